/*
 * Vector inner loops, written once in plain C and compiled once per ISA:
 * CMake builds this file with -DTG_ISA_SUFFIX=<name> and that ISA's flags
 * for every entry of isa/registry.h (portable: the target's baseline flags).
 * The loops are shaped so the compiler vectorizes the innermost one
 * (contiguous j) and keeps several rows in flight; explicit lane-parallel
 * partial sums stand in for the simd_sum of a Metal simdgroup. What plain C
 * does not reach comes from simd_<isa>.h; the blocking from blocking.h.
 */
#include <stdint.h>
#include <string.h>

#include "blocking.h"
#include "ops.h"
#include "philox.h"
#include "reduce.h"

#ifndef TG_ISA_SUFFIX
#error "compile with -DTG_ISA_SUFFIX=<isa>"
#endif
#if defined(__clang__) /* gcc's -ffp-contract=fast (isa/isa.cmake says why) */
#pragma clang fp contract(fast)
#endif
#define TG_CAT2(a, b) a##_##b
#define TG_CAT(a, b) TG_CAT2(a, b)
#define TG_NAME(fn) TG_CAT(fn, TG_ISA_SUFFIX)
#define TG_STR2(x) #x
#define TG_STR(x) TG_STR2(x)

#if defined(__AVX512F__)
#include "x86/simd_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "x86/simd_avx2.h"
#elif defined(__aarch64__) && defined(TG_ISA_WITH_NEON)
#include "arm/simd_neon.h"
#else
#include "portable/simd_portable.h"
#endif

/*
 * Register-blocked GEMM core shared by both shapes: an MR x NR block of C
 * (blocking.h) is held in registers while k runs; A is addressed as
 * A[r * a_rs + k * a_ks], so the same core serves A (row-major, nn) and A^T
 * (tn). `rows` (<= MR) is a literal at every call site, so each row count
 * gets its own fully unrolled copy: a tile whose height is not a multiple
 * of MR still runs its last rows from registers. (An intrinsics version of
 * the 8 x 32 AVX-512 block measured the same: gcc 12 and 13 keep the plain
 * C form in registers.)
 */
static inline __attribute__((always_inline)) void block_rows(
    const int rows, int K, const float *restrict A, int64_t a_rs, int64_t a_ks,
    const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc, int accumulate) {
  float acc[MR][NR];
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < NR; j++) acc[r][j] = accumulate ? C[r * ldc + j] : 0.0f;
  for (int k = 0; k < K; k++) {
    const float *restrict b = B + (int64_t)k * ldb;
    for (int r = 0; r < rows; r++) {
      const float x = A[r * a_rs + (int64_t)k * a_ks];
#pragma omp simd
      for (int j = 0; j < NR; j++) acc[r][j] += x * b[j];
    }
  }
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < NR; j++) C[r * ldc + j] = acc[r][j];
}

/* A block of 1..MR rows and NR columns. */
static void block_nr(int rows, int K, const float *restrict A, int64_t a_rs, int64_t a_ks,
                     const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc,
                     int accumulate) {
  switch (rows) {
#define TG_ROWS_CASE(n)                                                      \
  case n:                                                                    \
    if (n <= MR) block_rows(n, K, A, a_rs, a_ks, B, ldb, C, ldc, accumulate); \
    break;
    TG_ROWS_CASE(1) TG_ROWS_CASE(2) TG_ROWS_CASE(3) TG_ROWS_CASE(4)
    TG_ROWS_CASE(5) TG_ROWS_CASE(6) TG_ROWS_CASE(7) TG_ROWS_CASE(8)
#undef TG_ROWS_CASE
  }
}
_Static_assert(MR <= 8, "block_nr has cases for up to 8 rows");

