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

/*
 * Register-blocked GEMM core shared by both shapes: an 8 x 32 block of C is
 * held in registers (16 zmm at AVX-512) while k runs; A is addressed as
 * A[r * a_rs + k * a_ks], so the same core serves A (row-major, nn) and A^T
 * (tn). Edges fall back to a plain loop. (An intrinsics version of the block
 * measured the same: gcc 12 and 13 keep the plain C form in registers.)
 */
enum { MR = 8, NR = 32 };

static inline void block_mrxnr(int K, const float *restrict A, int64_t a_rs, int64_t a_ks,
                               const float *restrict B, int64_t ldb, float *restrict C,
                               int64_t ldc, int accumulate) {
  float acc[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++) acc[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
  for (int k = 0; k < K; k++) {
    const float *restrict b = B + (int64_t)k * ldb;
    for (int r = 0; r < MR; r++) {
      const float x = A[r * a_rs + (int64_t)k * a_ks];
#pragma omp simd
      for (int j = 0; j < NR; j++) acc[r][j] += x * b[j];
    }
  }
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++) C[r * ldc + j] = acc[r][j];
}

/* Any-size edge block: rows x cols of C. */
static inline void block_edge(int rows, int cols, int K, const float *restrict A, int64_t a_rs,
                              int64_t a_ks, const float *restrict B, int64_t ldb,
                              float *restrict C, int64_t ldc, int accumulate) {
  for (int r = 0; r < rows; r++) {
    float *restrict c = C + r * ldc;
    if (!accumulate)
      for (int j = 0; j < cols; j++) c[j] = 0.0f;
    for (int k = 0; k < K; k++) {
      const float x = A[r * a_rs + (int64_t)k * a_ks];
      const float *restrict b = B + (int64_t)k * ldb;
#pragma omp simd
      for (int j = 0; j < cols; j++) c[j] += x * b[j];
    }
  }
}

