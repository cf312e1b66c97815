/*
 * tg_attn_train_bwd_step: the whole attention backward step in one call.
 *
 * Its promise is bits, not a bound: the same bits as the three-call path
 *   tg_attn_train_bwd_compute_d(O, dO) -> D_vec,
 *   tg_attn_train_bwd(.., D_vec, dQ, dK, dV, opt with TG_ATTN_OPT_DKV_WRITE),
 *   and for bf16 gradients tg_f32_to_bf16_cast of dQ, dK and dV,
 * on the same context (ISA table, threads, deterministic flag, schedule,
 * precision mode); d_sinks accumulates as the backward's does. So nearly
 * every test here runs both on the same inputs and compares them bit for
 * bit: dQ, dK, dV in both gradient types and d_sinks. Before every call its
 * outputs are filled with a NaN pattern of their own (f32: 0x7FF0DEAD for the
 * step, 0x7FC00000 for the three-call path; bf16: 0xFFFF, a NaN no cast
 * gives): an element either path leaves unwritten, or a dK, dV read before
 * it is written, differs from the other path or shows as a NaN, and every
 * gradient here must be finite (the inputs are).
 *
 * The inputs come from the forward (tg_attn_train_fwd: O in the input type,
 * L), unit-variance Q, K, V, dO, mask entries -inf with probability 0.2 and
 * every third mask row all -inf (rows that see no key), sinks in [-3, 3)
 * with head 0's -inf (no sink: its d_sinks untouched) and head 1's 30 (a
 * sink that dominates its rows), d_sinks0 in [-1, 1).
 *
 * Each shape is run as f32 inputs and as bf16 inputs in the three precision
 * modes (exact, split, bf16), each with f32 and bf16 gradients, in
 * deterministic mode at 1, 2 or 3 threads (planned for TU_PLAN_CPUS = 16
 * CPUs whatever this machine has: tu_plan_fixed) and without it on the KV
 * schedule, planned for a machine of as many CPUs as threads. The shapes are
 * chosen for the backward's internal paths (kernels/attention_bwd.c: the
 * KV schedule's key ranges, whose dQ partials a second pass sums, and query
 * groups, whose dK, dV parts a second pass sums; the bf16 unit's dK, dV
 * summed transposed up to head dim TG_ATTN_DKV_T_MAX_D = 128, by rows
 * above). Ranges x groups at 16 planned CPUs on the 64-row tiles (portable,
 * avx512, avx512bf16, amx; avx2's 48-row tiles and amx's 128-key bf16-mode
 * tiles split them otherwise):
 *
 *   ranges x groups   gqa 4, causal qL < kL, D 64       2 x 12
 *   groups only       window, row path D 160, B 2       1 x 4
 *   groups only       Dv != D, causal qL > kL, tokens   1 x 4
 *   one item each     16 heads, one q tile              1 x 1
 *   ranges only       kL 1100, one q tile               4 x 1
 *   ranges, causal    ranges that see no query          4 x 1
 *   ranges x groups   row path D 256, gqa 2             2 x 4
 *   ranges x groups   window: range 0 sees no query     4 x 6
 *   ranges x groups   causal, keys 200.. seen by none   2 x 2
 *   single element                                      1 x 1
 *
 * and planned for 1-3 CPUs mostly 1 x 1 to 2 x 3.
 *
 * Beyond the bits: one modest shape against the float64 reference of
 * tests/common/attn_problem.c (the bounds of tests/test_attn_ext.c; a bf16
 * gradient adds its own rounding, see test_step_against_f64), where the
 * ATOMIC schedule's f32 gradients at 2 threads (atomic adds in any order:
 * not reproducible bitwise) are checked too; bad arguments refused with a
 * message and nothing written (outputs keep their poison); allocation
 * failures refused cleanly; a context reused across shapes.
 *
 * TG_TEST_SHORT (AddressSanitizer, qemu, where the full set took ten times
 * the other attention suites' time): each shape of a test takes one input
 * type / precision mode, in turn (every one taken across the shapes: takes),
 * the shapes of test_step_matches_three_calls in deterministic mode only,
 * test_step_dkv_transposed_forced D 64 in bf16 mode only, the ATOMIC
 * context's bf16 gradients at 2 threads only, test_step_context_reuse
 * without its D 256 call, test_step_key_chunks one
 * planned L2 per shape and type (alternating); the f64, bad-argument and
 * allocation tests as in Release.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_problem.h"
#include "bf16.h"
#include "tilegrad_testing.h"

/* --- problems ---------------------------------------------------------------- */

typedef struct {
  const char *name;
  int B, H, H_kv, qL, kL, D;
  int Dv;          /* value head dim (opt.v_head_dim); 0: D */
  int causal;
  int off_delta;   /* qL_off = kL - qL + off_delta */
  int mask;        /* 0 none, 1 full [B,H,qL,kL], 2 broadcast [qL,kL] */
  int token_major; /* Q, O, dO [B,qL,H,*]; K, V [B,kL,H_kv,*]; else head-major */
  int window;      /* opt.window, 0 none */
  int sinks;       /* opt.sinks and d_sinks */
  float dropout_p;
  float softcap;   /* 1: off */
} step_cfg;

/* What one input type's calls take: the inputs and the forward's O, L. */
typedef struct {
  const void *Q, *K, *V, *dO, *mask; /* mask NULL without one */
  void *O;                           /* type dtype, through O_strides */
  float *L;
} step_inputs;

typedef struct {
  step_cfg c;
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_attn_options opt; /* dropout, window, v_head_dim, sinks; flags 0, d_sinks NULL */
  int64_t Dv;
  int64_t nQ, nK, nV, nO, nL, nM; /* elements: Q (= dQ), K, V, O (= dO), rows, mask */
  int64_t nKg, nVg;               /* dK, dV elements (contiguous) */
  float *sinks, *d_sinks0;        /* [H], NULL without sinks */
  float *f32[5];                  /* Q, K, V, dO, mask */
  tg_bf16 *bf16[5];               /* the same rounded to bf16 */
  step_inputs in[2];              /* by tg_dtype: [TG_DTYPE_BF16], [TG_DTYPE_F32] */
} step_problem;

static size_t esize(tg_dtype t) { return t == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16); }

