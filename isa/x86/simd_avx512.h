/*
 * AVX-512 blocks of isa/common/, where plain C does not reach the
 * target: the 16-float Walsh-Hadamard block, the 16 x 16 transpose and,
 * where the compiler targets AVX512_BF16, the vdpbf16ps GEMM
 * (isa/x86/bf16_dot.c).
 * (Intrinsics rather than vector extensions: they build with gcc and clang
 * alike, and the fuzzer builds with clang.)
 */
#include <immintrin.h>

/* The mask of the first n of 16 lanes (all of them from 16 on): a row's
 * last, partial vector in the masked loads and stores of isa/common/. */
static inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* One zmm per block: per stage a permute (x[l ^ len]), a multiply by the
 * +-1 pattern (exact) and an add. */
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

/* bf16 <-> f32 on CVT_W lanes (common/rows.c's bf16_to_f32 / f32_to_bf16, and
 * common/bf16_pack.c): written out because gcc 13 leaves the plain loops scalar
 * (a 20-30x slower load of every attention tile than gcc 12's vector loop,
 * measured on the lent Xeon). Narrowing rounds to nearest even on the
 * integer lanes, NaN -> 0x7FC0: the bits of engine/bf16.h. */
enum { CVT_W = 16 };
static inline void bf16_widen_block(const uint16_t *restrict src, float *restrict dst) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
  _mm512_storeu_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
}
static inline __m512i bf16_rne_lanes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7FC0));
}
static inline void bf16_narrow_block(const float *restrict src, uint16_t *restrict dst) {
  _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(bf16_rne_lanes(_mm512_loadu_ps(src))));
}

/* The bf16 part of one-part operands (common/bf16_pack.c's split, and
 * common/rows.c's attn_exp_sum_bf16_row, which must give its bits): */
#if defined(__AVX512BF16__)
/* 16 lanes to bf16 by vcvtneps2bf16 (nearest even, as bf16_rne_lanes, in
 * one instruction instead of seven), NaN made 0x7FC0 as there. It reads
 * and writes subnormals as 0: a part of x that would be subnormal (|x| <
 * 2^-126, or a remainder that small) is 0, which is what the bf16 dot
 * products (vdpbf16ps, TDPBF16PS) read a subnormal part as. The parts'
 * products are those of the bf16_rne parts, but where a subnormal x
 * rounds up to 2^-126 (docs/KERNELS.md's bound: 2^-126 per operand). */
static inline __m256i bf16_lanes(__m512 v, const int any_nan) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
  if (!any_nan) return h;
  return _mm256_mask_mov_epi16(h, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm256_set1_epi16(0x7FC0));
}
#else
static inline __m256i bf16_lanes(__m512 v, const int any_nan) {
  (void)any_nan;
  return _mm512_cvtepi32_epi16(bf16_rne_lanes(v));
}
#endif

/* Transpose blocks of TB x TB floats; streaming needs each block row to be a
 * whole 64-byte line. */
enum { TB = 16 };
static inline int transpose_can_stream(const float *dst, int64_t ldd) {
  return (uintptr_t)dst % 64 == 0 && ldd % 16 == 0;
}

/* 16 rows of 16 32-bit lanes in 16 zmm, transposed in registers by 4 stages
 * of two-source permutes (stage b swaps bit b of the row index with bit b
 * of the column index). Lanes are moved, never computed on: any bits pass. */
static inline void transpose16_regs(__m512 m[16]) {
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
}

static inline void transpose_block(const float *restrict src, int64_t lds, float *restrict dst,
                                   int64_t ldd, int stream) {
  __m512 m[16];
  for (int i = 0; i < 16; i++) m[i] = _mm512_loadu_ps(src + i * lds);
  transpose16_regs(m);
  if (stream)
    for (int i = 0; i < 16; i++) _mm512_stream_ps(dst + i * ldd, m[i]);
  else
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, m[i]);
}

static inline void stream_fence(void) { _mm_sfence(); }

/* dst[0:16] = v[0:16] with one non-temporal store (dst 64-byte aligned): the
 * line goes to memory without being read first (no read-for-ownership). */
enum { STREAM_STORES = 1 };
static inline void stream16(float *dst, const float *v) {
  _mm512_stream_ps(dst, _mm512_loadu_ps(v));
}
