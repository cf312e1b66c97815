/*
 * The float32 attention entry points and dropout (a CPU extension beyond the
 * Metal contract; docs/KERNELS.md): tg_attn_train_fwd, tg_attn_train_bwd_
 * compute_d and tg_attn_train_bwd with TG_DTYPE_F32, dropout options, and
 * tg_attn_dropout_keep, against a float64 reference.
 *
 * Each problem is run as a training step runs it: forward (O, L) ->
 * compute_d (D_vec from that O) -> backward (dQ written, dK and dV
 * accumulated onto random values), with every output poisoned with NaN
 * first, at 1, 2 and 3 threads, both dK/dV schedules and deterministic mode
 * (with TG_TEST_SHORT each problem takes a few of these runs, and every run
 * is taken across the problems: attn_runs_of in tests/common/attn_problem.h).
 * The reference (tests/common/attn_problem.c, shared with the other FA-2
 * suites) is the exact math in f64 from the same f32 inputs (products of two
 * f32 are exact in f64), with dropout's keep flags taken from
 * tg_attn_dropout_keep (z = keep / (1 - p), exact).
 *
 * Tolerances. Per element, a first-order forward error bound of the f32
 * algorithm, computed in f64 beside the reference, doubled for the neglected
 * second-order terms; u = 2^-24 (f32 unit roundoff), gamma(n) = (n + 2) u
 * bounds a sum (or dot product) of n terms in any order relative to the sum
 * of the terms' magnitudes. These are the bounds of tests/test_attention.c
 * and tests/train/test_attn_roundtrip.c without the bf16 roundings (inputs
 * are used as given, O is stored in f32):
 *
 *   score s  e_s  = |scale| gamma(D) sum_d|q k| + 4u(|s| + |scale q.k|) + u|s + m|
 *                   (scale q.k, the softcap's division, tanhf and product: 4u;
 *                   the f32 mask add: u)
 *   forward (online softmax over T <= ceil(kL/16) key tiles; E = max e_s,
 *            R = max|s - max|; each rescale exp(m_old - m_new) adds u|dm| + 2u)
 *            eps  = 2E + 2u(T + 2) + 2uR + gamma(kL)   (relative, per weight)
 *            e_O  = 2((eps + e_r)(sum_k w z|V| + |O|) + u|O|)
 *            e_L  = 2(E + eps + u|L| + 2u|log l|)
 *            e_r  = 3u with dropout (1/(1-p) rounded in f32: 2u; O * it: u)
 *   D_vec    e_D  = sum_d e_O|dO| + gamma(D) sum_d (|O| + e_O)|dO|
 *   P        e_P  = P (e_s + e_L + u|s - L| + 2u)           (exp within 2 ulp)
 *   dP       e_dP = gamma(D) sum_d|dO V|, and with dropout z dP: + 3u z|dP|
 *   dS = scale P (z dP - D) c'   (c' = 1 - t^2 with softcap t, error e_c)
 *            e_dS = |scale| c' (e_P|z dP - D| + P(z e_dP + e_D + u|z dP - D|))
 *                   + |scale| P |z dP - D| e_c + 8u|dS|
 *   P z      e_Pz = z e_P + 3u P z with dropout (else e_P)
 *   dQ       2 (sum_k e_dS|K| + gamma(kL) sum_k|dS K|)
 *   dK       2 (sum_i e_dS|Q| + gamma(n) (|dK0| + sum_i|dS Q|))   n = gqa qL + 1
 *   dV       2 (sum_i e_Pz|dO| + gamma(n) (|dV0| + sum_i|P z dO|))
 *
 * With bf16 inputs, where a table runs the products that take P or dS
 * (O += P.V; dQ, dK, dV) on its bf16 unit as p bf16 parts of each f32
 * operand (tg_testing_attn_bf16_parts: p = 3 in exact mode's backward on
 * amx from some head dim on, hi + lo + lo2 = P exactly, and 2 in its
 * forward, split mode's hi + lo, whose u_P = 2^-16 the forward's bound then
 * takes; 2 in split mode; 1 in bf16 mode), every such sum adds p passes of
 * its terms: kL, n become p kL, p n in the
 * gammas above (a bound on the f32 GEMM too, so the reference takes the
 * largest p of the tables under test), and the unit flushes subnormal parts
 * and results to zero: 2^-126 absolute per operand and per product (the
 * f32 GEMM's subnormal roundings: 2^-149).
 *
 * The bounds scale with the magnitude of the summed terms, not the result
 * (dQ and dK cancel towards 0), and they are first order in u: a missing,
 * duplicated, wrongly dropped or bf16-rounded term is far outside them.
 * Rows that see no key must give exactly O = 0, L = -inf and a zero dQ row.
 *
 * Besides the bounds: the accuracy target, max |err| <= 1e-5 against
 * f64 on unit-variance inputs up to L = 4096 (a target, not a derived
 * bound; the measured values are printed), p = 0 bitwise equal to no
 * options, bf16 and f32 bitwise equal on bf16-exact inputs (one engine), the
 * dropout mask against the documented Philox mapping, the fraction kept,
 * independence of the thread count, and bad options refused with nothing
 * written. The Philox4x32-10 known answers are those of Salmon et al. (SC'11,
 * the Random123 distribution).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "engine.h"
#include "ops.h"
#include "philox.h"
#include "attn_problem.h"
#include "tilegrad_testing.h"

/* Unit-variance f32 inputs; mask entries -inf with probability 0.2, else
 * uniform in [-3, 1), every third mask row all -inf; dK0 / dV0 uniform in
 * [-1, 1) (zero with zero_acc); the dropout seed and offset; then the
 * reference (tests/common/attn_problem.c, attn_step_row). bf16 (the bf16
 * pipeline of test_bf16_precision_modes): Q, K, V, dO and the mask rounded
 * to bf16 before the reference, O's bf16 rounding and the precision mode's
 * error in its bounds (attn_suite.precision). */
static void build_ex(attn_problem *pb, const attn_cfg *c, tu_rng *r, int zero_acc, int bf16,
                     tg_attn_precision precision) {
  const attn_suite s = {.normal = 1, .bf16 = bf16, .mask_ninf = 0.2, .mask_lo = -3,
                        .mask_row0 = 0, .mask_step = 3,
                        .acc = zero_acc ? ATTN_ACC_ZERO : ATTN_ACC_RANDOM, .options = 1,
                        .precision = precision, .row = attn_step_row};
  attn_build(pb, c, &s, r);
}

static void build(attn_problem *pb, const attn_cfg *c, tu_rng *r, int zero_acc) {
  build_ex(pb, c, r, zero_acc, 0, TG_ATTN_PRECISION_EXACT);
}

/* --- running the kernels --------------------------------------------------- */
typedef struct {
  float *O;                /* through O_strides [nQ] */
  float *L, *Dv;           /* [nL] */
  float *dQ, *dK, *dV;     /* [nQ], [nKout] x 2 */
  float *Oc, *dOc;         /* O, dO gathered to contiguous [B,H,qL,D] for compute_d */
} ext_out;

static ext_out alloc_out(const attn_problem *pb) {
  ext_out o = {tu_alloc(sizeof(float) * pb->nQ), tu_alloc(sizeof(float) * pb->nL),
               tu_alloc(sizeof(float) * pb->nL), tu_alloc(sizeof(float) * pb->nQ),
               tu_alloc(sizeof(float) * pb->nKout), tu_alloc(sizeof(float) * pb->nKout),
               tu_alloc(sizeof(float) * pb->nQ), tu_alloc(sizeof(float) * pb->nQ)};
  return o;
}

static void free_out(ext_out *o) {
  free(o->O), free(o->L), free(o->Dv), free(o->dQ), free(o->dK), free(o->dV), free(o->Oc);
  free(o->dOc);
}

/* [B,H,qL,D] contiguous copy of a tensor laid out by strides s. */
static void gather(const attn_problem *pb, const int64_t s[3], const float *src, float *dst) {
  const tg_attn_params *p = &pb->p;
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++)
        memcpy(dst + ((b * p->H + h) * p->qL + i) * p->D, src + attn_off3(s, b, h, i),
               sizeof(float) * (size_t)p->D);
}

