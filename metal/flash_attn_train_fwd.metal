// flash_attn_train_fwd.metal -- FlashAttention-2 training forward, bf16:
// O = softmax(S) . V and the natural-log logsumexp L that the backward reads.
//
// Host names: flash_attn_train_fwd_bf16_d64, flash_attn_train_fwd_bf16_d256.
// S is exactly the backward's (flash_attn_train_bwd.metal, tilegrad's
// kernels/attention.h): scale, softcapping, causal with qL_off, additive mask.
// A row that sees no key gets O = 0 and L = -inf.
//
// Buffers (the backward's numbering; the forward's own outputs take the
// slots the backward leaves free):
//   Q(0), K(1), V(2)  bf16 through Q_/K_/V_strides (K, V: [B, H_kv, kL, D])
//   O(3)              bf16 [B, H, qL, D] through O_strides (writes)
//   L(4)              f32 [B, H, qL] (writes)
//   params(10) AttnParams; mask_params(11), mask(12) when has_mask.
// Function constants 200 align_Q, 201 align_K, 300 has_mask, 301 do_causal.
// Grid: threadgroups (NQ, H, B); threadgroup 128 threads (4 simdgroups).
//
// Simdgroup s owns rows q0 + 8s .. +7 of the 32-row tile, lane l the head dims
// l, l+32, ...; per key tile of 16 the threadgroup stages K and V in
// threadgroup memory, each row's 16 scores come from simd_sum, and the row
// keeps an online softmax (running max m, sum l, f32 accumulator rescaled by
// exp(m_old - m_new)) in registers.
#include <metal_stdlib>
using namespace metal;

struct AttnParams {
  int B, H, D, qL, kL, gqa_factor;  // H = query heads; H_kv = H / gqa_factor
  float scale, softcapping;         // softcapping 1.0 = off
  int NQ, NK, NQ_aligned, NK_aligned, qL_rem, kL_rem, qL_off, _pad;
  long Q_strides[3], K_strides[3], V_strides[3], O_strides[3];  // batch, head, row
};
struct AttnMaskParams {
  long M_strides[3];  // batch, head, row; 0 = broadcast
};
static_assert(sizeof(AttnParams) == 160, "AttnParams is 160 bytes");
static_assert(__builtin_offsetof(AttnParams, scale) == 24, "AttnParams.scale");
static_assert(__builtin_offsetof(AttnParams, NQ) == 32, "AttnParams.NQ");
static_assert(__builtin_offsetof(AttnParams, qL_off) == 56, "AttnParams.qL_off");
static_assert(__builtin_offsetof(AttnParams, Q_strides) == 64, "AttnParams.Q_strides");
static_assert(__builtin_offsetof(AttnParams, K_strides) == 88, "AttnParams.K_strides");
static_assert(__builtin_offsetof(AttnParams, V_strides) == 112, "AttnParams.V_strides");
static_assert(__builtin_offsetof(AttnParams, O_strides) == 136, "AttnParams.O_strides");
static_assert(sizeof(AttnMaskParams) == 24, "AttnMaskParams is 24 bytes");

constant bool align_Q [[function_constant(200)]];
constant bool align_K [[function_constant(201)]];
constant bool has_mask [[function_constant(300)]];
constant bool do_causal [[function_constant(301)]];

static inline float bf16_to_float(ushort h) { return as_type<float>(uint(h) << 16); }
static inline ushort float_to_bf16(float x) {  // RNE; NaN -> 0x7FC0
  uint u = as_type<uint>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ushort(0x7FC0);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return ushort(u >> 16);
}

constant constexpr int BQ = 32;
constant constexpr int BK = 16;
constant constexpr int N_SG = 4;
constant constexpr int ROWS = BQ / N_SG;
constant constexpr int N_THREADS = N_SG * 32;

static inline float attn_score(float qk, const constant AttnParams &p, int i, int k,
                               bool masked, float m) {
  float s = p.scale * qk;
  if (p.softcapping != 1.0f) s = p.softcapping * precise::tanh(s / p.softcapping);
  if (do_causal && k > i + p.qL_off) return -INFINITY;
  if (masked) {
    if (m == -INFINITY) return -INFINITY;
    s += m;
  }
  return s;
}

