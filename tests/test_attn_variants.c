/*
 * The attention variants of tg_attn_options: a sliding window W, attention
 * sinks (one logit s_h per query head, and their gradient d_sinks) and a
 * value head dim Dv != D, alone and together, through tg_attn_train_fwd ->
 * tg_attn_train_bwd_compute_d -> tg_attn_train_bwd in f32 and in bf16 (each
 * precision mode), on the ISA table under test, at 1, 2 and 3 threads, on
 * both dK/dV schedules and in deterministic mode (with TG_TEST_SHORT each
 * problem takes a few of these runs, and every run is taken across the
 * problems: attn_runs_of in tests/common/attn_problem.h), against the float64
 * reference of tests/common/attn_problem.c. That reference computes the
 * math from its definition, dense over every key of every row: the window
 * hides key k from query i where k <= i + qL_off - W (a mask, as the causal
 * limit is), the sink is one more term e^{s_h} of the softmax denominator,
 * d_sinks[h] = d_sinks0[h] - sum_{b,i} e^{s_h - L} D_vec; nothing of the
 * kernel's tiling or tile skipping.
 *
 * Every written output (O, L, D_vec, dQ) is NaN-poisoned before its call so
 * an unwritten element fails; dK, dV and d_sinks accumulate onto random
 * nonzero values, which the reference adds.
 *
 * Tolerances: the per-element first-order bounds of tests/test_attn_ext.c
 * (its header derives them; tests/common/attn_problem.c computes them),
 * doubled for the second-order terms, with what the variants change:
 *   - window: none (a hidden key is a masked key: no term);
 *   - sink: one more term of the softmax denominator and one more rescale
 *     of the running maximum however the kernel folds it in: eps = 2E +
 *     2u(T + 3) + 2uR + gamma(kL + 1) + u_P, R including |s_h - max|;
 *   - Dv: O, D_vec and dP = dO.V are sums of Dv terms (gamma(Dv));
 *   - d_sinks: per row t = P_s D_vec with P_s = e^{s_h - L} (bound P_s(e_L +
 *     u|s_h - L| + 2u), exp within 2 ulp), e_t = e_Ps|D_vec| + P_s e_D +
 *     u|t|; summed with d_sinks0 in any order (n = B qL + 1 terms):
 *     2 (sum e_t + gamma(n) (|d_sinks0| + sum |t|)).
 * Exact rules besides the bounds: a row that sees no key has O = 0 and
 * dQ = 0 exactly (L = s_h within the bound with a sink, else -inf); a sink
 * of -inf leaves d_sinks[h] unchanged bit for bit; W >= kL (with qL_off <=
 * kL - qL), sinks all -inf and v_head_dim = D give the bits of no window, no
 * sinks and v_head_dim 0; a window gives the result of the equivalent -inf
 * mask within the same bound (bitwise is not required); deterministic mode
 * gives the same bits at every thread count.
 *
 * Random configurations (fresh every run; the seed is printed at the start
 * and with every failure: TG_TEST_SEED=<seed> replays it) draw the shape,
 * GQA, masks with -inf rows, causal with qL != kL and qL_off shifts,
 * softcap, dropout and the variants (attn_random_variants).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_problem.h"
#include "bf16.h"

/* Unit-variance inputs; mask entries -inf with probability 0.2, else
 * uniform in [-3, 1), every third mask row all -inf (rows that see no key);
 * dK0, dV0, d_sinks0 uniform in [-1, 1); the reference of a training step
 * (attn_step_row). bf16: inputs rounded to bf16, O's rounding and the
 * precision mode's error in the bounds (attn_suite.precision). */
static void build(attn_problem *pb, const attn_cfg *c, const attn_variants *v, tu_rng *r,
                  int bf16, tg_attn_precision precision) {
  const attn_suite s = {.normal = 1, .bf16 = bf16, .mask_ninf = 0.2, .mask_lo = -3,
                        .mask_row0 = 0, .mask_step = 3, .acc = ATTN_ACC_RANDOM, .options = 1,
                        .precision = precision, .row = attn_step_row};
  attn_build_v(pb, c, v, &s, r);
}

/* --- running a step ------------------------------------------------------------ */
typedef struct {
  float *O;            /* through O_strides [nO] (bf16 runs: widened) */
  float *L, *Dv;       /* [nL] */
  float *dQ, *dK, *dV; /* [nQ], [nKout], [nVout] */
  float *d_sinks;      /* [H] */
  float *Oc, *dOc;     /* O, dO gathered to contiguous [B,H,qL,Dv] */
} step_out;

