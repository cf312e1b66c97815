/*
 * FlashAttention-2 backward (contract kernels 1 and 2).
 *
 * The work is a grid of (q-tile, key-tile) pairs per query head. For a pair
 * of BQ query rows and BK keys, with Q, dO [nq, D] and K [nk, D] in f32:
 *
 *   S  = Q . K^T                     [nq, nk]  -> P = exp(score(S) - L)
 *   dP = dO . V^T                    [nq, nk]  -> dS = scale * P * (dP - D_vec)
 *   dQ += dS . K                     [nq, D]
 *   dK += dS^T . Q                   [nk, D]
 *   dV += P^T . dO                   [nk, D]
 *
 * With dropout (keep flags recomputed from the counter-based generator,
 * z = keep / (1 - p)) the tile's dP becomes dP o z before dS is formed and
 * P becomes P o z before dV += P^T . dO: the weights the forward's O was
 * made of, and the gradient that reaches the undropped ones.
 *
 * Two schedules share this pair body (tg_ctx_set_attn_schedule):
 *
 * KV (default): one work item per (key range, kv head, batch) -- the
 * FlashAttention-2 loop order. Each key tile is loaded (and K^T, V^T packed)
 * once, then every q-tile of the kv head's query heads streams past it (past
 * a chunk of the range's key tiles at once, as many as the L2 holds: each
 * q-tile is loaded once per chunk); dK/dV of the tile stay in scratch and are
 * added to the output once, and no other item touches those rows: no
 * atomics. dQ rows are summed over key tiles in
 * place; with several key ranges each range sums into its own dQ partial and
 * the partials are added in range order afterwards. The number of ranges
 * depends on the shape and the CPUs planned for (tg_ctx_plan_cpus: about 4
 * items per CPU): in deterministic mode the machine's count, never the
 * thread count, so the result is the same bitwise for every thread count;
 * otherwise no more CPUs than the context's threads, where fewer items
 * split the sums less (fewer dQ partials, dK, dV parts and key-tile
 * loads). A range's first
 * key tile writes its dQ rows instead of adding to zeros, and a causal range
 * leaves the partial rows of q-tiles that see none of its keys unwritten
 * (and unread): the partials cost one write and one read of the rows that
 * matter, in a workspace the context keeps between calls.
 *
 * Query groups: when the key ranges still leave fewer than 4 items per CPU
 * (one batch, few kv heads, short keys), a (range, kv head)'s q-tiles are
 * split into bands, each its own item summing its own dK, dV parts over
 * the key tiles its band sees; group 0 adds its sums to dK, dV, the others
 * sum in their parts in place, and a second pass adds the parts in group
 * order. On the 16-core Xeon
 * (bench/results/xeon16-amx/groups/) this took the backward step of one
 * batch with 6 query heads on 2 kv heads, L 1024, D 512, causal, from 32 to
 * 13 ms (exact) and 25 to 7 ms (bf16 mode) at 16 threads.
 *
 * Precision modes (tg_attn_products, kernels/attention.h): with bf16
 * inputs on a table with bf16 dot products, split and bf16 mode turn the
 * tile's dS and P into bf16 parts and run the last three products on
 * mm_bf16_pairs: dQ = dS . K with dS rows against K packed in row pairs
 * (once per key tile); dK = dS^T . Q and dV = P^T . dO with dS^T, P^T rows
 * against Q, dO in row pairs (once per q-tile), or, up to head dim
 * TG_ATTN_DKV_T_MAX_D (plan.dkv_transposed), dK, dV transposed: dK^T = Q^T
 * . dS and dV^T = dO^T . P with dS and P in row pairs (a third of the cost
 * of the transposed conversion) against Q^T, dO^T (once per q-tile). The
 * sums of dK^T, dV^T are those of dK, dV (the same products, added in the
 * same order: the same bits), transposed as they are added to the output.
 *
 * tg_attn_backward_kv is the KV schedule on a validated problem (bf16 or
 * f32 inputs, gradients through strides); kernel 10 runs it too.
 *
 * ATOMIC: the Metal kernel's grid, one work item per (q-tile, query head,
 * batch); dQ of the tile stays local and is written once, dK/dV of every pair
 * are added to the output with `omp atomic` (the Metal atomic_fetch_add).
 *
 * Compensated dK/dV sums (pr.compensated; the f32 entry points): a key
 * tile's dK and dV are sums over every query row of its kv head, gqa * qL
 * terms. Accumulated in one f32 running sum their error grows with that
 * length (max |err| 2.2-3.7e-5 against f64 at qL = kL = 4096, gqa 4, causal,
 * unit-variance inputs: the f32 path's largest). With compensation each
 * q-tile's part is summed alone (BQ terms) and added to the running sum with
 * Kahan's correction (the ISA layer's add_compensated_f32, which also
 * zeroes the part for the next q-tile), which leaves the error of the parts
 * (1.3-3.0e-6 there; about 4% more time on the f32 backward, medians at D = 64
 * and 128). bf16 inputs carry 2^-8 of their own and
 * keep the plain sum (and today's bits); so does the ATOMIC schedule, whose
 * per-pair parts meet in the output through atomic adds.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "tilegrad_testing.h"

/* The KV schedule's plan (TG_ATTN_ITEMS_PER_CPU, _MIN_RANGE_TILES,
 * _MAX_RANGES, _PARTIALS_BUDGET, _MAX_CHUNK_TILES) and the pre-pass's
 * TG_ATTN_D_ROWS_PER_GROUP are in isa/tuning.h. */

typedef struct {
  tg_attn_problem pr;
  const void *Q, *K, *V, *dO, *mask; /* type pr.in */
  const float *L, *D_vec;
  float *dQ, *dK, *dV;
  const tg_isa_ops *ops;
  tg_attn_bwd_plan plan;
  float *dQ_partial; /* KV schedule: [plan.n_ranges - 1][B, H, qL, D] */
  float *dK_partial; /* KV schedule: [plan.n_qgroups - 1][B, H_kv, kL, D] */
  float *dV_partial; /* KV schedule: [plan.n_qgroups - 1][B, H_kv, kL, Dv] */
  /* bf16 gradients (tg_attn_train_bwd_step; NULL: f32 into dQ, dK, dV),
   * through pr.dQs, dKs, dVs, written as the last sums of their rows are:
   * dQ as range 0 finishes a q unit's rows (one key range) or by the pass
   * after the ranges (dQ holds range 0's f32 sums either way), dK, dV from
   * the key tiles' sums (one query group: dK, dV unused) or by the pass
   * after the groups (dK, dV then hold group 0's f32 sums). */
  uint16_t *dQ16, *dK16, *dV16;
} bwd_args;

/* Rows of the tile that starts at row `start` of `len`: `tile`, or fewer at
 * the end. */
static inline int64_t tile_rows(int64_t len, int64_t start, int64_t tile) {
  return len - start < tile ? len - start : tile;
}

/* Per-thread scratch, carved from tg_dispatch's buffer: one key-tile side
 * per key tile of a chunk (KV schedule; the ATOMIC schedule uses one), and
 * one q-tile side. */
typedef struct {
  float *K, *KT, *VT;  /* [BK, D], [D, BK], [Dv, BK] (bf16_dot: [D/2, BK],
                        * [Dv/2, BK] pairs) */
  float *dK, *dV;      /* [BK, D], [BK, Dv]; plan.dkv_transposed: dK^T, dV^T
                        * [D, nk], [Dv, nk] (put_dkv) */
  /* compensated sums only: the running dK, dV sums and their corrections,
   * [BK, D] and [BK, Dv] (dK, dV above then hold one q-tile's part, zeroed
   * again as it is added) */
  float *dK_sum, *dK_comp, *dV_sum, *dV_comp;
} ktile_scratch;

typedef struct {
  float *Q, *dO, *dQ;  /* [BQ, D], [BQ, Dv], [BQ, D] */
  float *S;            /* [BQ, BK]: scores -> P */
  /* dP -> dS: [BQ, ld_ds], the chunk's key tiles side by side (tile j in
   * columns j BK..), the A of the dQ product over them (bwd_dq); [BQ, BK]
   * for TG_PRODUCTS_BF16_DOT, whose dS parts take that place */
  float *dS;
  int64_t ld_ds;       /* chunk tiles x BK, and 64 bytes (carve) */
  uint8_t *keep;       /* [BQ, BK] dropout keep flags */
  /* TG_PRODUCTS_BF16_DOT only: the bf16 parts (tg_attn_parts of hi, lo,
   * lo2; the rest NULL) of dS [U][BQ, ld_ds] (unit slot s's rows from
   * s BQ ld_ds, its key tiles side by side as above) and of the dK, dV
   * products' dS, P (U = plan.dkv_units q units): dS^T, P^T [BK, U BQ]
   * (unit s in columns s BQ..), whose products take Q and dO as U units'
   * bf16 rows in pairs ([U BQ / 2, D] and [U BQ / 2, Dv], unit s from pair
   * row s BQ / 2); or, plan.dkv_transposed, dS, P in row pairs [U BQ / 2,
   * BK] (unit s from pair row s BQ / 2), with Q, dO holding Q^T, dO^T ([D,
   * U BQ] and [Dv, U BQ] bf16, unit s in columns s BQ..: rows of pairs of q
   * rows, made through row_pairs). K holds its bf16 rows in pairs ([BK / 2,
   * D]). */
  uint16_t *dS_parts[3], *dS_dkv[3], *P_dkv[3];
  uint32_t *row_pairs; /* plan.dkv_transposed: [BQ / 2, max(D, Dv)] */
  /* plan.bf16_dot with S's or dP's K padded (tg_attn_k_padded: Kq of D,
   * Kv of Dv): the U units' Q, dO rows [U BQ, Kq], [U BQ, Kv] with zeros
   * past D, Dv (unit s from row s BQ); else NULL, the rows read in place */
  tg_bf16 *Q_padded, *dO_padded;
  /* the chunk's K rows are contiguous (kt[j].K follows kt[j - 1].K): the
   * B of the dQ product over several key tiles */
  ktile_scratch kt[TG_ATTN_MAX_CHUNK_TILES];
} bwd_scratch;

/* The key tile's buffers in carve's order: which have Dv columns (the
 * others D); the first 5 always, the last 4 for compensated sums. */
static const int ktile_has_dv[9] = {0, 0, 1, 0, 1, 0, 0, 1, 1};

/* Bytes of the key tile's buffer i (carve's order). */
static size_t ktile_buf_bytes(int i, int64_t D, int64_t Dv, int64_t BK) {
  return tg_align64(sizeof(float) * BK * (size_t)(ktile_has_dv[i] ? Dv : D));
}

/* Bytes of one key tile's side of the scratch. */
static size_t ktile_bytes(int64_t D, int64_t Dv, int64_t BK, int compensated) {
  size_t n = 0;
  for (int i = 0; i < (compensated ? 9 : 5); i++) n += ktile_buf_bytes(i, D, Dv, BK);
  return n;
}

/* A work item's scratch for `chunk` key tiles: carved from base into *w
 * (base NULL: nothing is set); returns its bytes. */
static size_t carve(void *base, const tg_attn_problem *pr, const tg_attn_bwd_plan *plan,
                    int64_t chunk, int compensated, bwd_scratch *w) {
  const int64_t D = pr->D, Dv = pr->Dv, BQ = plan->BQ, BK = plan->BK;
  const int n_parts = tg_attn_part_buffers(pr, plan->products, TG_ATTN_PASS_BWD);
  /* dS columns: the chunk's key tiles and 64 bytes, so that its rows are
   * not a power of two apart (which would put a product's A rows in a few
   * L1 sets) */
  const int64_t U = plan->dkv_units, W = chunk * BK + (n_parts ? 32 : 16);
  /* K of one key tile: f32 rows [BK, D], or bf16 row pairs [BK / 2, D] */
  const int64_t k_tile = plan->products == TG_PRODUCTS_BF16_DOT ? BK / 2 * D : BK * D;
  size_t off = 0;
  *w = (bwd_scratch){0}; /* the buffers a work item does not use stay NULL */
  w->ld_ds = W;
#define TG_CARVE(ptr, type, bytes)                                  \
  do {                                                              \
    if (base) (ptr) = (type *)(void *)((char *)base + off);         \
    off += tg_align64(bytes);                                       \
  } while (0)
  /* f32 rows, or U units' bf16 rows in pairs */
  const size_t q_row = n_parts ? 2 * (size_t)U : 4;
  TG_CARVE(w->Q, float, q_row * BQ * (size_t)D);
  TG_CARVE(w->dO, float, q_row * BQ * (size_t)Dv);
  TG_CARVE(w->dQ, float, sizeof(float) * BQ * (size_t)D);
  TG_CARVE(w->S, float, sizeof(float) * BQ * BK);
  TG_CARVE(w->dS, float, sizeof(float) * BQ * (size_t)(n_parts ? BK : W));
  TG_CARVE(w->keep, uint8_t, (size_t)(BQ * BK));
  for (int i = 0; i < n_parts; i++) {
    TG_CARVE(w->dS_parts[i], uint16_t, 2 * (size_t)(U * BQ * W));
    TG_CARVE(w->dS_dkv[i], uint16_t, 2 * (size_t)(U * BQ * BK));
    TG_CARVE(w->P_dkv[i], uint16_t, 2 * (size_t)(U * BQ * BK));
  }
  if (plan->dkv_transposed)
    TG_CARVE(w->row_pairs, uint32_t, 2 * (size_t)(BQ * (D > Dv ? D : Dv)));
  if (plan->Kq != D) TG_CARVE(w->Q_padded, tg_bf16, 2 * (size_t)(U * BQ * plan->Kq));
  if (plan->Kv != Dv) TG_CARVE(w->dO_padded, tg_bf16, 2 * (size_t)(U * BQ * plan->Kv));
  float *K_chunk = NULL;
  TG_CARVE(K_chunk, float, ktile_buf_bytes(0, D, Dv, BK) * (size_t)chunk);
  for (int64_t j = 0; j < chunk; j++) {
    ktile_scratch *t = &w->kt[j];
    float **bufs[] = {&t->K, &t->KT, &t->VT, &t->dK, &t->dV,
                      &t->dK_sum, &t->dK_comp, &t->dV_sum, &t->dV_comp};
    if (base) t->K = K_chunk + j * k_tile;
    for (int i = 1; i < (compensated ? 9 : 5); i++)
      TG_CARVE(*bufs[i], float, ktile_buf_bytes(i, D, Dv, BK));
  }
#undef TG_CARVE
  return off;
}