/* Before a step: L, D_vec, dQ poisoned, dK and dV back to dK0 and dV0. */
static void reset_outputs(const attn_problem *pb, ext_out *o) {
  tu_poison_f32(o->L, pb->nL);
  tu_poison_f32(o->Dv, pb->nL);
  tu_poison_f32(o->dQ, pb->nQ);
  memcpy(o->dK, pb->dK0, sizeof(float) * pb->nKout);
  memcpy(o->dV, pb->dV0, sizeof(float) * pb->nKout);
}

/* forward -> compute_d -> backward, outputs poisoned first (dK, dV start
 * at dK0, dV0). opt NULL: no options. */
static void run_step(tg_ctx *ctx, const attn_problem *pb, const tg_attn_options *opt,
                     ext_out *o) {
  const tg_attn_params *p = &pb->p;
  const tg_attn_mask_params *mp = pb->mask ? &pb->mp : NULL;
  tu_poison_f32(o->O, pb->nQ);
  reset_outputs(pb, o);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_fwd(ctx, TG_DTYPE_F32, pb->Q, pb->K, pb->V, o->O, o->L, p, mp,
                                     pb->mask, pb->c.causal, opt),
                   TG_OK);
  gather(pb, p->O_strides, o->O, o->Oc);
  gather(pb, p->O_strides, pb->dO, o->dOc);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_F32, o->Oc, o->dOc, o->Dv, p->B,
                                               p->H, p->qL, p->D),
                   TG_OK);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb->Q, pb->K, pb->V, o->L, pb->dO,
                                     o->Dv, o->dQ, o->dK, o->dV, p, mp, pb->mask,
                                     pb->c.causal, opt),
                   TG_OK);
}

static tg_bf16 *to_bf16(const float *x, int64_t n) {
  tg_bf16 *y = tu_alloc(sizeof(tg_bf16) * (size_t)(n ? n : 1));
  for (int64_t e = 0; e < n; e++) y[e] = tg_f32_to_bf16(x[e]);
  return y;
}

/* run_step on the bf16 entry points (pb->bf16: the inputs are bf16
 * values): O comes back in bf16 (o->O gets it widened), compute_d reads
 * that O. */
static void run_step_bf16(tg_ctx *ctx, const attn_problem *pb, const tg_attn_options *opt,
                          ext_out *o) {
  const tg_attn_params *p = &pb->p;
  const tg_attn_mask_params *mp = pb->mask ? &pb->mp : NULL;
  tg_bf16 *Q = to_bf16(pb->Q, pb->nQ), *K = to_bf16(pb->K, pb->nK), *V = to_bf16(pb->V, pb->nK);
  tg_bf16 *dO = to_bf16(pb->dO, pb->nQ), *M = to_bf16(pb->mask, pb->nM);
  tg_bf16 *O = tu_alloc(sizeof(tg_bf16) * pb->nQ);
  for (int64_t e = 0; e < pb->nQ; e++) O[e] = 0x7FC0; /* NaN */
  reset_outputs(pb, o);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, O, o->L, p, mp,
                                     pb->mask ? M : NULL, pb->c.causal, opt),
                   TG_OK);
  for (int64_t e = 0; e < pb->nQ; e++) o->O[e] = tg_bf16_to_f32(O[e]);
  gather(pb, p->O_strides, o->O, o->Oc);
  gather(pb, p->O_strides, pb->dO, o->dOc);
  tg_bf16 *Oc = to_bf16(o->Oc, pb->nQ), *dOc = to_bf16(o->dOc, pb->nQ); /* exact */
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_BF16, Oc, dOc, o->Dv, p->B, p->H,
                                               p->qL, p->D),
                   TG_OK);
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q, K, V, o->L, dO, o->Dv, o->dQ, o->dK,
                                     o->dV, p, mp, pb->mask ? M : NULL, pb->c.causal, opt),
                   TG_OK);
  free(Q), free(K), free(V), free(dO), free(M), free(O), free(Oc), free(dOc);
}

/* The backward alone on the bf16 entry points, fed the reference's L and
 * D_vec rounded to f32 (dK, dV start at dK0, dV0): its error is that of the
 * backward's own arithmetic, without the bf16 O's share of D_vec. */
static void run_bwd_bf16_exact_ld(tg_ctx *ctx, const attn_problem *pb, const tg_attn_options *opt,
                                  ext_out *o) {
  reset_outputs(pb, o);
  for (int64_t e = 0; e < pb->nL; e++) o->L[e] = (float)pb->Lr[e], o->Dv[e] = (float)pb->Dr[e];
  TU_EXPECT_STATUS(ctx,
                   tg_attn_train_bwd(ctx, TG_DTYPE_BF16, pb->Qb, pb->Kb, pb->Vb, o->L, pb->dOb,
                                     o->Dv, o->dQ, o->dK, o->dV, &pb->p,
                                     pb->mask ? &pb->mp : NULL, pb->maskb, pb->c.causal, opt),
                   TG_OK);
}

/* Every output against the reference bounds; rows that see no key exactly
 * O = 0, L = -inf, dQ = 0. */
static int check_step(const attn_problem *pb, const ext_out *o, const char *what) {
  const int64_t D = pb->p.D;
  int ok = attn_check_L(pb, o->L);
  for (int64_t r = 0; r < pb->nL; r++) {
    if (pb->Lr[r] != -INFINITY) continue;
    int zero = 1;
    for (int64_t d = 0; d < D; d++) zero &= o->Oc[r * D + d] == 0.0f && o->dQ[r * D + d] == 0.0f;
    if (!zero) {
      printf("  row %lld sees no key: O and dQ must be 0\n", (long long)r);
      ok = 0;
    }
  }
  ok &= tu_check_bound("O", o->Oc, pb->Or, pb->Oe, pb->nQ);
  ok &= tu_check_bound("D_vec", o->Dv, pb->Dr, pb->De, pb->nL);
  ok &= attn_check_grads(pb, o->dQ, o->dK, o->dV);
  if (!ok) printf("  ^ in %s\n", what);
  return ok;
}

static const attn_cfg configs[] = {
    /* name                        B  H Hkv qL   kL    D causal off mask layout softcap p */
    {"single element",             1, 1, 1, 1,   1,    8, 0, 0,   0, 0, 1.0f, 0},
    {"ragged tails",               2, 3, 3, 70,  45,  24, 0, 0,   0, 0, 1.0f, 0},
    {"gqa causal qL<kL",           1, 4, 2, 37,  100, 64, 1, 0,   0, 0, 1.0f, 0},
    {"causal qL>kL",               1, 2, 1, 90,  30,  16, 1, 0,   0, 0, 1.0f, 0},
    {"causal qL_off=-35",          1, 2, 2, 40,  75,   8, 1, -35, 0, 0, 1.0f, 0},
    {"mask -inf rows, full",       2, 2, 1, 33,  47,  32, 0, 0,   1, 0, 1.0f, 0},
    {"mask broadcast + causal",    2, 3, 1, 65,  65,  40, 1, 0,   2, 0, 1.0f, 0},
    {"strided gqa causal",         2, 4, 2, 50,  67,  48, 1, 0,   0, 1, 1.0f, 0},
    {"softcap + mask",             1, 2, 2, 45,  45,  16, 1, 0,   1, 0, 5.0f, 0},
    {"D=256",                      1, 2, 1, 20,  33, 256, 0, 0,   0, 0, 1.0f, 0},
    {"key ranges, strided",        1, 2, 2, 40, 1100,  8, 0, 0,   0, 1, 1.0f, 0},
    {"key ranges causal qL>kL",    1, 1, 1, 700, 530, 16, 1, 0,   0, 0, 1.0f, 0},
    {"dropout 0.1 ragged",         2, 3, 3, 70,  45,  24, 0, 0,   0, 0, 1.0f, 0.1f},
    {"dropout 0.5 gqa causal mask",1, 4, 2, 37,  100, 64, 1, 0,   1, 0, 1.0f, 0.5f},
    {"dropout 0.3 softcap strided",1, 2, 2, 45,  60,  16, 1, 0,   2, 1, 3.0f, 0.3f},
    {"dropout 0.2 key ranges",     1, 2, 1, 70,  600, 16, 1, 0,   1, 0, 1.0f, 0.2f},
    {"dropout 0.9",                1, 2, 2, 64,  64,  32, 0, 0,   0, 0, 1.0f, 0.9f},
    {"q tiles of 128, gqa mask",   1, 4, 2, 260, 70,  32, 0, 0,   1, 0, 1.0f, 0.1f},
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

/* Every config, 1/2/3 threads, every run mode, on the ISA under test
 * (TG_TEST_SHORT: a covering subset, attn_runs_of). */
static void test_f32_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1);
  int failures = 0;
  for (int ci = 0; ci < N_CONFIGS; ci++) {
    attn_problem pb;
    build(&pb, &configs[ci], &r, 0);
    ext_out o = alloc_out(&pb);
    attn_runs runs = attn_runs_of(ci, N_CONFIGS);
    for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
      run_step(run->ctx, &pb, &pb.opt, &o);
      char what[160];
      snprintf(what, sizeof what, "%s %s", pb.c.name, run->what);
      failures += !check_step(&pb, &o, what);
    }
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d configuration runs out of bound", failures);
}

