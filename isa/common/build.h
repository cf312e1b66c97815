/*
 * What every file of one ISA's build shares. CMake compiles the files of isa/common/
 * and the ISA's own sources (isa/isa.cmake) with that ISA's flags and
 * -DTG_ISA_SUFFIX=<name>; each function here is named with the suffix
 * (mm_nn_avx2, ...) and isa/common/table.c points the table at them.
 *
 * The loops are plain C, shaped so the compiler vectorizes the innermost one
 * (contiguous j) and keeps several rows in flight; explicit lane-parallel
 * partial sums stand in for the simd_sum of a Metal simdgroup. What plain C
 * does not reach comes from simd_<isa>.h (chosen below by the compiler's
 * own target macros, so a build cannot pair one ISA's blocks with another's
 * instructions); the blocking from isa/tuning.h.
 */
#ifndef TG_ISA_BUILD_H
#define TG_ISA_BUILD_H

#include <stdint.h>
#include <string.h>

#include "ops.h"
#include "reduce.h"
#include "tuning.h"

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

_Static_assert(LANES == 16, "the row reductions end in tg_lane_tree16 (isa/reduce.h)");

/* One element each way, branch-free (engine/bf16.h's bits: RNE, any NaN ->
 * 0x7FC0), for the conversion loops of common/rows.c and common/bf16_pack.c;
 * the simd_<isa>.h blocks take whole vectors. */
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


/* The functions of one ISA's build, as the table (common/table.c) lists
 * them; isa/ops.h says what each computes. Hidden: only the table is
 * exported. */
#pragma GCC visibility push(hidden)
/* common/gemm.c */
void TG_NAME(mm_nn)(int M, int N, int K, const float *restrict A, int64_t lda,
                    const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc,
                    int accumulate);
void TG_NAME(mm_tn_acc)(int M, int N, int K, const float *restrict A, int64_t lda,
                        const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc);
/* common/bf16_pack.c */
void TG_NAME(f32_to_bf16_split)(int64_t rows, int64_t cols, const float *restrict src,
                                int64_t lds, int layout, uint16_t *restrict hi,
                                uint16_t *restrict lo, uint16_t *restrict lo2, int64_t ldd);
void TG_NAME(pack_bf16_row_pairs)(int64_t nr, int64_t ncols, const uint16_t *restrict X,
                                  int64_t lds, uint32_t *restrict Bp, int64_t ldb);
/* common/rows.c */
void TG_NAME(bf16_to_f32)(const uint16_t *restrict src, float *restrict dst, int64_t n);
void TG_NAME(f32_to_bf16)(const float *restrict src, uint16_t *restrict dst, int64_t n);
float TG_NAME(dot_bf16)(const uint16_t *restrict a, const uint16_t *restrict b, int64_t n);
void TG_NAME(exp_f32)(const float *x, float *y, int64_t n);
void TG_NAME(attn_score_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                             const void *restrict mask, tg_dtype mask_type, float shift);
void TG_NAME(attn_ds_row)(float *restrict dp, const float *restrict p, int64_t n, float d,
                          float scale);
void TG_NAME(attn_prob_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                            const void *restrict mask, tg_dtype mask_type, float shift);
float TG_NAME(attn_exp_sum_row)(float *restrict s, int64_t n, float shift);
float TG_NAME(attn_exp_sum_bf16_row)(const float *restrict s, int64_t n, float shift,
                                     uint16_t *restrict p);
float TG_NAME(attn_exp_sum_lag_bf16_row)(const float *restrict s, int64_t n, float scale,
                                         float m, uint16_t *restrict p, float *max_out);
float TG_NAME(attn_score_max_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                                  const void *restrict mask, tg_dtype mask_type);
void TG_NAME(dropout_keep)(uint8_t *restrict keep, int64_t n, uint64_t n0, uint64_t seed,
                           uint64_t offset, uint32_t threshold);
