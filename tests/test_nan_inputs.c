/*
 * NaN and +-inf in every input of every entry point (the
 * attention forward has its own suite, tests/test_attn_nan.c). The contract
 * (docs/KERNELS.md): an input NaN reaches every output element that depends
 * on it, as IEEE arithmetic and PyTorch do; +-inf follows the same
 * arithmetic (softmax of a +inf score is NaN); where a kernel's contract
 * departs from plain IEEE arithmetic, the reference follows the contract:
 *   - attention: a row that sees no key (fully masked, or L = -inf handed to
 *     the backward) contributes nothing; a masked or causally hidden key is
 *     no dependency of its row;
 *   - cross-entropy: a pad row reads no logit (grad 0, no loss); a -inf
 *     target gives loss +inf and a finite grad; a row of -inf only takes the
 *     equal-logits limit;
 *   - decode reduce: a workgroup with M = -inf is empty (its S and partials
 *     are never read); a row with St == 0 is 0;
 *   - cast: every NaN becomes the one quiet NaN 0x7FC0.
 *
 * For each entry point and each of its input buffers, NaN, +inf and -inf in
 * turn are planted at a random element (cross-entropy: also at a target
 * logit; decode: in the partials, the S and the M fields, and in a workgroup
 * whose weight underflows in f32), the kernel runs with its written outputs
 * poisoned by a finite sentinel (accumulated outputs start from a random
 * prefill), at 1 and 3 threads, and every output element is checked against
 * the f64 reference of the kernel's suite (tests/common/refs.h,
 * tests/common/attn_problem.h) evaluated on the same inputs in IEEE
 * arithmetic (tu_check_ieee): NaN where it is NaN, the same infinity where it
 * is infinite, within the suite's bound where it is finite.
 *
 * The attention backward runs with the variants too (tg_attn_train_bwd in
 * f32 with a window, sinks and d_sinks, Dv != D; NaN, +inf, -inf in a sink
 * among the planted values).
 *
 * Attention backward and kernel 10 multiply whole tiles: a key the mask or
 * the causal limit hides from a row still meets it in the tile products with
 * P = 0 (and dS = 0), and 0 * NaN, 0 * inf are NaN, as in PyTorch's matmul.
 * Such elements depend on the NaN only through an exact zero: the kernel may
 * make them NaN or keep them finite. The dense references (every pair of
 * every row entering, as a tile sees it) say where that may happen, and
 * tu_check_ieee accepts NaN (or the dense infinity) there; everywhere else
 * the exact rule above holds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_problem.h"
#include "refs.h"

/* --- planting ------------------------------------------------------------------ */
static const float special[3] = {NAN, INFINITY, -INFINITY};
static const char *const special_name[3] = {"NaN", "+inf", "-inf"};
static const int nan_threads[2] = {1, 3};
enum { N_SPECIAL = 3, N_THREADS = 2 };

/* Written outputs start as this: a kernel that leaves an element unwritten
 * fails the comparison even where the reference is NaN. */
static const float SENTINEL = 1234.5f;

static void fill_sentinel(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = SENTINEL;
}

/* An input buffer of the entry point under test: f32 or bf16 elements. */
typedef struct {
  const char *name;
  void *p;
  int64_t n;
  int bf16;
} input;

/* A value planted in an input, and where the kernel ran: for messages. */
typedef struct {
  const char *kernel, *input;
  int sv; /* special[sv] */
  int64_t at;
  tg_isa isa;
  int threads;
} planted;

static int failures; /* of the current test */

/* Plants special[sv] at element `at` of in; returns the bits it replaced. */
static uint32_t plant(const input *in, int64_t at, int sv) {
  uint32_t old = 0;
  if (in->bf16) {
    tg_bf16 *x = in->p;
    old = x[at];
    x[at] = tg_f32_to_bf16(special[sv]);
  } else {
    float *x = in->p;
    memcpy(&old, &x[at], sizeof old);
    x[at] = special[sv];
  }
  return old;
}

static void unplant(const input *in, int64_t at, uint32_t old) {
  if (in->bf16)
    ((tg_bf16 *)in->p)[at] = (tg_bf16)old;
  else
    memcpy((float *)in->p + at, &old, sizeof old);
}

static int64_t random_at(tu_rng *r, int64_t n) { return (int64_t)(tu_next(r) % (uint64_t)n); }

/* Compares one output (tu_check_ieee) and counts a failure. */
static void expect(const planted *w, const char *output, const float *got, const double *want,
                   const double *bound, const double *may, int64_t n) {
  char what[256];
  snprintf(what, sizeof what, "%s: %s in %s[%lld] -> %s [%s, %d threads]", w->kernel,
           special_name[w->sv], w->input, (long long)w->at, output, tg_isa_name(w->isa),
           w->threads);
  if (!tu_check_ieee(what, got, want, bound, may, n)) failures++;
}

static void end_test(const char *kernel) {
  if (failures) TU_FAIL("%s: %d outputs wrong (above)", kernel, failures);
}

static double *dalloc(int64_t n) { return tu_alloc(sizeof(double) * (size_t)n); }
static float *falloc(int64_t n) { return tu_alloc(sizeof(float) * (size_t)n); }

