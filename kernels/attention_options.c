/*
 * What the dtype / options entry points add to the attention kernels (a CPU
 * extension beyond the Metal contract): their extra checks, and dropout's
 * keep flags drawn from Philox4x32-10 (isa/philox.h; the vector
 * generator is the ISA layer's dropout_keep).
 *
 * The draw of weight n = ((b H + h) qL + i) kL + k is word n % 4 of
 * Philox4x32-10(key = seed, counter = offset + floor(n / 4)), with the
 * 128-bit counter's words c0..c3 and the key's k0, k1 taken little-endian
 * from the 64-bit values (a carry of offset + n/4 goes to c2). The weight is
 * kept iff draw >= threshold = round(p * 2^32). Each draw depends on its
 * number alone, so the forward and the backward, every tile order, schedule
 * and thread count, and tg_attn_dropout_keep see the same mask.
 */
#include <math.h>
#include <string.h>

#include "attention.h"
#include "reduce.h" /* tg_rows_per_block */

tg_status tg_attn_check_dtype(tg_ctx *ctx, const char *fn, tg_dtype dtype) {
  if (dtype != TG_DTYPE_BF16 && dtype != TG_DTYPE_F32)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: dtype = %d; it must be TG_DTYPE_BF16 (0) or TG_DTYPE_F32 (1)", fn,
                   (int)dtype);
  return TG_OK;
}

tg_status tg_attn_check_options(tg_ctx *ctx, const char *fn, const tg_attn_options *opt,
                                tg_attn_dropout *drop) {
  *drop = (tg_attn_dropout){0};
  if (!opt) return TG_OK;
  const uint32_t defined = TG_ATTN_OPT_O_F32 | TG_ATTN_OPT_DKV_WRITE;
  if (opt->flags & ~defined)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: opt->flags = 0x%x has bits that are not TG_ATTN_OPT_* flags "
                   "(defined: TG_ATTN_OPT_O_F32 = 0x%x, TG_ATTN_OPT_DKV_WRITE = 0x%x)",
                   fn, (unsigned)opt->flags, (unsigned)TG_ATTN_OPT_O_F32,
                   (unsigned)TG_ATTN_OPT_DKV_WRITE);
  const float p = opt->dropout_p;
  if (!(p >= 0.0f && p < 1.0f)) /* NaN fails both */
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: opt->dropout_p = %g; it must be in [0, 1)",
                   fn, (double)p);
  /* p <= 1 - 2^-24, so p * 2^32 (exact in double) rounds to at most
   * 2^32 - 2^8: a uint32. rint: nearest, ties to even (the default mode). */
  if (opt->v_head_dim % 8 != 0 || opt->v_head_dim > TG_ATTN_MAX_D)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "%s: opt->v_head_dim = %u; tilegrad takes value head dims that are "
                   "multiples of 8 up to %d (0 = the head dim D)",
                   fn, (unsigned)opt->v_head_dim, TG_ATTN_MAX_D);
  if (opt->d_sinks && !opt->sinks)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: opt->d_sinks is given but opt->sinks is NULL (the sinks' gradient "
                   "needs the sinks)", fn);
  drop->threshold = (uint32_t)rint((double)p * 4294967296.0);
  /* threshold 0 (p <= 2^-33) is no dropout; 1 - p then rounds to 1 anyway */
  drop->scale = 1.0f / (1.0f - p);
  drop->seed = opt->dropout_seed;
  drop->offset = opt->dropout_offset;
  return TG_OK;
}

tg_status tg_attn_prepare(tg_ctx *ctx, const char *fn, tg_dtype dtype,
                          const tg_attn_options *opt, const tg_attn_params *p,
                          const tg_attn_mask_params *mp, const void *mask, int causal,
                          tg_attn_problem *out) {
  tg_attn_dropout drop;
  tg_status st = tg_attn_check_dtype(ctx, fn, dtype);
  if (st == TG_OK) st = tg_attn_check_options(ctx, fn, opt, &drop);
  if (st == TG_OK)
    st = tg_attn_validate(ctx, fn, p, mp, mask, causal, opt ? opt->v_head_dim : 0, out);
  if (st != TG_OK) return st;
  out->in = dtype;
  out->window = opt ? opt->window : 0;
  out->sinks = opt ? opt->sinks : NULL;
  out->drop = drop;
  out->o_f32 = opt && (opt->flags & TG_ATTN_OPT_O_F32);
  out->dkv_write = opt && (opt->flags & TG_ATTN_OPT_DKV_WRITE);
  /* float32 inputs always compute in f32 (tg_attn_precision) */
  out->precision = dtype == TG_DTYPE_BF16 ? ctx->attn_precision : TG_ATTN_PRECISION_EXACT;
  return TG_OK;
}

