/*
 * The ISA layer's inner loops, each table (portable always; AVX-512 where the
 * CPU has it) against f64 references.
 *
 * Tolerances: GEMMs |err| <= (K + 2) u sum_k |a b| (any summation order);
 * exp within 2 ulp of the correctly rounded result (the bound the attention
 * tests assume); conversions exact; the attention row ops within the
 * roundings of their 2-3 operations (3 u relative to the magnitudes).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "micro.h"
#include "testutil.h"

static const double U = 0x1.0p-24;

static int n_tables(const tg_micro_ops *out[2]) {
  tg_isa isas[4];
  const int n = tu_isas(isas);
  out[0] = &tg_micro_portable;
#ifdef TG_HAVE_AVX512
  if (n > 1) out[1] = &tg_micro_avx512;
  return n;
#else
  (void)n;
  return 1;
#endif
}

/* C = A.B and C += A^T.B on ragged sizes (edges of the 8 x 32 blocks). */
static void test_gemms(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 11);
  const tg_micro_ops *tabs[2];
  const int nt = n_tables(tabs);
  const int sizes[][3] = {{1, 1, 1}, {4, 32, 8}, {5, 33, 7}, {64, 64, 128}, {3, 70, 64},
                          {64, 136, 64}, {13, 8, 300}, {17, 65, 9}};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    const int M = sizes[si][0], N = sizes[si][1], K = sizes[si][2];
    const int64_t lda = K + 3, ldat = M + 5, ldb = N + 2, ldc = N + 1;
    float *A = tu_alloc(sizeof(float) * M * lda), *At = tu_alloc(sizeof(float) * K * ldat);
    float *B = tu_alloc(sizeof(float) * K * ldb), *C = tu_alloc(sizeof(float) * M * ldc);
    float *C0 = tu_alloc(sizeof(float) * M * ldc);
    tu_fill_f32(&r, A, M * lda, -1, 1);
    tu_fill_f32(&r, At, K * ldat, -1, 1);
    tu_fill_f32(&r, B, K * ldb, -1, 1);
    tu_fill_f32(&r, C0, M * ldc, -1, 1);
    double *want = tu_alloc(sizeof(double) * M * N), *bound = tu_alloc(sizeof(double) * M * N);
    float *got = tu_alloc(sizeof(float) * M * N);
    for (int t = 0; t < nt; t++)
      for (int mode = 0; mode < 3; mode++) { /* nn write, nn accumulate, tn accumulate */
        memcpy(C, C0, sizeof(float) * M * ldc);
        if (mode < 2)
          tabs[t]->mm_nn(M, N, K, A, lda, B, ldb, C, ldc, mode);
        else
          tabs[t]->mm_tn_acc(M, N, K, At, ldat, B, ldb, C, ldc);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double s = mode ? C0[i * ldc + j] : 0, a = fabs(s);
            for (int k = 0; k < K; k++) {
              const double x = (mode < 2 ? A[i * lda + k] : At[k * ldat + i]) *
                               (double)B[k * ldb + j];
              s += x;
              a += fabs(x);
            }
            want[i * N + j] = s;
            bound[i * N + j] = (K + 3) * U * a;
            got[i * N + j] = C[i * ldc + j];
          }
        if (!tu_check_bound("gemm", got, want, bound, (int64_t)M * N))
          TU_FAIL("%s mode %d M=%d N=%d K=%d", tabs[t]->name, mode, M, N, K);
        /* padding between rows is never written */
        for (int i = 0; i < M; i++)
          assert_true(C[i * ldc + N] == C0[i * ldc + N]);
      }
    free(A), free(At), free(B), free(C), free(C0), free(want), free(bound), free(got);
  }
}

static void test_exp(void **state) {
  const tg_micro_ops *tabs[2];
  const int nt = n_tables(tabs);
  const int64_t n = 1 << 18;
  float *x = tu_alloc(sizeof(float) * n), *y = tu_alloc(sizeof(float) * n);
  tu_rng r = tu_rng_make(tu_seed() + 12);
  tu_fill_f32(&r, x, n, -110, 95);
  const float special[] = {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, 88.72283f, 88.7229f,
                           -87.33654f, -103.97f, -104.5f, 1e-30f, -1e-30f};
  memcpy(x, special, sizeof special);
  for (int t = 0; t < nt; t++) {
    tabs[t]->exp_f32(x, y, n);
    for (int64_t i = 0; i < n; i++) {
      const double e = exp((double)x[i]);
      const float want = (float)e; /* correctly rounded (double rounding is harmless here) */
      if (isnan(x[i])) {
        assert_true(isnan(y[i]));
        continue;
      }
      if (isinf(want) || want == 0.0f) {
        /* overflow must give inf; deep underflow 0 or the smallest subnormals */
        if (isinf(want)) assert_true(isinf(y[i]) || y[i] == 3.40282347e38f);
        else assert_true(y[i] <= 0x1p-148f);
        continue;
      }
      const double ulp = e < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(e) - 23);
      if (fabs(y[i] - e) > 2 * ulp)
        TU_FAIL("%s exp(%a) = %a, want %a (%.2f ulp)", tabs[t]->name, (double)x[i],
                (double)y[i], e, fabs(y[i] - e) / ulp);
    }
  }
  free(x), free(y);
}