static void fill_normal(tu_rng *r, float *x, int64_t n) { /* Box-Muller */
  for (int64_t i = 0; i < n; i++) {
    const double u1 = tu_uniform(r, 0x1p-53, 1), u2 = tu_uniform(r, 0, 1);
    x[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

/* Strides of a [B, heads, len, cols] tensor, head-major or token-major. */
static void set_strides(int64_t s[3], int token_major, int64_t heads, int64_t len,
                        int64_t cols) {
  s[0] = heads * len * cols;
  s[1] = token_major ? cols : len * cols;
  s[2] = token_major ? heads * cols : cols;
}

/* The forward of pb on a deterministic context: O, L of input type dt. */
static void run_forward(step_problem *pb, tg_dtype dt) {
  step_inputs *in = &pb->in[dt];
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_fwd(ctx, dt, in->Q, in->K, in->V, in->O, in->L, &pb->p,
                                     in->mask ? &pb->mp : NULL, in->mask, pb->c.causal, &pb->opt),
                   TG_OK);
  tg_ctx_destroy(ctx);
}

static void build(step_problem *pb, const step_cfg *c, tu_rng *r) {
  memset(pb, 0, sizeof *pb);
  pb->c = *c;
  const int64_t B = c->B, H = c->H, Hk = c->H_kv, qL = c->qL, kL = c->kL, D = c->D;
  const int64_t Dv = c->Dv ? c->Dv : D;
  pb->Dv = Dv;
  tg_attn_params *p = &pb->p;
  assert_int_equal(tg_attn_params_init(p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                                       (float)(1.0 / sqrt((double)D))),
                   TG_OK);
  p->qL_off += c->off_delta;
  p->softcapping = c->softcap;
  set_strides(p->Q_strides, c->token_major, H, qL, D);
  set_strides(p->O_strides, c->token_major, H, qL, Dv);
  set_strides(p->K_strides, c->token_major, Hk, kL, D);
  set_strides(p->V_strides, c->token_major, Hk, kL, Dv);
  pb->nQ = B * H * qL * D, pb->nO = B * H * qL * Dv, pb->nL = B * H * qL;
  pb->nK = pb->nKg = B * Hk * kL * D;
  pb->nV = pb->nVg = B * Hk * kL * Dv;
  const int64_t n[4] = {pb->nQ, pb->nK, pb->nV, pb->nO};
  for (int t = 0; t < 4; t++) {
    pb->f32[t] = tu_alloc(sizeof(float) * (size_t)n[t]);
    fill_normal(r, pb->f32[t], n[t]);
  }
  if (c->mask) {
    pb->nM = c->mask == 2 ? qL * kL : B * H * qL * kL;
    pb->mp.M_strides[0] = c->mask == 2 ? 0 : H * qL * kL;
    pb->mp.M_strides[1] = c->mask == 2 ? 0 : qL * kL;
    pb->mp.M_strides[2] = kL;
    float *m = pb->f32[4] = tu_alloc(sizeof(float) * (size_t)pb->nM);
    for (int64_t e = 0; e < pb->nM; e++)
      m[e] = tu_uniform(r, 0, 1) < 0.2 ? -INFINITY : (float)tu_uniform(r, -3, 1);
    for (int64_t row = 0; row < pb->nM / kL; row += 3)
      for (int64_t k = 0; k < kL; k++) m[row * kL + k] = -INFINITY;
  }
  for (int t = 0; t < 5; t++) {
    const int64_t cnt = t < 4 ? n[t] : pb->nM;
    if (!pb->f32[t]) continue;
    pb->bf16[t] = tu_alloc(sizeof(tg_bf16) * (size_t)cnt);
    for (int64_t e = 0; e < cnt; e++) pb->bf16[t][e] = tg_f32_to_bf16(pb->f32[t][e]);
  }
  pb->opt = (tg_attn_options){.dropout_p = c->dropout_p,
                              .dropout_seed = tu_next(r),
                              .dropout_offset = tu_next(r),
                              .window = (uint32_t)c->window,
                              .v_head_dim = c->Dv ? (uint32_t)c->Dv : 0};
  if (c->sinks) {
    pb->sinks = tu_alloc(sizeof(float) * (size_t)H);
    pb->d_sinks0 = tu_alloc(sizeof(float) * (size_t)H);
    tu_fill_f32(r, pb->sinks, H, -3, 3);
    tu_fill_f32(r, pb->d_sinks0, H, -1, 1);
    pb->sinks[0] = -INFINITY;
    if (H > 1) pb->sinks[1] = 30.0f;
    pb->opt.sinks = pb->sinks;
  }
  for (int dt = 0; dt < 2; dt++) {
    step_inputs *in = &pb->in[dt];
    const int f = dt == TG_DTYPE_F32;
    in->Q = f ? (void *)pb->f32[0] : (void *)pb->bf16[0];
    in->K = f ? (void *)pb->f32[1] : (void *)pb->bf16[1];
    in->V = f ? (void *)pb->f32[2] : (void *)pb->bf16[2];
    in->dO = f ? (void *)pb->f32[3] : (void *)pb->bf16[3];
    in->mask = f ? (void *)pb->f32[4] : (void *)pb->bf16[4];
    in->O = tu_alloc(esize((tg_dtype)dt) * (size_t)pb->nO);
    in->L = tu_alloc(sizeof(float) * (size_t)pb->nL);
    run_forward(pb, (tg_dtype)dt);
  }
}

static void destroy(step_problem *pb) {
  for (int t = 0; t < 5; t++) free(pb->f32[t]), free(pb->bf16[t]);
  for (int dt = 0; dt < 2; dt++) free(pb->in[dt].O), free(pb->in[dt].L);
  free(pb->sinks), free(pb->d_sinks0);
}

/* --- gradients and the two ways to get them ------------------------------------- */

typedef struct {
  tg_dtype gd;         /* float or tg_bf16 elements */
  void *dQ, *dK, *dV;  /* contiguous [B,H,qL,D], [B,H_kv,kL,D], [B,H_kv,kL,Dv] */
  float *d_sinks;      /* [H] (with sinks) */
} grads;

static grads alloc_grads(const step_problem *pb, tg_dtype gd) {
  const size_t e = esize(gd);
  return (grads){gd, tu_alloc(e * (size_t)pb->nQ), tu_alloc(e * (size_t)pb->nKg),
                 tu_alloc(e * (size_t)pb->nVg), tu_alloc(sizeof(float) * (size_t)pb->c.H)};
}

static void free_grads(grads *g) { free(g->dQ), free(g->dK), free(g->dV), free(g->d_sinks); }

/* Poison patterns: f32 NaNs of two payloads (the step's and the three-call
 * path's), bf16 0xFFFF (a NaN the cast never gives: it makes NaN 0x7FC0). */
enum { POISON_STEP = 0x7FF0DEADu, POISON_3CALL = 0x7FC00000u, POISON_BF16 = 0xFFFFu };

static void poison(void *x, int64_t n, tg_dtype gd, uint32_t f32_bits) {
  if (gd == TG_DTYPE_F32)
    for (int64_t e = 0; e < n; e++) memcpy((float *)x + e, &f32_bits, 4);
  else
    for (int64_t e = 0; e < n; e++) ((tg_bf16 *)x)[e] = POISON_BF16;
}

/* Gradients poisoned, d_sinks back to d_sinks0. */
static void reset_grads(const step_problem *pb, grads *g, uint32_t f32_bits) {
  poison(g->dQ, pb->nQ, g->gd, f32_bits);
  poison(g->dK, pb->nKg, g->gd, f32_bits);
  poison(g->dV, pb->nVg, g->gd, f32_bits);
  if (pb->sinks) memcpy(g->d_sinks, pb->d_sinks0, sizeof(float) * (size_t)pb->c.H);
}

/* [B,H,qL,Dv] contiguous copy of an O-shaped tensor laid out by O_strides
 * (compute_d takes contiguous rows). */
static void *gather_rows(const step_problem *pb, tg_dtype dt, const void *src) {
  const tg_attn_params *p = &pb->p;
  const size_t e = esize(dt);
  char *dst = tu_alloc(e * (size_t)pb->nO);
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++)
        memcpy(dst + e * (size_t)(((b * p->H + h) * p->qL + i) * pb->Dv),
               (const char *)src + e * (size_t)attn_off3(p->O_strides, b, h, i),
               e * (size_t)pb->Dv);
  return dst;
}

/* The three-call path with f32 gradients (g->gd F32): compute_d on O, dO
 * gathered to contiguous rows, then the backward with dK, dV written. */
static void run_three_calls(tg_ctx *ctx, const step_problem *pb, tg_dtype dt, grads *g) {
  const step_inputs *in = &pb->in[dt];
  assert_int_equal(g->gd, TG_DTYPE_F32);
  reset_grads(pb, g, POISON_3CALL);
  void *Oc = gather_rows(pb, dt, in->O), *dOc = gather_rows(pb, dt, in->dO);
  float *D_vec = tu_alloc(sizeof(float) * (size_t)pb->nL);
  tu_poison_f32(D_vec, pb->nL);
  const tg_attn_params *p = &pb->p;
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd_compute_d(ctx, dt, Oc, dOc, D_vec, (uint32_t)p->B,
                                               (uint32_t)p->H, (uint32_t)p->qL,
                                               (uint32_t)pb->Dv),
                   TG_OK);
  tg_attn_options opt = pb->opt;
  opt.flags |= TG_ATTN_OPT_DKV_WRITE;
  opt.d_sinks = pb->sinks ? g->d_sinks : NULL;
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, dt, in->Q, in->K, in->V, in->L, in->dO, D_vec, g->dQ,
                                     g->dK, g->dV, p, in->mask ? &pb->mp : NULL, in->mask,
                                     pb->c.causal, &opt),
                   TG_OK);
  free(Oc), free(dOc), free(D_vec);
}

/* The third call of the bf16 path: bf = tg_f32_to_bf16_cast of f32's
 * gradients (d_sinks copied). */
static void cast_grads(tg_ctx *ctx, const step_problem *pb, const grads *f32, grads *bf) {
  assert_int_equal(bf->gd, TG_DTYPE_BF16);
  reset_grads(pb, bf, 0);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, f32->dQ, bf->dQ, (uint64_t)pb->nQ), TG_OK);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, f32->dK, bf->dK, (uint64_t)pb->nKg), TG_OK);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, f32->dV, bf->dV, (uint64_t)pb->nVg), TG_OK);
  if (pb->sinks) memcpy(bf->d_sinks, f32->d_sinks, sizeof(float) * (size_t)pb->c.H);
}

/* The step into g (gradients of type g->gd), poisoned first; extra_flags
 * join the problem's options (TG_ATTN_OPT_DKV_WRITE: implied, so the same). */
static void run_step(tg_ctx *ctx, const step_problem *pb, tg_dtype dt, grads *g,
                     uint32_t extra_flags) {
  const step_inputs *in = &pb->in[dt];
  reset_grads(pb, g, POISON_STEP);
  tg_attn_options opt = pb->opt;
  opt.flags |= extra_flags;
  opt.d_sinks = pb->sinks ? g->d_sinks : NULL;
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd_step(ctx, dt, g->gd, in->Q, in->K, in->V, in->O, in->L,
                                          in->dO, g->dQ, g->dK, g->dV, &pb->p,
                                          in->mask ? &pb->mp : NULL, in->mask, pb->c.causal,
                                          &opt),
                   TG_OK);
}

/* --- comparing ------------------------------------------------------------------- */

static uint32_t bits_at(const void *x, int64_t i, size_t e) {
  if (e == 2) return ((const tg_bf16 *)x)[i];
  uint32_t u;
  memcpy(&u, (const float *)x + i, 4);
  return u;
}

static double value_at(const void *x, int64_t i, size_t e) {
  return e == 2 ? (double)tg_bf16_to_f32(((const tg_bf16 *)x)[i]) : (double)((const float *)x)[i];
}

/* got and want hold the same bits; else prints how many elements differ and
 * the first one. */
