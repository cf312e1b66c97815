/* Cross-entropy forward + backward. Per non-pad position t, target y:
 *   m = max_j l_j, d_j = l_j - m, e_j = exp(d_j), S = sum_j e_j,
 *   loss_t = log S - d_y,  grad[t,j] = (e_j / S - [j == y]) / count  (writes)
 *   loss_out[0] += sum_t loss_t / count                           (accumulates)
 * pad positions: grad row 0 (exactly).
 *
 * Reference: f64 from those formulas (not from kernel code; tests/common/
 * refs.c, shared with tests/test_nan_inputs.c), with a running error bound
 * per element (u = 2^-24):
 *   - inputs exact; max is exact;
 *   - an f32 op on values within e of the exact v rounds once: e' = (propagated
 *     e) + u*(|v| + e) + 2^-150 (subnormal underflow);
 *   - expf / logf are taken to be within 1 ulp (glibc documents <= 1 ulp for
 *     both), i.e. 2u relative, plus 2^-149 absolute for subnormal results
 *     (the kernel's own vector exp, isa/common/row_ops.c, is measured
 *     within 1.04 ulp: the excess is far inside the (n - 1) u of the row sum
 *     for any row of 2 or more logits, and exp(0) = 1 is exact);
 *     propagation through exp: exp(v)*expm1(e); through log: -log1p(-e/v);
 *   - products propagate |a| eb + |b| ea + ea eb, quotients (ea + |q| eb) /
 *     (|b| - eb);
 *   - a sum of n terms in ANY order is within sum e_i + gamma_{n-1} *
 *     sum(|v_i| + e_i), gamma_k = k u / (1 - k u). The loss is modelled as an
 *     f32 sum of prefill and the terms loss_t / count (the kernel sums in f64,
 *     which is more accurate and stays within this bound).
 * The bound holds for any evaluation order, so it is used as is (no fudge
 * factor); the f64 reference's own error is ~2^-29 of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"

static const double U = 0x1p-24;

enum { FILL_PLAIN, FILL_HUGE, FILL_NEGINF, FILL_NEGINF_TARGET };

/* One random case at every thread count x ISA x deterministic flag. */
static void check_case(uint32_t n_pos, uint32_t V, int fill, uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t n = (int64_t)n_pos * V;
  float *logits = tu_alloc(n * sizeof(float)), *grad = tu_alloc(n * sizeof(float));
  uint32_t *targets = tu_alloc(n_pos * sizeof(uint32_t));
  double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));

  /* pad_id: a valid class id (pads collide with real targets) or out of range */
  const uint32_t pad_id = tu_int(&rng, 0, 1) ? (uint32_t)tu_int(&rng, 0, (int)V - 1)
                                             : 0xFFFFFFFFu;
  uint32_t nonpad = 0;
  for (uint32_t t = 0; t < n_pos; t++) {
    float *l = logits + (int64_t)t * V;
    const double spread = tu_int(&rng, 0, 1) ? 3.0 : 30.0;
    tu_fill_f32(&rng, l, V, -spread, spread);
    uint32_t y = (uint32_t)tu_int(&rng, 0, (int)V - 1);
    if (tu_int(&rng, 0, 3) == 0) y = pad_id;
    if (y != pad_id) nonpad++;
    targets[t] = y;
    for (int64_t j = 0; j < V; j++) {
      const int r = tu_int(&rng, 0, 9);
      if (fill == FILL_HUGE && r < 4) l[j] = r < 2 ? 1e30f : -1e30f;
      if ((fill == FILL_NEGINF || fill == FILL_NEGINF_TARGET) && r < 3 && j != y)
        l[j] = -INFINITY;
    }
    if (fill == FILL_NEGINF_TARGET && y != pad_id && V > 1 && tu_int(&rng, 0, 1))
      l[y] = -INFINITY;
  }
  /* count is the caller's; it may exceed the non-pad positions of this call */
  uint32_t count = nonpad + (uint32_t)tu_int(&rng, 0, 2);
  if (count == 0) count = 1;

  const float prefill = (float)tu_uniform(&rng, 0.5, 3.0);
  double lw, lw_e; /* a -inf target makes it +inf */
  ref_cross_entropy(logits, targets, n_pos, V, pad_id, count, prefill, want, bound, &lw, &lw_e);

  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++)
      for (int det = 0; det <= 1; det++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
        tu_poison_f32(grad, n);
        float got = prefill;
        TU_EXPECT_STATUS(ctx,
                         tg_cross_entropy_fwd_bwd(ctx, logits, targets, grad, &got, n_pos,
                                                  V, pad_id, count),
                         TG_OK);
        char what[160];
        snprintf(what, sizeof what, "%ux%u fill=%d pad_id=%u count=%u threads=%d isa=%s det=%d",
                 n_pos, V, fill, pad_id, count, tu_thread_counts[ti],
                 tg_isa_name(isas[ii]), det);
        if (!tu_check_bound("grad", grad, want, bound, n)) TU_FAIL("grad %s", what);
        if (isinf(lw)) {
          if (!(isinf(got) && got > 0)) TU_FAIL("loss %s: got %g, want +inf", what, got);
        } else if (!tu_check_bound("loss", &got, &lw, &lw_e, 1)) {
          TU_FAIL("loss %s", what);
        }
        tg_ctx_destroy(ctx);
      }
  free(logits);
  free(grad);
  free(targets);
  free(want);
  free(bound);
}

