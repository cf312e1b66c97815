/*
 * FA-2 family (contract kernels 1-3 and the training forward) against an f64
 * reference.
 *
 * Tolerances. Every comparison uses a per-element bound computed in f64 next
 * to the reference: a first-order forward error bound of the f32 algorithm,
 * with u = 2^-24 (f32 unit roundoff) and gamma(n) = (n + 2) u for a sum of n
 * terms in any order (the classic bound, |fl(sum) - sum| <= gamma(n) sum|terms|):
 *
 *   qk  = Q.K            e_qk = gamma(D) sum_d |Q K|
 *   s   = score(qk)      e_s  = |scale| e_qk + 4u(|s| + |scale qk|) (+ u|s| mask add)
 *   P   = exp(s - L)     e_P  = P (e_s + u|s - L| + 2u)      (expf is < 2 ulp)
 *   dP  = dO.V           e_dP = gamma(D) sum_d |dO V|
 *   dS  = scale P (dP - Dv) (1 - t^2 with softcap)
 *                        e_dS = |scale| (e_P |dP - Dv| + P (e_dP + u|dP - Dv|)) + 8u|dS|
 *   dQ  = sum_k dS K     e    = sum_k e_dS |K| + gamma(kL) sum_k |dS K|
 *   dK  = pre + sum dS Q e    = sum e_dS |Q| + gamma(n + 1) (|pre| + sum |dS Q|)
 *   dV  = pre + sum P dO e    = sum e_P |dO| + gamma(n + 1) (|pre| + sum |P dO|)
 *
 * and the test passes iff |got - ref| <= 2 e (the factor 2 covers the
 * neglected second-order terms). The bound scales with the magnitude of the
 * summed terms, not with the result, because dQ and dK cancel towards 0. It
 * is loose enough for any summation order and tight enough that a missing,
 * duplicated or mis-masked term (an error of the order of a whole term) fails.
 *
 * The problems and the reference with these bounds (and the forward's O and
 * L with theirs, derived at forward_row) come from
 * tests/common/attn_problem.c, shared with the other FA-2 suites; what is
 * particular to this suite is the row function attn_bwd_row (there too): the
 * backward is handed the reference's L and D_vec.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_problem.h"
#include "tilegrad_testing.h"
#include "refs.h"

/* Masks: 20 % -inf entries, the others in [-3, 1); every third row all -inf. */
static const attn_suite suite = {.bf16 = 1, .mask_ninf = 0.2, .mask_lo = -3, .mask_row0 = 0,
                                 .mask_step = 3, .acc = ATTN_ACC_RANDOM, .row = attn_bwd_row};

static tg_status run_bwd(tg_ctx *ctx, const attn_problem *pb, attn_outputs *o) {
  tu_poison_f32(o->dQ, pb->nQ);
  memcpy(o->dK, pb->dK0, sizeof(float) * pb->nKout);
  memcpy(o->dV, pb->dV0, sizeof(float) * pb->nKout);
  return tg_flash_attn_train_bwd_bf16(ctx, pb->Qb, pb->Kb, pb->Vb, pb->L, pb->dOb, pb->Dv,
                                      o->dQ, o->dK, o->dV, &pb->p,
                                      pb->maskb ? &pb->mp : NULL, pb->maskb, pb->c.causal);
}