static step_out alloc_out(const attn_problem *pb) {
  step_out o = {tu_alloc(4 * pb->nO),    tu_alloc(4 * pb->nL),    tu_alloc(4 * pb->nL),
                tu_alloc(4 * pb->nQ),    tu_alloc(4 * pb->nKout), tu_alloc(4 * pb->nVout),
                tu_alloc(4 * pb->p.H),   tu_alloc(4 * pb->nO),    tu_alloc(4 * pb->nO)};
  return o;
}

static void free_out(step_out *o) {
  free(o->O), free(o->L), free(o->Dv), free(o->dQ), free(o->dK), free(o->dV), free(o->d_sinks);
  free(o->Oc), free(o->dOc);
}

/* [B,H,qL,Dv] contiguous copy of an O-shaped tensor laid out by O_strides. */
static void gather(const attn_problem *pb, const float *src, float *dst) {
  const tg_attn_params *p = &pb->p;
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++)
        memcpy(dst + ((b * p->H + h) * p->qL + i) * pb->vdim,
               src + attn_off3(p->O_strides, b, h, i), sizeof(float) * (size_t)pb->vdim);
}

static tg_bf16 *to_bf16(const float *x, int64_t n) {
  tg_bf16 *y = tu_alloc(sizeof(tg_bf16) * (size_t)(n ? n : 1));
  for (int64_t e = 0; e < n; e++) y[e] = tg_f32_to_bf16(x[e]);
  return y;
}

/* How a step runs: dtype, and the mask and options it is given (the
 * problem's own unless overridden). */
typedef struct {
  int bf16;
  const float *mask; /* NULL: none */
  tg_attn_options opt;
} step_how;

static step_how own(const attn_problem *pb, int bf16) {
  return (step_how){bf16, pb->mask, pb->opt};
}

/* forward -> compute_d (head_dim = Dv) -> backward with O, L, D_vec, dQ
 * NaN-poisoned, dK, dV, d_sinks starting at dK0, dV0, d_sinks0 (d_sinks
 * wanted whenever there are sinks). bf16: the inputs (bf16 values) passed as
 * bf16, O stored in bf16 and widened into o->O. */
static void run_step(tg_ctx *ctx, const attn_problem *pb, const step_how *how, step_out *o) {
  const tg_attn_params *p = &pb->p;
  const tg_attn_mask_params *mp = how->mask ? &pb->mp : NULL;
  tg_attn_options opt = how->opt;
  opt.d_sinks = opt.sinks ? o->d_sinks : NULL;
  tu_poison_f32(o->O, pb->nO);
  tu_poison_f32(o->L, pb->nL);
  tu_poison_f32(o->Dv, pb->nL);
  tu_poison_f32(o->dQ, pb->nQ);
  memcpy(o->dK, pb->dK0, 4 * pb->nKout);
  memcpy(o->dV, pb->dV0, 4 * pb->nVout);
  if (pb->sinks) memcpy(o->d_sinks, pb->d_sinks0, 4 * pb->p.H);
  gather(pb, pb->dO, o->dOc);
  const int causal = pb->c.causal;
  if (!how->bf16) {
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_fwd(ctx, TG_DTYPE_F32, pb->Q, pb->K, pb->V, o->O, o->L, p, mp,
                                       how->mask, causal, &opt),
                     TG_OK);
    gather(pb, o->O, o->Oc);
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_F32, o->Oc, o->dOc, o->Dv, p->B,
                                                 p->H, p->qL, (uint32_t)pb->vdim),
                     TG_OK);
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb->Q, pb->K, pb->V, o->L, pb->dO,
                                       o->Dv, o->dQ, o->dK, o->dV, p, mp, how->mask, causal,
                                       &opt),
                     TG_OK);
    return;
  }
  tg_bf16 *Q = to_bf16(pb->Q, pb->nQ), *K = to_bf16(pb->K, pb->nK), *V = to_bf16(pb->V, pb->nV);
  tg_bf16 *dO = to_bf16(pb->dO, pb->nO), *M = how->mask ? to_bf16(how->mask, pb->nM) : NULL;
  tg_bf16 *O = tu_alloc(sizeof(tg_bf16) * pb->nO);
  for (int64_t e = 0; e < pb->nO; e++) O[e] = 0x7FC0; /* NaN */
  TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, O, o->L, p, mp, M, causal,
                                          &opt),
                   TG_OK);
  for (int64_t e = 0; e < pb->nO; e++) o->O[e] = tg_bf16_to_f32(O[e]);
  gather(pb, o->O, o->Oc);
  tg_bf16 *Oc = to_bf16(o->Oc, pb->nO), *dOc = to_bf16(o->dOc, pb->nO); /* exact */
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_BF16, Oc, dOc, o->Dv, p->B, p->H,
                                               p->qL, (uint32_t)pb->vdim),
                   TG_OK);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q, K, V, o->L, dO, o->Dv, o->dQ, o->dK,
                                     o->dV, p, mp, M, causal, &opt),
                   TG_OK);
  free(Q), free(K), free(V), free(dO), free(M), free(O), free(Oc), free(dOc);
}