static void test_ce_sizes(void **state) {
  /* vocab 1 (loss 0, grad 0), tiny, off the 16-lane grid, many short rows,
   * rows longer than the 8 Ki-element group, a GPT-2 vocab */
  const uint32_t sizes[][2] = {{1, 1},   {3, 1},    {1, 7},    {3, 17},   {7, 300},
                               {200, 100}, {300, 33}, {2, 9000}, {50, 1000}, {6, 50257}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    check_case(sizes[s][0], sizes[s][1], FILL_PLAIN, 100 + s);
}

/* logits +-1e30 mixed with ordinary values (targets land on either) */
static void test_ce_huge_logits(void **state) {
  check_case(1, 2, FILL_HUGE, 200);
  check_case(40, 33, FILL_HUGE, 201);
  check_case(3, 50257, FILL_HUGE, 202);
}

/* -inf non-target entries (their grad is 0, the rest is unaffected) */
static void test_ce_neginf_entries(void **state) {
  check_case(40, 33, FILL_NEGINF, 300);
  check_case(3, 50257, FILL_NEGINF, 301);
}

/* A -inf target logit: loss +inf (documented), grad finite */
static void test_ce_neginf_target(void **state) {
  check_case(30, 20, FILL_NEGINF_TARGET, 400);
  /* and one explicit row: p = softmax of the rest, target grad -1/count */
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  const float l[4] = {-INFINITY, 0.0f, 0.0f, 0.0f};
  const uint32_t y = 0;
  float g[4], loss = 1.0f;
  TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, &y, g, &loss, 1, 4, 99, 2), TG_OK);
  assert_true(isinf(loss) && loss > 0);
  assert_true(g[0] == -0.5f);
  /* e = 1, S = 3 exactly; the one rounding of 1/S, halved exactly: <= u/6 */
  for (int j = 1; j < 4; j++) assert_true(fabs(g[j] - 1.0 / 6.0) <= U / 6);
  tg_ctx_destroy(ctx);
}

/* A row of only -inf: the grad uses the limit of equal logits (uniform
 * softmax), the loss is +inf (documented in kernels/cross_entropy.c). */
static void test_ce_all_neginf_row(void **state) {
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  float l[2 * 5];
  for (int j = 0; j < 10; j++) l[j] = -INFINITY;
  const uint32_t y[2] = {3, 7}; /* row 1 is pad */
  float g[10], loss = 0.25f;
  TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, y, g, &loss, 2, 5, 7, 4), TG_OK);
  assert_true(isinf(loss) && loss > 0);
  for (int j = 0; j < 5; j++) {
    /* roundings of 1/5 (<= 0.2u) and of p - 1 (<= 0.8u), then /4 exactly */
    const double want = (0.2 - (j == 3)) / 4;
    assert_true(fabs(g[j] - want) <= (j == 3 ? 1.0 : 0.2) * U / 4);
    assert_true(g[5 + j] == 0.0f);
  }
  tg_ctx_destroy(ctx);
}

