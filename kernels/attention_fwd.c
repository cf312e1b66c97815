/*
 * FlashAttention-2 training forward: O = softmax(S) . V and the natural-log
 * logsumexp L that the backward consumes, with the score S exactly as the
 * backward defines it (tg_attn_score: scale, softcap, causal qL_off, mask).
 *
 * One work item per (q units, kv head, batch): a kv head's q units are its
 * (q-tile, query head) pairs, q-tile major, and an item takes up to
 * fwd_q_tiles consecutive ones: the query heads of a GQA group at one
 * q-tile before the next q-tile. They share each key tile's load (K
 * transposed or packed, V widened or packed) and keep their own state.
 * Each unit streams its visible key tiles with an online softmax:
 *
 *   S = Q . K^T                              [nq, nk]
 *   m' = max(m, rowmax S);  alpha = exp(m - m');  P = exp(S - m')
 *   l  = alpha l + rowsum P;  acc = alpha acc + P . V     [nq, D]
 *
 * and finishes with O = acc / l (bf16 or f32, through O_strides) and
 * L = m + log l. A row that sees no key (all -inf) gets O = 0 and L = -inf.
 * In bf16 mode (P's bf16 part from the exp rows, no mask or softcap) m
 * stays where it is while a tile's scores stay within TG_ATTN_FWD_MAX_LAG
 * above it (P up to e^8; alpha = 1): one pass over the row instead of two.
 * Every row is computed by one item in a fixed order: the forward is
 * deterministic for any thread count.
 *
 * With dropout the dropped entries of P are zeroed before acc += P . V (l
 * keeps them: L is the logsumexp of the undropped scores) and the kept ones'
 * 1 / (1 - p) is folded into the final scaling, O = (acc / l) / (1 - p).
 *
 * Variants (tg_attn_options): a sliding window W starts each q-tile's key
 * loop at the first key its first row can see (tg_attn_key_begin), so
 * a row costs about W keys, not kL; the keys of a tile left of a row's
 * window are -inf like causal ones. A sink s_h joins the row's state once,
 * after the last tile, as one more score with no value: m' = max(m, s_h),
 * l' = l e^{m - m'} + e^{s_h - m'}, acc scaled by e^{m - m'}. V, O and the
 * accumulator have Dv columns (Q, K: D).
 *
 * Precision modes (tg_attn_products): bf16 and split mode, and exact mode
 * where the table's exact_parts_min_d says so, run acc += P.V on the bf16
 * parts of P (1 or 2: tg_attn_parts; exact mode takes split mode's two)
 * against V's rows in pairs; l sums the f32 P. bf16 mode's one part comes
 * from the exp rows themselves (attn_exp_sum_bf16_row) where no dropout has
 * to zero entries of P first.
 *
 * tg_attn_forward is the loop itself, on a validated problem with bf16 or
 * f32 inputs; kernel 10 (causal_attention.c) runs it on f32 token-major
 * rows, storing no O but delta = dO . O (O in f32) for its backward.
 */
#include <math.h>
#include <string.h>

#include "attention.h"

typedef struct {
  tg_attn_problem pr;
  const void *Q, *K, *V, *dO, *mask; /* type pr.in */
  void *O;      /* type pr.in; NULL: O is not written */
  float *L;
  float *delta; /* with dO: rowsum(dO * O) */
  const tg_isa_ops *ops;
  int64_t BQ, BK; /* tiles: fwd_q_tile, fwd_key_tile */
  int64_t FQ;     /* q units per work item: fwd_q_tiles */
  int bf16_dot;   /* tg_attn_bf16_dot: S = Q.K^T on bf16 pairs, KT holds pairs */
  int64_t Kp;     /* S's K (tg_attn_k_padded of D; > D: Q's rows in the q units'
                   * Q, padded, and KT's pairs padded with zero rows) */
  tg_attn_products products; /* of acc += P.V (precision mode) */
  int64_t n_qtiles;
} fwd_args;

/* One q unit of a work item (a q-tile of query head h) and its rows'
 * online-softmax state. */
typedef struct {
  int64_t h, q0, nq, key_end; /* rows [q0, q0 + nq), keys [.., key_end) */
  float *Q, *acc;          /* [BQ, D], [BQ, Dv] */
  float *m, *l;            /* [BQ] running max and sum */
} fwd_qtile;

