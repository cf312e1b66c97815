/*
 * 4. and 5. RMSNorm backward (seeds 002 and 004). All f32; x, dy, dx are
 * [rows, dim] row-major, w, dw are [dim], r is [rows].
 *
 *   r[b]    = 1 / sqrt(mean_j x[b,j]^2 + eps)
 *   s[b]    = sum_i dy[b,i] * x[b,i] * w[i]
 *   dx[b,k] = r[b] * (dy[b,k] * w[k] - x[b,k] * s[b] * r[b]^2 / dim)
 *   dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]
 *
 * Metal grid -> CPU groups:
 *   - rms_inv, dx (seed 002) and the fused kernel (seed 004) run one
 *     threadgroup per row; here one group runs a block of consecutive rows
 *     (enough rows for ~8 Ki elements) so small rows do not pay one dispatch
 *     each. Every row is computed the same way whatever the block, so the
 *     result does not depend on the thread count.
 *   - dw (seed 002) runs one threadgroup per feature, striding over rows; here
 *     pass 1 cuts the rows into at most 64 blocks fixed by `rows` alone, each
 *     group summing its rows in order into a dim-long partial (whole rows
 *     streamed: the column-blocked walk it replaces read 1 KiB pieces at a
 *     row stride, which the prefetchers follow badly), and pass 2 adds the
 *     partials per column in block order. The partition never depends on
 *     the thread count, so dw is bitwise identical for any thread count.
 *   - The row loops (sums, dx, partial accumulation) are ISA-layer ops,
 *     compiled without FMA contraction, so every ISA gives the same bits.
 *   - fused grad_weight: Metal adds every row's x*r*dy atomically. Here the
 *     rows are cut into blocks of consecutive rows; each block sums its rows
 *     in order into a dim-long partial (grad_input is written on the way).
 *     Deterministic mode: the blocks are fixed by `rows` alone (never by the
 *     thread count), the partials live in a heap [nblocks, dim] buffer,
 *     and a second pass over column blocks adds them to grad_weight in block
 *     order -- bitwise identical across runs and thread counts. Otherwise:
 *     at most two blocks per thread, each adding its partial (in per-thread
 *     scratch) with `omp atomic` -- last-bit differences between runs, as on
 *     the GPU.
 *
 * Row reductions (sum x^2, sum dy*x*w) are f32 with 16 lane partial sums and a
 * fixed pairwise tree over the lanes, the CPU stand-in for the threadgroup
 * tree; the order depends only on dim.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "reduce.h"

/* r = 1 / sqrt(sum_j x[j]^2 / dim + eps) for one row. Every kernel here
 * (forward included) takes the sum from the same ISA-layer op, so r agrees
 * bitwise between them for one ISA. */
static float row_rms_inv(const tg_isa_ops *ops, const float *x, int64_t dim, float eps) {
  return 1.0f / sqrtf(ops->dot_f32(x, x, dim) / (float)dim + eps);
}

