/*
 * Varlen attention's documents (include/tilegrad.h, "packed sequences"):
 * the checks of cu_seqlens, and each document as a problem of its own.
 *
 * A packed call of n documents is n attention problems of B = 1 that share
 * the packed problem's heads, strides and options: document d's problem has
 * qL = len_q, kL = len_k, qL_off = len_k - len_q, its tensors' base rows at
 * cu_seqlens_q[d] and cu_seqlens_k[d], and L's head stride total_q (L is
 * [H, total_q]). Its work items are those of that problem, so tiles outside
 * every document do not exist; attention_fwd.c and attention_bwd.c put all
 * documents' items in one loop (tg_dispatch_grids: rank by rank across the
 * documents, within a rank the documents of most items first).
 */
#include <math.h>
#include <stdlib.h>

#include "attention.h"

/* Visible (query, key) pairs of a document: the rows' key counts under the
 * packed problem's causal and window rules (bottom-right aligned). */
static double doc_pairs(const tg_attn_problem *pr, int64_t qL, int64_t kL) {
  if (!pr->causal && !pr->window) return (double)qL * (double)kL;
  const int64_t off = kL - qL;
  double pairs = 0;
  for (int64_t i = 0; i < qL; i++) {
    int64_t hi = pr->causal ? i + off : kL - 1, lo = pr->window ? i + off - pr->window + 1 : 0;
    if (hi > kL - 1) hi = kL - 1;
    if (lo < 0) lo = 0;
    if (hi >= lo) pairs += (double)(hi - lo + 1);
  }
  return pairs;
}

/* Checks one cu_seqlens array: starts at 0, never decreases, ends at total. */
static tg_status check_offsets(tg_ctx *ctx, const char *fn, const char *name,
                               const int32_t *cu, int32_t n_docs, int64_t total,
                               const char *total_name) {
  if (cu[0] != 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: %s[0] = %d; the offsets start at 0", fn, name,
                   (int)cu[0]);
  for (int32_t d = 0; d < n_docs; d++)
    if (cu[d + 1] < cu[d])
      return tg_fail(ctx, TG_ERR_BAD_SHAPE,
                     "%s: %s[%d] = %d < %s[%d] = %d; the offsets must not decrease", fn, name,
                     (int)(d + 1), (int)cu[d + 1], name, (int)d, (int)cu[d]);
  if (cu[n_docs] != total)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE,
                   "%s: %s[%d] = %d, but the packed tensors have %lld rows (params %s)", fn,
                   name, (int)n_docs, (int)cu[n_docs], (long long)total, total_name);
  return TG_OK;
}

/* Costliest first; ties in document order (the order is part of no result:
 * each document's bits are its own problem's). */
static int by_work(const void *a, const void *b) {
  const tg_attn_doc *x = a, *y = b;
  if (x->work != y->work) return x->work > y->work ? -1 : 1;
  return x->q0 < y->q0 ? -1 : x->q0 > y->q0 ? 1 : (x->k0 > y->k0) - (x->k0 < y->k0);
}

