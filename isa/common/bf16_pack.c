/*
 * Operand packing of the attention's precision modes (TG_ATTN_PRECISION_
 * SPLIT and _BF16; tg_attn_products in kernels/attention.h): the f32
 * probabilities P and score gradients dS become one to three bf16 parts,
 * as the A (rows) or the B (row pairs) operand of mm_bf16_pairs, and the
 * bf16 rows of K, V, Q and dO become its B layout (pairs along the
 * reduction). Plain C on every table, with AVX-512's masked lanes where it
 * has them.
 */
#include "build.h"

/* One or two parts: hi = bf16(x); lo = bf16(x - hi), 0 where hi is not
 * finite (x - hi would be NaN for x = inf, and inf - inf for an x that
 * rounds up to inf). Three (exact mode): by truncation, hi = x's high half,
 * lo = (x - hi)'s, lo2 = x - hi - lo: each remainder is exact in f32, x -
 * hi has at most 16 significant bits, x - hi - lo at most 8, which lo2
 * holds (bf16's 8) except where it is subnormal; no rounding, so the
 * vector code is a few masks and subtractions, and the 16-bit halves move
 * two vectors at a time (the 2-core Xeon: a 32 x 512 tile 3.2 -> 2.2 us in
 * rows, 4.4 -> 3.3 transposed, 3.8 -> 1.9 in row pairs; exact mode's
 * backward took 0.89-0.98 the time, the forward 0.95-0.99,
 * bench/results/xeon2-amx/ab-split3-truncated.txt). n: the parts wanted,
 * 1 to 3 (a constant where inlined). */
#if defined(__AVX512F__)
static inline __m512 bf16_lanes_widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Three parts by truncation, as f32 lanes whose low 16 bits are 0 (the
 * bf16 in the high half): hi = x's high half, lo = (x - hi)'s, lo2 = x -
 * hi - lo (exact: at most 8 significant bits); a NaN's hi made quiet (so
 * it stays a NaN), lo and lo2 0 where x is not finite. */
static inline __attribute__((always_inline)) void split3_high_halves(__m512 v, __m512i part[3]) {
  const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
  const __mmask16 nan = _mm512_fpclass_ps_mask(v, 0x81), inf = _mm512_fpclass_ps_mask(v, 0x18);
  const __m512i hi = _mm512_and_si512(_mm512_castps_si512(v), high);
  const __m512 r1 = _mm512_maskz_sub_ps((__mmask16)~(nan | inf), v, _mm512_castsi512_ps(hi));
  const __m512i lo = _mm512_and_si512(_mm512_castps_si512(r1), high);
  part[0] = _mm512_mask_or_epi32(hi, nan, hi, _mm512_set1_epi32(0x00400000));
  part[1] = lo;
  part[2] = _mm512_castps_si512(_mm512_sub_ps(r1, _mm512_castsi512_ps(lo)));
}

/* The three parts of 32 lanes, v0's 16 then v1's, 32 bf16 per part: the
 * two vectors' high halves into one register by a permute. */
static inline __attribute__((always_inline)) void split3_lanes32(__m512 v0, __m512 v1,
                                                                 __m512i part[3]) {
  const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35,
                                       33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3,
                                       1);
  __m512i p0[3], p1[3];
  split3_high_halves(v0, p0);
  split3_high_halves(v1, p1);
  for (int k = 0; k < 3; k++) part[k] = _mm512_permutex2var_epi16(p0[k], odd, p1[k]);
}

/* One or two parts of 16 lanes, 16 bf16 each (bf16_lanes); three parts
 * take split3_high_halves. */
static inline __attribute__((always_inline)) void split_lanes(__m512 v, __m256i part[2],
                                                              const int n) {
  part[0] = bf16_lanes(v, 1);
  if (n < 2) return;
  const __mmask16 finite = _mm256_cmpneq_epi16_mask(
      _mm256_and_si256(part[0], _mm256_set1_epi16(0x7F80)), _mm256_set1_epi16(0x7F80));
  const __m512 r1 = _mm512_maskz_sub_ps(finite, v, bf16_lanes_widen(part[0])); /* exact */
  part[1] = bf16_lanes(r1, 0);
}