static int same_bits(const char *what, const void *want, const void *got, int64_t n, size_t e) {
  if (!memcmp(want, got, e * (size_t)n)) return 1;
  int64_t first = -1, bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (bits_at(want, i, e) != bits_at(got, i, e)) {
      if (first < 0) first = i;
      bad++;
    }
  printf("  %s: %lld of %lld elements differ; first [%lld] got 0x%0*x (%.9g) want 0x%0*x "
         "(%.9g)\n",
         what, (long long)bad, (long long)n, (long long)first, (int)(2 * e),
         bits_at(got, first, e), value_at(got, first, e), (int)(2 * e), bits_at(want, first, e),
         value_at(want, first, e));
  return 0;
}

/* Every element finite (f32, or bf16 with an exponent below 0xFF). */
static int all_finite(const char *what, const void *x, int64_t n, tg_dtype gd) {
  for (int64_t i = 0; i < n; i++) {
    const int fin = gd == TG_DTYPE_F32 ? isfinite(((const float *)x)[i])
                                       : (((const tg_bf16 *)x)[i] & 0x7F80) != 0x7F80;
    if (!fin) {
      printf("  %s[%lld] is not finite (bits 0x%x): unwritten?\n", what, (long long)i,
             bits_at(x, i, esize(gd)));
      return 0;
    }
  }
  return 1;
}

/* got == want bitwise (dQ, dK, dV, d_sinks), and got finite. */
static int same_grads(const step_problem *pb, const grads *want, const grads *got,
                      const char *what) {
  const size_t e = esize(got->gd);
  const char *t = got->gd == TG_DTYPE_F32 ? "f32" : "bf16";
  char nm[3][16];
  snprintf(nm[0], sizeof nm[0], "dQ (%s)", t);
  snprintf(nm[1], sizeof nm[1], "dK (%s)", t);
  snprintf(nm[2], sizeof nm[2], "dV (%s)", t);
  int ok = same_bits(nm[0], want->dQ, got->dQ, pb->nQ, e);
  ok &= same_bits(nm[1], want->dK, got->dK, pb->nKg, e);
  ok &= same_bits(nm[2], want->dV, got->dV, pb->nVg, e);
  if (pb->sinks) ok &= same_bits("d_sinks", want->d_sinks, got->d_sinks, pb->c.H, 4);
  ok &= all_finite(nm[0], got->dQ, pb->nQ, got->gd) &&
        all_finite(nm[1], got->dK, pb->nKg, got->gd) &&
        all_finite(nm[2], got->dV, pb->nVg, got->gd);
  if (pb->sinks && memcmp(&pb->d_sinks0[0], &got->d_sinks[0], 4) != 0) {
    printf("  d_sinks[0] of a -inf sink changed\n");
    ok = 0;
  }
  if (!ok)
    printf("  ^ step vs three calls, %s (TG_TEST_SEED=%llu)\n", what,
           (unsigned long long)tu_seed());
  return ok;
}

/* --- runs --------------------------------------------------------------------------- */

/* Input types and precision modes: f32 inputs (the mode does not apply),
 * bf16 inputs in each mode. */
static const struct {
  tg_dtype dt;
  tg_attn_precision prec;
  const char *name;
} variants[] = {
    {TG_DTYPE_F32, TG_ATTN_PRECISION_EXACT, "f32 in"},
    {TG_DTYPE_BF16, TG_ATTN_PRECISION_EXACT, "bf16 in, exact"},
    {TG_DTYPE_BF16, TG_ATTN_PRECISION_SPLIT, "bf16 in, split"},
    {TG_DTYPE_BF16, TG_ATTN_PRECISION_BF16, "bf16 in, bf16 mode"},
};
enum { N_VARIANTS = sizeof variants / sizeof variants[0] };

/* TG_TEST_SHORT: problem k of a test (its place in the test's list of
 * shapes) takes one variant, k's turn in the list (every variant taken
 * across a test's problems where it has four); otherwise all. */
static int takes(int k, int vi) { return !tu_short() || (k + vi) % N_VARIANTS == 0; }

static tg_ctx *make_ctx(int threads, int det, tg_attn_schedule sched, tg_attn_precision prec) {
  tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
  assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, sched), TG_OK);
  assert_int_equal(tg_ctx_set_attn_precision(ctx, prec), TG_OK);
  return ctx;
}

/* The four gradient sets of a comparison: the three-call path's f32 and
 * cast bf16, the step's f32 and bf16. */
typedef struct {
  grads ref32, ref16, got32, got16;
} grad_sets;

static grad_sets alloc_sets(const step_problem *pb) {
  return (grad_sets){alloc_grads(pb, TG_DTYPE_F32), alloc_grads(pb, TG_DTYPE_BF16),
                     alloc_grads(pb, TG_DTYPE_F32), alloc_grads(pb, TG_DTYPE_BF16)};
}

static void free_sets(grad_sets *s) {
  free_grads(&s->ref32), free_grads(&s->ref16), free_grads(&s->got32), free_grads(&s->got16);
}

/* On ctx: the three-call path once, then the step with f32 and with bf16
 * gradients, each against it. Returns the number of mismatches (0-2). */
static int compare_on(tg_ctx *ctx, const step_problem *pb, tg_dtype dt, grad_sets *s,
                      uint32_t extra_flags, const char *what) {
  char w[320];
  run_three_calls(ctx, pb, dt, &s->ref32);
  cast_grads(ctx, pb, &s->ref32, &s->ref16);
  run_step(ctx, pb, dt, &s->got32, extra_flags);
  snprintf(w, sizeof w, "%s, f32 gradients", what);
  int bad = !same_grads(pb, &s->ref32, &s->got32, w);
  run_step(ctx, pb, dt, &s->got16, extra_flags);
  snprintf(w, sizeof w, "%s, bf16 gradients", what);
  bad += !same_grads(pb, &s->ref16, &s->got16, w);
  return bad;
}

/* "<shape> <variant> [isa, N threads, mode, schedule, planned CPUs]" for
 * failure messages. */
static void describe(char *buf, size_t size, const step_problem *pb, int vi, const tg_ctx *ctx,
                     int threads, int det) {
  snprintf(buf, size, "\"%s\" %s [%s, %d threads, %s, schedule %s, plan for %d CPUs]",
           pb->c.name, variants[vi].name, tg_isa_name(tg_ctx_get_isa(ctx)), threads,
           det ? "deterministic" : "not deterministic",
           tg_ctx_get_attn_schedule(ctx) == TG_ATTN_SCHEDULE_ATOMIC ? "ATOMIC" : "KV",
           tg_ctx_plan_cpus(ctx));
}

/* --- the shapes ---------------------------------------------------------------------- */

/* Fields in step_cfg's order: name, B, H, H_kv, qL, kL, D, Dv, causal,
 * off_delta, mask, token_major, window, sinks, dropout_p, softcap. */
static const step_cfg shapes[] = {
    /* 2 key ranges x 12 query groups (dQ partials, dK/dV parts), dK/dV transposed on the
     * bf16 unit (D 64), gqa 4, causal with qL < kL, -inf mask rows, dropout */
    {"ranges x groups",      1, 4, 1, 150,  530,  64,   0, 1,     0, 1, 0,   0, 0, 0.2f, 1.0f},
    /* 1 range x 4 groups, dK/dV by rows (D 160), a window that hides whole key tiles
     * from whole q tiles (their dK, dV rows must be written as zeros), softcap,
     * broadcast mask, two batches */
    {"window, D 160",        2, 4, 2,  77,  300, 160,   0, 0,     0, 2, 0,  97, 0, 0.0f, 5.0f},
    /* 1 x 4, Dv != D (v_head_dim 128, transposed: both <= 128), causal with qL > kL
     * (the first 123 rows see no key: whole q tiles whose dQ rows are zeros),
     * token-major layout (O through O_strides), sinks */
    {"Dv 128, qL > kL",      1, 2, 2, 200,   77,  64, 128, 1,     0, 0, 1,   0, 1, 0.1f, 1.0f},
    /* 1 x 1: 16 heads, one q tile; D 128 (the transposed limit), Dv 64, full mask */
    {"16 heads",             2, 8, 8,  40,   77, 128,  64, 0,     0, 1, 0,   0, 1, 0.1f, 1.0f},
    /* 4 ranges x 1 group: dQ from the partials' sum alone, sinks */
    {"ranges only",          1, 2, 2,  40, 1100,  32,   0, 0,     0, 0, 0,   0, 1, 0.0f, 1.0f},
    /* 4 ranges, causal with qL_off = 60: ranges 1-3 see no query (their dQ partial
     * rows unwritten and unread), dK/dV rows of those keys zero */
    {"ranges, far keys",     1, 2, 2,  40, 1100,  32,   0, 1, -1000, 0, 0,   0, 0, 0.3f, 1.0f},
    /* 2 ranges x 4 groups, dK/dV by rows (D 256), gqa 2, causal, ragged 70 x 530 */
    {"D 256, gqa 2",         1, 2, 1,  70,  530, 256,   0, 1,     0, 1, 0,   0, 0, 0.0f, 1.0f},
    /* 4 ranges x 6 groups, causal with a window of 200: range 0 sees no query (it
     * writes the dQ rows as zeros, the later ranges' partials are added), key tiles
     * no query sees (dK, dV zeros) */
    {"window, range 0 blind", 1, 2, 1, 150, 1100,  64,   0, 1,     0, 0, 0, 200, 0, 0.1f, 1.0f},
    /* 2 x 2 (one range of 10 key tiles planned for 1 CPU: test_step_key_chunks),
     * causal with qL_off 100: every q tile's keys end in the range's first tiles,
     * keys 200.. seen by none */
    {"keys end early",       1, 4, 4, 100,  600,  32,   0, 1,  -400, 0, 0,   0, 0, 0.0f, 1.0f},
    {"single element",       1, 1, 1,   1,    1,   8,   0, 0,     0, 0, 0,   0, 1, 0.0f, 1.0f},
};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
/* The shapes by name, in the table's order. */
enum {
  S_RANGES_GROUPS, S_WINDOW_D160, S_DV_TOKENS, S_HEADS, S_RANGES, S_RANGES_CAUSAL, S_D256,
  S_WINDOW_RANGES, S_EARLY_END, S_SINGLE, S_COUNT
};
_Static_assert((int)S_COUNT == (int)N_SHAPES, "a name per shape");

