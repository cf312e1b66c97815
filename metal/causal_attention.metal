// causal_attention.metal -- naive causal attention backward (tilegrad kernel
// 10), token-major f32, GQA.
//
// Layout: Q, grad_out, grad_Q [seq, n_heads * D]; K, V, grad_K, grad_V
// [seq, n_kv_heads * D]; head h reads kv head g = h / (n_heads / n_kv_heads);
// scale = 1/sqrt(D); position i attends to keys j = 0..i. For every (i, h):
//   s[j]  = scale * Q[i,h].K[j,g]          P = softmax(s)   (recomputed, no L)
//   dP[j] = grad_out[i,h].V[j,g]           delta = sum_j P[j] dP[j]
//   dS[j] = P[j] (dP[j] - delta)
//   grad_Q[i,h]  = scale * sum_j dS[j] K[j,g]      (writes)
//   grad_K[j,g] += scale * dS[j] Q[i,h]            (atomic f32)
//   grad_V[j,g] += P[j] grad_out[i,h]              (atomic f32)
//
// Host name causal_attention_backward.
//   buffer(0) grad_out  buffer(1) Q  buffer(2) K  buffer(3) V
//   buffer(4) grad_Q (writes)  buffer(5) grad_K  buffer(6) grad_V (accumulate)
//   buffer(7) params uint[4] = {seq_len, n_heads, n_kv_heads, head_dim}
// Grid: threadgroups (seq_len, n_heads, 1); threadgroup a multiple of 32
// threads (128 is a good choice), with head_dim <= 8 * threadgroup size.
//
// tilegrad's fix over the seed: no 2048-token limit. The seed kept a whole
// row of P and dS in threadgroup memory; here the keys stream through in
// chunks of CH: pass 1 keeps an online (max, sum) of the scores, pass 2
// accumulates delta, pass 3 forms dS and the gradients. Scores are recomputed
// in each pass (one simd_sum per key), so threadgroup memory is fixed
// (2 * CH + 32 floats) whatever seq_len is.
#include <metal_stdlib>
using namespace metal;

constant constexpr uint CH = 256;        // keys per chunk
constant constexpr uint MAX_DPT = 8;     // head dims per thread (D <= 8 * tg_size)

static inline float tg_reduce_sum(float v, threadgroup float *scratch, uint tid, uint tg_size) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid % 32 == 0) scratch[tid / 32] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_sum(tid % 32 < (tg_size + 31) / 32 ? scratch[tid % 32] : 0.0f);
}
static inline float tg_reduce_max(float v, threadgroup float *scratch, uint tid, uint tg_size) {
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid % 32 == 0) scratch[tid / 32] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_max(tid % 32 < (tg_size + 31) / 32 ? scratch[tid % 32] : -INFINITY);
}