/* common/row_ops.c */
float TG_NAME(dot_f32)(const float *restrict a, const float *restrict b, int64_t n);
float TG_NAME(dot3_f32)(const float *restrict a, const float *restrict b,
                        const float *restrict c, int64_t n);
float TG_NAME(max_f32)(const float *restrict x, int64_t n);
void TG_NAME(scale2_f32)(float *restrict x, int64_t n, float a, float b);
void TG_NAME(add_f32)(float *restrict dst, const float *restrict src, int64_t n);
void TG_NAME(add_compensated_f32)(float *restrict sum, float *restrict comp, float *restrict x,
                                  int64_t n);
void TG_NAME(acc_mul2_f32)(float *restrict acc, const float *restrict a,
                           const float *restrict b, float s, int64_t n);
void TG_NAME(rms_dx_row)(const float *restrict x, const float *restrict w,
                         const float *restrict dy, float r, float c, float *restrict dx,
                         int64_t n);
void TG_NAME(fwht_mul_f32)(float *restrict x, int64_t n, const float *restrict mul);
void TG_NAME(add_transposed_f32)(int64_t rows, int64_t cols, const float *restrict src,
                                 int64_t lds, float *restrict dst, int64_t ldd);
void TG_NAME(transpose_f32)(int64_t rows, int64_t cols, const float *restrict src, int64_t lds,
                            float *restrict dst, int64_t ldd, int stream);
void TG_NAME(wsum4_f32)(const float *restrict part, int64_t ld, const int32_t *restrict w,
                        const float *restrict a, int64_t nw, int64_t n4, float div,
                        float *restrict dst);
float TG_NAME(softmax_exp_chunk)(const float *restrict x, int64_t len, float *restrict e,
                                 float *restrict state);
void TG_NAME(scale_chunks_f32)(const float *restrict e, const float *restrict a, float b,
                               float *restrict y, int64_t n, int stream);
void TG_NAME(rms_sums_f32)(const float *restrict x, const float *restrict dy,
                           const float *restrict w, int64_t n, float *xx, float *dyxw);
void TG_NAME(rms_bwd_row)(const float *restrict x, const float *restrict w,
                          const float *restrict dy, float r, float c, float *restrict part,
                          float *restrict dx, int64_t n, int stream);
void TG_NAME(stream_fence)(void);
void TG_NAME(rope_row_f32)(const float *restrict x, const float *restrict c,
                           const float *restrict s, float *restrict y, int64_t R,
                           int interleaved);
void TG_NAME(glu_fwd_f32)(const float *g, const float *u, float *y, int64_t n, int act);
void TG_NAME(glu_bwd_f32)(const float *g, const float *u, const float *dy, float *dg, float *du,
                          int64_t n, int act);
/* x86/bf16_dot.c (avx512bf16), arm/bf16_mmla.c (neonbf16) */
void TG_NAME(mm_bf16_pairs)(int M, int N, int K, const uint16_t *restrict A, int64_t lda,
                            const uint32_t *restrict Bp, int64_t ldb, float *restrict C,
                            int64_t ldc, int accumulate);
/* x86/bf16_pairs.c (avx512bf16, amx), arm/bf16_mmla.c (neonbf16) */
void TG_NAME(pack_bf16_pairs)(int64_t nr, int64_t K, const uint16_t *restrict X, int64_t lds,
                              uint32_t *restrict Bp, int64_t ldb);
/* x86/amx.c (amx) */
void TG_NAME(mm_bf16_pairs_amx)(int M, int N, int K, const uint16_t *A, int64_t lda,
                                const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc,
                                int accumulate);
void TG_NAME(mm_bf16_terms_amx)(int n, const tg_bf16_term *terms, int M, int N, int64_t lda,
                                int64_t ldb, float *C, int64_t ldc, int accumulate);
void TG_NAME(bf16_dot_begin_amx)(void);
void TG_NAME(bf16_dot_end_amx)(void);
#pragma GCC visibility pop

#endif /* TG_ISA_BUILD_H */
