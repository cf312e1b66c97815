/*
 * Operand packing of the attention's precision modes (TG_ATTN_PRECISION_
 * SPLIT and _BF16; tg_attn_products in kernels/attention.h): the f32
 * probabilities P and score gradients dS become bf16 rows, or bf16 hi + lo
 * pairs, in the A
 * layout mm_bf16_pairs reads, and the bf16 rows of K, V, Q and dO become its
 * B layout (pairs along the reduction). Plain C on every table, with the
 * 16 x 16 register transpose where AVX-512 has one.
 */
#include "build.h"

/* hi = bf16(x); lo = bf16(x - hi); lo2 = bf16(x - hi - lo); lo and lo2 0
 * where hi is not finite (x - hi would be NaN for x = inf, and inf - inf
 * for an x that rounds up to inf). Each remainder is exact in f32, and
 * three parts hold every f32 exactly: x - hi has at most 16 significant
 * bits, x - hi - lo at most 8, which lo2 holds (bf16's 8), except where it
 * is subnormal. lo NULL: hi only; lo2 NULL: hi and lo. */
#if defined(__AVX512F__)
/* On 16 lanes (those of `m`) of a register, with the rounding of
 * simd_avx512.h's bf16_rne_lanes. */
static inline void split_lanes(__m512 v, __mmask16 m, uint16_t *restrict hi,
                               uint16_t *restrict lo, uint16_t *restrict lo2) {
  const __m512i h = bf16_rne_lanes(v);
  _mm256_mask_storeu_epi16(hi, m, _mm512_cvtepi32_epi16(h));
  if (!lo) return;
  const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  const __mmask16 finite = _mm512_cmpneq_epi32_mask(
      _mm512_and_si512(h, _mm512_set1_epi32(0x7F80)), _mm512_set1_epi32(0x7F80));
  const __m512 r1 = _mm512_maskz_sub_ps(finite, v, hf); /* v - hf is exact */
  const __m512i l = bf16_rne_lanes(r1);
  _mm256_mask_storeu_epi16(lo, m, _mm512_cvtepi32_epi16(l));
  if (!lo2) return;
  const __m512 lf = _mm512_castsi512_ps(_mm512_slli_epi32(l, 16));
  _mm256_mask_storeu_epi16(lo2, m, _mm512_cvtepi32_epi16(bf16_rne_lanes(_mm512_sub_ps(r1, lf))));
}

static inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}
#else
/* On a row of n. (One loop per part count: a test of lo inside one keeps it
 * scalar.) */
static inline __attribute__((always_inline)) void split_row(const float *restrict x, int64_t n,
                                                            uint16_t *restrict hi,
                                                            uint16_t *restrict lo,
                                                            uint16_t *restrict lo2) {
  if (!lo) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) hi[i] = bf16_rne(x[i]);
    return;
  }
  if (!lo2) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      const uint16_t h = bf16_rne(x[i]); /* build.h's element conversions */
      const uint16_t l = bf16_rne(x[i] - bf16_widen(h)); /* x - hi is exact */
      hi[i] = h;
      lo[i] = (uint16_t)((h & 0x7F80u) == 0x7F80u ? 0u : l);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const uint16_t h = bf16_rne(x[i]);
    const int finite = (h & 0x7F80u) != 0x7F80u;
    const float r1 = finite ? x[i] - bf16_widen(h) : 0.0f;
    const uint16_t l = bf16_rne(r1);
    hi[i] = h;
    lo[i] = l;
    lo2[i] = bf16_rne(r1 - bf16_widen(l));
  }
}
#endif

void TG_NAME(f32_to_bf16_split)(int64_t rows, int64_t cols, const float *restrict src,
                                int64_t lds, int transpose, uint16_t *restrict hi,
                                uint16_t *restrict lo, uint16_t *restrict lo2, int64_t ldd) {
  if (!lo) lo2 = NULL;
  if (!transpose) {
    for (int64_t r = 0; r < rows; r++) {
#if defined(__AVX512F__)
      for (int64_t c = 0; c < cols; c += 16) {
        const __mmask16 m = first_lanes(cols - c);
        split_lanes(_mm512_maskz_loadu_ps(m, src + r * lds + c), m, hi + r * ldd + c,
                    lo ? lo + r * ldd + c : NULL, lo2 ? lo2 + r * ldd + c : NULL);
      }
#else
      split_row(src + r * lds, cols, hi + r * ldd, lo ? lo + r * ldd : NULL,
                lo2 ? lo2 + r * ldd : NULL);
#endif
      if (cols % 2) {
        hi[r * ldd + cols] = 0;
        if (lo) lo[r * ldd + cols] = 0;
        if (lo2) lo2[r * ldd + cols] = 0;
      }
    }
    return;
  }
  /* 16 x 16 blocks; rows past `rows` read as 0, which pads an odd count */
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int nr = rows - r0 < 16 ? (int)(rows - r0) : 16;
      const int nc = cols - c0 < 16 ? (int)(cols - c0) : 16;
      const int n = nr + (nr % 2);
#if defined(__AVX512F__)
      __m512 t[16];
      const __mmask16 cm = first_lanes(nc), rm = first_lanes(n);
      for (int r = 0; r < 16; r++)
        t[r] = r < nr ? _mm512_maskz_loadu_ps(cm, src + (r0 + r) * lds + c0) : _mm512_setzero_ps();
      transpose16_regs(t);
      for (int c = 0; c < nc; c++) {
        const int64_t d = (c0 + c) * ldd + r0;
        split_lanes(t[c], rm, hi + d, lo ? lo + d : NULL, lo2 ? lo2 + d : NULL);
      }
#else
      float t[16][16];
      for (int c = 0; c < 16; c++)
        for (int r = 0; r < 16; r++)
          t[c][r] = r < nr && c < nc ? src[(r0 + r) * lds + c0 + c] : 0.0f;
      for (int c = 0; c < nc; c++) {
        const int64_t d = (c0 + c) * ldd + r0;
        split_row(t[c], n, hi + d, lo ? lo + d : NULL, lo2 ? lo2 + d : NULL);
      }
#endif
    }
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