/* Every output against the reference bounds, and the exact rules: rows that
 * see no key O = 0 and dQ = 0; d_sinks of a -inf sink unchanged. */
static int check_step(const attn_problem *pb, const step_out *o, const char *what) {
  const int64_t D = pb->p.D, Dv = pb->vdim;
  int ok = attn_check_L(pb, o->L);
  for (int64_t r = 0; r < pb->nL; r++) {
    if (!pb->empty[r]) continue;
    int zero = 1;
    for (int64_t d = 0; d < Dv; d++) zero &= o->Oc[r * Dv + d] == 0.0f;
    for (int64_t d = 0; d < D; d++) zero &= o->dQ[r * D + d] == 0.0f;
    if (!zero) {
      printf("  row %lld sees no key: O and dQ must be 0\n", (long long)r);
      ok = 0;
      break;
    }
  }
  ok &= tu_check_bound("O", o->Oc, pb->Or, pb->Oe, pb->nO);
  ok &= tu_check_bound("D_vec", o->Dv, pb->Dr, pb->De, pb->nL);
  ok &= attn_check_grads(pb, o->dQ, o->dK, o->dV);
  ok &= attn_check_d_sinks(pb, o->d_sinks);
  for (int64_t h = 0; pb->sinks && h < pb->p.H; h++)
    if (pb->sinks[h] == -INFINITY && memcmp(&o->d_sinks[h], &pb->d_sinks0[h], 4)) {
      printf("  d_sinks[%lld] of a -inf sink: %a, want %a unchanged\n", (long long)h,
             (double)o->d_sinks[h], (double)pb->d_sinks0[h]);
      ok = 0;
    }
  if (!ok) printf("  ^ in %s (TG_TEST_SEED=%llu)\n", what, (unsigned long long)tu_seed());
  return ok;
}

