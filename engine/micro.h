/*
 * The ISA layer: the few vector inner loops the kernels spend their time in,
 * behind one table of function pointers. kernels/micro/micro.c is written in
 * plain C and compiled once per ISA (portable baseline; AVX-512), so the
 * portable table is always built and tested; tg_ctx_create picks a table from
 * CPUID (overridable with TG_ISA / tg_ctx_set_isa).
 *
 * Matrices are f32, row-major, with explicit leading dimensions (elements).
 */
#ifndef TG_MICRO_H
#define TG_MICRO_H

#include <stdint.h>

typedef struct {
  const char *name;
  /* C[M,N] = A[M,K] . B[K,N]          (accumulate == 0)
   * C[M,N] += A[M,K] . B[K,N]         (accumulate != 0) */
  void (*mm_nn)(int M, int N, int K, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, int accumulate);
  /* C[M,N] += A[K,M]^T . B[K,N] */
  void (*mm_tn_acc)(int M, int N, int K, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc);
  /* dst[i] = float(src[i]) */
  void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
  /* dst[i] = bf16(src[i]), round to nearest even */
  void (*f32_to_bf16)(const float *src, uint16_t *dst, int64_t n);
  /* sum_i float(a[i]) * float(b[i]), f32 accumulation */
  float (*dot_bf16)(const uint16_t *a, const uint16_t *b, int64_t n);
  /* y[i] = exp(x[i]) within 2 ulp (subnormal results included; -inf -> 0,
   * NaN -> NaN); y may alias x */
  void (*exp_f32)(const float *x, float *y, int64_t n);
  /* Attention score row without softcapping, in place on s[0..n) = Q.K^T:
   * s[k] = scale*s[k] + m[k] - shift for k < n_vis (m = 0 without a mask;
   * a mask entry of -inf gives -inf), and -inf for k >= n_vis (causal). */
  void (*attn_score_row)(float *s, int64_t n, int64_t n_vis, float scale,
                         const uint16_t *mask, float shift);
  /* Attention dS row: dp[k] = scale * (p[k] * (dp[k] - d)) */
  void (*attn_ds_row)(float *dp, const float *p, int64_t n, float d, float scale);
} tg_micro_ops;

extern const tg_micro_ops tg_micro_portable;
#ifdef TG_HAVE_AVX512
extern const tg_micro_ops tg_micro_avx512;
#endif

#endif /* TG_MICRO_H */