/* Fresh shapes and features every run. */
static void test_f32_random_configs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 2);
  int failures = 0;
  for (int it = 0; it < 8; it++) {
    const attn_cfg c =
        attn_random_cfg(&r, &(attn_cfg_limits){.long_lo = 300, .long_hi = 500, .dropout = 1});
    attn_problem pb;
    build(&pb, &c, &r, 0);
    ext_out o = alloc_out(&pb);
    const attn_run_mode *m = &attn_modes[tu_int(&r, 0, ATTN_N_MODES - 1)];
    tg_ctx *ctx = attn_mode_ctx(tu_int(&r, 1, 3), TG_ISA_AUTO, m);
    run_step(ctx, &pb, &pb.opt, &o);
    char what[200];
    attn_cfg_str(&c, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s", m->name);
    failures += !check_step(&pb, &o, what);
    tg_ctx_destroy(ctx);
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d random configurations out of bound", failures);
}

/* The target: max |err| <= 1e-5 against f64 on unit-variance inputs,
 * up to L = 4096 (PyTorch's float32 SDPA: ~3e-7). Causal with gqa 4 sums
 * 16384 rows into each dK, dV element: the case for compensated sums
 * (2.2-3.7e-5 with a plain running sum). A target, not a derived
 * bound (the per-element bounds are checked as well); the measured errors
 * are printed. dK, dV start from 0 here. The L = 4096 cases are left out
 * under AddressSanitizer, and with TG_TEST_SHORT (qemu, ASan) the whole
 * target: its f64 references are most of the suite's time there (the
 * L = 1024 ones alone over half of it), and the Release run checks it on
 * the same kernel code; the per-element bounds of every other test run. */
static void test_f32_accuracy_target(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  static const attn_cfg long_cfgs[] = {
      {"L=1024 full",          1, 1, 1, 1024, 1024, 64, 0, 0, 0, 0, 1.0f, 0},
      {"L=1024 causal gqa",    1, 2, 1, 1024, 1024, 64, 1, 0, 0, 0, 1.0f, 0},
      {"L=1024 dropout 0.1",   1, 1, 1, 1024, 1024, 64, 1, 0, 0, 0, 1.0f, 0.1f},
#if !defined(__SANITIZE_ADDRESS__)
      {"L=4096 full",          1, 1, 1, 4096, 4096, 64, 0, 0, 0, 0, 1.0f, 0},
      {"L=4096 causal gqa 4",  1, 4, 1, 4096, 4096, 64, 1, 0, 0, 0, 1.0f, 0},
#endif
  };
  int failures = 0;
  if (tu_short()) {
    printf("  the accuracy target: left out (TG_TEST_SHORT; the Release run checks it)\n");
    return;
  }
  /* The L = 4096 cases (40 s of f64 reference each run) on the table this
   * CPU picks only: the error's growth with L comes from the engine's
   * summation order, the same C on every table; the L = 1024 cases hold
   * every table's kernels to the target. */
  tg_ctx *best = NULL;
  assert_int_equal(tg_ctx_create(&best), TG_OK);
  const tg_isa best_isa = tg_ctx_get_isa(best);
  tg_ctx_destroy(best);
  for (size_t ci = 0; ci < sizeof long_cfgs / sizeof long_cfgs[0]; ci++) {
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    if (long_cfgs[ci].qL > 1024 && tg_ctx_get_isa(ctx) != best_isa) {
      printf("  [%s] %s: left out (run on %s, the table this CPU picks)\n",
             tg_isa_name(tg_ctx_get_isa(ctx)), long_cfgs[ci].name, tg_isa_name(best_isa));
      tg_ctx_destroy(ctx);
      continue;
    }
    attn_problem pb;
    build(&pb, &long_cfgs[ci], &r, 1);
    ext_out o = alloc_out(&pb);
    run_step(ctx, &pb, &pb.opt, &o);
    failures += !check_step(&pb, &o, pb.c.name);
    const struct { const char *name; const float *got; const double *want; int64_t n; } outs[] = {
        {"O", o.Oc, pb.Or, pb.nQ},     {"dQ", o.dQ, pb.dQr, pb.nQ},
        {"dK", o.dK, pb.dKr, pb.nKout}, {"dV", o.dV, pb.dVr, pb.nKout}};
    printf("  [%s] %s max |err| vs f64:", tg_isa_name(tg_ctx_get_isa(ctx)), pb.c.name);
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
      double e = 0, mag = 0;
      for (int64_t j = 0; j < outs[k].n; j++) {
        e = fmax(e, fabs(outs[k].got[j] - outs[k].want[j]));
        mag = fmax(mag, fabs(outs[k].want[j]));
      }
      printf(" %s %.2e (max |ref| %.2g)", outs[k].name, e, mag);
      if (!(e <= 1e-5)) failures++;
    }
    printf("\n");
    tg_ctx_destroy(ctx);
    free_out(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d accuracy checks failed", failures);
}

/* --- bitwise relations ------------------------------------------------------ */
static int same_bits(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* a[e] == b[e] for every e, as values: -0 and +0 equal, NaN where the
 * other is NaN. */
static int same_values(const float *a, const float *b, int64_t n) {
  for (int64_t e = 0; e < n; e++)
    if (!(a[e] == b[e] || (a[e] != a[e] && b[e] != b[e]))) return 0;
  return 1;
}

/* dQ, dK, dV of two steps are the same bits. */
static void assert_same_grads(const attn_problem *pb, const ext_out *a, const ext_out *b) {
  assert_true(same_bits(a->dQ, b->dQ, sizeof(float) * pb->nQ));
  assert_true(same_bits(a->dK, b->dK, sizeof(float) * pb->nKout));
  assert_true(same_bits(a->dV, b->dV, sizeof(float) * pb->nKout));
}

/* Two run_step results of pb bitwise equal: O, L, dQ, dK, dV. */
static void assert_same_step(const attn_problem *pb, const ext_out *a, const ext_out *b) {
  assert_true(same_bits(a->O, b->O, sizeof(float) * pb->nQ));
  assert_true(same_bits(a->L, b->L, sizeof(float) * pb->nL));
  assert_same_grads(pb, a, b);
}

/* The step of variant v on ctx: 0 f32; 1-3 bf16 in exact, split and bf16
 * precision mode (set on ctx). */
static void run_variant_on(tg_ctx *ctx, const attn_problem *pb, int v, ext_out *out) {
  static const tg_attn_precision precisions[] = {TG_ATTN_PRECISION_EXACT,
                                                 TG_ATTN_PRECISION_SPLIT, TG_ATTN_PRECISION_BF16};
  if (!v) {
    run_step(ctx, pb, &pb->opt, out);
    return;
  }
  assert_int_equal(tg_ctx_set_attn_precision(ctx, precisions[v - 1]), TG_OK);
  run_step_bf16(ctx, pb, &pb->opt, out);
}

/* The step on a deterministic context of `threads` threads, as variant v
 * (run_variant_on). */
static void run_step_variant(int threads, const attn_problem *pb, int v, ext_out *out) {
  tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
  tg_ctx_set_deterministic(ctx, 1);
  run_variant_on(ctx, pb, v, out);
  tg_ctx_destroy(ctx);
}

/* The KV schedule's key-tile chunks (kernels/attention_bwd.c, plan_chunk:
 * from the L2 per CPU) change where the operands sit, not the order of any
 * sum: with the L2 planned at 0 (one key tile at a time), 300 KiB and 1 GiB
 * (every tile of a range) the f32 step (compensated dK, dV sums, dropout)
 * and the bf16 step in each precision mode give the same bits; so does the
 * dQ product over a chunk's key tiles (the f32 GEMM, and on the bf16 unit
 * from D 128: hence the bf16 modes at D 128 too; under TG_TEST_SHORT, for
 * qemu, bf16 mode with one tile and all at once only). 9 key tiles of 64
 * (planned for TU_PLAN_CPUS: two key ranges, the last chunk short), causal
 * with qL < kL, a mask with -inf rows, gqa 2. */
static void test_key_chunks_same_bits(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 12);
  static const int dims[] = {32, 128};
  for (int di = 0; di < 2; di++) {
    const int D = dims[di];
    const attn_cfg c = {"chunks", 1, 4, 2, 150, 530, D, 1, 0, 1, 0, 1.0f, 0.2f};
    attn_problem pb;
    build(&pb, &c, &r, 0);
    ext_out first = alloc_out(&pb), o = alloc_out(&pb);
    const long long l2[] = {0, 1LL << 30, 300 << 10};
    const int n_l2 = D == 128 && tu_short() ? 2 : 3;
    for (int v = D == 32 ? 0 : tu_short() ? 3 : 1; v < 4; v++) /* f32; bf16 in each mode */
      for (int li = 0; li < n_l2; li++) {
        tg_testing_plan_l2_bytes(l2[li]);
        run_step_variant(li + 1, &pb, v, li ? &o : &first);
        if (li) assert_same_grads(&pb, &first, &o);
      }
    free_out(&first), free_out(&o);
    attn_destroy(&pb);
  }
  tg_testing_plan_l2_bytes(12345);
  assert_true(tg_plan_l2_bytes() == 12345);
  tg_testing_plan_l2_bytes(-1); /* the machine's: sysfs, sysconf or the default */
  assert_true(tg_plan_l2_bytes() > 0 && tg_plan_l2_bytes() == tg_plan_l2_bytes());
}

/* The backward's dK, dV products over several q units (kernels/
 * attention_bwd.c, plan_dkv_units) sum in the order of one unit at a time:
 * bf16 mode (one part) gives the same bits with 1, 2, 3 and 8 units per
 * product, at 1 and 3 threads. The "chunks" problem: 150 q rows (a short
 * last q-tile, which ends its batch), causal with qL < kL (a key tile near
 * the diagonal is seen by a batch's later units only: the product's run
 * starts mid-batch), gqa 2, dropout, -inf mask rows. On a
 * table without the bf16 unit it checks only that the hook changes
 * nothing. */
static void test_dkv_units_same_bits(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 14);
  const attn_cfg c = {"dkv-units", 1, 4, 2, 150, 530, 32, 1, 0, 1, 0, 1.0f, 0.2f};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out first = alloc_out(&pb), o = alloc_out(&pb);
  const int units[] = {1, 2, 3, 8};
  for (int ui = 0; ui < 4; ui++) {
    tg_testing_attn_dkv_units(units[ui]);
    run_step_variant(ui % 2 ? 3 : 1, &pb, 3, ui ? &o : &first);
    if (ui) assert_same_grads(&pb, &first, &o);
  }
  tg_testing_attn_dkv_units(0);
  free_out(&first), free_out(&o);
  attn_destroy(&pb);
}

/* The backward's dK, dV summed transposed on the bf16 unit (dK^T = Q^T .
 * dS, dV^T = dO^T . P: kernels/attention_bwd.c, up to TG_ATTN_DKV_T_MAX_D)
 * or as dS^T . Q, P^T . dO: the same products added in the same order,
 * so the same bits, in each precision mode, in the KV schedule (key
 * ranges and query groups: dK, dV parts summed in place) at 1 and 3
 * threads and in the ATOMIC one at 1 (its adds then in a fixed order).
 * The "chunks" problem (short last q-tile, causal with qL < kL, dropout,
 * -inf mask rows, gqa 2) at D 32 and 160, on either side of the rule.
 * TG_TEST_SHORT (qemu): split and bf16 mode at D 32, the KV schedule. On
 * a table without the bf16 unit the hook changes nothing. */
static void test_dkv_transposed_same_bits(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 15);
  static const int dims[] = {32, 160};
  for (int di = 0; di < (tu_short() ? 1 : 2); di++) {
    const attn_cfg c = {"dkv-t", 1, 4, 2, 150, 530, dims[di], 1, 0, 1, 0, 1.0f, 0.2f};
    attn_problem pb;
    build(&pb, &c, &r, 0);
    ext_out first = alloc_out(&pb), o = alloc_out(&pb);
    for (int v = tu_short() ? 2 : 1; v < 4; v++) /* bf16 inputs in each precision mode */
      for (int run = 0; run < (tu_short() ? 2 : 3); run++) { /* KV 1, 3 threads; ATOMIC 1 */
        for (int t = 0; t < 2; t++) {
          tg_testing_attn_dkv_transposed(t);
          tg_ctx *ctx = attn_mode_ctx(run == 1 ? 3 : 1, TG_ISA_AUTO, &attn_modes[run == 2]);
          if (run < 2) assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
          run_variant_on(ctx, &pb, v, t ? &o : &first);
          tg_ctx_destroy(ctx);
        }
        assert_same_grads(&pb, &first, &o);
      }
    tg_testing_attn_dkv_transposed(-1);
    free_out(&first), free_out(&o);
    attn_destroy(&pb);
  }
}