static int same_bits(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* Two steps of pb bitwise equal: O, L, D_vec, dQ, dK, dV, d_sinks. */
static int same_step(const attn_problem *pb, const step_out *a, const step_out *b) {
  return same_bits(a->O, b->O, 4 * pb->nO) && same_bits(a->L, b->L, 4 * pb->nL) &&
         same_bits(a->Dv, b->Dv, 4 * pb->nL) && same_bits(a->dQ, b->dQ, 4 * pb->nQ) &&
         same_bits(a->dK, b->dK, 4 * pb->nKout) && same_bits(a->dV, b->dV, 4 * pb->nVout) &&
         (!pb->sinks || same_bits(a->d_sinks, b->d_sinks, 4 * pb->p.H));
}

/* --- the configurations ------------------------------------------------------- */
typedef struct {
  attn_cfg c;
  attn_variants v;
} variant_cfg;

#define NONE ATTN_SINKS_NONE
#define RAND ATTN_SINKS_RANDOM
#define XTRM ATTN_SINKS_EXTREME
static const variant_cfg configs[] = {
    /* name                          B  H Hkv qL   kL    D causal off mask layout softcap p;  W  Dv sinks */
    /* windows (the CPU tiles: 16-64 keys) */
    {{"W=1 causal",                  1, 2, 1, 40,  40,  16, 1,   0, 0, 0, 1.0f, 0},     {1, 0, NONE}},
    {{"W=1 non-causal",              1, 2, 2, 33,  50,  16, 0,   0, 0, 0, 1.0f, 0},     {1, 0, NONE}},
    {{"W=5 < BK, ragged",            2, 3, 3, 70,  45,  24, 1,   0, 0, 0, 1.0f, 0},     {5, 0, NONE}},
    {{"W=37 causal qL<kL gqa",       1, 4, 2, 37, 100,  64, 1,   0, 1, 0, 1.0f, 0},     {37, 0, NONE}},
    {{"W=100 causal qL>kL",          1, 2, 1, 150, 130, 16, 1,   0, 0, 1, 1.0f, 0},     {100, 0, NONE}},
    {{"W=23 non-causal qL_off+17",   1, 2, 1, 60,  90,  32, 0,  17, 2, 0, 1.0f, 0},     {23, 0, NONE}},
    {{"W=19 causal qL_off-35",       1, 2, 2, 40,  75,   8, 1, -35, 0, 0, 1.0f, 0},     {19, 0, NONE}},
    {{"W=kL causal",                 1, 2, 1, 50,  77,  16, 1,   0, 1, 0, 1.0f, 0},     {77, 0, NONE}},
    {{"W>kL non-causal",             1, 2, 1, 64,  64,  16, 0,   0, 0, 2, 1.0f, 0},     {1000, 0, NONE}},
    {{"W=64 key ranges",             1, 2, 2, 300, 1100, 8, 1,   0, 0, 1, 1.0f, 0},     {64, 0, NONE}},
    {{"W=129 softcap dropout",       1, 2, 2, 200, 260, 16, 1,   0, 1, 0, 3.0f, 0.3f},  {129, 0, NONE}},
    /* sinks */
    {{"sinks random",                2, 3, 3, 70,  45,  24, 0,   0, 0, 0, 1.0f, 0},     {0, 0, RAND}},
    {{"sinks extreme gqa",           1, 8, 1, 40,  67,  32, 1,   0, 1, 0, 1.0f, 0},     {0, 0, XTRM}},
    {{"sinks, rows with no key",     1, 5, 5, 40,  75,   8, 1, -50, 1, 0, 1.0f, 0},     {0, 0, XTRM}},
    {{"sinks dropout softcap",       1, 4, 2, 65,  65,  40, 1,   0, 2, 1, 5.0f, 0.5f},  {0, 0, RAND}},
    {{"sinks key ranges",            1, 2, 1, 70,  600, 16, 1,   0, 1, 0, 1.0f, 0.2f},  {0, 0, RAND}},
    /* value head dims */
    {{"Dv < D",                      1, 2, 1, 40,  50,  64, 0,   0, 0, 0, 1.0f, 0},     {0, 32, NONE}},
    {{"Dv > D strided",              2, 4, 2, 50,  67,  32, 1,   0, 0, 1, 1.0f, 0},     {0, 96, NONE}},
    {{"Dv=8 D=192",                  1, 2, 1, 33,  47, 192, 1,   0, 1, 0, 1.0f, 0},     {0, 8, NONE}},
    {{"MLA D=192 Dv=128",            1, 4, 4, 45,  70, 192, 1,   0, 0, 2, 1.0f, 0.1f},  {0, 128, NONE}},
    {{"Dv=512 D=128",                1, 2, 1, 20,  40, 128, 1,   0, 1, 0, 1.0f, 0},     {0, 512, NONE}},
    {{"Dv=D given",                  1, 2, 2, 30,  30,  16, 0,   0, 0, 0, 1.0f, 0},     {0, 16, NONE}},
    /* all three */
    {{"all: gqa 8 causal mask",      1, 8, 1, 70,  90,  64, 1,   0, 1, 0, 1.0f, 0},     {20, 24, XTRM}},
    {{"all: dropout softcap strided",2, 4, 2, 45,  60,  16, 1,   0, 2, 1, 3.0f, 0.3f},  {7, 48, RAND}},
    {{"all: non-causal token-major", 1, 3, 1, 50,  70,  40, 0,  -9, 1, 2, 1.0f, 0.1f},  {30, 8, RAND}},
    {{"all: qL_off-50 no-key rows",  1, 5, 5, 40,  75,  16, 1, -50, 0, 0, 1.0f, 0},     {3, 24, XTRM}},
    {{"all: key ranges MLA",         1, 2, 1, 100, 700, 192, 1,  0, 1, 0, 1.0f, 0.2f},  {150, 128, RAND}},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

/* "name (variants) [isa, N threads, mode]" and the precision mode (NULL:
 * none) for a failure message. */
static void describe(char *what, size_t size, const attn_problem *pb, const attn_run *run,
                     const char *precision) {
  char v[64];
  attn_variants_str(&pb->v, v, sizeof v);
  snprintf(what, size, "%s (%s) %s%s%s", pb->c.name, v, run->what,
           precision ? ", precision " : "", precision ? precision : "");
}

/* Every config, f32, 1/2/3 threads, every run mode, the ISA under test
 * (TG_TEST_SHORT: a covering subset, attn_runs_of). */
static void test_f32_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1);
  int failures = 0;
  for (int ci = 0; ci < N_CONFIGS; ci++) {
    attn_problem pb;
    build(&pb, &configs[ci].c, &configs[ci].v, &r, 0, TG_ATTN_PRECISION_EXACT);
    step_out o = alloc_out(&pb);
    const step_how how = own(&pb, 0);
    attn_runs runs = attn_runs_of(ci, N_CONFIGS);
    for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
      run_step(run->ctx, &pb, &how, &o);
      char what[200];
      describe(what, sizeof what, &pb, run, NULL);
      failures += !check_step(&pb, &o, what);
    }
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d configuration runs out of bound", failures);
}

