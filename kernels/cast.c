/* 3. f32 -> bf16 cast: dst[i] = bf16(src[i]), round to nearest even.
 * Metal: one thread per element; here one group per 64 Ki-element chunk. */
#include "engine.h"

enum { CAST_CHUNK = 1 << 16 };

typedef struct {
  const float *src;
  tg_bf16 *dst;
  int64_t n;
  const tg_micro_ops *ops;
} cast_args;

static void cast_group(const void *vargs, int64_t chunk, int64_t y, int64_t z,
                       void *scratch) {
  const cast_args *a = vargs;
  const int64_t begin = chunk * CAST_CHUNK;
  const int64_t len = a->n - begin < CAST_CHUNK ? a->n - begin : CAST_CHUNK;
  a->ops->f32_to_bf16(a->src + begin, a->dst + begin, len);
}

tg_status tg_f32_to_bf16_cast(tg_ctx *ctx, const float *src, tg_bf16 *dst, uint64_t n) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (!src || !dst)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "tg_f32_to_bf16_cast: %s is NULL",
                   !src ? "src" : "dst");
  if (n == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "tg_f32_to_bf16_cast: n is 0");
  if (n > (uint64_t)INT64_MAX / sizeof(float))
    return tg_fail(ctx, TG_ERR_OVERFLOW,
                   "tg_f32_to_bf16_cast: n = %llu elements overflow int64 bytes",
                   (unsigned long long)n);
  const tg_buf bufs[] = {tg_in("src", src, n * sizeof(float)),
                         tg_out("dst", dst, n * sizeof(tg_bf16))};
  tg_status st = tg_check_alias(ctx, "tg_f32_to_bf16_cast", bufs, TG_LEN(bufs));
  if (st != TG_OK) return st;
  const cast_args a = {src, dst, (int64_t)n, ctx->ops};
  return tg_dispatch(ctx, ((int64_t)n + CAST_CHUNK - 1) / CAST_CHUNK, 1, 1, 0, cast_group,
                     &a);
}
