/*
 * The bf16 dot-product GEMM of the neonbf16 table (FEAT_BF16): the contract
 * of isa/x86/bf16_dot.c's vdpbf16ps GEMM (isa/ops.h: mm_bf16_pairs,
 * pack_bf16_pairs) on BFMMLA.
 * BFMMLA acc, a, b adds to the 2 x 2 f32 block acc (row-major: c00 c01 c10
 * c11) the product of the 2 x 4 bf16 block a (two rows of 4 k) and the
 * 4 x 2 block whose two columns of 4 k are the two halves of b. A row pair
 * of A loads in place (4 k of each row); b is two columns of 4 k: the
 * zip of two rows of Bp (pairs p, p+1) gives pair p and p+1 of column j,
 * then of j+1. An 8 x 8 block of C is 4 x 4 such tiles: 16 accumulators,
 * 4 B vectors and an A vector per row pair, with 4 zips per 4 k.
 *
 * Numerics (Arm ARM, BFDOT / BFMMLA, BFDotAdd): unless FEAT_EBF16 is
 * implemented and FPCR.EBF set, the instruction ignores the FPCR: it rounds
 * the sum of each pair of products, and that sum added to the accumulator,
 * with round-to-odd (an inexact result gets its last bit set: an error of
 * up to 1 ulp, twice round-to-nearest's), flushes subnormal inputs and
 * results to zero and makes only the default NaN (qemu 7.2 does the same:
 * 1 + 2^-24 gives 1 + 2^-23). An accumulation chain of BFMMLAs would then
 * carry up to 2u per step, twice the f32 sums of vdpbf16ps and of the
 * tests' bounds. So every BFMMLA starts from zero and covers 4 k only:
 * its products are exact (bf16 x bf16 fits in f32), its two pair sums and
 * their sum are rounded to odd (at most 2u of the 4 products' magnitudes
 * each, 4u for the group), and the group is added to C's accumulator with
 * an ordinary FADD (round to nearest even; FPCR.FZ is off: no flush). For K
 * products that is at most (5 + K/4) u (|C| + sum |a b|) to first order:
 * within gamma(K) = (K + 2) u, the f32 bound of the tests, for every even
 * K >= 4 (K = 2: one rounded pair and one add, 3u). (With FPCR.EBF set the
 * pair sums are fused and round to nearest: smaller still.) As on x86,
 * parts below 2^-126 are flushed to zero.
 */
#include "common/build.h"

#if !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#error "arm/bf16_mmla.c: the neonbf16 table needs BFMMLA (-march=armv8.2-a+bf16)"
#endif

_Static_assert(BF16_MR == 8 && BF16_NR == 8, "bf16_block holds 4 x 4 tiles of 2 x 2");

/* acc + (a . b from zero): one group of 4 k, rounded as above. */
static inline float32x4_t mmla_group(float32x4_t acc, uint16x8_t a, uint16x8_t b) {
  return vaddq_f32(acc, vbfmmlaq_f32(vdupq_n_f32(0.0f), vreinterpretq_bf16_u16(a),
                                     vreinterpretq_bf16_u16(b)));
}

/* Rows r0, r1 at k..k+3 (pairs = 2), or k, k+1 and zeros (pairs = 1). */
static inline uint16x8_t a_rows(const uint16_t *r0, const uint16_t *r1, int64_t k, int pairs) {
  if (pairs == 2) return vcombine_u16(vld1_u16(r0 + k), vld1_u16(r1 + k));
  uint32_t x0, x1;
  memcpy(&x0, r0 + k, sizeof x0);
  memcpy(&x1, r1 + k, sizeof x1);
  return vreinterpretq_u16_u64(vcombine_u64(vcreate_u64(x0), vcreate_u64(x1)));
}

/* 4 pairs of a Bp row from `row`, of which `cols` (any int) are there; the
 * rest 0. */
static inline uint32x4_t b_cols(const uint32_t *row, int cols) {
  if (cols >= 4) return vld1q_u32(row);
  uint32_t t[4] = {0, 0, 0, 0};
  if (cols > 0) memcpy(t, row, sizeof(uint32_t) * (size_t)cols);
  return vld1q_u32(t);
}

/* 4 floats of a C row, `cols` (any int) of them there, the rest 0; and the
 * store of those only. */
static inline float32x4_t c_load(const float *c, int cols) {
  if (cols >= 4) return vld1q_f32(c);
  float t[4] = {0, 0, 0, 0};
  if (cols > 0) memcpy(t, c, sizeof(float) * (size_t)cols);
  return vld1q_f32(t);
}
static inline void c_store(float *c, float32x4_t v, int cols) {
  if (cols >= 4) {
    vst1q_f32(c, v);
    return;
  }
  float t[4];
  vst1q_f32(t, v);
  if (cols > 0) memcpy(c, t, sizeof(float) * (size_t)cols);
}

/* One group (pairs 2: pairs p, p + 1 of k; pairs 1: pair p alone, zeros
 * for p + 1 on both sides, so a NaN or inf never meets the padding) into
 * the 4 x 4 tiles. a[] holds the 8 row pointers. */