/* The backward alone, fed the reference's L and D_vec rounded to f32 (so
 * neither carries the forward's error: attn_bwd_row_given's bounds, with
 * e_L = e_D = 0), f32, every config without dropout (attn_bwd_row_given has
 * none), 1/2/3 threads, every run mode (TG_TEST_SHORT: a covering subset
 * over those configs): the sharper check of dQ, dK, dV and
 * above all d_sinks, whose bound in a training step is dominated by the
 * forward's e_L and e_D (a 0.1 % error of every d_sinks term passed the
 * training-step check of most configs; it fails here). */
static void test_f32_backward_exact_l_d(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 8);
  int n_problems = 0; /* the configs without dropout, numbered in order */
  for (int ci = 0; ci < N_CONFIGS; ci++) n_problems += configs[ci].c.dropout_p == 0;
  int failures = 0;
  for (int ci = 0, problem = 0; ci < N_CONFIGS; ci++) {
    if (configs[ci].c.dropout_p > 0) continue;
    attn_problem pb;
    build(&pb, &configs[ci].c, &configs[ci].v, &r, 0, TG_ATTN_PRECISION_EXACT);
    for (int64_t e = 0; e < pb.nL; e++) pb.L[e] = (float)pb.Lr[e], pb.Dv[e] = (float)pb.Dr[e];
    attn_reference(&pb, attn_bwd_row_given, 0);
    step_out o = alloc_out(&pb);
    tg_attn_options opt = pb.opt;
    opt.d_sinks = pb.sinks ? o.d_sinks : NULL;
    attn_runs runs = attn_runs_of(problem++, n_problems);
    for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
      tu_poison_f32(o.dQ, pb.nQ);
      memcpy(o.dK, pb.dK0, 4 * pb.nKout);
      memcpy(o.dV, pb.dV0, 4 * pb.nVout);
      if (pb.sinks) memcpy(o.d_sinks, pb.d_sinks0, 4 * pb.p.H);
      TU_EXPECT_STATUS(run->ctx,
                       tg_attn_train_bwd(run->ctx, TG_DTYPE_F32, pb.Q, pb.K, pb.V, pb.L, pb.dO,
                                         pb.Dv, o.dQ, o.dK, o.dV, &pb.p, pb.mask ? &pb.mp : NULL,
                                         pb.mask, pb.c.causal, &opt),
                       TG_OK);
      if (!attn_check_grads(&pb, o.dQ, o.dK, o.dV) || !attn_check_d_sinks(&pb, o.d_sinks)) {
        char what[200];
        describe(what, sizeof what, &pb, run, NULL);
        printf("  ^ in %s, backward from exact L, D_vec (TG_TEST_SEED=%llu)\n", what,
               (unsigned long long)tu_seed());
        failures++;
      }
    }
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d backward runs out of bound", failures);
}

/* bf16 inputs in each precision mode (the mode's error per term of the
 * products that take P or dS, as tests/test_attn_ext.c derives: 0, 2^-16,
 * 2^-8): every config, 1/2/3 threads, every run mode (TG_TEST_SHORT: a
 * covering subset in each precision mode). */
static void test_bf16_precision_modes(void **state) {
  static const struct { tg_attn_precision mode; const char *name; } pm[] = {
      {TG_ATTN_PRECISION_EXACT, "exact"},
      {TG_ATTN_PRECISION_SPLIT, "split"},
      {TG_ATTN_PRECISION_BF16, "bf16"},
  };
  int failures = 0;
  for (size_t mi = 0; mi < sizeof pm / sizeof pm[0]; mi++) {
    tu_rng r = tu_rng_make(tu_seed() + 2); /* the same problems in every mode */
    for (int ci = 0; ci < N_CONFIGS; ci++) {
      attn_problem pb;
      build(&pb, &configs[ci].c, &configs[ci].v, &r, 1, pm[mi].mode);
      step_out o = alloc_out(&pb);
      const step_how how = own(&pb, 1);
      /* numbered ci + mi: each precision mode's configs still take every
       * run under TG_TEST_SHORT, and a config meets other runs in each */
      attn_runs runs = attn_runs_of((ci + (int)mi) % N_CONFIGS, N_CONFIGS);
      for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
        assert_int_equal(tg_ctx_set_attn_precision(run->ctx, pm[mi].mode), TG_OK);
        run_step(run->ctx, &pb, &how, &o);
        char what[200];
        describe(what, sizeof what, &pb, run, pm[mi].name);
        failures += !check_step(&pb, &o, what);
      }
      free_out(&o);
      attn_destroy(&pb);
    }
  }
  if (failures) TU_FAIL("%d precision-mode runs out of bound", failures);
}

/* Fresh shapes, features and variants every run, f32 and bf16 (a random
 * precision mode), a random thread count and run mode. */
