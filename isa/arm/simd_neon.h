/*
 * NEON (AArch64 Advanced SIMD) blocks of isa/common/, for the
 * neon and neonbf16 tables (built with -DTG_ISA_WITH_NEON): the 16-float
 * Walsh-Hadamard block, the bf16 <-> f32 conversion blocks and the 4 x 4
 * transpose. The rest is isa/common/'s plain C, which gcc and clang vectorize
 * for the 32 128-bit registers (the portable table of an aarch64 build is
 * that plain C alone, with its own blocking).
 */
#include <arm_neon.h>

/* The 16 floats in four q registers. Stages len = 1, 2 act inside each
 * register as y[l] = x[l ^ len] + sgn(l) x[l] (a lane permute, an exact
 * multiply by the +-1 pattern, an add: the same bits as the plain
 * butterfly); stages 4 and 8 are butterflies between registers. */
static inline void fwht16_block(float *restrict x) {
  float32x4_t v[4];
  for (int i = 0; i < 4; i++) v[i] = vld1q_f32(x + 4 * i);
  const float32x4_t s1 = {1, -1, 1, -1}, s2 = {1, 1, -1, -1};
  for (int i = 0; i < 4; i++) {
    v[i] = vaddq_f32(vrev64q_f32(v[i]), vmulq_f32(s1, v[i]));     /* lanes 1, 0, 3, 2 */
    v[i] = vaddq_f32(vextq_f32(v[i], v[i], 2), vmulq_f32(s2, v[i])); /* lanes 2, 3, 0, 1 */
  }
  /* len 4: x[l] + x[l+4] | x[l] - x[l+4], inside each half of 8 */
  const float32x4_t a0 = vaddq_f32(v[0], v[1]), a1 = vsubq_f32(v[0], v[1]);
  const float32x4_t a2 = vaddq_f32(v[2], v[3]), a3 = vsubq_f32(v[2], v[3]);
  /* len 8 */
  vst1q_f32(x, vaddq_f32(a0, a2));
  vst1q_f32(x + 4, vaddq_f32(a1, a3));
  vst1q_f32(x + 8, vsubq_f32(a0, a2));
  vst1q_f32(x + 12, vsubq_f32(a1, a3));
}

/* bf16 <-> f32 on CVT_W lanes (common/rows.c's bf16_to_f32 / f32_to_bf16, and
 * common/bf16_pack.c): the bits of engine/bf16.h, narrowing to nearest even on the
 * integer lanes, any NaN -> 0x7FC0 (BFCVTN would need FEAT_BF16 and keeps
 * NaN payloads). */
enum { CVT_W = 8 };
static inline void bf16_widen_block(const uint16_t *restrict src, float *restrict dst) {
  const uint16x8_t h = vld1q_u16(src);
  vst1q_f32(dst, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
  vst1q_f32(dst + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
}
static inline uint16x4_t bf16_rne4(float32x4_t v) {
  const uint32x4_t u = vreinterpretq_u32_f32(v);
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  const uint16x4_t r = vaddhn_u32(u, vaddq_u32(odd, vdupq_n_u32(0x7FFF))); /* (u + ...) >> 16 */
  return vbsl_u16(vmovn_u32(vceqq_f32(v, v)), r, vdup_n_u16(0x7FC0));
}
static inline void bf16_narrow_block(const float *restrict src, uint16_t *restrict dst) {
  vst1q_u16(dst, vcombine_u16(bf16_rne4(vld1q_f32(src)), bf16_rne4(vld1q_f32(src + 4))));
}

/* 4 rows of 4 32-bit lanes, transposed in registers: trn pairs lanes of
 * neighbouring rows, zip on 64-bit halves pairs the rows two apart. Lanes
 * are moved, never computed on: any bits pass (the pair packing of x86/bf16_pairs.c and arm/bf16_mmla.c
 * uses it too). */
static inline void transpose4_regs(float32x4_t m[4]) {
  const float32x4_t t0 = vtrn1q_f32(m[0], m[1]), t1 = vtrn2q_f32(m[0], m[1]); /* a0 b0 a2 b2, a1 b1 a3 b3 */
  const float32x4_t t2 = vtrn1q_f32(m[2], m[3]), t3 = vtrn2q_f32(m[2], m[3]);
  const float64x2_t d0 = vreinterpretq_f64_f32(t0), d1 = vreinterpretq_f64_f32(t1);
  const float64x2_t d2 = vreinterpretq_f64_f32(t2), d3 = vreinterpretq_f64_f32(t3);
  m[0] = vreinterpretq_f32_f64(vzip1q_f64(d0, d2)); /* a0 b0 c0 d0 */
  m[1] = vreinterpretq_f32_f64(vzip1q_f64(d1, d3));
  m[2] = vreinterpretq_f32_f64(vzip2q_f64(d0, d2));
  m[3] = vreinterpretq_f32_f64(vzip2q_f64(d1, d3));
}

/* Transpose blocks of TB x TB floats. No streaming stores: AArch64 cores
 * that see whole lines written in sequence stop reading them for ownership
 * on their own (the write-streaming mode of the Cortex-A / Neoverse cores),
 * and STNP is only a hint; so transpose_can_stream says no and the row ops
 * take their ordinary loops (STREAM_STORES = 0). */
enum { TB = 4 };
static inline int transpose_can_stream(const float *dst, int64_t ldd) {
  (void)dst, (void)ldd;
  return 0;
}
static inline void transpose_block(const float *restrict src, int64_t lds, float *restrict dst,
                                   int64_t ldd, int stream) {
  (void)stream;
  float32x4_t m[4];
  for (int i = 0; i < 4; i++) m[i] = vld1q_f32(src + i * lds);
  transpose4_regs(m);
  for (int i = 0; i < 4; i++) vst1q_f32(dst + i * ldd, m[i]);
}
static inline void stream_fence(void) {}
enum { STREAM_STORES = 0 };
static inline void stream16(float *dst, const float *v) {
  for (int l = 0; l < 16; l++) dst[l] = v[l];
}
