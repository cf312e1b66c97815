/*
 * 6. Softmax backward (seed 004). f32, sm, grad_out, grad_in are
 * [n_rows, row_len] row-major; per row b:
 *
 *   dot[b]        = sum_j sm[b,j] * grad_out[b,j]
 *   grad_in[b,j]  = sm[b,j] * (grad_out[b,j] - dot[b])          (writes)
 *
 * Metal grid: one threadgroup per row. Here one group runs a block of
 * consecutive rows (enough for ~8 Ki elements, at least one row). dot is an
 * f32 sum with 16 lane partial sums and a fixed pairwise tree over the lanes
 * (the threadgroup tree); its order depends only on row_len, so the result is
 * the same for every thread count.
 */
#include <stdio.h>

#include "engine.h"
#include "reduce.h"


typedef struct {
  const float *sm, *go;
  float *gi;
  int64_t rows, len, rpg;
  const tg_isa_ops *ops;
} softmax_bwd_args;

static void softmax_bwd_group(const void *vargs, int64_t g, int64_t y, int64_t z,
                              void *scratch) {
  const softmax_bwd_args *a = vargs;
  const int64_t b1 = (g + 1) * a->rpg < a->rows ? (g + 1) * a->rpg : a->rows;
  for (int64_t b = g * a->rpg; b < b1; b++) {
    const float *sm = a->sm + b * a->len, *go = a->go + b * a->len;
    float *gi = a->gi + b * a->len;
    const float dot = a->ops->dot_f32(sm, go, a->len);
    for (int64_t j = 0; j < a->len; j++) gi[j] = sm[j] * (go[j] - dot);
  }
}

tg_status tg_softmax_backward(tg_ctx *ctx, const float *sm, const float *grad_out,
                              float *grad_in, uint32_t n_rows, uint32_t row_len) {
  static const char fn[] = "tg_softmax_backward";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !sm ? "sm" : !grad_out ? "grad_out" : !grad_in ? "grad_in" : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  char name[160];
  snprintf(name, sizeof name, "%s: sm[n_rows = %u, row_len = %u]", fn, n_rows, row_len);
  int64_t n;
  tg_status st =
      tg_shape_count(ctx, name, sizeof(float), &n, 2, (int64_t)n_rows, (int64_t)row_len);
  if (st != TG_OK) return st;
  /* grad_in may be grad_out itself (the usual in-place backward): a row's
   * dot reads the whole row before any of it is written, element j is then
   * written after its own read, and no other work item reads the row. */
  const int64_t bytes = n * (int64_t)sizeof(float);
  const tg_buf bufs[] = {tg_in("sm", sm, bytes), tg_in("grad_out", grad_out, bytes),
                         tg_out_in_place("grad_in", grad_in, bytes, "grad_out")};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const int64_t rpg = tg_rows_per_block(row_len);
  const softmax_bwd_args a = {sm, grad_out, grad_in, n_rows, row_len, rpg, ctx->ops};
  return tg_dispatch(ctx, (a.rows + rpg - 1) / rpg, 1, 1, 0, softmax_bwd_group, &a);
}