/* S's and dP's K padded to a k step (kernels/attention.h, tg_attn_k_padded:
 * Q's, dO's rows copied with zeros past D, zero pairs in K^T, V^T), which
 * the amx table does at its tile step of 32, forced on whatever table runs
 * the bf16 products (tg_testing_attn_k_step): the padded products add only
 * 0 * 0 terms, so O, L, dQ, dK, dV are the same values (a zero sum may
 * change its sign on a unit that adds the zero pairs: -0 and +0 equal;
 * NaN where the other is NaN), in each precision mode, in the KV schedule
 * (1 and 3 threads) and the ATOMIC one (1). The "chunks" problem at D 40
 * (K 64), 72 (96) and 136 (160); TG_TEST_SHORT (qemu): D 40. On a table
 * without the bf16 unit nothing is padded. */
static void test_k_padded_same_values(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 16);
  static const int dims[] = {40, 72, 136};
  for (int di = 0; di < (tu_short() ? 1 : 3); di++) {
    const attn_cfg c = {"k-pad", 1, 4, 2, 150, 530, dims[di], 1, 0, 1, 0, 1.0f, 0.2f};
    attn_problem pb;
    build(&pb, &c, &r, 0);
    ext_out first = alloc_out(&pb), o = alloc_out(&pb);
    for (int v = 1; v < 4; v++) /* bf16 inputs in each precision mode */
      for (int run = 0; run < (tu_short() ? 2 : 3); run++) { /* KV 1, 3 threads; ATOMIC 1 */
        for (int t = 0; t < 2; t++) {
          tg_testing_attn_k_step(t ? 32 : 0);
          tg_ctx *ctx = attn_mode_ctx(run == 1 ? 3 : 1, TG_ISA_AUTO, &attn_modes[run == 2]);
          if (run < 2) assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
          run_variant_on(ctx, &pb, v, t ? &o : &first);
          tg_ctx_destroy(ctx);
        }
        assert_true(same_values(first.O, o.O, pb.nQ));
        assert_true(same_values(first.L, o.L, pb.nL));
        assert_true(same_values(first.dQ, o.dQ, pb.nQ));
        assert_true(same_values(first.dK, o.dK, pb.nKout));
        assert_true(same_values(first.dV, o.dV, pb.nKout));
      }
    tg_testing_attn_k_step(0);
    free_out(&first), free_out(&o);
    attn_destroy(&pb);
  }
}

/* dK, dV of two steps are equal as values (NaN where the other is NaN;
 * -0 and +0 equal), dQ the same bits. */
static void assert_same_grad_values(const attn_problem *pb, const ext_out *a, const ext_out *b) {
  assert_true(same_bits(a->dQ, b->dQ, sizeof(float) * pb->nQ));
  assert_true(same_values(a->dK, b->dK, pb->nKout));
  assert_true(same_values(a->dV, b->dV, pb->nKout));
}