/* One row of dx: s = sum dy*x*w; dx[k] = r * (dy[k]*w[k] - x[k] * s*r^2/dim). */
static void row_dx(const tg_isa_ops *ops, const float *x, const float *w, const float *dy,
                   float r, float *dx, int64_t dim) {
  const float s = ops->dot3_f32(dy, x, w, dim);
  const float coeff = s * r * r / (float)dim;
  ops->rms_dx_row(x, w, dy, r, coeff, dx, dim);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* --- validation ------------------------------------------------------------ */
/* rows x dim must be non-zero and its byte size must fit int64. */
static tg_status check_shape(tg_ctx *ctx, const char *fn, const char *tensor,
                             uint32_t rows, uint32_t dim) {
  char name[160];
  snprintf(name, sizeof name, "%s: %s[rows = %u, dim = %u]", fn, tensor, rows, dim);
  int64_t n;
  return tg_shape_count(ctx, name, sizeof(float), &n, 2, (int64_t)rows, (int64_t)dim);
}

static tg_status check_eps(tg_ctx *ctx, const char *fn, float eps) {
  if (!isfinite(eps) || eps < 0.0f)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: eps = %g; it must be finite and >= 0", fn, (double)eps);
  return TG_OK;
}

/* Bytes of rows x dim floats (and of `rows` floats): checked by check_shape. */
static uint64_t f32_bytes(uint32_t rows, uint32_t dim) {
  return (uint64_t)rows * dim * sizeof(float);
}

/* --- 4a. r[b] = 1/sqrt(mean_j x[b,j]^2 + eps) (writes) --------------------- */
typedef struct {
  const float *x;
  float *r;
  int64_t rows, dim, rpg;
  float eps;
  const tg_isa_ops *ops;
} rms_inv_args;

static void rms_inv_group(const void *vargs, int64_t g, int64_t y, int64_t z,
                          void *scratch) {
  const rms_inv_args *a = vargs;
  const int64_t b1 = min64((g + 1) * a->rpg, a->rows);
  for (int64_t b = g * a->rpg; b < b1; b++)
    a->r[b] = row_rms_inv(a->ops, a->x + b * a->dim, a->dim, a->eps);
}

tg_status tg_rms_norm_compute_rms_inv_f32(tg_ctx *ctx, const float *x, float *r_out,
                                          uint32_t rows, uint32_t dim, float eps) {
  static const char fn[] = "tg_rms_norm_compute_rms_inv_f32";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (!x || !r_out)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, !x ? "x" : "r_out");
  tg_status st = check_shape(ctx, fn, "x", rows, dim);
  if (st == TG_OK) st = check_eps(ctx, fn, eps);
  if (st != TG_OK) return st;
  const tg_buf bufs[] = {tg_in("x", x, f32_bytes(rows, dim)),
                         tg_out("r_out", r_out, f32_bytes(rows, 1))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const rms_inv_args a = {x, r_out, rows, dim, tg_rows_per_block(dim), eps, ctx->ops};
  return tg_dispatch(ctx, (a.rows + a.rpg - 1) / a.rpg, 1, 1, 0, rms_inv_group, &a);
}

/* --- forward: r[b] as in 4a, y[b,k] = x[b,k] * r[b] * w[k] (writes) ------- */
typedef struct {
  const float *x, *w;
  float *y, *r; /* r may be NULL */
  int64_t rows, dim, rpg;
  float eps;
  const tg_isa_ops *ops;
} fwd_args;

static void fwd_group(const void *vargs, int64_t g, int64_t y_, int64_t z, void *scratch) {
  const fwd_args *a = vargs;
  const int64_t b1 = min64((g + 1) * a->rpg, a->rows);
  for (int64_t b = g * a->rpg; b < b1; b++) {
    const float *x = a->x + b * a->dim;
    float *y = a->y + b * a->dim;
    const float r = row_rms_inv(a->ops, x, a->dim, a->eps);
    for (int64_t k = 0; k < a->dim; k++) y[k] = x[k] * r * a->w[k];
    if (a->r) a->r[b] = r;
  }
}

tg_status tg_rms_norm_forward_f32(tg_ctx *ctx, const float *x, const float *w, float *y,
                                  float *r_out, uint32_t rows, uint32_t dim, float eps) {
  static const char fn[] = "tg_rms_norm_forward_f32";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !x ? "x" : !w ? "w" : !y ? "y" : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  tg_status st = check_shape(ctx, fn, "x", rows, dim);
  if (st == TG_OK) st = check_eps(ctx, fn, eps);
  if (st != TG_OK) return st;
  /* y may be x itself: a row's r reads the whole row before y[k] = x[k]*r*w[k]
   * writes it, element by element after its own read (plain loop, no
   * restrict), and no other work item touches the row. */
  const tg_buf bufs[] = {tg_in("x", x, f32_bytes(rows, dim)), tg_in("w", w, f32_bytes(1, dim)),
                         tg_out_in_place("y", y, f32_bytes(rows, dim), "x"),
                         tg_out("r_out", r_out, f32_bytes(rows, 1))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const fwd_args a = {x, w, y, r_out, rows, dim, tg_rows_per_block(dim), eps, ctx->ops};
  return tg_dispatch(ctx, (a.rows + a.rpg - 1) / a.rpg, 1, 1, 0, fwd_group, &a);
}

/* --- 4b. dx[b,k] = r[b]*(dy[b,k]*w[k] - x[b,k]*s[b]*r[b]^2/dim) (writes) ---- */
typedef struct {
  const float *x, *w, *dy, *r;
  float *dx;
  int64_t rows, dim, rpg;
  const tg_isa_ops *ops;
} dx_args;

static void dx_group(const void *vargs, int64_t g, int64_t y, int64_t z, void *scratch) {
  const dx_args *a = vargs;
  const int64_t b1 = min64((g + 1) * a->rpg, a->rows);
  for (int64_t b = g * a->rpg; b < b1; b++) {
    const int64_t o = b * a->dim;
    row_dx(a->ops, a->x + o, a->w, a->dy + o, a->r[b], a->dx + o, a->dim);
  }
}

tg_status tg_rms_norm_backward_dx_f32(tg_ctx *ctx, const float *x, const float *w,
                                      const float *dy, const float *r, float *dx,
                                      uint32_t rows, uint32_t dim) {
  static const char fn[] = "tg_rms_norm_backward_dx_f32";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !x ? "x" : !w ? "w" : !dy ? "dy" : !r ? "r" : !dx ? "dx" : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  tg_status st = check_shape(ctx, fn, "x", rows, dim);
  if (st != TG_OK) return st;
  /* Not in place, not even exactly: the row op (rms_dx_row) takes x, dy and
   * dx as restrict pointers. */
  const tg_buf bufs[] = {tg_in("x", x, f32_bytes(rows, dim)), tg_in("w", w, f32_bytes(1, dim)),
                         tg_in("dy", dy, f32_bytes(rows, dim)), tg_in("r", r, f32_bytes(rows, 1)),
                         tg_out("dx", dx, f32_bytes(rows, dim))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const dx_args a = {x, w, dy, r, dx, rows, dim, tg_rows_per_block(dim), ctx->ops};
  return tg_dispatch(ctx, (a.rows + a.rpg - 1) / a.rpg, 1, 1, 0, dx_group, &a);
}

/* --- 4c. dw[i] = sum_b dy[b,i]*x[b,i]*r[b] (writes) ------------------------- */
typedef struct {
  const float *x, *dy, *r;
  float *dw;
  float *partials; /* [nblocks, dim] */
  int64_t rows, dim, rows_per_block, nblocks;
  const tg_isa_ops *ops;
} dw_args;

/* Pass 1, group g = row block g: partial[g, :] = sum over its rows, in row
 * order, of dy[b,:] * r[b] * x[b,:]. Each group streams whole rows
 * (contiguous x and dy), so the hardware prefetchers see long runs. */
static void dw_rows_group(const void *vargs, int64_t g, int64_t y, int64_t z, void *scratch) {
  const dw_args *a = vargs;
  float *restrict part = a->partials + g * a->dim;
  for (int64_t i = 0; i < a->dim; i++) part[i] = 0.0f;
  const int64_t b1 = min64((g + 1) * a->rows_per_block, a->rows);
  for (int64_t b = g * a->rows_per_block; b < b1; b++)
    a->ops->acc_mul2_f32(part, a->dy + b * a->dim, a->x + b * a->dim, a->r[b], a->dim);
}

/* Pass 2, group c owns dw[c*TG_RMS_COL_BLOCK ..): dw[i] = sum_g partial[g, i], blocks
 * in order 0..nblocks-1. */
static void dw_cols_group(const void *vargs, int64_t c, int64_t y, int64_t z, void *scratch) {
  const dw_args *a = vargs;
  const int64_t c0 = c * TG_RMS_COL_BLOCK, n = min64(TG_RMS_COL_BLOCK, a->dim - c0);
  float acc[TG_RMS_COL_BLOCK] = {0};
  for (int64_t g = 0; g < a->nblocks; g++) a->ops->add_f32(acc, a->partials + g * a->dim + c0, n);
  for (int64_t j = 0; j < n; j++) a->dw[c0 + j] = acc[j];
}

tg_status tg_rms_norm_backward_dw_f32(tg_ctx *ctx, const float *x, const float *dy,
                                      const float *r, float *dw, uint32_t rows,
                                      uint32_t dim) {
  static const char fn[] = "tg_rms_norm_backward_dw_f32";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !x ? "x" : !dy ? "dy" : !r ? "r" : !dw ? "dw" : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  tg_status st = check_shape(ctx, fn, "x", rows, dim);
  if (st != TG_OK) return st;
  const tg_buf bufs[] = {tg_in("x", x, f32_bytes(rows, dim)), tg_in("dy", dy, f32_bytes(rows, dim)),
                         tg_in("r", r, f32_bytes(rows, 1)), tg_out("dw", dw, f32_bytes(1, dim))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  /* Row blocks fixed by `rows` alone (never by the thread count), so dw is
   * bitwise identical for any thread count, in both modes: about one block
   * per TG_RMS_DW_MIN_ROWS rows, at most TG_RMS_DW_SPLIT_MAX_BLOCKS (the partials, at most
   * 64 * dim floats, are small next to x and dy). */
  int64_t nblocks = min64(((int64_t)rows + TG_RMS_DW_MIN_ROWS - 1) / TG_RMS_DW_MIN_ROWS,
                          TG_RMS_DW_SPLIT_MAX_BLOCKS);
  const int64_t rpb = ((int64_t)rows + nblocks - 1) / nblocks;
  nblocks = ((int64_t)rows + rpb - 1) / rpb;
  dw_args a = {x, dy, r, dw, NULL, rows, dim, rpb, nblocks, ctx->ops};
  a.partials = tg_mem_alloc((size_t)nblocks * dim * sizeof(float), 64);
  if (!a.partials)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate %lld x %u floats of dw partials",
                   fn, (long long)nblocks, dim);
  st = tg_dispatch(ctx, nblocks, 1, 1, 0, dw_rows_group, &a);
  if (st == TG_OK)
    st = tg_dispatch(ctx, (a.dim + TG_RMS_COL_BLOCK - 1) / TG_RMS_COL_BLOCK, 1, 1, 0,
                     dw_cols_group, &a);
  tg_mem_free(a.partials);
  return st;
}

/* --- 5. fused: grad_input writes, grad_weight accumulates ------------------- */
typedef struct {
  const float *x, *w, *dy;
  float *dx;
  float *dw;       /* grad_weight */
  float *partials; /* deterministic: [nblocks, dim] row-block partials; else NULL */
  int64_t rows, dim, rows_per_block, nblocks;
  float eps;
  int stream; /* grad_input with non-temporal stores */
  const tg_isa_ops *ops;
} fused_args;

/* Row block g: for each of its rows, r and dx as in 4a/4b, and
 * partial[i] += x[b,i] * r[b] * dy[b,i] (rows in order). */
static void fused_group(const void *vargs, int64_t g, int64_t y, int64_t z,
                        void *scratch) {
  const fused_args *a = vargs;
  const int64_t dim = a->dim;
  float *restrict part = a->partials ? a->partials + g * dim : scratch;
  for (int64_t i = 0; i < dim; i++) part[i] = 0.0f;
  const int64_t b1 = min64((g + 1) * a->rows_per_block, a->rows);
  for (int64_t b = g * a->rows_per_block; b < b1; b++) {
    /* two walks over the row (the second from L1/L2), with the roundings of
     * row_rms_inv, acc_mul2_f32 and row_dx: the same bits as the split kernels */
    const float *x = a->x + b * dim, *dy = a->dy + b * dim;
    float xx, s;
    a->ops->rms_sums_f32(x, dy, a->w, dim, &xx, &s);
    const float r = 1.0f / sqrtf(xx / (float)dim + a->eps);
    const float coeff = s * r * r / (float)dim;
    a->ops->rms_bwd_row(x, a->w, dy, r, coeff, part, a->dx + b * dim, dim, a->stream);
  }
  if (a->stream) a->ops->stream_fence();
  if (!a->partials) tg_add_f32(a->dw, part, dim, 1);
}

/* Deterministic reduce, group c owns columns c*TG_RMS_COL_BLOCK..:
 * grad_weight[i] += sum_g partial[g, i], blocks in order 0..nblocks-1. */
static void fused_reduce_group(const void *vargs, int64_t c, int64_t y, int64_t z,
                               void *scratch) {
  const fused_args *a = vargs;
  const int64_t c0 = c * TG_RMS_COL_BLOCK, n = min64(TG_RMS_COL_BLOCK, a->dim - c0);
  float acc[TG_RMS_COL_BLOCK] = {0};
  for (int64_t g = 0; g < a->nblocks; g++) a->ops->add_f32(acc, a->partials + g * a->dim + c0, n);
  for (int64_t j = 0; j < n; j++) a->dw[c0 + j] += acc[j];
}

tg_status tg_rms_norm_backward(tg_ctx *ctx, const float *input, const float *weight,
                               const float *grad_out, float *grad_input,
                               float *grad_weight, uint32_t n_groups, uint32_t dim,
                               float eps) {
  static const char fn[] = "tg_rms_norm_backward";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !input        ? "input"
                     : !weight     ? "weight"
                     : !grad_out   ? "grad_out"
                     : !grad_input ? "grad_input"
                     : !grad_weight ? "grad_weight"
                                    : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  tg_status st = check_shape(ctx, fn, "input", n_groups, dim);
  if (st == TG_OK) st = check_eps(ctx, fn, eps);
  if (st != TG_OK) return st;
  /* Not in place, not even exactly: the row op (rms_bwd_row) takes input,
   * grad_out and grad_input as restrict pointers; grad_weight accumulates
   * while the rows are read. */
  const tg_buf bufs[] = {tg_in("input", input, f32_bytes(n_groups, dim)),
                         tg_in("weight", weight, f32_bytes(1, dim)),
                         tg_in("grad_out", grad_out, f32_bytes(n_groups, dim)),
                         tg_out("grad_input", grad_input, f32_bytes(n_groups, dim)),
                         tg_out("grad_weight", grad_weight, f32_bytes(1, dim))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;

  /* Blocks of rpb consecutive rows (the last may be shorter): about one per
   * TG_RMS_DW_MIN_ROWS rows, at most max_blocks. Deterministic: max_blocks =
   * TG_RMS_DW_MAX_BLOCKS, so the partition depends on `rows` alone. Otherwise two
   * per thread, so the atomic adds (dim per block) stay few next to the
   * rows * dim work. */
  const int64_t rows = n_groups;
  const int64_t max_blocks =
      ctx->deterministic ? TG_RMS_DW_MAX_BLOCKS : 2 * (int64_t)tg_threads(ctx);
  int64_t nblocks = min64((rows + TG_RMS_DW_MIN_ROWS - 1) / TG_RMS_DW_MIN_ROWS, max_blocks);
  const int64_t rpb = (rows + nblocks - 1) / nblocks;
  nblocks = (rows + rpb - 1) / rpb;
  fused_args a = {input, weight, grad_out, grad_input, grad_weight, NULL, rows, dim, rpb,
                  nblocks, eps, rows * dim * (int64_t)sizeof(float) >= TG_STREAM_BYTES,
                  ctx->ops};

  if (!ctx->deterministic) /* partial in per-thread scratch, atomic add */
    return tg_dispatch(ctx, nblocks, 1, 1, (size_t)dim * sizeof(float), fused_group, &a);

  /* nblocks * dim <= 256 * dim floats, at most the size of the input. */
  a.partials = tg_mem_alloc((size_t)nblocks * dim * sizeof(float), 64);
  if (!a.partials)
    return tg_fail(ctx, TG_ERR_NO_MEMORY,
                   "%s: cannot allocate %lld x %u floats of grad_weight partials", fn,
                   (long long)nblocks, dim);
  st = tg_dispatch(ctx, nblocks, 1, 1, 0, fused_group, &a);
  if (st == TG_OK)
    st = tg_dispatch(ctx, (a.dim + TG_RMS_COL_BLOCK - 1) / TG_RMS_COL_BLOCK, 1, 1, 0,
                     fused_reduce_group, &a);
  tg_mem_free(a.partials);
  return st;
}
