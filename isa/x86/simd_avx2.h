/*
 * AVX2 blocks of isa/common/, where plain C does not reach the
 * target: the 16-float Walsh-Hadamard block and the 8 x 8 transpose.
 */
#include <immintrin.h>

/* bf16 <-> f32 on CVT_W lanes, written out as simd_avx512.h's (gcc 13
 * leaves the plain loops scalar); the same bits as engine/bf16.h. */
enum { CVT_W = 8 };
static inline void bf16_widen_block(const uint16_t *restrict src, float *restrict dst) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
  _mm256_storeu_ps(dst, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
}
static inline void bf16_narrow_block(const float *restrict src, uint16_t *restrict dst) {
  const __m256 v = _mm256_loadu_ps(src);
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0),
                         _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  /* 32 -> 16 bits (every lane <= 0xFFFF): packus works per 128-bit half */
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p));
}

/* The 16 floats in two ymm. Stages len = 1, 2, 4 act inside each ymm as
 * y[l] = x[l ^ len] + sgn(l) x[l] (a lane permute, an exact multiply by the
 * +-1 pattern, an add: each output is one rounding of x[l] + x[l^len] or
 * x[l^len] - x[l], the same bits as the plain butterfly); stage 8 is the
 * butterfly between the two ymm. */
static inline void fwht16_block(float *restrict x) {
  __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
  const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
  const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
  const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
  /* len 1: swap neighbours (imm 0xB1 = lanes 1,0,3,2 in each 128-bit half) */
  a = _mm256_add_ps(_mm256_permute_ps(a, 0xB1), _mm256_mul_ps(s1, a));
  b = _mm256_add_ps(_mm256_permute_ps(b, 0xB1), _mm256_mul_ps(s1, b));
  /* len 2: swap pairs (imm 0x4E = lanes 2,3,0,1) */
  a = _mm256_add_ps(_mm256_permute_ps(a, 0x4E), _mm256_mul_ps(s2, a));
  b = _mm256_add_ps(_mm256_permute_ps(b, 0x4E), _mm256_mul_ps(s2, b));
  /* len 4: swap the 128-bit halves */
  a = _mm256_add_ps(_mm256_permute2f128_ps(a, a, 0x01), _mm256_mul_ps(s4, a));
  b = _mm256_add_ps(_mm256_permute2f128_ps(b, b, 0x01), _mm256_mul_ps(s4, b));
  /* len 8: x[l] + x[l+8] | x[l] - x[l+8] */
  _mm256_storeu_ps(x, _mm256_add_ps(a, b));
  _mm256_storeu_ps(x + 8, _mm256_sub_ps(a, b));
}

/* Transpose blocks of TB x TB floats; streaming needs 32-byte aligned block
 * rows (two neighbouring blocks fill a 64-byte line back to back). */
enum { TB = 8 };
static inline int transpose_can_stream(const float *dst, int64_t ldd) {
  return (uintptr_t)dst % 32 == 0 && ldd % 8 == 0;
}

/* 8 rows in 8 ymm: interleave pairs of rows, then pairs of pairs, then swap
 * 128-bit halves (the classic unpack / shuffle / permute2f128 network). */
static inline void transpose_block(const float *restrict src, int64_t lds, float *restrict dst,
                                   int64_t ldd, int stream) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; h++) {
      r[i + h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0x44);     /* a b c d, col 0|4 (h=0) */
      r[i + h + 2] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], 0xEE); /* col 1|5 (h=0) */
    }
  /* r[0] = cols 0|4 of rows 0-3, r[2] = cols 1|5, r[1] = cols 2|6, r[3] = cols 3|7;
   * likewise r[4..7] for rows 4-7 */
  static const int col_of[4] = {0, 2, 1, 3};
  for (int k = 0; k < 4; k++) {
    const int c = col_of[k];
    const __m256 lo = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20); /* col c   */
    const __m256 hi = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31); /* col c+4 */
    if (stream) {
      _mm256_stream_ps(dst + c * ldd, lo);
      _mm256_stream_ps(dst + (c + 4) * ldd, hi);
    } else {
      _mm256_storeu_ps(dst + c * ldd, lo);
      _mm256_storeu_ps(dst + (c + 4) * ldd, hi);
    }
  }
}

static inline void stream_fence(void) { _mm_sfence(); }

/* dst[0:16] = v[0:16] with two non-temporal stores filling one 64-byte line
 * (dst 64-byte aligned): no read-for-ownership of the line. */
enum { STREAM_STORES = 1 };
static inline void stream16(float *dst, const float *v) {
  _mm256_stream_ps(dst, _mm256_loadu_ps(v));
  _mm256_stream_ps(dst + 8, _mm256_loadu_ps(v + 8));
}