static size_t bwd_scratch_bytes(const tg_attn_problem *pr, const tg_attn_bwd_plan *plan,
                                int64_t chunk, int compensated) {
  bwd_scratch unused;
  return carve(NULL, pr, plan, chunk, compensated, &unused);
}

/* plan.dkv_transposed: X^T for the bf16 rows X [nq, D] (row stride lds)
 * -> unit slot `slot`'s columns of XT [D, U BQ] (bf16): X in row pairs
 * [ceil(nq / 2), D] (an odd count's missing row 0), whose 32-bit pairs
 * transposed are rows of X^T with q rows paired along them, mm_bf16_pairs'
 * A layout. */
static void load_transposed(const bwd_args *a, const tg_bf16 *X, int64_t lds, int64_t nq,
                            int64_t D, int64_t slot, float *XT, bwd_scratch *w) {
  const int64_t pairs = (nq + 1) / 2, ld = a->plan.dkv_units * a->plan.BQ / 2;
  a->ops->pack_bf16_row_pairs(nq, D, X, lds, w->row_pairs, D);
  /* 32-bit moves (transpose_f32 copies the pairs' bits as they are) */
  a->ops->transpose_f32(pairs, D, (const float *)(void *)w->row_pairs, D,
                        XT + slot * a->plan.BQ / 2, ld, 0);
}

/* Rows [q0, q0 + nq) of query head h in batch b -> w->Q, w->dO (f32 rows;
 * for TG_PRODUCTS_BF16_DOT in unit slot `slot`, bf16 row pairs, or Q^T,
 * dO^T where plan.dkv_transposed). */
static void load_qtile(const bwd_args *a, int64_t b, int64_t h, int64_t q0, int64_t nq,
                       int64_t slot, bwd_scratch *w) {
  const tg_attn_problem *pr = &a->pr;
  const tg_bf16 *Q = (const tg_bf16 *)a->Q + tg_attn_offset(pr->Qs, b, h, q0);
  const tg_bf16 *dO = (const tg_bf16 *)a->dO + tg_attn_offset(pr->Os, b, h, q0);
  if (w->Q_padded) /* S's operand, padded (bwd_pair) */
    tg_attn_copy_padded(Q, pr->Qs[2], nq, pr->D, a->plan.Kq,
                        w->Q_padded + slot * a->plan.BQ * a->plan.Kq);
  if (w->dO_padded) /* dP's */
    tg_attn_copy_padded(dO, pr->Os[2], nq, pr->Dv, a->plan.Kv,
                        w->dO_padded + slot * a->plan.BQ * a->plan.Kv);
  if (a->plan.dkv_transposed) {
    load_transposed(a, Q, pr->Qs[2], nq, pr->D, slot, w->Q, w);
    load_transposed(a, dO, pr->Os[2], nq, pr->Dv, slot, w->dO, w);
    return;
  }
  if (a->plan.products == TG_PRODUCTS_BF16_DOT) {
    const int64_t pair_row = slot * a->plan.BQ / 2;
    a->ops->pack_bf16_row_pairs(nq, pr->D, Q, pr->Qs[2], (uint32_t *)w->Q + pair_row * pr->D,
                                pr->D);
    a->ops->pack_bf16_row_pairs(nq, pr->Dv, dO, pr->Os[2],
                                (uint32_t *)w->dO + pair_row * pr->Dv, pr->Dv);
    return;
  }
  tg_attn_load_rows(a->ops, pr->in, tg_attn_at(pr->in, a->Q, tg_attn_offset(pr->Qs, b, h, 0)),
                    pr->Qs[2], q0, nq, pr->D, w->Q, NULL, 0);
  tg_attn_load_rows(a->ops, pr->in, tg_attn_at(pr->in, a->dO, tg_attn_offset(pr->Os, b, h, 0)),
                    pr->Os[2], q0, nq, pr->Dv, w->dO, NULL, 0);
}

/* Keys [k0, k0 + nk) of kv head h_kv -> t->K (f32, or bf16 row pairs for
 * TG_PRODUCTS_BF16_DOT), t->KT, t->VT (f32, or bf16 pairs with bf16_dot). */
static void load_ktile(const bwd_args *a, int64_t b, int64_t h_kv, int64_t k0, int64_t nk,
                       ktile_scratch *t) {
  const tg_attn_problem *pr = &a->pr;
  const void *Kh = tg_attn_at(pr->in, a->K, tg_attn_offset(pr->Ks, b, h_kv, 0));
  const void *Vh = tg_attn_at(pr->in, a->V, tg_attn_offset(pr->Vs, b, h_kv, 0));
  if (a->plan.bf16_dot) {
    if (a->plan.products == TG_PRODUCTS_BF16_DOT)
      a->ops->pack_bf16_row_pairs(nk, pr->D, (const tg_bf16 *)Kh + k0 * pr->Ks[2], pr->Ks[2],
                                  (uint32_t *)t->K, pr->D);
    else
      tg_attn_load_rows(a->ops, pr->in, Kh, pr->Ks[2], k0, nk, pr->D, t->K, NULL, 0);
    const int64_t BK = a->plan.BK;
    tg_attn_pack_pairs(a->ops, Kh, pr->Ks[2], k0, nk, pr->D, (uint32_t *)t->KT, BK);
    tg_attn_pack_pairs(a->ops, Vh, pr->Vs[2], k0, nk, pr->Dv, (uint32_t *)t->VT, BK);
    /* zero pairs up to S's and dP's padded K */
    memset((uint32_t *)t->KT + pr->D / 2 * BK, 0,
           sizeof(uint32_t) * (size_t)((a->plan.Kq - pr->D) / 2 * BK));
    memset((uint32_t *)t->VT + pr->Dv / 2 * BK, 0,
           sizeof(uint32_t) * (size_t)((a->plan.Kv - pr->Dv) / 2 * BK));
    return;
  }
  tg_attn_load_rows(a->ops, pr->in, Kh, pr->Ks[2], k0, nk, pr->D, t->K, t->KT, a->plan.BK);
  /* V is only used transposed; t->dV is free until the pair body runs. */
  tg_attn_load_rows(a->ops, pr->in, Vh, pr->Vs[2], k0, nk, pr->Dv, t->dV, t->VT, a->plan.BK);
}

/* Unit slot `slot`'s dS parts from column col (its rows [BQ, ld_ds]). */
static void slot_ds_parts(const bwd_args *a, const bwd_scratch *w, int64_t slot, int64_t col,
                          uint16_t *out[3]) {
  tg_attn_parts_at(w->dS_parts, slot * a->plan.BQ * w->ld_ds + col, out);
}

/* The pair body for loaded tiles (the key tile's side in t, the q-tile's in
 * w): dS into columns [col, col + nk) of w->dS, or of unit slot `slot`'s dS
 * parts, for bwd_dq; t->dK [nk, D], t->dV [nk, Dv] += dS^T . Q, P^T . dO.
 * TG_PRODUCTS_BF16_DOT leaves dK, dV to bwd_dkv_bf16: the pair's dS and P
 * go to the slot's place in dS_dkv, P_dkv instead. dq_soon: the
 * dQ rows [nq, D] (row stride ldq) that a dQ product reads next (NULL:
 * none), fetched meanwhile. */