/* --- the step against the three-call path -------------------------------------------- */

/* Every shape, every input type and precision mode, both gradient types:
 * deterministic at 1, 2 or 3 threads (by shape and variant, so each shape
 * and each variant meets every count; on odd variants the context asks for
 * the ATOMIC schedule, which deterministic mode overrides), planned for 16
 * CPUs; then not deterministic on the KV schedule at another count, planned
 * as on a machine of that many CPUs (tg_testing_plan_cpus: fewer ranges and
 * groups, mostly 1 x 1 to 2 x 3). The step's options carry
 * TG_ATTN_OPT_DKV_WRITE on every other run (implied: the same bits). */
static void test_step_matches_three_calls(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 101);
  int failures = 0, runs = 0;
  for (int si = 0; si < N_SHAPES; si++) {
    step_problem pb;
    build(&pb, &shapes[si], &r);
    grad_sets s = alloc_sets(&pb);
    for (int vi = 0; vi < N_VARIANTS; vi++)
      for (int run = 0; run < (tu_short() ? 1 : 2) && takes(si, vi); run++) {
        const int det = run == 0, threads = 1 + (si + vi + run) % 3;
        const tg_attn_schedule sched =
            det && vi % 2 ? TG_ATTN_SCHEDULE_ATOMIC : TG_ATTN_SCHEDULE_KV;
        tg_ctx *ctx = make_ctx(threads, det, sched, variants[vi].prec);
        if (!det) tg_testing_plan_cpus(threads);
        char what[256];
        describe(what, sizeof what, &pb, vi, ctx, threads, det);
        failures += compare_on(ctx, &pb, variants[vi].dt, &s,
                               (si + vi + run) % 2 ? TG_ATTN_OPT_DKV_WRITE : 0, what);
        runs += 2;
        tu_plan_fixed();
        tg_ctx_destroy(ctx);
      }
    free_sets(&s);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d of %d step runs differ from the three-call path", failures, runs);
}

/* Deterministic mode: the step's bits at 1, 2 and 3 threads are those of
 * the three-call path at 1 thread, in every variant, on the shapes with
 * several key ranges (and query groups): the sums of the dQ partials and
 * the dK, dV parts in a fixed order whatever the thread count. At 2 and 3
 * threads the key-tile chunks are planned as for an L2 of 0 bytes (one key
 * tile at a time) and of 1 GiB (every tile of a range: tg_testing_plan_
 * l2_bytes), which moves operands, never a sum: the same bits again. */