typedef struct {
  fwd_qtile q[TG_ATTN_FWD_MAX_UNITS];
  float *K, *V;    /* [BK, D], [BK, Dv] */
  float *KT;       /* [D, BK] */
  float *S;        /* [BQ, BK] */
  uint8_t *keep;   /* [BQ, BK] dropout keep flags */
  /* TG_PRODUCTS_BF16_DOT: P's bf16 parts [BQ, BK] (tg_attn_parts of them,
   * the rest NULL); V then holds V's bf16 rows in pairs ([BK/2, D],
   * pack_bf16_row_pairs) */
  uint16_t *P_parts[3];
} fwd_scratch;

/* Bytes of one q-tile's state. */
static size_t fwd_qtile_bytes(int64_t D, int64_t Dv, int64_t BQ) {
  return tg_align64(sizeof(float) * BQ * (size_t)D) + tg_align64(sizeof(float) * BQ * (size_t)Dv) +
         2 * tg_align64(sizeof(float) * BQ);
}

static size_t fwd_scratch_bytes(int64_t D, int64_t Dv, int64_t BQ, int64_t BK, int64_t FQ,
                                int n_parts) {
  const size_t parts = (size_t)n_parts * tg_align64(2 * BQ * BK);
  return (size_t)FQ * fwd_qtile_bytes(D, Dv, BQ) + 2 * tg_align64(sizeof(float) * BK * (size_t)D) +
         tg_align64(sizeof(float) * BK * (size_t)Dv) + tg_align64(sizeof(float) * BQ * BK) +
         tg_align64((size_t)(BQ * BK)) + parts;
}

static fwd_scratch fwd_carve(void *base, int64_t D, int64_t Dv, int64_t BQ, int64_t BK,
                             int64_t FQ, int n_parts) {
  char *p = base;
  const size_t k = tg_align64(sizeof(float) * BK * (size_t)D);
  fwd_scratch w;
  for (int64_t s = 0; s < FQ; s++) {
    fwd_qtile *t = &w.q[s];
    t->Q = (float *)p, p += tg_align64(sizeof(float) * BQ * (size_t)D);
    t->acc = (float *)p, p += tg_align64(sizeof(float) * BQ * (size_t)Dv);
    t->m = (float *)p, p += tg_align64(sizeof(float) * BQ);
    t->l = (float *)p, p += tg_align64(sizeof(float) * BQ);
  }
  w.K = (float *)p, p += k;
  w.KT = (float *)p, p += k;
  w.V = (float *)p, p += tg_align64(sizeof(float) * BK * (size_t)Dv);
  w.S = (float *)p, p += tg_align64(sizeof(float) * BQ * BK);
  w.keep = (uint8_t *)p, p += tg_align64((size_t)(BQ * BK));
  for (int i = 0; i < 3; i++)
    w.P_parts[i] = i < n_parts ? (uint16_t *)(p + (size_t)i * tg_align64(2 * BQ * BK)) : NULL;
  return w;
}

/* The scores of q unit t against the key tile [k0, k0 + nk) in S become
 * P = exp(S - m') (rows' new running max m'), with l and acc rescaled; P
 * in S, or, with P16, as its bf16 part in P16's rows [nq, BK] (each padded
 * to even with a 0; the exp rows' shorter exp for a value rounded to bf16
 * next, within 2^-18 of e^x: ops.h, attn_exp_sum_bf16_row). */
