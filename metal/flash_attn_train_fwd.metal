// flash_attn_train_fwd.metal -- FlashAttention-2 training forward, bf16:
// O = softmax(S) . V and the natural-log logsumexp L that the backward reads.
//
// Host names: flash_attn_train_fwd_bf16_d64, flash_attn_train_fwd_bf16_d256
// (head dim D = value head dim Dv), flash_attn_train_fwd_bf16_d192_dv128
// (D = 192, Dv = 128: MLA); attn_varlen_fwd_bf16_d64, _d256: packed
// documents (tg_attn_varlen_fwd; at the end of this file).
// S is exactly the backward's (flash_attn_train_bwd.metal, tilegrad's
// kernels/attention.h): scale, softcapping, causal with qL_off, sliding
// window, additive mask. With a sink s_h per query head,
//   L_i = log(sum_k e^{S_ik} + e^{s_h}),  O_i = sum_k e^{S_ik - L_i} V_k
// (the sink has no value). A row that sees no key gets O = 0 and L = s_h
// (-inf without a sink); s_h = -inf is no sink; a NaN or +inf sink makes its
// head's O and L NaN.
//
// Buffers (the backward's numbering; the forward's own outputs take the
// slots the backward leaves free):
//   Q(0), K(1)        bf16 through Q_/K_strides (K: [B, H_kv, kL, D])
//   V(2)              bf16 [B, H_kv, kL, Dv] through V_strides
//   O(3)              bf16 [B, H, qL, Dv] through O_strides (writes)
//   L(4)              f32 [B, H, qL] (writes)
//   params(10) AttnParams; mask_params(11), mask(12) when has_mask;
//   variant_params(13) AttnVariantParams when has_variant_params;
//   sinks(14) f32 [H] when has_sinks.
// Function constants 200 align_Q, 201 align_K, 300 has_mask, 301 do_causal;
// optional (unset = false, so hosts written before them keep working):
// 302 has_variant_params, 303 has_sinks.
// Grid: threadgroups (NQ, H, B); threadgroup 128 threads (4 simdgroups).
//
// Simdgroup s owns rows q0 + 8s .. +7 of the 32-row tile, lane l the head dims
// l, l+32, ...; per key tile of 16 the threadgroup stages K and V in
// threadgroup memory, each row's 16 scores come from simd_sum, and the row
// keeps an online softmax (running max m, sum l, f32 accumulator rescaled by
// exp(m_old - m_new)) in registers. Only the key tiles that the tile's rows
// can see (causal limit, window) are visited.
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
// tilegrad's tg_attn_options.window / .v_head_dim (8 bytes: window at 0,
// v_head_dim at 4).
struct AttnVariantParams {
  uint window;      // W >= 1: key k visible to query i iff k > i + qL_off - W; 0 = none
  uint v_head_dim;  // Dv; 0 = D. Must be the kernel's Dv (else O, L are NaN)
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
static_assert(sizeof(AttnVariantParams) == 8, "AttnVariantParams is 8 bytes");
static_assert(__builtin_offsetof(AttnVariantParams, v_head_dim) == 4, "AttnVariantParams.v_head_dim");

constant bool align_Q [[function_constant(200)]];
constant bool align_K [[function_constant(201)]];
constant bool has_mask [[function_constant(300)]];
constant bool do_causal [[function_constant(301)]];
// Optional: a pipeline built without them (hosts older than the variants)
// sees false.
constant bool has_variant_params_fc [[function_constant(302)]];
constant bool has_sinks_fc [[function_constant(303)]];
constant bool has_variant_params = is_function_constant_defined(has_variant_params_fc) && has_variant_params_fc;
constant bool has_sinks = is_function_constant_defined(has_sinks_fc) && has_sinks_fc;

static inline float bf16_to_float(ushort h) { return as_type<float>(uint(h) << 16); }
static inline ushort float_to_bf16(float x) {  // RNE; NaN -> 0x7FC0
  uint u = as_type<uint>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ushort(0x7FC0);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return ushort(u >> 16);
}
// NaN or +inf, from the bits (fast math may fold isnan/isinf away).
static inline bool is_nan_or_pos_inf(float x) {
  const uint u = as_type<uint>(x);
  return (u & 0x7FFFFFFFu) >= 0x7F800000u && u != 0xFF800000u;
}

constant constexpr int BQ = 32;
constant constexpr int BK = 16;
constant constexpr int N_SG = 4;
constant constexpr int ROWS = BQ / N_SG;
constant constexpr int N_THREADS = N_SG * 32;

// Keys k <= lo_key are outside the window: lo_key = i + qL_off - W (64-bit,
// so any W fits), -1 without a window.
static inline float attn_score(float qk, const thread AttnParams &p, int i, int k, long lo_key,
                               bool masked, float m) {
  float s = p.scale * qk;
  if (p.softcapping != 1.0f) s = p.softcapping * precise::tanh(s / p.softcapping);
  if (do_causal && k > i + p.qL_off) return -INFINITY;
  if (long(k) <= lo_key) return -INFINITY;
  if (masked) {
    if (m == -INFINITY) return -INFINITY;
    s += m;
  }
  return s;
}

template <int BD, int BDV>
static inline void attn_fwd_body(
    const device ushort *Q, const device ushort *K, const device ushort *V,
    device ushort *O, device float *L, const thread AttnParams &p, long L_batch, long L_head,
    const constant AttnMaskParams *mp, const device ushort *mask,
    const constant AttnVariantParams *vp, const device float *sinks, uint3 tgid, uint tid,
    uint lane, uint sg, threadgroup ushort *K_s, threadgroup ushort *V_s) {
  static_assert(BD % 32 == 0 && BDV % 32 == 0, "head dims are multiples of 32 (lane layout)");
  constexpr int DPL = BD / 32, DPLV = BDV / 32, BDM = BD > BDV ? BD : BDV;
  const int qb = int(tgid.x), h = int(tgid.y), b = int(tgid.z);
  const int h_kv = h / p.gqa_factor;
  const int q0 = qb * BQ;
  const int nq = (!align_Q && qb == p.NQ_aligned) ? p.qL_rem : BQ;
  const uint window = has_variant_params ? vp->window : 0u;
  const uint dv = has_variant_params && vp->v_head_dim != 0u ? vp->v_head_dim : uint(p.D);

  if (p.D != BD || dv != uint(BDV)) {  // wrong kernel for the shapes: NaN (O's dv columns)
    for (int e = int(tid); e < nq * int(dv); e += N_THREADS) {
      const int i = q0 + e / int(dv), d = e % int(dv);
      O[b * p.O_strides[0] + h * p.O_strides[1] + i * p.O_strides[2] + d] = ushort(0x7FC0);
      if (d == 0) L[b * L_batch + h * L_head + i] = NAN;
    }
    return;  // uniform for the threadgroup
  }

  // Keys [key_begin, key_end) can be visible to this tile's rows; whole key
  // tiles outside are never visited.
  int key_end = p.kL, key_begin = 0;
  if (do_causal) key_end = clamp(q0 + nq + p.qL_off, 0, p.kL);
  if (window != 0u) {  // the tile's first row sees keys from q0 + qL_off - W + 1 on
    const long first = long(q0) + p.qL_off - long(window) + 1;
    key_begin = first <= 0 ? 0 : (first >= long(p.kL) ? p.kL : int(first));
  }
  const int kt_begin = key_begin / BK, kt_end = (key_end + BK - 1) / BK;

  const device ushort *Qh = Q + b * p.Q_strides[0] + h * p.Q_strides[1];
  const device ushort *Kh = K + b * p.K_strides[0] + h_kv * p.K_strides[1];
  const device ushort *Vh = V + b * p.V_strides[0] + h_kv * p.V_strides[1];

  float o[ROWS][DPLV];               // unnormalised output, this lane's dims
  float m_run[ROWS], l_run[ROWS];    // running max and sum (same in every lane)
  for (int r = 0; r < ROWS; r++) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.0f;
    for (int j = 0; j < DPLV; j++) o[r][j] = 0.0f;
  }