template <int BD>
static inline void attn_fwd_body(
    const device ushort *Q, const device ushort *K, const device ushort *V,
    device ushort *O, device float *L, const constant AttnParams &p,
    const constant AttnMaskParams *mp, const device ushort *mask, uint3 tgid, uint tid,
    uint lane, uint sg, threadgroup ushort *K_s, threadgroup ushort *V_s) {
  constexpr int DPL = BD / 32;
  const int qb = int(tgid.x), h = int(tgid.y), b = int(tgid.z);
  const int h_kv = h / p.gqa_factor;
  const int q0 = qb * BQ;
  const int nq = (!align_Q && qb == p.NQ_aligned) ? p.qL_rem : BQ;
  int key_end = p.kL;
  if (do_causal) key_end = clamp(q0 + nq + p.qL_off, 0, p.kL);
  const int n_ktiles = (key_end + BK - 1) / BK;

  const device ushort *Qh = Q + b * p.Q_strides[0] + h * p.Q_strides[1];
  const device ushort *Kh = K + b * p.K_strides[0] + h_kv * p.K_strides[1];
  const device ushort *Vh = V + b * p.V_strides[0] + h_kv * p.V_strides[1];

  float o[ROWS][DPL];                // unnormalised output, this lane's dims
  float m_run[ROWS], l_run[ROWS];    // running max and sum (same in every lane)
  for (int r = 0; r < ROWS; r++) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.0f;
    for (int j = 0; j < DPL; j++) o[r][j] = 0.0f;
  }

  for (int kt = 0; kt < n_ktiles; kt++) {
    const int k0 = kt * BK;
    const int nk = (!align_K && kt == p.NK_aligned) ? p.kL_rem : BK;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = int(tid); e < BK * BD; e += N_THREADS) {
      const int kr = e / BD, d = e % BD;
      K_s[e] = kr < nk ? Kh[(k0 + kr) * p.K_strides[2] + d] : ushort(0);
      V_s[e] = kr < nk ? Vh[(k0 + kr) * p.V_strides[2] + d] : ushort(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (int r = 0; r < ROWS; r++) {
      const int il = int(sg) * ROWS + r;
      if (il >= nq) continue;  // uniform per simdgroup
      const int i = q0 + il;
      float q[DPL];
      for (int j = 0; j < DPL; j++) q[j] = bf16_to_float(Qh[i * p.Q_strides[2] + int(lane) + 32 * j]);
      const device ushort *mrow = has_mask ? mask + b * mp->M_strides[0] + h * mp->M_strides[1] +
                                                 i * mp->M_strides[2]
                                           : nullptr;
      float s[BK];
      float m_new = m_run[r];
      for (int k = 0; k < BK; k++) {
        float acc = 0.0f;
        for (int j = 0; j < DPL; j++) acc += q[j] * bf16_to_float(K_s[k * BD + int(lane) + 32 * j]);
        acc = simd_sum(acc);
        s[k] = k < nk ? attn_score(acc, p, i, k0 + k, has_mask,
                                   has_mask ? bf16_to_float(mrow[k0 + k]) : 0.0f)
                      : -INFINITY;
        m_new = fmax(m_new, s[k]);
      }
      if (m_new == -INFINITY) continue;  // nothing visible yet: state unchanged
      const float alpha = m_run[r] == -INFINITY ? 0.0f : exp(m_run[r] - m_new);
      float sum = 0.0f;
      for (int k = 0; k < BK; k++) {
        s[k] = exp(s[k] - m_new);  // P, 0 for masked keys
        sum += s[k];
      }
      l_run[r] = alpha * l_run[r] + sum;
      m_run[r] = m_new;
      for (int j = 0; j < DPL; j++) {
        float acc = o[r][j] * alpha;
        for (int k = 0; k < BK; k++) acc += s[k] * bf16_to_float(V_s[k * BD + int(lane) + 32 * j]);
        o[r][j] = acc;
      }
    }
  }

  for (int r = 0; r < ROWS; r++) {
    const int il = int(sg) * ROWS + r;
    if (il >= nq) continue;
    const int i = q0 + il;
    const float l = l_run[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    device ushort *Orow = O + b * p.O_strides[0] + h * p.O_strides[1] + i * p.O_strides[2];
    for (int j = 0; j < DPL; j++) Orow[int(lane) + 32 * j] = float_to_bf16(o[r][j] * inv);
    if (lane == 0) L[((ulong)b * p.H + h) * p.qL + i] = l > 0.0f ? m_run[r] + log(l) : -INFINITY;
  }
}

#define TG_ATTN_FWD_KERNEL(NAME, BD)                                                       \
  kernel void NAME(                                                                        \
      const device ushort *Q             [[buffer(0)]],                                    \
      const device ushort *K             [[buffer(1)]],                                    \
      const device ushort *V             [[buffer(2)]],                                    \
      device ushort       *O             [[buffer(3)]],                                    \
      device float        *L             [[buffer(4)]],                                    \
      const constant AttnParams *params  [[buffer(10)]],                                   \
      const constant AttnMaskParams *mp  [[buffer(11), function_constant(has_mask)]],      \
      const device ushort *mask          [[buffer(12), function_constant(has_mask)]],      \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint  tid  [[thread_index_in_threadgroup]],                                          \
      uint  lane [[thread_index_in_simdgroup]],                                            \
      uint  sg   [[simdgroup_index_in_threadgroup]]) {                                     \
    threadgroup ushort K_s[BK * BD];                                                       \
    threadgroup ushort V_s[BK * BD];                                                       \
    attn_fwd_body<BD>(Q, K, V, O, L, *params, mp, mask, tgid, tid, lane, sg, K_s, V_s);   \
  }

TG_ATTN_FWD_KERNEL(flash_attn_train_fwd_bf16_d64, 64)
TG_ATTN_FWD_KERNEL(flash_attn_train_fwd_bf16_d256, 256)
