/*
 * The row kernels' blocks of rows, and the fixed tree that ends every
 * 16-lane reduction of the ISA layer's row ops (isa/ops.h).
 */
#ifndef TG_REDUCE_H
#define TG_REDUCE_H

#include <stdint.h>

#include "tuning.h"

/* Whole rows per work item of about TG_ROW_BLOCK_ELEMS elements (isa/tuning.h). */
static inline int64_t tg_rows_per_block(int64_t row_len) {
  return row_len >= TG_ROW_BLOCK_ELEMS ? 1 : TG_ROW_BLOCK_ELEMS / row_len;
}

/* The fixed pairwise tree over 16 lane partial sums (lane l + 8, then + 4,
 * + 2, + 1): the CPU stand-in for a Metal simd_sum, the end of every 16-lane
 * reduction of the ISA layer's row ops, and the sum S of an online softmax
 * state (softmax_exp_chunk: 16 lane sums, then the running max). */
static inline float tg_lane_tree16(const float lanes[16]) {
  float acc[16];
  for (int l = 0; l < 16; l++) acc[l] = lanes[l];
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

#endif /* TG_REDUCE_H */