  for (int kt = kt_begin; kt < kt_end; kt++) {
    const int k0 = kt * BK;
    const int nk = (!align_K && kt == p.NK_aligned) ? p.kL_rem : BK;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = int(tid); e < BK * BDM; e += N_THREADS) {
      const int kr = e / BDM, d = e % BDM;
      if (d < BD) K_s[kr * BD + d] = kr < nk ? Kh[(k0 + kr) * p.K_strides[2] + d] : ushort(0);
      if (d < BDV) V_s[kr * BDV + d] = kr < nk ? Vh[(k0 + kr) * p.V_strides[2] + d] : ushort(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (int r = 0; r < ROWS; r++) {
      const int il = int(sg) * ROWS + r;
      if (il >= nq) continue;  // uniform per simdgroup
      const int i = q0 + il;
      const long lo_key = window != 0u ? long(i) + p.qL_off - long(window) : -1L;
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
        s[k] = k < nk ? attn_score(acc, p, i, k0 + k, lo_key, has_mask,
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
      for (int j = 0; j < DPLV; j++) {
        float acc = o[r][j] * alpha;
        for (int k = 0; k < BK; k++) acc += s[k] * bf16_to_float(V_s[k * BDV + int(lane) + 32 * j]);
        o[r][j] = acc;
      }
    }
  }

  const float sink = has_sinks ? sinks[h] : -INFINITY;
  for (int r = 0; r < ROWS; r++) {
    const int il = int(sg) * ROWS + r;
    if (il >= nq) continue;
    const int i = q0 + il;
    float m = m_run[r], l = l_run[r], o_scale = 1.0f;
    if (sink != -INFINITY) {  // the sink joins the sum: rescale to max(m, s_h)
      const float m_new = fmax(m, sink);
      o_scale = m == -INFINITY ? 0.0f : exp(m - m_new);
      l = o_scale * l + exp(sink - m_new);
      m = m_new;
    }
    const bool bad_sink = is_nan_or_pos_inf(sink);
    const float inv = bad_sink ? NAN : (l > 0.0f ? o_scale / l : 0.0f);
    device ushort *Orow = O + b * p.O_strides[0] + h * p.O_strides[1] + i * p.O_strides[2];
    for (int j = 0; j < DPLV; j++) Orow[int(lane) + 32 * j] = float_to_bf16(o[r][j] * inv);
    if (lane == 0)
      L[b * L_batch + h * L_head + i] = bad_sink ? NAN : (l > 0.0f ? m + log(l) : -INFINITY);
  }
}

#define TG_ATTN_FWD_KERNEL(NAME, BD, BDV)                                                  \
  kernel void NAME(                                                                        \
      const device ushort *Q             [[buffer(0)]],                                    \
      const device ushort *K             [[buffer(1)]],                                    \
      const device ushort *V             [[buffer(2)]],                                    \
      device ushort       *O             [[buffer(3)]],                                    \
      device float        *L             [[buffer(4)]],                                    \
      const constant AttnParams *params  [[buffer(10)]],                                   \
      const constant AttnMaskParams *mp  [[buffer(11), function_constant(has_mask)]],      \
      const device ushort *mask          [[buffer(12), function_constant(has_mask)]],      \
      const constant AttnVariantParams *vp [[buffer(13), function_constant(has_variant_params)]], \
      const device float  *sinks         [[buffer(14), function_constant(has_sinks)]],     \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint  tid  [[thread_index_in_threadgroup]],                                          \
      uint  lane [[thread_index_in_simdgroup]],                                            \
      uint  sg   [[simdgroup_index_in_threadgroup]]) {                                     \
    threadgroup ushort K_s[BK * BD];                                                       \
    threadgroup ushort V_s[BK * BDV];                                                      \
    const AttnParams p = *params;                                                          \
    attn_fwd_body<BD, BDV>(Q, K, V, O, L, p, long(p.H) * p.qL, long(p.qL), mp, mask, vp,  \
                           sinks, tgid, tid, lane, sg, K_s, V_s);                          \
  }

// Packed documents (tilegrad's tg_attn_varlen_fwd): Q [total_q, H, D], K, V
// [total_k, H_kv, D | Dv] through the params' strides (B = 1, qL = total_q,
// kL = total_k), cu_seqlens_q(15), cu_seqlens_k(16) int32 [documents + 1];
// O through O_strides, L [H, total_q]. Document d = tgid.z is the problem
// of B = 1, qL = len_q, kL = len_k, qL_off = len_k - len_q (bottom-right
// causal), its tensors from its rows; a tile past its queries returns.
// Grid: (ceil(max len_q / 32), H, documents); align_Q, align_K and
// has_mask false. A document with no keys gets O rows 0, L the sink or -inf.
#define TG_ATTN_VARLEN_FWD_KERNEL(NAME, BD, BDV)                                           \
  kernel void NAME(                                                                        \
      const device ushort *Q             [[buffer(0)]],                                    \
      const device ushort *K             [[buffer(1)]],                                    \
      const device ushort *V             [[buffer(2)]],                                    \
      device ushort       *O             [[buffer(3)]],                                    \
      device float        *L             [[buffer(4)]],                                    \
      const constant AttnParams *params  [[buffer(10)]],                                   \
      const constant AttnVariantParams *vp [[buffer(13), function_constant(has_variant_params)]], \
      const device float  *sinks         [[buffer(14), function_constant(has_sinks)]],     \
      const device int    *cu_q          [[buffer(15)]],                                   \
      const device int    *cu_k          [[buffer(16)]],                                   \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint  tid  [[thread_index_in_threadgroup]],                                          \
      uint  lane [[thread_index_in_simdgroup]],                                            \
      uint  sg   [[simdgroup_index_in_threadgroup]]) {                                     \
    threadgroup ushort K_s[BK * BD];                                                       \
    threadgroup ushort V_s[BK * BDV];                                                      \
    const int doc = int(tgid.z), q0 = cu_q[doc], k0 = cu_k[doc];                           \
    const int lq = cu_q[doc + 1] - q0, lk = cu_k[doc + 1] - k0;                             \
    if (int(tgid.x) * BQ >= lq) return; /* uniform: past this document's queries */       \
    AttnParams p = *params;                                                                \
    const long L_head = long(p.qL); /* L [H, total_q] */                                   \
    device ushort *Od = O + q0 * p.O_strides[2];                                           \
    device float *Ld = L + q0;                                                             \
    if (lk == 0) { /* no keys: O 0, L the sink or -inf */                                  \
      const int h = int(tgid.y), r0 = int(tgid.x) * BQ, n = min(BQ, lq - r0);              \
      const uint dv = has_variant_params && vp->v_head_dim != 0u ? vp->v_head_dim : uint(p.D); \
      for (int e = int(tid); e < n * int(dv); e += N_THREADS) {                            \
        const int i = r0 + e / int(dv), d = e % int(dv);                                   \
        Od[h * p.O_strides[1] + i * p.O_strides[2] + d] = ushort(0);                       \
        if (d == 0) Ld[h * L_head + i] = has_sinks ? sinks[h] : -INFINITY;                 \
      }                                                                                    \
      return;                                                                              \
    }                                                                                      \
    p.B = 1, p.qL = lq, p.kL = lk, p.qL_off = lk - lq;                                     \
    p.NQ = (lq + BQ - 1) / BQ, p.NK = (lk + BK - 1) / BK;                                  \
    p.NQ_aligned = lq / BQ, p.NK_aligned = lk / BK, p.qL_rem = lq % BQ, p.kL_rem = lk % BK; \
    uint3 doc_tg = tgid; /* the document's grid: batch 0 */                             \
    doc_tg.z = 0;                                                                          \
    attn_fwd_body<BD, BDV>(Q + q0 * p.Q_strides[2], K + k0 * p.K_strides[2],              \
                           V + k0 * p.V_strides[2], Od, Ld, p, 0, L_head, nullptr, nullptr, \
                           vp, sinks, doc_tg, tid, lane, sg, K_s, V_s);                    \
  }

TG_ATTN_FWD_KERNEL(flash_attn_train_fwd_bf16_d64, 64, 64)
TG_ATTN_FWD_KERNEL(flash_attn_train_fwd_bf16_d256, 256, 256)
TG_ATTN_FWD_KERNEL(flash_attn_train_fwd_bf16_d192_dv128, 192, 128)
TG_ATTN_VARLEN_FWD_KERNEL(attn_varlen_fwd_bf16_d64, 64, 64)
TG_ATTN_VARLEN_FWD_KERNEL(attn_varlen_fwd_bf16_d256, 256, 256)
