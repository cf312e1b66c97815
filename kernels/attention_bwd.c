/*
 * FlashAttention-2 backward (contract kernels 1 and 2).
 *
 * Metal grid of the main kernel: one threadgroup per (q-tile, query head,
 * batch); the group keeps dQ of its tile in registers and adds its dK/dV
 * contributions to device memory with f32 atomics. Here each such group is
 * one CPU work item (tg_dispatch) over q-tiles of BQ rows:
 *
 *   for each key tile K[k0 : k0+nk] visible to the q-tile:
 *     S  = Q . K^T                     [nq, nk]  -> P = exp(score(S) - L)
 *     dP = dO . V^T                    [nq, nk]  -> dS = P * (dP - D_vec)
 *     dQ += scale * dS . K             [nq, D]   (local, written once at the end)
 *     dK[k0:] += scale * dS^T . Q      [nk, D]   (one atomic add per element
 *     dV[k0:] += P^T . dO              [nk, D]    per (q-tile, key tile))
 *
 * The kv-head schedule runs the same q-tile body, but one work item per
 * (kv head, batch) walks its query heads and q-tiles in a fixed order with
 * plain adds: no two items touch the same dK/dV rows, so results do not
 * depend on the thread count. It is used in deterministic mode, and by
 * default whenever there are at least as many (kv head, batch) items as
 * threads: x86 has no f32 atomic add, so each `omp atomic` is a
 * compare-exchange loop, and measured at L = 1024, D = 128 on 2 threads the
 * atomic adds halved the throughput (first, unblocked microkernels). The Metal-faithful q-tile grid with
 * atomics is kept for problems with too few heads to keep the threads busy.
 */
#include <math.h>
#include <string.h>

#include "attention.h"

enum { BQ = TG_ATTN_BQ, BK = TG_ATTN_BK };

typedef struct {
  tg_attn_problem pr;
  const tg_bf16 *Q, *K, *V, *dO, *mask;
  const float *L, *D_vec;
  float *dQ, *dK, *dV;
  const tg_micro_ops *ops;
  int64_t n_qtiles;
  int atomic; /* add dK/dV with omp atomic */
} bwd_args;

/* Per-thread scratch, carved from tg_dispatch's buffer. */
typedef struct {
  float *Q, *dO, *dQ;  /* [BQ, D] */
  float *K, *V;        /* [BK, D] */
  float *KT, *VT;      /* [D, BK] */
  float *S, *dS;       /* [BQ, BK]: scores -> P, dP -> dS */
  float *dK, *dV;      /* [BK, D] */
} bwd_scratch;

static size_t bwd_scratch_bytes(int64_t D) {
  const size_t q = tg_align64(sizeof(float) * BQ * (size_t)D);
  const size_t k = tg_align64(sizeof(float) * BK * (size_t)D);
  const size_t s = tg_align64(sizeof(float) * BQ * BK);
  return 3 * q + 6 * k + 2 * s;
}

static bwd_scratch carve(void *base, int64_t D) {
  char *p = base;
  const size_t q = tg_align64(sizeof(float) * BQ * (size_t)D);
  const size_t k = tg_align64(sizeof(float) * BK * (size_t)D);
  const size_t s = tg_align64(sizeof(float) * BQ * BK);
  bwd_scratch w;
  w.Q = (float *)p, p += q;
  w.dO = (float *)p, p += q;
  w.dQ = (float *)p, p += q;
  w.K = (float *)p, p += k;
  w.V = (float *)p, p += k;
  w.KT = (float *)p, p += k;
  w.VT = (float *)p, p += k;
  w.dK = (float *)p, p += k;
  w.dV = (float *)p, p += k;
  w.S = (float *)p, p += s;
  w.dS = (float *)p;
  return w;
}

