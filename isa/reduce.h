/*
 * Blocking of the row kernels (the row reductions themselves, with 16 lane
 * partial sums and a fixed tree, live in the ISA layer: isa/ops.h).
 */
#ifndef TG_REDUCE_H
#define TG_REDUCE_H

#include <stdint.h>

/* Row kernels hand each work item a block of whole rows of about this many
 * elements (at least one row, 256 KiB of f32): work items are taken in
 * dynamic order, so the two threads alternate blocks, and every block starts
 * a new stream whose first lines are demand misses before the prefetchers
 * catch up; with 32 KiB blocks that was a large part of each block. */
enum { TG_ROW_BLOCK_ELEMS = 65536 };
static inline int64_t tg_rows_per_block(int64_t row_len) {
  return row_len >= TG_ROW_BLOCK_ELEMS ? 1 : TG_ROW_BLOCK_ELEMS / row_len;
}

/* Outputs at least this large are written with non-temporal stores where the
 * row op offers them: far past the caches a cached store first reads its line
 * from memory (read-for-ownership), a stream more than the kernel needs. */
#define TG_STREAM_BYTES ((int64_t)16 << 20)

/* Chunk of the online softmax row ops (softmax_exp_f32, scale_chunks_f32):
 * 4 KiB, so a chunk stays in L1 between its max and its exp. */
enum { TG_SOFTMAX_CHUNK = 1024 };

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