static inline __attribute__((always_inline)) void bf16_group(
    float32x4_t acc[4][4], const uint16_t *const a[BF16_MR], const uint32_t *restrict bp,
    int64_t ldb, int64_t p, int pairs, int cols) {
  const uint32x4_t z = vdupq_n_u32(0);
  const uint32_t *r0 = bp + p * ldb, *r1 = r0 + ldb;
  const uint32x4_t lo0 = b_cols(r0, cols), hi0 = b_cols(r0 + 4, cols - 4);
  const uint32x4_t lo1 = pairs == 2 ? b_cols(r1, cols) : z;
  const uint32x4_t hi1 = pairs == 2 ? b_cols(r1 + 4, cols - 4) : z;
  const uint16x8_t b[4] = {vreinterpretq_u16_u32(vzip1q_u32(lo0, lo1)), /* columns 0, 1 */
                           vreinterpretq_u16_u32(vzip2q_u32(lo0, lo1)), /* 2, 3 */
                           vreinterpretq_u16_u32(vzip1q_u32(hi0, hi1)),
                           vreinterpretq_u16_u32(vzip2q_u32(hi0, hi1))};
  for (int q = 0; q < 4; q++) {
    const uint16x8_t x = a_rows(a[2 * q], a[2 * q + 1], 2 * p, pairs);
    for (int c = 0; c < 4; c++) acc[q][c] = mmla_group(acc[q][c], x, b[c]);
  }
}

/* rows (<= 8) x cols (<= 8) of C over P pairs of k. Tile [q][c] holds rows
 * 2q, 2q + 1 and columns 2c, 2c + 1. A block of fewer rows computes its
 * missing rows on row 0 and stores only its own; missing columns are zero
 * pairs of B, never stored. */
static inline __attribute__((always_inline)) void bf16_block(
    int rows, int cols, int64_t P, const uint16_t *restrict A, int64_t lda,
    const uint32_t *restrict Bp, int64_t ldb, float *restrict C, int64_t ldc, int accumulate) {
  const uint16_t *a[BF16_MR];
  for (int r = 0; r < BF16_MR; r++) a[r] = A + (r < rows ? r : 0) * lda;
  float32x4_t acc[4][4];
  for (int q = 0; q < 4; q++)
    for (int h = 0; h < 2; h++) { /* columns 4h..4h+3 of rows 2q, 2q + 1 */
      const int n = cols - 4 * h;
      const float64x2_t x = vreinterpretq_f64_f32(
          accumulate && 2 * q < rows ? c_load(C + 2 * q * ldc + 4 * h, n) : vdupq_n_f32(0.0f));
      const float64x2_t y = vreinterpretq_f64_f32(accumulate && 2 * q + 1 < rows
                                                      ? c_load(C + (2 * q + 1) * ldc + 4 * h, n)
                                                      : vdupq_n_f32(0.0f));
      acc[q][2 * h] = vreinterpretq_f32_f64(vzip1q_f64(x, y));
      acc[q][2 * h + 1] = vreinterpretq_f32_f64(vzip2q_f64(x, y));
    }
  int64_t p = 0;
  for (; p + 2 <= P; p += 2) bf16_group(acc, a, Bp, ldb, p, 2, cols);
  if (p < P) bf16_group(acc, a, Bp, ldb, p, 1, cols);
  for (int q = 0; q < 4; q++)
    for (int h = 0; h < 2; h++) {
      const float64x2_t u = vreinterpretq_f64_f32(acc[q][2 * h]);
      const float64x2_t v = vreinterpretq_f64_f32(acc[q][2 * h + 1]);
      const int n = cols - 4 * h;
      if (2 * q < rows) c_store(C + 2 * q * ldc + 4 * h, vreinterpretq_f32_f64(vzip1q_f64(u, v)), n);
      if (2 * q + 1 < rows)
        c_store(C + (2 * q + 1) * ldc + 4 * h, vreinterpretq_f32_f64(vzip2q_f64(u, v)), n);
    }
}

void TG_NAME(mm_bf16_pairs)(int M, int N, int K, const uint16_t *restrict A,
                            int64_t lda, const uint32_t *restrict Bp, int64_t ldb,
                            float *restrict C, int64_t ldc, int accumulate) {
  const int64_t P = K / 2;
  for (int i = 0; i < M; i += BF16_MR) {
    const int rows = M - i < BF16_MR ? M - i : BF16_MR;
    const uint16_t *Ai = A + (int64_t)i * lda;
    float *Ci = C + (int64_t)i * ldc;
    for (int j = 0; j < N; j += BF16_NR) {
      if (rows == BF16_MR && N - j >= BF16_NR) /* whole blocks: every bound a constant */
        bf16_block(BF16_MR, BF16_NR, P, Ai, lda, Bp + j, ldb, Ci + j, ldc, accumulate);
      else
        bf16_block(rows, N - j < BF16_NR ? N - j : BF16_NR, P, Ai, lda, Bp + j, ldb, Ci + j,
                   ldc, accumulate);
    }
  }
}

/* 4 rows x 4 pairs per block through the 4 x 4 register transpose of
 * simd_neon.h; the edges pair by pair. Bits are moved, never computed on. */
void TG_NAME(pack_bf16_pairs)(int64_t nr, int64_t K, const uint16_t *restrict X,
                              int64_t lds, uint32_t *restrict Bp, int64_t ldb) {
  const int64_t P = K / 2, rb = nr - nr % 4, pb = P - P % 4;
  for (int64_t r = 0; r < rb; r += 4)
    for (int64_t p = 0; p < pb; p += 4) {
      float32x4_t m[4];
      for (int i = 0; i < 4; i++)
        m[i] = vreinterpretq_f32_u16(vld1q_u16(X + (r + i) * lds + 2 * p));
      transpose4_regs(m);
      for (int i = 0; i < 4; i++) vst1q_u32(Bp + (p + i) * ldb + r, vreinterpretq_u32_f32(m[i]));
    }
  for (int64_t r = 0; r < nr; r++)
    for (int64_t p = r < rb ? pb : 0; p < P; p++)
      memcpy(Bp + p * ldb + r, X + r * lds + 2 * p, sizeof(uint32_t));
}
