/* 11. Decode: reduce of split-KV flash-attention partials, and the TurboQuant
 * Hadamard/sign undo (mlx-native flash_attn_vec family).
 *
 * htmp, for nrows rows, nwg workgroups, value dim DV (= head_dim):
 *   partials  nrows*DV*nwg floats, interleaved in fours: part[r, w, 4c+k] at
 *             ((r*(DV/4) + c)*nwg + w)*4 + k
 *   (S, M)    nrows*nwg pairs after them: S[r,w] at nrows*DV*nwg + (r*nwg + w)*2,
 *             M[r,w] one float later (S = sum of exp weights, M = running max)
 *
 * Reduce, per row r:
 *   Mg  = max_w M[w]
 *   a_w = exp(M[w] - Mg)
 *   St  = sum_w S[w] * a_w
 *   dst[r, d] = (sum_w part[w, d] * a_w) / St,    0 where St == 0
 * A workgroup that saw no keys has M = -inf (a_w = 0): it is skipped, so
 * whatever its partials hold cannot turn into NaN (0 * inf), and a row of only
 * empty workgroups is 0. Any other workgroup is read, also when its weight
 * underflows to 0 in f32: a NaN or inf in its S or partials then makes the
 * row (element) NaN, as IEEE arithmetic does.
 *
 * Hadamard/sign undo, per row x of D = 256 or 512:
 *   y = H x / sqrt(D)    H the Sylvester Hadamard matrix, H[i][j] = (-1)^popcount(i & j)
 *   y[j] *= sign(j)      sign(j) = -1 where bit j of the D1 table is set
 *
 * Metal: one threadgroup per row (32*nwg threads for the fused kernel, nwg
 * capped at 32). CPU: one group per block of whole rows (~8 Ki floats read);
 * the row loops are ISA-layer ops: the weighted sum over workgroups
 * (wsum4_f32, four output quads in flight, the non-empty workgroups listed
 * so the empty ones are never read) and the transform (fwht_mul_f32: the
 * butterflies vectorized, the 1/sqrt(D) and the sign folded into one factor
 * per element). The fused kernel reduces each row into its output row and
 * transforms it there, with the very same ops as tg_flash_attn_vec_reduce
 * followed by tg_fwht_sign_undo_f32, so fused and unfused results are
 * bitwise equal. nwg is unbounded.
 */
#include <math.h>

#include "engine.h"
#include "reduce.h"

/* The TurboQuant D1 sign table: bit j = (T[j >> 3] >> (j & 7)) & 1, 1 -> -1.
 * D = 256 uses the first 32 bytes, D = 512 all 64.
 * sha256(first 32) = 3ef1038e6c232e9519101daa2d6efd637d4c6bfdb29f4ee7101625c39d0ddc89
 * sha256(all 64)   = 44f13ce9f6db1edac62f558ee054f9de29cd474fd051362cadcaa98a55745f17
 * (checked by tests/test_decode.c). */
static const uint8_t tq_d1_signs[64] = {
    0xa7, 0x3b, 0x91, 0xf4, 0x6d, 0xc2, 0x58, 0x0e, 0xb3, 0x7f, 0x24, 0xd6, 0x89,
    0x45, 0xea, 0x1c, 0x63, 0xaf, 0xd8, 0x52, 0x97, 0x0b, 0xe1, 0x3d, 0x76, 0xc4,
    0x19, 0xfe, 0x4a, 0x85, 0x2c, 0xdb, 0xd3, 0x4e, 0xa8, 0x17, 0x9c, 0x5b, 0xe6,
    0x31, 0x72, 0xb9, 0x0d, 0xf5, 0x43, 0x8a, 0x6e, 0xc7, 0x58, 0x2f, 0x94, 0xe1,
    0xb6, 0x3d, 0x0a, 0x7c, 0xc5, 0x61, 0xd8, 0x4f, 0xa3, 0x97, 0x1e, 0x85};

typedef struct {
  const float *htmp;
  float *out;
  int64_t nrows, DV, nwg, rpg; /* rpg: rows per group */
  const tg_isa_ops *ops;
  float mul[512]; /* FWHT: sign(j) / sqrt(D), the undo's per-element factor */
} dec_args;

/* Scratch of one reduce group: nwg weights and the indices of the non-empty
 * workgroups. */
static size_t reduce_scratch(int64_t nwg) {
  return tg_align64((size_t)nwg * sizeof(float)) + (size_t)nwg * sizeof(int32_t);
}

/* dst[0:DV] = reduce of row r (see the header). a, wi: nwg floats / ints of
 * scratch. The weighted sum over workgroups (in workgroup order, the empty
 * ones never read) runs in the ISA layer, four output quads at a time. */