static void test_random_configs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  int failures = 0;
  const int n = tu_short() ? 6 : 24;
  for (int it = 0; it < n; it++) {
    const attn_cfg c =
        attn_random_cfg(&r, &(attn_cfg_limits){.long_lo = 200, .long_hi = 400, .dropout = 1});
    const attn_variants v = attn_random_variants(&r, &c);
    const int bf16 = tu_int(&r, 0, 1);
    const tg_attn_precision prec = bf16 ? (tg_attn_precision)tu_int(&r, 0, 2)
                                        : TG_ATTN_PRECISION_EXACT;
    attn_problem pb;
    build(&pb, &c, &v, &r, bf16, prec);
    step_out o = alloc_out(&pb);
    const attn_run_mode *m = &attn_modes[tu_int(&r, 0, ATTN_N_MODES - 1)];
    const int threads = tu_int(&r, 1, 3);
    tg_ctx *ctx = attn_mode_ctx(threads, TG_ISA_AUTO, m);
    assert_int_equal(tg_ctx_set_attn_precision(ctx, prec), TG_OK);
    const step_how how = own(&pb, bf16);
    run_step(ctx, &pb, &how, &o);
    char what[320], cs[200], vs[64];
    attn_cfg_str(&c, cs, sizeof cs);
    attn_variants_str(&v, vs, sizeof vs);
    snprintf(what, sizeof what, "random %d: %s %s %s %s, %d threads, %s", it, cs, vs,
             bf16 ? "bf16" : "f32", tg_attn_precision_name(prec), threads, m->name);
    failures += !check_step(&pb, &o, what);
    tg_ctx_destroy(ctx);
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures)
    TU_FAIL("%d random configurations out of bound (TG_TEST_SEED=%llu)", failures,
            (unsigned long long)tu_seed());
}

/* --- equivalences ---------------------------------------------------------------- */

/* A window and the -inf mask that hides the same keys: both against the one
 * reference of the masked problem (the keys the window leaves visible get
 * mask 0, so their scores and bounds are the same), f32 and bf16, every run
 * mode at 2 threads. The problem's own mask (with its -inf rows) is
 * replaced. */
static void test_window_equals_mask(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 4);
  static const variant_cfg cases[] = {
      {{"causal W=9",          1, 4, 2, 70, 130, 32, 1,   0, 1, 0, 1.0f, 0},    {9, 0, NONE}},
      {{"non-causal W=40",     1, 2, 1, 90,  90, 16, 0,   0, 1, 1, 2.0f, 0.2f}, {40, 0, RAND}},
      {{"causal qL_off+20 W=1",1, 2, 2, 33,  80, 24, 1,  20, 1, 0, 1.0f, 0},    {1, 40, NONE}},
      {{"long W=100",          1, 2, 1, 200, 600, 16, 1,  0, 1, 0, 1.0f, 0},    {100, 0, XTRM}},
  };
  int failures = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
    for (int bf16 = 0; bf16 < 2; bf16++) {
      attn_problem pb;
      build(&pb, &cases[ci].c, &cases[ci].v, &r, bf16, TG_ATTN_PRECISION_EXACT);
      const int64_t qL = pb.p.qL, kL = pb.p.kL, W = pb.v.window;
      for (int64_t row = 0; row < pb.nM / kL; row++) { /* full mask: [B,H,qL] rows */
        const int64_t i = row % qL;
        for (int64_t k = 0; k < kL; k++) {
          pb.mask[row * kL + k] = k <= i + pb.p.qL_off - W ? -INFINITY : 0.0f;
          if (bf16) pb.maskb[row * kL + k] = tg_f32_to_bf16(pb.mask[row * kL + k]);
        }
      }
      pb.v.window = 0;
      pb.opt.window = 0;
      attn_reference(&pb, attn_step_row, 0); /* the masked problem */
      step_out o = alloc_out(&pb);
      step_how masked = own(&pb, bf16), windowed = own(&pb, bf16);
      windowed.mask = NULL;
      windowed.opt.window = (uint32_t)W;
      for (int mi = 0; mi < ATTN_N_MODES; mi++) {
        tg_ctx *ctx = attn_mode_ctx(2, TG_ISA_AUTO, &attn_modes[mi]);
        for (int w = 0; w < 2; w++) {
          run_step(ctx, &pb, w ? &windowed : &masked, &o);
          char what[200];
          snprintf(what, sizeof what, "%s as %s, %s, %s", pb.c.name, w ? "window" : "mask",
                   bf16 ? "bf16" : "f32", attn_modes[mi].name);
          failures += !check_step(&pb, &o, what);
        }
        tg_ctx_destroy(ctx);
      }
      free_out(&o);
      attn_destroy(&pb);
    }
  if (failures) TU_FAIL("%d window/mask runs out of bound", failures);
}

