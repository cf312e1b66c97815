/* Softmax backward: grad_in[b,j] = sm[b,j] * (grad_out[b,j] - sum_i sm[b,i] *
 * grad_out[b,i]) (writes).
 *
 * Reference: f64 from the formula (tests/common/refs.c, shared with
 * tests/test_nan_inputs.c), with a running error bound per element
 * (u = 2^-24): inputs exact; an f32 op on values within e of the exact v
 * rounds once, e' = (propagated e) + u*(|v| + e) + 2^-150; a sum of n terms in
 * ANY order is within sum e_i + gamma_{n-1} * sum(|v_i| + e_i), gamma_k =
 * k u / (1 - k u); products propagate |a| eb + |b| ea + ea eb. Applied to
 * dot = sum sm*go and out = sm * (go - dot), per element in f64. The bound
 * holds for any f32 evaluation order, so it is used as is (no fudge factor);
 * the f64 reference's own error is ~2^-29 of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"

/* sm rows: a real softmax of random logits (positive, sums to ~1) */
static void fill_softmax(tu_rng *r, float *sm, int64_t n, double spread) {
  double *l = tu_alloc(n * sizeof(double)), mx = -INFINITY, s = 0;
  for (int64_t i = 0; i < n; i++) {
    l[i] = tu_uniform(r, -spread, spread);
    mx = l[i] > mx ? l[i] : mx;
  }
  for (int64_t i = 0; i < n; i++) s += exp(l[i] - mx);
  for (int64_t i = 0; i < n; i++) sm[i] = (float)(exp(l[i] - mx) / s);
  free(l);
}

static void check_case(uint32_t rows, uint32_t len, uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t n = (int64_t)rows * len;
  float *sm = tu_alloc(n * sizeof(float)), *go = tu_alloc(n * sizeof(float));
  float *gi = tu_alloc(n * sizeof(float));
  double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
  for (uint32_t b = 0; b < rows; b++) {
    fill_softmax(&rng, sm + (int64_t)b * len, len, tu_int(&rng, 0, 1) ? 1.0 : 8.0);
    tu_fill_f32(&rng, go + (int64_t)b * len, len, -1, 1);
  }
  ref_softmax_backward(sm, go, rows, len, want, bound);
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      tu_poison_f32(gi, n);
      TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, gi, rows, len), TG_OK);
      if (!tu_check_bound("grad_in", gi, want, bound, n))
        TU_FAIL("softmax_backward %ux%u threads=%d isa=%s", rows, len,
                tu_thread_counts[ti], tg_isa_name(isas[ii]));
      tg_ctx_destroy(ctx);
    }
  free(sm);
  free(go);
  free(gi);
  free(want);
  free(bound);
}

static void test_softmax_sizes(void **state) {
  /* 1x1 (grad 0 up to rounding), lengths off the 16-lane grid, many short
   * rows (row blocks), a row longer than the 8 Ki-element group, vocab-sized */
  const uint32_t sizes[][2] = {{1, 1},  {1, 15}, {3, 17},   {7, 300},  {300, 33},
                               {2, 16}, {500, 5}, {3, 9000}, {4, 50257}, {129, 257}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    check_case(sizes[s][0], sizes[s][1], 100 + s);
}

/* Results never depend on the thread count (per-row work only). */
static void test_softmax_thread_invariance(void **state) {
  const uint32_t rows = 37, len = 1001;
  const int64_t n = (int64_t)rows * len;
  tu_rng rng = tu_rng_make(tu_seed() + 300);
  float *sm = tu_alloc(n * sizeof(float)), *go = tu_alloc(n * sizeof(float));
  float *gi = tu_alloc(n * sizeof(float)), *gi0 = tu_alloc(n * sizeof(float));
  for (uint32_t b = 0; b < rows; b++) fill_softmax(&rng, sm + (int64_t)b * len, len, 4.0);
  tu_fill_f32(&rng, go, n, -1, 1);
  const int threads[] = {1, 2, 3, 5};
  for (int t = 0; t < 4; t++) {
    tg_ctx *ctx = tu_ctx(threads[t], TG_ISA_PORTABLE);
    assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
    TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, t ? gi : gi0, rows, len), TG_OK);
    if (t && memcmp(gi, gi0, n * sizeof(float)))
      TU_FAIL("threads=%d differs bitwise from threads=1", threads[t]);
    tg_ctx_destroy(ctx);
  }
  free(sm);
  free(go);
  free(gi);
  free(gi0);
}

static void test_softmax_bad_input(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  float sm[6] = {0.2f, 0.3f, 0.5f, 0.1f, 0.1f, 0.8f}, go[6] = {1, 2, 3, 4, 5, 6};
  float out[6], snap[6];
  for (int i = 0; i < 6; i++) out[i] = (float)(10 + i);
  memcpy(snap, out, sizeof out);
  const uint32_t M = 0xFFFFFFFFu, H = 0x80000000u;

  assert_int_equal(tg_softmax_backward(NULL, sm, go, out, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, NULL, go, out, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, NULL, out, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, NULL, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, out, 0, 3), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, out, 2, 0), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, out, M, M), TG_ERR_OVERFLOW);
  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, out, M, H), TG_ERR_OVERFLOW);
  assert_memory_equal(out, snap, sizeof out);

  TU_EXPECT_STATUS(ctx, tg_softmax_backward(ctx, sm, go, out, 2, 3), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  assert_true(tu_all_finite(out, 6));
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax_sizes),
      cmocka_unit_test(test_softmax_thread_invariance),
      cmocka_unit_test(test_softmax_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
