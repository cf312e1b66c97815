/*
 * 12. Rotary position embedding, forward and backward: HF transformers'
 * apply_rotary_pos_emb on one of q, k.
 *
 *   x, y [B, H, L, D] through strides (batch, head, row; D contiguous),
 *   cos, sin [B or 1, L, R] through strides (batch 0 = broadcast), R even.
 *   rotate-half, h = R/2, i < h:
 *     y[i]   = x[i] cos[i] - x[i+h] sin[i],  y[i+h] = x[i+h] cos[i+h] + x[i] sin[i+h]
 *   interleaved pairs: the same with (2i, 2i+1) for (i, i+h);
 *   y[j] = x[j] for R <= j < D.
 *
 * The backward is the transpose of that rotation, dx[i] = dy[i] cos[i] +
 * dy[i+h] sin[i+h], dx[i+h] = dy[i+h] cos[i+h] - dy[i] sin[i]: the forward
 * with the sine's two halves (or the two of each pair) swapped and negated.
 * So both run one row op (rope_row_f32: y = x c + x' s, x' the partner
 * element), given a signed sine s per table row, built here:
 *   forward:  s[i] = -sin[i],   s[i+h] = sin[i+h]
 *   backward: s[i] = sin[i+h],  s[i+h] = -sin[i]
 * (negation is exact and a - b = a + (-b), so every output rounds exactly
 * as the formula reads: two products and a sum, then the one rounding to
 * y's dtype.)
 *
 * Metal grid -> CPU groups: the twin runs one thread per (pair, row, head,
 * batch); here one work item runs the H heads of a block of consecutive
 * rows l of one batch, so each table row is widened and signed once for
 * all heads. Inside it the loop over heads and rows follows x's strides
 * (the smaller one inner): contiguous [B, H, L, D] walks each head's rows,
 * [B, L, H, D] storage seen through transpose(1, 2) walks a row's heads.
 * Rows are independent, so the result does not depend on the thread count.
 */
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "reduce.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static size_t dtype_bytes(int32_t t) { return t == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16); }

/* --- validation ------------------------------------------------------------- */
static int dtype_ok(int32_t t) { return t == TG_DTYPE_BF16 || t == TG_DTYPE_F32; }

/* The largest element offset addressed through strides s over dims n (the
 * innermost `inner` elements contiguous), +1, in *extent: refused if a
 * stride is negative or the offset overflows int64. */
static tg_status strided_extent(tg_ctx *ctx, const char *fn, const char *name, const int64_t *s,
                                const int64_t *n, int nd, int64_t inner, int64_t *extent) {
  int64_t last = inner;
  for (int i = 0; i < nd; i++) {
    if (s[i] < 0)
      return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: params->%s[%d] = %lld; strides must be >= 0",
                     fn, name, i, (long long)s[i]);
    int64_t t;
    if (!tg_mul_ok(&t, 2, n[i] - 1, s[i]) || __builtin_add_overflow(last, t, &last))
      return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: params->%s address an offset beyond int64", fn,
                     name);
  }
  *extent = last;
  return TG_OK;
}

/* y's rows must be disjoint (the rows are written in parallel): sorted by
 * stride, each dim of size > 1 must step past everything inside it. A
 * sufficient rule (every dense and transposed layout passes it). */
static tg_status check_rows_disjoint(tg_ctx *ctx, const char *fn, const int64_t s[3],
                                     const int64_t n[3], int64_t D) {
  int idx[3] = {0, 1, 2};
  for (int a = 0; a < 3; a++) /* three elements: insertion sort by stride */
    for (int b = a; b > 0 && s[idx[b]] < s[idx[b - 1]]; b--) {
      const int t = idx[b];
      idx[b] = idx[b - 1], idx[b - 1] = t;
    }
  int64_t extent = D; /* elements spanned by the dims inside, all offsets fit (checked) */
  for (int k = 0; k < 3; k++) {
    const int i = idx[k];
    if (n[i] == 1) continue;
    if (s[i] < extent)
      return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                     "%s: params->y_strides = {%lld, %lld, %lld} make rows of y overlap "
                     "(stride %d is %lld, below the %lld elements inside it)",
                     fn, (long long)s[0], (long long)s[1], (long long)s[2], i,
                     (long long)s[i], (long long)extent);
    extent += (n[i] - 1) * s[i];
  }
  return TG_OK;
}