static void reduce_row(const dec_args *g, int64_t r, float *dst, float *a, int32_t *wi) {
  const int64_t DV = g->DV, nwg = g->nwg;
  const float *SM = g->htmp + g->nrows * DV * nwg + r * nwg * 2;
  float Mg = -INFINITY;
  for (int64_t w = 0; w < nwg; w++)
    if (SM[2 * w + 1] > Mg) Mg = SM[2 * w + 1];
  float St = 0.0f;
  int64_t nw = 0;
  for (int64_t w = 0; w < nwg; w++) {
    const float M = SM[2 * w + 1];
    if (M == -INFINITY) continue; /* empty workgroup: never read */
    /* A weight that underflows to 0 stays in the list: 0 times a NaN or inf
     * in its S or partials is NaN, which skipping it would hide. */
    const float aw = expf(M - Mg);
    St += SM[2 * w] * aw;
    a[nw] = aw;
    wi[nw++] = (int32_t)w;
  }
  if (St == 0.0f) {
    for (int64_t d = 0; d < DV; d++) dst[d] = 0.0f;
    return;
  }
  /* part[w, 4c+k] = htmp[((r*(DV/4) + c)*nwg + w)*4 + k] */
  g->ops->wsum4_f32(g->htmp + r * DV * nwg, nwg, wi, a, nw, DV / 4, St, dst);
}

static void reduce_group(const void *vargs, int64_t grp, int64_t y, int64_t z, void *scratch) {
  const dec_args *g = vargs;
  float *a = scratch;
  int32_t *wi = (int32_t *)((char *)scratch + tg_align64((size_t)g->nwg * sizeof(float)));
  const int64_t r1 = (grp + 1) * g->rpg < g->nrows ? (grp + 1) * g->rpg : g->nrows;
  for (int64_t r = grp * g->rpg; r < r1; r++) reduce_row(g, r, g->out + r * g->DV, a, wi);
}

/* The reduce of each row straight into its output row, then the transform in
 * place there: the ops (and so the bits) of tg_flash_attn_vec_reduce followed
 * by tg_fwht_sign_undo_f32. (Staging the row in per-thread scratch instead
 * made fwht_mul_f32's prefetch 2 KiB past the row land in the next thread's
 * scratch, with write intent: 61% of triad against 84% for the plain reduce.) */
static void reduce_undo_group(const void *vargs, int64_t grp, int64_t y, int64_t z,
                              void *scratch) {
  const dec_args *g = vargs;
  float *a = scratch; /* [nwg] weights, [nwg] indices */
  int32_t *wi = (int32_t *)((char *)scratch + tg_align64((size_t)g->nwg * sizeof(float)));
  const int64_t r1 = (grp + 1) * g->rpg < g->nrows ? (grp + 1) * g->rpg : g->nrows;
  for (int64_t r = grp * g->rpg; r < r1; r++) {
    float *dst = g->out + r * g->DV;
    reduce_row(g, r, dst, a, wi);
    g->ops->fwht_mul_f32(dst, g->DV, g->mul);
  }
}

/* x[0:D] <- sign .* (H x) / sqrt(D) in place, for a block of rows: the
 * butterflies and the factor mul[j] = sign(j) / sqrt(D) (x * -s is exactly
 * -(x * s), so this is "scale, then flip the sign") in the ISA layer. */
static void undo_group(const void *vargs, int64_t grp, int64_t y, int64_t z, void *scratch) {
  const dec_args *g = vargs;
  const int64_t r1 = (grp + 1) * g->rpg < g->nrows ? (grp + 1) * g->rpg : g->nrows;
  for (int64_t r = grp * g->rpg; r < r1; r++) g->ops->fwht_mul_f32(g->out + r * g->DV, g->DV, g->mul);
}

/* mul[j] = +-1/sqrt(D) from the D1 sign table. */
static void fill_undo_mul(dec_args *g, int64_t D) {
  const float inv_sqrt_d = (float)(1.0 / sqrt((double)D));
  for (int64_t j = 0; j < D; j++)
    g->mul[j] = (tq_d1_signs[j >> 3] >> (j & 7)) & 1 ? -inv_sqrt_d : inv_sqrt_d;
}