static void fwd_softmax_tile(const fwd_args *a, fwd_qtile *t, float *S, int64_t b, int64_t k0,
                             int64_t nk, uint16_t *P16) {
  const tg_attn_problem *pr = &a->pr;
  const tg_isa_ops *ops = a->ops;
  const int64_t BK = a->BK, Dv = pr->Dv;
  for (int64_t i = 0; i < t->nq; i++) {
    const int64_t qi = t->q0 + i;
    const void *mrow = pr->Ms ? tg_attn_at(pr->in, a->mask, tg_attn_offset(pr->Ms, b, t->h, qi))
                              : NULL;
    float *P = S + i * BK, unused, tile_max;
    uint16_t *p16 = P16 ? P16 + i * BK : NULL;
    if (p16 && nk % 2) p16[nk] = 0;
    /* without softcap: keys [0, lo) left of the window, [n_vis, nk) right
     * of the diagonal */
    const int64_t lo = pr->softcap == 0.0f ? tg_attn_hidden_left(pr, qi, k0, nk) : 0;
    const int64_t n_vis = pr->softcap == 0.0f ? tg_attn_visible(pr, qi, k0, nk) : nk;
    /* bf16 part, no mask or softcap, a running max, some key visible: one
     * pass where the tile's scores stay within TG_ATTN_FWD_MAX_LAG above it
     * (the raw scores are still in S for the two passes below where they
     * do not) */
    if (p16 && !mrow && pr->softcap == 0.0f && lo < n_vis && t->m[i] > -INFINITY &&
        t->m[i] < INFINITY) {
      float row_max;
      const float sum = ops->attn_exp_sum_lag_bf16_row(P + lo, n_vis - lo, pr->scale, t->m[i],
                                                       p16 + lo, &row_max);
      if (row_max <= t->m[i] + TG_ATTN_FWD_MAX_LAG) {
        memset(p16, 0, sizeof(uint16_t) * (size_t)lo);
        memset(p16 + n_vis, 0, sizeof(uint16_t) * (size_t)(nk - n_vis));
        t->l[i] += sum;
        continue;
      }
    }
    if (pr->softcap == 0.0f) {
      if (lo >= n_vis) { /* none visible */
        for (int64_t k = 0; k < nk; k++) P[k] = -INFINITY;
        tile_max = -INFINITY;
      } else {
        for (int64_t k = 0; k < lo; k++) P[k] = -INFINITY;
        tile_max = ops->attn_score_max_row(P + lo, nk - lo, n_vis - lo, pr->scale,
                                           mrow ? tg_attn_at(pr->in, mrow, k0 + lo) : NULL,
                                           pr->in);
      }
    } else {
      for (int64_t k = 0; k < nk; k++) P[k] = tg_attn_score(pr, P[k], qi, k0 + k, mrow, &unused);
      tile_max = ops->max_f32(P, nk); /* skips NaN: */
      for (int64_t k = 0; k < nk; k++) tile_max = P[k] != P[k] ? P[k] : tile_max;
    }
    /* NaN-propagating max: once a score of the row is NaN, so are its
     * running max, P, sum, O row and L (PyTorch's and IEEE's semantics) */
    const float m_new = tile_max > t->m[i] || tile_max != tile_max ? tile_max : t->m[i];
    if (m_new == -INFINITY) { /* nothing visible yet: P = 0, state unchanged */
      if (p16) memset(p16, 0, sizeof(uint16_t) * (size_t)nk);
      else memset(P, 0, sizeof(float) * (size_t)nk);
      continue;
    }
    const float alpha = t->m[i] == m_new ? 1.0f /* the usual case, after a few tiles */
                        : t->m[i] == -INFINITY ? 0.0f : expf(t->m[i] - m_new);
    const float sum = p16 ? ops->attn_exp_sum_bf16_row(P, nk, m_new, p16)
                          : ops->attn_exp_sum_row(P, nk, m_new); /* P = exp(S - m') */
    t->l[i] = alpha * t->l[i] + sum;
    t->m[i] = m_new;
    if (alpha != 1.0f) ops->scale2_f32(t->acc + i * Dv, Dv, alpha, 1.0f);
  }
}

/* q unit t's O = (acc / l) * keep_scale, L and, with dO, delta = dO . O
 * (one dO row at a time through `row`, [Dv] floats). */
static void fwd_finish(const fwd_args *a, const fwd_qtile *t, int64_t b, float *row) {
  const tg_attn_problem *pr = &a->pr;
  const int64_t h = t->h;
  const tg_isa_ops *ops = a->ops;
  const int64_t Dv = pr->Dv;
  const float keep_scale = pr->drop.threshold ? pr->drop.scale : 1.0f;
  const float sink = pr->sinks ? pr->sinks[h] : -INFINITY; /* -inf: no sink */
  const int64_t row0 = b * pr->Ls[0] + h * pr->Ls[1] + t->q0; /* of L (and delta) */
  const void *dOh = a->dO ? tg_attn_at(pr->in, a->dO, tg_attn_offset(pr->Os, b, h, 0)) : NULL;
  for (int64_t i = 0; i < t->nq; i++) {
    float l = t->l[i], m = t->m[i];
    float *o = t->acc + i * Dv;
    /* l == 0: the row sees no key: O = 0 (the contract), also when V holds
     * a NaN that P = 0 multiplied; L = -inf, or the sink's s_h. l NaN: a NaN
     * reached the row's scores (O and L NaN) */
    if (l == 0.0f) memset(o, 0, sizeof(float) * (size_t)Dv);
    if (sink != -INFINITY) { /* one more score, with no value; NaN and +inf give NaN */
      const float m_new = sink > m || sink != sink ? sink : m;
      const float alpha = m == m_new ? 1.0f : m == -INFINITY ? 0.0f : expf(m - m_new);
      l = alpha * l + expf(sink - m_new);
      m = m_new;
      if (alpha != 1.0f) ops->scale2_f32(o, Dv, alpha, 1.0f);
    }
    if (l != 0.0f) ops->scale2_f32(o, Dv, l > 0.0f ? 1.0f / l : l, keep_scale);
    if (a->O) {
      const int64_t off = tg_attn_offset(pr->Os, b, h, t->q0 + i);
      if (pr->in == TG_DTYPE_F32 || pr->o_f32) /* o_f32: TG_ATTN_OPT_O_F32 */
        memcpy((float *)a->O + off, o, sizeof(float) * (size_t)Dv);
      else
        ops->f32_to_bf16(o, (tg_bf16 *)a->O + off, Dv);
    }
    if (dOh) {
      tg_attn_load_rows(ops, pr->in, dOh, pr->Os[2], t->q0 + i, 1, Dv, row, NULL, 0);
      a->delta[row0 + i] = ops->dot_f32(row, o, Dv);
    }
    a->L[row0 + i] = l == 0.0f ? -INFINITY : m + logf(l);
  }
}