static tg_status validate(tg_ctx *ctx, const char *fn, const tg_rope_params *p, const void *x,
                          const void *cos, const void *sin, const void *y, const char *xn,
                          const char *yn) {
  if (!p) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: params is NULL", fn);
  const char *null = !x ? xn : !cos ? "cos" : !sin ? "sin" : !y ? yn : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  const struct { const char *name; int32_t v; } sizes[] = {
      {"B", p->B}, {"H", p->H}, {"L", p->L}, {"D", p->D}};
  for (int i = 0; i < 4; i++)
    if (sizes[i].v < 1)
      return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: params->%s = %d; it must be >= 1", fn,
                     sizes[i].name, (int)sizes[i].v);
  if (p->rotary_dim < 2 || p->rotary_dim > p->D || p->rotary_dim % 2)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: params->rotary_dim = %d; it must be even and in [2, D = %d]", fn,
                   (int)p->rotary_dim, (int)p->D);
  if (p->layout != TG_ROPE_ROTATE_HALF && p->layout != TG_ROPE_INTERLEAVED)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: params->layout = %d is no tg_rope_layout", fn,
                   (int)p->layout);
  const struct { const char *name; int32_t v; } types[] = {
      {"x_dtype", p->x_dtype}, {"y_dtype", p->y_dtype}, {"table_dtype", p->table_dtype}};
  for (int i = 0; i < 3; i++)
    if (!dtype_ok(types[i].v))
      return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: params->%s = %d is no tg_dtype", fn,
                     types[i].name, (int)types[i].v);
  if (p->flags)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: params->flags = 0x%x; no flag is defined", fn,
                   (unsigned)p->flags);
  tg_status st = tg_shape_count(ctx, "x, y [B, H, L, D]", sizeof(float), NULL, 4,
                                (int64_t)p->B, (int64_t)p->H, (int64_t)p->L, (int64_t)p->D);
  if (st) return st;
  const int64_t n4[3] = {p->B, p->H, p->L}, n2[2] = {p->B, p->L};
  int64_t ex = 0, ey = 0, ec = 0, es = 0;
  if ((st = strided_extent(ctx, fn, "x_strides", p->x_strides, n4, 3, p->D, &ex)) ||
      (st = strided_extent(ctx, fn, "y_strides", p->y_strides, n4, 3, p->D, &ey)) ||
      (st = strided_extent(ctx, fn, "cos_strides", p->cos_strides, n2, 2, p->rotary_dim, &ec)) ||
      (st = strided_extent(ctx, fn, "sin_strides", p->sin_strides, n2, 2, p->rotary_dim, &es)) ||
      (st = check_rows_disjoint(ctx, fn, p->y_strides, n4, p->D)))
    return st;
  /* extents in elements fit int64; in bytes they may not: saturate */
  const size_t bx = dtype_bytes(p->x_dtype), by = dtype_bytes(p->y_dtype),
               bt = dtype_bytes(p->table_dtype);
#define TG_BYTES(e, b) ((uint64_t)(e) > UINT64_MAX / (b) ? UINT64_MAX : (uint64_t)(e) * (b))
  if (x == y && (p->x_dtype != p->y_dtype ||
                 memcmp(p->x_strides, p->y_strides, sizeof p->x_strides) != 0))
    return tg_fail(ctx, TG_ERR_ALIAS,
                   "%s: %s == %s, but in place needs the same dtype and strides for both", fn,
                   yn, xn);
  const tg_buf bufs[] = {tg_in(xn, x, TG_BYTES(ex, bx)), tg_in("cos", cos, TG_BYTES(ec, bt)),
                         tg_in("sin", sin, TG_BYTES(es, bt)),
                         tg_out_in_place(yn, y, TG_BYTES(ey, by), xn)};
