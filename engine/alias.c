/*
 * The aliasing check every entry point runs with its validation (see
 * tg_check_alias in engine.h): each buffer argument is a byte range, and an
 * output may share no byte with an input or with another output, except an
 * output that the kernel computes exactly in place over one named input.
 *
 * Why refuse rather than run: the kernels read their inputs in blocks and
 * write their outputs in blocks, on several threads, in dynamic order; an
 * output that lands on an input still to be read (or on another output)
 * gives wrong results that depend on the thread count and the schedule,
 * with TG_OK. Checking byte ranges pairwise costs a few comparisons per
 * call, whatever the sizes.
 */
#include <string.h>

#include "engine.h"

/* One past the last byte of b, saturated: a declared extent that would run
 * past the address space reaches its end (overlapping everything above it),
 * never wraps to a low address. */
static uintptr_t end_of(const tg_buf *b) {
  const uintptr_t lo = (uintptr_t)b->p;
  return b->bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + (uintptr_t)b->bytes;
}

static int is_empty(const tg_buf *b) { return b->p == NULL || b->bytes == 0; }

/* Bytes that a and b share (0 if none; empty buffers share nothing). */
static uint64_t shared_bytes(const tg_buf *a, const tg_buf *b) {
  if (is_empty(a) || is_empty(b)) return 0;
  const uintptr_t lo_a = (uintptr_t)a->p, lo_b = (uintptr_t)b->p;
  const uintptr_t lo = lo_a > lo_b ? lo_a : lo_b;
  const uintptr_t hi_a = end_of(a), hi_b = end_of(b);
  const uintptr_t hi = hi_a < hi_b ? hi_a : hi_b;
  return hi > lo ? (uint64_t)(hi - lo) : 0;
}

/* Is `other` the input that output `out` may be computed in place over? */
static int in_place_pair(const tg_buf *out, const tg_buf *other) {
  return out->in_place_of && !other->written && strcmp(out->in_place_of, other->name) == 0;
}

tg_status tg_check_alias(tg_ctx *ctx, const char *fn, const tg_buf *bufs, int n) {
  for (int i = 0; i < n; i++) {
    const tg_buf *out = &bufs[i];
    if (!out->written) continue; /* inputs may overlap inputs: both only read */
    for (int j = 0; j < n; j++) {
      const tg_buf *other = &bufs[j];
      /* every output pair once (j < i), every output-input pair */
      if (j == i || (other->written && j > i)) continue;
      const uint64_t shared = shared_bytes(out, other);
      const int may_be_in_place = in_place_pair(out, other);
      if (shared == 0 || (may_be_in_place && out->p == other->p)) continue;
      return tg_fail(ctx, TG_ERR_ALIAS,
                     "%s: %s overlaps %s (%s: %llu bytes at %p, %s: %llu bytes at %p, "
                     "%llu bytes shared); %s",
                     fn, out->name, other->name, out->name, (unsigned long long)out->bytes,
                     out->p, other->name, (unsigned long long)other->bytes, other->p,
                     (unsigned long long)shared,
                     may_be_in_place ? "in place is allowed only at the same start address"
                     : other->written ? "two outputs may not share memory"
                                      : "an output may not share memory with an input");
    }
  }
  return TG_OK;
}