/* NaN logits are never hidden: they give NaN in that row's grad and in the
 * loss, also when the rest of the row is -inf. */
static void test_ce_nan_logits(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  const float l[2 * 3] = {1.0f, NAN, 2.0f, -INFINITY, NAN, -INFINITY};
  for (int row = 0; row < 2; row++) {
    const uint32_t y = 0;
    float g[3], loss = 0.5f;
    TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l + 3 * row, &y, g, &loss, 1, 3, 9, 1),
                     TG_OK);
    assert_true(isnan(loss));
    for (int j = 0; j < 3; j++) assert_true(isnan(g[j]));
  }
  tg_ctx_destroy(ctx);
}

/* Every position pad: grad all 0 (exactly), loss_out unchanged bit for bit. */
static void test_ce_all_pad(void **state) {
  const uint32_t n_pos = 9, V = 70;
  tu_rng rng = tu_rng_make(tu_seed() + 500);
  float *l = tu_alloc(n_pos * V * sizeof(float)), *g = tu_alloc(n_pos * V * sizeof(float));
  uint32_t t[9];
  tu_fill_f32(&rng, l, n_pos * V, -5, 5);
  for (uint32_t i = 0; i < n_pos; i++) t[i] = 12;
  for (int ti = 0; ti < tu_n_thread_counts; ti++) {
    tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], TG_ISA_PORTABLE);
    tu_poison_f32(g, n_pos * V);
    float loss = 1.75f;
    TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, t, g, &loss, n_pos, V, 12, 3),
                     TG_OK);
    assert_true(loss == 1.75f);
    for (uint32_t i = 0; i < n_pos * V; i++)
      if (g[i] != 0.0f) TU_FAIL("grad[%u] = %g on an all-pad input", i, (double)g[i]);
    tg_ctx_destroy(ctx);
  }
  free(l);
  free(g);
}

/* count == 0: TG_OK and nothing written (targets are not read, so even an
 * out-of-range one is not reported -- the seed's early return). */
static void test_ce_count_zero(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  float l[6] = {1, 2, 3, 4, 5, 6}, g[6], snap[6], loss = 0.5f;
  const uint32_t t[2] = {1, 1000};
  tu_poison_f32(g, 6);
  g[2] = 7.0f;
  memcpy(snap, g, sizeof g);
  TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, t, g, &loss, 2, 3, 0, 0), TG_OK);
  assert_memory_equal(g, snap, sizeof g);
  assert_true(loss == 0.5f);
  tg_ctx_destroy(ctx);
}

/* loss_out and grad bitwise identical across thread counts 1, 2, 3, 5 and
 * repeated runs, in deterministic mode (and, as documented, also without),
 * for each ISA (the vector exp of the ISA layer may round differently
 * between ISAs). */
static void test_ce_deterministic(void **state) {
  const uint32_t sizes[][2] = {{500, 200}, {12, 50257}, {3000, 5}};
  const int threads[] = {1, 2, 3, 5, 5};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const uint32_t n_pos = sizes[s][0], V = sizes[s][1];
    const int64_t n = (int64_t)n_pos * V;
    tu_rng rng = tu_rng_make(tu_seed() + 600 + s);
    float *l = tu_alloc(n * sizeof(float)), *g = tu_alloc(n * sizeof(float));
    float *g0 = tu_alloc(n * sizeof(float));
    uint32_t *t = tu_alloc(n_pos * sizeof(uint32_t));
    tu_fill_f32(&rng, l, n, -10, 10);
    for (uint32_t i = 0; i < n_pos; i++) t[i] = (uint32_t)tu_int(&rng, 0, (int)V - 1);
    const float prefill = (float)tu_uniform(&rng, 0.5, 3);
    float loss0 = 0;
    for (int ii = 0; ii < n_isas; ii++)
      for (int det = 1; det >= 0; det--)
        for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
          tg_ctx *ctx = tu_ctx(threads[k], isas[ii]);
          assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
          float loss = prefill;
          TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, t, g, &loss, n_pos, V, V,
                                                         n_pos),
                           TG_OK);
          if (det == 1 && k == 0) { /* first run of this ISA */
            loss0 = loss;
            memcpy(g0, g, n * sizeof(float));
          } else if (memcmp(&loss, &loss0, sizeof loss) || memcmp(g, g0, n * sizeof(float))) {
            TU_FAIL("%ux%u det=%d threads=%d isa=%s: %s differs bitwise (loss %.9g vs %.9g)",
                    n_pos, V, det, threads[k], tg_isa_name(isas[ii]),
                    memcmp(&loss, &loss0, sizeof loss) ? "loss" : "grad", (double)loss,
                    (double)loss0);
          }
          tg_ctx_destroy(ctx);
        }
    free(l);
    free(g);
    free(g0);
    free(t);
  }
}