static void bwd_pair(const bwd_args *a, int64_t b, int64_t h, int64_t q0, int64_t nq,
                     int64_t k0, int64_t nk, int64_t col, int64_t slot, const float *dq_soon,
                     int64_t ldq, const ktile_scratch *t, bwd_scratch *w) {
  const tg_attn_problem *pr = &a->pr;
  const tg_isa_ops *ops = a->ops;
  const int64_t D = pr->D, Dv = pr->Dv, BK = a->plan.BK;
  const int64_t row0 = b * pr->Ls[0] + h * pr->Ls[1] + q0;
  const float *L = a->L + row0, *Drow = a->D_vec + row0;
  const int bf16_products = a->plan.products == TG_PRODUCTS_BF16_DOT;
  float *const dS_tile = bf16_products ? w->dS : w->dS + col; /* [nq, nk] */
  const int64_t ld = bf16_products ? BK : w->ld_ds;

  /* on the diagonal, the top rows over their keys alone: their P and dS
   * past them are written 0 below, never computed */
  tg_attn_rows blk[2];
  const int n_blk = tg_attn_row_blocks(pr, q0, nq, k0, nk, blk);
  for (int r = 0; r < n_blk; r++) {
    const int64_t r0 = blk[r].r0, rows = blk[r].rows, keys = blk[r].keys;
    if (keys == 0) continue;
    if (a->plan.bf16_dot) { /* the bf16 rows of Q and dO in place (or padded: Kq, Kv),
                             * K^T and V^T in pairs */
      const int64_t Kq = a->plan.Kq, Kv = a->plan.Kv, at = slot * a->plan.BQ + r0;
      const tg_bf16 *Qr = w->Q_padded
                              ? w->Q_padded + at * Kq
                              : (const tg_bf16 *)a->Q + tg_attn_offset(pr->Qs, b, h, q0 + r0);
      const tg_bf16 *dOr = w->dO_padded
                               ? w->dO_padded + at * Kv
                               : (const tg_bf16 *)a->dO + tg_attn_offset(pr->Os, b, h, q0 + r0);
      ops->mm_bf16_pairs((int)rows, (int)keys, (int)Kq, Qr, w->Q_padded ? Kq : pr->Qs[2],
                         (const uint32_t *)t->KT, BK, w->S + r0 * BK, BK, 0);
      ops->mm_bf16_pairs((int)rows, (int)keys, (int)Kv, dOr, w->dO_padded ? Kv : pr->Os[2],
                         (const uint32_t *)t->VT, BK, dS_tile + r0 * ld, ld, 0);
    } else {
      ops->mm_nn((int)rows, (int)keys, (int)D, w->Q + r0 * D, D, t->KT, BK, w->S + r0 * BK, BK,
                 0); /* Q.K^T */
      ops->mm_nn((int)rows, (int)keys, (int)Dv, w->dO + r0 * Dv, Dv, t->VT, BK,
                 dS_tile + r0 * ld, ld, 0); /* dO.V^T */
    }
  }
  const int64_t top = n_blk == 2 ? blk[1].r0 : 0, top_keys = blk[0].keys;
  if (pr->drop.threshold) { /* dP -> dP o keep / (1 - p) */
    tg_attn_dropout_tile(ops, &pr->drop, pr, b, h, q0, nq, k0, nk, w->keep, BK);
    tg_attn_dropout_apply(w->keep, BK, dS_tile, ld, nq, nk, pr->drop.scale);
  }

  for (int64_t i = 0; i < nq; i++) {
    const int64_t qi = q0 + i;
    /* dQ rows often live in L3 or DRAM (KV schedule): start fetching them
     * now so the dS . K product after this pair finds them in L2. */
    if (dq_soon)
      for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(dq_soon + i * ldq + d, 1, 2);
    const void *mrow =
        pr->Ms ? tg_attn_at(pr->in, a->mask, tg_attn_offset(pr->Ms, b, h, qi)) : NULL;
    float *P = w->S + i * BK, *dS = dS_tile + i * ld;
    /* A fully masked row has L = -inf: P = exp(S - L) is 0 for every key. */
    const float Li = L[i] == -INFINITY ? INFINITY : L[i];
    if (pr->softcap == 0.0f) { /* P = 0 for masked keys, [0, lo) left of the window */
      const int64_t lo = tg_attn_hidden_left(pr, qi, k0, nk);
      const int64_t n_vis = tg_attn_visible(pr, qi, k0, nk);
      memset(P, 0, sizeof(float) * (size_t)(lo < nk ? lo : nk));
      if (lo < nk)
        ops->attn_prob_row(P + lo, nk - lo, n_vis > lo ? n_vis - lo : 0, pr->scale,
                           mrow ? tg_attn_at(pr->in, mrow, k0 + lo) : NULL, pr->in, Li);
      const int64_t n_ds = i < top ? top_keys : nk; /* (the top block's dP stops there) */
      ops->attn_ds_row(dS, P, n_ds, Drow[i], pr->scale);
      memset(dS + n_ds, 0, sizeof(float) * (size_t)(nk - n_ds));
      continue;
    }
    float tanh_row[TG_ATTN_MAX_TILE]; /* softcap: d(c tanh(x/c))/dx = 1 - tanh^2 */
    for (int64_t k = 0; k < nk; k++)
      P[k] = tg_attn_score(pr, P[k], qi, k0 + k, mrow, &tanh_row[k]) - Li;
    ops->exp_f32(P, P, nk);
    for (int64_t k = 0; k < nk; k++) {
      const float g = P[k] * (dS[k] - Drow[i]) * (1.0f - tanh_row[k] * tanh_row[k]);
      dS[k] = pr->scale * g; /* dL/d(Q.K) */
    }
  }
  if (pr->drop.threshold) /* P -> P o keep / (1 - p), for dV */
    tg_attn_dropout_apply(w->keep, BK, w->S, BK, nq, nk, pr->drop.scale);

  if (bf16_products) { /* dS rows, and dS^T, P^T or dS, P in row pairs, as bf16
                        * parts (odd counts padded with a 0) */
    const int transposed = a->plan.dkv_transposed;
    /* the slot's place: pair rows from slot BQ / 2, or columns from slot BQ */
    const int64_t at = transposed ? slot * a->plan.BQ * BK : slot * a->plan.BQ;
    const int64_t ldd = transposed ? BK : a->plan.dkv_units * a->plan.BQ;
    const int layout = transposed ? TG_SPLIT_ROW_PAIRS : TG_SPLIT_TRANSPOSED;
    uint16_t *dSp[3], *dSk[3], *Pk[3];
    slot_ds_parts(a, w, slot, col, dSp);
    tg_attn_parts_at(w->dS_dkv, at, dSk);
    tg_attn_parts_at(w->P_dkv, at, Pk);
    ops->f32_to_bf16_split(nq, nk, dS_tile, ld, TG_SPLIT_ROWS, dSp[0], dSp[1], dSp[2], w->ld_ds);
    ops->f32_to_bf16_split(nq, nk, dS_tile, ld, layout, dSk[0], dSk[1], dSk[2], ldd);
    ops->f32_to_bf16_split(nq, nk, w->S, BK, layout, Pk[0], Pk[1], Pk[2], ldd);
    return;
  }
  if (a->plan.products == TG_PRODUCTS_F32_ROUNDED) {
    tg_attn_round_bf16(dS_tile, nq, nk, ld);
    tg_attn_round_bf16(w->S, nq, nk, BK);
  }
  /* on the diagonal, keys past the top block's over the bottom rows alone */
  for (int64_t k_lo = 0, r = 0; r < n_blk; k_lo = blk[r++].keys) {
    const int64_t r0 = blk[r].r0, keys = blk[r].keys - k_lo, rows = nq - r0;
    if (keys == 0) continue;
    ops->mm_tn_acc((int)keys, (int)D, (int)rows, dS_tile + r0 * ld + k_lo, ld, w->Q + r0 * D, D,
                   t->dK + k_lo * D, D); /* dS^T.Q */
    ops->mm_tn_acc((int)keys, (int)Dv, (int)rows, w->S + r0 * BK + k_lo, BK, w->dO + r0 * Dv, Dv,
                   t->dV + k_lo * Dv, Dv); /* P^T.dO */
  }
}

/* dQ [nq, D] (row stride ldq) (+)= dS . K over kn keys from the chunk's key
 * tile t: the dS that bwd_pair left from column col of w->dS (or of unit
 * slot `slot`'s dS parts), those tiles' K rows (contiguous in the chunk).
 * Every key tile but the last of the keys is whole (BK), so the product
 * gives the bits of one product per tile: the f32 GEMM and one bf16 part
 * add along k in that order and keep C in f32 between k steps, whether in
 * registers or in memory; two or three parts run as terms, each tile's
 * parts in turn (tg_attn_mm_terms). With first the rows are written. The
 * q-tile starts at row q0, the last key tile at key k_last: on the f32 GEMM
 * a last tile that the causal diagonal crosses gives the top rows of the
 * q-tile fewer keys (tg_attn_row_blocks; their dS past them is 0). */
static void bwd_dq(const bwd_args *a, int64_t q0, int64_t nq, int64_t kn, int64_t k_last,
                   int64_t slot, int64_t col, const ktile_scratch *t, float *dQ, int64_t ldq,
                   int first, bwd_scratch *w) {
  const tg_attn_problem *pr = &a->pr;
  const int64_t BK = a->plan.BK;
  if (a->plan.products != TG_PRODUCTS_BF16_DOT) {
    const int64_t nk_last = kn - (kn - 1) / BK * BK; /* (the tiles before it are whole) */
    tg_attn_rows blk[2];
    const int n_blk = tg_attn_row_blocks(pr, q0, nq, k_last, nk_last, blk);
    for (int r = 0; r < n_blk; r++) {
      const int64_t r0 = blk[r].r0, keys = kn - nk_last + blk[r].keys;
      if (keys == 0) { /* rows that see none of these keys */
        for (int64_t i = r0; first && i < r0 + blk[r].rows; i++)
          memset(dQ + i * ldq, 0, sizeof(float) * (size_t)pr->D);
        continue;
      }
      a->ops->mm_nn((int)blk[r].rows, (int)pr->D, (int)keys, w->dS + col + r0 * w->ld_ds,
                    w->ld_ds, t->K, pr->D, dQ + r0 * ldq, ldq, !first);
    }
    return;
  }
  const int n_parts = tg_attn_parts(pr, TG_ATTN_PASS_BWD);
  if (n_parts == 1) { /* one run along k; an odd kn: a 0 pads dS and K */
    uint16_t *dSp[3];
    slot_ds_parts(a, w, slot, col, dSp);
    tg_attn_mm_parts(pr, TG_ATTN_PASS_BWD, a->ops, nq, pr->D, kn + kn % 2, dSp, w->ld_ds,
                     (const uint32_t *)t->K, pr->D, dQ, ldq, !first);
    return;
  }
  tg_bf16_term terms[3 * TG_ATTN_MAX_CHUNK_TILES];
  int n = 0;
  for (int64_t k0 = 0; k0 < kn; k0 += BK, t++) { /* tile by tile, its parts in turn */
    const int64_t nk = kn - k0 < BK ? kn - k0 : BK;
    uint16_t *dSp[3];
    slot_ds_parts(a, w, slot, col + k0, dSp);
    for (int i = 0; i < n_parts; i++)
      terms[n++] = (tg_bf16_term){dSp[i], (const uint32_t *)t->K, (int)(nk + nk % 2)};
  }
  tg_attn_mm_terms(a->ops, n, terms, nq, pr->D, w->ld_ds, pr->D, dQ, ldq, !first);
}

/* plan.dkv_transposed: C [M, nk] (+)= XT . Y over unit slots [s0, s1):
 * XT the slots' columns of w->Q or w->dO (Q^T, dO^T), Y the parts of dS or
 * P in row pairs (terms XT . part, hi, lo, lo2: with one A the order of
 * the f32 sums of C^T += part^T . X, and so its bits, tg_attn_mm_terms). */
static void dkv_product_t(const bwd_args *a, int64_t M, int64_t nk, int64_t s0, int64_t rows,
                          const float *XT, uint16_t *const pairs[3], float *C, int first) {
  const int64_t BQ = a->plan.BQ, BK = a->plan.BK;
  uint16_t *Y[3];
  tg_attn_parts_at(pairs, s0 * BQ * BK, Y);
  tg_bf16_term terms[3];
  const int n = tg_attn_parts(&a->pr, TG_ATTN_PASS_BWD);
  for (int i = 0; i < n; i++)
    terms[i] = (tg_bf16_term){(const uint16_t *)(const void *)XT + s0 * BQ,
                              (const uint32_t *)(const void *)Y[i], (int)rows};
  tg_attn_mm_terms(a->ops, n, terms, M, nk, a->plan.dkv_units * BQ, BK, C, nk, !first);
}

/* TG_PRODUCTS_BF16_DOT: t->dK [nk, D], t->dV [nk, Dv] (+)= dS^T . Q, P^T . dO
 * (or their transposes, dK^T = Q^T . dS, dV^T = dO^T . P, where
 * plan.dkv_transposed) over unit slots [s0, s1) of w at once (bwd_pair put
 * their dS, P there, load_qtile their Q, dO): K = the slots' q rows, those
 * of slot s1 - 1 (nq_last of them) padded to even. With one part (bf16
 * mode) the terms meet the sums in the order of one product per slot (a
 * slot's rows are BQ, even, so every slot starts a k pair), and so do the
 * bits: the tile GEMMs add along k in order; two or three parts in
 * tg_attn_mm_terms' order (on amx per 32 rows of k hi, lo, lo2, whatever
 * the slots; else every slot's hi terms, then the lo terms). With first the products
 * write dK, dV instead. */
static void bwd_dkv_bf16(const bwd_args *a, int64_t nk, int64_t s0, int64_t s1,
                         int64_t nq_last, int first, ktile_scratch *t, bwd_scratch *w) {
  const tg_attn_problem *pr = &a->pr;
  const int64_t BQ = a->plan.BQ, ldt = a->plan.dkv_units * BQ, col = s0 * BQ;
  const int64_t rows = (s1 - 1 - s0) * BQ + nq_last + nq_last % 2;
  if (a->plan.dkv_transposed) {
    dkv_product_t(a, pr->D, nk, s0, rows, w->Q, w->dS_dkv, t->dK, first);  /* Q^T.dS */
    dkv_product_t(a, pr->Dv, nk, s0, rows, w->dO, w->P_dkv, t->dV, first); /* dO^T.P */
    return;
  }
  uint16_t *dSt[3], *Pt[3];
  tg_attn_parts_at(w->dS_dkv, col, dSt);
  tg_attn_parts_at(w->P_dkv, col, Pt);
  tg_attn_mm_parts(pr, TG_ATTN_PASS_BWD, a->ops, nk, pr->D, rows, dSt, ldt,
                   (const uint32_t *)w->Q + col / 2 * pr->D, pr->D, t->dK, pr->D,
                   !first); /* dS^T.Q */
  tg_attn_mm_parts(pr, TG_ATTN_PASS_BWD, a->ops, nk, pr->Dv, rows, Pt, ldt,
                   (const uint32_t *)w->dO + col / 2 * pr->Dv, pr->Dv, t->dV, pr->Dv,
                   !first); /* P^T.dO */
}

/* KV schedule: the dQ rows [nq, D] of query head h, q-tile at q0, that key
 * range `range` sums into (the output through pr->dQs for range 0, a
 * contiguous partial otherwise); *ld gets their row stride. */
static float *dq_rows(const bwd_args *a, int64_t range, int64_t b, int64_t h, int64_t q0,
                      int64_t *ld) {
  const tg_attn_problem *pr = &a->pr;
  if (range == 0) {
    *ld = pr->dQs[2];
    return a->dQ + tg_attn_offset(pr->dQs, b, h, q0);
  }
  *ld = pr->D;
  return a->dQ_partial + (range - 1) * a->plan.dq_elems + ((b * pr->H + h) * pr->qL + q0) * pr->D;
}

/* How a sum meets its output rows (put_rows, put_dkv). */
typedef enum { ROWS_ADD, ROWS_ADD_ATOMIC, ROWS_WRITE } rows_mode;

/* dst rows [n, D] (row stride ld) += src [n, D] (contiguous), atomically
 * with ROWS_ADD_ATOMIC (tg_add_f32), or = src with ROWS_WRITE; = 0 when src
 * is NULL (any mode). */
static void put_rows(float *dst, int64_t ld, const float *src, int64_t n, int64_t D,
                     rows_mode mode) {
  for (int64_t r = 0; r < n; r++) {
    if (!src)
      memset(dst + r * ld, 0, sizeof(float) * (size_t)D);
    else if (mode == ROWS_WRITE)
      memcpy(dst + r * ld, src + r * D, sizeof(float) * (size_t)D);
    else
      tg_add_f32(dst + r * ld, src + r * D, D, mode == ROWS_ADD_ATOMIC);
  }
}