/* --- 1. compute_d: O, dO ---------------------------------------------------------- */
static void test_compute_d(void **state) {
  enum { B = 1, H = 2, QL = 37, D = 24, ROWS = B * H * QL };
  tu_rng r = tu_rng_make(tu_seed() + 1101);
  failures = 0;
  tg_bf16 *O = tu_alloc(2 * ROWS * D), *dO = tu_alloc(2 * ROWS * D);
  tu_fill_bf16(&r, O, ROWS * D, -3, 3);
  tu_fill_bf16(&r, dO, ROWS * D, -3, 3);
  double *want = dalloc(ROWS), *bound = dalloc(ROWS);
  float *got = falloc(ROWS);
  const input ins[] = {{"O", O, ROWS * D, 1}, {"dO", dO, ROWS * D, 1}};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (size_t b = 0; b < 2; b++)
    for (int sv = 0; sv < N_SPECIAL; sv++) {
      const int64_t at = random_at(&r, ins[b].n);
      const uint32_t old = plant(&ins[b], at, sv);
      ref_compute_d(O, dO, ROWS, D, want, bound);
      for (int ii = 0; ii < nisa; ii++)
        for (int t = 0; t < N_THREADS; t++) {
          const planted w = {"compute_d", ins[b].name, sv, at, isas[ii], nan_threads[t]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          fill_sentinel(got, ROWS);
          TU_EXPECT_STATUS(
              ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, got, B, H, QL, D), TG_OK);
          expect(&w, "D_out", got, want, bound, NULL, ROWS);
          tg_ctx_destroy(ctx);
        }
      unplant(&ins[b], at, old);
    }
  free(O), free(dO), free(want), free(bound), free(got);
  end_test("compute_d");
}

/* --- 2. FA-2 backward: Q, K, V, L, dO, D_vec, mask ------------------------------------ */
static const attn_cfg fa2_configs[] = {
    /* name                   B  H Hkv qL  kL  D  causal off mask layout        softcap p */
    {"gqa causal mask",       1, 2, 1, 70, 100, 16, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"softcap token-major",   1, 2, 2, 40, 50,  8,  0, 0, 2, ATTN_TOKEN_MAJOR, 5.0f, 0},
};
/* 20 % of the mask -inf; rows 5, 45, ... of the mask entirely -inf (L = -inf) */
static const attn_suite fa2_suite = {.bf16 = 1, .mask_ninf = 0.2, .mask_lo = -3,
                                     .mask_row0 = 5, .mask_step = 40, .acc = ATTN_ACC_RANDOM,
                                     .row = attn_bwd_row};

/* The outputs of a backward entry point, and the entry point run on a
 * problem (the FA-2 bf16 one, the f32 one with the variants). */
typedef struct {
  float *dQ, *dK, *dV, *d_sinks; /* d_sinks NULL: none */
} bwd_out;

typedef void bwd_entry(tg_ctx *ctx, const attn_problem *pb, const bwd_out *o);

/* The dense references of a planted problem (every pair of a tile entering:
 * where the kernel may also give NaN, tu_check_ieee's may) of dQ, dK, dV. */
typedef struct {
  double *dQ, *dK, *dV;
} attn_may;

/* special[0..2] in turn at a random element of `in` (a buffer of pb), the
 * references from pb's planted inputs, then `entry` on every ISA, at 1 and 3
 * threads, on both schedules, each output checked (dK, dV, d_sinks from
 * their starting values). */
static void plant_and_check_backward(const char *name, attn_problem *pb, const input *in,
                                     tu_rng *r, bwd_entry *entry, const bwd_out *o,
                                     const attn_may *may) {
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int sv = 0; sv < N_SPECIAL; sv++) {
    const int64_t at = random_at(r, in->n);
    const uint32_t old = plant(in, at, sv);
    attn_reference(pb, attn_bwd_row_given, 1);
    memcpy(may->dQ, pb->dQr, sizeof(double) * pb->nQ);
    memcpy(may->dK, pb->dKr, sizeof(double) * pb->nKout);
    memcpy(may->dV, pb->dVr, sizeof(double) * pb->nVout);
    attn_reference(pb, attn_bwd_row_given, 0);
    for (int ii = 0; ii < nisa; ii++)
      for (int t = 0; t < N_THREADS; t++)
        for (int sched = TG_ATTN_SCHEDULE_KV; sched <= TG_ATTN_SCHEDULE_ATOMIC; sched++) {
          char kernel[128];
          snprintf(kernel, sizeof kernel, "%s (%s, %s schedule)", name, pb->c.name,
                   sched == TG_ATTN_SCHEDULE_KV ? "KV" : "atomic");
          const planted w = {kernel, in->name, sv, at, isas[ii], nan_threads[t]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          assert_int_equal(tg_ctx_set_attn_schedule(ctx, (tg_attn_schedule)sched), TG_OK);
          fill_sentinel(o->dQ, pb->nQ);
          memcpy(o->dK, pb->dK0, sizeof(float) * pb->nKout);
          memcpy(o->dV, pb->dV0, sizeof(float) * pb->nVout);
          if (o->d_sinks) memcpy(o->d_sinks, pb->d_sinks0, sizeof(float) * pb->p.H);
          entry(ctx, pb, o);
          expect(&w, "dQ", o->dQ, pb->dQr, pb->dQe, may->dQ, pb->nQ);
          expect(&w, "dK", o->dK, pb->dKr, pb->dKe, may->dK, pb->nKout);
          expect(&w, "dV", o->dV, pb->dVr, pb->dVe, may->dV, pb->nVout);
          if (o->d_sinks) expect(&w, "d_sinks", o->d_sinks, pb->dsr, pb->dse, NULL, pb->p.H);
          tg_ctx_destroy(ctx);
        }
    unplant(in, at, old);
  }
}

