/* 10. Causal attention backward (naive, token-major, f32).
 *
 *   Q, grad_out, grad_Q  [seq, n_heads * D]     grad_Q writes
 *   K, V, grad_K, grad_V [seq, n_kv_heads * D]  grad_K, grad_V accumulate
 *
 * Query head h reads kv head g = h / (n_heads / n_kv_heads); scale = 1/sqrt(D);
 * position i attends to keys j = 0..i. The softmax is recomputed from Q, K.
 * For every (i, h), with q = Q[i,h,:], dO = grad_out[i,h,:]:
 *
 *   s[j]  = scale * q . K[j,g,:]                 j = 0..i
 *   P[j]  = exp(s[j] - m) / Z,   m = max_j s[j],  Z = sum_j exp(s[j] - m)
 *   dP[j] = dO . V[j,g,:]
 *   delta = sum_j P[j] * dP[j]
 *   dS[j] = P[j] * (dP[j] - delta)
 *   grad_Q[i,h,:]  = scale * sum_j dS[j] * K[j,g,:]
 *   grad_K[j,g,:] += scale * dS[j] * q          (summed over i >= j and the
 *   grad_V[j,g,:] += P[j] * dO                   query heads sharing g)
 *
 * Metal: one threadgroup per (position i, head h) computes its row of P and
 * dS in threadgroup memory (capped at 2048 positions) and scatters grad_K /
 * grad_V with atomic adds.
 *
 * CPU: two grids, no atomics, no length cap, O(seq) scratch per task.
 *   Pass 1, grid (i, h) -- the Metal grid: recompute the row s, P, dP in
 *     per-thread scratch (2*seq + D floats), write grad_Q[i,h,:] and keep the
 *     row's (m, Z, delta) in a [seq, n_heads] side table.
 *   Pass 2, grid (key block, kv head g): the group owns grad_K/grad_V rows
 *     j0..j1-1 of head g; it walks queries i = j0..seq-1 in order and the heads
 *     h of g in order, recomputes P[i,j] and dS[i,j] exactly as pass 1 did
 *     (same f32 operations, so the same bits), and sums the contributions in
 *     scratch before adding them to grad_K/grad_V once.
 * Every output element is therefore summed in one fixed order whatever the
 * thread count: the result is bitwise identical across runs and thread counts
 * with or without ctx->deterministic, and no atomics are needed. Cost is
 * O(seq^2 * D) per head (s and dP are computed twice).
 */
#include <math.h>
#include <stdlib.h>

#include "engine.h"

enum { CA_KEY_BLOCK = 32 }; /* key rows owned by one pass-2 group */

typedef struct {
  const float *dO, *Q, *K, *V;
  float *dQ, *dK, *dV;
  float *stats; /* [seq, n_heads, 3]: m, Z, delta of each query row */
  int64_t seq, n_heads, n_kv_heads, heads_per_kv, D;
  int64_t ldq, ldk; /* row strides: n_heads*D, n_kv_heads*D */
  float scale;
} ca_args;

/* sum_d a[d]*b[d] in f32, eight partial sums then the tail: one fixed order. */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int k = 0; k < 8; k++) acc[k] += a[d + k] * b[d + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; d < n; d++) s += a[d] * b[d];
  return s;
}

/* y[d] += alpha * x[d] */
static inline void axpy_f32(float *y, float alpha, const float *x, int64_t n) {
  for (int64_t d = 0; d < n; d++) y[d] += alpha * x[d];
}

/* The three row quantities both passes must agree on bit for bit. */
static inline float score(const ca_args *a, const float *q, int64_t j, int64_t g) {
  return dot_f32(q, a->K + j * a->ldk + g * a->D, a->D) * a->scale;
}
static inline float prob(float s, float m, float Z) { return expf(s - m) / Z; }
static inline float dscore(float P, float dP, float delta) { return P * (dP - delta); }