kernel void causal_attention_backward(
    const device float  *grad_out [[buffer(0)]],
    const device float  *Q        [[buffer(1)]],
    const device float  *K        [[buffer(2)]],
    const device float  *V        [[buffer(3)]],
    device float        *grad_Q   [[buffer(4)]],
    device atomic_float *grad_K   [[buffer(5)]],
    device atomic_float *grad_V   [[buffer(6)]],
    const device uint   *params   [[buffer(7)]],
    uint2 tg      [[threadgroup_position_in_grid]],
    uint  tid     [[thread_index_in_threadgroup]],
    uint  lane    [[thread_index_in_simdgroup]],
    uint  sg      [[simdgroup_index_in_threadgroup]],
    uint  tg_size [[threads_per_threadgroup]]) {
  const uint seq = params[0], n_heads = params[1], n_kv = params[2], D = params[3];
  const uint pos = tg.x, h = tg.y;
  threadgroup float s_c[CH];      // scores of the chunk, then P
  threadgroup float dp_c[CH];     // dP of the chunk, then dS
  threadgroup float scratch[32];  // cross-simdgroup reductions
  if (pos >= seq || h >= n_heads) return;  // uniform

  const uint g = h / (n_heads / n_kv);
  const ulong ldq = (ulong)n_heads * D, ldk = (ulong)n_kv * D;
  const device float *q = Q + pos * ldq + h * D;
  const device float *go = grad_out + pos * ldq + h * D;
  const float scale = precise::divide(1.0f, precise::sqrt(float(D)));
  const uint n = pos + 1;  // visible keys 0..pos
  const uint n_sg = tg_size / 32;

  // Scores (and optionally dP) of keys c0 .. c0+len-1 into s_c / dp_c:
  // simdgroup sg takes keys sg, sg + n_sg, ...; its lanes split the head dim.
#define TG_CHUNK_SCORES(WITH_DP)                                                \
  for (uint jj = sg; jj < len; jj += n_sg) {                                    \
    const device float *kr = K + (c0 + jj) * ldk + g * D;                       \
    const device float *vr = V + (c0 + jj) * ldk + g * D;                       \
    float2 acc = float2(0.0f);                                                  \
    for (uint d = lane; d < D; d += 32) {                                       \
      acc.x += q[d] * kr[d];                                                    \
      if (WITH_DP) acc.y += go[d] * vr[d];                                      \
    }                                                                           \
    acc = simd_sum(acc);                                                        \
    if (lane == 0) { s_c[jj] = acc.x * scale; dp_c[jj] = acc.y; }               \
  }                                                                             \
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // pass 1: m = max_j s[j], Z = sum_j exp(s[j] - m), online over chunks
  float m = -INFINITY, Z = 0.0f;
  for (uint c0 = 0; c0 < n; c0 += CH) {
    const uint len = min(CH, n - c0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    TG_CHUNK_SCORES(false)
    float mx = -INFINITY;
    for (uint jj = tid; jj < len; jj += tg_size) mx = fmax(mx, s_c[jj]);
    const float m_new = fmax(m, tg_reduce_max(mx, scratch, tid, tg_size));
    float z = 0.0f;
    for (uint jj = tid; jj < len; jj += tg_size) z += exp(s_c[jj] - m_new);
    Z = Z * exp(m - m_new) + tg_reduce_sum(z, scratch, tid, tg_size);  // exp(-inf) = 0 at first
    m = m_new;
  }

  // pass 2: delta = sum_j P[j] dP[j]
  float delta_part = 0.0f;
  for (uint c0 = 0; c0 < n; c0 += CH) {
    const uint len = min(CH, n - c0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    TG_CHUNK_SCORES(true)
    for (uint jj = tid; jj < len; jj += tg_size) delta_part += exp(s_c[jj] - m) / Z * dp_c[jj];
  }
  const float delta = tg_reduce_sum(delta_part, scratch, tid, tg_size);

  // pass 3: dS, grad_Q (registers), grad_K / grad_V (atomics)
  float dq[MAX_DPT];
  for (uint t = 0; t < MAX_DPT; t++) dq[t] = 0.0f;
  for (uint c0 = 0; c0 < n; c0 += CH) {
    const uint len = min(CH, n - c0);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    TG_CHUNK_SCORES(true)
    for (uint jj = tid; jj < len; jj += tg_size) {
      const float P = exp(s_c[jj] - m) / Z;
      dp_c[jj] = P * (dp_c[jj] - delta);  // dS
      s_c[jj] = P;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint d = tid, t = 0; d < D; d += tg_size, t++)
      for (uint jj = 0; jj < len; jj++) dq[t] += dp_c[jj] * K[(c0 + jj) * ldk + g * D + d];
    for (uint e = tid; e < len * D; e += tg_size) {
      const uint jj = e / D, d = e % D;
      const ulong o = (c0 + jj) * ldk + g * D + d;
      atomic_fetch_add_explicit(&grad_K[o], scale * dp_c[jj] * q[d], memory_order_relaxed);
      atomic_fetch_add_explicit(&grad_V[o], s_c[jj] * go[d], memory_order_relaxed);
    }
  }
#undef TG_CHUNK_SCORES
  for (uint d = tid, t = 0; d < D; d += tg_size, t++) grad_Q[pos * ldq + h * D + d] = scale * dq[t];
}