static void test_conversions_and_dot(void **state) {
  const tg_micro_ops *tabs[2];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 13);
  const int64_t n = 1000;
  tg_bf16 *a = tu_alloc(2 * n), *b = tu_alloc(2 * n), *back = tu_alloc(2 * n);
  float *f = tu_alloc(sizeof(float) * n);
  tu_fill_bf16(&r, a, n, -4, 4);
  tu_fill_bf16(&r, b, n, -4, 4);
  for (int t = 0; t < nt; t++) {
    tabs[t]->bf16_to_f32(a, f, n);
    for (int64_t i = 0; i < n; i++) assert_true(f[i] == tg_bf16_to_f32(a[i]));
    tabs[t]->f32_to_bf16(f, back, n);
    assert_memory_equal(back, a, 2 * n);
    for (int64_t len = 1; len <= n; len = len * 3 + 1) {
      double s = 0, abs_sum = 0;
      for (int64_t i = 0; i < len; i++) {
        const double x = (double)tg_bf16_to_f32(a[i]) * tg_bf16_to_f32(b[i]);
        s += x;
        abs_sum += fabs(x);
      }
      const float got = tabs[t]->dot_bf16(a, b, len);
      if (fabs(got - s) > (len + 2) * U * abs_sum)
        TU_FAIL("%s dot_bf16 len %lld: got %g want %g", tabs[t]->name, (long long)len,
                (double)got, s);
    }
  }
  free(a), free(b), free(back), free(f);
}

/* attn_score_row / attn_ds_row on ragged rows: visible prefix, mask with
 * -inf entries, the causal tail set to -inf. */
static void test_attention_rows(void **state) {
  const tg_micro_ops *tabs[2];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 17);
  enum { N = 77 };
  float s0[N], s[N], p[N], dp0[N], dp[N];
  tg_bf16 mask[N];
  tu_fill_f32(&r, s0, N, -8, 8);
  tu_fill_f32(&r, p, N, 0, 1);
  tu_fill_f32(&r, dp0, N, -2, 2);
  tu_fill_bf16(&r, mask, N, -3, 3);
  mask[5] = mask[40] = 0xFF80; /* -inf */
  const float scale = 0.37f, shift = 1.25f, d = 0.3f;
  for (int t = 0; t < nt; t++) {
    for (int with_mask = 0; with_mask < 2; with_mask++)
      for (int64_t n_vis = -1; n_vis <= N + 1; n_vis += 13) {
        memcpy(s, s0, sizeof s);
        tabs[t]->attn_score_row(s, N, n_vis, scale, with_mask ? mask : NULL, shift);
        for (int64_t k = 0; k < N; k++) {
          const double m = with_mask ? tg_bf16_to_f32(mask[k]) : 0.0;
          if (k >= n_vis || m == -INFINITY) {
            assert_true(s[k] == -INFINITY);
            continue;
          }
          const double want = (double)scale * s0[k] + m - shift;
          const double mag = fabs((double)scale * s0[k]) + fabs(m) + fabs(shift);
          if (fabs(s[k] - want) > 3 * U * mag)
            TU_FAIL("%s attn_score_row k %lld: got %g want %g", tabs[t]->name, (long long)k,
                    (double)s[k], want);
        }
      }
    memcpy(dp, dp0, sizeof dp);
    tabs[t]->attn_ds_row(dp, p, N, d, scale);
    for (int64_t k = 0; k < N; k++) {
      const double want = (double)scale * p[k] * ((double)dp0[k] - d);
      const double mag = (double)scale * p[k] * (fabs(dp0[k]) + fabs(d));
      if (fabs(dp[k] - want) > 3 * U * mag)
        TU_FAIL("%s attn_ds_row k %lld: got %g want %g", tabs[t]->name, (long long)k,
                (double)dp[k], want);
    }
  }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemms),
      cmocka_unit_test(test_exp),
      cmocka_unit_test(test_conversions_and_dot),
      cmocka_unit_test(test_attention_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