/* Every input of the problem (those it has: inputs[i].p not NULL) in turn
 * (plant_and_check_backward), with outputs and references of its sizes. */
static void check_backward_inputs(const char *name, attn_problem *pb, const input *inputs,
                                  size_t n_inputs, tu_rng *r, bwd_entry *entry) {
  const bwd_out o = {falloc(pb->nQ), falloc(pb->nKout), falloc(pb->nVout),
                     pb->sinks ? falloc(pb->p.H) : NULL};
  const attn_may may = {dalloc(pb->nQ), dalloc(pb->nKout), dalloc(pb->nVout)};
  for (size_t b = 0; b < n_inputs; b++)
    if (inputs[b].p) plant_and_check_backward(name, pb, &inputs[b], r, entry, &o, &may);
  free(o.dQ), free(o.dK), free(o.dV), free(o.d_sinks);
  free(may.dQ), free(may.dK), free(may.dV);
}

static void fa2_backward_bf16(tg_ctx *ctx, const attn_problem *pb, const bwd_out *o) {
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_bf16(ctx, pb->Qb, pb->Kb, pb->Vb, pb->L, pb->dOb,
                                                pb->Dv, o->dQ, o->dK, o->dV, &pb->p,
                                                pb->maskb ? &pb->mp : NULL, pb->maskb,
                                                pb->c.causal),
                   TG_OK);
}

static void test_attention_backward(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1102);
  failures = 0;
  for (size_t ci = 0; ci < sizeof fa2_configs / sizeof fa2_configs[0]; ci++) {
    attn_problem pb;
    attn_build(&pb, &fa2_configs[ci], &fa2_suite, &r);
    const input ins[] = {{"Q", pb.Qb, pb.nQ, 1},   {"K", pb.Kb, pb.nK, 1},
                         {"V", pb.Vb, pb.nK, 1},   {"L", pb.L, pb.nL, 0},
                         {"dO", pb.dOb, pb.nQ, 1}, {"D_vec", pb.Dv, pb.nL, 0},
                         {"mask", pb.maskb, pb.nM, 1}};
    check_backward_inputs("FA-2 backward", &pb, ins, sizeof ins / sizeof ins[0], &r,
                          fa2_backward_bf16);
    attn_destroy(&pb);
  }
  end_test("FA-2 backward");
}

/* The f32 backward (tg_attn_train_bwd) with the variants: a window, sinks
 * (an input, and d_sinks accumulated) and a value head dim. The sinks enter
 * d_sinks alone (L holds them): a NaN sink makes d_sinks[h] NaN, +inf gives
 * it +-inf (or NaN where the rows' terms cancel), -inf is no sink. A key
 * the window hides is no dependency of its row but for the tile products
 * (the dense reference). */
static const struct {
  attn_cfg c;
  attn_variants v;
} variant_configs[] = {
    {{"window sinks Dv causal mask", 1, 2, 1, 40, 60, 16, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0},
     {9, 24, ATTN_SINKS_RANDOM}},
    {{"window sinks Dv softcap strided", 1, 4, 2, 30, 50, 8, 0, 0, 0, ATTN_STRIDED, 5.0f, 0},
     {20, 8, ATTN_SINKS_EXTREME}},
};
static const attn_suite variant_suite = {.mask_ninf = 0.2, .mask_lo = -3, .mask_row0 = 5,
                                         .mask_step = 40, .acc = ATTN_ACC_RANDOM,
                                         .options = 1, .row = attn_bwd_row};

static void backward_f32_variants(tg_ctx *ctx, const attn_problem *pb, const bwd_out *o) {
  tg_attn_options opt = pb->opt;
  opt.d_sinks = o->d_sinks;
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb->Q, pb->K, pb->V, pb->L, pb->dO,
                                     pb->Dv, o->dQ, o->dK, o->dV, &pb->p,
                                     pb->mask ? &pb->mp : NULL, pb->mask, pb->c.causal, &opt),
                   TG_OK);
}

static void test_attention_backward_variants(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1112);
  failures = 0;
  for (size_t ci = 0; ci < sizeof variant_configs / sizeof variant_configs[0]; ci++) {
    attn_problem pb;
    attn_build_v(&pb, &variant_configs[ci].c, &variant_configs[ci].v, &variant_suite, &r);
    const input ins[] = {{"Q", pb.Q, pb.nQ, 0},      {"K", pb.K, pb.nK, 0},
                         {"V", pb.V, pb.nV, 0},      {"L", pb.L, pb.nL, 0},
                         {"dO", pb.dO, pb.nO, 0},    {"D_vec", pb.Dv, pb.nL, 0},
                         {"mask", pb.mask, pb.nM, 0}, {"sinks", pb.sinks, pb.p.H, 0}};
    check_backward_inputs("f32 backward", &pb, ins, sizeof ins / sizeof ins[0], &r,
                          backward_f32_variants);
    attn_destroy(&pb);
  }
  end_test("f32 backward with variants");
}