/* Bad input: right status, a message, grad and loss_out byte-identical. */
static float b_grad[12], b_snap[12], b_loss, b_loss_snap;
static void snapshot(void) {
  memcpy(b_snap, b_grad, sizeof b_grad);
  b_loss_snap = b_loss;
}
static void expect_unchanged(const char *call) {
  if (memcmp(b_snap, b_grad, sizeof b_grad) || memcmp(&b_loss_snap, &b_loss, sizeof b_loss))
    TU_FAIL("%s changed an output on failure", call);
}
#define EXPECT_FAIL(ctx, call, status)  \
  do {                                  \
    snapshot();                         \
    TU_EXPECT_STATUS(ctx, call, status); \
    expect_unchanged(#call);            \
  } while (0)

static void test_ce_bad_input(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  float l[12];
  tu_fill_f32(&rng, l, 12, -2, 2);
  tu_fill_f32(&rng, b_grad, 12, 1, 2);
  b_loss = 0.75f;
  const uint32_t ok[3] = {0, 3, 1};
  const uint32_t bad_last[3] = {0, 1, 4};          /* == vocab, last position */
  const uint32_t bad_first[3] = {0xFFFFFFFFu, 1, 2}; /* far out of range */
  const uint32_t M = 0xFFFFFFFFu, H = 0x80000000u;
  for (int det = 0; det <= 1; det++) {
    tg_ctx *ctx = tu_ctx(3, TG_ISA_PORTABLE);
    assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
    snapshot();
    assert_int_equal(tg_cross_entropy_fwd_bwd(NULL, l, ok, b_grad, &b_loss, 3, 4, 9, 3),
                     TG_ERR_NULL_ARG);
    expect_unchanged("NULL ctx");
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, NULL, ok, b_grad, &b_loss, 3, 4, 9, 3),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, NULL, b_grad, &b_loss, 3, 4, 9, 3),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, NULL, &b_loss, 3, 4, 9, 3),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, b_grad, NULL, 3, 4, 9, 3),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, b_grad, &b_loss, 0, 4, 9, 3),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, b_grad, &b_loss, 3, 0, 9, 3),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, b_grad, &b_loss, M, M, 9, 3),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd(ctx, l, ok, b_grad, &b_loss, H, M, 9, 3),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx,
                tg_cross_entropy_fwd_bwd(ctx, l, bad_last, b_grad, &b_loss, 3, 4, 9, 3),
                TG_ERR_BAD_INDEX);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "targets[2]"));
    EXPECT_FAIL(ctx,
                tg_cross_entropy_fwd_bwd(ctx, l, bad_first, b_grad, &b_loss, 3, 4, 9, 3),
                TG_ERR_BAD_INDEX);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "targets[0]"));

    /* an out-of-range id equal to pad_id is a pad, not an error */
    TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, l, bad_last, b_grad, &b_loss, 3, 4,
                                                   4, 2),
                     TG_OK);
    assert_string_equal(tg_ctx_last_error(ctx), "");
    assert_true(tu_all_finite(b_grad, 12) && isfinite(b_loss));
    for (int j = 8; j < 12; j++) assert_true(b_grad[j] == 0.0f);
    tg_ctx_destroy(ctx);
  }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ce_sizes),          cmocka_unit_test(test_ce_huge_logits),
      cmocka_unit_test(test_ce_neginf_entries), cmocka_unit_test(test_ce_neginf_target),
      cmocka_unit_test(test_ce_all_neginf_row), cmocka_unit_test(test_ce_nan_logits),
      cmocka_unit_test(test_ce_all_pad),
      cmocka_unit_test(test_ce_count_zero),     cmocka_unit_test(test_ce_deterministic),
      cmocka_unit_test(test_ce_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