void tg_attn_dropout_tile(const tg_isa_ops *ops, const tg_attn_dropout *d,
                          const tg_attn_problem *pr, int64_t b, int64_t h, int64_t q0, int64_t nq,
                          int64_t k0, int64_t nk, uint8_t *keep, int64_t ldk) {
  for (int64_t i = 0; i < nq; i++) {
    const int64_t n0 = ((b * pr->H + h) * pr->qL + q0 + i) * pr->kL + k0;
    ops->dropout_keep(keep + i * ldk, nk, (uint64_t)n0, d->seed, d->offset, d->threshold);
  }
}

void tg_attn_dropout_apply(const uint8_t *keep, int64_t ldk, float *x, int64_t ldx,
                           int64_t nq, int64_t nk, float scale) {
  for (int64_t i = 0; i < nq; i++) {
    const uint8_t *restrict kr = keep + i * ldk;
    float *restrict xr = x + i * ldx;
    /* x * scale, then its bits and-ed with all ones (kept) or zeros (dropped:
     * +0.0f): no branch per weight, which random flags would mispredict, and
     * a loop the compiler vectorizes (a conditional multiply it keeps as a
     * branch under trapping math) */
    for (int64_t k = 0; k < nk; k++) {
      const float scaled = xr[k] * scale;
      uint32_t bits;
      memcpy(&bits, &scaled, sizeof bits);
      bits &= 0u - (uint32_t)kr[k]; /* kr[k] is 0 or 1 */
      memcpy(&xr[k], &bits, sizeof bits);
    }
  }
}

/* --- tg_attn_dropout_keep: the mask of a whole problem, rows in blocks ---- */
typedef struct {
  tg_attn_dropout drop;
  int64_t rows, kL, rows_per_item;
  uint8_t *keep;
  const tg_isa_ops *ops;
} keep_args;

static void keep_group(const void *vargs, int64_t item, int64_t y, int64_t z, void *scratch) {
  const keep_args *a = vargs;
  const int64_t r0 = item * a->rows_per_item;
  const int64_t r1 = r0 + a->rows_per_item < a->rows ? r0 + a->rows_per_item : a->rows;
  a->ops->dropout_keep(a->keep + r0 * a->kL, (r1 - r0) * a->kL, (uint64_t)(r0 * a->kL),
                       a->drop.seed, a->drop.offset, a->drop.threshold);
}

tg_status tg_attn_dropout_keep(tg_ctx *ctx, const tg_attn_options *opt, uint32_t B,
                               uint32_t H, uint32_t qL, uint32_t kL, uint8_t *keep) {
  static const char fn[] = "tg_attn_dropout_keep";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (!keep) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: keep is NULL", fn);
  keep_args a = {.kL = kL, .keep = keep, .ops = ctx->ops};
  tg_status st = tg_attn_check_options(ctx, fn, opt, &a.drop);
  if (st != TG_OK) return st;
  int64_t n;
  if ((st = tg_shape_count(ctx, "tg_attn_dropout_keep: keep [B, H, qL, kL]", 1, &n, 4,
                           (int64_t)B, (int64_t)H, (int64_t)qL, (int64_t)kL)))
    return st;
  a.rows = n / kL;
  a.rows_per_item = tg_rows_per_block(kL);
  if (a.drop.threshold == 0) { /* no dropout: every weight kept */
    memset(keep, 1, (size_t)n);
    return TG_OK;
  }
  return tg_dispatch(ctx, (a.rows + a.rows_per_item - 1) / a.rows_per_item, 1, 1, 0,
                     keep_group, &a);
}