/* A row x of cols in 16-lane steps (three parts: 32) -> out[k] + at..
 * (16-bit stores). */
static inline __attribute__((always_inline)) void split_row(const float *restrict x,
                                                            int64_t cols, uint16_t *out[3],
                                                            int64_t at, const int n) {
  if (n == 3) {
    for (int64_t c = 0; c < cols; c += 32) {
      const __mmask16 m0 = first_lanes(cols - c), m1 = cols - c > 16 ? first_lanes(cols - c - 16) : 0;
      __m512i part[3];
      split3_lanes32(_mm512_maskz_loadu_ps(m0, x + c), _mm512_maskz_loadu_ps(m1, x + c + 16), part);
      const __mmask32 m = (__mmask32)m0 | (__mmask32)m1 << 16;
      for (int k = 0; k < 3; k++) _mm512_mask_storeu_epi16(out[k] + at + c, m, part[k]);
    }
    return;
  }
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    __m256i part[3];
    split_lanes(_mm512_maskz_loadu_ps(m, x + c), part, n);
    for (int k = 0; k < n; k++) _mm256_mask_storeu_epi16(out[k] + at + c, m, part[k]);
  }
}

/* Rows x0 and x1 (NULL: zeros) -> the pairs out[k] + at (32-bit stores). */
static inline __attribute__((always_inline)) void split_pair_row(
    const float *restrict x0, const float *restrict x1, int64_t cols, uint32_t *out[3],
    int64_t at, const int n) {
  if (n == 3) { /* a pair: row x0's high half down, row x1's in place */
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      __m512i p0[3], p1[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      split3_high_halves(_mm512_maskz_loadu_ps(m, x0 + c), p0);
      if (x1) split3_high_halves(_mm512_maskz_loadu_ps(m, x1 + c), p1);
      for (int k = 0; k < 3; k++)
        _mm512_mask_storeu_epi32(out[k] + at + c, m,
                                 _mm512_ternarylogic_epi32(_mm512_srli_epi32(p0[k], 16), p1[k],
                                                           high, 0xF8)); /* a | (b & c) */
    }
    return;
  }
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m = first_lanes(cols - c);
    __m256i lo_half[3], hi_half[3] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                      _mm256_setzero_si256()};
    split_lanes(_mm512_maskz_loadu_ps(m, x0 + c), lo_half, n);
    if (x1) split_lanes(_mm512_maskz_loadu_ps(m, x1 + c), hi_half, n);
    /* word j of the pair lanes: lo_half[j / 2] or hi_half[j / 2] */
    const __m512i interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0);
    for (int k = 0; k < n; k++)
      _mm512_mask_storeu_epi32(
          out[k] + at + c, m,
          _mm512_permutexvar_epi16(
              interleave, _mm512_inserti64x4(_mm512_castsi256_si512(lo_half[k]), hi_half[k], 1)));
  }
}
#else
/* One element's parts (build.h's element conversions). */
static inline __attribute__((always_inline)) void split_elem(float x, uint16_t part[3],
                                                             const int n) {
  if (n == 3) { /* split3_high_halves' parts, one element */
    uint32_t u, r;
    memcpy(&u, &x, sizeof u);
    const int nan = (u & 0x7FFFFFFFu) > 0x7F800000u, inf = (u & 0x7FFFFFFFu) == 0x7F800000u;
    const uint16_t hi = (uint16_t)(u >> 16);
    const float r1 = nan || inf ? 0.0f : x - bf16_widen(hi);
    memcpy(&r, &r1, sizeof r);
    const uint16_t lo = (uint16_t)(r >> 16);
    const float r2 = r1 - bf16_widen(lo);
    memcpy(&r, &r2, sizeof r);
    part[0] = (uint16_t)(hi | (nan ? 0x40u : 0u));
    part[1] = lo;
    part[2] = (uint16_t)(r >> 16);
    return;
  }
  const uint16_t h = bf16_rne(x);
  part[0] = h;
  if (n < 2) return;
  const int finite = (h & 0x7F80u) != 0x7F80u;
  const float r1 = finite ? x - bf16_widen(h) : 0.0f; /* x - hi is exact */
  part[1] = bf16_rne(r1);
  if (n < 3) return;
  part[2] = bf16_rne(r1 - bf16_widen(part[1]));
}