static const attn_cfg configs[] = {
    /* name                    B  H Hkv qL  kL   D  causal off mask layout        softcap p */
    {"single element",         1, 1, 1, 1,   1,   8, 0, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"ragged tails",           2, 3, 3, 70,  45,  24, 0, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"gqa causal qL<kL",       1, 4, 2, 37,  100, 64, 1, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"causal qL>kL",           1, 2, 1, 90,  30,  16, 1, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"causal qL_off=0 (seed)", 1, 2, 2, 40,  75,  8,  1, -35, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"mask -inf, full",        2, 2, 1, 33,  47,  32, 0, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"mask broadcast + causal",2, 3, 1, 65,  65,  40, 1, 0, 2, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"strided layouts",        2, 4, 2, 50,  67,  48, 1, 0, 0, ATTN_STRIDED, 1.0f, 0},
    {"D=256",                  1, 2, 1, 20,  33,  256, 0, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"D=512 gqa",              1, 2, 1, 9,   70,  512, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"softcap",                1, 2, 2, 45,  45,  16, 1, 0, 1, ATTN_HEAD_MAJOR, 5.0f, 0},
    {"multi-tile",             1, 2, 1, 200, 150, 128, 1, 0, 0, ATTN_STRIDED, 1.0f, 0},
    /* >= 8 key tiles of 64: the KV schedule splits keys into ranges and sums
     * dQ partials */
    {"key ranges causal mask", 1, 2, 1, 70,  600, 16, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"key ranges x4 strided",  1, 2, 2, 40, 1100, 8,  0, 0, 0, ATTN_STRIDED, 1.0f, 0},
    /* causal ranges that early q-tiles never reach (their partial rows are
     * skipped), and q rows that see no key at all (qL > kL) */
    {"key ranges causal qL=kL",1, 2, 1, 600, 600, 24, 1, 0, 0, ATTN_HEAD_MAJOR, 1.0f, 0},
    {"key ranges causal qL>kL",1, 1, 1, 700, 530, 16, 1, 0, 0, ATTN_STRIDED, 1.0f, 0},
};

/* Every config, at 1/2/3 threads, on every ISA, in every run mode (with
 * TG_TEST_SHORT a few of these per config, each taken across the configs:
 * attn_runs_of). */
static void test_bwd_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1);
  enum { N_CONFIGS = sizeof configs / sizeof configs[0] };
  int failures = 0;
  for (int ci = 0; ci < N_CONFIGS; ci++) {
    attn_problem pb;
    attn_build(&pb, &configs[ci], &suite, &r);
    attn_outputs o = attn_alloc_outputs(&pb);
    attn_runs runs = attn_runs_of(ci, N_CONFIGS);
    for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;) {
      TU_EXPECT_STATUS(run->ctx, run_bwd(run->ctx, &pb, &o), TG_OK);
      if (!attn_check_grads(&pb, o.dQ, o.dK, o.dV)) {
        printf("  ^ in %s %s\n", pb.c.name, run->what);
        failures++;
      }
    }
    attn_free_outputs(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d configuration runs out of bound", failures);
}

/* One context for every config, forwards then backwards: the dQ partial
 * workspace it keeps holds the previous call's rows, which must never leak
 * into a later result. */
static void test_bwd_reused_context(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  enum { N = sizeof configs / sizeof configs[0] };
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  int failures = 0;
  for (int i = 0; i < 2 * N; i++) {
    attn_problem pb;
    attn_build(&pb, &configs[i < N ? i : 2 * N - 1 - i], &suite, &r);
    attn_outputs o = attn_alloc_outputs(&pb);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
    if (!attn_check_grads(&pb, o.dQ, o.dK, o.dV)) {
      printf("  ^ in %s, call %d on one context\n", pb.c.name, i);
      failures++;
    }
    attn_free_outputs(&o);
    attn_destroy(&pb);
  }
  tg_ctx_destroy(ctx);
  if (failures) TU_FAIL("%d calls on a reused context out of bound", failures);
}

/* Random configurations: fresh shapes and features every run. */
static void test_bwd_random_configs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 2);
  int failures = 0;
  for (int it = 0; it < 6; it++) {
    const attn_cfg c = attn_random_cfg(&r, &(attn_cfg_limits){.long_lo = 400, .long_hi = 700});
    attn_problem pb;
    attn_build(&pb, &c, &suite, &r);
    attn_outputs o = attn_alloc_outputs(&pb);
    const int threads = tu_int(&r, 1, 3);
    const attn_run_mode *mode = &attn_modes[tu_int(&r, 0, ATTN_N_MODES - 1)];
    tg_ctx *ctx = attn_mode_ctx(threads, TG_ISA_AUTO, mode);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
    if (!attn_check_grads(&pb, o.dQ, o.dK, o.dV)) {
      char what[200];
      attn_cfg_str(&c, what, sizeof what);
      printf("  ^ in %s %s\n", what, mode->name);
      failures++;
    }
    tg_ctx_destroy(ctx);
    attn_free_outputs(&o);
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d random configurations out of bound", failures);
}

