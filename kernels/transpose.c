/* 9. 2-D transpose.
 *
 *   input  [rows, cols]  f32
 *   output [cols, rows]  f32, writes
 *
 *   output[c, r] = input[r, c]
 *
 * Metal: one thread per element (gid.x = c, gid.y = r).
 *
 * CPU: cache-blocked. The matrix is cut into TG_TR_TILE x TG_TR_TILE tiles
 * (64 x 64 floats: 16 KiB read + 16 KiB written, both in L1); group (x, y)
 * takes tile row y (input rows y*T .. y*T+T-1) and a stripe of up to
 * TG_TR_STRIPE tiles along it. Each tile goes through the ISA layer's transpose
 * (16 x 16 register transposes on AVX-512), so every output row receives
 * 256 contiguous bytes per tile -- whole lines, four at a time, rather than
 * the 4-byte scattered stores of an element loop. A pure copy: exact.
 */
#include "engine.h"
#include "reduce.h"

/* Outputs of TG_STREAM_BYTES or more (isa/tuning.h) are written with
 * non-temporal stores where the ISA has them: far past the L2s, a cached
 * store first reads each output line from memory (read-for-ownership), one
 * stream more than the copy needs, and the column-order writes of a
 * transpose also thrash the L1 sets. */

typedef struct {
  const float *in;
  float *out;
  int64_t rows, cols;
  int stream;
  const tg_isa_ops *ops;
} tr_args;

static void transpose_group(const void *vargs, int64_t stripe, int64_t tile_row, int64_t z,
                            void *scratch) {
  const tr_args *a = vargs;
  const int64_t r0 = tile_row * TG_TR_TILE;
  const int64_t r1 = r0 + TG_TR_TILE < a->rows ? r0 + TG_TR_TILE : a->rows;
  const int64_t cs0 = stripe * (TG_TR_TILE * TG_TR_STRIPE);
  const int64_t cs1 =
      cs0 + TG_TR_TILE * TG_TR_STRIPE < a->cols ? cs0 + TG_TR_TILE * TG_TR_STRIPE : a->cols;
  for (int64_t c0 = cs0; c0 < cs1; c0 += TG_TR_TILE) {
    const int64_t c1 = c0 + TG_TR_TILE < cs1 ? c0 + TG_TR_TILE : cs1;
    /* one tile: output[c, r0:r1] = input[r0:r1, c] for c in [c0, c1) */
    a->ops->transpose_f32(r1 - r0, c1 - c0, a->in + r0 * a->cols + c0, a->cols,
                          a->out + c0 * a->rows + r0, a->rows, a->stream);
  }
}

tg_status tg_transpose_2d(tg_ctx *ctx, const float *input, float *output, uint32_t rows,
                          uint32_t cols) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  static const char fn[] = "tg_transpose_2d";
  if (!input) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: input is NULL", fn);
  if (!output) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: output is NULL", fn);
  if (rows == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: rows is 0; it must be >= 1", fn);
  if (cols == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: cols is 0; it must be >= 1", fn);
  tg_status st = tg_shape_count(ctx, "tg_transpose_2d: input [rows, cols]", sizeof(float),
                                NULL, 2, (int64_t)rows, (int64_t)cols);
  if (st) return st;
  const int64_t bytes = (int64_t)rows * cols * (int64_t)sizeof(float);
  /* Not in place: a tile's output rows land on input rows that other tiles
   * (other threads) still read. */
  const tg_buf bufs[] = {tg_in("input", input, bytes), tg_out("output", output, bytes)};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const tr_args a = {input, output, rows, cols, bytes >= TG_STREAM_BYTES, ctx->ops};
  const int64_t tile_rows = ((int64_t)rows + TG_TR_TILE - 1) / TG_TR_TILE;
  const int64_t stripe = TG_TR_TILE * TG_TR_STRIPE;
  const int64_t stripes = ((int64_t)cols + stripe - 1) / stripe;
  return tg_dispatch(ctx, stripes, tile_rows, 1, 0, transpose_group, &a);
}