/* Any-size edge block (fewer than NR columns): rows x cols of C. */
static void block_edge(int rows, int cols, int K, const float *restrict A, int64_t a_rs,
                       int64_t a_ks, const float *restrict B, int64_t ldb, float *restrict C,
                       int64_t ldc, int accumulate) {
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
    for (; j + NR <= N; j += NR)
      block_nr(rows, K, Ai, a_rs, a_ks, B + j, ldb, Ci + j, ldc, accumulate);
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

_Static_assert(LANES == 16, "the row reductions end in tg_lane_tree16 (isa/reduce.h)");

/* One element each way, branch-free (engine/bf16.h's bits: RNE, any NaN ->
 * 0x7FC0), for the loops below and bf16_pack.h; the simd_<isa>.h blocks
 * take whole vectors. */
static inline __attribute__((always_inline)) float bf16_widen(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline __attribute__((always_inline)) uint16_t bf16_rne(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(((u & 0x7FFFFFFFu) > 0x7F800000u) ? 0x7FC0u : rounded);
}

static void TG_NAME(bf16_to_f32)(const uint16_t *restrict src, float *restrict dst,
                                 int64_t n) {
  int64_t i = 0;
  if (CVT_W)
    for (; i + CVT_W <= n; i += CVT_W) bf16_widen_block(src + i, dst + i);
#pragma omp simd
  for (int64_t j = i; j < n; j++) dst[j] = bf16_widen(src[j]);
}

static void TG_NAME(f32_to_bf16)(const float *restrict src, uint16_t *restrict dst,
                                 int64_t n) {
  int64_t i = 0;
  if (CVT_W)
    for (; i + CVT_W <= n; i += CVT_W) bf16_narrow_block(src + i, dst + i);
#pragma omp simd
  for (int64_t j = i; j < n; j++) dst[j] = bf16_rne(src[j]);
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
  return tg_lane_tree16(acc);
}

/*
 * exp(x), one lane: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an
 * exact n ln2), e^r by a degree-7 polynomial (the Cephes expf minimax
 * coefficients), 2^n applied as two exponent-field scalings so results down
 * to the subnormal range stay right; measured within 1 ulp. The range
 * handling is selects, which gcc turns into vector blends on every ISA (the
 * tables are built with -fno-trapping-math, isa/isa.cmake): every loop that
 * calls it vectorizes. The one exp of the attention rows and exp_f32.
 */
static inline float exp_lane(float v) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f,
              ln2_lo = -2.12194440e-4f, round_magic = 12582912.0f; /* 1.5 * 2^23 */
  float xc = v > 89.0f ? 89.0f : v;
  xc = xc >= -104.0f ? xc : -104.0f; /* NaN too (float->int of NaN is UB); restored below */
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
  const int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1; /* each in [-75, 64] */
  const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  float out = (er * s1) * s2;
  out = v > 88.7228394f ? __builtin_inff() : out;
  out = v < -103.972084f ? 0.0f : out;
  return v == v ? out : v;
}

/* y[i] = exp(x[i]); y may alias x */
static void TG_NAME(exp_f32)(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = exp_lane(x[i]);
}

/* Element k of a mask row of type t as f32 (bf16 widened exactly). t is a
 * constant wherever this is inlined: each masked loop below is compiled once
 * per mask type, each as plain a vector loop as one written for that type. */
static inline __attribute__((always_inline)) float mask_elem(const void *restrict mask,
                                                             int64_t k, const tg_dtype t) {
  if (t == TG_DTYPE_F32) return ((const float *)mask)[k];
  const uint32_t u = (uint32_t)((const uint16_t *)mask)[k] << 16;
  float m;
  memcpy(&m, &u, sizeof m);
  return m;
}

static inline __attribute__((always_inline)) void score_row_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    float shift) {
#pragma omp simd
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? m : (scale * s[k] + m) - shift;
  }
}

static void TG_NAME(attn_score_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                                    const void *restrict mask, tg_dtype mask_type,
                                    float shift) {
  if (n_vis > n) n_vis = n;
  if (mask && mask_type == TG_DTYPE_F32) {
    score_row_masked(s, n_vis, scale, mask, TG_DTYPE_F32, shift);
  } else if (mask) {
    score_row_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, shift);
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


static inline __attribute__((always_inline)) void prob_row_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    float shift) {
#pragma omp simd
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? 0.0f : exp_lane((scale * s[k] + m) - shift);
  }
}

static void TG_NAME(attn_prob_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                                   const void *restrict mask, tg_dtype mask_type,
                                   float shift) {
  if (n_vis > n) n_vis = n;
  if (mask && mask_type == TG_DTYPE_F32) {
    prob_row_masked(s, n_vis, scale, mask, TG_DTYPE_F32, shift);
  } else if (mask) {
    prob_row_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, shift);
  } else {
#pragma omp simd
    for (int64_t k = 0; k < n_vis; k++) s[k] = exp_lane(scale * s[k] - shift);
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = 0.0f;
}