/* Fully masked rows (L = -inf) give exactly zero dQ and no dK/dV change. */
static void test_bwd_fully_masked_rows_are_zero(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  const attn_cfg c = {"all masked", 1, 2, 1, 20, 10, 16, 1, -30, /* i + qL_off < 0 */
                      0, ATTN_HEAD_MAJOR, 1.0f, 0};
  attn_problem pb;
  attn_build(&pb, &c, &suite, &r);
  attn_outputs o = attn_alloc_outputs(&pb);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
  for (int64_t e = 0; e < pb.nQ; e++) assert_true(o.dQ[e] == 0.0f);
  assert_memory_equal(o.dK, pb.dK0, sizeof(float) * pb.nKout);
  assert_memory_equal(o.dV, pb.dV0, sizeof(float) * pb.nKout);
  tg_ctx_destroy(ctx);
  attn_free_outputs(&o);
  attn_destroy(&pb);
}

/* dQ, dK, dV of two runs are the same bits. */
static void assert_same_grads(const attn_problem *pb, const attn_outputs *a,
                              const attn_outputs *b) {
  assert_memory_equal(b->dQ, a->dQ, sizeof(float) * pb->nQ);
  assert_memory_equal(b->dK, a->dK, sizeof(float) * pb->nKout);
  assert_memory_equal(b->dV, a->dV, sizeof(float) * pb->nKout);
}

/* Deterministic mode: bitwise identical across runs and 1/2/3/5 threads
 * (9 key tiles: two key ranges, so the dQ partial sum is covered). */
static void test_bwd_deterministic_bitwise(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 4);
  const attn_cfg c = {"det", 2, 4, 2, 150, 530, 64, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0};
  attn_problem pb;
  attn_build(&pb, &c, &suite, &r);
  attn_outputs first = attn_alloc_outputs(&pb), o = attn_alloc_outputs(&pb);
  const int threads[] = {1, 2, 3, 5, 2};
  for (int ti = 0; ti < 5; ti++) {
    tg_ctx *ctx = tu_ctx(threads[ti], TG_ISA_AUTO);
    tg_ctx_set_deterministic(ctx, 1);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, ti ? &o : &first), TG_OK);
    if (ti) assert_same_grads(&pb, &first, &o);
    tg_ctx_destroy(ctx);
  }
  attn_free_outputs(&first);
  attn_free_outputs(&o);
  attn_destroy(&pb);
}

/* The KV schedule's plan (tg_plan_cpus): work planned for 1 CPU (one key
 * range), 16 (9 key tiles: two ranges), 64 and this machine's count is
 * within the reference bound and bitwise the same at 1 and 3 threads. A
 * small problem: the plan, not the size, is under test. */
static void test_bwd_plan_cpus(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 10);
  const attn_cfg c = {"plan", 1, 2, 1, 40, 530, 16, 1, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0};
  attn_problem pb;
  attn_build(&pb, &c, &suite, &r);
  attn_outputs first = attn_alloc_outputs(&pb), o = attn_alloc_outputs(&pb);
  const int plans[] = {1, TU_PLAN_CPUS, 64, 0}; /* 0: the machine's */
  for (int pi = 0; pi < 4; pi++) {
    tg_testing_plan_cpus(plans[pi]);
    for (int ti = 0; ti < 2; ti++) {
      tg_ctx *ctx = tu_ctx(ti ? 3 : 1, TG_ISA_AUTO);
      tg_ctx_set_deterministic(ctx, 1);
      TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, ti ? &o : &first), TG_OK);
      if (!ti && !attn_check_grads(&pb, first.dQ, first.dK, first.dV))
        TU_FAIL("result out of bound, planned for %d CPUs", plans[pi]);
      if (ti) assert_same_grads(&pb, &first, &o);
      tg_ctx_destroy(ctx);
    }
  }
  tu_plan_fixed();
  assert_true(tg_plan_cpus() == TU_PLAN_CPUS);
  tg_testing_plan_cpus(0);
  const int machine = tg_plan_cpus();
  assert_true(machine >= 1 && machine == tg_plan_cpus());
  tu_plan_fixed();
  attn_free_outputs(&first);
  attn_free_outputs(&o);
  attn_destroy(&pb);
}