/* One q-tile of query head h in batch b: the body of one Metal threadgroup. */
static void bwd_qtile(const bwd_args *a, int64_t b, int64_t h, int64_t qt, bwd_scratch *w) {
  const tg_attn_problem *pr = &a->pr;
  const tg_micro_ops *ops = a->ops;
  const int64_t D = pr->D, h_kv = h / pr->gqa;
  const int64_t q0 = qt * BQ, nq = pr->qL - q0 < BQ ? pr->qL - q0 : BQ;
  const int64_t bh = b * pr->H + h;
  const float *L = a->L + bh * pr->qL + q0, *Dv = a->D_vec + bh * pr->qL + q0;

  tg_attn_load_rows(ops, a->Q + tg_attn_offset(pr->Qs, b, h, 0), pr->Qs[2], q0, nq, D, w->Q, NULL);
  tg_attn_load_rows(ops, a->dO + tg_attn_offset(pr->Os, b, h, 0), pr->Os[2], q0, nq, D, w->dO,
            NULL);
  memset(w->dQ, 0, sizeof(float) * (size_t)(nq * D));

  const tg_bf16 *Khead = a->K + tg_attn_offset(pr->Ks, b, h_kv, 0);
  const tg_bf16 *Vhead = a->V + tg_attn_offset(pr->Vs, b, h_kv, 0);
  float *dK = a->dK + (b * pr->H_kv + h_kv) * pr->kL * D;
  float *dV = a->dV + (b * pr->H_kv + h_kv) * pr->kL * D;
  const int64_t key_end = tg_attn_key_end(pr, q0, nq);

  for (int64_t k0 = 0; k0 < key_end; k0 += BK) {
    const int64_t nk = key_end - k0 < BK ? key_end - k0 : BK;
    tg_attn_load_rows(ops, Khead, pr->Ks[2], k0, nk, D, w->K, w->KT);
    tg_attn_load_rows(ops, Vhead, pr->Vs[2], k0, nk, D, w->V, w->VT);

    ops->mm_nn((int)nq, (int)nk, (int)D, w->Q, D, w->KT, BK, w->S, BK, 0);   /* Q.K^T  */
    ops->mm_nn((int)nq, (int)nk, (int)D, w->dO, D, w->VT, BK, w->dS, BK, 0); /* dO.V^T */

    for (int64_t i = 0; i < nq; i++) {
      const int64_t qi = q0 + i;
      const tg_bf16 *mrow = pr->Ms ? a->mask + tg_attn_offset(pr->Ms, b, h, qi) : NULL;
      float *P = w->S + i * BK, *dS = w->dS + i * BK;
      /* A fully masked row has L = -inf: P = exp(S - L) is 0 for every key. */
      const float Li = L[i] == -INFINITY ? INFINITY : L[i];
      if (pr->softcap == 0.0f) {
        ops->attn_score_row(P, nk, tg_attn_visible(pr, qi, k0, nk), pr->scale,
                            mrow ? mrow + k0 : NULL, Li);
        ops->exp_f32(P, P, nk); /* exp(-inf) = 0 for masked keys */
        ops->attn_ds_row(dS, P, nk, Dv[i], pr->scale);
        continue;
      }
      float tanh_row[BK]; /* softcap: d(c tanh(x/c))/dx = 1 - tanh^2 */
      for (int64_t k = 0; k < nk; k++)
        P[k] = tg_attn_score(pr, P[k], qi, k0 + k, mrow, &tanh_row[k]) - Li;
      ops->exp_f32(P, P, nk);
      for (int64_t k = 0; k < nk; k++) {
        const float g = P[k] * (dS[k] - Dv[i]) * (1.0f - tanh_row[k] * tanh_row[k]);
        dS[k] = pr->scale * g; /* dL/d(Q.K) */
      }
    }

    ops->mm_nn((int)nq, (int)D, (int)nk, w->dS, BK, w->K, D, w->dQ, D, 1); /* dQ += dS.K */
    memset(w->dK, 0, sizeof(float) * (size_t)(nk * D));
    memset(w->dV, 0, sizeof(float) * (size_t)(nk * D));
    ops->mm_tn_acc((int)nk, (int)D, (int)nq, w->dS, BK, w->Q, D, w->dK, D);  /* dS^T.Q */
    ops->mm_tn_acc((int)nk, (int)D, (int)nq, w->S, BK, w->dO, D, w->dV, D);  /* P^T.dO */
    tg_add_f32(dK + k0 * D, w->dK, nk * D, a->atomic);
    tg_add_f32(dV + k0 * D, w->dV, nk * D, a->atomic);
  }
  memcpy(a->dQ + (bh * pr->qL + q0) * D, w->dQ, sizeof(float) * (size_t)(nq * D));
}

/* Metal-faithful grid: x = q-tile (heaviest causal tiles first), y = query
 * head, z = batch. */
static void bwd_group_qtile(const void *vargs, int64_t x, int64_t h, int64_t b,
                            void *scratch) {
  const bwd_args *a = vargs;
  bwd_scratch w = carve(scratch, a->pr.D);
  bwd_qtile(a, b, h, a->n_qtiles - 1 - x, &w);
}