/* No-effect settings give the bits of the setting they equal, in
 * deterministic mode (f32 and bf16): W >= kL with qL_off <= kL - qL (every
 * key already satisfies k > i + qL_off - W), sinks all -inf (d_sinks
 * wanted: left unchanged), v_head_dim = D. */
static void test_no_effect_settings_same_bits(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 5);
  static const attn_cfg shapes[] = {
      {"causal gqa mask", 2, 4, 2, 70, 130, 32, 1, 0, 1, 0, 1.0f, 0.2f},
      {"non-causal qL>kL", 1, 2, 1, 90, 60, 16, 0, -5, 2, 1, 3.0f, 0},
  };
  for (size_t ci = 0; ci < sizeof shapes / sizeof shapes[0]; ci++) {
    const attn_variants with_sinks = {0, 0, RAND};
    attn_problem pb;
    build(&pb, &shapes[ci], &with_sinks, &r, 0, TG_ATTN_PRECISION_EXACT);
    float *no_sinks = tu_alloc(4 * pb.p.H);
    for (int64_t h = 0; h < pb.p.H; h++) no_sinks[h] = -INFINITY;
    step_out a = alloc_out(&pb), b = alloc_out(&pb);
    const int kL = pb.p.kL;
    for (int bf16 = 0; bf16 < 2; bf16++) {
      tg_ctx *ctx = attn_mode_ctx(3, TG_ISA_AUTO, &attn_modes[2]); /* deterministic */
      step_how plain = own(&pb, bf16);
      plain.opt.sinks = NULL;
      run_step(ctx, &pb, &plain, &a);
      const struct { const char *name; uint32_t window, v_head_dim; const float *sinks; } same[] = {
          {"W = kL", (uint32_t)kL, 0, NULL},
          {"W = kL + 1", (uint32_t)kL + 1, 0, NULL},
          {"W = 2^32 - 1", UINT32_MAX, 0, NULL},
          {"sinks all -inf", 0, 0, no_sinks},
          {"v_head_dim = D", 0, (uint32_t)pb.p.D, NULL},
          {"all three", (uint32_t)kL, (uint32_t)pb.p.D, no_sinks},
      };
      for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        step_how how = plain;
        how.opt.window = same[k].window;
        how.opt.v_head_dim = same[k].v_head_dim;
        how.opt.sinks = same[k].sinks;
        memcpy(b.d_sinks, pb.d_sinks0, 4 * pb.p.H);
        run_step(ctx, &pb, &how, &b);
        if (!same_step(&pb, &a, &b))
          TU_FAIL("%s, %s: %s does not give the bits of its plain equivalent", pb.c.name,
                  bf16 ? "bf16" : "f32", same[k].name);
        if (same[k].sinks && !same_bits(b.d_sinks, pb.d_sinks0, 4 * pb.p.H))
          TU_FAIL("%s: d_sinks of -inf sinks changed", pb.c.name);
      }
      tg_ctx_destroy(ctx);
    }
    free(no_sinks);
    free_out(&a), free_out(&b);
    attn_destroy(&pb);
  }
}

/* Deterministic mode with all three variants: the same bits at 1, 2, 3 and
 * 5 threads, f32 and bf16 in each precision mode, d_sinks included; the KV
 * schedule without deterministic mode gives them too (it is atomic-free). */
static void test_deterministic(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 6);
  const attn_cfg c = {"det", 2, 4, 2, 150, 530, 32, 1, 0, 1, 0, 1.0f, 0.3f};
  const attn_variants v = {70, 40, RAND};
  attn_problem pb;
  build(&pb, &c, &v, &r, 0, TG_ATTN_PRECISION_EXACT);
  step_out first = alloc_out(&pb), o = alloc_out(&pb);
  const int threads[] = {1, 2, 3, 5, 2};
  for (int variant = 0; variant < 4; variant++) { /* f32, bf16 exact, split, bf16 */
    const step_how how = own(&pb, variant > 0);
    for (int ti = 0; ti < 5; ti++) {
      tg_ctx *ctx = tu_ctx(threads[ti], TG_ISA_AUTO);
      tg_ctx_set_deterministic(ctx, ti != 4);
      if (variant)
        assert_int_equal(tg_ctx_set_attn_precision(ctx, (tg_attn_precision)(variant - 1)), TG_OK);
      run_step(ctx, &pb, &how, ti ? &o : &first);
      if (ti && !same_step(&pb, &first, &o))
        TU_FAIL("variant %d: %d threads%s differ from 1 thread", variant, threads[ti],
                ti == 4 ? " (KV schedule, not deterministic)" : "");
      tg_ctx_destroy(ctx);
    }
  }
  free_out(&first), free_out(&o);
  attn_destroy(&pb);
}