/* A key tile's dK or dV sum (cols columns, nk rows; [cols, nk] transposed
 * where plan.dkv_transposed) put into rows [nk, cols] at stride ld as
 * put_rows (the transposed sum written through the table's transpose, added
 * by add_transposed_f32, or atomically 16 x 16 at a time; NULL: zeros). */
static void put_dkv(const bwd_args *a, float *dst, int64_t ld, const float *src, int64_t nk,
                    int64_t cols, rows_mode mode) {
  if (!src || !a->plan.dkv_transposed) {
    put_rows(dst, ld, src, nk, cols, mode);
  } else if (mode == ROWS_WRITE) {
    a->ops->transpose_f32(cols, nk, src, nk, dst, ld, 0);
  } else if (mode == ROWS_ADD) {
    a->ops->add_transposed_f32(cols, nk, src, nk, dst, ld);
  } else {
    float block[16 * 16];
    for (int64_t r0 = 0; r0 < nk; r0 += 16)
      for (int64_t c0 = 0; c0 < cols; c0 += 16) {
        const int64_t nr = tile_rows(nk, r0, 16), nc = tile_rows(cols, c0, 16);
        a->ops->transpose_f32(nc, nr, src + c0 * nk + r0, nk, block, 16, 0); /* [nr, 16] */
        for (int64_t r = 0; r < nr; r++)
          tg_add_f32(dst + (r0 + r) * ld + c0, block + r * 16, nc, 1);
      }
  }
}

/* bf16 rows dst [n, cols] (row stride ldd) = src [n, cols] (row stride
 * lds) rounded to nearest even (the cast's op: tg_f32_to_bf16_cast's bits). */
static void rows_to_bf16(const tg_isa_ops *ops, const float *src, int64_t lds, uint16_t *dst,
                         int64_t ldd, int64_t n, int64_t cols) {
  for (int64_t r = 0; r < n; r++) ops->f32_to_bf16(src + r * lds, dst + r * ldd, cols);
}

/* bf16 gradients with one query group: a key tile's dK or dV sum (as
 * put_dkv's src; NULL: zeros) rounded into bf16 rows [nk, cols] at stride
 * ld. A transposed sum goes through the stack 8 rows at a time. */
static void write_dkv_bf16(const bwd_args *a, uint16_t *dst, int64_t ld, const float *src,
                           int64_t nk, int64_t cols) {
  if (!src) {
    for (int64_t r = 0; r < nk; r++) memset(dst + r * ld, 0, sizeof(uint16_t) * (size_t)cols);
  } else if (!a->plan.dkv_transposed) {
    rows_to_bf16(a->ops, src, cols, dst, ld, nk, cols);
  } else {
    float rows[8 * TG_ATTN_MAX_D];
    for (int64_t r0 = 0; r0 < nk; r0 += 8) {
      const int64_t nr = tile_rows(nk, r0, 8);
      a->ops->transpose_f32(cols, nr, src + r0, nk, rows, cols, 0); /* [nr, cols] */
      rows_to_bf16(a->ops, rows, cols, dst + r0 * ld, ld, nr, cols);
    }
  }
}

/* bf16 gradients written straight from the key tiles' sums: one query
 * group, so no parts are added after them. */
static int dkv_to_bf16(const bwd_args *a) { return a->dK16 && a->plan.n_qgroups == 1; }

/* bf16 gradients: dQ rows rounded as range 0 finishes them (while they are
 * in the caches), where one key range leaves no partials to add. */
static int dq_to_bf16(const bwd_args *a) { return a->dQ16 && a->plan.n_ranges == 1; }

/* Key tile k0's sums dk [nk, D], dv [nk, Dv] (put_dkv's layout; NULL:
 * zeros) into dK, dV (f32, as put_dkv with `mode`) or, dkv_to_bf16, their
 * bf16 rows. */
static void put_dkv_tile(const bwd_args *a, int64_t b, int64_t h_kv, int64_t k0, int64_t nk,
                         const float *dk, const float *dv, rows_mode mode) {
  const tg_attn_problem *pr = &a->pr;
  if (dkv_to_bf16(a)) {
    write_dkv_bf16(a, a->dK16 + tg_attn_offset(pr->dKs, b, h_kv, k0), pr->dKs[2], dk, nk, pr->D);
    write_dkv_bf16(a, a->dV16 + tg_attn_offset(pr->dVs, b, h_kv, k0), pr->dVs[2], dv, nk,
                   pr->Dv);
  } else {
    put_dkv(a, a->dK + tg_attn_offset(pr->dKs, b, h_kv, k0), pr->dKs[2], dk, nk, pr->D, mode);
    put_dkv(a, a->dV + tg_attn_offset(pr->dVs, b, h_kv, k0), pr->dVs[2], dv, nk, pr->Dv, mode);
  }
}

/* Zeros the dK, dV rows of key tile kt (kv head h_kv, batch b). */
static void zero_dkv_tile(const bwd_args *a, int64_t b, int64_t h_kv, int64_t kt) {
  const int64_t k0 = kt * a->plan.BK;
  put_dkv_tile(a, b, h_kv, k0, tile_rows(a->pr.kL, k0, a->plan.BK), NULL, NULL, ROWS_WRITE);
}

/* ATOMIC schedule with pr->dkv_write: zeros dK, dV of kv head h_kv, batch
 * b, before the pairs add to them. */
static void zero_dkv_group(const void *vargs, int64_t h_kv, int64_t b, int64_t z,
                           void *scratch) {
  const bwd_args *a = vargs;
  for (int64_t kt = 0; kt < a->plan.n_ktiles; kt++) zero_dkv_tile(a, b, h_kv, kt);
}

/* The key tiles [*first, *end) of tiles [kt_first, kt_end) that the q-tile
 * at q0 can see: one interval, empty (*first >= *end) when it sees none
 * (causal attention cuts it on the right, a window on the left). */
static void visible_tiles(const bwd_args *a, int64_t q0, int64_t nq, int64_t kt_first,
                          int64_t kt_end, int64_t *first, int64_t *end) {
  const int64_t BK = a->plan.BK;
  const int64_t kb = tg_attn_key_begin(&a->pr, q0) / BK;
  const int64_t ke = (tg_attn_key_end(&a->pr, q0, nq) + BK - 1) / BK;
  *first = kb > kt_first ? kb : kt_first;
  *end = ke < kt_end ? ke : kt_end;
}

/* KV schedule: the key tiles of range `range`, [*first, *end). */
static void range_tiles(const bwd_args *a, int64_t range, int64_t *first, int64_t *end) {
  *first = range * a->plan.range_tiles;
  *end = *first + tile_rows(a->plan.n_ktiles, *first, a->plan.range_tiles);
}

/* KV schedule: the q units [*u0, *u1) of query group `group`. A kv head's
 * q units are its (query head, q-tile) pairs, q-tile major: u = q-tile * gqa
 * + (h - h_kv gqa), gqa * n_qtiles of them, split into plan.n_qgroups runs of
 * (almost) equal length. So a group is a band of q-tiles, which under
 * causality or a window sees a band of keys (group_tiles). */
static void query_units(const bwd_args *a, int64_t group, int64_t *u0, int64_t *u1) {
  const int64_t units = a->pr.gqa * a->plan.n_qtiles, G = a->plan.n_qgroups;
  *u0 = group * units / G;
  *u1 = (group + 1) * units / G;
}

/* Query head and first row of q unit u of kv head h_kv. */
static void unit_rows(const bwd_args *a, int64_t h_kv, int64_t u, int64_t *h, int64_t *q0) {
  *h = h_kv * a->pr.gqa + u % a->pr.gqa;
  *q0 = u / a->pr.gqa * a->plan.BQ;
}

/* The key tiles [*first, *end) that any q unit of query group `group` can
 * see (empty when *first >= *end): its parts of dK, dV cover these alone. */
static void group_tiles(const bwd_args *a, int64_t group, int64_t *first, int64_t *end) {
  int64_t u0, u1, h, qa, qb;
  query_units(a, group, &u0, &u1);
  if (u0 >= u1) {
    *first = *end = 0;
    return;
  }
  unit_rows(a, 0, u0, &h, &qa);
  unit_rows(a, 0, u1 - 1, &h, &qb);
  visible_tiles(a, qa, qb - qa + tile_rows(a->pr.qL, qb, a->plan.BQ), 0, a->plan.n_ktiles, first,
                end);
}

/* KV schedule: the dK (which 0) or dV (which 1) rows from key k0 of kv head
 * h_kv that query group `group` >= 1 sums into (contiguous rows; a key
 * tile's [cols, nk] transposed there where plan.dkv_transposed). */
static float *dkv_part(const bwd_args *a, int64_t group, int64_t b, int64_t h_kv, int64_t k0,
                       int which) {
  const tg_attn_problem *pr = &a->pr;
  const int64_t cols = which ? pr->Dv : pr->D;
  const int64_t row = (((group - 1) * pr->B + b) * pr->H_kv + h_kv) * pr->kL + k0;
  return (which ? a->dV_partial : a->dK_partial) + row * cols;
}

/* KV schedule: does the q-tile at q0 see any key of range `range`? */
static int range_visible(const bwd_args *a, int64_t range, int64_t q0, int64_t nq) {
  int64_t kt_first, kt_end, first, end;
  range_tiles(a, range, &kt_first, &kt_end);
  visible_tiles(a, q0, nq, kt_first, kt_end, &first, &end);
  return first < end;
}

/* KV schedule: a q unit of a batch (bwd_group_kv): its query head, rows
 * [q0, q0 + nq), the chunk's key tiles [j0, j1) it sees (j_first: the
 * range's first it sees, relative to the chunk), its dQ rows (row stride ld). */
typedef struct {
  int64_t h, q0, nq, j0, j1, j_first, ld;
  int last_chunk; /* the chunk holds the range's last key tile it sees */
  float *dq;
} q_slot;

/* KV schedule: x = kv head, y = batch, z = key range. The range varies
 * slowest, so every kv head's range 0 is handed out first: under causality
 * the early keys are seen by the most queries, and the heaviest items
 * starting first keeps the last ones short (dynamic order).
 *
 * The range's key tiles are taken a chunk at a time (plan_chunk): the
 * chunk's tiles are loaded, then every q-tile of the kv head's query heads
 * is loaded once and meets each of them in key order. Every sum runs in the
 * order it would with chunks of one tile: dK, dV of a key tile over (query
 * head, q-tile) in order, dQ rows of a q-tile over the range's key tiles in
 * order. So the chunk changes where the operands are, not the bits. */