/* --- 3. cast: every output bit as ref_bf16 says ------------------------------------------ */
static void test_cast(void **state) {
  enum { N = 1000 };
  tu_rng r = tu_rng_make(tu_seed() + 1103);
  failures = 0;
  float *src = falloc(N);
  tg_bf16 *dst = tu_alloc(2 * N);
  tu_fill_f32(&r, src, N, -10, 10);
  const input in = {"src", src, N, 0};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int sv = 0; sv < N_SPECIAL; sv++) {
    const int64_t at = random_at(&r, N);
    const uint32_t old = plant(&in, at, sv);
    for (int ii = 0; ii < nisa; ii++)
      for (int t = 0; t < N_THREADS; t++) {
        tg_ctx *ctx = tu_ctx(nan_threads[t], isas[ii]);
        memset(dst, 0x5A, 2 * N);
        TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, N), TG_OK);
        for (int64_t i = 0; i < N; i++)
          if (dst[i] != ref_bf16(src[i])) {
            printf("  cast: %s in src[%lld] -> dst[%lld] = 0x%04x, want 0x%04x [%s, %d threads]\n",
                   special_name[sv], (long long)at, (long long)i, dst[i], ref_bf16(src[i]),
                   tg_isa_name(isas[ii]), nan_threads[t]);
            failures++;
            break;
          }
        tg_ctx_destroy(ctx);
      }
    unplant(&in, at, old);
  }
  free(src), free(dst);
  end_test("cast");
}

/* --- 4-5. RMSNorm ----------------------------------------------------------------- */
/* rows x dim: two row blocks of the row kernels, dim off the 16-lane grid */
enum { RMS_ROWS = 300, RMS_DIM = 257, RMS_N = RMS_ROWS * RMS_DIM };
static const float RMS_EPS = 1e-5f;

typedef struct {
  float *x, *w, *dy, *r, *gw_pre;          /* inputs (r: the given r of dx and dw) */
  float *y, *r_out, *dx, *dw;              /* outputs */
  double *want, *bound, *want2, *bound2;   /* [RMS_N] references (two outputs) */
} rms_bufs;

static rms_bufs rms_make(tu_rng *r) {
  rms_bufs b = {falloc(RMS_N), falloc(RMS_DIM),  falloc(RMS_N), falloc(RMS_ROWS),
                falloc(RMS_DIM), falloc(RMS_N), falloc(RMS_ROWS), falloc(RMS_N),
                falloc(RMS_DIM), dalloc(RMS_N), dalloc(RMS_N), dalloc(RMS_N), dalloc(RMS_N)};
  tu_fill_f32(r, b.x, RMS_N, -2, 2);
  tu_fill_f32(r, b.w, RMS_DIM, -1.5, 1.5);
  tu_fill_f32(r, b.dy, RMS_N, -1, 1);
  tu_fill_f32(r, b.r, RMS_ROWS, 0.5, 2);
  tu_fill_f32(r, b.gw_pre, RMS_DIM, -1, 1);
  return b;
}