tg_status tg_attn_varlen_prepare(tg_ctx *ctx, const char *fn, tg_dtype dtype,
                                 const tg_attn_options *opt, const tg_attn_params *p,
                                 const tg_attn_varlen *docs, int causal,
                                 tg_attn_problem *pr, tg_attn_docs *out) {
  *out = (tg_attn_docs){0};
  if (!docs) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: docs is NULL", fn);
  if (!docs->cu_seqlens_q || !docs->cu_seqlens_k)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: docs->%s is NULL", fn,
                   !docs->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
  if (docs->n_docs < 1)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: docs->n_docs = %d; it must be >= 1", fn,
                   (int)docs->n_docs);
  if (docs->_pad != 0)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: docs->_pad = %d; it must be 0", fn,
                   (int)docs->_pad);
  if (p && p->B != 1)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE,
                   "%s: params->B = %d; packed documents are one row: B must be 1", fn,
                   (int)p->B);
  tg_status st = tg_attn_prepare(ctx, fn, dtype, opt, p, NULL, NULL, causal, pr);
  if (st != TG_OK) return st;
  /* a mask: each document's own strides (tg_attn_doc_problem); any non-NULL
   * value marks the packed problem as masked */
  static const int64_t per_document[3] = {0, 0, 0};
  pr->Ms = docs->mask ? per_document : NULL;
  if ((st = check_offsets(ctx, fn, "cu_seqlens_q", docs->cu_seqlens_q, docs->n_docs, pr->qL,
                          "qL")) ||
      (st = check_offsets(ctx, fn, "cu_seqlens_k", docs->cu_seqlens_k, docs->n_docs, pr->kL,
                          "kL")))
    return st;
  /* the packed gradients: contiguous [total, heads, D] */
  const int64_t H = pr->H, H_kv = pr->H_kv, D = pr->D, Dv = pr->Dv;
  pr->dQs[0] = 0, pr->dQs[1] = D, pr->dQs[2] = H * D;
  pr->dKs[0] = 0, pr->dKs[1] = D, pr->dKs[2] = H_kv * D;
  pr->dVs[0] = 0, pr->dVs[1] = Dv, pr->dVs[2] = H_kv * Dv;

  const int64_t n = docs->n_docs;
  tg_attn_doc *list = tg_mem_alloc(sizeof(tg_attn_doc) * (size_t)n, 64);
  if (!list)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate the list of %lld documents", fn,
                   (long long)n);
  uint64_t counter = pr->drop.offset;
  int64_t mask0 = 0;
  double total_work = 0;
  for (int64_t d = 0; d < n; d++) {
    tg_attn_doc *doc = &list[d];
    doc->q0 = docs->cu_seqlens_q[d], doc->qL = docs->cu_seqlens_q[d + 1] - doc->q0;
    doc->k0 = docs->cu_seqlens_k[d], doc->kL = docs->cu_seqlens_k[d + 1] - doc->k0;
    doc->drop_offset = counter;
    doc->mask0 = mask0;
    doc->Ms[0] = 0, doc->Ms[1] = 0, doc->Ms[2] = doc->kL;
    if (__builtin_add_overflow(mask0, doc->qL * doc->kL, &mask0)) {
      tg_mem_free(list);
      return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: the documents' mask overflows int64", fn);
    }
    /* H * len_q * len_k < 2^31 * 2^31 * 2^31 fits no int64: count in u64
     * quarters, wrapping as the 128-bit Philox counter's low word would */
    counter += ((uint64_t)H * (uint64_t)doc->qL * (uint64_t)doc->kL + 3) / 4;
    doc->work = doc->qL && doc->kL ? doc_pairs(pr, doc->qL, doc->kL) * (double)H : 0;
    total_work += doc->work;
  }
  const int cpus = tg_ctx_plan_cpus(ctx);
  for (int64_t d = 0; d < n; d++) {
    const double share = total_work > 0 ? ceil(cpus * list[d].work / total_work) : 1;
    list[d].cpus = share < 1 ? 1 : share > cpus ? cpus : (int)share;
  }
  qsort(list, (size_t)n, sizeof *list, by_work);
  out->docs = list;
  out->n = n;
  out->mask_elems = docs->mask ? mask0 : 0;
  return TG_OK;
}

void tg_attn_docs_free(tg_attn_docs *docs) {
  tg_mem_free(docs->docs);
  *docs = (tg_attn_docs){0};
}

tg_attn_problem tg_attn_doc_problem(const tg_attn_problem *packed, const tg_attn_doc *doc) {
  tg_attn_problem pr = *packed;
  pr.qL = doc->qL, pr.kL = doc->kL, pr.qL_off = doc->kL - doc->qL;
  pr.Ls[0] = 0, pr.Ls[1] = packed->qL; /* L [H, total_q] */
  pr.drop.offset = doc->drop_offset;
  pr.Ms = packed->Ms ? doc->Ms : NULL;
  return pr;
}

tg_status tg_attn_varlen_check_alias(tg_ctx *ctx, const char *fn, const tg_attn_varlen *docs,
                                     const tg_attn_problem *pr, const tg_attn_docs *dl,
                                     const tg_buf *outputs, int n_outputs) {
  tg_buf bufs[9];
  const uint64_t bytes = sizeof(int32_t) * ((uint64_t)docs->n_docs + 1);
  const uint64_t e = pr->in == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
  bufs[0] = tg_in("cu_seqlens_q", docs->cu_seqlens_q, bytes);
  bufs[1] = tg_in("cu_seqlens_k", docs->cu_seqlens_k, bytes);
  /* (mask_elems * e < 2^63: the shape checks bound every tensor's bytes) */
  bufs[2] = tg_in("mask", docs->mask, (uint64_t)dl->mask_elems * e);
  for (int i = 0; i < n_outputs && i < 6; i++) bufs[3 + i] = outputs[i];
  return tg_check_alias(ctx, fn, bufs, 3 + (n_outputs < 6 ? n_outputs : 6));
}