static void bwd_group_kv(const void *vargs, int64_t x, int64_t b, int64_t range,
                         void *scratch) {
  const bwd_args *a = vargs;
  const tg_attn_problem *pr = &a->pr;
  const int64_t D = pr->D, BQ = a->plan.BQ, BK = a->plan.BK;
  const int64_t Dv = pr->Dv;
  const int64_t h_kv = x / a->plan.n_qgroups, group = x % a->plan.n_qgroups;
  int64_t u0, u1; /* this item's q units: (query head, q-tile) pairs, query_units */
  query_units(a, group, &u0, &u1);
  bwd_scratch w;
  carve(scratch, pr, &a->plan, a->plan.chunk_tiles, pr->compensated, &w);
  tg_attn_dot_begin(a->ops, a->plan.bf16_dot);

  int64_t kt_first, kt_end, g_first, g_end; /* the range's tiles, this group's */
  range_tiles(a, range, &kt_first, &kt_end);
  group_tiles(a, group, &g_first, &g_end);
  /* Output rows no key of range 0 reaches are zeros (the other ranges'
   * partials are added to them); a partial's rows its range never reaches
   * stay unwritten, and the sum skips them. */
  if (range == 0)
    for (int64_t u = u0; u < u1; u++) {
      int64_t h, q0;
      unit_rows(a, h_kv, u, &h, &q0);
      const int64_t nq = tile_rows(pr->qL, q0, BQ);
      if (range_visible(a, 0, q0, nq)) continue;
      int64_t ld;
      float *dq = dq_rows(a, 0, b, h, q0, &ld);
      put_rows(dq, ld, NULL, nq, D, ROWS_WRITE);
      if (dq_to_bf16(a))
        rows_to_bf16(a->ops, dq, ld, a->dQ16 + tg_attn_offset(pr->dQs, b, h, q0), ld, nq, D);
    }
  /* the key tiles of the range that the group sees: the others' dK, dV
   * sums would be 0 */
  const int64_t t0 = g_first > kt_first ? g_first : kt_first, t1 = g_end < kt_end ? g_end : kt_end;
  /* Group 0 adds its sums to dK, dV, or writes them (pr->dkv_write: then
   * also zeros in the range's tiles it does not see, so that every row is
   * written once before the second pass adds the other groups' parts). */
  const rows_mode group0 = pr->dkv_write ? ROWS_WRITE : ROWS_ADD;
  if (group == 0 && pr->dkv_write)
    for (int64_t kt = kt_first; kt < kt_end; kt++)
      if (kt < t0 || kt >= t1) zero_dkv_tile(a, b, h_kv, kt);
  /* The bf16 dot products run dK, dV's products a batch of q units at a
   * time (bwd_dkv_bf16) and write a key tile's dK, dV with its first
   * instead of adding to zeros (a tile no unit reaches is zeroed at the
   * end); a group other than 0 sums them in its part, in place. */
  const int bf16_products = a->plan.products == TG_PRODUCTS_BF16_DOT;
  const int in_part = group > 0 && !pr->compensated;
  /* A q unit's dQ rows take one product over the chunk's key tiles it
   * sees (bwd_dq: each block of the rows loaded and stored once, not once
   * per tile), with the bits of one product per tile; on the bf16 unit
   * only from TG_ATTN_DQ_CHUNK_MIN_D (isa/tuning.h says why). */
  const int dq_over_chunk = !bf16_products || pr->D >= TG_ATTN_DQ_CHUNK_MIN_D;
  for (int64_t c0 = t0; c0 < t1; c0 += a->plan.chunk_tiles) {
    const int64_t nc = tile_rows(t1, c0, a->plan.chunk_tiles);
    int written[TG_ATTN_MAX_CHUNK_TILES] = {0}; /* has a unit written tile j's dK, dV? */
    for (int64_t j = 0; j < nc; j++) {
      const int64_t k0 = (c0 + j) * BK, nk = tile_rows(pr->kL, k0, BK);
      const size_t k_bytes = sizeof(float) * (size_t)(nk * D), v_bytes = sizeof(float) * (size_t)(nk * Dv);
      ktile_scratch *t = &w.kt[j];
      if (in_part) { /* (before load_ktile, which may use t->dV as its buffer) */
        t->dK = dkv_part(a, group, b, h_kv, k0, 0);
        t->dV = dkv_part(a, group, b, h_kv, k0, 1);
      }
      load_ktile(a, b, h_kv, k0, nk, t);
      if (!bf16_products) {
        memset(t->dK, 0, k_bytes);
        memset(t->dV, 0, v_bytes);
      }
      if (pr->compensated) {
        memset(t->dK_sum, 0, k_bytes), memset(t->dK_comp, 0, k_bytes);
        memset(t->dV_sum, 0, v_bytes), memset(t->dV_comp, 0, v_bytes);
      }
    }
    /* The q units a batch at a time: up to plan.dkv_units of them, one per
     * slot of w, each meeting the chunk's key tiles in key order; a tile's
     * dK, dV products then run over the batch's slots that see it (one run:
     * visibility is monotone in the q-tile). A short q-tile (the last) ends
     * its batch, so only a batch's last slot has fewer than BQ rows. */
    for (int64_t ub = u0, ue; ub < u1; ub = ue) {
      q_slot sl[TG_ATTN_MAX_DKV_UNITS];
      int64_t ns = 0;
      for (ue = ub; ue < u1 && ns < a->plan.dkv_units;) {
        q_slot *q = &sl[ns++];
        unit_rows(a, h_kv, ue++, &q->h, &q->q0);
        q->nq = tile_rows(pr->qL, q->q0, BQ);
        int64_t first, end; /* the key tiles of the range this q-tile sees */
        visible_tiles(a, q->q0, q->nq, kt_first, kt_end, &first, &end);
        q->j0 = first > c0 ? first - c0 : 0;
        q->j1 = end - c0 < nc ? end - c0 : nc;
        q->j_first = first - c0;
        q->last_chunk = end - c0 <= nc;
        if (q->j0 < q->j1) { /* sees some of the chunk's keys */
          q->dq = dq_rows(a, range, b, q->h, q->q0, &q->ld);
          load_qtile(a, b, q->h, q->q0, q->nq, ns - 1, &w);
        }
        if (q->nq < BQ) break;
      }
      for (int64_t j = 0; j < nc; j++) {
        const int64_t k0 = (c0 + j) * BK, nk = tile_rows(pr->kL, k0, BK);
        ktile_scratch *t = &w.kt[j];
        int64_t run = -1; /* first slot of the run that sees tile j */
        for (int64_t s = 0; s <= ns; s++) {
          if (s < ns && sl[s].j0 <= j && j < sl[s].j1) {
            const q_slot *q = &sl[s];
            const int dq_now = j == q->j1 - 1 || !dq_over_chunk;
            /* dS of tile j in columns j BK.., or 0.. when its dQ product
             * comes right after */
            const int64_t col = dq_over_chunk ? j * BK : 0;
            bwd_pair(a, b, q->h, q->q0, q->nq, k0, nk, col, s, dq_now ? q->dq : NULL, q->ld, t,
                     &w);
            if (dq_now) { /* dQ over the tiles [js, j] */
              const int64_t js = dq_over_chunk ? q->j0 : j;
              bwd_dq(a, q->q0, q->nq, (j - js) * BK + nk, k0, s, col - (j - js) * BK,
                     &w.kt[js], q->dq, q->ld, js == q->j_first, &w);
              if (j == q->j1 - 1 && q->last_chunk && dq_to_bf16(a))
                rows_to_bf16(a->ops, q->dq, q->ld,
                             a->dQ16 + tg_attn_offset(pr->dQs, b, q->h, q->q0), q->ld, q->nq, D);
            }
            if (pr->compensated) { /* this q-tile's part into the sums; t->dK, t->dV = 0 */
              a->ops->add_compensated_f32(t->dK_sum, t->dK_comp, t->dK, nk * D);
              a->ops->add_compensated_f32(t->dV_sum, t->dV_comp, t->dV, nk * Dv);
            }
            if (run < 0) run = s;
            continue;
          }
          if (run >= 0 && bf16_products) {
            bwd_dkv_bf16(a, nk, run, s, sl[s - 1].nq, !written[j], t, &w);
            written[j] = 1;
          }
          run = -1;
        }
      }
    }
    for (int64_t j = 0; j < nc; j++) { /* group 0 into dK, dV; the others' parts */
      const int64_t k0 = (c0 + j) * BK, nk = tile_rows(pr->kL, k0, BK);
      const ktile_scratch *t = &w.kt[j];
      if (bf16_products && !written[j]) {
        memset(t->dK, 0, sizeof(float) * (size_t)(nk * D));
        memset(t->dV, 0, sizeof(float) * (size_t)(nk * Dv));
      }
      const float *dk = pr->compensated ? t->dK_sum : t->dK;
      const float *dv = pr->compensated ? t->dV_sum : t->dV;
      if (group == 0) {
        put_dkv_tile(a, b, h_kv, k0, nk, dk, dv, group0);
      } else if (!in_part) {
        memcpy(dkv_part(a, group, b, h_kv, k0, 0), dk, sizeof(float) * (size_t)(nk * D));
        memcpy(dkv_part(a, group, b, h_kv, k0, 1), dv, sizeof(float) * (size_t)(nk * Dv));
      }
    }
  }
  tg_attn_dot_end(a->ops, a->plan.bf16_dot);
}

/* KV schedule, second pass over the key tiles when there are several query
 * groups: dK, dV (group 0's sums already added) += the parts of groups 1..
 * in group order, then rounded into dK16, dV16 for bf16 gradients; x = key
 * tile, y = kv head, z = batch. */
static void bwd_group_sum_dkv(const void *vargs, int64_t kt, int64_t h_kv, int64_t b,
                              void *scratch) {
  const bwd_args *a = vargs;
  const tg_attn_problem *pr = &a->pr;
  const int64_t k0 = kt * a->plan.BK, nk = tile_rows(pr->kL, k0, a->plan.BK);
  float *dk = a->dK + tg_attn_offset(pr->dKs, b, h_kv, k0);
  float *dv = a->dV + tg_attn_offset(pr->dVs, b, h_kv, k0);
  for (int64_t g = 1; g < a->plan.n_qgroups; g++) {
    int64_t first, end;
    group_tiles(a, g, &first, &end);
    if (kt < first || kt >= end) continue; /* the group wrote no part here */
    put_dkv(a, dk, pr->dKs[2], dkv_part(a, g, b, h_kv, k0, 0), nk, pr->D, ROWS_ADD);
    put_dkv(a, dv, pr->dVs[2], dkv_part(a, g, b, h_kv, k0, 1), nk, pr->Dv, ROWS_ADD);
  }
  if (a->dK16) {
    rows_to_bf16(a->ops, dk, pr->dKs[2], a->dK16 + tg_attn_offset(pr->dKs, b, h_kv, k0),
                 pr->dKs[2], nk, pr->D);
    rows_to_bf16(a->ops, dv, pr->dVs[2], a->dV16 + tg_attn_offset(pr->dVs, b, h_kv, k0),
                 pr->dVs[2], nk, pr->Dv);
  }
}

/* KV schedule, second pass: dQ += the partials of ranges 1.. in range order,
 * one q-tile (x) of query head y, batch z at a time (a partial's rows that
 * its range never wrote are skipped), then rounded into dQ16 for bf16
 * gradients (one range: dq_to_bf16 did it). */
static void bwd_group_sum_dq(const void *vargs, int64_t qt, int64_t h, int64_t b,
                             void *scratch) {
  const bwd_args *a = vargs;
  const int64_t BQ = a->plan.BQ, q0 = qt * BQ, nq = tile_rows(a->pr.qL, q0, BQ);
  int64_t ld, ld_r;
  float *dq = dq_rows(a, 0, b, h, q0, &ld);
  for (int64_t r = 1; r < a->plan.n_ranges; r++)
    if (range_visible(a, r, q0, nq))
      put_rows(dq, ld, dq_rows(a, r, b, h, q0, &ld_r), nq, a->pr.D, ROWS_ADD);
  if (a->dQ16)
    rows_to_bf16(a->ops, dq, ld, a->dQ16 + tg_attn_offset(a->pr.dQs, b, h, q0), ld, nq, a->pr.D);
}

/* ATOMIC schedule: x = q-tile (heaviest causal tiles first), y = query head,
 * z = batch. */
static void bwd_group_atomic(const void *vargs, int64_t x, int64_t h, int64_t b,
                             void *scratch) {
  const bwd_args *a = vargs;
  const tg_attn_problem *pr = &a->pr;
  const int64_t D = pr->D, Dv = pr->Dv, h_kv = h / pr->gqa, BQ = a->plan.BQ, BK = a->plan.BK;
  bwd_scratch w;
  carve(scratch, pr, &a->plan, 1, 0, &w);
  ktile_scratch *t = &w.kt[0];
  tg_attn_dot_begin(a->ops, a->plan.bf16_dot);
  const int64_t q0 = (a->plan.n_qtiles - 1 - x) * BQ, nq = tile_rows(pr->qL, q0, BQ);

  load_qtile(a, b, h, q0, nq, 0, &w);
  memset(w.dQ, 0, sizeof(float) * (size_t)(nq * D));
  /* (as in bwd_group_kv: the bf16 dot products write dK, dV, no zero-fill) */
  const int bf16_products = a->plan.products == TG_PRODUCTS_BF16_DOT;
  const int64_t key_end = tg_attn_key_end(pr, q0, nq);
  for (int64_t k0 = tg_attn_key_begin(pr, q0); k0 < key_end; k0 += BK) {
    const int64_t nk = tile_rows(key_end, k0, BK);
    load_ktile(a, b, h_kv, k0, nk, t);
    if (!bf16_products) {
      memset(t->dK, 0, sizeof(float) * (size_t)(nk * D));
      memset(t->dV, 0, sizeof(float) * (size_t)(nk * Dv));
    }
    bwd_pair(a, b, h, q0, nq, k0, nk, 0, 0, NULL, D, t, &w);
    bwd_dq(a, q0, nq, nk, k0, 0, 0, t, w.dQ, D, 0, &w);
    if (bf16_products) bwd_dkv_bf16(a, nk, 0, 1, nq, 1, t, &w);
    put_dkv(a, a->dK + tg_attn_offset(pr->dKs, b, h_kv, k0), pr->dKs[2], t->dK, nk, D,
            ROWS_ADD_ATOMIC);
    put_dkv(a, a->dV + tg_attn_offset(pr->dVs, b, h_kv, k0), pr->dVs[2], t->dV, nk, Dv,
            ROWS_ADD_ATOMIC);
  }
  float *dq = a->dQ + tg_attn_offset(pr->dQs, b, h, q0);
  for (int64_t i = 0; i < nq; i++)
    memcpy(dq + i * pr->dQs[2], w.dQ + i * D, sizeof(float) * (size_t)D);
  tg_attn_dot_end(a->ops, a->plan.bf16_dot);
}

/* KV schedule: key ranges per kv head (see TG_ATTN_ITEMS_PER_CPU), from the
 * shape and the planned CPUs (pl->cpus); sets pl->range_tiles, n_ranges, dq_elems. */