static void rms_free(rms_bufs *b) {
  void *p[] = {b->x,  b->w,  b->dy, b->r,    b->gw_pre, b->y,      b->r_out,
               b->dx, b->dw, b->want, b->bound, b->want2, b->bound2};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* The five RMSNorm entry points, each with its inputs. */
enum { RMS_FORWARD, RMS_INV, RMS_DX, RMS_DW, RMS_FUSED, N_RMS };
static const char *const rms_kernel[N_RMS] = {"rms_norm_forward", "rms_inv", "rms_dx", "rms_dw",
                                              "rms_norm_backward (fused)"};

/* The reference of kernel k on b's current inputs. */
static void rms_reference(int k, rms_bufs *b) {
  switch (k) {
    case RMS_FORWARD:
    case RMS_INV:
      ref_rms_forward(b->x, b->w, RMS_ROWS, RMS_DIM, RMS_EPS, k == RMS_FORWARD ? b->want : NULL,
                      b->bound, b->want2, b->bound2);
      break;
    case RMS_DX: ref_rms_dx(b->x, b->w, b->dy, b->r, RMS_ROWS, RMS_DIM, b->want, b->bound); break;
    case RMS_DW: ref_rms_dw(b->x, b->dy, b->r, RMS_ROWS, RMS_DIM, b->want, b->bound); break;
    case RMS_FUSED:
      ref_rms_fused(b->x, b->w, b->dy, b->gw_pre, RMS_ROWS, RMS_DIM, RMS_EPS, b->want, b->bound,
                    b->want2, b->bound2);
      break;
  }
}

/* Runs kernel k and checks its outputs. */
static void rms_run(int k, rms_bufs *b, const planted *w) {
  tg_ctx *ctx = tu_ctx(w->threads, w->isa);
  for (int det = 0; det <= (k == RMS_FUSED); det++) { /* fused: both grad_weight paths */
    assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
    fill_sentinel(b->y, RMS_N), fill_sentinel(b->r_out, RMS_ROWS);
    fill_sentinel(b->dx, RMS_N), fill_sentinel(b->dw, RMS_DIM);
    switch (k) {
      case RMS_FORWARD:
        TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, b->x, b->w, b->y, b->r_out, RMS_ROWS,
                                                      RMS_DIM, RMS_EPS),
                         TG_OK);
        expect(w, "y", b->y, b->want, b->bound, NULL, RMS_N);
        expect(w, "r_out", b->r_out, b->want2, b->bound2, NULL, RMS_ROWS);
        break;
      case RMS_INV:
        TU_EXPECT_STATUS(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, b->x, b->r_out, RMS_ROWS,
                                                              RMS_DIM, RMS_EPS),
                         TG_OK);
        expect(w, "r_out", b->r_out, b->want2, b->bound2, NULL, RMS_ROWS);
        break;
      case RMS_DX:
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward_dx_f32(ctx, b->x, b->w, b->dy, b->r, b->dx,
                                                          RMS_ROWS, RMS_DIM),
                         TG_OK);
        expect(w, "dx", b->dx, b->want, b->bound, NULL, RMS_N);
        break;
      case RMS_DW:
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward_dw_f32(ctx, b->x, b->dy, b->r, b->dw,
                                                          RMS_ROWS, RMS_DIM),
                         TG_OK);
        expect(w, "dw", b->dw, b->want, b->bound, NULL, RMS_DIM);
        break;
      case RMS_FUSED:
        memcpy(b->dw, b->gw_pre, sizeof(float) * RMS_DIM); /* grad_weight accumulates */
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward(ctx, b->x, b->w, b->dy, b->dx, b->dw,
                                                   RMS_ROWS, RMS_DIM, RMS_EPS),
                         TG_OK);
        expect(w, det ? "grad_input (det)" : "grad_input", b->dx, b->want, b->bound, NULL,
               RMS_N);
        expect(w, det ? "grad_weight (det)" : "grad_weight", b->dw, b->want2, b->bound2, NULL,
               RMS_DIM);
        break;
    }
  }
  tg_ctx_destroy(ctx);
}

static void test_rmsnorm(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1104);
  failures = 0;
  rms_bufs b = rms_make(&r);
  const input x = {"x", b.x, RMS_N, 0}, wt = {"w", b.w, RMS_DIM, 0};
  const input dy = {"dy", b.dy, RMS_N, 0}, rr = {"r", b.r, RMS_ROWS, 0};
  const input *const ins[N_RMS][4] = {
      [RMS_FORWARD] = {&x, &wt}, [RMS_INV] = {&x},          [RMS_DX] = {&x, &wt, &dy, &rr},
      [RMS_DW] = {&x, &dy, &rr}, [RMS_FUSED] = {&x, &wt, &dy}};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int k = 0; k < N_RMS; k++)
    for (int i = 0; i < 4 && ins[k][i]; i++)
      for (int sv = 0; sv < N_SPECIAL; sv++) {
        const input *in = ins[k][i];
        const int64_t at = random_at(&r, in->n);
        const uint32_t old = plant(in, at, sv);
        rms_reference(k, &b);
        for (int ii = 0; ii < nisa; ii++)
          for (int t = 0; t < N_THREADS; t++) {
            const planted w = {rms_kernel[k], in->name, sv, at, isas[ii], nan_threads[t]};
            rms_run(k, &b, &w);
          }
        unplant(in, at, old);
      }
  rms_free(&b);
  end_test("RMSNorm");
}

/* --- 6. softmax backward: sm, grad_out -------------------------------------------- */
static void test_softmax_backward(void **state) {
  enum { ROWS = 300, LEN = 257, N = ROWS * LEN };
  tu_rng r = tu_rng_make(tu_seed() + 1106);
  failures = 0;
  float *sm = falloc(N), *go = falloc(N), *gi = falloc(N);
  double *want = dalloc(N), *bound = dalloc(N);
  for (int64_t b = 0; b < ROWS; b++) { /* rows of a softmax: positive, summing to ~1 */
    double s = 0;
    tu_fill_f32(&r, sm + b * LEN, LEN, 0.01, 1);
    for (int64_t j = 0; j < LEN; j++) s += sm[b * LEN + j];
    for (int64_t j = 0; j < LEN; j++) sm[b * LEN + j] = (float)(sm[b * LEN + j] / s);
  }
  tu_fill_f32(&r, go, N, -1, 1);
  const input ins[] = {{"sm", sm, N, 0}, {"grad_out", go, N, 0}};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (size_t b = 0; b < 2; b++)
    for (int sv = 0; sv < N_SPECIAL; sv++) {
      const int64_t at = random_at(&r, N);
      const uint32_t old = plant(&ins[b], at, sv);
      ref_softmax_backward(sm, go, ROWS, LEN, want, bound);
      for (int ii = 0; ii < nisa; ii++)
        for (int t = 0; t < N_THREADS; t++) {
          const planted w = {"softmax_backward", ins[b].name, sv, at, isas[ii], nan_threads[t]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          fill_sentinel(gi, N);
          TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, gi, ROWS, LEN), TG_OK);
          expect(&w, "grad_in", gi, want, bound, NULL, N);
          tg_ctx_destroy(ctx);
        }
      unplant(&ins[b], at, old);
    }
  free(sm), free(go), free(gi), free(want), free(bound);
  end_test("softmax_backward");
}