/* --- bad input: status + message, nothing written ------------------------- */
static void test_bwd_bad_input_writes_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 5);
  const attn_cfg c = {"bad", 1, 2, 1, 33, 17, 16, 0, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0};
  attn_problem pb;
  attn_build(&pb, &c, &suite, &r);
  attn_outputs o = attn_alloc_outputs(&pb);
  tu_fill_f32(&r, o.dQ, pb.nQ, -1, 1);
  tu_fill_f32(&r, o.dK, pb.nKout, -1, 1);
  tu_fill_f32(&r, o.dV, pb.nKout, -1, 1);
  float *sQ = tu_alloc(sizeof(float) * pb.nQ), *sK = tu_alloc(sizeof(float) * pb.nKout);
  float *sV = tu_alloc(sizeof(float) * pb.nKout);
  memcpy(sQ, o.dQ, sizeof(float) * pb.nQ);
  memcpy(sK, o.dK, sizeof(float) * pb.nKout);
  memcpy(sV, o.dV, sizeof(float) * pb.nKout);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);

#define CALL(P, MP, M)                                                                  \
  tg_flash_attn_train_bwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, pb.L, pb.dOb, pb.Dv, o.dQ, o.dK,    \
                               o.dV, P, MP, M, 0)
  assert_int_equal(tg_flash_attn_train_bwd_bf16(NULL, pb.Qb, pb.Kb, pb.Vb, pb.L, pb.dOb, pb.Dv,
                                                o.dQ, o.dK, o.dV, &pb.p, &pb.mp, pb.maskb, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(NULL, &pb.mp, pb.maskb), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(&pb.p, NULL, pb.maskb), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(&pb.p, &pb.mp, NULL), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_bf16(ctx, pb.Qb, NULL, pb.Vb, pb.L, pb.dOb, pb.Dv,
                                                o.dQ, o.dK, o.dV, &pb.p, NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, pb.L, pb.dOb, pb.Dv,
                                                o.dQ, o.dK, NULL, &pb.p, NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  /* Each case: a copy of the params with one field broken. */
  tg_attn_params q;
  tg_attn_mask_params mq;
#define EXPECT_PARAMS(edit, status)                                                     \
  do {                                                                                  \
    q = pb.p;                                                                           \
    mq = pb.mp;                                                                         \
    edit;                                                                               \
    TU_EXPECT_STATUS(ctx, CALL(&q, &mq, pb.maskb), status);                              \
  } while (0)
  EXPECT_PARAMS(q.B = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.qL = -1, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.kL = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.gqa_factor = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.gqa_factor = 3, TG_ERR_BAD_SHAPE); /* H = 2 */
  EXPECT_PARAMS(q.D = 12, TG_ERR_UNSUPPORTED);
  EXPECT_PARAMS(q.D = 520, TG_ERR_UNSUPPORTED);
  EXPECT_PARAMS(q.NQ += 1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NK = 1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NQ_aligned = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NK_aligned = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.qL_rem = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.kL_rem = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.scale = NAN, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.scale = INFINITY, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.softcapping = 0.0f, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.softcapping = -2.0f, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.Q_strides[1] = -1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.V_strides[2] = INT64_MAX / 4, TG_ERR_OVERFLOW);
  EXPECT_PARAMS(q.O_strides[2] = INT64_MAX / 16, TG_ERR_OVERFLOW);
  EXPECT_PARAMS(mq.M_strides[2] = -5, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(mq.M_strides[2] = INT64_MAX / 2, TG_ERR_OVERFLOW);
#undef EXPECT_PARAMS
#undef CALL
  assert_memory_equal(o.dQ, sQ, sizeof(float) * pb.nQ);
  assert_memory_equal(o.dK, sK, sizeof(float) * pb.nKout);
  assert_memory_equal(o.dV, sV, sizeof(float) * pb.nKout);
  tg_ctx_destroy(ctx);
  free(sQ), free(sK), free(sV);
  attn_free_outputs(&o);
  attn_destroy(&pb);
}

/* --- training forward ------------------------------------------------------ */
/* Runs the forward with O (through O_strides) and L poisoned; checks both. */
static int check_forward(tg_ctx *ctx, const attn_problem *pb, const char *what) {
  const tg_attn_params *p = &pb->p;
  const int64_t B = p->B, H = p->H, qL = p->qL, D = p->D;
  tg_bf16 *O = tu_alloc(2 * pb->nQ); /* strided: [B,qL,H,D] */
  float *L = tu_alloc(sizeof(float) * pb->nL), *Of = tu_alloc(sizeof(float) * pb->nQ);
  for (int64_t e = 0; e < pb->nQ; e++) O[e] = 0xFFFF; /* bf16 NaN */
  tu_poison_f32(L, pb->nL);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_fwd_bf16(ctx, pb->Qb, pb->Kb, pb->Vb, O, L, p,
                                                pb->maskb ? &pb->mp : NULL, pb->maskb,
                                                pb->c.causal),
                   TG_OK);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < qL; i++)
        for (int64_t d = 0; d < D; d++)
          Of[((b * H + h) * qL + i) * D + d] =
              tg_bf16_to_f32(O[attn_off3(p->O_strides, b, h, i) + d]);
  int ok = tu_check_bound("O", Of, pb->Or, pb->Oe, pb->nQ);
  ok &= attn_check_L(pb, L);
  if (!ok) printf("  ^ forward, %s\n", what);
  free(O), free(L), free(Of);
  return ok;
}

static void test_fwd_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 8);
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  int failures = 0;
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    attn_problem pb;
    attn_build(&pb, &configs[ci], &suite, &r);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        char what[160];
        snprintf(what, sizeof what, "%s [%s, %d threads]", pb.c.name, tg_isa_name(isas[ii]),
                 tu_thread_counts[ti]);
        failures += !check_forward(ctx, &pb, what);
        tg_ctx_destroy(ctx);
      }
    attn_destroy(&pb);
  }
  if (failures) TU_FAIL("%d forward runs out of bound", failures);
}