static void plan_ranges(tg_attn_bwd_plan *pl, const tg_attn_problem *pr) {
  const int64_t heads = pr->B * pr->H_kv;
  const int64_t dq_bytes = pr->B * pr->H * pr->qL * pr->D * (int64_t)sizeof(float);
  const int64_t items = (int64_t)TG_ATTN_ITEMS_PER_CPU * pl->cpus;
  int64_t ranges = (items + heads - 1) / heads;
  if (ranges > pl->n_ktiles / TG_ATTN_MIN_RANGE_TILES)
    ranges = pl->n_ktiles / TG_ATTN_MIN_RANGE_TILES;
  if (ranges > TG_ATTN_MAX_RANGES) ranges = TG_ATTN_MAX_RANGES;
  if (ranges > 1 + TG_ATTN_PARTIALS_BUDGET / dq_bytes)
    ranges = 1 + TG_ATTN_PARTIALS_BUDGET / dq_bytes;
  if (ranges < 1) ranges = 1;
  pl->range_tiles = (pl->n_ktiles + ranges - 1) / ranges;
  pl->n_ranges = (pl->n_ktiles + pl->range_tiles - 1) / pl->range_tiles;
  pl->dq_elems = pr->B * pr->H * pr->qL * pr->D;
}

/* KV schedule: query groups per (key range, kv head) when the key ranges
 * alone leave fewer than TG_ATTN_ITEMS_PER_CPU items per CPU (few kv heads,
 * short keys: one batch of a GQA model with 2 kv heads and L 1024 had 8 items
 * for 16 CPUs). Each group sums its own dK, dV parts over its q units; the
 * parts are added in group order by a second pass. At least
 * TG_ATTN_MIN_GROUP_UNITS q units per group (1 where even that many groups
 * would leave fewer items than CPUs), at most TG_ATTN_MAX_QGROUPS groups,
 * and the parts ((groups - 1) copies of dK and dV) within what the dQ
 * partials left of TG_ATTN_PARTIALS_BUDGET. Shape and planned CPUs only
 * (pl->cpus). Sets pl->n_qgroups, dk_elems, dv_elems. */
static void plan_qgroups(tg_attn_bwd_plan *pl, const tg_attn_problem *pr) {
  const int64_t items = pr->B * pr->H_kv * pl->n_ranges;
  const int64_t want = (int64_t)TG_ATTN_ITEMS_PER_CPU * pl->cpus;
  const int64_t units = pr->gqa * pl->n_qtiles;
  pl->dk_elems = pr->B * pr->H_kv * pr->kL * pr->D;
  pl->dv_elems = pr->B * pr->H_kv * pr->kL * pr->Dv;
  const int64_t part_bytes = (pl->dk_elems + pl->dv_elems) * (int64_t)sizeof(float);
  const int64_t budget =
      TG_ATTN_PARTIALS_BUDGET - (pl->n_ranges - 1) * pl->dq_elems * (int64_t)sizeof(float);
  int64_t groups = (want + items - 1) / items;
  /* starved: even the most groups of TG_ATTN_MIN_GROUP_UNITS leave fewer
   * items than CPUs; then groups of one unit */
  const int64_t most = units / TG_ATTN_MIN_GROUP_UNITS;
  const int64_t min_units = items * (most > 1 ? most : 1) < pl->cpus ? 1 : TG_ATTN_MIN_GROUP_UNITS;
  if (groups > units / min_units) groups = units / min_units;
  if (groups > TG_ATTN_MAX_QGROUPS) groups = TG_ATTN_MAX_QGROUPS;
  if (groups > 1 + budget / part_bytes) groups = 1 + budget / part_bytes;
  pl->n_qgroups = groups < 1 ? 1 : groups;
}

/* KV schedule: query groups traded for key ranges, two for one, keeping
 * the items' count, while the ranges stay TG_ATTN_MIN_RANGE_TILES of the
 * table's own key tile (table_bk: ops->attn_bk) long and the GQA groups
 * are at most TG_ATTN_RANGES_OVER_GROUPS_MAX_GQA wide. plan_ranges'
 * minimum counts the plan's key tiles, and bf16 mode's on amx are twice
 * the table's: it left the split to query groups, whose dK, dV parts and
 * per-group key tile packing cost more there than ranges' dQ partials
 * (isa/tuning.h). Sets pl->range_tiles, n_ranges, n_qgroups. */
static void plan_groups_to_ranges(tg_attn_bwd_plan *pl, const tg_attn_problem *pr,
                                  int64_t table_bk) {
  if (pr->gqa > TG_ATTN_RANGES_OVER_GROUPS_MAX_GQA) return;
  const int64_t min_tiles = TG_ATTN_MIN_RANGE_TILES * table_bk / pl->BK;
  const int64_t most = pl->n_ktiles / (min_tiles > 1 ? min_tiles : 1);
  const int64_t dq_bytes = pl->dq_elems * (int64_t)sizeof(float);
  while (pl->n_qgroups > 1 && 2 * pl->n_ranges <= most &&
         2 * pl->n_ranges <= TG_ATTN_MAX_RANGES &&
         (2 * pl->n_ranges - 1) * dq_bytes <= TG_ATTN_PARTIALS_BUDGET) {
    const int64_t tiles = (pl->n_ktiles + 2 * pl->n_ranges - 1) / (2 * pl->n_ranges);
    if ((pl->n_ktiles + tiles - 1) / tiles != 2 * pl->n_ranges) return; /* (not two for one) */
    pl->range_tiles = tiles;
    pl->n_ranges *= 2;
    pl->n_qgroups = (pl->n_qgroups + 1) / 2;
  }
}

/* KV schedule: key tiles per chunk (see TG_ATTN_MAX_CHUNK_TILES): as many key
 * tiles' scratch (their packed K, K^T, V^T and dK, dV sums) as the L2 per
 * CPU holds (tg_plan_l2_bytes), at least one, at most the range. Any chunk
 * gives the same bits (bwd_group_kv); the machine's L2, never the thread
 * count, decides. On Zen 5 (1 MiB L2, 2 threads, bench/results/zen5/
 * paired-chunk.*): 0.95-1.00x the step time of one tile at a time on the
 * four vs_torch shapes in exact and bf16 mode. */
static void plan_chunk(tg_attn_bwd_plan *pl, const tg_attn_problem *pr) {
  const int64_t tile = (int64_t)ktile_bytes(pr->D, pr->Dv, pl->BK, pr->compensated);
  const int64_t fit = tg_plan_l2_bytes() / tile;
  int64_t chunk = fit < TG_ATTN_MAX_CHUNK_TILES ? fit : TG_ATTN_MAX_CHUNK_TILES;
  if (chunk > pl->range_tiles) chunk = pl->range_tiles;
  pl->chunk_tiles = chunk < 1 ? 1 : chunk;
}

static atomic_int testing_dkv_units; /* tg_testing_attn_dkv_units; 0: off */

void tg_testing_attn_dkv_units(int units) {
  if (units < 0) units = 0;
  if (units > TG_ATTN_MAX_DKV_UNITS) units = TG_ATTN_MAX_DKV_UNITS;
  atomic_store(&testing_dkv_units, units);
}

/* KV schedule: q units per dK, dV product (TG_ATTN_DKV_K, _MIN_D): enough
 * that the product's k runs TG_ATTN_DKV_K bf16 rows, parts included, at
 * least one. Sets pl->dkv_units. */
static void plan_dkv_units(tg_attn_bwd_plan *pl, const tg_attn_problem *pr) {
  pl->dkv_units = 1;
  if (pl->products != TG_PRODUCTS_BF16_DOT) return;
  const int forced = atomic_load(&testing_dkv_units);
  if (forced > 0) {
    pl->dkv_units = forced;
    return;
  }
  if (pr->D < TG_ATTN_DKV_MIN_D) return;
  const int64_t unit_k = pl->BQ * tg_attn_parts(pr, TG_ATTN_PASS_BWD);
  const int64_t units = (TG_ATTN_DKV_K + unit_k - 1) / unit_k;
  pl->dkv_units = units < TG_ATTN_MAX_DKV_UNITS ? units : TG_ATTN_MAX_DKV_UNITS;
}

static atomic_int testing_dkv_transposed = -1; /* tg_testing_attn_dkv_transposed */

void tg_testing_attn_dkv_transposed(int mode) {
  atomic_store(&testing_dkv_transposed, mode < 0 ? -1 : mode > 0);
}

tg_attn_bwd_plan tg_attn_bwd_plan_make(const tg_attn_problem *pr, const tg_isa_ops *ops,
                                       int cpus) {
  tg_attn_bwd_plan pl = {.BQ = tg_attn_bq(pr, ops),
                         .cpus = cpus < 1 ? 1 : cpus,
                         .BK = tg_attn_bk(pr, ops),
                         .bf16_dot = tg_attn_bf16_dot(pr, ops),
                         .products = tg_attn_products_of(pr, ops, TG_ATTN_PASS_BWD)};
  pl.Kq = tg_attn_k_padded(pr, ops, pr->D);
  pl.Kv = tg_attn_k_padded(pr, ops, pr->Dv);
  pl.n_qtiles = (pr->qL + pl.BQ - 1) / pl.BQ;
  pl.n_ktiles = (pr->kL + pl.BK - 1) / pl.BK;
  plan_ranges(&pl, pr);
  plan_qgroups(&pl, pr);
  plan_groups_to_ranges(&pl, pr, ops->attn_bk);
  plan_chunk(&pl, pr);
  plan_dkv_units(&pl, pr);
  const int forced = atomic_load(&testing_dkv_transposed);
  pl.dkv_transposed =
      pl.products == TG_PRODUCTS_BF16_DOT &&
      (forced >= 0 ? forced : pr->D <= TG_ATTN_DKV_T_MAX_D && pr->Dv <= TG_ATTN_DKV_T_MAX_D);
  return pl;
}

size_t tg_attn_bwd_workspace_bytes(const tg_attn_bwd_plan *plan) {
  /* dQ partials and dK, dV parts together <= TG_ATTN_PARTIALS_BUDGET bytes
   * by plan_ranges' and plan_qgroups' caps */
  return (size_t)((plan->n_ranges - 1) * plan->dq_elems +
                  (plan->n_qgroups - 1) * (plan->dk_elems + plan->dv_elems)) *
         sizeof(float);
}

static bwd_args make_args(const tg_attn_problem *pr, const tg_isa_ops *ops,
                          const tg_attn_bwd_plan *plan) {
  return (bwd_args){.pr = *pr, .ops = ops, .plan = *plan};
}

/* The KV schedule's dQ partials, then dK parts, then dV parts, carved
 * from workspace (NULL: none of them). */
static void kv_partials(bwd_args *a, void *workspace) {
  if (!workspace) return;
  a->dQ_partial = workspace;
  a->dK_partial = a->dQ_partial + (a->plan.n_ranges - 1) * a->plan.dq_elems;
  a->dV_partial = a->dK_partial + (a->plan.n_qgroups - 1) * a->plan.dk_elems;
}

/* The KV schedule's first pass, and the scratch its items take. */
static tg_grid kv_grid(const bwd_args *a) {
  return (tg_grid){a->pr.H_kv * a->plan.n_qgroups, a->pr.B, a->plan.n_ranges, bwd_group_kv, a};
}
static size_t kv_scratch(const bwd_args *a) {
  return bwd_scratch_bytes(&a->pr, &a->plan, a->plan.chunk_tiles, a->pr.compensated);
}

/* The second passes (no scratch), after the first: the dQ partials' sums
 * with several key ranges, the dK, dV parts' with several query groups.
 * Writes up to 2 grids into g; returns how many. */
static int kv_sum_grids(const bwd_args *a, tg_grid g[2]) {
  int n = 0;
  if (a->plan.n_ranges > 1)
    g[n++] = (tg_grid){a->plan.n_qtiles, a->pr.H, a->pr.B, bwd_group_sum_dq, a};
  if (a->plan.n_qgroups > 1)
    g[n++] = (tg_grid){a->plan.n_ktiles, a->pr.H_kv, a->pr.B, bwd_group_sum_dkv, a};
  return n;
}

/* The KV schedule on prepared args (inputs, outputs set); workspace as
 * kv_partials. */
static tg_status run_kv(tg_ctx *ctx, bwd_args *a, void *workspace) {
  kv_partials(a, workspace);
  const tg_grid first = kv_grid(a);
  tg_status st = tg_dispatch(ctx, first.nx, first.ny, first.nz, kv_scratch(a), bwd_group_kv, a);
  /* The second passes need no scratch: they cannot fail once the first wrote. */
  tg_grid sums[2];
  const int n = kv_sum_grids(a, sums);
  for (int i = 0; i < n && st == TG_OK; i++)
    st = tg_dispatch(ctx, sums[i].nx, sums[i].ny, sums[i].nz, 0, sums[i].fn, a);
  return st;
}