/* --- 7. embedding backward: grad_out ---------------------------------------------- */
static void test_embedding_backward(void **state) {
  enum { VOCAB = 20, SEQ = 200, DIM = 40 };
  tu_rng r = tu_rng_make(tu_seed() + 1107);
  failures = 0;
  float *g = falloc(SEQ * DIM), *pre = falloc(VOCAB * DIM), *gw = falloc(VOCAB * DIM);
  uint32_t *ids = tu_alloc(sizeof(uint32_t) * SEQ);
  double *want = dalloc(VOCAB * DIM), *bound = dalloc(VOCAB * DIM);
  tu_fill_f32(&r, g, SEQ * DIM, -1, 1);
  tu_fill_f32(&r, pre, VOCAB * DIM, -2, 2);
  for (int t = 0; t < SEQ; t++) ids[t] = (uint32_t)tu_int(&r, 0, VOCAB - 1); /* repeats */
  const input in = {"grad_out", g, SEQ * DIM, 0};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int sv = 0; sv < N_SPECIAL; sv++) {
    const int64_t at = random_at(&r, in.n);
    const uint32_t old = plant(&in, at, sv);
    ref_embedding_backward(g, ids, pre, VOCAB, SEQ, DIM, want, bound);
    for (int ii = 0; ii < nisa; ii++)
      for (int t = 0; t < N_THREADS; t++) {
        const planted w = {"embedding_backward", in.name, sv, at, isas[ii], nan_threads[t]};
        tg_ctx *ctx = tu_ctx(w.threads, w.isa);
        memcpy(gw, pre, sizeof(float) * VOCAB * DIM);
        TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, VOCAB, SEQ, DIM), TG_OK);
        expect(&w, "grad_weight", gw, want, bound, NULL, VOCAB * DIM);
        tg_ctx_destroy(ctx);
      }
    unplant(&in, at, old);
  }
  free(g), free(pre), free(gw), free(ids), free(want), free(bound);
  end_test("embedding_backward");
}

/* --- 8. cross-entropy: one logit, and a target logit -------------------------------- */
static void test_cross_entropy(void **state) {
  /* 2500 logits a row: three chunks of the online softmax (TG_SOFTMAX_CHUNK) */
  enum { NPOS = 12, V = 2500, N = NPOS * V, PAD_ID = 7 };
  tu_rng r = tu_rng_make(tu_seed() + 1108);
  failures = 0;
  float *logits = falloc(N), *grad = falloc(N);
  uint32_t targets[NPOS], count = 0;
  double *want = dalloc(N), *bound = dalloc(N), loss, loss_e;
  tu_fill_f32(&r, logits, N, -5, 5);
  for (int t = 0; t < NPOS; t++) {
    targets[t] = t % 4 == 3 ? PAD_ID : (uint32_t)tu_int(&r, 0, V - 1); /* every 4th a pad row */
    count += targets[t] != PAD_ID;
  }
  const float prefill = 0.75f;
  const input in = {"logits", logits, N, 0};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int where = 0; where < 2; where++) /* a random logit; a target logit */
    for (int sv = 0; sv < N_SPECIAL; sv++) {
      int t = tu_int(&r, 0, NPOS - 1);
      while (targets[t] == PAD_ID) t = tu_int(&r, 0, NPOS - 1);
      const int64_t at = where ? (int64_t)t * V + targets[t] : random_at(&r, N);
      const uint32_t old = plant(&in, at, sv);
      ref_cross_entropy(logits, targets, NPOS, V, PAD_ID, count, prefill, want, bound, &loss,
                        &loss_e);
      for (int ii = 0; ii < nisa; ii++)
        for (int th = 0; th < N_THREADS; th++) {
          const planted w = {where ? "cross_entropy (target logit)" : "cross_entropy",
                             in.name, sv, at, isas[ii], nan_threads[th]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          float got_loss = prefill;
          fill_sentinel(grad, N);
          TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, logits, targets, grad, &got_loss,
                                                         NPOS, V, PAD_ID, count),
                           TG_OK);
          expect(&w, "grad", grad, want, bound, NULL, N);
          expect(&w, "loss_out", &got_loss, &loss, &loss_e, NULL, 1);
          tg_ctx_destroy(ctx);
        }
      unplant(&in, at, old);
    }
  free(logits), free(grad), free(want), free(bound);
  end_test("cross_entropy");
}