/* Deterministic grid: x = kv head, y = batch; query heads and q-tiles in order. */
static void bwd_group_kvhead(const void *vargs, int64_t h_kv, int64_t b, int64_t z,
                             void *scratch) {
  const bwd_args *a = vargs;
  bwd_scratch w = carve(scratch, a->pr.D);
  for (int64_t g = 0; g < a->pr.gqa; g++)
    for (int64_t qt = 0; qt < a->n_qtiles; qt++) bwd_qtile(a, b, h_kv * a->pr.gqa + g, qt, &w);
}

tg_status tg_flash_attn_train_bwd_bf16(tg_ctx *ctx, const tg_bf16 *Q, const tg_bf16 *K,
                                       const tg_bf16 *V, const float *L,
                                       const tg_bf16 *dO, const float *D_vec, float *dQ,
                                       float *dK, float *dV, const tg_attn_params *p,
                                       const tg_attn_mask_params *mp,
                                       const tg_bf16 *mask, int causal) {
  static const char fn[] = "tg_flash_attn_train_bwd_bf16";
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  const void *bufs[] = {Q, K, V, L, dO, D_vec, dQ, dK, dV};
  const char *names[] = {"Q", "K", "V", "L", "dO", "D_vec", "dQ", "dK", "dV"};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!bufs[i]) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, names[i]);
  bwd_args a = {.Q = Q, .K = K, .V = V, .dO = dO, .mask = mask, .L = L, .D_vec = D_vec,
                .dQ = dQ, .dK = dK, .dV = dV, .ops = ctx->ops};
  tg_status st = tg_attn_validate(ctx, fn, p, mp, mask, causal, &a.pr);
  if (st != TG_OK) return st;
  a.n_qtiles = (a.pr.qL + BQ - 1) / BQ;
  const size_t scratch = bwd_scratch_bytes(a.pr.D);
  if (ctx->deterministic || a.pr.B * a.pr.H_kv >= tg_threads(ctx))
    return tg_dispatch(ctx, a.pr.H_kv, a.pr.B, 1, scratch, bwd_group_kvhead, &a);
  a.atomic = 1;
  return tg_dispatch(ctx, a.n_qtiles, a.pr.H, a.pr.B, scratch, bwd_group_qtile, &a);
}

/* --- 1. pre-pass: D[b,h,i] = sum_d O[b,h,i,d] * dO[b,h,i,d] ----------------
 * Metal: one threadgroup per row (simd tree over d). Here one work item per
 * block of rows; the per-row dot is the ISA layer's lane-parallel sum. */
enum { D_ROWS_PER_GROUP = 256 };

typedef struct {
  const tg_bf16 *O, *dO;
  float *D_out;
  int64_t rows, D;
  const tg_micro_ops *ops;
} compute_d_args;

static void compute_d_group(const void *vargs, int64_t blk, int64_t y, int64_t z,
                            void *scratch) {
  const compute_d_args *a = vargs;
  const int64_t r0 = blk * D_ROWS_PER_GROUP;
  const int64_t r1 = r0 + D_ROWS_PER_GROUP < a->rows ? r0 + D_ROWS_PER_GROUP : a->rows;
  for (int64_t r = r0; r < r1; r++)
    a->D_out[r] = a->ops->dot_bf16(a->O + r * a->D, a->dO + r * a->D, a->D);
}

tg_status tg_flash_attn_train_bwd_compute_d_bf16(tg_ctx *ctx, const tg_bf16 *O,
                                                 const tg_bf16 *dO, float *D_out,
                                                 uint32_t batch, uint32_t n_q_heads,
                                                 uint32_t q_seq_len, uint32_t head_dim) {
  static const char fn[] = "tg_flash_attn_train_bwd_compute_d_bf16";
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  if (!O || !dO || !D_out)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn,
                   !O ? "O" : !dO ? "dO" : "D_out");
  int64_t rows, elems;
  tg_status st = tg_shape_count(ctx, "tg_flash_attn_train_bwd_compute_d_bf16: O/dO "
                                "[batch, n_q_heads, q_seq_len, head_dim]",
                                sizeof(float), &elems, 4, (int64_t)batch,
                                (int64_t)n_q_heads, (int64_t)q_seq_len, (int64_t)head_dim);
  if (st != TG_OK) return st;
  rows = elems / head_dim;
  const compute_d_args a = {O, dO, D_out, rows, head_dim, ctx->ops};
  return tg_dispatch(ctx, (rows + D_ROWS_PER_GROUP - 1) / D_ROWS_PER_GROUP, 1, 1, 0,
                     compute_d_group, &a);
}