tg_status tg_attn_backward_kv(tg_ctx *ctx, const tg_attn_problem *pr,
                              const tg_attn_bwd_plan *plan, const void *Q, const void *K,
                              const void *V, const void *dO, const void *mask, const float *L,
                              const float *D_vec, float *dQ, float *dK, float *dV,
                              void *workspace) {
  bwd_args a = make_args(pr, ctx->ops, plan);
  a.Q = Q, a.K = K, a.V = V, a.dO = dO, a.mask = mask, a.L = L, a.D_vec = D_vec;
  a.dQ = dQ, a.dK = dK, a.dV = dV;
  return run_kv(ctx, &a, workspace);
}

/* --- the sinks' gradient ----------------------------------------------------
 * A sink is one more score of every row of its head, with no value:
 * P_sink = e^{s_h - L} (L holds the sink), dP_sink = dO . 0 = 0, so
 * dS_sink = P_sink (0 - D) and d_sinks[h] += -sum_{b,i} e^{s_h - L[b,h,i]}
 * D_vec[b,h,i]. One item per head, the B * qL terms summed in f64 in (b, i)
 * order: the same bits for every thread count. */
typedef struct {
  const float *sinks, *L, *D_vec;
  float *d_sinks;
  int64_t B, H, qL;
} sinks_grad_args;

static void sinks_grad_group(const void *vargs, int64_t h, int64_t y, int64_t z,
                             void *scratch) {
  const sinks_grad_args *a = vargs;
  const double s = a->sinks[h];
  if (s == -INFINITY) return; /* no sink: P_sink = 0 */
  double sum = 0.0;
  for (int64_t b = 0; b < a->B; b++) {
    const int64_t r0 = (b * a->H + h) * a->qL;
    for (int64_t i = 0; i < a->qL; i++) sum += exp(s - a->L[r0 + i]) * a->D_vec[r0 + i];
  }
  a->d_sinks[h] += (float)-sum;
}

static tg_status compute_d_rows(tg_ctx *ctx, tg_dtype dtype, const void *O, const void *dO,
                                const tg_attn_problem *pr, float *D_out);

/* bf16 gradients: where their f32 sums are kept (bwd_args.dQ16), carved
 * from the workspace before the partials: dQ's range-0 sums, and with
 * several query groups group 0's dK, dV sums, all contiguous like the
 * gradients. Returns the bytes. */
static size_t carve_grad_sums(const tg_attn_bwd_plan *plan, void *base, bwd_args *a) {
  const size_t dq = tg_align64(sizeof(float) * (size_t)plan->dq_elems);
  const size_t dk = plan->n_qgroups > 1 ? tg_align64(sizeof(float) * (size_t)plan->dk_elems) : 0;
  const size_t dv = plan->n_qgroups > 1 ? tg_align64(sizeof(float) * (size_t)plan->dv_elems) : 0;
  if (base) {
    a->dQ = base;
    a->dK = dk ? (float *)(void *)((char *)base + dq) : NULL;
    a->dV = dv ? (float *)(void *)((char *)base + dq + dk) : NULL;
  }
  return dq + dk + dv;
}

/* TG_ERR_NULL_ARG naming the first of the backward's buffers that is NULL
 * (O with step, else D_vec). */
static tg_status need_buffers(tg_ctx *ctx, const char *fn, int step, const void *Q,
                              const void *K, const void *V, const float *L, const void *dO,
                              const void *O, const float *D_vec, const void *dQ,
                              const void *dK, const void *dV) {
  const void *bufs[] = {Q, K, V, L, dO, step ? O : D_vec, dQ, dK, dV};
  const char *names[] = {"Q", "K", "V", "L", "dO", step ? "O" : "D_vec", "dQ", "dK", "dV"};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!bufs[i]) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, names[i]);
  return TG_OK;
}

/* The backward entry points' checks after tg_attn_prepare, and pr's
 * compensated sums (f32 inputs) and dK, dV writes (the step). */
static tg_status step_checks(tg_ctx *ctx, const char *fn, int step, tg_dtype dtype,
                             tg_dtype grad, tg_attn_problem *pr) {
  if (grad != TG_DTYPE_F32 && grad != TG_DTYPE_BF16)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: grad_dtype %d is not a tg_dtype (TG_DTYPE_BF16 0, TG_DTYPE_F32 1)", fn,
                   (int)grad);
  /* The forward's options may carry TG_ATTN_OPT_O_F32: its O is then f32,
   * which the step would read as bf16. */
  if (step && pr->o_f32 && dtype == TG_DTYPE_BF16)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: flags has TG_ATTN_OPT_O_F32, but the step reads O as dtype (bf16); "
                   "round O to bf16, or call tg_attn_train_bwd_compute_d and "
                   "tg_attn_train_bwd", fn);
  pr->compensated = dtype == TG_DTYPE_F32;
  pr->dkv_write |= step;
  return TG_OK;
}

/* The entry points' shared body; fn names the public function in messages.
 * step (tg_attn_train_bwd_step): O given, D_vec computed into the
 * workspace, dK, dV written, gradients of type grad; otherwise D_vec
 * given and f32 gradients. */
static tg_status train_bwd(tg_ctx *ctx, const char *fn, int step, tg_dtype dtype,
                           tg_dtype grad, const void *Q, const void *K, const void *V,
                           const float *L, const void *dO, const void *O, const float *D_vec,
                           void *dQ, void *dK, void *dV, const tg_attn_params *p,
                           const tg_attn_mask_params *mp, const void *mask, int causal,
                           const tg_attn_options *opt) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = need_buffers(ctx, fn, step, Q, K, V, L, dO, O, D_vec, dQ, dK, dV);
  if (st != TG_OK) return st;
  tg_attn_problem pr;
  st = tg_attn_prepare(ctx, fn, dtype, opt, p, mp, mask, causal, &pr);
  if (st != TG_OK) return st;
  if ((st = step_checks(ctx, fn, step, dtype, grad, &pr)) != TG_OK) return st;
  float *d_sinks = opt ? opt->d_sinks : NULL;
  st = tg_attn_check_alias_bwd(ctx, fn, &pr, Q, K, V, L, dO, step ? O : NULL,
                               step ? NULL : D_vec, mask, dQ, dK, dV,
                               grad == TG_DTYPE_BF16 ? sizeof(tg_bf16) : sizeof(float), d_sinks);
  if (st != TG_OK) return st;
  const tg_attn_bwd_plan plan = tg_attn_bwd_plan_make(&pr, ctx->ops, tg_ctx_plan_cpus(ctx));
  bwd_args a = make_args(&pr, ctx->ops, &plan);
  a.Q = Q, a.K = K, a.V = V, a.dO = dO, a.mask = mask, a.L = L, a.D_vec = D_vec;
  a.dQ = dQ, a.dK = dK, a.dV = dV;
  const int bf16_grads = grad == TG_DTYPE_BF16;
  /* the workspace: D_vec (step), the bf16 gradients' f32 sums, the partials */
  const size_t d_bytes = step ? tg_align64(sizeof(float) * (size_t)(pr.B * pr.H * pr.qL)) : 0;
  const size_t sums_bytes = bf16_grads ? carve_grad_sums(&plan, NULL, &a) : 0;
  const int atomic = ctx->attn_schedule == TG_ATTN_SCHEDULE_ATOMIC && !ctx->deterministic &&
                     !bf16_grads;
  const size_t ws_bytes = d_bytes + sums_bytes + (atomic ? 0 : tg_attn_bwd_workspace_bytes(&plan));
  char *ws = NULL;
  if (ws_bytes > 0 && (st = tg_workspace(ctx, ws_bytes, (void **)&ws)) != TG_OK) return st;
  if (step) {
    a.D_vec = (float *)(void *)ws;
    if ((st = compute_d_rows(ctx, dtype, O, dO, &pr, (float *)(void *)ws)) != TG_OK) return st;
  }
  if (bf16_grads) {
    a.dQ16 = dQ, a.dK16 = dK, a.dV16 = dV;
    carve_grad_sums(&plan, ws + d_bytes, &a);
  }
  if (atomic) {
    const size_t scratch = bwd_scratch_bytes(&pr, &a.plan, 1, 0);
    /* (the zeros ask for the pairs' scratch: a failure to get it comes
     * before anything is written) */
    if (pr.dkv_write) st = tg_dispatch(ctx, pr.H_kv, pr.B, 1, scratch, zero_dkv_group, &a);
    if (st == TG_OK) st = tg_dispatch(ctx, a.plan.n_qtiles, pr.H, pr.B, scratch, bwd_group_atomic, &a);
  } else {
    const size_t partials = tg_attn_bwd_workspace_bytes(&plan);
    st = run_kv(ctx, &a, partials ? ws + d_bytes + sums_bytes : NULL);
  }
  if (st != TG_OK || !d_sinks) return st;
  /* needs no scratch: cannot fail once the key gradients are written */
  const sinks_grad_args sa = {pr.sinks, L, a.D_vec, d_sinks, pr.B, pr.H, pr.qL};
  return tg_dispatch(ctx, pr.H, 1, 1, 0, sinks_grad_group, &sa);
}

tg_status tg_attn_train_bwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                            const void *V, const float *L, const void *dO,
                            const float *D_vec, float *dQ, float *dK, float *dV,
                            const tg_attn_params *p, const tg_attn_mask_params *mp,
                            const void *mask, int causal, const tg_attn_options *opt) {
  return train_bwd(ctx, "tg_attn_train_bwd", 0, dtype, TG_DTYPE_F32, Q, K, V, L, dO, NULL, D_vec,
                   dQ, dK, dV, p, mp, mask, causal, opt);
}

tg_status tg_attn_train_bwd_step(tg_ctx *ctx, tg_dtype dtype, tg_dtype grad_dtype,
                                 const void *Q, const void *K, const void *V, const void *O,
                                 const float *L, const void *dO, void *dQ, void *dK,
                                 void *dV, const tg_attn_params *p,
                                 const tg_attn_mask_params *mp, const void *mask, int causal,
                                 const tg_attn_options *opt) {
  return train_bwd(ctx, "tg_attn_train_bwd_step", 1, dtype, grad_dtype, Q, K, V, L, dO, O, NULL,
                   dQ, dK, dV, p, mp, mask, causal, opt);
}

tg_status tg_flash_attn_train_bwd_bf16(tg_ctx *ctx, const tg_bf16 *Q, const tg_bf16 *K,
                                       const tg_bf16 *V, const float *L,
                                       const tg_bf16 *dO, const float *D_vec, float *dQ,
                                       float *dK, float *dV, const tg_attn_params *p,
                                       const tg_attn_mask_params *mp,
                                       const tg_bf16 *mask, int causal) {
  return train_bwd(ctx, "tg_flash_attn_train_bwd_bf16", 0, TG_DTYPE_BF16, TG_DTYPE_F32, Q, K, V,
                   L, dO, NULL, D_vec, dQ, dK, dV, p, mp, mask, causal, NULL);
}

/* --- varlen (include/tilegrad.h, "packed sequences") ------------------------
 * Each document's KV schedule as its own problem's (its plan for its share
 * of the CPUs, its slice of the workspace), all documents' first passes in
 * one loop, then all their second passes in another. */
