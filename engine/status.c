/* Status codes and messages: tg_status_str, the context's last error
 * (tg_fail, tg_ctx_last_error) and the one-call-at-a-time claim
 * (tg_enter, tg_leave: TG_ENTER in engine.h). */
#include <stdio.h>
#include <string.h>

#include "engine.h"

const char *tg_version(void) { return TG_VERSION; }

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
    case TG_ERR_BUSY: return "the context is in use by a call on another thread";
    case TG_ERR_ALIAS:
      return "an output shares memory with an input or another output that it may not";
  }
  return "unknown status code";
}

tg_status tg_fail(tg_ctx *ctx, tg_status s, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof ctx->err) /* cut: say so */
      memcpy(ctx->err + sizeof ctx->err - 4, "...", 4);
  }
  return s;
}

void tg_begin(tg_ctx *ctx) { ctx->err[0] = '\0'; }

tg_call tg_enter(tg_ctx *ctx) {
  if (atomic_exchange_explicit(&ctx->busy, 1, memory_order_acquire)) return (tg_call){NULL};
  tg_begin(ctx);
  return (tg_call){ctx};
}

void tg_leave(tg_call *call) {
  if (call->ctx) atomic_store_explicit(&call->ctx->busy, 0, memory_order_release);
}

const char *tg_ctx_last_error(const tg_ctx *ctx) {
  return ctx ? ctx->err : "tg_ctx_last_error: ctx is NULL";
}