static void fwd_group(const void *vargs, int64_t x, int64_t h_kv, int64_t b, void *scratch) {
  const fwd_args *a = vargs;
  const tg_attn_problem *pr = &a->pr;
  const tg_isa_ops *ops = a->ops;
  const int64_t BQ = a->BQ, BK = a->BK;
  fwd_scratch w = fwd_carve(scratch, pr->D, pr->Dv, BQ, BK, a->FQ,
                            tg_attn_part_buffers(pr, a->products, TG_ATTN_PASS_FWD));
  tg_attn_dot_begin(ops, a->bf16_dot);
  const int64_t D = pr->D, Dv = pr->Dv, n_units = pr->gqa * a->n_qtiles;
  /* bf16 mode without dropout: the exp rows write P's one part themselves */
  uint16_t *P16 = a->products == TG_PRODUCTS_BF16_DOT &&
                          tg_attn_parts(pr, TG_ATTN_PASS_FWD) == 1 && !pr->drop.threshold
                      ? w.P_parts[0]
                      : NULL;
  /* the item's q units (the last items, the heaviest under causality, first) */
  const int64_t n_items = (n_units + a->FQ - 1) / a->FQ, u0 = (n_items - 1 - x) * a->FQ;
  int64_t n_tiles = 0, key_end = 0;
  for (int64_t u = u0; u < n_units && u < u0 + a->FQ; u++, n_tiles++) {
    fwd_qtile *t = &w.q[n_tiles];
    t->h = h_kv * pr->gqa + u % pr->gqa;
    t->q0 = u / pr->gqa * BQ;
    t->nq = pr->qL - t->q0 < BQ ? pr->qL - t->q0 : BQ;
    t->key_end = tg_attn_key_end(pr, t->q0, t->nq);
    key_end = t->key_end > key_end ? t->key_end : key_end;
    if (!a->bf16_dot) /* (the bf16 dot reads Q's rows in place, or padded) */
      tg_attn_load_rows(ops, pr->in, tg_attn_at(pr->in, a->Q, tg_attn_offset(pr->Qs, b, t->h, 0)),
                        pr->Qs[2], t->q0, t->nq, D, t->Q, NULL, 0);
    else if (a->Kp != D)
      tg_attn_copy_padded((const tg_bf16 *)a->Q + tg_attn_offset(pr->Qs, b, t->h, t->q0),
                          pr->Qs[2], t->nq, D, a->Kp, (tg_bf16 *)(void *)t->Q);
    for (int64_t i = 0; i < t->nq; i++) {
      t->m[i] = -INFINITY;
      t->l[i] = 0.0f;
    }
    memset(t->acc, 0, sizeof(float) * (size_t)(t->nq * Dv));
  }

  const void *Kh = tg_attn_at(pr->in, a->K, tg_attn_offset(pr->Ks, b, h_kv, 0));
  const void *Vh = tg_attn_at(pr->in, a->V, tg_attn_offset(pr->Vs, b, h_kv, 0));
  /* (fwd_q_tiles: several q units only without a window, so every one
   * starts at the same key) */
  for (int64_t k0 = tg_attn_key_begin(pr, w.q[0].q0); k0 < key_end; k0 += BK) {
    const int64_t nk = key_end - k0 < BK ? key_end - k0 : BK;
    const float *V = w.V; /* [nk, Dv] at stride ldv */
    int64_t ldv = Dv;
    if (a->products == TG_PRODUCTS_BF16_DOT) {
      ops->pack_bf16_row_pairs(nk, Dv, (const tg_bf16 *)Vh + k0 * pr->Vs[2], pr->Vs[2],
                               (uint32_t *)w.V, Dv);
    } else if (pr->in == TG_DTYPE_F32) { /* f32 rows in place */
      V = (const float *)Vh + k0 * pr->Vs[2], ldv = pr->Vs[2];
    } else {
      tg_attn_load_rows(ops, pr->in, Vh, pr->Vs[2], k0, nk, Dv, w.V, NULL, 0);
    }
    if (a->bf16_dot) { /* K^T in pairs, zero pairs up to Kp */
      tg_attn_pack_pairs(ops, Kh, pr->Ks[2], k0, nk, D, (uint32_t *)w.KT, BK);
      memset((uint32_t *)w.KT + D / 2 * BK, 0, sizeof(uint32_t) * (size_t)((a->Kp - D) / 2 * BK));
    } else if (pr->in == TG_DTYPE_F32) { /* f32 rows transposed in place */
      ops->transpose_f32(nk, D, (const float *)Kh + k0 * pr->Ks[2], pr->Ks[2], w.KT, BK, 0);
    } else {
      tg_attn_load_rows(ops, pr->in, Kh, pr->Ks[2], k0, nk, D, w.K, w.KT, BK);
    }

    for (int64_t s = 0; s < n_tiles; s++) {
      fwd_qtile *t = &w.q[s];
      if (k0 >= t->key_end) continue; /* (causal: the q-tile sees no key of this tile) */
      const int64_t nq = t->nq, nkt = t->key_end - k0 < nk ? t->key_end - k0 : nk;
      /* on the diagonal, the top rows over their keys alone (the score rows
       * never read the others: they write -inf, then P = 0, there) */
      tg_attn_rows blk[2];
      const int n_blk = tg_attn_row_blocks(pr, t->q0, nq, k0, nkt, blk);
      for (int r = 0; r < n_blk; r++) {
        const int64_t r0 = blk[r].r0, rows = blk[r].rows, keys = blk[r].keys;
        if (keys == 0) continue;
        if (a->bf16_dot) { /* Q's bf16 rows in place, or padded */
          const int padded = a->Kp != D;
          const tg_bf16 *Qr = padded ? (const tg_bf16 *)(const void *)t->Q + r0 * a->Kp
                                     : (const tg_bf16 *)a->Q +
                                           tg_attn_offset(pr->Qs, b, t->h, t->q0 + r0);
          ops->mm_bf16_pairs((int)rows, (int)keys, (int)a->Kp, Qr, padded ? a->Kp : pr->Qs[2],
                             (const uint32_t *)w.KT, BK, w.S + r0 * BK, BK, 0); /* Q.K^T */
        } else {
          ops->mm_nn((int)rows, (int)keys, (int)D, t->Q + r0 * D, D, w.KT, BK, w.S + r0 * BK, BK,
                     0); /* Q.K^T */
        }
      }
      fwd_softmax_tile(a, t, w.S, b, k0, nkt, P16);
      if (pr->drop.threshold) { /* P -> P o keep; l and m keep the dropped weights */
        tg_attn_dropout_tile(ops, &pr->drop, pr, b, t->h, t->q0, nq, k0, nkt, w.keep, BK);
        tg_attn_dropout_apply(w.keep, BK, w.S, BK, nq, nkt, 1.0f);
      }
      if (a->products == TG_PRODUCTS_BF16_DOT) { /* P's bf16 parts, nkt padded to even */
        if (!P16)
          ops->f32_to_bf16_split(nq, nkt, w.S, BK, TG_SPLIT_ROWS, w.P_parts[0], w.P_parts[1],
                                 w.P_parts[2], BK);
        for (int r = 0; r < n_blk; r++) { /* (a block's odd key count: its next P is 0) */
          const int64_t r0 = blk[r].r0, keys = blk[r].keys;
          uint16_t *parts[3];
          tg_attn_parts_at(w.P_parts, r0 * BK, parts);
          if (keys)
            tg_attn_mm_parts(pr, TG_ATTN_PASS_FWD, ops, blk[r].rows, Dv, keys + keys % 2, parts,
                             BK, (const uint32_t *)w.V, Dv, t->acc + r0 * Dv, Dv,
                             1); /* acc += P.V */
        }
        continue;
      }
      if (a->products == TG_PRODUCTS_F32_ROUNDED) tg_attn_round_bf16(w.S, nq, nkt, BK);
      for (int r = 0; r < n_blk; r++)
        if (blk[r].keys)
          ops->mm_nn((int)blk[r].rows, (int)Dv, (int)blk[r].keys, w.S + blk[r].r0 * BK, BK, V, ldv,
                     t->acc + blk[r].r0 * Dv, Dv, 1); /* acc += P.V */
    }
  }
  for (int64_t s = 0; s < n_tiles; s++) fwd_finish(a, &w.q[s], b, w.V); /* (w.V free now) */
  tg_attn_dot_end(ops, a->bf16_dot);
}