#undef TG_BYTES
  return tg_check_alias(ctx, fn, bufs, TG_LEN(bufs));
}

/* --- the work ---------------------------------------------------------------- */
typedef struct {
  const void *x, *cos, *sin;
  void *y;
  const tg_rope_params *p;
  int64_t rows_per_item; /* consecutive l per work item */
  int backward;
  const tg_isa_ops *ops;
} rope_args;

/* A row of n elements of dtype t at p as f32 in buf, or p itself (f32). */
static const float *as_f32(const tg_isa_ops *ops, const void *p, int32_t t, int64_t n,
                           float *buf) {
  if (t == TG_DTYPE_F32) return p;
  ops->bf16_to_f32(p, buf, n);
  return buf;
}

/* The table row l of batch b: c = cos, s = the signed sine (see the top). */
static void table_row(const rope_args *a, int64_t b, int64_t l, float *c, float *s,
                      float *tmp) {
  const tg_rope_params *p = a->p;
  const int64_t R = p->rotary_dim, h = R / 2;
  const size_t bt = dtype_bytes(p->table_dtype);
  const char *cr = (const char *)a->cos + (b * p->cos_strides[0] + l * p->cos_strides[1]) * bt;
  const char *sr = (const char *)a->sin + (b * p->sin_strides[0] + l * p->sin_strides[1]) * bt;
  const float *cf = as_f32(a->ops, cr, p->table_dtype, R, tmp);
  memcpy(c, cf, R * sizeof(float));
  const float *sf = as_f32(a->ops, sr, p->table_dtype, R, tmp);
  if (p->layout == TG_ROPE_ROTATE_HALF) {
    for (int64_t i = 0; i < h; i++)
      if (!a->backward)
        s[i] = -sf[i], s[i + h] = sf[i + h];
      else
        s[i] = sf[i + h], s[i + h] = -sf[i];
  } else {
    for (int64_t i = 0; i < h; i++)
      if (!a->backward)
        s[2 * i] = -sf[2 * i], s[2 * i + 1] = sf[2 * i + 1];
      else
        s[2 * i] = sf[2 * i + 1], s[2 * i + 1] = -sf[2 * i];
  }
}

/* One head row: y = rotation of x's first R, then x's D - R as they are;
 * through f32 buffers (so y may be x: the row is read whole first). */
static void head_row(const rope_args *a, const void *xr, void *yr, const float *c,
                     const float *s, float *xbuf, float *ybuf) {
  const tg_rope_params *p = a->p;
  const int64_t D = p->D, R = p->rotary_dim;
  const float *xf = as_f32(a->ops, xr, p->x_dtype, D, xbuf);
  a->ops->rope_row_f32(xf, c, s, ybuf, R, p->layout == TG_ROPE_INTERLEAVED);
  memcpy(ybuf + R, xf + R, (D - R) * sizeof(float));
  if (p->y_dtype == TG_DTYPE_F32)
    memcpy(yr, ybuf, D * sizeof(float));
  else
    a->ops->f32_to_bf16(ybuf, yr, D);
}

/* Work item (g, b): rows l of [g * rows_per_item, ...) of batch b, all heads.
 * scratch: the block's tables (c, s per row), then x and y row buffers. */
