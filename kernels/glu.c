/*
 * 13. Gated linear units: the MLP's act(gate) * up (SwiGLU with silu,
 * GeGLU with gelu_tanh), forward and backward.
 *
 *   gate, up, y, dy, dgate, dup [rows, cols], each through its own row
 *   stride (elements, >= cols): the two chunks of a fused gate_up [rows,
 *   2 cols] are views at strides 2 cols.
 *   forward:  y     = act(gate) * up
 *   backward: dgate = dy * up * act'(gate),   dup = dy * act(gate)
 *   silu(g)      = g S(g)                      silu'      = S (1 + g (1 - S))
 *   gelu_tanh(g) = g S(z), z = 2 sqrt(2/pi) (g + 0.044715 g^3)
 *                                              gelu_tanh' = S + g S (1 - S) z'
 * with S the sigmoid (0.5 (1 + tanh(z/2)) = S(z)). The row ops
 * (isa/common/row_ops.c: glu_fwd_f32, glu_bwd_f32) take S and 1 - S from
 * exp(-|z|) so neither overflows nor cancels; f32 throughout, bf16 rows
 * widened exactly into f32 buffers and the results rounded once.
 *
 * Metal grid -> CPU groups: the twin runs one thread per element; here a
 * work item runs a block of rows times a piece of at most TG_GLU_COLS
 * columns (so one long row still spreads over the threads), in pieces of
 * GLU_PIECE elements through L1-sized f32 buffers for bf16. Elementwise:
 * the result does not depend on the thread count or the blocking.
 */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "reduce.h"

/* Columns of one work item's piece of a row (64 KiB of f32), and the
 * elements converted at a time for bf16 (5 f32 buffers of 4 KiB: L1). */
enum { TG_GLU_COLS = 16384, GLU_PIECE = 1024 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* --- validation ------------------------------------------------------------- */
/* One [rows, cols] operand through its stride, for the aliasing check. */
typedef struct {
  const char *name;
  const void *p;
  int64_t stride;
  int written;
  const char *in_place_of;
} glu_view;

static tg_status check_view(tg_ctx *ctx, const char *fn, const glu_view *v, int64_t rows,
                            int64_t cols) {
  if (!v->p) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, v->name);
  if (rows > 1 && v->stride < cols)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: %s_stride = %lld; with %lld rows it must be >= cols = %lld", fn, v->name,
                   (long long)v->stride, (long long)rows, (long long)cols);
  int64_t t, last;
  if (!tg_mul_ok(&t, 2, rows - 1, rows > 1 ? v->stride : 0) ||
      __builtin_add_overflow(t, cols, &last) || last > INT64_MAX / (int64_t)sizeof(float))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: %s [%lld rows at stride %lld] overflows int64 bytes",
                   fn, v->name, (long long)rows, (long long)v->stride);
  return TG_OK;
}

/* Row-strided views a and b of the same stride whose rows sit in each
 * other's gaps: every row of b starts at least cols elements after a row
 * of a and ends before the next one (two chunks of one fused buffer). */
static int rows_interleave(const glu_view *a, const glu_view *b, int64_t rows, int64_t cols,
                           size_t eb) {
  if (rows == 1 || a->stride != b->stride) return 0;
  const uint64_t pitch = (uint64_t)a->stride * eb, width = (uint64_t)cols * eb;
  const uintptr_t pa = (uintptr_t)a->p, pb = (uintptr_t)b->p;
  const uint64_t d = pa <= pb ? (uint64_t)(pb - pa) : pitch - (uint64_t)(pa - pb) % pitch;
  const uint64_t r = d % pitch;
  return r >= width && r + width <= pitch;
}

/* tg_check_alias over the views' extents, but for pairs that interleave
 * row by row, which share no byte whatever their extents. */