static void test_step_deterministic_threads(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 102);
  static const int which[] = {S_RANGES_GROUPS, S_RANGES};
  int failures = 0;
  for (size_t wi = 0; wi < sizeof which / sizeof which[0]; wi++) {
    step_problem pb;
    build(&pb, &shapes[which[wi]], &r);
    grad_sets s = alloc_sets(&pb);
    for (int vi = 0; vi < N_VARIANTS; vi++) {
      if (!takes((int)wi, vi)) continue;
      tg_ctx *one = make_ctx(1, 1, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
      run_three_calls(one, &pb, variants[vi].dt, &s.ref32);
      cast_grads(one, &pb, &s.ref32, &s.ref16);
      tg_ctx_destroy(one);
      for (int threads = 1; threads <= 3; threads++) {
        static const long long l2[3] = {-1, 0, 1LL << 30}; /* the machine's; 0; 1 GiB */
        tg_testing_plan_l2_bytes(l2[threads - 1]);
        tg_ctx *ctx = make_ctx(threads, 1, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
        char what[256];
        describe(what, sizeof what, &pb, vi, ctx, threads, 1);
        snprintf(what + strlen(what), sizeof what - strlen(what),
                 ", L2 planned %lld, vs the three calls at 1 thread", l2[threads - 1]);
        run_step(ctx, &pb, variants[vi].dt, &s.got32, 0);
        failures += !same_grads(&pb, &s.ref32, &s.got32, what);
        run_step(ctx, &pb, variants[vi].dt, &s.got16, 0);
        failures += !same_grads(&pb, &s.ref16, &s.got16, what);
        tg_ctx_destroy(ctx);
      }
      tg_testing_plan_l2_bytes(-1);
    }
    free_sets(&s);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d deterministic runs differ across thread counts", failures);
}

/* The bf16 unit's dK, dV summed transposed (dK^T = Q^T . dS) or by rows,
 * forced either way (tg_testing_attn_dkv_transposed): the step follows the
 * three-call path in both, at D 64 (transposed by the plan's own rule) and
 * D 160 (by rows), in each precision mode whose backward runs on the bf16
 * unit of the table under test (elsewhere the hook changes nothing: left
 * out). TG_TEST_SHORT: D 64, bf16 mode. */
static void test_step_dkv_transposed_forced(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 103);
  static const int which[] = {S_RANGES_GROUPS, S_WINDOW_D160}; /* D 64; D 160 */
  int failures = 0, ran = 0;
  for (int wi = 0; wi < (tu_short() ? 1 : 2); wi++) {
    step_problem pb;
    build(&pb, &shapes[which[wi]], &r);
    grad_sets s = alloc_sets(&pb);
    for (int vi = tu_short() ? N_VARIANTS - 1 : 1; vi < N_VARIANTS; vi++) /* bf16 inputs */
      for (int mode = 0; mode <= 1; mode++) {
        tg_ctx *ctx = make_ctx(2, 1, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
        if (tg_testing_attn_bf16_parts(tg_ctx_get_isa(ctx), variants[vi].prec, pb.c.D, 1) <= 0) {
          tg_ctx_destroy(ctx);
          continue;
        }
        tg_testing_attn_dkv_transposed(mode);
        char what[256];
        describe(what, sizeof what, &pb, vi, ctx, 2, 1);
        strncat(what, mode ? " dK/dV transposed" : " dK/dV by rows",
                sizeof what - strlen(what) - 1);
        failures += compare_on(ctx, &pb, TG_DTYPE_BF16, &s, 0, what);
        ran++;
        tg_testing_attn_dkv_transposed(-1);
        tg_ctx_destroy(ctx);
      }
    free_sets(&s);
    destroy(&pb);
  }
  if (!ran) printf("  no precision mode runs the backward on this table's bf16 unit\n");
  if (failures) TU_FAIL("%d forced dK/dV layouts differ from the three-call path", failures);
}

/* The ATOMIC schedule (a context not deterministic). f32 gradients take it
 * as the three-call path does: at 1 thread its adds come in one order, so
 * the bits must agree (at more threads see test_step_against_f64). bf16
 * gradients run the KV schedule whatever was asked: at 1 and 2 threads the
 * step on an ATOMIC context gives the cast of the three-call path on a KV
 * context of the same threads, and the context still says ATOMIC after.
 * The window shape has key tiles no q tile sees (the ATOMIC schedule's
 * zeros for DKV_WRITE). */
static void test_step_atomic_schedule(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 104);
  static const int which[] = {S_RANGES_GROUPS, S_WINDOW_D160, S_DV_TOKENS};
  int failures = 0;
  for (size_t wi = 0; wi < sizeof which / sizeof which[0]; wi++) {
    step_problem pb;
    build(&pb, &shapes[which[wi]], &r);
    grad_sets s = alloc_sets(&pb);
    for (int vi = 0; vi < N_VARIANTS; vi++) {
      if (!takes((int)wi, vi)) continue;
      const tg_dtype dt = variants[vi].dt;
      char what[256];
      tg_ctx *at1 = make_ctx(1, 0, TG_ATTN_SCHEDULE_ATOMIC, variants[vi].prec);
      describe(what, sizeof what, &pb, vi, at1, 1, 0);
      run_three_calls(at1, &pb, dt, &s.ref32);
      run_step(at1, &pb, dt, &s.got32, 0);
      failures += !same_grads(&pb, &s.ref32, &s.got32, what);
      tg_ctx_destroy(at1);
      for (int threads = tu_short() ? 2 : 1; threads <= 2; threads++) {
        tg_ctx *kv = make_ctx(threads, 0, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
        tg_ctx *at = make_ctx(threads, 0, TG_ATTN_SCHEDULE_ATOMIC, variants[vi].prec);
        run_three_calls(kv, &pb, dt, &s.ref32);
        cast_grads(kv, &pb, &s.ref32, &s.ref16);
        run_step(at, &pb, dt, &s.got16, 0);
        describe(what, sizeof what, &pb, vi, at, threads, 0);
        strncat(what, " vs the three calls on KV", sizeof what - strlen(what) - 1);
        failures += !same_grads(&pb, &s.ref16, &s.got16, what);
        if (tg_ctx_get_attn_schedule(at) != TG_ATTN_SCHEDULE_ATOMIC) {
          printf("  the step changed the context's schedule (%s)\n", what);
          failures++;
        }
        tg_ctx_destroy(kv), tg_ctx_destroy(at);
      }
    }
    free_sets(&s);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d ATOMIC-schedule runs wrong", failures);
}

/* One context through several shapes in turn (its scratch and workspace
 * sized by the first, then grown and shrunk): each step gives the bits of
 * the three-call path on a fresh context. Input types, modes and gradient
 * types rotate. */
static void test_step_context_reuse(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 105);
  static const int order[] = {S_SINGLE, S_RANGES,  S_RANGES_GROUPS, S_DV_TOKENS,
                              S_D256,   S_HEADS,   S_RANGES_GROUPS};
  enum { N_ORDER = sizeof order / sizeof order[0] };
  step_problem pb[N_SHAPES];
  int built[N_SHAPES] = {0};
  int failures = 0;
  tg_ctx *reused = make_ctx(2, 1, TG_ATTN_SCHEDULE_KV, TG_ATTN_PRECISION_EXACT);
  for (int oi = 0; oi < N_ORDER; oi++) {
    const int si = order[oi], vi = oi % N_VARIANTS;
    if (tu_short() && si == S_D256) continue; /* (the longest; the others grow it too) */
    if (!built[si]) build(&pb[si], &shapes[si], &r), built[si] = 1;
    grad_sets s = alloc_sets(&pb[si]);
    assert_int_equal(tg_ctx_set_attn_precision(reused, variants[vi].prec), TG_OK);
    grads *got = oi % 2 ? &s.got16 : &s.got32, *want = oi % 2 ? &s.ref16 : &s.ref32;
    run_step(reused, &pb[si], variants[vi].dt, got, 0);
    tg_ctx *fresh = make_ctx(2, 1, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
    run_three_calls(fresh, &pb[si], variants[vi].dt, &s.ref32);
    cast_grads(fresh, &pb[si], &s.ref32, &s.ref16);
    tg_ctx_destroy(fresh);
    char what[256];
    describe(what, sizeof what, &pb[si], vi, reused, 2, 1);
    snprintf(what + strlen(what), sizeof what - strlen(what), ", call %d on one context", oi);
    failures += !same_grads(&pb[si], want, got, what);
    free_sets(&s);
  }
  tg_ctx_destroy(reused);
  for (int si = 0; si < N_SHAPES; si++)
    if (built[si]) destroy(&pb[si]);
  if (failures) TU_FAIL("%d steps on a reused context differ", failures);
}

/* One key range planned (a machine of 1 CPU, 1 thread, not deterministic:
 * every shape below is then one work item per kv head), split into chunks
 * of key tiles by the L2 planned (tg_testing_plan_l2_bytes: 0, one key
 * tile a chunk; 1 GiB, up to 8): with one range the bf16 dQ rows are
 * rounded as the range finishes them, in the chunk that holds the last key
 * tile their q tile sees, and dK, dV straight from the key tiles' sums.
 * Shapes: causal with every q tile's keys ending in the range's first
 * tiles (10 key tiles; keys 200.. seen by none), whole q tiles that see no
 * key (Dv 128, token-major), a window that hides whole key tiles. */
static void test_step_key_chunks(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 109);
  static const int which[] = {S_EARLY_END, S_DV_TOKENS, S_WINDOW_D160};
  static const long long l2[2] = {0, 1LL << 30};
  int failures = 0;
  for (size_t wi = 0; wi < sizeof which / sizeof which[0]; wi++) {
    step_problem pb;
    build(&pb, &shapes[which[wi]], &r);
    grad_sets s = alloc_sets(&pb);
    tg_testing_plan_cpus(1);
    for (int vi = 0; vi < N_VARIANTS; vi++)
      for (int li = 0; li < 2 && takes((int)wi, vi); li++) {
        if (tu_short() && li != (int)(wi + (size_t)vi) % 2) continue; /* one L2 each */
        tg_testing_plan_l2_bytes(l2[li]);
        tg_ctx *ctx = make_ctx(1, 0, TG_ATTN_SCHEDULE_KV, variants[vi].prec);
        char what[256];
        describe(what, sizeof what, &pb, vi, ctx, 1, 0);
        snprintf(what + strlen(what), sizeof what - strlen(what), ", L2 planned %lld", l2[li]);
        failures += compare_on(ctx, &pb, variants[vi].dt, &s, 0, what);
        tg_ctx_destroy(ctx);
      }
    tg_testing_plan_l2_bytes(-1);
    tu_plan_fixed();
    free_sets(&s);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d one-range runs differ from the three-call path", failures);
}

/* --- against the float64 reference ------------------------------------------------------ */

/* got (bf16) against the reference: the bound of the f32 gradient plus the
 * bf16 rounding (see test_step_against_f64). */
static int check_bf16_bound(const char *what, const tg_bf16 *got, const double *want,
                            const double *bound, int64_t n) {
  float *w = tu_alloc(sizeof(float) * (size_t)n);
  double *b = tu_alloc(sizeof(double) * (size_t)n);
  for (int64_t e = 0; e < n; e++) {
    w[e] = tg_bf16_to_f32(got[e]);
    b[e] = bound[e] + BF16_U * (fabs(want[e]) + bound[e]) + 0x1.0p-134;
  }
  const int ok = tu_check_bound(what, w, want, b, n);
  free(w), free(b);
  return ok;
}

/* dQ rows of the rows that see no key exactly 0 (either gradient type). */
static int empty_rows_zero(const attn_problem *pb, const void *dQ, tg_dtype gd) {
  const int64_t D = pb->p.D;
  for (int64_t row = 0; row < pb->nL; row++) {
    if (!pb->empty[row]) continue;
    for (int64_t d = 0; d < D; d++)
      if (value_at(dQ, row * D + d, esize(gd)) != 0.0) {
        printf("  dQ row %lld sees no key but [%lld] = %g\n", (long long)row, (long long)d,
               value_at(dQ, row * D + d, esize(gd)));
        return 0;
      }
  }
  return 1;
}

/*
 * The step's gradients against the float64 reference (tests/common/
 * attn_problem.c, attn_step_row: the backward fed the forward's L and
 * D_vec = rowsum(dO o O) of the forward's O, as the step computes it), not
 * only against our own three-call path. One modest shape: B 1, H 4, H_kv 2,
 * qL 77, kL 131 (ragged against every tile), D 64, causal, a mask with -inf
 * entries and all -inf rows, dropout 0.1, random sinks with d_sinks; f32
 * inputs and bf16 inputs in each precision mode (the forward in the same
 * mode); both gradient types; deterministic at 2 threads, and the ATOMIC
 * schedule at 2 threads (its f32 gradients come from atomic adds in any
 * order: not bitwise reproducible, so the step's and the three-call path's
 * are both held to the bound instead; bf16 gradients run the KV schedule).
 *
 * Tolerances. f32 gradients: the per-element first-order bounds of
 * tests/test_attn_ext.c, doubled for the second-order terms (its header
 * derives them, for bf16 inputs with the precision mode's error per term and
 * the table's bf16 parts; attn_problem.c computes them), for dK and dV
 * summed from zero (dK, dV are written). bf16 gradients: the step promises
 * the round to nearest even of those f32 gradients g, so with |g - ref| <= e
 * and bf16's unit roundoff 2^-8 (8 significant bits),
 * |bf16(g) - ref| <= e + 2^-8 (|ref| + e) + 2^-134 (half the spacing of
 * bf16's subnormals, 2^-133, where g is below 2^-126). Rows that see no key:
 * dQ exactly 0. d_sinks: the bound of tests/test_attn_variants.c.
 */
static void test_step_against_f64(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 106);
  const attn_cfg c = {"f64 step", 1, 4, 2, 77, 131, 64, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0.1f};
  const attn_variants v = {.sinks = ATTN_SINKS_RANDOM};
  int failures = 0;
  for (int vi = 0; vi < N_VARIANTS; vi++) {
    const tg_dtype dt = variants[vi].dt;
    const tg_attn_precision prec = variants[vi].prec;
    const int bf = dt == TG_DTYPE_BF16;
    const attn_suite su = {.normal = 1, .bf16 = bf, .mask_ninf = 0.2, .mask_lo = -3,
                           .mask_row0 = 0, .mask_step = 3, .acc = ATTN_ACC_NONE,
                           .options = 1, .precision = prec, .row = attn_step_row};
    attn_problem pb;
    attn_build_v(&pb, &c, &v, &su, &r);
    const void *Q = bf ? (const void *)pb.Qb : pb.Q, *K = bf ? (const void *)pb.Kb : pb.K;
    const void *V = bf ? (const void *)pb.Vb : pb.V, *dO = bf ? (const void *)pb.dOb : pb.dO;
    const void *M = bf ? (const void *)pb.maskb : pb.mask;
    void *O = tu_alloc(esize(dt) * (size_t)pb.nO);
    float *L = tu_alloc(sizeof(float) * (size_t)pb.nL);
    float *g32[3] = {tu_alloc(4 * (size_t)pb.nQ), tu_alloc(4 * (size_t)pb.nKout),
                     tu_alloc(4 * (size_t)pb.nVout)};
    tg_bf16 *g16[3] = {tu_alloc(2 * (size_t)pb.nQ), tu_alloc(2 * (size_t)pb.nKout),
                       tu_alloc(2 * (size_t)pb.nVout)};
    float *ds = tu_alloc(sizeof(float) * (size_t)pb.p.H), *Dvec = tu_alloc(4 * (size_t)pb.nL);
    const int64_t n[3] = {pb.nQ, pb.nKout, pb.nVout};
    tg_ctx *fctx = make_ctx(2, 1, TG_ATTN_SCHEDULE_KV, prec);
    TU_EXPECT_STATUS(fctx, tg_attn_train_fwd(fctx, dt, Q, K, V, O, L, &pb.p, &pb.mp, M, 1, &pb.opt),
                     TG_OK);
    tg_ctx_destroy(fctx);
    char what[160];
    snprintf(what, sizeof what, "%s, %s", c.name, variants[vi].name);
    int ok = attn_check_L(&pb, L); /* (the premise of the backward's bounds) */
    for (int run = 0; run < 2; run++) { /* deterministic KV; ATOMIC, not deterministic */
      tg_ctx *ctx = run ? make_ctx(2, 0, TG_ATTN_SCHEDULE_ATOMIC, prec)
                        : make_ctx(2, 1, TG_ATTN_SCHEDULE_KV, prec);
      for (int path = 0; path < (run ? 3 : 2); path++) { /* step f32, step bf16, three calls */
        tg_attn_options opt = pb.opt;
        opt.d_sinks = ds;
        memcpy(ds, pb.d_sinks0, sizeof(float) * (size_t)pb.p.H);
        for (int k = 0; k < 3; k++) poison(g32[k], n[k], TG_DTYPE_F32, POISON_STEP);
        for (int k = 0; k < 3; k++) poison(g16[k], n[k], TG_DTYPE_BF16, 0);
        const tg_dtype gd = path == 1 ? TG_DTYPE_BF16 : TG_DTYPE_F32;
        void *dQ = gd == TG_DTYPE_BF16 ? (void *)g16[0] : g32[0];
        void *dK = gd == TG_DTYPE_BF16 ? (void *)g16[1] : g32[1];
        void *dV = gd == TG_DTYPE_BF16 ? (void *)g16[2] : g32[2];
        if (path < 2) {
          TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_step(ctx, dt, gd, Q, K, V, O, L, dO, dQ, dK,
                                                       dV, &pb.p, &pb.mp, M, 1, &opt),
                           TG_OK);
        } else { /* head-major: O and dO are contiguous rows */
          TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_compute_d(ctx, dt, O, dO, Dvec, (uint32_t)c.B,
                                                             (uint32_t)c.H, (uint32_t)c.qL,
                                                             (uint32_t)c.D),
                           TG_OK);
          opt.flags |= TG_ATTN_OPT_DKV_WRITE;
          TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, dt, Q, K, V, L, dO, Dvec, g32[0], g32[1],
                                                  g32[2], &pb.p, &pb.mp, M, 1, &opt),
                           TG_OK);
        }
        int run_ok;
        if (gd == TG_DTYPE_F32) {
          run_ok = attn_check_grads(&pb, g32[0], g32[1], g32[2]);
        } else {
          run_ok = check_bf16_bound("dQ (bf16)", g16[0], pb.dQr, pb.dQe, pb.nQ);
          run_ok &= check_bf16_bound("dK (bf16)", g16[1], pb.dKr, pb.dKe, pb.nKout);
          run_ok &= check_bf16_bound("dV (bf16)", g16[2], pb.dVr, pb.dVe, pb.nVout);
        }
        run_ok &= empty_rows_zero(&pb, dQ, gd) && attn_check_d_sinks(&pb, ds);
        if (!run_ok)
          printf("  ^ in %s, %s, %s [%s, 2 threads, %s] (TG_TEST_SEED=%llu)\n", what,
                 path == 2 ? "three calls" : "step",
                 gd == TG_DTYPE_BF16 ? "bf16 gradients" : "f32 gradients",
                 tg_isa_name(tg_ctx_get_isa(ctx)),
                 run ? "ATOMIC, not deterministic" : "deterministic",
                 (unsigned long long)tu_seed());
        ok &= run_ok;
      }
      tg_ctx_destroy(ctx);
    }
    failures += !ok;
    for (int k = 0; k < 3; k++) free(g32[k]), free(g16[k]);
    free(O), free(L), free(ds), free(Dvec);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d variants out of the f64 reference's bounds", failures);
}