/* q units per forward work item: a GQA group's heads (gqa units), at least
 * TG_ATTN_FWD_Q_TILES, or, where Q.K^T runs on the bf16 unit (whose
 * products leave the key tiles' packing a larger share), as many as keep
 * their f32 accumulators within TG_ATTN_FWD_ACC_BYTES if that is more; at
 * most TG_ATTN_FWD_MAX_UNITS, and fewer where fewer leave
 * TG_ATTN_ITEMS_PER_CPU items per thread; 1 with a window (its q-tiles
 * start at different keys). Each unit's sums run in the same order
 * whatever this is (it changes the loads, not the bits), so unlike the
 * backward's plan it may follow the thread count. */
static int64_t fwd_q_tiles(const tg_attn_problem *pr, const tg_isa_ops *ops, int64_t bq,
                           int64_t n_qtiles, int threads) {
  if (pr->window) return 1;
  const int64_t units = pr->gqa * n_qtiles;
  int64_t fq = pr->gqa < TG_ATTN_FWD_Q_TILES ? TG_ATTN_FWD_Q_TILES : pr->gqa;
  if (tg_attn_bf16_dot(pr, ops)) {
    const int64_t fit = TG_ATTN_FWD_ACC_BYTES / (bq * pr->Dv * (int64_t)sizeof(float));
    fq = fit > fq ? fit : fq;
  }
  if (fq > TG_ATTN_FWD_MAX_UNITS) fq = TG_ATTN_FWD_MAX_UNITS;
  for (; fq > 1; fq--)
    if (pr->B * pr->H_kv * ((units + fq - 1) / fq) >= (int64_t)TG_ATTN_ITEMS_PER_CPU * threads)
      break;
  return fq;
}