static void test_fwd_bad_input_writes_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 9);
  const attn_cfg c = {"bad fwd", 1, 2, 1, 20, 17, 16, 0, 0, 1, ATTN_HEAD_MAJOR, 1.0f, 0};
  attn_problem pb;
  attn_build(&pb, &c, &suite, &r);
  tg_bf16 *O = tu_alloc(2 * pb.nQ);
  float *L = tu_alloc(sizeof(float) * pb.nL);
  memset(O, 0x5A, 2 * pb.nQ);
  memset(L, 0x5A, sizeof(float) * pb.nL);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  tg_attn_params q = pb.p;
  q.D = 20;
  assert_int_equal(tg_flash_attn_train_fwd_bf16(NULL, pb.Qb, pb.Kb, pb.Vb, O, L, &pb.p, NULL,
                                                NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, NULL, L, &pb.p,
                                                     NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, O, NULL, &pb.p,
                                                     NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, O, L, &pb.p,
                                                     &pb.mp, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, O, L, &q, NULL,
                                                     NULL, 0),
                   TG_ERR_UNSUPPORTED);
  q = pb.p;
  q.kL_rem = 0;
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Qb, pb.Kb, pb.Vb, O, L, &q, NULL,
                                                     NULL, 0),
                   TG_ERR_BAD_PARAMS);
  for (int64_t e = 0; e < pb.nQ; e++) assert_int_equal(O[e], 0x5A5A);
  for (int64_t e = 0; e < pb.nL; e++) {
    uint32_t u;
    memcpy(&u, &L[e], 4);
    assert_int_equal(u, 0x5A5A5A5Au);
  }
  tg_ctx_destroy(ctx);
  free(O), free(L);
  attn_destroy(&pb);
}

