/*
 * Row reductions in f32 with TG_LANES lane-parallel partial sums and a fixed
 * pairwise tree over the lanes: the CPU stand-in for a Metal simd_sum /
 * threadgroup tree. The summation order depends only on n, never on threads,
 * and the lane loop vectorizes.
 */
#ifndef TG_REDUCE_H
#define TG_REDUCE_H

#include <stdint.h>

enum { TG_LANES = 16 };

/* Row kernels hand each work item a block of whole rows of about this many
 * elements (at least one row), so short rows do not cost a dispatch each. */
enum { TG_ROW_BLOCK_ELEMS = 8192 };
static inline int64_t tg_rows_per_block(int64_t row_len) {
  return row_len >= TG_ROW_BLOCK_ELEMS ? 1 : TG_ROW_BLOCK_ELEMS / row_len;
}

/* Chunk of the online softmax row ops (softmax_exp_f32, scale_chunks_f32):
 * 4 KiB, so a chunk stays in L1 between its max and its exp. */
enum { TG_SOFTMAX_CHUNK = 1024 };

static inline float tg_lane_tree(float acc[TG_LANES]) {
  for (int w = TG_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  return acc[0];
}

/* sum_i a[i] * b[i] */
static inline float tg_dot_f32(const float *a, const float *b, int64_t n) {
  float acc[TG_LANES] = {0};
  int64_t i = 0;
  for (; i + TG_LANES <= n; i += TG_LANES) {
#pragma omp simd
    for (int l = 0; l < TG_LANES; l++) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
  return tg_lane_tree(acc);
}

/* sum_i a[i] * b[i] * c[i] */
static inline float tg_dot3_f32(const float *a, const float *b, const float *c, int64_t n) {
  float acc[TG_LANES] = {0};
  int64_t i = 0;
  for (; i + TG_LANES <= n; i += TG_LANES) {
#pragma omp simd
    for (int l = 0; l < TG_LANES; l++) acc[l] += a[i + l] * b[i + l] * c[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i] * c[i];
  return tg_lane_tree(acc);
}

#endif /* TG_REDUCE_H */