static void rope_group(const void *vargs, int64_t g, int64_t b, int64_t z, void *scratch) {
  const rope_args *a = vargs;
  const tg_rope_params *p = a->p;
  const int64_t R = p->rotary_dim, D = p->D, H = p->H;
  const int64_t l0 = g * a->rows_per_item, nl = min64(a->rows_per_item, p->L - l0);
  float *tables = scratch; /* [nl][2][R] */
  float *xbuf = tables + a->rows_per_item * 2 * R, *ybuf = xbuf + D;
  for (int64_t i = 0; i < nl; i++)
    table_row(a, b, l0 + i, tables + i * 2 * R, tables + i * 2 * R + R, xbuf);
  const size_t bx = dtype_bytes(p->x_dtype), by = dtype_bytes(p->y_dtype);
  const int64_t *xs = p->x_strides, *ys = p->y_strides;
  const int heads_inner = xs[1] < xs[2];
  const int64_t n_outer = heads_inner ? nl : H, n_inner = heads_inner ? H : nl;
  for (int64_t o = 0; o < n_outer; o++)
    for (int64_t in = 0; in < n_inner; in++) {
      const int64_t h = heads_inner ? in : o, i = heads_inner ? o : in, l = l0 + i;
      const char *xr = (const char *)a->x + (b * xs[0] + h * xs[1] + l * xs[2]) * bx;
      char *yr = (char *)a->y + (b * ys[0] + h * ys[1] + l * ys[2]) * by;
      head_row(a, xr, yr, tables + i * 2 * R, tables + i * 2 * R + R, xbuf, ybuf);
    }
}

static tg_status rope_run(tg_ctx *ctx, const char *fn, const void *x, const void *cos,
                          const void *sin, void *y, const tg_rope_params *p, int backward,
                          const char *xn, const char *yn) {
  tg_status st = validate(ctx, fn, p, x, cos, sin, y, xn, yn);
  if (st) return st;
  const int64_t H = p->H, D = p->D, R = p->rotary_dim;
  /* about TG_ROW_BLOCK_ELEMS elements of x per work item, and at most 4096
   * table entries (32 KiB of f32 cos and sine) in its scratch */
  const int64_t rpi =
      max64(1, min64(min64(TG_ROW_BLOCK_ELEMS / (H * D), 4096 / R), (int64_t)p->L));
  const rope_args a = {x, cos, sin, y, p, rpi, backward, ctx->ops};
  const size_t scratch = (size_t)(rpi * 2 * R + 2 * D) * sizeof(float);
  return tg_dispatch(ctx, (p->L + rpi - 1) / rpi, p->B, 1, scratch, rope_group, &a);
}

tg_status tg_rope_forward(tg_ctx *ctx, const void *x, const void *cos, const void *sin,
                          void *y, const tg_rope_params *p) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  return rope_run(ctx, "tg_rope_forward", x, cos, sin, y, p, 0, "x", "y");
}

tg_status tg_rope_backward(tg_ctx *ctx, const void *dy, const void *cos, const void *sin,
                           void *dx, const tg_rope_params *p) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  return rope_run(ctx, "tg_rope_backward", dy, cos, sin, dx, p, 1, "dy", "dx");
}

static void set_contiguous(int64_t s[3], int64_t H, int64_t L, int64_t D) {
  s[2] = D, s[1] = L * D, s[0] = H * L * D;
}

tg_status tg_rope_params_init(tg_rope_params *p, int B, int H, int L, int D, int rotary_dim,
                              tg_rope_layout layout) {
  if (!p) return TG_ERR_NULL_ARG;
  if (B < 1 || H < 1 || L < 1 || D < 1) return TG_ERR_BAD_SHAPE;
  if (rotary_dim < 2 || rotary_dim > D || rotary_dim % 2) return TG_ERR_BAD_PARAMS;
  if (layout != TG_ROPE_ROTATE_HALF && layout != TG_ROPE_INTERLEAVED) return TG_ERR_BAD_PARAMS;
  int64_t n;
  if (!tg_mul_ok(&n, 4, (int64_t)B, (int64_t)H, (int64_t)L, (int64_t)D)) return TG_ERR_OVERFLOW;
  *p = (tg_rope_params){.B = B, .H = H, .L = L, .D = D, .rotary_dim = rotary_dim,
                        .layout = layout, .x_dtype = TG_DTYPE_F32, .y_dtype = TG_DTYPE_F32,
                        .table_dtype = TG_DTYPE_F32};
  set_contiguous(p->x_strides, H, L, D);
  set_contiguous(p->y_strides, H, L, D);
  p->cos_strides[0] = p->sin_strides[0] = 0;
  p->cos_strides[1] = p->sin_strides[1] = rotary_dim;
  return TG_OK;
}