/* Pass 1, group (i, h): row i of head h -> grad_Q[i,h,:] and (m, Z, delta). */
static void attn_bwd_rows(const void *vargs, int64_t i, int64_t h, int64_t z,
                          void *scratch) {
  const ca_args *a = vargs;
  const int64_t D = a->D, g = h / a->heads_per_kv, n = i + 1;
  const float *q = a->Q + i * a->ldq + h * D;
  const float *dO = a->dO + i * a->ldq + h * D;
  float *P = scratch;         /* [n]: s, then P */
  float *dP = P + a->seq;     /* [n] */
  float *acc = dP + a->seq;   /* [D] */

  float m = -INFINITY;
  for (int64_t j = 0; j < n; j++) {
    P[j] = score(a, q, j, g);
    if (P[j] > m) m = P[j];
  }
  float Z = 0.0f;
  for (int64_t j = 0; j < n; j++) Z += expf(P[j] - m);
  for (int64_t j = 0; j < n; j++) P[j] = prob(P[j], m, Z);

  float delta = 0.0f;
  for (int64_t j = 0; j < n; j++) {
    dP[j] = dot_f32(dO, a->V + j * a->ldk + g * D, D);
    delta += P[j] * dP[j];
  }

  /* grad_Q[i,h,:] = scale * sum_j dS[j] * K[j,g,:] */
  for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
  for (int64_t j = 0; j < n; j++)
    axpy_f32(acc, dscore(P[j], dP[j], delta), a->K + j * a->ldk + g * D, D);
  float *dq = a->dQ + i * a->ldq + h * D;
  for (int64_t d = 0; d < D; d++) dq[d] = a->scale * acc[d];

  float *st = a->stats + (i * a->n_heads + h) * 3;
  st[0] = m;
  st[1] = Z;
  st[2] = delta;
}

/* Pass 2, group (kb, g): grad_K/grad_V rows j0..j1-1 of kv head g. */
static void attn_bwd_keys(const void *vargs, int64_t kb, int64_t g, int64_t z,
                          void *scratch) {
  const ca_args *a = vargs;
  const int64_t D = a->D;
  const int64_t j0 = kb * CA_KEY_BLOCK;
  const int64_t j1 = j0 + CA_KEY_BLOCK < a->seq ? j0 + CA_KEY_BLOCK : a->seq;
  float *dk = scratch;                 /* [j1-j0, D] */
  float *dv = dk + CA_KEY_BLOCK * D;   /* [j1-j0, D] */
  for (int64_t e = 0; e < (j1 - j0) * D; e++) dk[e] = dv[e] = 0.0f;

  for (int64_t i = j0; i < a->seq; i++) {
    const int64_t jend = i + 1 < j1 ? i + 1 : j1; /* causal: j <= i */
    for (int64_t h = g * a->heads_per_kv; h < (g + 1) * a->heads_per_kv; h++) {
      const float *q = a->Q + i * a->ldq + h * D;
      const float *dO = a->dO + i * a->ldq + h * D;
      const float *st = a->stats + (i * a->n_heads + h) * 3;
      for (int64_t j = j0; j < jend; j++) {
        const float P = prob(score(a, q, j, g), st[0], st[1]);
        const float dP = dot_f32(dO, a->V + j * a->ldk + g * D, D);
        const float dS = dscore(P, dP, st[2]);
        axpy_f32(dk + (j - j0) * D, a->scale * dS, q, D); /* scale*dS[i,j]*q */
        axpy_f32(dv + (j - j0) * D, P, dO, D);            /* P[i,j]*dO */
      }
    }
  }
  for (int64_t j = j0; j < j1; j++) {
    tg_add_f32(a->dK + j * a->ldk + g * D, dk + (j - j0) * D, D, 0);
    tg_add_f32(a->dV + j * a->ldk + g * D, dv + (j - j0) * D, D, 0);
  }
}