/* LANES partial sums in a generic vector (one zmm, two ymm or four xmm), so
 * the tree at the end stays in registers (tg_lane_tree16's order): its array
 * form goes through memory one scalar add at a time, which costs more than
 * the exp of a 64-key row. */
typedef float lanes_v __attribute__((vector_size(LANES * sizeof(float))));
_Static_assert(LANES == 16, "lanes_sum is a tree over 16 lanes");
static inline float lanes_sum(const lanes_v *px) { /* by pointer: no vector ABI */
  const lanes_v x = *px;
  const lanes_v h = x + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2,
                                                3, 4, 5, 6, 7); /* l + 8 */
  const lanes_v q = h + __builtin_shufflevector(h, h, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0,
                                                1, 2, 3); /* l + 4 */
  return (q[0] + q[2]) + (q[1] + q[3]);
}

static float TG_NAME(attn_exp_sum_row)(float *restrict s, int64_t n, float shift) {
#pragma omp simd
  for (int64_t k = 0; k < n; k++) s[k] = exp_lane(s[k] - shift);
  lanes_v acc = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    lanes_v x;
    memcpy(&x, s + i, sizeof x);
    acc += x;
  }
  float sum = lanes_sum(&acc);
  for (; i < n; i++) sum += s[i]; /* the tail (< LANES) in order */
  return sum;
}

/* The masked loop of attn_score_max_row; *nan gets whether a score is NaN. */
static inline __attribute__((always_inline)) float score_max_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    int *nan_out) {
  float mx = -__builtin_inff();
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? m : scale * s[k] + m;
    mx = s[k] > mx ? s[k] : mx;
    nan |= s[k] != s[k];
  }
  *nan_out = nan;
  return mx;
}

static float TG_NAME(attn_score_max_row)(float *restrict s, int64_t n, int64_t n_vis,
                                         float scale, const void *restrict mask,
                                         tg_dtype mask_type) {
  if (n_vis > n) n_vis = n;
  float mx = -__builtin_inff();
  int nan = 0; /* a NaN score makes the row's max NaN (the compare alone skips it) */
  if (mask && mask_type == TG_DTYPE_F32) {
    mx = score_max_masked(s, n_vis, scale, mask, TG_DTYPE_F32, &nan);
  } else if (mask) {
    mx = score_max_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, &nan);
  } else {
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int64_t k = 0; k < n_vis; k++) {
      s[k] = scale * s[k];
      mx = s[k] > mx ? s[k] : mx;
      nan |= s[k] != s[k];
    }
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = -__builtin_inff();
  return nan ? __builtin_nanf("") : mx;
}
/*
 * Dropout keep flags: Philox4x32-10 (isa/philox.h) on PHILOX_LANES
 * consecutive counters at once, one counter per vector lane, so each round
 * is a few vector instructions (the widening 32 x 32 -> 64-bit multiply is
 * one on every x86 vector ISA) where the scalar generator spends ~20
 * instructions per draw.
 */
enum { PHILOX_LANES = 16 };

