/* 3. f32 -> bf16 cast: dst[i] = bf16(src[i]), round to nearest even.
 * Metal: one thread per element; here one group per 64 Ki-element chunk.
 *
 * In place (dst == (void *)src): element i's bf16 goes to bytes [2i, 2i + 2),
 * inside f32 element floor(i / 2) <= i, so every write lands on an element
 * that is already read -- if the elements are read in order. Chunks in
 * parallel are not in order (chunk c writes over chunk c/2's floats while
 * another thread may still be reading them), so the in-place cast runs in
 * rounds that double: elements [0, 1) from a copy, then [1, 2), [2, 4), ...,
 * [2^r, 2^(r+1)). Round r writes bytes [2^(r+1), 2^(r+2)), the floats of
 * elements [2^(r-1), 2^r): the previous round's, already converted; it reads
 * floats [2^r, 2^(r+1)), not written yet. So within a round no byte is both
 * read and written (the source and destination of every call are disjoint,
 * as the restrict of the row op requires), and rounds of at least a chunk
 * run in parallel, one dispatch each (its end is the barrier). The bits are
 * those of the out-of-place cast: one rounding per element either way.
 */
#include "engine.h"

typedef struct {
  const float *src;
  tg_bf16 *dst;
  int64_t begin, end; /* the elements of this dispatch */
  const tg_isa_ops *ops;
} cast_args;

static void cast_group(const void *vargs, int64_t chunk, int64_t y, int64_t z,
                       void *scratch) {
  const cast_args *a = vargs;
  const int64_t begin = a->begin + chunk * TG_CAST_CHUNK;
  const int64_t len = a->end - begin < TG_CAST_CHUNK ? a->end - begin : TG_CAST_CHUNK;
  a->ops->f32_to_bf16(a->src + begin, a->dst + begin, len);
}

/* Elements [begin, end), TG_CAST_CHUNK per work item. Needs no scratch, so it
 * cannot fail once validation passed. */
static tg_status cast_range(tg_ctx *ctx, const float *src, tg_bf16 *dst, int64_t begin,
                            int64_t end) {
  const cast_args a = {src, dst, begin, end, ctx->ops};
  return tg_dispatch(ctx, (end - begin + TG_CAST_CHUNK - 1) / TG_CAST_CHUNK, 1, 1, 0, cast_group,
                     &a);
}

/* The in-place cast over buf (n f32 in, n bf16 out at the same address), in
 * doubling rounds (see the header). */
static tg_status cast_in_place(tg_ctx *ctx, void *buf, int64_t n) {
  const float *src = buf;
  tg_bf16 *dst = buf;
  const float first = src[0]; /* element 0's bf16 overwrites half of its own float */
  ctx->ops->f32_to_bf16(&first, dst, 1);
  for (int64_t begin = 1; begin < n; begin *= 2) {
    const int64_t end = 2 * begin < n ? 2 * begin : n;
    if (end - begin <= TG_CAST_CHUNK) {
      ctx->ops->f32_to_bf16(src + begin, dst + begin, end - begin); /* serially, no fork */
    } else {
      const tg_status st = cast_range(ctx, src, dst, begin, end);
      if (st != TG_OK) return st;
    }
  }
  return TG_OK;
}

tg_status tg_f32_to_bf16_cast(tg_ctx *ctx, const float *src, tg_bf16 *dst, uint64_t n) {
  static const char fn[] = "tg_f32_to_bf16_cast";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (!src || !dst)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, !src ? "src" : "dst");
  if (n == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: n is 0", fn);
  if (n > (uint64_t)INT64_MAX / sizeof(float))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: n = %llu elements overflow int64 bytes", fn,
                   (unsigned long long)n);
  const tg_buf bufs[] = {tg_in("src", src, n * sizeof(float)),
                         tg_out_in_place("dst", dst, n * sizeof(tg_bf16), "src")};
  tg_status st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs));
  if (st != TG_OK) return st;
  if ((const void *)dst == (const void *)src) return cast_in_place(ctx, dst, (int64_t)n);
  return cast_range(ctx, src, dst, 0, (int64_t)n);
}