static void gemm(int M, int N, int K, const float *A, int64_t a_rs, int64_t a_ks,
                 const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  for (int i = 0; i < M; i += MR) {
    const int rows = M - i < MR ? M - i : MR;
    const float *Ai = A + (int64_t)i * a_rs;
    float *Ci = C + (int64_t)i * ldc;
    int j = 0;
    if (rows == MR)
      for (; j + NR <= N; j += NR)
        block_mrxnr(K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
    if (j < N) block_edge(rows, N - j, K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
  }
}

/* C[M,N] (+)= A[M,K] . B[K,N] */
static void TG_NAME(mm_nn)(int M, int N, int K, const float *restrict A, int64_t lda,
                           const float *restrict B, int64_t ldb, float *restrict C,
                           int64_t ldc, int accumulate) {
  gemm(M, N, K, A, lda, 1, B, ldb, C, ldc, accumulate);
}

/* C[M,N] += A[K,M]^T . B[K,N] */
static void TG_NAME(mm_tn_acc)(int M, int N, int K, const float *restrict A, int64_t lda,
                               const float *restrict B, int64_t ldb, float *restrict C,
                               int64_t ldc) {
  gemm(M, N, K, A, 1, lda, B, ldb, C, ldc, 1);
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

/*
 * exp(x) for a whole row, in a form the compiler vectorizes: x = n ln2 + r
 * with |r| <= ln2/2 (ln2 split in two for an exact n ln2), e^r by a degree-7
 * polynomial (the Cephes expf minimax coefficients), 2^n applied as two
 * exponent-field scalings so results down to the subnormal range stay right.
 */
static void TG_NAME(exp_f32)(const float *x, float *y, int64_t n) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f,
              ln2_lo = -2.12194440e-4f, round_magic = 12582912.0f; /* 1.5 * 2^23 */
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float v = x[i];
    /* NaN clamps to -104 too (float->int of NaN is UB); the NaN is restored below */
    const float xc = !(v >= -104.0f) ? -104.0f : (v > 89.0f ? 89.0f : v);
    const float k = (xc * log2e + round_magic) - round_magic; /* nearest integer */
    float r = xc - k * ln2_hi;
    r = r - k * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * (r * r) + r + 1.0f;
    const int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1; /* each in [-52, 45] */
    const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float out = (er * s1) * s2;
    if (v > 88.7228394f) out = __builtin_inff();
    if (v < -103.972084f) out = 0.0f;
    if (v != v) out = v;
    y[i] = out;
  }
}

static void TG_NAME(attn_score_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                                    const uint16_t *restrict mask, float shift) {
  if (n_vis > n) n_vis = n;
  if (mask) {
#pragma omp simd
    for (int64_t k = 0; k < n_vis; k++) {
      const uint32_t u = (uint32_t)mask[k] << 16;
      float m;
      memcpy(&m, &u, sizeof m);
      s[k] = m == -__builtin_inff() ? m : (scale * s[k] + m) - shift;
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < n_vis; k++) s[k] = scale * s[k] - shift;
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = -__builtin_inff();
}

static void TG_NAME(attn_ds_row)(float *restrict dp, const float *restrict p, int64_t n,
                                 float d, float scale) {
#pragma omp simd
  for (int64_t k = 0; k < n; k++) dp[k] = scale * (p[k] * (dp[k] - d));
}

/* --- row ops of the memory-bound kernels ------------------------------------
 * Compiled without FMA contraction: each op then rounds exactly as its
 * formula reads on every ISA (the portable build has no FMA anyway), so the
 * kernels built on them give the same bits whatever table is chosen, as
 * their tests check. They are memory-bound; the FMA would buy nothing. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

/* Streaming row ops prefetch PF_AHEAD floats (2 KiB) ahead, one line per 16
 * floats: one thread walking one row at a time otherwise leans on the L2
 * streamer alone, which stops at every 4 KiB page and keeps too few misses
 * in flight to reach the bandwidth a multi-stream triad gets. A prefetch
 * never faults, so running past the end of a row is harmless. */
enum { PF_AHEAD = 512 };
#define TG_PF(p) __builtin_prefetch((p) + PF_AHEAD, 0, 3)

/* Fixed pairwise tree over the lanes (the simd_sum). */
static inline float lane_tree(float acc[LANES]) {
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

static float TG_NAME(dot_f32)(const float *restrict a, const float *restrict b, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(a + i), TG_PF(b + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
  return lane_tree(acc);
}

static float TG_NAME(dot3_f32)(const float *restrict a, const float *restrict b,
                               const float *restrict c, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(a + i), TG_PF(b + i), TG_PF(c + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l] * c[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i] * c[i];
  return lane_tree(acc);
}

static float TG_NAME(max_f32)(const float *restrict x, int64_t n) {
  float acc[LANES];
  for (int l = 0; l < LANES; l++) acc[l] = -__builtin_inff();
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(x + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

/* Chunks of EXP_CHUNK (a multiple of LANES) stay in L1 between the subtract,
 * the exp and the sum; the lanes run on across chunks, so the sum order is
 * that of one 16-lane pass over the row. */
enum { EXP_CHUNK = 1024 };
static float TG_NAME(exp_shift_sum_f32)(const float *x, float shift, float *y, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  while (i < n) {
    const int64_t len = n - i < EXP_CHUNK ? n - i : EXP_CHUNK;
#pragma omp simd
    for (int64_t j = 0; j < len; j++) y[i + j] = x[i + j] - shift;
    TG_NAME(exp_f32)(y + i, y + i, len);
    const float *restrict e = y + i;
    int64_t j = 0;
    for (; j + LANES <= len; j += LANES) {
#pragma omp simd
      for (int l = 0; l < LANES; l++) acc[l] += e[j + l];
    }
    for (int l = 0; j < len; j++, l++) acc[l] += e[j]; /* only in the last chunk */
    i += len;
  }
  return lane_tree(acc);
}

static void TG_NAME(scale2_f32)(float *restrict x, int64_t n, float a, float b) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) x[i] = (x[i] * a) * b;
}

static void TG_NAME(add_f32)(float *restrict dst, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i += LANES) {
    const int64_t m = n - i < LANES ? n - i : LANES;
    /* within the row only: callers (embedding rows, partial sums) jump
     * elsewhere next, and a prefetch of dst for writing past the end is a
     * wasted read-for-ownership */
    if (i + PF_AHEAD < n) TG_PF(src + i), TG_PF(dst + i);
#pragma omp simd
    for (int64_t j = 0; j < m; j++) dst[i + j] += src[i + j];
  }
}

static void TG_NAME(acc_mul2_f32)(float *restrict acc, const float *restrict a,
                                  const float *restrict b, float s, int64_t n) {
  for (int64_t i = 0; i < n; i += LANES) {
    const int64_t m = n - i < LANES ? n - i : LANES;
    TG_PF(a + i), TG_PF(b + i);
#pragma omp simd
    for (int64_t j = 0; j < m; j++) acc[i + j] += a[i + j] * s * b[i + j];
  }
}

static void TG_NAME(rms_dx_row)(const float *restrict x, const float *restrict w,
                                const float *restrict dy, float r, float c,
                                float *restrict dx, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; k++) dx[k] = r * (dy[k] * w[k] - x[k] * c);
}

/*
 * FWHT. Stages len = 1, 2, 4, 8 act inside each aligned block of 16 floats:
 * y[l] = x[l ^ len] + sgn_len(l) * x[l] with sgn = -1 where (l & len), i.e.
 * x[l] + x[l^len] or x[l^len] - x[l], exactly the butterfly (sgn * x is exact,
 * so with or without FMA contraction each output is one rounding of the same
 * sum). Written as fixed permutes of one 16-float block, which the compiler
 * keeps in one zmm (permute + FMA per stage). Stages len >= 16 are plain
 * butterflies vectorized over j; the factor mul is applied in the last one.
 */
#if defined(__AVX512F__)
#include <immintrin.h>
/* One zmm per block: per stage a permute (x[l ^ len]), a multiply by the
 * +-1 pattern (exact) and an add. (Intrinsics rather than vector extensions:
 * they build with gcc and clang alike, and the fuzzer builds with clang.) */
static inline void fwht16_block(float *restrict x) {
  __m512 v = _mm512_loadu_ps(x);
#define TG_FW_STAGE(len)                                                          \
  do {                                                                            \
    int32_t idx[16];                                                              \
    float sg[16];                                                                 \
    for (int l = 0; l < 16; l++) idx[l] = l ^ (len), sg[l] = (l & (len)) ? -1.0f : 1.0f; \
    v = _mm512_add_ps(_mm512_permutexvar_ps(_mm512_loadu_si512(idx), v),          \
                      _mm512_mul_ps(_mm512_loadu_ps(sg), v));                     \
  } while (0)
  TG_FW_STAGE(1);
  TG_FW_STAGE(2);
  TG_FW_STAGE(4);
  TG_FW_STAGE(8);
#undef TG_FW_STAGE
  _mm512_storeu_ps(x, v);
}
#else
static inline void fwht16_block(float *restrict x) {
  float t[16], u[16];
  for (int l = 0; l < 16; l++) t[l] = x[l];
  for (int l = 0; l < 16; l++) u[l] = t[l ^ 1] + ((l & 1) ? -t[l] : t[l]);
  for (int l = 0; l < 16; l++) t[l] = u[l ^ 2] + ((l & 2) ? -u[l] : u[l]);
  for (int l = 0; l < 16; l++) u[l] = t[l ^ 4] + ((l & 4) ? -t[l] : t[l]);
  for (int l = 0; l < 16; l++) t[l] = u[l ^ 8] + ((l & 8) ? -u[l] : u[l]);
  for (int l = 0; l < 16; l++) x[l] = t[l];
}
#endif

static void TG_NAME(fwht_mul_f32)(float *restrict x, int64_t n, const float *restrict mul) {
  for (int64_t b = 0; b < n; b += 16) {
    __builtin_prefetch(x + b + PF_AHEAD, 1, 3); /* rows are walked in order */
    fwht16_block(x + b);
  }
  for (int64_t len = 16; len < n; len *= 2) {
    const int last = 2 * len == n;
    for (int64_t i = 0; i < n; i += 2 * len) {
      float *restrict lo = x + i, *restrict hi = x + i + len;
      if (last) {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          const float u = lo[j], v = hi[j];
          lo[j] = (u + v) * mul[j];
          hi[j] = (u - v) * mul[len + j];
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          const float u = lo[j], v = hi[j];
          lo[j] = u + v;
          hi[j] = u - v;
        }
      }
    }
  }
  if (n <= 16)
    for (int64_t j = 0; j < n; j++) x[j] *= mul[j];
}

/*
 * Transpose. AVX-512 build: 16 x 16 blocks held in 16 zmm and transposed by
 * 4 stages of two-source permutes (stage b swaps bit b of the row index with
 * bit b of the column index); edges and the portable build copy element by
 * element in 8 x 8 sub-blocks.
 */
static void transpose_small(int64_t rows, int64_t cols, const float *restrict src, int64_t lds,
                            float *restrict dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8)
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const int64_t r1 = r0 + 8 < rows ? r0 + 8 : rows, c1 = c0 + 8 < cols ? c0 + 8 : cols;
      for (int64_t c = c0; c < c1; c++)
        for (int64_t r = r0; r < r1; r++) dst[c * ldd + r] = src[r * lds + c];
    }
}