static tg_status varlen_bwd(tg_ctx *ctx, const char *fn, int step, tg_dtype dtype,
                            tg_dtype grad, const void *Q, const void *K, const void *V,
                            const float *L, const void *dO, const void *O, const float *D_vec,
                            void *dQ, void *dK, void *dV, const tg_attn_params *p,
                            const tg_attn_varlen *docs, int causal,
                            const tg_attn_options *opt) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = need_buffers(ctx, fn, step, Q, K, V, L, dO, O, D_vec, dQ, dK, dV);
  if (st != TG_OK) return st;
  tg_attn_problem pr;
  tg_attn_docs dl;
  st = tg_attn_varlen_prepare(ctx, fn, dtype, opt, p, docs, causal, &pr, &dl);
  if (st != TG_OK) return st;
  bwd_args *args = NULL;
  tg_grid *grids = NULL;
  float *d_sinks = opt ? opt->d_sinks : NULL;
  const size_t ge = grad == TG_DTYPE_BF16 ? sizeof(tg_bf16) : sizeof(float);
  if ((st = step_checks(ctx, fn, step, dtype, grad, &pr)) ||
      (st = tg_attn_check_alias_bwd(ctx, fn, &pr, Q, K, V, L, dO, step ? O : NULL,
                                    step ? NULL : D_vec, NULL, dQ, dK, dV, ge, d_sinks)))
    goto done;
  {
    const tg_buf outs[] = {
        tg_attn_buf("dQ", dQ, pr.dQs, 1, pr.H, pr.qL, pr.D, ge, 1),
        tg_attn_buf("dK", dK, pr.dKs, 1, pr.H_kv, pr.kL, pr.D, ge, 1),
        tg_attn_buf("dV", dV, pr.dVs, 1, pr.H_kv, pr.kL, pr.Dv, ge, 1),
        tg_out("d_sinks", d_sinks, d_sinks ? (uint64_t)pr.H * sizeof(float) : 0)};
    if ((st = tg_attn_varlen_check_alias(ctx, fn, docs, &pr, &dl, outs, TG_LEN(outs)))) goto done;
  }
  args = tg_mem_alloc(sizeof(bwd_args) * (size_t)dl.n, 64);
  grids = tg_mem_alloc(sizeof(tg_grid) * 3 * (size_t)dl.n, 64);
  if (!args || !grids) {
    st = tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate the plans of %lld documents", fn,
                 (long long)dl.n);
    goto done;
  }
  const int bf16_grads = grad == TG_DTYPE_BF16;
  /* the plans, and the workspace: D_vec (step), then per document its
   * bf16 gradients' f32 sums and its partials */
  const size_t d_bytes = step ? tg_align64(sizeof(float) * (size_t)(pr.H * pr.qL)) : 0;
  size_t ws_bytes = d_bytes;
  int64_t n = 0;
  for (int64_t i = 0; i < dl.n; i++) {
    const tg_attn_doc *d = &dl.docs[i];
    if (!d->qL || !d->kL) continue;
    const tg_attn_problem dp = tg_attn_doc_problem(&pr, d);
    const tg_attn_bwd_plan plan = tg_attn_bwd_plan_make(&dp, ctx->ops, d->cpus);
    bwd_args *a = &args[n++];
    *a = make_args(&dp, ctx->ops, &plan);
    const size_t own = (bf16_grads ? carve_grad_sums(&plan, NULL, a) : 0) +
                       tg_align64(tg_attn_bwd_workspace_bytes(&plan));
    if (ws_bytes > SIZE_MAX - own) {
      st = tg_fail(ctx, TG_ERR_OVERFLOW, "%s: the workspace size overflows", fn);
      goto done;
    }
    ws_bytes += own;
  }
  char *ws = NULL;
  if (ws_bytes > 0 && (st = tg_workspace(ctx, ws_bytes, (void **)&ws)) != TG_OK) goto done;
  if (step) {
    D_vec = (float *)(void *)ws;
    if ((st = compute_d_rows(ctx, dtype, O, dO, &pr, (float *)(void *)ws)) != TG_OK) goto done;
  }
  /* the documents' args, in the order of args (their docs' order) */
  size_t at = d_bytes, scratch = 0;
  for (int64_t i = 0, j = 0; i < dl.n; i++) {
    const tg_attn_doc *d = &dl.docs[i];
    if (!d->qL || !d->kL) continue;
    bwd_args *a = &args[j];
    a->Q = tg_attn_at(pr.in, Q, d->q0 * pr.Qs[2]);
    a->K = tg_attn_at(pr.in, K, d->k0 * pr.Ks[2]);
    a->V = tg_attn_at(pr.in, V, d->k0 * pr.Vs[2]);
    a->dO = tg_attn_at(pr.in, dO, d->q0 * pr.Os[2]);
    a->L = L + d->q0, a->D_vec = D_vec + d->q0;
    a->mask = docs->mask ? tg_attn_at(pr.in, docs->mask, d->mask0) : NULL;
    const int64_t q = d->q0 * pr.dQs[2], k = d->k0 * pr.dKs[2], v = d->k0 * pr.dVs[2];
    if (bf16_grads) {
      a->dQ16 = (uint16_t *)dQ + q, a->dK16 = (uint16_t *)dK + k, a->dV16 = (uint16_t *)dV + v;
      at += carve_grad_sums(&a->plan, ws + at, a);
    } else {
      a->dQ = (float *)dQ + q, a->dK = (float *)dK + k, a->dV = (float *)dV + v;
    }
    const size_t partials = tg_attn_bwd_workspace_bytes(&a->plan);
    kv_partials(a, partials ? ws + at : NULL);
    at += tg_align64(partials);
    grids[j] = kv_grid(a);
    const size_t b = kv_scratch(a);
    scratch = b > scratch ? b : scratch;
    j++;
  }
  if ((st = tg_dispatch_grids(ctx, grids, n, scratch)) != TG_OK) goto done;
  /* the second passes need no scratch: they cannot fail once the first wrote */
  int64_t m = 0;
  for (int64_t j = 0; j < n; j++) m += kv_sum_grids(&args[j], grids + m);
  if ((st = tg_dispatch_grids(ctx, grids, m, 0)) != TG_OK) goto done;
  /* documents with queries and no keys: dQ rows 0; with keys and no
   * queries: dK, dV rows 0 where they are written */
  for (int64_t i = 0; i < dl.n; i++) {
    const tg_attn_doc *d = &dl.docs[i];
    if (d->qL && !d->kL)
      memset((char *)dQ + (size_t)(d->q0 * pr.dQs[2]) * ge, 0, (size_t)(d->qL * pr.dQs[2]) * ge);
    if (!d->qL && d->kL && pr.dkv_write) {
      memset((char *)dK + (size_t)(d->k0 * pr.dKs[2]) * ge, 0, (size_t)(d->kL * pr.dKs[2]) * ge);
      memset((char *)dV + (size_t)(d->k0 * pr.dVs[2]) * ge, 0, (size_t)(d->kL * pr.dVs[2]) * ge);
    }
  }
  if (d_sinks) { /* L, D_vec [H, total_q]: the dense pass over B = 1 */
    const sinks_grad_args sa = {pr.sinks, L, D_vec, d_sinks, 1, pr.H, pr.qL};
    st = tg_dispatch(ctx, pr.H, 1, 1, 0, sinks_grad_group, &sa);
  }
done:
  tg_mem_free(args);
  tg_mem_free(grids);
  tg_attn_docs_free(&dl);
  return st;
}

tg_status tg_attn_varlen_bwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                             const void *V, const float *L, const void *dO,
                             const float *D_vec, float *dQ, float *dK, float *dV,
                             const tg_attn_params *p, const tg_attn_varlen *docs,
                             int causal, const tg_attn_options *opt) {
  return varlen_bwd(ctx, "tg_attn_varlen_bwd", 0, dtype, TG_DTYPE_F32, Q, K, V, L, dO, NULL,
                    D_vec, dQ, dK, dV, p, docs, causal, opt);
}

tg_status tg_attn_varlen_bwd_step(tg_ctx *ctx, tg_dtype dtype, tg_dtype grad_dtype,
                                  const void *Q, const void *K, const void *V, const void *O,
                                  const float *L, const void *dO, void *dQ, void *dK,
                                  void *dV, const tg_attn_params *p,
                                  const tg_attn_varlen *docs, int causal,
                                  const tg_attn_options *opt) {
  return varlen_bwd(ctx, "tg_attn_varlen_bwd_step", 1, dtype, grad_dtype, Q, K, V, L, dO, O,
                    NULL, dQ, dK, dV, p, docs, causal, opt);
}

/* --- 1. pre-pass: D[b,h,i] = sum_d O[b,h,i,d] * dO[b,h,i,d] ----------------
 * Metal: one threadgroup per row (simd tree over d). Here one work item per
 * block of TG_ATTN_D_ROWS_PER_GROUP rows; the per-row dot is the ISA layer's
 * lane-parallel sum. */

typedef struct {
  const void *O, *dO; /* type t */
  tg_dtype t;
  float *D_out;
  int64_t rows, D;
  const tg_isa_ops *ops;
  /* O's and dO's [batch, head, row] strides (contiguous for the pre-pass,
   * the params' O_strides for tg_attn_train_bwd_step), H heads of qL rows */
  int64_t Os[3], H, qL;
} compute_d_args;

/* Rows are taken in memory order: a row's heads side by side where they lie
 * closer together than a head's rows (packed [total, H, D] and
 * transformers' [B, L, H, D] views: Os[1] < Os[2]), else a head's rows in
 * turn. Walking a packed layout head by head read each 128-byte row slice
 * a row stride (H * D elements) away from the last: D_vec of 4096 x 12
 * heads x 64 took 4.0 ms at 2 threads on the lent Xeon, a tenth of its
 * bandwidth. Each row's dot is the same whatever the order. */
static void compute_d_group(const void *vargs, int64_t blk, int64_t y, int64_t z,
                            void *scratch) {
  const compute_d_args *a = vargs;
  const int64_t r0 = blk * TG_ATTN_D_ROWS_PER_GROUP;
  const int64_t r1 =
      r0 + TG_ATTN_D_ROWS_PER_GROUP < a->rows ? r0 + TG_ATTN_D_ROWS_PER_GROUP : a->rows;
  const int heads_inner = a->Os[1] < a->Os[2];
  const int64_t per_batch = a->H * a->qL;
  for (int64_t r = r0; r < r1; r++) {
    const int64_t b = r / per_batch, in_b = r % per_batch;
    const int64_t h = heads_inner ? in_b % a->H : in_b / a->qL;
    const int64_t i = heads_inner ? in_b / a->H : in_b % a->qL;
    const int64_t at = tg_attn_offset(a->Os, b, h, i);
    float *out = a->D_out + (b * a->H + h) * a->qL + i; /* D_vec [B, H, qL] */
    if (a->t == TG_DTYPE_F32)
      *out = a->ops->dot_f32((const float *)a->O + at, (const float *)a->dO + at, a->D);
    else
      *out = a->ops->dot_bf16((const tg_bf16 *)a->O + at, (const tg_bf16 *)a->dO + at, a->D);
  }
}

static tg_status dispatch_compute_d(tg_ctx *ctx, const compute_d_args *a) {
  return tg_dispatch(ctx, (a->rows + TG_ATTN_D_ROWS_PER_GROUP - 1) / TG_ATTN_D_ROWS_PER_GROUP, 1,
                     1, 0, compute_d_group, a);
}

/* tg_attn_train_bwd_step's D_vec: O and dO rows through pr->Os, Dv long. */
static tg_status compute_d_rows(tg_ctx *ctx, tg_dtype dtype, const void *O, const void *dO,
                                const tg_attn_problem *pr, float *D_out) {
  const compute_d_args a = {O,      dO,       dtype,
                            D_out,  pr->B * pr->H * pr->qL,
                            pr->Dv, ctx->ops, {pr->Os[0], pr->Os[1], pr->Os[2]},
                            pr->H,  pr->qL};
  return dispatch_compute_d(ctx, &a);
}

/* The entry points' shared body; fn names the public function in messages. */
static tg_status compute_d(tg_ctx *ctx, const char *fn, tg_dtype dtype, const void *O,
                           const void *dO, float *D_out, uint32_t batch, uint32_t n_q_heads,
                           uint32_t q_seq_len, uint32_t head_dim) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (!O || !dO || !D_out)
    return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn,
                   !O ? "O" : !dO ? "dO" : "D_out");
  tg_status st = tg_attn_check_dtype(ctx, fn, dtype);
  if (st != TG_OK) return st;
  char what[128];
  snprintf(what, sizeof what, "%s: O/dO [batch, n_q_heads, q_seq_len, head_dim]", fn);
  int64_t elems;
  if ((st = tg_shape_count(ctx, what, sizeof(float), &elems, 4, (int64_t)batch,
                           (int64_t)n_q_heads, (int64_t)q_seq_len, (int64_t)head_dim)))
    return st;
  const int64_t rows = elems / head_dim;
  /* Not in place: D_out[r] lands inside O / dO rows <= r, which other work
   * items may still be reading. */
  const size_t e = dtype == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
  const tg_buf bufs[] = {tg_in("O", O, (uint64_t)elems * e), tg_in("dO", dO, (uint64_t)elems * e),
                         tg_out("D_out", D_out, (uint64_t)rows * sizeof(float))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  const int64_t D = head_dim, L = q_seq_len, H = n_q_heads; /* contiguous [B, H, L, D] */
  const compute_d_args a = {O, dO, dtype, D_out, rows, D, ctx->ops, {H * L * D, L * D, D}, H, L};
  return dispatch_compute_d(ctx, &a);
}

tg_status tg_attn_train_bwd_compute_d(tg_ctx *ctx, tg_dtype dtype, const void *O,
                                      const void *dO, float *D_out, uint32_t batch,
                                      uint32_t n_q_heads, uint32_t q_seq_len,
                                      uint32_t head_dim) {
  return compute_d(ctx, "tg_attn_train_bwd_compute_d", dtype, O, dO, D_out, batch, n_q_heads,
                   q_seq_len, head_dim);
}

tg_status tg_flash_attn_train_bwd_compute_d_bf16(tg_ctx *ctx, const tg_bf16 *O,
                                                 const tg_bf16 *dO, float *D_out,
                                                 uint32_t batch, uint32_t n_q_heads,
                                                 uint32_t q_seq_len, uint32_t head_dim) {
  return compute_d(ctx, "tg_flash_attn_train_bwd_compute_d_bf16", TG_DTYPE_BF16, O, dO, D_out,
                   batch, n_q_heads, q_seq_len, head_dim);
}