static tg_status check_views_alias(tg_ctx *ctx, const char *fn, const glu_view *v, int n,
                                   int64_t rows, int64_t cols, size_t eb) {
  for (int i = 0; i < n; i++) {
    if (!v[i].written) continue;
    for (int j = 0; j < n; j++) {
      if (j == i || (v[j].written && j > i) || rows_interleave(&v[i], &v[j], rows, cols, eb))
        continue;
      const uint64_t bytes_i = (uint64_t)((rows - 1) * (rows > 1 ? v[i].stride : 0) + cols) * eb;
      const uint64_t bytes_j = (uint64_t)((rows - 1) * (rows > 1 ? v[j].stride : 0) + cols) * eb;
      const tg_buf pair[2] = {
          v[j].written ? tg_out(v[j].name, v[j].p, bytes_j) : tg_in(v[j].name, v[j].p, bytes_j),
          v[i].in_place_of ? tg_out_in_place(v[i].name, v[i].p, bytes_i, v[i].in_place_of)
                           : tg_out(v[i].name, v[i].p, bytes_i)};
      /* in place: the same address needs the same stride too */
      if (v[i].in_place_of && v[i].p == v[j].p && !v[j].written &&
          strcmp(v[i].in_place_of, v[j].name) == 0 && v[i].stride != v[j].stride && rows > 1)
        return tg_fail(ctx, TG_ERR_ALIAS,
                       "%s: %s == %s, but in place needs the same stride (%lld, %lld)", fn,
                       v[i].name, v[j].name, (long long)v[i].stride, (long long)v[j].stride);
      const tg_status st = tg_check_alias(ctx, fn, pair, 2);
      if (st) return st;
    }
  }
  return TG_OK;
}

static tg_status check_common(tg_ctx *ctx, const char *fn, tg_glu_act act, tg_dtype dtype,
                              uint32_t rows, uint32_t cols) {
  if (act != TG_GLU_SILU && act != TG_GLU_GELU_TANH)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: act = %d is no tg_glu_act", fn, (int)act);
  if (dtype != TG_DTYPE_BF16 && dtype != TG_DTYPE_F32)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: dtype = %d is no tg_dtype", fn, (int)dtype);
  if (rows == 0 || cols == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: [rows = %u, cols = %u]; both must be >= 1", fn,
                   rows, cols);
  return TG_OK;
}

static tg_status validate(tg_ctx *ctx, const char *fn, const glu_view *v, int n,
                          tg_glu_act act, tg_dtype dtype, uint32_t rows, uint32_t cols) {
  for (int i = 0; i < n; i++) /* NULLs first, as every entry point */
    if (!v[i].p) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, v[i].name);
  tg_status st = check_common(ctx, fn, act, dtype, rows, cols);
  for (int i = 0; i < n && !st; i++) st = check_view(ctx, fn, &v[i], rows, cols);
  if (st) return st;
  return check_views_alias(ctx, fn, v, n, rows, cols,
                           dtype == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16));
}

/* --- the work ---------------------------------------------------------------- */
typedef struct {
  const void *g, *u, *dy;
  void *y, *dg, *du; /* forward: y; backward: dg, du */
  int64_t gs, us, dys, ys, dgs, dus;
  int64_t rows, cols, rows_per_item;
  int act, bf16;
  const tg_isa_ops *ops;
} glu_args;

static const void *at(const void *p, int64_t row, int64_t stride, int64_t col, int bf16) {
  return (const char *)p + (row * stride + col) * (bf16 ? 2 : 4);
}

/* Columns [c0, c0 + n) of one row. f32 rows go to the row op as they are
 * (in place is elementwise there); bf16 ones through f32 buffers. */
static void fwd_piece(const glu_args *a, int64_t row, int64_t c0, int64_t n, float *buf) {
  const float *g = at(a->g, row, a->gs, c0, a->bf16), *u = at(a->u, row, a->us, c0, a->bf16);
  float *y = (float *)at(a->y, row, a->ys, c0, a->bf16);
  if (!a->bf16) {
    a->ops->glu_fwd_f32(g, u, y, n, a->act);
    return;
  }
  float *gf = buf, *uf = buf + GLU_PIECE;
  for (int64_t k = 0; k < n; k += GLU_PIECE) {
    const int64_t m = min64(GLU_PIECE, n - k);
    a->ops->bf16_to_f32((const uint16_t *)g + k, gf, m);
    a->ops->bf16_to_f32((const uint16_t *)u + k, uf, m);
    a->ops->glu_fwd_f32(gf, uf, gf, m, a->act);
    a->ops->f32_to_bf16(gf, (uint16_t *)y + k, m);
  }
}