/* --- 9. transpose: an exact copy, every bit ----------------------------------------- */
static void test_transpose(void **state) {
  enum { ROWS = 70, COLS = 130, N = ROWS * COLS };
  tu_rng r = tu_rng_make(tu_seed() + 1109);
  failures = 0;
  float *in = falloc(N), *out = falloc(N), *want = falloc(N);
  tu_fill_f32(&r, in, N, -10, 10);
  const input buf = {"input", in, N, 0};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int sv = 0; sv < N_SPECIAL; sv++) {
    const int64_t at = random_at(&r, N);
    const uint32_t old = plant(&buf, at, sv);
    for (int64_t i = 0; i < ROWS; i++)
      for (int64_t c = 0; c < COLS; c++) want[c * ROWS + i] = in[i * COLS + c];
    for (int ii = 0; ii < nisa; ii++)
      for (int t = 0; t < N_THREADS; t++) {
        tg_ctx *ctx = tu_ctx(nan_threads[t], isas[ii]);
        fill_sentinel(out, N);
        TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, ROWS, COLS), TG_OK);
        if (memcmp(out, want, sizeof(float) * N)) {
          printf("  transpose: %s in input[%lld]: output differs from the copy [%s, %d threads]\n",
                 special_name[sv], (long long)at, tg_isa_name(isas[ii]), nan_threads[t]);
          failures++;
        }
        tg_ctx_destroy(ctx);
      }
    unplant(&buf, at, old);
  }
  free(in), free(out), free(want);
  end_test("transpose");
}

/* --- 10. causal attention backward: Q, K, V, grad_out --------------------------------- */
static void test_causal_attention(void **state) {
  /* two q-tiles and key tiles on every ISA, GQA 2 */
  enum { S = 70, H = 4, HKV = 2, D = 16, NQ = S * H * D, NK = S * HKV * D };
  tu_rng r = tu_rng_make(tu_seed() + 1110);
  failures = 0;
  float *dO = falloc(NQ), *Q = falloc(NQ), *K = falloc(NK), *V = falloc(NK);
  float *preK = falloc(NK), *preV = falloc(NK), *gQ = falloc(NQ), *gK = falloc(NK),
        *gV = falloc(NK);
  double *wQ = dalloc(NQ), *bQ = dalloc(NQ), *wK = dalloc(NK), *bK = dalloc(NK);
  double *wV = dalloc(NK), *bV = dalloc(NK), *mQ = dalloc(NQ), *mK = dalloc(NK),
         *mV = dalloc(NK), *unused = dalloc(NQ);
  tu_fill_f32(&r, dO, NQ, -1, 1);
  tu_fill_f32(&r, Q, NQ, -1, 1);
  tu_fill_f32(&r, K, NK, -1, 1);
  tu_fill_f32(&r, V, NK, -1, 1);
  tu_fill_f32(&r, preK, NK, -1, 1);
  tu_fill_f32(&r, preV, NK, -1, 1);
  const input ins[] = {{"Q", Q, NQ, 0}, {"K", K, NK, 0}, {"V", V, NK, 0}, {"grad_out", dO, NQ, 0}};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b++)
    for (int sv = 0; sv < N_SPECIAL; sv++) {
      const int64_t at = random_at(&r, ins[b].n);
      const uint32_t old = plant(&ins[b], at, sv);
      ref_causal_attention_backward(dO, Q, K, V, preK, preV, S, H, HKV, D, 1, mQ, unused, mK,
                                    unused, mV, unused);
      ref_causal_attention_backward(dO, Q, K, V, preK, preV, S, H, HKV, D, 0, wQ, bQ, wK, bK,
                                    wV, bV);
      for (int ii = 0; ii < nisa; ii++)
        for (int t = 0; t < N_THREADS; t++) {
          const planted w = {"causal_attention_backward", ins[b].name, sv, at, isas[ii],
                             nan_threads[t]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          fill_sentinel(gQ, NQ);
          memcpy(gK, preK, sizeof(float) * NK);
          memcpy(gV, preV, sizeof(float) * NK);
          TU_EXPECT_STATUS(ctx, tg_causal_attention_backward(ctx, dO, Q, K, V, gQ, gK, gV, S, H,
                                                             HKV, D),
                           TG_OK);
          expect(&w, "grad_Q", gQ, wQ, bQ, mQ, NQ);
          expect(&w, "grad_K", gK, wK, bK, mK, NK);
          expect(&w, "grad_V", gV, wV, bV, mV, NK);
          tg_ctx_destroy(ctx);
        }
      unplant(&ins[b], at, old);
    }
  void *p[] = {dO, Q, K, V, preK, preV, gQ, gK, gV, wQ, bQ, wK, bK, wV, bV, mQ, mK, mV, unused};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  end_test("causal_attention_backward");
}

/* --- 11. decode: htmp (partials, S, M) and the FWHT's data ------------------------------- */
enum { DEC_ROWS = 3, DEC_DV = 256, DEC_NWG = 5, DEC_PART = DEC_ROWS * DEC_DV * DEC_NWG,
       DEC_HTMP = DEC_PART + 2 * DEC_ROWS * DEC_NWG, DEC_N = DEC_ROWS * DEC_DV };
/* Row 0's workgroup 1 is empty (M = -inf: never read); row 1's workgroup 3
 * has M 200 below the others, so its f32 weight exp(M - Mg) underflows to 0
 * -- a weight of exactly 0 that multiplies its S and partials. */
enum { EMPTY_ROW = 0, EMPTY_WG = 1, FAR_ROW = 1, FAR_WG = 3 };

static int64_t dec_part_at(int64_t r, int64_t w, int64_t d) {
  return ((r * (DEC_DV / 4) + d / 4) * DEC_NWG + w) * 4 + d % 4;
}
static int64_t dec_s_at(int64_t r, int64_t w) { return DEC_PART + (r * DEC_NWG + w) * 2; }