/* --- kernel 1: D = rowsum(O * dO) ----------------------------------------------- */
static void test_compute_d(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 6);
  const int shapes[][4] = {{1, 1, 1, 8}, {2, 3, 37, 24}, {1, 4, 300, 64}, {1, 1, 5, 512},
                           {1, 2, 3, 7}};
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int64_t rows = (int64_t)shapes[si][0] * shapes[si][1] * shapes[si][2];
    const int64_t D = shapes[si][3];
    tg_bf16 *O = tu_alloc(2 * rows * D), *dO = tu_alloc(2 * rows * D);
    tu_fill_bf16(&r, O, rows * D, -3, 3);
    tu_fill_bf16(&r, dO, rows * D, -3, 3);
    double *want = tu_alloc(sizeof(double) * rows), *bound = tu_alloc(sizeof(double) * rows);
    ref_compute_d(O, dO, rows, D, want, bound); /* gamma(D) sum |O dO| */
    float *got = tu_alloc(sizeof(float) * rows);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tu_poison_f32(got, rows);
        TU_EXPECT_STATUS(ctx,
                         tg_flash_attn_train_bwd_compute_d_bf16(
                             ctx, O, dO, got, shapes[si][0], shapes[si][1], shapes[si][2],
                             shapes[si][3]),
                         TG_OK);
        if (!tu_check_bound("D_out", got, want, bound, rows))
          TU_FAIL("compute_d shape %zu, %s, %d threads", si, tg_isa_name(isas[ii]),
                  tu_thread_counts[ti]);
        tg_ctx_destroy(ctx);
      }
    free(O), free(dO), free(want), free(bound), free(got);
  }
}

static void test_compute_d_bad_input(void **state) {
  tg_bf16 O[16] = {0}, dO[16] = {0};
  float out[2] = {7, 7};
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  assert_int_equal(tg_flash_attn_train_bwd_compute_d_bf16(NULL, O, dO, out, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, NULL, dO, out, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, NULL, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, 0, 1, 2, 8),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, 1, 1, 2, 0),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, UINT32_MAX,
                                                          UINT32_MAX, UINT32_MAX, 8),
                   TG_ERR_OVERFLOW);
  /* a zero dim is BAD_SHAPE even where the other dims' product overflows */
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, UINT32_MAX,
                                                          UINT32_MAX, UINT32_MAX, 0),
                   TG_ERR_BAD_SHAPE);
  assert_true(out[0] == 7 && out[1] == 7);
  tg_ctx_destroy(ctx);
}

/* --- kernel 3: f32 -> bf16 (against ref_bf16, tests/common/refs.c) ---------------- */
static void test_cast(void **state) {
  const uint32_t specials[] = {
      0x00000000, 0x80000000, 0x3F800000, 0x3F808000 /* tie -> even */, 0x3F818000,
      0x3F80C000, 0x3F807FFF, 0x7F7FFFFF /* max -> inf */, 0x7F7F7FFF, 0x7F800000,
      0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001 /* sNaN */, 0x00000001 /* denormal */,
      0x00008000, 0x00018000, 0x807FFFFF, 0x3EAAAAAB};
  const size_t ns = sizeof specials / sizeof specials[0];
  const int64_t n = 200003; /* several chunks and a ragged tail */
  float *src = tu_alloc(sizeof(float) * n);
  tg_bf16 *dst = tu_alloc(2 * n);
  tu_rng r = tu_rng_make(tu_seed() + 7);
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = i < (int64_t)ns ? specials[i] : (uint32_t)tu_next(&r);
    memcpy(&src[i], &u, 4);
  }
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int ii = 0; ii < nisa; ii++)
    for (int ti = 0; ti < tu_n_thread_counts; ti++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      memset(dst, 0xAB, 2 * n);
      TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, (uint64_t)n), TG_OK);
      for (int64_t i = 0; i < n; i++)
        if (dst[i] != ref_bf16(src[i]))
          TU_FAIL("cast[%lld] of %a (0x%08x): got 0x%04x want 0x%04x (%s)", (long long)i,
                  (double)src[i], (unsigned)((uint32_t *)src)[i], dst[i], ref_bf16(src[i]),
                  tg_isa_name(isas[ii]));
      tg_ctx_destroy(ctx);
    }
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  memset(dst, 0xAB, 4);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, NULL, dst, 2), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, NULL, 2), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, 0), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, UINT64_MAX / 2), TG_ERR_OVERFLOW);
  assert_int_equal(tg_f32_to_bf16_cast(NULL, src, dst, 2), TG_ERR_NULL_ARG);
  assert_true(dst[0] == 0xABAB && dst[1] == 0xABAB);
  tg_ctx_destroy(ctx);
  free(src), free(dst);
}