static inline __attribute__((always_inline)) void split_row(const float *restrict x,
                                                            int64_t cols, uint16_t *out[3],
                                                            int64_t at, const int n) {
  uint16_t *restrict o0 = out[0] + at, *restrict o1 = n > 1 ? out[1] + at : NULL,
                     *restrict o2 = n > 2 ? out[2] + at : NULL;
#pragma omp simd
  for (int64_t c = 0; c < cols; c++) {
    uint16_t part[3];
    split_elem(x[c], part, n);
    o0[c] = part[0];
    if (n > 1) o1[c] = part[1];
    if (n > 2) o2[c] = part[2];
  }
}

/* (x1 is tested inside the loop: -O3 unswitches it, and both loops
 * vectorize.) */
static inline __attribute__((always_inline)) void split_pair_row(
    const float *restrict x0, const float *restrict x1, int64_t cols, uint32_t *out[3],
    int64_t at, const int n) {
  uint32_t *restrict o0 = out[0] + at, *restrict o1 = n > 1 ? out[1] + at : NULL,
                     *restrict o2 = n > 2 ? out[2] + at : NULL;
#pragma omp simd
  for (int64_t c = 0; c < cols; c++) {
    uint16_t a[3], b[3] = {0, 0, 0};
    split_elem(x0[c], a, n);
    if (x1) split_elem(x1[c], b, n);
    o0[c] = a[0] | (uint32_t)b[0] << 16;
    if (n > 1) o1[c] = a[1] | (uint32_t)b[1] << 16;
    if (n > 2) o2[c] = a[2] | (uint32_t)b[2] << 16;
  }
}

#endif

#if defined(__AVX512F__)
/* split_transposed's three parts: 32 x 16 blocks, each half transposed in
 * registers, a column's 32 rows made and stored at once (split3_lanes32). */
static void split3_transposed(int64_t rows, int64_t cols, const float *restrict src, int64_t lds,
                              uint16_t *out[3], int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 32)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int nr = rows - r0 < 32 ? (int)(rows - r0) : 32;
      const int nc = cols - c0 < 16 ? (int)(cols - c0) : 16;
      const __mmask16 cm = first_lanes(nc);
      const __mmask32 rm = nr + nr % 2 >= 32 ? 0xFFFFFFFFu : (1u << (nr + nr % 2)) - 1;
      __m512 t[2][16];
      for (int h = 0; h < 2; h++) {
        for (int r = 0; r < 16; r++)
          t[h][r] = 16 * h + r < nr ? _mm512_maskz_loadu_ps(cm, src + (r0 + 16 * h + r) * lds + c0)
                                   : _mm512_setzero_ps();
        transpose16_regs(t[h]);
      }
      for (int c = 0; c < nc; c++) {
        __m512i part[3];
        split3_lanes32(t[0][c], t[1][c], part);
        for (int k = 0; k < 3; k++) _mm512_mask_storeu_epi16(out[k] + (c0 + c) * ldd + r0, rm, part[k]);
      }
    }
}
#endif

/* 16 x 16 blocks, transposed in registers where AVX-512 has them, else
 * through a buffer; rows past `rows` read as 0, which pads an odd count. */