static void dec_fill(tu_rng *r, float *htmp) {
  tu_fill_f32(r, htmp, DEC_PART, -1, 1);
  for (int64_t row = 0; row < DEC_ROWS; row++)
    for (int64_t w = 0; w < DEC_NWG; w++) {
      htmp[dec_s_at(row, w)] = (float)tu_uniform(r, 0.5, 2);     /* S */
      htmp[dec_s_at(row, w) + 1] = (float)tu_uniform(r, -3, 3);  /* M */
    }
  htmp[dec_s_at(EMPTY_ROW, EMPTY_WG)] = 0.0f;
  htmp[dec_s_at(EMPTY_ROW, EMPTY_WG) + 1] = -INFINITY;
  htmp[dec_s_at(FAR_ROW, FAR_WG) + 1] = -200.0f;
}

static void test_decode(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1111);
  failures = 0;
  float *htmp = falloc(DEC_HTMP), *dst = falloc(DEC_N), *fused = falloc(DEC_N);
  double *want = dalloc(DEC_N), *bound = dalloc(DEC_N);
  dec_fill(&r, htmp);
  const input in = {"htmp", htmp, DEC_HTMP, 0};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  /* where: 0 a partial, 1 an S, 2 an M (random), 3 a partial and 4 the S of
   * the workgroup whose weight underflows */
  static const char *const where_name[5] = {"a partial", "an S", "an M",
                                            "the underflowed workgroup's partial",
                                            "the underflowed workgroup's S"};
  for (int where = 0; where < 5; where++)
    for (int sv = 0; sv < N_SPECIAL; sv++) {
      const int64_t row = tu_int(&r, 0, DEC_ROWS - 1), wg = tu_int(&r, 0, DEC_NWG - 1);
      const int64_t at = where == 0   ? random_at(&r, DEC_PART)
                         : where == 1 ? dec_s_at(row, wg)
                         : where == 2 ? dec_s_at(row, wg) + 1
                         : where == 3 ? dec_part_at(FAR_ROW, FAR_WG, tu_int(&r, 0, DEC_DV - 1))
                                      : dec_s_at(FAR_ROW, FAR_WG);
      const uint32_t old = plant(&in, at, sv);
      ref_vec_reduce(htmp, DEC_ROWS, DEC_DV, DEC_NWG, want, bound);
      for (int ii = 0; ii < nisa; ii++)
        for (int t = 0; t < N_THREADS; t++) {
          char kernel[96];
          snprintf(kernel, sizeof kernel, "vec_reduce (%s)", where_name[where]);
          const planted w = {kernel, in.name, sv, at, isas[ii], nan_threads[t]};
          tg_ctx *ctx = tu_ctx(w.threads, w.isa);
          fill_sentinel(dst, DEC_N);
          TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, dst, DEC_ROWS, DEC_DV, DEC_NWG),
                           TG_OK);
          expect(&w, "dst", dst, want, bound, NULL, DEC_N);
          /* the fused kernel is the reduce, then the transform, bit for bit
           * (the transform's own NaN check is below) */
          fill_sentinel(fused, DEC_N);
          TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, fused, DEC_ROWS,
                                                                    DEC_DV, DEC_NWG),
                           TG_OK);
          TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, dst, DEC_ROWS, DEC_DV), TG_OK);
          if (memcmp(fused, dst, sizeof(float) * DEC_N)) {
            printf("  %s: %s in htmp[%lld]: tq_hb_undo differs from reduce + fwht_sign_undo "
                   "[%s, %d threads]\n",
                   kernel, special_name[sv], (long long)at, tg_isa_name(w.isa), w.threads);
            failures++;
          }
          tg_ctx_destroy(ctx);
        }
      unplant(&in, at, old);
    }

  /* fwht_sign_undo: data, in place */
  float *x = falloc(DEC_N);
  tu_fill_f32(&r, x, DEC_N, -1, 1);
  const input data = {"data", x, DEC_N, 0};
  for (int sv = 0; sv < N_SPECIAL; sv++) {
    const int64_t at = random_at(&r, DEC_N);
    const uint32_t old = plant(&data, at, sv);
    ref_fwht_sign_undo(x, DEC_ROWS, DEC_DV, want, bound);
    for (int ii = 0; ii < nisa; ii++)
      for (int t = 0; t < N_THREADS; t++) {
        const planted w = {"fwht_sign_undo", data.name, sv, at, isas[ii], nan_threads[t]};
        tg_ctx *ctx = tu_ctx(w.threads, w.isa);
        memcpy(dst, x, sizeof(float) * DEC_N);
        TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, dst, DEC_ROWS, DEC_DV), TG_OK);
        expect(&w, "data", dst, want, bound, NULL, DEC_N);
        tg_ctx_destroy(ctx);
      }
    unplant(&data, at, old);
  }
  free(htmp), free(dst), free(fused), free(want), free(bound), free(x);
  end_test("decode");
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_compute_d),        cmocka_unit_test(test_attention_backward),
      cmocka_unit_test(test_attention_backward_variants),
      cmocka_unit_test(test_cast),             cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_softmax_backward), cmocka_unit_test(test_embedding_backward),
      cmocka_unit_test(test_cross_entropy),    cmocka_unit_test(test_transpose),
      cmocka_unit_test(test_causal_attention), cmocka_unit_test(test_decode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