/* --- refused calls ------------------------------------------------------------------- */

/* The arguments of one step call. */
typedef struct {
  tg_dtype dt, gd;
  const void *Q, *K, *V, *O;
  const float *L;
  const void *dO;
  void *dQ, *dK, *dV;
  const tg_attn_params *p;
  const tg_attn_mask_params *mp;
  const void *mask;
  int causal;
  const tg_attn_options *opt;
} step_args;

static tg_status call_step(tg_ctx *ctx, const step_args *a) {
  return tg_attn_train_bwd_step(ctx, a->dt, a->gd, a->Q, a->K, a->V, a->O, a->L, a->dO, a->dQ,
                                a->dK, a->dV, a->p, a->mp, a->mask, a->causal, a->opt);
}

/* Every buffer a refused call could touch, inputs included (an output that
 * aliases an input makes it one), with a snapshot. */
enum { MAX_WATCHED = 24 };
typedef struct {
  int n;
  const char *name[MAX_WATCHED];
  void *p[MAX_WATCHED], *snap[MAX_WATCHED];
  size_t bytes[MAX_WATCHED];
} watched;

static void watch(watched *w, const char *name, void *p, size_t bytes) {
  if (!p) return;
  assert_true(w->n < MAX_WATCHED);
  w->name[w->n] = name, w->p[w->n] = p, w->bytes[w->n] = bytes;
  w->snap[w->n] = tu_alloc(bytes);
  memcpy(w->snap[w->n], p, bytes);
  w->n++;
}

/* The first watched buffer that changed since the snapshot, or NULL. */
static const char *changed(const watched *w) {
  for (int i = 0; i < w->n; i++)
    if (memcmp(w->p[i], w->snap[i], w->bytes[i])) return w->name[i];
  return NULL;
}

/* a refused with `status`, a message that names the entry point (and
 * `field`, when given), nothing written. */
static int expect_refused(tg_ctx *ctx, const step_args *a, tg_status status, const char *field,
                          const watched *w, const char *what) {
  const tg_status st = call_step(ctx, a);
  const char *msg = tg_ctx_last_error(ctx), *ch = changed(w);
  int ok = 1;
  if (st != status) {
    printf("  %s: status %d (%s), want %d (%s); message '%s'\n", what, (int)st, tg_status_str(st),
           (int)status, tg_status_str(status), msg);
    ok = 0;
  } else if (!msg[0] || !strstr(msg, "tg_attn_train_bwd_step") || (field && !strstr(msg, field))) {
    printf("  %s: message '%s' should name tg_attn_train_bwd_step%s%s\n", what, msg,
           field ? " and " : "", field ? field : "");
    ok = 0;
  }
  if (ch) {
    printf("  %s: refused, but %s was written\n", what, ch);
    ok = 0;
  }
  return ok;
}

/* NULL pointers (O among them), a grad_dtype or dtype outside tg_dtype, the
 * backward's own parameter and option checks (a sample), and outputs that
 * alias inputs or each other (dQ == O: O is an input; dK == dV; a bf16 dQ
 * that overlaps the last bytes of O; d_sinks on sinks): each refused with
 * its status and a message, every buffer (inputs too) unchanged, outputs
 * still poisoned. Then the same arguments, unbroken, succeed; and bf16
 * gradients packed back to back in one buffer (adjacent, not overlapping
 * at bf16's 2 bytes an element) are accepted with the bits of separate
 * buffers. */