/* Does the forward take the bf16-mode tiles (ops->attn_bq_bf16, _bk_bf16)?
 * Wherever its P.V runs on the bf16 unit, in every precision mode (the
 * backward: in bf16 mode only, tg_attn_bq): with exact mode's three parts
 * on amx the forward took 0.92-0.96x the time with them (2-core Xeon, 2
 * threads, paired calls, bench/results/xeon2-amx/ab-fwd-tiles-exact.txt). */
static int fwd_bf16_tiles(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  return tg_attn_products_of(pr, ops, TG_ATTN_PASS_FWD) == TG_PRODUCTS_BF16_DOT;
}

/* The forward's q tile: the bf16-mode one where fwd_bf16_tiles says so and
 * no causal diagonal or window edge crosses it (tg_attn_bq's rule). */
static int64_t fwd_q_tile(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  return fwd_bf16_tiles(pr, ops) && !pr->causal && !pr->window ? ops->attn_bq_bf16
                                                                : tg_attn_bq(pr, ops);
}

/* The forward's key tile: the table's (tg_attn_bk; the bf16-mode one where
 * fwd_bf16_tiles says so, but with a window) times as many, up to
 * TG_ATTN_FWD_KEY_TILES, as keep a key tile's K^T and V within
 * TG_ATTN_FWD_TILE_BYTES (f32, or bf16 pairs where the products that take
 * them run on the bf16 unit). Longer key tiles run the online softmax's
 * per-row work (a max, the rescale, each row op's set-up) once per more
 * keys and give P.V a longer k loop. A function of the table, the
 * precision mode and D, Dv only: the tile sets the order of the softmax
 * sums, so O and L are the same bits on any machine with that table. */
static int64_t fwd_key_tile(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  const int64_t bk = fwd_bf16_tiles(pr, ops) && !pr->window ? ops->attn_bk_bf16 : tg_attn_bk(pr, ops);
  const int64_t k_bytes = tg_attn_bf16_dot(pr, ops) ? 2 : 4;
  const int64_t v_bytes = tg_attn_products_of(pr, ops, TG_ATTN_PASS_FWD) == TG_PRODUCTS_BF16_DOT ? 2 : 4;
  const int64_t fit = TG_ATTN_FWD_TILE_BYTES / ((k_bytes * pr->D + v_bytes * pr->Dv) * bk);
  return bk * (fit < 1 ? 1 : fit > TG_ATTN_FWD_KEY_TILES ? TG_ATTN_FWD_KEY_TILES : fit);
}

