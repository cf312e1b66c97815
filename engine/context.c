/* The context and its setters (the ISA table itself is chosen in isa/select.c). */
#include <stdlib.h>
#include <string.h>

#include "engine.h"

tg_status tg_ctx_set_isa(tg_ctx *ctx, tg_isa isa) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const tg_isa_ops *ops = tg_isa_table(isa);
  if (!ops) {
    const char *why = tg_isa_why_not(isa);
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "tg_ctx_set_isa: ISA '%s' (%d) is not available on this CPU/build%s%s",
                   tg_isa_name(isa), (int)isa, why[0] ? ": " : "", why);
  }
  ctx->isa = tg_isa_of(ops);
  ctx->ops = ops;
  return TG_OK;
}

tg_isa tg_ctx_get_isa(const tg_ctx *ctx) { return ctx ? ctx->isa : TG_ISA_AUTO; }

/* --- context ----------------------------------------------------------------- */
tg_status tg_ctx_create(tg_ctx **out) {
  if (!out) return TG_ERR_NULL_ARG;
  *out = NULL;
  tg_ctx *ctx = tg_mem_alloc(sizeof *ctx, 64);
  if (!ctx) return TG_ERR_NO_MEMORY;
  memset(ctx, 0, sizeof *ctx);
  /* TG_ISA=<name> where this CPU runs it; otherwise (unset, unknown or
   * unavailable) the best available, as without it. */
  tg_isa isa = TG_ISA_AUTO;
  const char *env = getenv("TG_ISA");
  if (env && tg_isa_from_name(env, &isa) != TG_OK) isa = TG_ISA_AUTO;
  if (tg_ctx_set_isa(ctx, isa) != TG_OK) tg_ctx_set_isa(ctx, TG_ISA_AUTO);
  tg_begin(ctx); /* not shared yet: no claim needed */
  *out = ctx;
  return TG_OK;
}

void tg_ctx_destroy(tg_ctx *ctx) {
  if (!ctx) return;
  tg_mem_free(ctx->scratch);
  tg_mem_free(ctx->workspace);
  tg_mem_free(ctx);
}

tg_status tg_ctx_set_threads(tg_ctx *ctx, int n) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (n < 0)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_threads: n = %d; a thread count must be >= 0", n);
  ctx->threads = n;
  return TG_OK;
}

tg_status tg_ctx_set_deterministic(tg_ctx *ctx, int on) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  ctx->deterministic = on != 0;
  return TG_OK;
}

tg_status tg_ctx_set_attn_schedule(tg_ctx *ctx, tg_attn_schedule s) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (s != TG_ATTN_SCHEDULE_KV && s != TG_ATTN_SCHEDULE_ATOMIC)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_attn_schedule: %d is not a tg_attn_schedule", (int)s);
  ctx->attn_schedule = s;
  return TG_OK;
}

tg_attn_schedule tg_ctx_get_attn_schedule(const tg_ctx *ctx) {
  return ctx ? ctx->attn_schedule : TG_ATTN_SCHEDULE_KV;
}

tg_status tg_ctx_set_attn_precision(tg_ctx *ctx, tg_attn_precision p) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (p != TG_ATTN_PRECISION_EXACT && p != TG_ATTN_PRECISION_SPLIT &&
      p != TG_ATTN_PRECISION_BF16)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_attn_precision: %d is not a tg_attn_precision", (int)p);
  ctx->attn_precision = p;
  return TG_OK;
}

tg_attn_precision tg_ctx_get_attn_precision(const tg_ctx *ctx) {
  return ctx ? ctx->attn_precision : TG_ATTN_PRECISION_EXACT;
}

const char *tg_attn_precision_name(tg_attn_precision p) {
  switch (p) {
    case TG_ATTN_PRECISION_EXACT: return "exact";
    case TG_ATTN_PRECISION_SPLIT: return "split";
    case TG_ATTN_PRECISION_BF16: return "bf16";
  }
  return "unknown";
}