/* --- bad input: status, a message naming the field, nothing written -------- */
static void test_bad_variants_write_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 7);
  const attn_cfg c = {"bad", 1, 2, 1, 20, 17, 16, 1, 0, 1, 0, 1.0f, 0};
  const attn_variants v = {0, 0, RAND};
  attn_problem pb;
  build(&pb, &c, &v, &r, 0, TG_ATTN_PRECISION_EXACT);
  /* outputs sized for the largest Dv tried (520), filled with a pattern */
  const int64_t nbig = pb.nL * 520;
  float *O = tu_alloc(4 * nbig), *L = tu_alloc(4 * pb.nL), *Dv = tu_alloc(4 * pb.nL);
  float *dQ = tu_alloc(4 * pb.nQ), *dK = tu_alloc(4 * pb.nKout), *dV = tu_alloc(4 * nbig / 2);
  float *d_sinks = tu_alloc(4 * pb.p.H);
  float *Vbig = tu_alloc(4 * nbig), *dObig = tu_alloc(4 * nbig);
  tu_fill_f32(&r, Vbig, nbig, -1, 1);
  tu_fill_f32(&r, dObig, nbig, -1, 1);
  float *const outs[] = {O, L, Dv, dQ, dK, dV, d_sinks};
  const int64_t sizes[] = {nbig, pb.nL, pb.nL, pb.nQ, pb.nKout, nbig / 2, pb.p.H};
  enum { N_OUTS = sizeof outs / sizeof outs[0] };
  float *snap[N_OUTS];
  for (int k = 0; k < N_OUTS; k++) {
    tu_fill_f32(&r, outs[k], sizes[k], -1, 1);
    snap[k] = tu_alloc(4 * sizes[k]);
    memcpy(snap[k], outs[k], 4 * sizes[k]);
  }
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  const tg_attn_params *p = &pb.p;
  for (int dt = 0; dt < 2; dt++) {
    const tg_dtype dtype = dt ? TG_DTYPE_BF16 : TG_DTYPE_F32; /* bf16: only the checks run */
    /* v_head_dim not a multiple of 8, or beyond 512 (V, O, dO strides as
     * for that Dv, so the shape is otherwise valid) */
    const uint32_t bad_dv[] = {4, 12, 520, 1, 7, 513, 1024, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_dv / sizeof bad_dv[0]; i++) {
      tg_attn_params q = *p;
      const int64_t n = bad_dv[i] <= 520 ? bad_dv[i] : 8;
      const int64_t vs[3] = {p->kL * n, p->kL * n, n}, os[3] = {p->H * p->qL * n, p->qL * n, n};
      memcpy(q.V_strides, vs, sizeof vs);
      memcpy(q.O_strides, os, sizeof os);
      tg_attn_options opt = pb.opt;
      opt.v_head_dim = bad_dv[i];
      TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, dtype, pb.Q, pb.K, Vbig, O, L, &q, &pb.mp,
                                              pb.mask, 1, &opt),
                       TG_ERR_UNSUPPORTED);
      assert_non_null(strstr(tg_ctx_last_error(ctx), "v_head_dim"));
      opt.d_sinks = d_sinks;
      TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, dtype, pb.Q, pb.K, Vbig, L, dObig, Dv, dQ, dK,
                                              dV, &q, &pb.mp, pb.mask, 1, &opt),
                       TG_ERR_UNSUPPORTED);
      assert_non_null(strstr(tg_ctx_last_error(ctx), "v_head_dim"));
    }
    /* d_sinks without sinks */
    tg_attn_options opt = pb.opt;
    opt.sinks = NULL;
    opt.d_sinks = d_sinks;
    TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, dtype, pb.Q, pb.K, pb.V, L, pb.dO, Dv, dQ, dK, dV,
                                            p, &pb.mp, pb.mask, 1, &opt),
                     TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "d_sinks"));
  }
  for (int k = 0; k < N_OUTS; k++)
    if (!same_bits(outs[k], snap[k], 4 * sizes[k])) TU_FAIL("output %d written on failure", k);
  tg_ctx_destroy(ctx);
  for (int k = 0; k < N_OUTS; k++) free(snap[k]), free(outs[k]);
  free(Vbig), free(dObig);
  attn_destroy(&pb);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_variants_write_nothing),
      cmocka_unit_test(test_no_effect_settings_same_bits),
      cmocka_unit_test(test_window_equals_mask),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_f32_against_reference),
      cmocka_unit_test(test_f32_backward_exact_l_d),
      cmocka_unit_test(test_random_configs),
      cmocka_unit_test(test_bf16_precision_modes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