static void TG_NAME(dropout_keep)(uint8_t *restrict keep, int64_t n, uint64_t n0, uint64_t seed,
                                  uint64_t offset, uint32_t threshold) {
  uint64_t blk = n0 / 4;            /* counter of the draw n0, less offset */
  int64_t skip = (int64_t)(n0 % 4); /* words of the first block before n0 */
  for (int64_t done = 0; done < n; blk += PHILOX_LANES, skip = 0) {
    uint32_t c0[PHILOX_LANES], c1[PHILOX_LANES], c2[PHILOX_LANES], c3[PHILOX_LANES];
#pragma omp simd
    for (int l = 0; l < PHILOX_LANES; l++) {
      const uint64_t ctr = offset + blk + (uint64_t)l; /* its low 64 bits; a carry -> c2 */
      c0[l] = (uint32_t)ctr, c1[l] = (uint32_t)(ctr >> 32), c2[l] = ctr < offset, c3[l] = 0;
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < TG_PHILOX_ROUNDS; r++, k0 += TG_PHILOX_W0, k1 += TG_PHILOX_W1) {
#pragma omp simd
      for (int l = 0; l < PHILOX_LANES; l++) {
        const uint64_t p0 = (uint64_t)TG_PHILOX_M0 * c0[l], p1 = (uint64_t)TG_PHILOX_M1 * c2[l];
        const uint32_t n0w = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
        const uint32_t n2w = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
        c0[l] = n0w, c1[l] = (uint32_t)p1, c2[l] = n2w, c3[l] = (uint32_t)p0;
      }
    }
    uint8_t flags[4 * PHILOX_LANES]; /* draw 4 l + w: word w of counter l */
#pragma omp simd
    for (int l = 0; l < PHILOX_LANES; l++) {
      flags[4 * l + 0] = c0[l] >= threshold, flags[4 * l + 1] = c1[l] >= threshold;
      flags[4 * l + 2] = c2[l] >= threshold, flags[4 * l + 3] = c3[l] >= threshold;
    }
    const int64_t take = 4 * PHILOX_LANES - skip < n - done ? 4 * PHILOX_LANES - skip : n - done;
    memcpy(keep + done, flags + skip, (size_t)take);
    done += take;
  }
}

#include "row_ops.h"
#include "x86/bf16_dot.h" /* AVX512_BF16 (vdpbf16ps), FEAT_BF16 (BFMMLA): pack_bf16_pairs, mm_bf16_pairs */
#include "x86/amx_dot.h" /* AMX-BF16: mm_bf16_pairs on tiles in place of bf16_dot.h's */
#include "bf16_pack.h" /* the precision modes' operand packing */
#ifndef TG_BF16_BRACKET_OPS /* only the amx table brackets its calls */
#define TG_BF16_BRACKET_OPS
#endif

const tg_isa_ops TG_NAME(tg_isa_ops) = {
    .name = TG_STR(TG_ISA_SUFFIX),
    .gemm_mr = MR,
    .gemm_nr = NR,
    .attn_bq = ATTN_BQ,
    .attn_bk = ATTN_BK,
    .attn_bq_bf16 = ATTN_BQ_BF16,
    .attn_bk_bf16 = ATTN_BK_BF16,
    .mm_nn = TG_NAME(mm_nn),
    .mm_tn_acc = TG_NAME(mm_tn_acc),
    TG_BF16_DOT_OPS
    TG_BF16_BRACKET_OPS
    TG_BF16_PACK_OPS
    .bf16_to_f32 = TG_NAME(bf16_to_f32),
    .f32_to_bf16 = TG_NAME(f32_to_bf16),
    .dot_bf16 = TG_NAME(dot_bf16),
    .exp_f32 = TG_NAME(exp_f32),
    .attn_score_row = TG_NAME(attn_score_row),
    .attn_ds_row = TG_NAME(attn_ds_row),
    .attn_prob_row = TG_NAME(attn_prob_row),
    .attn_exp_sum_row = TG_NAME(attn_exp_sum_row),
    .attn_score_max_row = TG_NAME(attn_score_max_row),
    .dropout_keep = TG_NAME(dropout_keep),
    .dot_f32 = TG_NAME(dot_f32),
    .dot3_f32 = TG_NAME(dot3_f32),
    .max_f32 = TG_NAME(max_f32),
    .scale2_f32 = TG_NAME(scale2_f32),
    .add_f32 = TG_NAME(add_f32),
    .add_compensated_f32 = TG_NAME(add_compensated_f32),
    .acc_mul2_f32 = TG_NAME(acc_mul2_f32),
    .rms_dx_row = TG_NAME(rms_dx_row),
    .fwht_mul_f32 = TG_NAME(fwht_mul_f32),
    .transpose_f32 = TG_NAME(transpose_f32),
    .wsum4_f32 = TG_NAME(wsum4_f32),
    .softmax_exp_chunk = TG_NAME(softmax_exp_chunk),
    .scale_chunks_f32 = TG_NAME(scale_chunks_f32),
    .rms_sums_f32 = TG_NAME(rms_sums_f32),
    .rms_bwd_row = TG_NAME(rms_bwd_row),
    .stream_fence = TG_NAME(stream_fence),
};