/* Shared validation of (htmp, out, nrows, head_dim, nwg). */
static tg_status check_reduce(tg_ctx *ctx, const char *fn, const float *htmp,
                              const float *out, const char *out_name, uint32_t nrows,
                              uint32_t head_dim, uint32_t nwg) {
  if (!htmp) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: htmp is NULL", fn);
  if (!out) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, out_name);
  if (nrows == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: nrows is 0; it must be >= 1", fn);
  if (head_dim == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: head_dim is 0; it must be >= 1", fn);
  if (nwg == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: nwg is 0; it must be >= 1", fn);
  /* htmp holds nrows*nwg*(head_dim + 2) floats. */
  return tg_shape_count(ctx, fn, sizeof(float), NULL, 3, (int64_t)nrows, (int64_t)nwg,
                        (int64_t)head_dim + 2);
}

/* The reduce's output may not overlap htmp, not even exactly: output row r
 * lands on htmp floats [r*D, (r+1)*D), the partials of rows that other work
 * items are still reducing. (After check_reduce: the sizes fit int64.) */
static tg_status check_reduce_alias(tg_ctx *ctx, const char *fn, const float *htmp,
                                    const float *out, const char *out_name, uint32_t nrows,
                                    uint32_t head_dim, uint32_t nwg) {
  const uint64_t htmp_floats = (uint64_t)nrows * nwg * ((uint64_t)head_dim + 2);
  const tg_buf bufs[] = {tg_in("htmp", htmp, htmp_floats * sizeof(float)),
                         tg_out(out_name, out, (uint64_t)nrows * head_dim * sizeof(float))};
  return tg_check_alias(ctx, fn, bufs, TG_LEN(bufs));
}

tg_status tg_flash_attn_vec_reduce(tg_ctx *ctx, const float *htmp, float *dst,
                                   uint32_t nrows, uint32_t head_dim, uint32_t nwg) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  static const char fn[] = "tg_flash_attn_vec_reduce";
  tg_status st = check_reduce(ctx, fn, htmp, dst, "dst", nrows, head_dim, nwg);
  if (st) return st;
  if (head_dim % 4 != 0)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "%s: head_dim = %u; it must be a multiple of 4", fn, head_dim);
  if ((st = check_reduce_alias(ctx, fn, htmp, dst, "dst", nrows, head_dim, nwg))) return st;
  /* groups of whole rows, ~8 Ki partial floats each */
  dec_args g = {htmp, dst, nrows, head_dim, nwg,
                tg_rows_per_block((int64_t)head_dim * nwg), ctx->ops, {0}};
  return tg_dispatch(ctx, (g.nrows + g.rpg - 1) / g.rpg, 1, 1, reduce_scratch(nwg),
                     reduce_group, &g);
}

tg_status tg_flash_attn_vec_reduce_tq_hb_undo(tg_ctx *ctx, const float *htmp,
                                              float *output, uint32_t nrows,
                                              uint32_t head_dim, uint32_t nwg) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  static const char fn[] = "tg_flash_attn_vec_reduce_tq_hb_undo";
  tg_status st = check_reduce(ctx, fn, htmp, output, "output", nrows, head_dim, nwg);
  if (st) return st;
  if (head_dim != 256 && head_dim != 512)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED, "%s: head_dim = %u; it must be 256 or 512", fn,
                   head_dim);
  if ((st = check_reduce_alias(ctx, fn, htmp, output, "output", nrows, head_dim, nwg)))
    return st;
  dec_args g = {htmp, output, nrows, head_dim, nwg,
                tg_rows_per_block((int64_t)head_dim * nwg), ctx->ops, {0}};
  fill_undo_mul(&g, head_dim);
  return tg_dispatch(ctx, (g.nrows + g.rpg - 1) / g.rpg, 1, 1, reduce_scratch(nwg),
                     reduce_undo_group, &g);
}

tg_status tg_fwht_sign_undo_f32(tg_ctx *ctx, float *data, uint32_t num_heads,
                                uint32_t head_dim) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  static const char fn[] = "tg_fwht_sign_undo_f32";
  if (!data) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: data is NULL", fn);
  if (num_heads == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: num_heads is 0; it must be >= 1", fn);
  if (head_dim == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: head_dim is 0; it must be >= 1", fn);
  tg_status st = tg_shape_count(ctx, "tg_fwht_sign_undo_f32: data [num_heads, head_dim]",
                                sizeof(float), NULL, 2, (int64_t)num_heads,
                                (int64_t)head_dim);
  if (st) return st;
  if (head_dim != 256 && head_dim != 512)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED, "%s: head_dim = %u; it must be 256 or 512", fn,
                   head_dim);
  dec_args g = {NULL, data, num_heads, head_dim, 1, tg_rows_per_block(head_dim), ctx->ops, {0}};
  fill_undo_mul(&g, head_dim);
  return tg_dispatch(ctx, (g.nrows + g.rpg - 1) / g.rpg, 1, 1, 0, undo_group, &g);
}