static void test_step_refuses_bad_arguments(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 107);
  /* name     B  H Hkv qL kL  D Dv causal off mask tok W sinks p  softcap */
  const step_cfg c = {"bad", 1, 2, 1, 20, 17, 16, 0, 1, 0, 1, 0, 0, 1, 0.0f, 1.0f};
  step_problem pb;
  build(&pb, &c, &r);
  grads g32 = alloc_grads(&pb, TG_DTYPE_F32), g16 = alloc_grads(&pb, TG_DTYPE_BF16);
  reset_grads(&pb, &g32, POISON_STEP);
  reset_grads(&pb, &g16, POISON_STEP);
  /* one region for overlaps: room for an f32 O and a bf16 dQ after it */
  const size_t region_bytes = 4 * (size_t)pb.nO + 2 * (size_t)pb.nQ + 4 * (size_t)pb.nKg;
  char *region = tu_alloc(region_bytes);
  memset(region, 0x55, region_bytes);
  watched w = {0};
  const char *in_names[5] = {"Q", "K", "V", "dO", "mask"};
  const int64_t in_n[5] = {pb.nQ, pb.nK, pb.nV, pb.nO, pb.nM};
  for (int t = 0; t < 5; t++) {
    watch(&w, in_names[t], pb.f32[t], 4 * (size_t)in_n[t]);
    watch(&w, in_names[t], pb.bf16[t], 2 * (size_t)in_n[t]);
  }
  for (int dt = 0; dt < 2; dt++) {
    watch(&w, "O", pb.in[dt].O, esize((tg_dtype)dt) * (size_t)pb.nO);
    watch(&w, "L", pb.in[dt].L, 4 * (size_t)pb.nL);
  }
  watch(&w, "sinks", pb.sinks, 4 * (size_t)c.H);
  grads *gs[2] = {&g32, &g16};
  for (int k = 0; k < 2; k++) {
    const size_t e = esize(gs[k]->gd);
    watch(&w, "dQ", gs[k]->dQ, e * (size_t)pb.nQ);
    watch(&w, "dK", gs[k]->dK, e * (size_t)pb.nKg);
    watch(&w, "dV", gs[k]->dV, e * (size_t)pb.nVg);
    watch(&w, "d_sinks", gs[k]->d_sinks, 4 * (size_t)c.H);
  }
  watch(&w, "the overlap region", region, region_bytes);

  tg_attn_options opt = pb.opt;
  opt.d_sinks = g32.d_sinks;
  const step_inputs *f = &pb.in[TG_DTYPE_F32], *b = &pb.in[TG_DTYPE_BF16];
  const step_args good = {TG_DTYPE_F32, TG_DTYPE_F32, f->Q, f->K, f->V, f->O, f->L, f->dO,
                          g32.dQ, g32.dK, g32.dV, &pb.p, &pb.mp, f->mask, 1, &opt};
  tg_ctx *ctx = make_ctx(2, 0, TG_ATTN_SCHEDULE_KV, TG_ATTN_PRECISION_EXACT);
  int failures = 0, cases = 0;
  step_args a;
#define REFUSED(status, field, what) \
  (cases++, failures += !expect_refused(ctx, &a, status, field, &w, what))

  /* NULL pointers */
  a = good, a.Q = NULL, REFUSED(TG_ERR_NULL_ARG, "Q", "Q NULL");
  a = good, a.K = NULL, REFUSED(TG_ERR_NULL_ARG, "K", "K NULL");
  a = good, a.V = NULL, REFUSED(TG_ERR_NULL_ARG, "V", "V NULL");
  a = good, a.O = NULL, REFUSED(TG_ERR_NULL_ARG, "O", "O NULL");
  a = good, a.L = NULL, REFUSED(TG_ERR_NULL_ARG, "L", "L NULL");
  a = good, a.dO = NULL, REFUSED(TG_ERR_NULL_ARG, "dO", "dO NULL");
  a = good, a.dQ = NULL, REFUSED(TG_ERR_NULL_ARG, "dQ", "dQ NULL");
  a = good, a.dK = NULL, REFUSED(TG_ERR_NULL_ARG, "dK", "dK NULL");
  a = good, a.dV = NULL, REFUSED(TG_ERR_NULL_ARG, "dV", "dV NULL");
  a = good, a.p = NULL, REFUSED(TG_ERR_NULL_ARG, NULL, "params NULL");
  a = good, a.mask = NULL, REFUSED(TG_ERR_NULL_ARG, NULL, "mask params without a mask");
  a = good, a.gd = TG_DTYPE_BF16, a.dQ = g16.dQ, a.dK = g16.dK, a.dV = g16.dV, a.O = NULL;
  REFUSED(TG_ERR_NULL_ARG, "O", "O NULL, bf16 gradients");
  assert_int_equal(call_step(NULL, &good), TG_ERR_NULL_ARG);
  failures += changed(&w) != NULL;

  /* grad_dtype and dtype outside tg_dtype */
  const int bad_types[] = {2, 7, -1, 1000};
  for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
    char what[64];
    snprintf(what, sizeof what, "grad_dtype %d", bad_types[i]);
    a = good, a.gd = (tg_dtype)bad_types[i], REFUSED(TG_ERR_BAD_PARAMS, "grad_dtype", what);
    snprintf(what, sizeof what, "dtype %d", bad_types[i]);
    a = good, a.dt = (tg_dtype)bad_types[i], REFUSED(TG_ERR_BAD_PARAMS, "dtype", what);
  }

  /* the backward's parameter and option checks */
  tg_attn_params q = pb.p;
  q.NK += 1;
  a = good, a.p = &q, REFUSED(TG_ERR_BAD_PARAMS, NULL, "params NK off by one");
  q = pb.p, q.D = 12;
  a = good, a.p = &q, REFUSED(TG_ERR_UNSUPPORTED, NULL, "head dim 12");
  tg_attn_options o = opt;
  o.dropout_p = 1.0f;
  a = good, a.opt = &o, REFUSED(TG_ERR_BAD_PARAMS, "dropout_p", "dropout_p 1");
  o = opt, o.flags = 4;
  a = good, a.opt = &o, REFUSED(TG_ERR_BAD_PARAMS, "flags", "an unknown flag");
  o = opt, o.sinks = NULL;
  a = good, a.opt = &o, REFUSED(TG_ERR_BAD_PARAMS, "d_sinks", "d_sinks without sinks");
  /* the forward's TG_ATTN_OPT_O_F32 with bf16 inputs: its O is f32, the
   * step reads O as bf16 */
  o = opt, o.flags = TG_ATTN_OPT_O_F32;
  a = good, a.dt = TG_DTYPE_BF16, a.Q = b->Q, a.K = b->K, a.V = b->V, a.O = b->O, a.L = b->L,
  a.dO = b->dO, a.mask = b->mask, a.opt = &o;
  REFUSED(TG_ERR_BAD_PARAMS, "TG_ATTN_OPT_O_F32", "O_F32 with bf16 inputs");
  o = opt, o.v_head_dim = 12;
  a = good, a.opt = &o, REFUSED(TG_ERR_UNSUPPORTED, "v_head_dim", "v_head_dim 12");

  /* aliasing: outputs on inputs (O is one) and on each other */
  a = good, a.dQ = (void *)f->O, REFUSED(TG_ERR_ALIAS, NULL, "dQ == O");
  a = good, a.dQ = (void *)f->Q, REFUSED(TG_ERR_ALIAS, NULL, "dQ == Q");
  a = good, a.dK = (void *)f->K, REFUSED(TG_ERR_ALIAS, NULL, "dK == K");
  a = good, a.dV = (void *)f->dO, REFUSED(TG_ERR_ALIAS, NULL, "dV == dO");
  a = good, a.dV = a.dK, REFUSED(TG_ERR_ALIAS, NULL, "dK == dV");
  a = good, a.dQ = region, a.dK = region + 4 * (pb.nQ - 1);
  REFUSED(TG_ERR_ALIAS, NULL, "dK overlapping the end of dQ");
  o = opt, o.d_sinks = pb.sinks;
  a = good, a.opt = &o, REFUSED(TG_ERR_ALIAS, NULL, "d_sinks == sinks");
  o = opt, o.d_sinks = (float *)f->L;
  a = good, a.opt = &o, REFUSED(TG_ERR_ALIAS, NULL, "d_sinks == L");
  /* bf16 inputs and gradients: the same sizes */
  const step_args good16 = {TG_DTYPE_BF16, TG_DTYPE_BF16, b->Q, b->K, b->V, b->O, b->L, b->dO,
                            g16.dQ, g16.dK, g16.dV, &pb.p, &pb.mp, b->mask, 1, &opt};
  tg_attn_options o16 = opt;
  o16.d_sinks = g16.d_sinks;
  a = good16, a.opt = &o16, a.dQ = (void *)b->O, REFUSED(TG_ERR_ALIAS, NULL, "bf16 dQ == bf16 O");
  a = good16, a.opt = &o16, a.dV = a.dK, REFUSED(TG_ERR_ALIAS, NULL, "bf16 dK == bf16 dV");
  a = good16, a.opt = &o16, a.dK = (void *)b->Q, REFUSED(TG_ERR_ALIAS, NULL, "bf16 dK == bf16 Q");
  /* f32 O in the region, a bf16 dQ sharing its last 2 bytes */
  a = good, a.opt = &o16, a.gd = TG_DTYPE_BF16, a.dK = g16.dK, a.dV = g16.dV;
  a.O = region, a.dQ = region + 4 * pb.nO - 2;
  REFUSED(TG_ERR_ALIAS, NULL, "bf16 dQ on the last 2 bytes of an f32 O");
  /* and under the ATOMIC schedule with bf16 gradients */
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
  a = good16, a.opt = &o16, a.O = NULL, REFUSED(TG_ERR_NULL_ARG, "O", "O NULL, ATOMIC asked");
  a = good16, a.opt = &o16, a.dQ = (void *)b->O;
  REFUSED(TG_ERR_ALIAS, NULL, "bf16 dQ == bf16 O, ATOMIC asked");
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_KV), TG_OK);
#undef REFUSED

  /* the arguments unbroken: accepted (f32 and bf16 gradients), the bits of
   * the three-call path */
  grad_sets s = alloc_sets(&pb);
  run_three_calls(ctx, &pb, TG_DTYPE_F32, &s.ref32);
  cast_grads(ctx, &pb, &s.ref32, &s.ref16);
  TU_EXPECT_STATUS(ctx, call_step(ctx, &good), TG_OK);
  failures += !same_grads(&pb, &s.ref32, &g32, "bad-args shape, good arguments");
  a = good, a.gd = TG_DTYPE_BF16, a.dQ = g16.dQ, a.dK = g16.dK, a.dV = g16.dV, a.opt = &o16;
  TU_EXPECT_STATUS(ctx, call_step(ctx, &a), TG_OK);
  failures += !same_grads(&pb, &s.ref16, &g16, "bad-args shape, good arguments, bf16");
  /* bf16 gradients back to back in one buffer: adjacent, not overlapping */
  tg_bf16 *packed = tu_alloc(2 * (size_t)(pb.nQ + pb.nKg + pb.nVg));
  for (int64_t e = 0; e < pb.nQ + pb.nKg + pb.nVg; e++) packed[e] = POISON_BF16;
  grads pk = {TG_DTYPE_BF16, packed, packed + pb.nQ, packed + pb.nQ + pb.nKg, g16.d_sinks};
  memcpy(g16.d_sinks, pb.d_sinks0, 4 * (size_t)c.H);
  a.dQ = pk.dQ, a.dK = pk.dK, a.dV = pk.dV;
  TU_EXPECT_STATUS(ctx, call_step(ctx, &a), TG_OK);
  failures += !same_grads(&pb, &s.ref16, &pk, "bf16 gradients packed in one buffer");
  free(packed);
  free_sets(&s);

  printf("  %d refused calls checked\n", cases);
  tg_ctx_destroy(ctx);
  for (int i = 0; i < w.n; i++) free(w.snap[i]);
  free(region);
  free_grads(&g32), free_grads(&g16);
  destroy(&pb);
  if (failures) TU_FAIL("%d checks of bad arguments failed", failures);
}