#if defined(__AVX512F__)
static inline void transpose16(const float *restrict src, int64_t lds, float *restrict dst,
                               int64_t ldd, int stream) {
  __m512 m[16];
  for (int i = 0; i < 16; i++) m[i] = _mm512_loadu_ps(src + i * lds);
  /* stage b: rows i (bit b clear) and i|b exchange the halves selected by
   * bit b of the column: lo[j] = j&b ? hi_old[j^b] : lo_old[j],
   *                       hi[j] = j&b ? hi_old[j]  : lo_old[j^b]. */
#define TG_T_STAGE(b, MLO, MHI)                                         \
  do {                                                                  \
    const __m512i mlo = MLO, mhi = MHI;                                 \
    for (int i = 0; i < 16; i++)                                        \
      if (!(i & (b))) {                                                 \
        const __m512 lo = m[i], hi = m[i | (b)];                        \
        m[i] = _mm512_permutex2var_ps(lo, mlo, hi);                     \
        m[i | (b)] = _mm512_permutex2var_ps(lo, mhi, hi);               \
      }                                                                 \
  } while (0)
  /* index j < 16 picks lo[j], 16 + j picks hi[j] (_mm512_setr_epi32 lists
   * lane 0 first) */
  TG_T_STAGE(1, _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
             _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31));
  TG_T_STAGE(2, _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
             _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31));
  TG_T_STAGE(4, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
             _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31));
  TG_T_STAGE(8, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
             _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
#undef TG_T_STAGE
  if (stream)
    for (int i = 0; i < 16; i++) _mm512_stream_ps(dst + i * ldd, m[i]);
  else
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, m[i]);
}
#endif