/* The forward's args for pr on a team of `threads` (the q units per item
 * follow it; the bits do not). */
static fwd_args fwd_make(const tg_ctx *ctx, const tg_attn_problem *pr, int threads) {
  fwd_args a = {.pr = *pr, .ops = ctx->ops, .BQ = fwd_q_tile(pr, ctx->ops),
                .BK = fwd_key_tile(pr, ctx->ops), .bf16_dot = tg_attn_bf16_dot(pr, ctx->ops),
                .Kp = tg_attn_k_padded(pr, ctx->ops, pr->D),
                .products = tg_attn_products_of(pr, ctx->ops, TG_ATTN_PASS_FWD)};
  a.n_qtiles = (pr->qL + a.BQ - 1) / a.BQ;
  a.FQ = fwd_q_tiles(pr, ctx->ops, a.BQ, a.n_qtiles, threads);
  return a;
}

static tg_grid fwd_grid(const fwd_args *a) {
  return (tg_grid){(a->pr.gqa * a->n_qtiles + a->FQ - 1) / a->FQ, a->pr.H_kv, a->pr.B, fwd_group, a};
}

/* Varlen: the same items with the kv head varying fastest (x = kv head,
 * y = item, z = batch), so that tg_dispatch_grids, which hands out every
 * document's items rank by rank, starts every head's heaviest items first. */
static void fwd_group_heads_inner(const void *vargs, int64_t h_kv, int64_t x, int64_t b,
                                  void *scratch) {
  fwd_group(vargs, x, h_kv, b, scratch);
}

static tg_grid varlen_fwd_grid(const fwd_args *a) {
  const tg_grid g = fwd_grid(a);
  return (tg_grid){g.ny, g.nx, g.nz, fwd_group_heads_inner, a};
}

static size_t fwd_args_scratch(const fwd_args *a) {
  return fwd_scratch_bytes(a->pr.D, a->pr.Dv, a->BQ, a->BK, a->FQ,
                           tg_attn_part_buffers(&a->pr, a->products, TG_ATTN_PASS_FWD));
}

tg_status tg_attn_forward(tg_ctx *ctx, const tg_attn_problem *pr, const void *Q,
                          const void *K, const void *V, const void *mask, void *O, float *L,
                          const void *dO, float *delta) {
  fwd_args a = fwd_make(ctx, pr, tg_threads(ctx));
  a.Q = Q, a.K = K, a.V = V, a.dO = dO, a.mask = mask, a.O = O, a.L = L, a.delta = delta;
  const tg_grid g = fwd_grid(&a);
  return tg_dispatch(ctx, g.nx, g.ny, g.nz, fwd_args_scratch(&a), fwd_group, &a);
}

/* TG_ERR_NULL_ARG naming the first of the forward's buffers that is NULL. */
static tg_status need_buffers(tg_ctx *ctx, const char *fn, const void *Q, const void *K,
                              const void *V, const void *O, const float *L) {
  const void *bufs[] = {Q, K, V, O, L};
  const char *names[] = {"Q", "K", "V", "O", "L"};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!bufs[i]) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, names[i]);
  return TG_OK;
}

/* The entry points' shared body; fn names the public function in messages. */
static tg_status train_fwd(tg_ctx *ctx, const char *fn, tg_dtype dtype, const void *Q,
                           const void *K, const void *V, void *O, float *L,
                           const tg_attn_params *p, const tg_attn_mask_params *mp,
                           const void *mask, int causal, const tg_attn_options *opt) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = need_buffers(ctx, fn, Q, K, V, O, L);
  if (st != TG_OK) return st;
  tg_attn_problem pr;
  st = tg_attn_prepare(ctx, fn, dtype, opt, p, mp, mask, causal, &pr);
  if (st != TG_OK) return st;
  st = tg_attn_check_alias_fwd(ctx, fn, &pr, Q, K, V, mask, O, L); /* by pr.in's size */
  if (st != TG_OK) return st;
  return tg_attn_forward(ctx, &pr, Q, K, V, mask, O, L, NULL, NULL);
}

