/*
 * Vector inner loops, written once in plain C and compiled once per ISA:
 * CMake builds this file with -DTG_MICRO_SUFFIX=portable (baseline flags)
 * and, on x86-64, with -DTG_MICRO_SUFFIX=avx512 (-mavx512f ... ). The loops
 * are shaped so the compiler vectorizes the innermost one (contiguous j) and
 * keeps several rows in flight; explicit lane-parallel partial sums stand in
 * for the simd_sum of a Metal simdgroup.
 */
#include <stdint.h>
#include <string.h>

#include "micro.h"

#ifndef TG_MICRO_SUFFIX
#error "compile with -DTG_MICRO_SUFFIX=<isa>"
#endif
#define TG_CAT2(a, b) a##_##b
#define TG_CAT(a, b) TG_CAT2(a, b)
#define TG_NAME(fn) TG_CAT(fn, TG_MICRO_SUFFIX)
#define TG_STR2(x) #x
#define TG_STR(x) TG_STR2(x)

/* Lanes of the partial sums in reductions: one zmm of f32. */
enum { LANES = 16 };

/* C[M,N] (+)= A[M,K] . B[K,N]; four rows of C share each B row load. */
static void TG_NAME(mm_nn)(int M, int N, int K, const float *restrict A, int64_t lda,
                           const float *restrict B, int64_t ldb, float *restrict C,
                           int64_t ldc, int accumulate) {
  int i = 0;
  for (; i + 4 <= M; i += 4) {
    float *restrict c0 = C + (int64_t)i * ldc, *restrict c1 = c0 + ldc;
    float *restrict c2 = c1 + ldc, *restrict c3 = c2 + ldc;
    if (!accumulate) {
      memset(c0, 0, sizeof(float) * (size_t)N);
      memset(c1, 0, sizeof(float) * (size_t)N);
      memset(c2, 0, sizeof(float) * (size_t)N);
      memset(c3, 0, sizeof(float) * (size_t)N);
    }
    const float *a0 = A + (int64_t)i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    for (int k = 0; k < K; k++) {
      const float *restrict b = B + (int64_t)k * ldb;
      const float x0 = a0[k], x1 = a1[k], x2 = a2[k], x3 = a3[k];
#pragma omp simd
      for (int j = 0; j < N; j++) {
        const float bj = b[j];
        c0[j] += x0 * bj;
        c1[j] += x1 * bj;
        c2[j] += x2 * bj;
        c3[j] += x3 * bj;
      }
    }
  }
  for (; i < M; i++) {
    float *restrict c = C + (int64_t)i * ldc;
    if (!accumulate) memset(c, 0, sizeof(float) * (size_t)N);
    const float *a = A + (int64_t)i * lda;
    for (int k = 0; k < K; k++) {
      const float *restrict b = B + (int64_t)k * ldb;
      const float x = a[k];
#pragma omp simd
      for (int j = 0; j < N; j++) c[j] += x * b[j];
    }
  }
}

/* C[M,N] += A[K,M]^T . B[K,N]; four k-steps per pass over a C row. */
static void TG_NAME(mm_tn_acc)(int M, int N, int K, const float *restrict A, int64_t lda,
                               const float *restrict B, int64_t ldb, float *restrict C,
                               int64_t ldc) {
  int k = 0;
  for (; k + 4 <= K; k += 4) {
    const float *a0 = A + (int64_t)k * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    const float *restrict b0 = B + (int64_t)k * ldb, *restrict b1 = b0 + ldb;
    const float *restrict b2 = b1 + ldb, *restrict b3 = b2 + ldb;
    for (int i = 0; i < M; i++) {
      const float x0 = a0[i], x1 = a1[i], x2 = a2[i], x3 = a3[i];
      if (x0 == 0.0f && x1 == 0.0f && x2 == 0.0f && x3 == 0.0f) continue;
      float *restrict c = C + (int64_t)i * ldc;
#pragma omp simd
      for (int j = 0; j < N; j++) c[j] += x0 * b0[j] + x1 * b1[j] + x2 * b2[j] + x3 * b3[j];
    }
  }
  for (; k < K; k++) {
    const float *a = A + (int64_t)k * lda;
    const float *restrict b = B + (int64_t)k * ldb;
    for (int i = 0; i < M; i++) {
      const float x = a[i];
      if (x == 0.0f) continue;
      float *restrict c = C + (int64_t)i * ldc;
#pragma omp simd
      for (int j = 0; j < N; j++) c[j] += x * b[j];
    }
  }
}

static void TG_NAME(bf16_to_f32)(const uint16_t *restrict src, float *restrict dst,
                                 int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = (uint32_t)src[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    dst[i] = f;
  }
}

static void TG_NAME(f32_to_bf16)(const float *restrict src, uint16_t *restrict dst,
                                 int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    dst[i] = (uint16_t)(((u & 0x7FFFFFFFu) > 0x7F800000u) ? 0x7FC0u : rounded);
  }
}

static float TG_NAME(dot_bf16)(const uint16_t *restrict a, const uint16_t *restrict b,
                               int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      const uint32_t ua = (uint32_t)a[i + l] << 16, ub = (uint32_t)b[i + l] << 16;
      float fa, fb;
      memcpy(&fa, &ua, sizeof fa);
      memcpy(&fb, &ub, sizeof fb);
      acc[l] += fa * fb;
    }
  }
  for (int l = 0; i < n; i++, l++) {
    const uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
    float fa, fb;
    memcpy(&fa, &ua, sizeof fa);
    memcpy(&fb, &ub, sizeof fb);
    acc[l] += fa * fb;
  }
  /* Fixed pairwise tree over the lanes (the simd_sum). */
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

const tg_micro_ops TG_NAME(tg_micro) = {
    TG_STR(TG_MICRO_SUFFIX), TG_NAME(mm_nn),       TG_NAME(mm_tn_acc),
    TG_NAME(bf16_to_f32),    TG_NAME(f32_to_bf16), TG_NAME(dot_bf16),
};