/* TG_ATTN_OPT_DKV_WRITE: dK, dV written, not accumulated. NaN-filled
 * before the call, they come out as accumulating into zeros gives them
 * (as values: a zero sum may come out -0 where that gives +0), and dQ the
 * same bits: f32 inputs and bf16 in each precision mode, the KV schedule
 * (planned for TU_PLAN_CPUS: key ranges and query groups, group 0 writing
 * the key tiles it sees and zeros in the rest of its range) at 1 and 3
 * threads, the ATOMIC one at 1 (a fixed order of its adds; the zeros
 * first). The "chunks" problem (causal with qL < kL, dropout, -inf mask
 * rows, gqa 2) without and with a sliding window (key tiles that the
 * first q-tiles' group never sees). D 40, where the bf16 products sum
 * dK, dV transposed, and D 136, where they sum them by rows
 * (TG_ATTN_DKV_T_MAX_D). TG_TEST_SHORT (qemu): bf16 mode. */
static void test_dkv_write(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 31);
  for (int wi = 0; wi < 3; wi++) { /* D 40; D 40 with a window; D 136 */
    const attn_cfg c = {"dkv-write", 1, 4, 2, 150, 530, wi < 2 ? 40 : 136, 1, 0, 1, 0, 1.0f, 0.2f};
    attn_problem pb;
    build(&pb, &c, &r, 1); /* dK0 = dV0 = 0 */
    if (wi == 1) pb.opt.window = 97;
    float *zeros_k = pb.dK0, *zeros_v = pb.dV0;
    float *nan_k = tu_alloc(sizeof(float) * pb.nKout), *nan_v = tu_alloc(sizeof(float) * pb.nKout);
    tu_poison_f32(nan_k, pb.nKout);
    tu_poison_f32(nan_v, pb.nKout);
    ext_out acc = alloc_out(&pb), wr = alloc_out(&pb);
    for (int v = tu_short() ? 3 : 0; v < 4; v++) /* f32; bf16 in exact, split, bf16 mode */
      for (int run = 0; run < 3; run++) {        /* KV 1, 3 threads; ATOMIC 1 */
        for (int w = 0; w < 2; w++) {
          tg_ctx *ctx = attn_mode_ctx(run == 1 ? 3 : 1, TG_ISA_AUTO, &attn_modes[run == 2]);
          pb.opt.flags = w ? TG_ATTN_OPT_DKV_WRITE : 0;
          pb.dK0 = w ? nan_k : zeros_k, pb.dV0 = w ? nan_v : zeros_v;
          run_variant_on(ctx, &pb, v, w ? &wr : &acc);
          tg_ctx_destroy(ctx);
        }
        assert_true(same_bits(acc.O, wr.O, sizeof(float) * pb.nQ)); /* (the forward ignores it) */
        assert_same_grad_values(&pb, &acc, &wr);
      }
    pb.dK0 = zeros_k, pb.dV0 = zeros_v, pb.opt.flags = 0;
    free(nan_k), free(nan_v);
    free_out(&acc), free_out(&wr);
    attn_destroy(&pb);
  }
}

/* The forward's q units per work item ((q-tile, query head) pairs of a kv
 * head, q-tile major; up to gqa of them where that leaves 4 items per
 * thread: here gqa 4 on one kv head, so at 1 thread an item holds 3 or 4
 * units (by the q tile: the four heads of a q-tile, or three across two
 * q-tiles), at 3 threads one) share each
 * key tile's load, never a sum: O and L are the same bits either way, f32
 * and bf16 in each precision mode. Causal with qL < kL and an odd qL_off,
 * so a q-tile's last key tile ends short of its neighbour's (the bf16
 * pairs then hold a key the q-tile does not see); a mask with -inf rows,
 * dropout, D 128 (exact mode's three bf16 parts in the forward where the
 * table has them). */
static void test_fwd_q_tiles_same_bits(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 13);
  const attn_cfg c = {"q-tiles", 1, 4, 1, 150, 531, 128, 1, 0, 1, 0, 1.0f, 0.2f};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out first = alloc_out(&pb), o = alloc_out(&pb);
  for (int v = 0; v < 4; v++) /* f32; bf16 in each precision mode */
    for (int pi = 0; pi < 2; pi++) { /* 1 thread: 3 or 4 units an item; 3: one */
      run_step_variant(pi ? 3 : 1, &pb, v, pi ? &o : &first);
      if (pi) {
        assert_true(same_bits(first.O, o.O, sizeof(float) * pb.nQ));
        assert_true(same_bits(first.L, o.L, sizeof(float) * pb.nL));
      }
    }
  free_out(&first), free_out(&o);
  attn_destroy(&pb);
}

/* bf16 mode's forward keeps a row's running max while a key tile's scores
 * stay within TG_ATTN_FWD_MAX_LAG above it (one pass, isa/tuning.h), and
 * its l sums the f32 P as exact mode's does, so their L agree to the f32
 * sums' rounding: |L_bf16 - L_exact| <= 2 kL u (each of the two l's within
 * kL u relative, log's error far below) + 4 u |L|. Scores of scale 6 so
 * the running max moves by more than the lag on some tiles and less on
 * others; several key tiles a row; no mask, softcap or dropout (the rows
 * the one-pass path takes); every table. */
static void test_fwd_lag_L(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 17);
  const attn_cfg c = {"lag", 1, 4, 2, 150, 1100, 64, 0, 0, 0, 0, 1.0f, 0};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  pb.p.scale = 6.0f / sqrtf(64.0f);
  ext_out ex = alloc_out(&pb), bf = alloc_out(&pb);
  run_step_variant(1, &pb, 1, &ex);
  run_step_variant(1, &pb, 3, &bf);
  for (int64_t e = 0; e < pb.nL; e++) {
    const double bound = 2.0 * 1100 * U + 4 * U * fabs(ex.L[e]);
    if (!(fabs((double)bf.L[e] - ex.L[e]) <= bound))
      TU_FAIL("L[%lld]: bf16 mode %.9g, exact %.9g", (long long)e, (double)bf.L[e],
              (double)ex.L[e]);
  }
  free_out(&ex), free_out(&bf);
  attn_destroy(&pb);
}

/* p = 0 (any seed and offset) gives the bits of opt == NULL, in f32 and bf16;
 * bf16 with opt NULL gives the bits of the tg_flash_attn_*_bf16 entry points. */
static void test_p0_bitwise_equals_no_options(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 4);
  const attn_cfg c = {"p0", 2, 4, 2, 70, 130, 32, 1, 0, 1, 0, 1.0f, 0};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out a = alloc_out(&pb), b = alloc_out(&pb);
  const tg_attn_options p0 = {.dropout_p = 0.0f, .dropout_seed = tu_next(&r),
                              .dropout_offset = tu_next(&r)};
  for (int mi = 0; mi < ATTN_N_MODES; mi++) {
    tg_ctx *ctx = attn_mode_ctx(2, TG_ISA_AUTO, &attn_modes[mi]);
    run_step(ctx, &pb, NULL, &a);
    run_step(ctx, &pb, &p0, &b);
    assert_true(same_bits(a.O, b.O, sizeof(float) * pb.nQ));
    assert_true(same_bits(a.L, b.L, sizeof(float) * pb.nL));
    if (!attn_modes[mi].det && attn_modes[mi].schedule == TG_ATTN_SCHEDULE_ATOMIC) {
      tg_ctx_destroy(ctx); /* atomic adds in varying order: not bitwise */
      continue;
    }
    assert_same_grads(&pb, &a, &b);
    tg_ctx_destroy(ctx);
  }

  /* bf16: the new entry points with opt NULL and with p = 0 against the
   * contract entry points (deterministic: every output bitwise) */
  const int64_t nQ = pb.nQ, nK = pb.nK, nL = pb.nL, nKo = pb.nKout;
  tg_bf16 *Q = tu_alloc(2 * nQ), *K = tu_alloc(2 * nK), *V = tu_alloc(2 * nK);
  tg_bf16 *dO = tu_alloc(2 * nQ), *M = tu_alloc(2 * pb.nM), *O[3];
  float *L[3], *Dv[3], *dQ[3], *dK[3], *dV[3];
  for (int64_t e = 0; e < nQ; e++) Q[e] = tg_f32_to_bf16(pb.Q[e]), dO[e] = tg_f32_to_bf16(pb.dO[e]);
  for (int64_t e = 0; e < nK; e++) K[e] = tg_f32_to_bf16(pb.K[e]), V[e] = tg_f32_to_bf16(pb.V[e]);
  for (int64_t e = 0; e < pb.nM; e++) M[e] = tg_f32_to_bf16(pb.mask[e]);
  tg_ctx *ctx = tu_ctx(3, TG_ISA_AUTO);
  tg_ctx_set_deterministic(ctx, 1);
  const tg_attn_params *p = &pb.p;
  for (int v = 0; v < 3; v++) { /* 0: contract entry points, 1: opt NULL, 2: p = 0 */
    O[v] = tu_alloc(2 * nQ), L[v] = tu_alloc(4 * nL), Dv[v] = tu_alloc(4 * nL);
    dQ[v] = tu_alloc(4 * nQ), dK[v] = tu_alloc(4 * nKo), dV[v] = tu_alloc(4 * nKo);
    memcpy(dK[v], pb.dK0, 4 * nKo);
    memcpy(dV[v], pb.dV0, 4 * nKo);
    const tg_attn_options *opt = v == 2 ? &p0 : NULL;
    if (v == 0) {
      TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, Q, K, V, O[v], L[v], p, &pb.mp, M, 1),
                       TG_OK);
      TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O[v], dO, Dv[v], p->B, p->H,
                                                                  p->qL, p->D),
                       TG_OK);
      TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_bf16(ctx, Q, K, V, L[v], dO, Dv[v], dQ[v],
                                                         dK[v], dV[v], p, &pb.mp, M, 1),
                       TG_OK);
    } else {
      TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, O[v], L[v], p, &pb.mp,
                                              M, 1, opt),
                       TG_OK);
      TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_BF16, O[v], dO, Dv[v], p->B,
                                                        p->H, p->qL, p->D),
                       TG_OK);
      TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q, K, V, L[v], dO, Dv[v], dQ[v],
                                              dK[v], dV[v], p, &pb.mp, M, 1, opt),
                       TG_OK);
    }
  }
  for (int v = 1; v < 3; v++) {
    assert_true(same_bits(O[0], O[v], 2 * nQ));
    assert_true(same_bits(L[0], L[v], 4 * nL));
    assert_true(same_bits(Dv[0], Dv[v], 4 * nL));
    assert_true(same_bits(dQ[0], dQ[v], 4 * nQ));
    assert_true(same_bits(dK[0], dK[v], 4 * nKo));
    assert_true(same_bits(dV[0], dV[v], 4 * nKo));
  }
  for (int v = 0; v < 3; v++) free(O[v]), free(L[v]), free(Dv[v]), free(dQ[v]), free(dK[v]), free(dV[v]);
  free(Q), free(K), free(V), free(dO), free(M);
  tg_ctx_destroy(ctx);
  free_out(&a), free_out(&b);
  attn_destroy(&pb);
}