tg_status tg_attn_train_fwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                            const void *V, void *O, float *L, const tg_attn_params *p,
                            const tg_attn_mask_params *mp, const void *mask, int causal,
                            const tg_attn_options *opt) {
  return train_fwd(ctx, "tg_attn_train_fwd", dtype, Q, K, V, O, L, p, mp, mask, causal, opt);
}

tg_status tg_flash_attn_train_fwd_bf16(tg_ctx *ctx, const tg_bf16 *Q, const tg_bf16 *K,
                                       const tg_bf16 *V, tg_bf16 *O, float *L,
                                       const tg_attn_params *p,
                                       const tg_attn_mask_params *mp, const tg_bf16 *mask,
                                       int causal) {
  return train_fwd(ctx, "tg_flash_attn_train_fwd_bf16", TG_DTYPE_BF16, Q, K, V, O, L, p, mp,
                   mask, causal, NULL);
}

/* --- varlen (include/tilegrad.h, "packed sequences") ------------------------ */
tg_status tg_attn_varlen_fwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                             const void *V, void *O, float *L, const tg_attn_params *p,
                             const tg_attn_varlen *docs, int causal,
                             const tg_attn_options *opt) {
  static const char fn[] = "tg_attn_varlen_fwd";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = need_buffers(ctx, fn, Q, K, V, O, L);
  if (st != TG_OK) return st;
  tg_attn_problem pr;
  tg_attn_docs dl;
  st = tg_attn_varlen_prepare(ctx, fn, dtype, opt, p, docs, causal, &pr, &dl);
  if (st != TG_OK) return st;
  const size_t oe = pr.o_f32 || pr.in == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
  const tg_buf outs[] = {tg_attn_buf("O", O, pr.Os, 1, pr.H, pr.qL, pr.Dv, oe, 1),
                         tg_out("L", L, (uint64_t)(pr.H * pr.qL) * sizeof(float))};
  if ((st = tg_attn_check_alias_fwd(ctx, fn, &pr, Q, K, V, NULL, O, L)) ||
      (st = tg_attn_varlen_check_alias(ctx, fn, docs, &pr, &dl, outs, TG_LEN(outs)))) {
    tg_attn_docs_free(&dl);
    return st;
  }
  fwd_args *args = tg_mem_alloc(sizeof(fwd_args) * (size_t)dl.n, 64);
  tg_grid *grids = tg_mem_alloc(sizeof(tg_grid) * (size_t)dl.n, 64);
  if (!args || !grids) {
    st = tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate the plans of %lld documents", fn,
                 (long long)dl.n);
    goto done;
  }
  int64_t n = 0;
  size_t scratch = 0;
  for (int64_t i = 0; i < dl.n; i++) {
    const tg_attn_doc *d = &dl.docs[i];
    if (!d->qL || !d->kL) continue;
    const tg_attn_problem dp = tg_attn_doc_problem(&pr, d);
    fwd_args *a = &args[n];
    *a = fwd_make(ctx, &dp, d->cpus);
    a->Q = tg_attn_at(pr.in, Q, d->q0 * pr.Qs[2]);
    a->K = tg_attn_at(pr.in, K, d->k0 * pr.Ks[2]);
    a->V = tg_attn_at(pr.in, V, d->k0 * pr.Vs[2]);
    a->O = (char *)O + (size_t)(d->q0 * pr.Os[2]) * oe;
    a->L = L + d->q0;
    a->mask = docs->mask ? tg_attn_at(pr.in, docs->mask, d->mask0) : NULL;
    grids[n++] = varlen_fwd_grid(a);
    const size_t b = fwd_args_scratch(a);
    scratch = b > scratch ? b : scratch;
  }
  if ((st = tg_dispatch_grids(ctx, grids, n, scratch)) != TG_OK) goto done;
  /* documents with queries and no keys: O rows 0, L the sink or -inf */
  for (int64_t i = 0; i < dl.n; i++) {
    const tg_attn_doc *d = &dl.docs[i];
    if (!d->qL || d->kL) continue;
    for (int64_t h = 0; h < pr.H; h++)
      for (int64_t r = d->q0; r < d->q0 + d->qL; r++) {
        memset((char *)O + (size_t)tg_attn_offset(pr.Os, 0, h, r) * oe, 0, (size_t)pr.Dv * oe);
        L[h * pr.qL + r] = pr.sinks ? pr.sinks[h] : -INFINITY;
      }
  }
done:
  tg_mem_free(args);
  tg_mem_free(grids);
  tg_attn_docs_free(&dl);
  return st;
}
