/* tg_transpose_2d: output[c, r] = input[r, c], exact (a copy: compared bit
 * for bit, special values included). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Random values plus the bit patterns a sloppy copy would lose: -0, +-inf,
 * a NaN with payload, subnormals. */
static void fill_special(tu_rng *r, float *x, int64_t n) {
  tu_fill_f32(r, x, n, -1e3, 1e3);
  const uint32_t specials[] = {0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC01234u,
                               0x00000001u, 0x807FFFFFu};
  for (int64_t i = 0; i < n; i++)
    if (tu_next(r) % 16 == 0) {
      uint32_t b = specials[tu_next(r) % 6];
      memcpy(&x[i], &b, sizeof b);
    }
}

static void check_case(uint32_t rows, uint32_t cols, uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t n = (int64_t)rows * cols;
  float *in = tu_alloc(n * sizeof(float));
  float *out = tu_alloc(n * sizeof(float));
  float *want = tu_alloc(n * sizeof(float));
  fill_special(&rng, in, n);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) want[c * rows + r] = in[r * cols + c];

  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      tu_poison_f32(out, n);
      TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, rows, cols), TG_OK);
      if (memcmp(out, want, n * sizeof(float)) != 0) {
        int64_t i = 0;
        while (memcmp(&out[i], &want[i], sizeof(float)) == 0) i++;
        TU_FAIL("transpose %ux%u threads=%d isa=%s: output[%lld] = %g, want %g", rows,
                cols, tu_thread_counts[ti], tg_isa_name(isas[ii]), (long long)i,
                (double)out[i], (double)want[i]);
      }
      tg_ctx_destroy(ctx);
    }
  free(in);
  free(out);
  free(want);
}

static void test_transpose_sizes(void **state) {
  /* 1x1, single row / column, dims off the 32-tile grid, exact tiles, a
   * stripe boundary (cols > 256), tall and thin. */
  const uint32_t sizes[][2] = {{1, 1},   {1, 100}, {100, 1},  {33, 47},  {32, 32},
                               {64, 64}, {31, 33}, {257, 130}, {5, 700}, {1000, 3},
                               {129, 513}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    check_case(sizes[s][0], sizes[s][1], 100 + s);
}

static void test_transpose_bad_input(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  float in[6] = {1, 2, 3, 4, 5, 6}, out[6], snap[6];
  for (int i = 0; i < 6; i++) out[i] = (float)(10 + i);
  memcpy(snap, out, sizeof out);

  assert_int_equal(tg_transpose_2d(NULL, in, out, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, NULL, out, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, NULL, 2, 3), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, 0, 3), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, 2, 0), TG_ERR_BAD_SHAPE);
  /* (2^32-1)^2 * 4 bytes overflows int64: refused before any access. */
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, 0xFFFFFFFFu, 0xFFFFFFFFu),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(out, snap, sizeof out);

  /* and the same context still works afterwards, clearing the message */
  TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, in, out, 2, 3), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  const float want[6] = {1, 4, 2, 5, 3, 6};
  assert_memory_equal(out, want, sizeof want);
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transpose_sizes),
      cmocka_unit_test(test_transpose_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