/* --- params ABI and context ------------------------------------------------------ */
static void test_params_init_and_ctx(void **state) {
  tg_attn_params p;
  assert_int_equal(sizeof p, 160);
  assert_int_equal(tg_attn_params_init(&p, 2, 8, 2, 100, 130, 64, 0.125f), TG_OK);
  assert_int_equal(p.gqa_factor, 4);
  assert_int_equal(p.NQ, 4);
  assert_int_equal(p.NQ_aligned, 3);
  assert_int_equal(p.qL_rem, 4);
  assert_int_equal(p.NK, 9);
  assert_int_equal(p.NK_aligned, 8);
  assert_int_equal(p.kL_rem, 2);
  assert_int_equal(p.qL_off, 30);
  assert_true(p.softcapping == 1.0f);
  assert_int_equal(p.Q_strides[0], 8 * 100 * 64);
  assert_int_equal(p.K_strides[1], 130 * 64);
  assert_int_equal(p.O_strides[2], 64);
  assert_int_equal(tg_attn_params_init(NULL, 1, 1, 1, 1, 1, 8, 1), TG_ERR_NULL_ARG);
  assert_int_equal(tg_attn_params_init(&p, 1, 3, 2, 1, 1, 8, 1), TG_ERR_BAD_SHAPE);
  assert_int_equal(tg_attn_params_init(&p, 1, 1, 1, 0, 1, 8, 1), TG_ERR_BAD_SHAPE);
  /* tiling of a length near INT32_MAX (computed in int64), and batch strides
   * heads * L * D beyond int64 (refused before *p is written) */
  assert_int_equal(tg_attn_params_init(&p, 1, 1, 1, INT32_MAX, 1, 8, 1), TG_OK);
  assert_int_equal(p.NQ, (INT32_MAX / 32) + 1);
  assert_int_equal(p.qL_rem, INT32_MAX % 32);
  const tg_attn_params before = p;
  assert_int_equal(tg_attn_params_init(&p, 1, 1 << 30, 1, 1 << 30, 1, 1 << 30, 1),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(&p, &before, sizeof p);

  tg_ctx *ctx;
  assert_int_equal(tg_ctx_create(&ctx), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  TU_EXPECT_STATUS(ctx, tg_ctx_set_threads(ctx, -1), TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_threads(ctx, 3), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  assert_int_equal(tg_ctx_set_threads(NULL, 1), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_KV);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, (tg_attn_schedule)7), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_KV);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_ATOMIC);
  assert_int_equal(tg_ctx_set_attn_schedule(NULL, TG_ATTN_SCHEDULE_KV), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_create(NULL), TG_ERR_NULL_ARG);
  for (int s = 0; s <= 7; s++) assert_non_null(tg_status_str((tg_status)s));
  tg_ctx_destroy(ctx);
  tg_ctx_destroy(NULL);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_params_init_and_ctx),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_compute_d),
      cmocka_unit_test(test_compute_d_bad_input),
      cmocka_unit_test(test_bwd_against_reference),
      cmocka_unit_test(test_bwd_random_configs),
      cmocka_unit_test(test_bwd_reused_context),
      cmocka_unit_test(test_bwd_fully_masked_rows_are_zero),
      cmocka_unit_test(test_bwd_deterministic_bitwise),
      cmocka_unit_test(test_bwd_plan_cpus),
      cmocka_unit_test(test_bwd_bad_input_writes_nothing),
      cmocka_unit_test(test_fwd_against_reference),
      cmocka_unit_test(test_fwd_bad_input_writes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