/* One engine: on inputs that bf16 holds exactly, TG_DTYPE_BF16 and
 * TG_DTYPE_F32 compute the same f32 numbers, with and without dropout: L
 * bitwise equal, the bf16 O the f32 O rounded to bf16, and from the same L
 * and D_vec the same dQ; dK and dV too on the ATOMIC schedule at one thread
 * (on the KV schedule f32 sums them with compensation, bf16 does not). */
static void test_bf16_f32_same_engine(void **state) {
  tg_ctx *probe = tu_ctx(1, TG_ISA_AUTO);
  const tg_isa_ops *ops = tg_isa_table(tg_ctx_get_isa(probe));
  tg_ctx_destroy(probe);
  if (ops->mm_bf16_pairs) { /* bf16 runs Q.K^T and dO.V^T on the bf16 dot GEMM
                             * (vdpbf16ps, AMX tiles): other sums, other bits */
    printf("  %s: the bf16 path has its own products; not bitwise the f32 path's\n", ops->name);
    return;
  }
  tu_rng r = tu_rng_make(tu_seed() + 5);
  const float ps[] = {0.0f, 0.25f};
  for (int pi = 0; pi < 2; pi++) {
    const attn_cfg c = {"engine", 1, 4, 2, 80, 150, 24, 1, 0, 1, 0, 2.0f, ps[pi]};
    attn_problem pb;
    build(&pb, &c, &r, 0);
    const int64_t nQ = pb.nQ, nK = pb.nK, nL = pb.nL, nKo = pb.nKout;
    tg_bf16 *Qb = tu_alloc(2 * nQ), *Kb = tu_alloc(2 * nK), *Vb = tu_alloc(2 * nK);
    tg_bf16 *dOb = tu_alloc(2 * nQ), *Mb = tu_alloc(2 * pb.nM), *Ob = tu_alloc(2 * nQ);
    /* round the f32 inputs to bf16 in place: both paths then see the same values */
    struct { float *f; tg_bf16 *b; int64_t n; } t[] = {
        {pb.Q, Qb, nQ}, {pb.K, Kb, nK}, {pb.V, Vb, nK}, {pb.dO, dOb, nQ}, {pb.mask, Mb, pb.nM}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
      for (int64_t e = 0; e < t[k].n; e++) {
        t[k].b[e] = tg_f32_to_bf16(t[k].f[e]);
        t[k].f[e] = tg_bf16_to_f32(t[k].b[e]);
      }
    float *Of = tu_alloc(4 * nQ), *Lf = tu_alloc(4 * nL), *Lb = tu_alloc(4 * nL);
    float *Dv = tu_alloc(4 * nL), *g[2][3];
    for (int v = 0; v < 2; v++)
      for (int k = 0; k < 3; k++) g[v][k] = tu_alloc(4 * (k ? nKo : nQ));
    tu_fill_f32(&r, Dv, nL, -1, 1);
    const tg_attn_params *p = &pb.p;
    tg_ctx *kv = tu_ctx(2, TG_ISA_AUTO), *atomic1 = tu_ctx(1, TG_ISA_AUTO);
    assert_int_equal(tg_ctx_set_attn_schedule(atomic1, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
    TU_EXPECT_STATUS(kv, tg_attn_train_fwd(kv, TG_DTYPE_F32, pb.Q, pb.K, pb.V, Of, Lf, p, &pb.mp,
                                           pb.mask, 1, &pb.opt),
                     TG_OK);
    TU_EXPECT_STATUS(kv, tg_attn_train_fwd(kv, TG_DTYPE_BF16, Qb, Kb, Vb, Ob, Lb, p, &pb.mp, Mb,
                                           1, &pb.opt),
                     TG_OK);
    assert_true(same_bits(Lf, Lb, 4 * nL));
    for (int64_t e = 0; e < nQ; e++) assert_int_equal(Ob[e], tg_f32_to_bf16(Of[e]));
    for (int sched = 0; sched < 2; sched++) {
      tg_ctx *ctx = sched ? atomic1 : kv;
      for (int v = 0; v < 2; v++) {
        memcpy(g[v][1], pb.dK0, 4 * nKo);
        memcpy(g[v][2], pb.dV0, 4 * nKo);
        TU_EXPECT_STATUS(
            ctx,
            tg_attn_train_bwd(ctx, v ? TG_DTYPE_BF16 : TG_DTYPE_F32, v ? (const void *)Qb : pb.Q,
                              v ? (const void *)Kb : pb.K, v ? (const void *)Vb : pb.V, Lf,
                              v ? (const void *)dOb : pb.dO, Dv, g[v][0], g[v][1], g[v][2], p,
                              &pb.mp, v ? (const void *)Mb : pb.mask, 1, &pb.opt),
            TG_OK);
      }
      for (int k = 0; k < (sched ? 3 : 1); k++)
        assert_true(same_bits(g[0][k], g[1][k], 4 * (k ? nKo : nQ)));
    }
    tg_ctx_destroy(kv), tg_ctx_destroy(atomic1);
    for (int v = 0; v < 2; v++)
      for (int k = 0; k < 3; k++) free(g[v][k]);
    free(Qb), free(Kb), free(Vb), free(dOb), free(Mb), free(Ob), free(Of), free(Lf), free(Lb);
    free(Dv);
    attn_destroy(&pb);
  }
}

/* The precision modes (tg_ctx_set_attn_precision) on the bf16 pipeline:
 * every config, 1/2/3 threads, both schedules and deterministic mode, the
 * ISA under test (TG_TEST_SHORT: a covering subset in each precision
 * mode, attn_runs_of), against the f64 reference with the mode's error per
 * term of the products that take P or dS: 0 (exact), 2^-16 (split: hi + lo
 * misses x by at most bf16's unit roundoff of x - hi, itself at most 2^-8
 * |x|) and 2^-8 (bf16: one rounding), besides the f32 bounds above, and
 * O's bf16 rounding. The measured max |err| of O, dQ, dK, dV over all runs
 * of each mode is printed (docs/KERNELS.md's table comes from these and
 * from tilegrad bench --section precision). Also: exact-mode bits do not
 * change when a context was in another mode before; bad modes refused. */
static void test_bf16_precision_modes(void **state) {
  static const struct { tg_attn_precision mode; const char *name; } pm[] = {
      {TG_ATTN_PRECISION_EXACT, "exact"},
      {TG_ATTN_PRECISION_SPLIT, "split"},
      {TG_ATTN_PRECISION_BF16, "bf16"},
  };
  tg_isa isas[TU_MAX_ISAS];
  tu_isas(isas); /* for the line of measured errors */
  int failures = 0;
  for (size_t mi = 0; mi < sizeof pm / sizeof pm[0]; mi++) {
    tu_rng r = tu_rng_make(tu_seed() + 11); /* the same problems in every mode */
    double worst[4] = {0, 0, 0, 0}, mag[4] = {0, 0, 0, 0};
    for (int ci = 0; ci < N_CONFIGS; ci++) {
      attn_problem pb;
      build_ex(&pb, &configs[ci], &r, 0, 1, pm[mi].mode);
      ext_out o = alloc_out(&pb);
      /* numbered ci + mi: each precision mode's configs still take every
       * run under TG_TEST_SHORT, and a config meets other runs in each */
      attn_runs runs = attn_runs_of((ci + (int)mi) % N_CONFIGS, N_CONFIGS);
      for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
        assert_int_equal(tg_ctx_set_attn_precision(run->ctx, pm[mi].mode), TG_OK);
        assert_int_equal(tg_ctx_get_attn_precision(run->ctx), pm[mi].mode);
        run_step_bf16(run->ctx, &pb, &pb.opt, &o);
        char what[160];
        snprintf(what, sizeof what, "%s %s, precision %s", pb.c.name, run->what, pm[mi].name);
        failures += !check_step(&pb, &o, what);
        for (int64_t j = 0; j < pb.nQ; j++) /* O: the forward's (bf16 output) */
          worst[0] = fmax(worst[0], fabs(o.Oc[j] - pb.Or[j])), mag[0] = fmax(mag[0], fabs(pb.Or[j]));
        run_bwd_bf16_exact_ld(run->ctx, &pb, &pb.opt, &o);
        if (!attn_check_grads(&pb, o.dQ, o.dK, o.dV)) {
          printf("  ^ in %s (backward from exact L, D_vec)\n", what);
          failures++;
        }
        const struct { const float *got; const double *want; int64_t n; } outs[] = {
            {o.dQ, pb.dQr, pb.nQ}, {o.dK, pb.dKr, pb.nKout}, {o.dV, pb.dVr, pb.nKout}};
        for (int k = 0; k < 3; k++)
          for (int64_t j = 0; j < outs[k].n; j++) {
            worst[k + 1] = fmax(worst[k + 1], fabs(outs[k].got[j] - outs[k].want[j]));
            mag[k + 1] = fmax(mag[k + 1], fabs(outs[k].want[j]));
          }
      }
      free_out(&o);
      attn_destroy(&pb);
    }
    printf("  precision %s [%s]: max |err| vs f64 over the configs (max |ref|): O %.2e (%.2g), "
           "and the backward from exact L, D_vec: dQ %.2e (%.2g) dK %.2e (%.2g) dV %.2e (%.2g)\n",
           pm[mi].name, tg_isa_name(isas[0]), worst[0], mag[0], worst[1], mag[1], worst[2], mag[2],
           worst[3], mag[3]);
  }
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_precision(ctx, (tg_attn_precision)3), TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_precision(ctx, (tg_attn_precision)-1), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_ctx_get_attn_precision(ctx), TG_ATTN_PRECISION_EXACT);
  assert_int_equal(tg_ctx_get_attn_precision(NULL), TG_ATTN_PRECISION_EXACT);
  assert_int_equal(tg_ctx_set_attn_precision(NULL, TG_ATTN_PRECISION_BF16), TG_ERR_NULL_ARG);
  tg_ctx_destroy(ctx);
  if (failures) TU_FAIL("%d precision-mode runs out of bound", failures);
}

/* float32 inputs compute in f32 whatever the mode: the same bits. */
static void test_precision_modes_leave_f32(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 12);
  const attn_cfg c = {"f32 modes", 1, 4, 2, 70, 90, 32, 1, 0, 1, 0, 1.0f, 0.2f};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out a = alloc_out(&pb), b = alloc_out(&pb);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  run_step(ctx, &pb, &pb.opt, &a);
  for (int m = TG_ATTN_PRECISION_SPLIT; m <= TG_ATTN_PRECISION_BF16; m++) {
    assert_int_equal(tg_ctx_set_attn_precision(ctx, (tg_attn_precision)m), TG_OK);
    run_step(ctx, &pb, &pb.opt, &b);
    assert_same_step(&pb, &a, &b);
  }
  tg_ctx_destroy(ctx);
  free_out(&a), free_out(&b);
  attn_destroy(&pb);
}

