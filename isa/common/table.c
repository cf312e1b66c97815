/*
 * The table of one ISA's build (isa/ops.h's tg_isa_ops): its blocking from
 * isa/tuning.h and the functions of isa/common/ and of the ISA's own
 * sources (isa/isa.cmake lists them; the TG_ISA_WITH_* flags say which
 * optional ones it has).
 */
#include "build.h"

const tg_isa_ops TG_NAME(tg_isa_ops) = {
    .name = TG_STR(TG_ISA_SUFFIX),
    .gemm_mr = MR,
    .gemm_nr = NR,
    .attn_bq = ATTN_BQ,
    .attn_bk = ATTN_BK,
    .attn_bq_bf16 = ATTN_BQ_BF16,
    .attn_bk_bf16 = ATTN_BK_BF16,
    .exact_parts_min_d = {EXACT_PARTS_MIN_D_FWD, EXACT_PARTS_MIN_D_BWD},
#if defined(__AVX512BF16__) /* x86/simd_avx512.h's bf16_lanes */
    .split_ftz = 1,
#endif
    .mm_nn = TG_NAME(mm_nn),
    .mm_tn_acc = TG_NAME(mm_tn_acc),
#if defined(TG_ISA_WITH_AMX) /* the bf16 x bf16 products on tiles, x86/amx.c */
    .mm_bf16_pairs = TG_NAME(mm_bf16_pairs_amx),
    .mm_bf16_terms = TG_NAME(mm_bf16_terms_amx),
    .bf16_k_step = 32,
    .bf16_dot_begin = TG_NAME(bf16_dot_begin_amx),
    .bf16_dot_end = TG_NAME(bf16_dot_end_amx),
    .pack_bf16_pairs = TG_NAME(pack_bf16_pairs),
#elif defined(TG_ISA_WITH_BF16_DOT) /* vdpbf16ps (x86/bf16_dot.c), BFMMLA (arm/bf16_mmla.c) */
    .mm_bf16_pairs = TG_NAME(mm_bf16_pairs),
    .pack_bf16_pairs = TG_NAME(pack_bf16_pairs),
#endif
    .f32_to_bf16_split = TG_NAME(f32_to_bf16_split),
    .pack_bf16_row_pairs = TG_NAME(pack_bf16_row_pairs),
    .bf16_to_f32 = TG_NAME(bf16_to_f32),
    .f32_to_bf16 = TG_NAME(f32_to_bf16),
    .dot_bf16 = TG_NAME(dot_bf16),
    .exp_f32 = TG_NAME(exp_f32),
    .attn_score_row = TG_NAME(attn_score_row),
    .attn_ds_row = TG_NAME(attn_ds_row),
    .attn_prob_row = TG_NAME(attn_prob_row),
    .attn_exp_sum_row = TG_NAME(attn_exp_sum_row),
    .attn_exp_sum_bf16_row = TG_NAME(attn_exp_sum_bf16_row),
    .attn_exp_sum_lag_bf16_row = TG_NAME(attn_exp_sum_lag_bf16_row),
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
    .add_transposed_f32 = TG_NAME(add_transposed_f32),
    .wsum4_f32 = TG_NAME(wsum4_f32),
    .softmax_exp_chunk = TG_NAME(softmax_exp_chunk),
    .scale_chunks_f32 = TG_NAME(scale_chunks_f32),
    .rms_sums_f32 = TG_NAME(rms_sums_f32),
    .rms_bwd_row = TG_NAME(rms_bwd_row),
    .stream_fence = TG_NAME(stream_fence),
    .rope_row_f32 = TG_NAME(rope_row_f32),
    .glu_fwd_f32 = TG_NAME(glu_fwd_f32),
    .glu_bwd_f32 = TG_NAME(glu_bwd_f32),
};
