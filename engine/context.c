/* The context, status messages, ISA selection and checked arithmetic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

const char *tg_status_str(tg_status s) {
  switch (s) {
    case TG_OK: return "success";
    case TG_ERR_NULL_ARG: return "a required pointer argument is NULL";
    case TG_ERR_BAD_SHAPE: return "a size is zero or sizes disagree";
    case TG_ERR_UNSUPPORTED: return "valid input that this build does not support";
    case TG_ERR_BAD_INDEX: return "an index or id is out of range";
    case TG_ERR_BAD_PARAMS: return "parameter fields are inconsistent";
    case TG_ERR_OVERFLOW: return "a size overflows 64-bit arithmetic";
    case TG_ERR_NO_MEMORY: return "out of memory";
  }
  return "unknown status code";
}

tg_status tg_fail(tg_ctx *ctx, tg_status s, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
  }
  return s;
}

void tg_begin(tg_ctx *ctx) { ctx->err[0] = '\0'; }

const char *tg_ctx_last_error(const tg_ctx *ctx) {
  return ctx ? ctx->err : "tg_ctx_last_error: ctx is NULL";
}

/* --- ISA ------------------------------------------------------------------ */
const char *tg_isa_name(tg_isa isa) {
  switch (isa) {
    case TG_ISA_AUTO: return "auto";
    case TG_ISA_PORTABLE: return "portable";
    case TG_ISA_AVX512: return "avx512";
  }
  return "unknown";
}

static int cpu_has_avx512(void) {
#if defined(TG_HAVE_AVX512)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return 0;
#endif
}

static const tg_micro_ops *micro_for(tg_isa isa) {
  switch (isa) {
    case TG_ISA_PORTABLE: return &tg_micro_portable;
#if defined(TG_HAVE_AVX512)
    case TG_ISA_AVX512: return cpu_has_avx512() ? &tg_micro_avx512 : NULL;
#endif
    default: return NULL;
  }
}

tg_status tg_ctx_set_isa(tg_ctx *ctx, tg_isa isa) {
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  if (isa == TG_ISA_AUTO) isa = cpu_has_avx512() ? TG_ISA_AVX512 : TG_ISA_PORTABLE;
  const tg_micro_ops *ops = micro_for(isa);
  if (!ops)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "tg_ctx_set_isa: ISA '%s' (%d) is not available on this CPU/build",
                   tg_isa_name(isa), (int)isa);
  ctx->isa = isa;
  ctx->ops = ops;
  return TG_OK;
}

tg_isa tg_ctx_get_isa(const tg_ctx *ctx) { return ctx ? ctx->isa : TG_ISA_AUTO; }

/* --- context ----------------------------------------------------------------- */
tg_status tg_ctx_create(tg_ctx **out) {
  if (!out) return TG_ERR_NULL_ARG;
  *out = NULL;
  tg_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return TG_ERR_NO_MEMORY;
  tg_isa isa = TG_ISA_AUTO;
  const char *env = getenv("TG_ISA");
  if (env && strcmp(env, "portable") == 0) isa = TG_ISA_PORTABLE;
  if (env && strcmp(env, "avx512") == 0) isa = TG_ISA_AVX512;
  if (tg_ctx_set_isa(ctx, isa) != TG_OK) tg_ctx_set_isa(ctx, TG_ISA_PORTABLE);
  tg_begin(ctx);
  *out = ctx;
  return TG_OK;
}

void tg_ctx_destroy(tg_ctx *ctx) {
  if (!ctx) return;
  free(ctx->scratch);
  free(ctx->workspace);
  free(ctx);
}

tg_status tg_ctx_set_threads(tg_ctx *ctx, int n) {
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  if (n < 0)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_threads: n = %d; a thread count must be >= 0", n);
  ctx->threads = n;
  return TG_OK;
}

tg_status tg_ctx_set_deterministic(tg_ctx *ctx, int on) {
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  ctx->deterministic = on != 0;
  return TG_OK;
}

tg_status tg_ctx_set_attn_schedule(tg_ctx *ctx, tg_attn_schedule s) {
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  if (s != TG_ATTN_SCHEDULE_KV && s != TG_ATTN_SCHEDULE_ATOMIC)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_attn_schedule: %d is not a tg_attn_schedule", (int)s);
  ctx->attn_schedule = s;
  return TG_OK;
}

tg_attn_schedule tg_ctx_get_attn_schedule(const tg_ctx *ctx) {
  return ctx ? ctx->attn_schedule : TG_ATTN_SCHEDULE_KV;
}

int tg_threads(const tg_ctx *ctx) {
  return ctx->threads > 0 ? ctx->threads : omp_get_max_threads();
}

/* --- checked arithmetic -------------------------------------------------------- */
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