/* Deterministic mode with dropout: bitwise the same at 1, 2, 3 and 5 threads
 * (several key ranges: the dQ partial sum), and the KV schedule without
 * deterministic mode gives those bits too (it is atomic-free). */
static void test_dropout_deterministic(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 6);
  const attn_cfg c = {"det", 2, 4, 2, 150, 530, 32, 1, 0, 1, 0, 1.0f, 0.3f};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out first = alloc_out(&pb), o = alloc_out(&pb);
  const int threads[] = {1, 2, 3, 5, 2};
  for (int ti = 0; ti < 5; ti++) {
    tg_ctx *ctx = tu_ctx(threads[ti], TG_ISA_AUTO);
    tg_ctx_set_deterministic(ctx, ti != 4);
    run_step(ctx, &pb, &pb.opt, ti ? &o : &first);
    if (ti) assert_same_step(&pb, &first, &o);
    tg_ctx_destroy(ctx);
  }
  free_out(&first), free_out(&o);
  attn_destroy(&pb);
}

/* --- the dropout mask --------------------------------------------------------- */

/* Random123's known-answer vectors for Philox4x32-10 (counter, key -> out). */
static void test_philox_known_answers(void **state) {
  static const struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
    uint32_t out[4];
    tg_philox4x32_10(kat[i].ctr, kat[i].key, out);
    for (int w = 0; w < 4; w++)
      if (out[w] != kat[i].out[w])
        TU_FAIL("Philox4x32-10 vector %zu word %d: got %08x want %08x", i, w, out[w],
                kat[i].out[w]);
  }
}

/* tg_attn_dropout_keep against the documented mapping evaluated here draw by
 * draw (word n % 4 of Philox(seed, offset + n/4 as a 128-bit counter), kept
 * iff >= round(p 2^32)), at 1, 2 and 3 threads (the same bits); the fraction
 * kept within 6 standard deviations of the binomial count n (1 - t/2^32)
 * (a false alarm about once in 10^9 runs); opt NULL and p = 0: all kept. */
