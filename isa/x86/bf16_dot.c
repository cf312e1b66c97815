/*
 * The bf16 dot-product GEMM of the avx512bf16 table (isa/arm/bf16_mmla.c is
 * FEAT_BF16's, x86/amx.c the amx table's); NULL in tables without a bf16
 * unit.
 *
 * vdpbf16ps takes 16 pairs of bf16 from each source and adds both products
 * of a pair to one f32 lane: acc[j] += a[2j] * b[2j] + a[2j+1] * b[2j+1].
 * The attention products Q.K^T and dO.V^T have bf16 operands on both sides,
 * so they run on it directly: A (Q or dO rows) is read in place, one 32-bit
 * pair broadcast per row, and B (K^T or V^T) is packed once per key tile as
 * 32-bit pairs along k (pack_bf16_pairs, x86/bf16_pairs.c), 32 columns per two loads.
 *
 * Numerics: the products of two bf16 are exact in f32 (8-bit significands);
 * the sums are rounded to f32 in pairs of k, as an FMA chain rounds each
 * step, so the error is that of f32 accumulation over K (the contract's
 * "f32 accumulation"). The instruction flushes subnormal inputs and
 * results to zero, below 1.2e-38.
 */
#include "common/build.h"

#if !defined(__AVX512BF16__)
#error "x86/bf16_dot.c is for tables built with -mavx512bf16 (isa/isa.cmake)"
#endif

static inline __m512 dp_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

static inline __m512i pair_at(const uint16_t *p) {
  uint32_t pair;
  memcpy(&pair, p, sizeof pair);
  return _mm512_set1_epi32((int32_t)pair);
}

/* rows (<= BF16_MR) x 32 columns of C, the columns of each half limited by
 * its lane mask (edge blocks). The 16 accumulators are named variables: an
 * array of them (acc[r][j]) was stored to the stack on every k by gcc 12.
 * A block of fewer rows computes its missing rows on row 0 and stores
 * only its own. */
static void bf16_block(int rows, int P, const uint16_t *restrict A, int64_t lda,
                       const uint32_t *restrict Bp, int64_t ldb, float *restrict C, int64_t ldc,
                       int accumulate, __mmask16 m0, __mmask16 m1) {
  int64_t off[BF16_MR]; /* element offset of each row's A (row 0 for rows past the edge) */
  for (int r = 0; r < BF16_MR; r++) off[r] = r < rows ? r * lda : 0;
#define TG_BF16_INIT(r)                                                                     \
  __m512 c##r##0 = accumulate && r < rows ? _mm512_maskz_loadu_ps(m0, C + r * ldc)         \
                                          : _mm512_setzero_ps();                          \
  __m512 c##r##1 = accumulate && r < rows ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16)    \
                                          : _mm512_setzero_ps();
  TG_BF16_INIT(0) TG_BF16_INIT(1) TG_BF16_INIT(2) TG_BF16_INIT(3)
  TG_BF16_INIT(4) TG_BF16_INIT(5) TG_BF16_INIT(6) TG_BF16_INIT(7)
#undef TG_BF16_INIT
  const uint16_t *a0 = A + off[0], *a1 = A + off[1], *a2 = A + off[2], *a3 = A + off[3];
  const uint16_t *a4 = A + off[4], *a5 = A + off[5], *a6 = A + off[6], *a7 = A + off[7];
  for (int p = 0; p < P; p++) {
    const __m512i b0 = _mm512_maskz_loadu_epi32(m0, Bp + (int64_t)p * ldb);
    const __m512i b1 = _mm512_maskz_loadu_epi32(m1, Bp + (int64_t)p * ldb + 16);
#define TG_BF16_STEP(r)                                \
  {                                                    \
    const __m512i x = pair_at(a##r + 2 * (int64_t)p);  \
    c##r##0 = dp_pairs(c##r##0, x, b0);                \
    c##r##1 = dp_pairs(c##r##1, x, b1);                \
  }
    TG_BF16_STEP(0) TG_BF16_STEP(1) TG_BF16_STEP(2) TG_BF16_STEP(3)
    TG_BF16_STEP(4) TG_BF16_STEP(5) TG_BF16_STEP(6) TG_BF16_STEP(7)
#undef TG_BF16_STEP
  }
#define TG_BF16_STORE(r)                                       \
  if (r < rows) {                                              \
    _mm512_mask_storeu_ps(C + r * ldc, m0, c##r##0);           \
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c##r##1);      \
  }
  TG_BF16_STORE(0) TG_BF16_STORE(1) TG_BF16_STORE(2) TG_BF16_STORE(3)
  TG_BF16_STORE(4) TG_BF16_STORE(5) TG_BF16_STORE(6) TG_BF16_STORE(7)
#undef TG_BF16_STORE
}
_Static_assert(BF16_MR == 8, "bf16_block names 8 rows of accumulators");

/* The lanes of a 16-lane half with `cols` (any int) columns left. */
static inline __mmask16 lanes_mask(int cols) {
  return cols >= 16 ? (__mmask16)0xFFFF : cols <= 0 ? (__mmask16)0 : (__mmask16)((1u << cols) - 1);
}

void TG_NAME(mm_bf16_pairs)(
    int M, int N, int K, const uint16_t *restrict A, int64_t lda,
    const uint32_t *restrict Bp, int64_t ldb, float *restrict C, int64_t ldc, int accumulate) {
  const int P = K / 2;
  for (int i = 0; i < M; i += BF16_MR) {
    const int rows = M - i < BF16_MR ? M - i : BF16_MR;
    for (int j = 0; j < N; j += 32)
      bf16_block(rows, P, A + (int64_t)i * lda, lda, Bp + j, ldb, C + (int64_t)i * ldc + j, ldc,
                 accumulate, lanes_mask(N - j), lanes_mask(N - j - 16));
  }
}
