/* 10. Causal attention backward (token-major, f32), on the FA-2 engine.
 *
 *   Q, grad_out, grad_Q  [seq, n_heads * D]     grad_Q writes
 *   K, V, grad_K, grad_V [seq, n_kv_heads * D]  grad_K, grad_V accumulate
 *
 * Query head h reads kv head g = h / (n_heads / n_kv_heads); scale = 1/sqrt(D);
 * position i attends to keys j = 0..i. The softmax is recomputed from Q, K.
 * For every (i, h), with q = Q[i,h,:], dO = grad_out[i,h,:]:
 *
 *   s[j]  = scale * q . K[j,g,:]                 j = 0..i
 *   P[j]  = exp(s[j] - L),  L = log sum_j exp(s[j])   (the logsumexp)
 *   O     = sum_j P[j] V[j,g,:],  delta = dO . O      (= sum_j P[j] dP[j])
 *   dP[j] = dO . V[j,g,:],  dS[j] = P[j] * (dP[j] - delta)
 *   grad_Q[i,h,:]  = scale * sum_j dS[j] * K[j,g,:]
 *   grad_K[j,g,:] += scale * dS[j] * q          (summed over i >= j and the
 *   grad_V[j,g,:] += P[j] * dO                   query heads sharing g)
 *
 * Metal: one threadgroup per (position i, head h) computes its row of P and
 * dS in threadgroup memory (capped at 2048 positions) and scatters grad_K /
 * grad_V with atomic adds.
 *
 * CPU: the FlashAttention-2 engine of kernels 1-2 (kernels/attention.h) on
 * f32 inputs. Token-major is the engine's strided layout with B = 1, head
 * stride D and row stride n_heads * D (n_kv_heads * D for K, V and their
 * gradients). Two passes, no length cap:
 *   1. the training forward's tile loop (Q.K^T, online max / sum, P.V) gives
 *      each row's L and, in its epilogue, delta = dO . O with O in f32 (O
 *      itself is never stored);
 *   2. the FA-2 backward's KV schedule with those L and delta: five tile
 *      GEMMs per (q-tile, key-tile) pair, dK/dV of a key tile summed in
 *      scratch and added once, dQ summed over key ranges in range order.
 * Both passes fix every sum's order by the shape alone: the result is
 * bitwise identical across runs and thread counts, without atomics.
 * L and delta ([n_heads, seq] each) and the dQ partials live in the
 * context's workspace, reserved before anything is written.
 */
#include <math.h>

#include "attention.h"

tg_status tg_causal_attention_backward(tg_ctx *ctx, const float *grad_out, const float *Q,
                                       const float *K, const float *V, float *grad_Q,
                                       float *grad_K, float *grad_V, uint32_t seq_len,
                                       uint32_t n_heads, uint32_t n_kv_heads,
                                       uint32_t head_dim) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
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
  /* n_kv_heads <= n_heads, so K/V fit whenever Q does. The row statistics
   * L and delta are [2, n_heads, seq] floats. */
  int64_t n_stats;
  if ((st = tg_shape_count(ctx, "tg_causal_attention_backward: row statistics [2, n_heads, seq_len]",
                           sizeof(float), &n_stats, 3, (int64_t)2, (int64_t)n_heads,
                           (int64_t)seq_len)))
    return st;
  /* No output may overlap an input or another output (the backward reads
   * Q, K, V and grad_out while it writes the gradients, in any order). */
  const uint64_t q_bytes = (uint64_t)seq_len * n_heads * head_dim * sizeof(float);
  const uint64_t kv_bytes = (uint64_t)seq_len * n_kv_heads * head_dim * sizeof(float);
  const tg_buf bufs[] = {tg_in("grad_out", grad_out, q_bytes), tg_in("Q", Q, q_bytes),
                         tg_in("K", K, kv_bytes),              tg_in("V", V, kv_bytes),
                         tg_out("grad_Q", grad_Q, q_bytes),    tg_out("grad_K", grad_K, kv_bytes),
                         tg_out("grad_V", grad_V, kv_bytes)};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;

  const int64_t S = seq_len, H = n_heads, H_kv = n_kv_heads, D = head_dim;
  const int64_t q_strides[3] = {0, D, H * D}, kv_strides[3] = {0, D, H_kv * D};
  const tg_attn_problem pr = {
      .B = 1, .H = H, .H_kv = H_kv, .gqa = H / H_kv, .qL = S, .kL = S, .D = D, .Dv = D,
      .qL_off = 0, .scale = (float)(1.0 / sqrt((double)D)), .softcap = 0.0f,
      .Qs = q_strides, .Ks = kv_strides, .Vs = kv_strides, .Os = q_strides, .Ms = NULL,
      .causal = 1, .in = TG_DTYPE_F32,
      .dQs = {0, D, H * D}, .dKs = {0, D, H_kv * D}, .dVs = {0, D, H_kv * D},
      .Ls = {H * S, S}};

  /* Workspace: L, delta, then the backward's dQ partials. Both terms are
   * below 2^63 bytes (the checks above, and the partials' 1 GiB cap). */
  const size_t stats_bytes = tg_align64((size_t)n_stats * sizeof(float));
  const tg_attn_bwd_plan plan = tg_attn_bwd_plan_make(&pr, ctx->ops, tg_ctx_plan_cpus(ctx));
  const size_t part_bytes = tg_attn_bwd_workspace_bytes(&plan);
  void *ws;
  if ((st = tg_workspace(ctx, stats_bytes + part_bytes, &ws))) return st;
  float *L = ws, *delta = L + H * S;
  void *partials = part_bytes ? (char *)ws + stats_bytes : NULL;

  /* Pass 1 writes only the workspace; pass 2 writes the outputs. */
  st = tg_attn_forward(ctx, &pr, Q, K, V, NULL, NULL, L, grad_out, delta);
  if (st == TG_OK)
    st = tg_attn_backward_kv(ctx, &pr, &plan, Q, K, V, grad_out, NULL, L, delta, grad_Q,
                             grad_K, grad_V, partials);
  return st;
}