static void test_dropout_keep_mask(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 7);
  const struct { uint32_t B, H, qL, kL; float p; } cases[] = {
      {1, 1, 1, 1, 0.5f}, {2, 3, 17, 29, 0.1f}, {1, 2, 64, 257, 0.5f}, {3, 1, 100, 333, 0.9f},
      {1, 1, 300, 700, 1e-3f}, {1, 1, 1, 70000, 0.37f}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const uint64_t n = (uint64_t)cases[ci].B * cases[ci].H * cases[ci].qL * cases[ci].kL;
    const tg_attn_options opt = {
        .dropout_p = cases[ci].p, .dropout_seed = tu_next(&r),
        .dropout_offset = ci % 2 ? tu_next(&r) : UINT64_MAX - (uint64_t)tu_int(&r, 0, 100)};
    const uint32_t t = (uint32_t)rint((double)opt.dropout_p * 4294967296.0);
    uint8_t *want = tu_alloc(n), *got = tu_alloc(n);
    uint64_t kept = 0;
    const uint32_t key[2] = {(uint32_t)opt.dropout_seed, (uint32_t)(opt.dropout_seed >> 32)};
    for (uint64_t i = 0; i < n; i++) {
      const uint64_t lo = opt.dropout_offset + i / 4; /* 128-bit counter: carry into c2 */
      const uint32_t ctr[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), lo < opt.dropout_offset, 0};
      uint32_t w[4];
      tg_philox4x32_10(ctr, key, w);
      want[i] = w[i % 4] >= t;
      kept += want[i];
    }
    for (int ti = 0; ti < tu_n_thread_counts; ti++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], TG_ISA_AUTO);
      memset(got, 7, n);
      TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, &opt, cases[ci].B, cases[ci].H,
                                                 cases[ci].qL, cases[ci].kL, got),
                       TG_OK);
      if (memcmp(got, want, n)) TU_FAIL("keep mask of case %zu differs from the mapping", ci);
      tg_ctx_destroy(ctx);
    }
    const double q = 1 - t / 4294967296.0, sd = sqrt((double)n * q * (1 - q));
    if (fabs((double)kept - (double)n * q) > 6 * sd + 1)
      TU_FAIL("case %zu: %llu of %llu kept, expected %.1f +- 6 * %.1f", ci,
              (unsigned long long)kept, (unsigned long long)n, n * q, sd);
    free(want), free(got);
  }
  /* no dropout: every weight kept */
  uint8_t keep[2 * 3 * 5];
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  const tg_attn_options p0 = {.dropout_p = 0.0f, .dropout_seed = 99};
  for (int v = 0; v < 2; v++) {
    memset(keep, 0, sizeof keep);
    TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, v ? &p0 : NULL, 1, 2, 3, 5, keep), TG_OK);
    for (size_t i = 0; i < sizeof keep; i++) assert_int_equal(keep[i], 1);
  }
  tg_ctx_destroy(ctx);
}

/* --- bad input: status, a message naming the field, nothing written -------- */
static void test_bad_options_write_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 8);
  const attn_cfg c = {"bad", 1, 2, 1, 20, 17, 16, 1, 0, 1, 0, 1.0f, 0};
  attn_problem pb;
  build(&pb, &c, &r, 0);
  ext_out o = alloc_out(&pb);
  float *snap[6];
  float *const outs[6] = {o.O, o.L, o.Dv, o.dQ, o.dK, o.dV};
  const int64_t sizes[6] = {pb.nQ, pb.nL, pb.nL, pb.nQ, pb.nKout, pb.nKout};
  for (int k = 0; k < 6; k++) {
    tu_fill_f32(&r, outs[k], sizes[k], -1, 1);
    snap[k] = tu_alloc(4 * sizes[k]);
    memcpy(snap[k], outs[k], 4 * sizes[k]);
  }
  uint8_t keep[20 * 17 * 2], keep_snap[sizeof keep];
  memset(keep, 0x5A, sizeof keep);
  memcpy(keep_snap, keep, sizeof keep);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  const tg_attn_params *p = &pb.p;

#define FWD(dt, opt) \
  tg_attn_train_fwd(ctx, dt, pb.Q, pb.K, pb.V, o.O, o.L, p, &pb.mp, pb.mask, 1, opt)
#define BWD(dt, opt)                                                                   \
  tg_attn_train_bwd(ctx, dt, pb.Q, pb.K, pb.V, o.L, pb.dO, o.Dv, o.dQ, o.dK, o.dV, p, \
                    &pb.mp, pb.mask, 1, opt)
#define KEEP(opt) tg_attn_dropout_keep(ctx, opt, 1, 2, 20, 17, keep)
  /* each bad option: the three entry points that take options refuse it and
   * name the field */
  const struct { tg_attn_options opt; const char *field; } bad[] = {
      {{.dropout_p = NAN}, "dropout_p"},       {{.dropout_p = -0.1f}, "dropout_p"},
      {{.dropout_p = 1.0f}, "dropout_p"},      {{.dropout_p = 1.5f}, "dropout_p"},
      {{.dropout_p = INFINITY}, "dropout_p"},  {{.dropout_p = -INFINITY}, "dropout_p"},
      {{.dropout_p = -0.0f - 1e-30f}, "dropout_p"},
      {{.dropout_p = 0.1f, .flags = 4}, "flags"},
      {{.flags = 0x80000000u | TG_ATTN_OPT_O_F32}, "flags"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    TU_EXPECT_STATUS(ctx, FWD(TG_DTYPE_F32, &bad[i].opt), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), bad[i].field));
    assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_attn_train_fwd"));
    TU_EXPECT_STATUS(ctx, BWD(TG_DTYPE_F32, &bad[i].opt), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), bad[i].field));
    TU_EXPECT_STATUS(ctx, KEEP(&bad[i].opt), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), bad[i].field));
  }
  /* dtype out of range */
  const tg_dtype bad_dtypes[] = {(tg_dtype)2, (tg_dtype)-1, (tg_dtype)1000};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
    TU_EXPECT_STATUS(ctx, FWD(bad_dtypes[i], NULL), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "dtype"));
    TU_EXPECT_STATUS(ctx, BWD(bad_dtypes[i], NULL), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "dtype"));
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_bwd_compute_d(ctx, bad_dtypes[i], o.Oc, pb.dO, o.Dv, 1, 2, 20,
                                                 16),
                     TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "dtype"));
  }
  /* the bf16 entry points' checks hold for the new ones: a sample */
  tg_attn_params q = *p;
  q.D = 12;
  TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_F32, pb.Q, pb.K, pb.V, o.O, o.L, &q,
                                          &pb.mp, pb.mask, 1, NULL),
                   TG_ERR_UNSUPPORTED);
  q = *p;
  q.NK += 1;
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb.Q, pb.K, pb.V, o.L, pb.dO, o.Dv,
                                          o.dQ, o.dK, o.dV, &q, &pb.mp, pb.mask, 1, NULL),
                   TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_F32, pb.Q, NULL, pb.V, o.O, o.L, p,
                                          &pb.mp, pb.mask, 1, NULL),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb.Q, pb.K, pb.V, o.L, pb.dO, o.Dv,
                                          o.dQ, o.dK, o.dV, p, &pb.mp, NULL, 1, NULL),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_F32, pb.Q, pb.K, pb.V, o.L, pb.dO, o.Dv,
                                          NULL, o.dK, o.dV, p, &pb.mp, pb.mask, 1, NULL),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_F32, o.Oc, NULL, o.Dv, 1, 2,
                                                    20, 16),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_F32, o.Oc, pb.dO, o.Dv, 1, 0,
                                                    20, 16),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, NULL, 1, 2, 20, 17, NULL), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, NULL, 1, 2, 0, 17, keep), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, NULL, UINT32_MAX, UINT32_MAX, UINT32_MAX, 2,
                                             keep),
                   TG_ERR_OVERFLOW);
  const tg_attn_options ok = {.dropout_p = 0.5f};
  assert_int_equal(tg_attn_train_fwd(NULL, TG_DTYPE_F32, pb.Q, pb.K, pb.V, o.O, o.L, p, &pb.mp,
                                     pb.mask, 1, &ok),
                   TG_ERR_NULL_ARG);
  assert_int_equal(tg_attn_dropout_keep(NULL, &ok, 1, 2, 20, 17, keep), TG_ERR_NULL_ARG);
#undef FWD
#undef BWD
#undef KEEP
  for (int k = 0; k < 6; k++) assert_true(same_bits(outs[k], snap[k], 4 * sizes[k]));
  assert_true(same_bits(keep, keep_snap, sizeof keep));
  tg_ctx_destroy(ctx);
  for (int k = 0; k < 6; k++) free(snap[k]);
  free_out(&o);
  attn_destroy(&pb);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_philox_known_answers),
      cmocka_unit_test(test_dropout_keep_mask),
      cmocka_unit_test(test_bad_options_write_nothing),
      cmocka_unit_test(test_f32_against_reference),
      cmocka_unit_test(test_f32_random_configs),
      cmocka_unit_test(test_p0_bitwise_equals_no_options),
      cmocka_unit_test(test_key_chunks_same_bits),
      cmocka_unit_test(test_dkv_units_same_bits),
      cmocka_unit_test(test_dkv_transposed_same_bits),
      cmocka_unit_test(test_k_padded_same_values),
      cmocka_unit_test(test_dkv_write),
      cmocka_unit_test(test_fwd_lag_L),
      cmocka_unit_test(test_fwd_q_tiles_same_bits),
      cmocka_unit_test(test_bf16_f32_same_engine),
      cmocka_unit_test(test_dropout_deterministic),
      cmocka_unit_test(test_bf16_precision_modes),
      cmocka_unit_test(test_precision_modes_leave_f32),
      cmocka_unit_test(test_f32_accuracy_target),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