tg_status tg_causal_attention_backward(tg_ctx *ctx, const float *grad_out, const float *Q,
                                       const float *K, const float *V, float *grad_Q,
                                       float *grad_K, float *grad_V, uint32_t seq_len,
                                       uint32_t n_heads, uint32_t n_kv_heads,
                                       uint32_t head_dim) {
  if (!ctx) return TG_ERR_NULL_ARG;
  tg_begin(ctx);
  static const char fn[] = "tg_causal_attention_backward";
  const struct { const void *p; const char *name; } ptrs[] = {
      {grad_out, "grad_out"}, {Q, "Q"},           {K, "K"},          {V, "V"},
      {grad_Q, "grad_Q"},     {grad_K, "grad_K"}, {grad_V, "grad_V"}};
  for (size_t k = 0; k < sizeof ptrs / sizeof ptrs[0]; k++)
    if (!ptrs[k].p) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, ptrs[k].name);
  const struct { uint32_t v; const char *name; } dims[] = {
      {seq_len, "seq_len"}, {n_heads, "n_heads"}, {n_kv_heads, "n_kv_heads"},
      {head_dim, "head_dim"}};
  for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++)
    if (dims[k].v == 0)
      return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: %s is 0; it must be >= 1", fn, dims[k].name);
  if (n_heads % n_kv_heads != 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE,
                   "%s: n_heads = %u is not a multiple of n_kv_heads = %u", fn, n_heads,
                   n_kv_heads);
  tg_status st;
  if ((st = tg_shape_count(ctx, "tg_causal_attention_backward: Q [seq_len, n_heads*head_dim]",
                           sizeof(float), NULL, 3, (int64_t)seq_len, (int64_t)n_heads,
                           (int64_t)head_dim)))
    return st;
  /* n_kv_heads <= n_heads, so K/V fit whenever Q does. The side table of row
   * statistics is [seq, n_heads, 3] floats. */
  int64_t n_stats;
  if ((st = tg_shape_count(ctx, "tg_causal_attention_backward: row statistics [seq_len, n_heads, 3]",
                           sizeof(float), &n_stats, 3, (int64_t)seq_len, (int64_t)n_heads,
                           (int64_t)3)))
    return st;
  /* Per-thread scratch: pass 1 needs 2*seq + D floats, pass 2 2*KEY_BLOCK*D.
   * Both passes reserve the larger, so pass 2 never allocates (and so cannot
   * fail after pass 1 has written grad_Q). */
  const size_t s1 = (2 * (size_t)seq_len + head_dim) * sizeof(float);
  const size_t s2 = 2 * (size_t)CA_KEY_BLOCK * head_dim * sizeof(float);
  const size_t scratch = s1 > s2 ? s1 : s2;

  float *stats = malloc((size_t)n_stats * sizeof(float));
  if (!stats)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate %lld bytes of row statistics",
                   fn, (long long)n_stats * (long long)sizeof(float));
  const ca_args a = {
      .dO = grad_out, .Q = Q, .K = K, .V = V, .dQ = grad_Q, .dK = grad_K, .dV = grad_V,
      .stats = stats, .seq = seq_len, .n_heads = n_heads, .n_kv_heads = n_kv_heads,
      .heads_per_kv = n_heads / n_kv_heads, .D = head_dim,
      .ldq = (int64_t)n_heads * head_dim, .ldk = (int64_t)n_kv_heads * head_dim,
      .scale = (float)(1.0 / sqrt((double)head_dim))};
  st = tg_dispatch(ctx, seq_len, n_heads, 1, scratch, attn_bwd_rows, &a);
  if (st == TG_OK) {
    const int64_t n_key_blocks = ((int64_t)seq_len + CA_KEY_BLOCK - 1) / CA_KEY_BLOCK;
    st = tg_dispatch(ctx, n_key_blocks, n_kv_heads, 1, scratch, attn_bwd_keys, &a);
  }
  free(stats);
  return st;
}