static inline __attribute__((always_inline)) void split_transposed(
    int64_t rows, int64_t cols, const float *restrict src, int64_t lds, uint16_t *out[3],
    int64_t ldd, const int n) {
#if defined(__AVX512F__)
  if (n == 3) {
    split3_transposed(rows, cols, src, lds, out, ldd);
    return;
  }
#endif
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int nr = rows - r0 < 16 ? (int)(rows - r0) : 16;
      const int nc = cols - c0 < 16 ? (int)(cols - c0) : 16;
#if defined(__AVX512F__)
      __m512 t[16];
      const __mmask16 cm = first_lanes(nc), rm = first_lanes(nr + nr % 2);
      for (int r = 0; r < 16; r++)
        t[r] = r < nr ? _mm512_maskz_loadu_ps(cm, src + (r0 + r) * lds + c0) : _mm512_setzero_ps();
      transpose16_regs(t);
      for (int c = 0; c < nc; c++) {
        __m256i part[3];
        split_lanes(t[c], part, n);
        for (int k = 0; k < n; k++) _mm256_mask_storeu_epi16(out[k] + (c0 + c) * ldd + r0, rm, part[k]);
      }
#else
      float t[16][16];
      for (int c = 0; c < 16; c++)
        for (int r = 0; r < 16; r++)
          t[c][r] = r < nr && c < nc ? src[(r0 + r) * lds + c0 + c] : 0.0f;
      for (int c = 0; c < nc; c++) split_row(t[c], nr + nr % 2, out, (c0 + c) * ldd + r0, n);
#endif
    }
}

/* f32_to_bf16_split with n parts (inlined once per count: a test of the
 * count inside the row loops keeps them scalar). */
static inline __attribute__((always_inline)) void split_block(
    int64_t rows, int64_t cols, const float *restrict src, int64_t lds, int layout,
    uint16_t *out[3], int64_t ldd, const int n) {
  if (layout == TG_SPLIT_TRANSPOSED) {
    split_transposed(rows, cols, src, lds, out, ldd, n);
    return;
  }
  if (layout == TG_SPLIT_ROWS) {
    for (int64_t r = 0; r < rows; r++) {
      split_row(src + r * lds, cols, out, r * ldd, n);
      if (cols % 2)
        for (int k = 0; k < n; k++) out[k][r * ldd + cols] = 0;
    }
    return;
  }
  uint32_t *pairs[3];
  for (int k = 0; k < 3; k++) pairs[k] = (uint32_t *)(void *)out[k];
  for (int64_t p = 0; 2 * p < rows; p++)
    split_pair_row(src + 2 * p * lds, 2 * p + 1 < rows ? src + (2 * p + 1) * lds : NULL, cols,
                   pairs, p * ldd, n);
}

void TG_NAME(f32_to_bf16_split)(int64_t rows, int64_t cols, const float *restrict src,
                                int64_t lds, int layout, uint16_t *restrict hi,
                                uint16_t *restrict lo, uint16_t *restrict lo2, int64_t ldd) {
  uint16_t *out[3] = {hi, lo, lo ? lo2 : NULL};
  if (!out[1])
    split_block(rows, cols, src, lds, layout, out, ldd, 1);
  else if (!out[2])
    split_block(rows, cols, src, lds, layout, out, ldd, 2);
  else
    split_block(rows, cols, src, lds, layout, out, ldd, 3);
}

void TG_NAME(pack_bf16_row_pairs)(int64_t nr, int64_t ncols, const uint16_t *restrict X,
                                  int64_t lds, uint32_t *restrict Bp, int64_t ldb) {
  for (int64_t p = 0; 2 * p < nr; p++) {
    const uint16_t *restrict a = X + 2 * p * lds, *restrict b = a + lds;
    uint32_t *restrict dst = Bp + p * ldb;
    if (2 * p + 1 < nr) {
#pragma omp simd
      for (int64_t j = 0; j < ncols; j++) dst[j] = (uint32_t)a[j] | (uint32_t)b[j] << 16;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < ncols; j++) dst[j] = a[j];
    }
  }
}