static void TG_NAME(transpose_f32)(int64_t rows, int64_t cols, const float *restrict src,
                                   int64_t lds, float *restrict dst, int64_t ldd, int stream) {
#if defined(__AVX512F__)
  /* Non-temporal stores need every block row on a 64-byte line. */
  stream = stream && (uintptr_t)dst % 64 == 0 && ldd % 16 == 0;
  const int64_t r16 = rows & ~(int64_t)15, c16 = cols & ~(int64_t)15;
  for (int64_t c = 0; c < c16; c += 16)
    for (int64_t r = 0; r < r16; r += 16)
      transpose16(src + r * lds + c, lds, dst + c * ldd + r, ldd, stream);
  if (r16 < rows) transpose_small(rows - r16, cols, src + r16 * lds, lds, dst + r16, ldd);
  if (c16 < cols) transpose_small(r16, cols - c16, src + c16, lds, dst + c16 * ldd, ldd);
  if (stream) _mm_sfence(); /* streamed stores visible before any later store */
#else
  (void)stream; /* plain C has no non-temporal store */
  transpose_small(rows, cols, src, lds, dst, ldd);
#endif
}

/* Four c at a time (16 independent accumulators: four xmm-wide chains), each
 * summing its workgroups in list order. */
static void TG_NAME(wsum4_f32)(const float *restrict part, int64_t ld, const int32_t *restrict w,
                               const float *restrict a, int64_t nw, int64_t n4, float div,
                               float *restrict dst) {
  int64_t c = 0;
  for (; c + 4 <= n4; c += 4) {
    float acc[4][4] = {{0}};
    /* every line of the block of four c 4 blocks ahead (ld = 16: 4 KiB) */
    const float *restrict ahead = part + (c + 16) * ld * 4;
    for (int64_t l = 0; l < 16 * ld; l += 16) __builtin_prefetch(ahead + l, 0, 3);
    for (int64_t i = 0; i < nw; i++) {
      const float ai = a[i];
      const float *restrict p = part + (c * ld + w[i]) * 4;
      for (int cc = 0; cc < 4; cc++)
#pragma omp simd
        for (int k = 0; k < 4; k++) acc[cc][k] += p[cc * ld * 4 + k] * ai;
    }
    for (int cc = 0; cc < 4; cc++)
      for (int k = 0; k < 4; k++) dst[(c + cc) * 4 + k] = acc[cc][k] / div;
  }
  for (; c < n4; c++) {
    float acc[4] = {0};
    for (int64_t i = 0; i < nw; i++) {
      const float *restrict p = part + (c * ld + w[i]) * 4;
      for (int k = 0; k < 4; k++) acc[k] += p[k] * a[i];
    }
    for (int k = 0; k < 4; k++) dst[c * 4 + k] = acc[k] / div;
  }
}

#pragma GCC pop_options

const tg_micro_ops TG_NAME(tg_micro) = {
    TG_STR(TG_MICRO_SUFFIX), TG_NAME(mm_nn),       TG_NAME(mm_tn_acc),
    TG_NAME(bf16_to_f32),    TG_NAME(f32_to_bf16), TG_NAME(dot_bf16),
    TG_NAME(exp_f32),        TG_NAME(attn_score_row), TG_NAME(attn_ds_row),
    TG_NAME(dot_f32),        TG_NAME(dot3_f32),       TG_NAME(max_f32),
    TG_NAME(exp_shift_sum_f32), TG_NAME(scale2_f32),  TG_NAME(add_f32),
    TG_NAME(acc_mul2_f32),   TG_NAME(rms_dx_row),     TG_NAME(fwht_mul_f32),
    TG_NAME(transpose_f32),  TG_NAME(wsum4_f32),
};
