/* Checked 64-bit shape arithmetic: tg_mul_ok, tg_shape_count. */
#include "engine.h"

int tg_mul_ok(int64_t *out, int n, ...) {
  va_list ap;
  va_start(ap, n);
  int64_t acc = 1;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    int64_t f = va_arg(ap, int64_t);
    if (f < 0 || __builtin_mul_overflow(acc, f, &acc)) ok = 0;
  }
  va_end(ap);
  *out = ok ? acc : 0;
  return ok;
}

tg_status tg_shape_count(tg_ctx *ctx, const char *name, size_t elem_bytes,
                         int64_t *count, int ndims, ...) {
  /* Zero dims first: a shape with a zero dim is BAD_SHAPE even where the
   * product of the others would overflow. */
  int64_t dims[8];
  va_list ap;
  va_start(ap, ndims);
  for (int i = 0; i < ndims && i < 8; i++) dims[i] = va_arg(ap, int64_t);
  va_end(ap);
  tg_status st = TG_OK;
  for (int i = 0; i < ndims && st == TG_OK; i++)
    if (dims[i] <= 0)
      st = tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: dimension %d is %lld; it must be >= 1",
                   name, i, (long long)dims[i]);
  int64_t acc = 1;
  for (int i = 0; i < ndims && st == TG_OK; i++)
    if (__builtin_mul_overflow(acc, dims[i], &acc))
      st = tg_fail(ctx, TG_ERR_OVERFLOW, "%s: element count overflows int64", name);
  int64_t bytes;
  if (st == TG_OK && __builtin_mul_overflow(acc, (int64_t)elem_bytes, &bytes))
    st = tg_fail(ctx, TG_ERR_OVERFLOW, "%s: %lld elements of %zu bytes overflow int64",
                 name, (long long)acc, elem_bytes);
  if (count) *count = st == TG_OK ? acc : 0;
  return st;
}