static void bwd_piece(const glu_args *a, int64_t row, int64_t c0, int64_t n, float *buf) {
  const float *g = at(a->g, row, a->gs, c0, a->bf16), *u = at(a->u, row, a->us, c0, a->bf16);
  const float *dy = at(a->dy, row, a->dys, c0, a->bf16);
  float *dg = (float *)at(a->dg, row, a->dgs, c0, a->bf16);
  float *du = (float *)at(a->du, row, a->dus, c0, a->bf16);
  if (!a->bf16) {
    a->ops->glu_bwd_f32(g, u, dy, dg, du, n, a->act);
    return;
  }
  float *gf = buf, *uf = buf + GLU_PIECE, *df = buf + 2 * GLU_PIECE;
  for (int64_t k = 0; k < n; k += GLU_PIECE) {
    const int64_t m = min64(GLU_PIECE, n - k);
    a->ops->bf16_to_f32((const uint16_t *)g + k, gf, m);
    a->ops->bf16_to_f32((const uint16_t *)u + k, uf, m);
    a->ops->bf16_to_f32((const uint16_t *)dy + k, df, m);
    a->ops->glu_bwd_f32(gf, uf, df, gf, uf, m, a->act); /* in place over the buffers */
    a->ops->f32_to_bf16(gf, (uint16_t *)dg + k, m);
    a->ops->f32_to_bf16(uf, (uint16_t *)du + k, m);
  }
}

/* Work item (c, rb): column piece c of the rows of block rb. */
static void glu_group(const void *vargs, int64_t c, int64_t rb, int64_t z, void *scratch) {
  const glu_args *a = vargs;
  const int64_t c0 = c * TG_GLU_COLS, n = min64(TG_GLU_COLS, a->cols - c0);
  const int64_t r1 = min64((rb + 1) * a->rows_per_item, a->rows);
  for (int64_t r = rb * a->rows_per_item; r < r1; r++)
    if (a->y)
      fwd_piece(a, r, c0, n, scratch);
    else
      bwd_piece(a, r, c0, n, scratch);
}

static tg_status glu_run(tg_ctx *ctx, glu_args *a) {
  a->rows_per_item = tg_rows_per_block(min64(a->cols, TG_GLU_COLS));
  a->ops = ctx->ops;
  const size_t scratch = a->bf16 ? 3 * GLU_PIECE * sizeof(float) : 0;
  return tg_dispatch(ctx, (a->cols + TG_GLU_COLS - 1) / TG_GLU_COLS,
                     (a->rows + a->rows_per_item - 1) / a->rows_per_item, 1, scratch, glu_group,
                     a);
}

tg_status tg_glu_forward(tg_ctx *ctx, const void *gate, const void *up, void *y,
                         tg_glu_act act, tg_dtype dtype, uint32_t rows, uint32_t cols,
                         int64_t gate_stride, int64_t up_stride, int64_t y_stride) {
  static const char fn[] = "tg_glu_forward";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  /* y may be in place over gate or over up: the one it starts at */
  const glu_view v[] = {{"gate", gate, gate_stride, 0, NULL},
                        {"up", up, up_stride, 0, NULL},
                        {"y", y, y_stride, 1, y == up ? "up" : "gate"}};
  tg_status st = validate(ctx, fn, v, TG_LEN(v), act, dtype, rows, cols);
  if (st) return st;
  glu_args a = {.g = gate, .u = up, .y = y, .gs = gate_stride, .us = up_stride,
                .ys = y_stride, .rows = rows, .cols = cols, .act = act,
                .bf16 = dtype == TG_DTYPE_BF16};
  return glu_run(ctx, &a);
}

tg_status tg_glu_backward(tg_ctx *ctx, const void *gate, const void *up, const void *dy,
                          void *dgate, void *dup, tg_glu_act act, tg_dtype dtype,
                          uint32_t rows, uint32_t cols, int64_t gate_stride,
                          int64_t up_stride, int64_t dy_stride, int64_t dgate_stride,
                          int64_t dup_stride) {
  static const char fn[] = "tg_glu_backward";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const glu_view v[] = {{"gate", gate, gate_stride, 0, NULL},
                        {"up", up, up_stride, 0, NULL},
                        {"dy", dy, dy_stride, 0, NULL},
                        {"dgate", dgate, dgate_stride, 1, "gate"},
                        {"dup", dup, dup_stride, 1, "up"}};
  tg_status st = validate(ctx, fn, v, TG_LEN(v), act, dtype, rows, cols);
  if (st) return st;
  glu_args a = {.g = gate, .u = up, .dy = dy, .dg = dgate, .du = dup, .gs = gate_stride,
                .us = up_stride, .dys = dy_stride, .dgs = dgate_stride, .dus = dup_stride,
                .rows = rows, .cols = cols, .act = act, .bf16 = dtype == TG_DTYPE_BF16};
  return glu_run(ctx, &a);
}