/* --- allocation failures -------------------------------------------------------------- */

/* Each allocation the step makes on a fresh context (its scratch, the
 * workspace of D_vec and of the dQ partials and dK, dV parts) fails in turn
 * (tg_testing_alloc_arm, as tests/test_hardening.c does for the other entry
 * points): TG_ERR_NO_MEMORY with a message saying so, no allocation after
 * the failed one, gradients and d_sinks untouched (still poisoned); then
 * the same call on that context succeeds with the bits of the three-call
 * path, as does the run in which no allocation failed. A shape with key
 * ranges (kL 520) and query groups, sinks; deterministic and not, both
 * schedules, both gradient types. */
static void test_step_alloc_failure(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 108);
  /* name       B  H Hkv qL  kL  D Dv causal off mask tok W sinks p     softcap */
  const step_cfg c = {"alloc", 1, 4, 2, 70, 520, 32, 0, 1, 0, 1, 0, 0, 1, 0.2f, 1.0f};
  step_problem pb;
  build(&pb, &c, &r);
  static const struct {
    int threads, det;
    tg_attn_schedule sched;
    tg_dtype gd;
    int vi;
  } runs[] = {
      {1, 0, TG_ATTN_SCHEDULE_KV, TG_DTYPE_F32, 0},
      {3, 1, TG_ATTN_SCHEDULE_KV, TG_DTYPE_BF16, 1},
      {2, 1, TG_ATTN_SCHEDULE_KV, TG_DTYPE_F32, 2},
      {3, 0, TG_ATTN_SCHEDULE_ATOMIC, TG_DTYPE_F32, 0},
      {3, 0, TG_ATTN_SCHEDULE_ATOMIC, TG_DTYPE_BF16, 3},
  };
  grad_sets s = alloc_sets(&pb);
  int failures = 0;
  for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
    const int vi = runs[ri].vi;
    const tg_dtype dt = variants[vi].dt, gd = runs[ri].gd;
    /* the bits to get (ATOMIC f32 at 3 threads has none: only the status
     * and the untouched outputs are checked there) */
    const int bitwise = !(runs[ri].sched == TG_ATTN_SCHEDULE_ATOMIC && gd == TG_DTYPE_F32);
    tg_ctx *ref = make_ctx(runs[ri].threads, runs[ri].det,
                           gd == TG_DTYPE_BF16 ? TG_ATTN_SCHEDULE_KV : runs[ri].sched,
                           variants[vi].prec);
    run_three_calls(ref, &pb, dt, &s.ref32);
    cast_grads(ref, &pb, &s.ref32, &s.ref16);
    tg_ctx_destroy(ref);
    grads *got = gd == TG_DTYPE_BF16 ? &s.got16 : &s.got32;
    const grads *want = gd == TG_DTYPE_BF16 ? &s.ref16 : &s.ref32;
    char base[256], what[300];
    int k;
    for (k = 0; k < 64; k++) {
      tg_ctx *ctx = make_ctx(runs[ri].threads, runs[ri].det, runs[ri].sched, variants[vi].prec);
      describe(base, sizeof base, &pb, vi, ctx, runs[ri].threads, runs[ri].det);
      snprintf(what, sizeof what, "%s, %s gradients, allocation %d", base,
               gd == TG_DTYPE_BF16 ? "bf16" : "f32", k);
      reset_grads(&pb, got, POISON_STEP);
      grads snap = alloc_grads(&pb, gd);
      const size_t e = esize(gd);
      memcpy(snap.dQ, got->dQ, e * (size_t)pb.nQ), memcpy(snap.dK, got->dK, e * (size_t)pb.nKg);
      memcpy(snap.dV, got->dV, e * (size_t)pb.nVg);
      memcpy(snap.d_sinks, got->d_sinks, 4 * (size_t)c.H);
      const step_inputs *in = &pb.in[dt];
      tg_attn_options opt = pb.opt;
      opt.d_sinks = got->d_sinks;
      int failed;
      tg_testing_alloc_arm(k);
      const tg_status st =
          tg_attn_train_bwd_step(ctx, dt, gd, in->Q, in->K, in->V, in->O, in->L, in->dO, got->dQ,
                                 got->dK, got->dV, &pb.p, &pb.mp, in->mask, 1, &opt);
      const long long made = tg_testing_alloc_disarm(&failed);
      if (!failed) { /* every allocation served: the result */
        TU_EXPECT_STATUS(ctx, st, TG_OK);
        if (bitwise) failures += !same_grads(&pb, want, got, what);
        free_grads(&snap);
        tg_ctx_destroy(ctx);
        break;
      }
      int ok = 1;
      if (st != TG_ERR_NO_MEMORY || !strstr(tg_ctx_last_error(ctx), "allocate")) {
        printf("  %s failed: status %d (%s), message '%s'\n", what, (int)st, tg_status_str(st),
               tg_ctx_last_error(ctx));
        ok = 0;
      }
      if (made != k + 1) {
        printf("  %s failed, then %lld more allocations were made\n", what, made - k - 1);
        ok = 0;
      }
      if (!same_bits("dQ after a failed allocation", snap.dQ, got->dQ, pb.nQ, e) ||
          !same_bits("dK after a failed allocation", snap.dK, got->dK, pb.nKg, e) ||
          !same_bits("dV after a failed allocation", snap.dV, got->dV, pb.nVg, e) ||
          !same_bits("d_sinks after a failed allocation", snap.d_sinks, got->d_sinks, c.H, 4))
        ok = 0;
      /* the context recovers: the same call succeeds on it */
      reset_grads(&pb, got, POISON_STEP);
      TU_EXPECT_STATUS(ctx,
                       tg_attn_train_bwd_step(ctx, dt, gd, in->Q, in->K, in->V, in->O, in->L,
                                              in->dO, got->dQ, got->dK, got->dV, &pb.p, &pb.mp,
                                              in->mask, 1, &opt),
                       TG_OK);
      if (bitwise) ok &= same_grads(&pb, want, got, what);
      if (!ok) printf("  ^ %s\n", what);
      failures += !ok;
      free_grads(&snap);
      tg_ctx_destroy(ctx);
    }
    if (k == 64) TU_FAIL("%s: still failing after 64 allocations", what);
    printf("  %s, %s gradients: %d allocation(s), each failure refused cleanly\n", base,
           gd == TG_DTYPE_BF16 ? "bf16" : "f32", k);
  }
  free_sets(&s);
  destroy(&pb);
  if (failures) TU_FAIL("%d allocation-failure checks failed", failures);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_refuses_bad_arguments),
      cmocka_unit_test(test_step_matches_three_calls),
      cmocka_unit_test(test_step_deterministic_threads),
      cmocka_unit_test(test_step_dkv_transposed_forced),
      cmocka_unit_test(test_step_atomic_schedule),
      cmocka_unit_test(test_step_context_reuse),
      cmocka_unit_test(test_step_key_chunks),
      cmocka_unit_test(test_step_alloc_failure),
      cmocka_unit_test(test_step_against_f64),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
