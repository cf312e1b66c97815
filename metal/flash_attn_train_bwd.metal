// flash_attn_train_bwd.metal -- FlashAttention-2 training backward
// (tilegrad kernels 1 and 2), bf16 in, f32 out.
//
// Host names:
//   flash_attn_train_bwd_compute_d_bf16   D[b,h,i] = sum_d O[b,h,i,d] * dO[b,h,i,d]
//                                         (with a value head dim, d runs over Dv)
//   flash_attn_train_bwd_bf16_d64         the main backward, head dim 64
//   flash_attn_train_bwd_bf16_d256        the main backward, head dim 256
//   flash_attn_train_bwd_bf16_d192_dv128  the main backward, D = 192, Dv = 128 (MLA)
//   attn_varlen_bwd_bf16_d64, _d256       packed documents (tg_attn_varlen_bwd; at the end)
//
// For each (b, h, query row i), h_kv = h / gqa_factor:
//   S[i,k]  = scale * Q[i].K[k]; softcapping c != 1: S = c * tanh(S / c)
//             causal and k > i + qL_off -> -inf; window W and k <= i + qL_off - W -> -inf;
//             mask m: m == -inf -> -inf, else S + m
//   P[i,k]  = exp(S[i,k] - L[i])        (0 for a fully masked row, L = -inf;
//                                        L from the forward includes any sink)
//   dP[i,k] = dO[i].V[k]                (Dv columns)
//   dS[i,k] = scale * P * (dP - D[i])   (* (1 - tanh^2) with softcapping)
//   dQ[i]   = sum_k dS[i,k] K[k]                            (writes)
//   dK[k]  += sum_i dS[i,k] Q[i],  dV[k] += sum_i P[i,k] dO[i]   (atomic f32)
//   d_sinks[h] += -sum_{b,i} exp(s_h - L[i]) D[i]   (sinks; nothing when s_h = -inf)
// tilegrad's fixes over the seed: causal honours qL_off (the seed assumed 0);
// a fully masked row contributes exact zeros; softcapping is applied (the
// seed ignored it); every lane of the tile does its share of the dK/dV adds
// (no 4x over-count).
#include <metal_stdlib>
using namespace metal;

// ---- ABI: byte-identical to tilegrad's tg_attn_params -----------------------
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
// tilegrad's tg_attn_options.window / .v_head_dim (8 bytes: window at 0,
// v_head_dim at 4).
struct AttnVariantParams {
  uint window;      // W >= 1: key k visible to query i iff k > i + qL_off - W; 0 = none
  uint v_head_dim;  // Dv; 0 = D. Must be the kernel's Dv (else dQ is NaN)
};
static_assert(sizeof(AttnVariantParams) == 8, "AttnVariantParams is 8 bytes");
static_assert(__builtin_offsetof(AttnVariantParams, v_head_dim) == 4, "AttnVariantParams.v_head_dim");

struct ComputeDParams {
  uint batch, n_q_heads, q_seq_len, head_dim;
};

constant bool align_Q [[function_constant(200)]];    // qL % BQ == 0
constant bool align_K [[function_constant(201)]];    // kL % BK == 0
constant bool has_mask [[function_constant(300)]];   // buffers 11, 12 bound
constant bool do_causal [[function_constant(301)]];  // k <= i + qL_off
// Optional (a pipeline built without them, as by hosts older than the
// variants, sees false): buffer 13 bound; buffer 14 bound; buffer 15 bound.
constant bool has_variant_params_fc [[function_constant(302)]];
constant bool has_sinks_fc [[function_constant(303)]];
constant bool has_d_sinks_fc [[function_constant(304)]];
constant bool has_variant_params = is_function_constant_defined(has_variant_params_fc) && has_variant_params_fc;
constant bool has_sinks = is_function_constant_defined(has_sinks_fc) && has_sinks_fc;
constant bool has_d_sinks = is_function_constant_defined(has_d_sinks_fc) && has_d_sinks_fc;

static inline float bf16_to_float(ushort h) { return as_type<float>(uint(h) << 16); }

// ---- 1. D = rowsum(O * dO) ------------------------------------------------
//   buffer(0) O [B,H,qL,D] bf16, buffer(1) dO (same), buffer(2) D_out [B,H,qL]
//   f32 (writes), buffer(3) ComputeDParams (head_dim = Dv with a value head dim).
// Grid: threadgroups (qL, 1, B*H); threadgroup min(256, next_pow2(D)) threads.
kernel void flash_attn_train_bwd_compute_d_bf16(
    const device ushort *O                [[buffer(0)]],
    const device ushort *dO               [[buffer(1)]],
    device float        *D_out            [[buffer(2)]],
    const constant ComputeDParams *params [[buffer(3)]],
    uint3 tgid   [[threadgroup_position_in_grid]],
    uint  tid    [[thread_index_in_threadgroup]],
    uint  tg_size [[threads_per_threadgroup]]) {
  const uint qL = params->q_seq_len, D = params->head_dim;
  const uint i = tgid.x, bh = tgid.z;
  threadgroup float partial[32];  // one per simdgroup
  if (i >= qL) return;            // uniform for the threadgroup
  const ulong row = ((ulong)bh * qL + i) * D;
  float acc = 0.0f;
  for (uint d = tid; d < D; d += tg_size) acc += bf16_to_float(O[row + d]) * bf16_to_float(dO[row + d]);
  acc = simd_sum(acc);
  if (tid % 32 == 0) partial[tid / 32] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < 32) {  // simdgroup 0 folds the partials
    const float v = simd_sum(tid < (tg_size + 31) / 32 ? partial[tid] : 0.0f);
    if (tid == 0) D_out[(ulong)bh * qL + i] = v;
  }
}

// ---- 2. the main backward ---------------------------------------------------
// Buffers: Q(0) K(1) V(2) [3 unused] L(4) dO(5) D_vec(6) dQ(7) dK(8) dV(9)
//   params(10) AttnParams; mask_params(11), mask(12) when has_mask;
//   variant_params(13) AttnVariantParams when has_variant_params; sinks(14)
//   f32 [H] when has_sinks; d_sinks(15) f32 [H] when has_d_sinks (with sinks).
//   Q bf16 [B,H,qL,D] through Q_strides, dO bf16 [B,H,qL,Dv] through
//   O_strides; K bf16 [B,H_kv,kL,D], V bf16 [B,H_kv,kL,Dv] through K_strides
//   / V_strides; L, D_vec f32 [B,H,qL]; dQ f32 [B,H,qL,D] (writes); dK f32
//   [B,H_kv,kL,D], dV f32 [B,H_kv,kL,Dv] (accumulate atomically); d_sinks
//   accumulates (one atomic per threadgroup).
// Function constants 200, 201, 300, 301 as the forward's; optional 302
// has_variant_params, 303 has_sinks, 304 has_d_sinks.
// Grid: threadgroups (NQ, H, B); threadgroup 128 threads (4 simdgroups).
//
// Threadgroup (qb, h, b) owns query rows q0 = 32 qb .. q0+31; simdgroup s owns
// rows q0 + 8s .. q0 + 8s + 7 and lane l owns head dims l, l+32, ... For each
// key tile of 16 that the rows can see (causal limit, window; tiles wholly
// outside are not visited):
//   1. the 128 threads stage K [16, BD] and V [16, BDV] (bf16) in threadgroup
//      memory;
//   2. per owned row and key, the lanes' partial Q.K and dO.V products are
//      folded by one simd_sum (a float2), giving S and dP; P and dS go to
//      threadgroup tiles [32, 16] and dQ accumulates in registers;
//   3. thread (k, d) forms sum_i dS[i,k] Q[i,d] and sum_i P[i,k] dO[i,d]
//      over the 32 rows and adds them to dK, dV with one atomic each.
// With d_sinks, the rows' -exp(s_h - L) D terms are folded by simd_sum and
// through threadgroup memory, and added with one atomic per threadgroup.
constant constexpr int BQ = 32;              // query rows per threadgroup (params.NQ)
constant constexpr int BK = 16;              // keys per tile (params.NK)
constant constexpr int N_SG = 4;             // simdgroups per threadgroup
constant constexpr int ROWS = BQ / N_SG;     // rows per simdgroup
constant constexpr int N_THREADS = N_SG * 32;

// tilegrad's score (kernels/attention.h): tanh_out gets the softcap's tanh.
// Keys k <= lo_key are outside the window: lo_key = i + qL_off - W (64-bit,
// so any W fits), -1 without a window.
static inline float attn_score(float qk, const thread AttnParams &p, int i, int k, long lo_key,
                               bool masked, float m, thread float &tanh_out) {
  float s = p.scale * qk;
  float t = 0.0f;
  if (p.softcapping != 1.0f) {
    t = precise::tanh(s / p.softcapping);
    s = p.softcapping * t;
  }
  tanh_out = t;
  if (do_causal && k > i + p.qL_off) return -INFINITY;
  if (long(k) <= lo_key) return -INFINITY;
  if (masked) {
    if (m == -INFINITY) return -INFINITY;
    s += m;
  }
  return s;
}

// Where the body reads L, D_vec and writes dQ, dK, dV: L's and D_vec's
// [batch, head] strides (rows 1) and the gradients' [batch, head, row]
// strides (elements 1). The dense kernels: [B, H, qL] and contiguous
// [B, heads, L, D]; the varlen ones: [H, total_q] and [total, heads, D].
struct GradLayout {
  long Ls[2], dQs[3], dKs[3], dVs[3];
};

template <int BD, int BDV>
static inline void attn_bwd_body(
    const device ushort *Q, const device ushort *K, const device ushort *V,
    const device float *L, const device ushort *dO, const device float *D_vec,
    device float *dQ, device float *dK, device float *dV,
    const thread AttnParams &p, const thread GradLayout &gl, const constant AttnMaskParams *mp,
    const device ushort *mask, const constant AttnVariantParams *vp,
    const device float *sinks, device float *d_sinks, uint3 tgid, uint tid, uint lane, uint sg,
    threadgroup ushort *K_s, threadgroup ushort *V_s,
    threadgroup float (*P_s)[BK], threadgroup float (*dS_s)[BK], threadgroup float *sink_part) {
  static_assert(BD % 32 == 0 && BDV % 32 == 0, "head dims are multiples of 32 (lane layout)");
  constexpr int DPL = BD / 32, DPLV = BDV / 32;  // head dims per lane (Q/K, V/O)
  constexpr int BDM = BD > BDV ? BD : BDV;
  const int qb = int(tgid.x), h = int(tgid.y), b = int(tgid.z);
  const int h_kv = h / p.gqa_factor;
  const int q0 = qb * BQ;
  const int nq = (!align_Q && qb == p.NQ_aligned) ? p.qL_rem : BQ;  // rows in this tile
  const long lrow = b * gl.Ls[0] + h * gl.Ls[1];  // of L and D_vec
  device float *dQh = dQ + b * gl.dQs[0] + h * gl.dQs[1];
  const uint window = has_variant_params ? vp->window : 0u;
  const uint dv = has_variant_params && vp->v_head_dim != 0u ? vp->v_head_dim : uint(p.D);

  if (p.D != BD || dv != uint(BDV)) {  // wrong kernel for the shapes: NaN dQ, nothing else
    for (int e = int(tid); e < nq * p.D; e += N_THREADS) dQh[(q0 + e / p.D) * gl.dQs[2] + e % p.D] = NAN;
    return;  // uniform for the threadgroup
  }

  // Keys [key_begin, key_end) can be visible to this tile's rows.
  int key_end = p.kL, key_begin = 0;
  if (do_causal) key_end = clamp(q0 + nq + p.qL_off, 0, p.kL);
  if (window != 0u) {  // the tile's first row sees keys from q0 + qL_off - W + 1 on
    const long first = long(q0) + p.qL_off - long(window) + 1;
    key_begin = first <= 0 ? 0 : (first >= long(p.kL) ? p.kL : int(first));
  }
  const int kt_begin = key_begin / BK, kt_end = (key_end + BK - 1) / BK;

  const device ushort *Qh = Q + b * p.Q_strides[0] + h * p.Q_strides[1];
  const device ushort *dOh = dO + b * p.O_strides[0] + h * p.O_strides[1];
  const device ushort *Kh = K + b * p.K_strides[0] + h_kv * p.K_strides[1];
  const device ushort *Vh = V + b * p.V_strides[0] + h_kv * p.V_strides[1];

  float dq[ROWS][DPL];  // dQ of the simdgroup's rows, this lane's dims
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < DPL; j++) dq[r][j] = 0.0f;

  for (int kt = kt_begin; kt < kt_end; kt++) {
    const int k0 = kt * BK;
    const int nk = (!align_K && kt == p.NK_aligned) ? p.kL_rem : BK;  // keys in this tile

    // 1. stage K [BK, BD], V [BK, BDV] (zeros past the tail)
    threadgroup_barrier(mem_flags::mem_threadgroup);  // previous tile fully used
    for (int e = int(tid); e < BK * BDM; e += N_THREADS) {
      const int kr = e / BDM, d = e % BDM;
      if (d < BD) K_s[kr * BD + d] = kr < nk ? Kh[(k0 + kr) * p.K_strides[2] + d] : ushort(0);
      if (d < BDV) V_s[kr * BDV + d] = kr < nk ? Vh[(k0 + kr) * p.V_strides[2] + d] : ushort(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 2. S, dP, P, dS for the simdgroup's rows (uniform loop per simdgroup)
    for (int r = 0; r < ROWS; r++) {
      const int il = int(sg) * ROWS + r;  // row within the tile
      if (il >= nq) {
        if (lane < uint(BK)) { P_s[il][lane] = 0.0f; dS_s[il][lane] = 0.0f; }
        continue;
      }
      const int i = q0 + il;
      const long lo_key = window != 0u ? long(i) + p.qL_off - long(window) : -1L;
      float q[DPL], g[DPLV];
      for (int j = 0; j < DPL; j++) q[j] = bf16_to_float(Qh[i * p.Q_strides[2] + int(lane) + 32 * j]);
      for (int j = 0; j < DPLV; j++) g[j] = bf16_to_float(dOh[i * p.O_strides[2] + int(lane) + 32 * j]);
      const float Li = L[lrow + i], Di = D_vec[lrow + i];
      const device ushort *mrow = has_mask ? mask + b * mp->M_strides[0] + h * mp->M_strides[1] +
                                                 i * mp->M_strides[2]
                                           : nullptr;
      for (int k = 0; k < BK; k++) {
        float2 acc = float2(0.0f);  // (Q.K, dO.V) partials of this lane
        for (int j = 0; j < DPL; j++) acc.x += q[j] * bf16_to_float(K_s[k * BD + int(lane) + 32 * j]);
        for (int j = 0; j < DPLV; j++) acc.y += g[j] * bf16_to_float(V_s[k * BDV + int(lane) + 32 * j]);
        acc = simd_sum(acc);
        float t = 0.0f, s = -INFINITY;
        if (k < nk)
          s = attn_score(acc.x, p, i, k0 + k, lo_key, has_mask,
                         has_mask ? bf16_to_float(mrow[k0 + k]) : 0.0f, t);
        const float P = (Li == -INFINITY) ? 0.0f : exp(s - Li);  // fully masked row: 0
        float gs = P * (acc.y - Di);
        if (p.softcapping != 1.0f) gs *= 1.0f - t * t;
        const float ds = p.scale * gs;
        if (lane == 0) { P_s[il][k] = P; dS_s[il][k] = ds; }
        for (int j = 0; j < DPL; j++) dq[r][j] += ds * bf16_to_float(K_s[k * BD + int(lane) + 32 * j]);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // 3. this tile's dK, dV: thread per (key, dim), one atomic add each
    device float *dKh = dK + b * gl.dKs[0] + h_kv * gl.dKs[1] + k0 * gl.dKs[2];
    device float *dVh = dV + b * gl.dVs[0] + h_kv * gl.dVs[1] + k0 * gl.dVs[2];
    for (int e = int(tid); e < nk * BDM; e += N_THREADS) {
      const int k = e / BDM, d = e % BDM;
      if (d < BD) {
        float ak = 0.0f;
        for (int il = 0; il < nq; il++) ak += dS_s[il][k] * bf16_to_float(Qh[(q0 + il) * p.Q_strides[2] + d]);
        atomic_fetch_add_explicit((device atomic_float *)&dKh[k * gl.dKs[2] + d], ak, memory_order_relaxed);
      }
      if (d < BDV) {
        float av = 0.0f;
        for (int il = 0; il < nq; il++) av += P_s[il][k] * bf16_to_float(dOh[(q0 + il) * p.O_strides[2] + d]);
        atomic_fetch_add_explicit((device atomic_float *)&dVh[k * gl.dVs[2] + d], av, memory_order_relaxed);
      }
    }
  }

  // dQ rows of this simdgroup (writes; zeros for rows that saw no key)
  for (int r = 0; r < ROWS; r++) {
    const int il = int(sg) * ROWS + r;
    if (il >= nq) continue;
    device float *dq_row = dQh + (q0 + il) * gl.dQs[2];
    for (int j = 0; j < DPL; j++) dq_row[int(lane) + 32 * j] = dq[r][j];
  }

  // d_sinks[h] += -sum_i exp(s_h - L[i]) D[i] over this tile's rows; P_sink
  // is 0 for s_h = -inf (no sink), so nothing is added then.
  const float sink = has_sinks ? sinks[h] : -INFINITY;
  if (has_d_sinks && sink != -INFINITY) {  // uniform for the threadgroup
    const int il = int(sg) * ROWS + int(lane);  // lane r < ROWS takes row r
    float term = 0.0f;
    if (lane < uint(ROWS) && il < nq) term = -exp(sink - L[lrow + q0 + il]) * D_vec[lrow + q0 + il];
    term = simd_sum(term);
    if (lane == 0) sink_part[sg] = term;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
      float sum = 0.0f;
      for (int s = 0; s < N_SG; s++) sum += sink_part[s];
      atomic_fetch_add_explicit((device atomic_float *)&d_sinks[h], sum, memory_order_relaxed);
    }
  }
}

// One kernel per instantiated (head dim, value head dim); identical signatures.
#define TG_ATTN_BWD_KERNEL(NAME, BD, BDV)                                                     \
  kernel void NAME(                                                                        \
      const device ushort *Q             [[buffer(0)]],                                    \
      const device ushort *K             [[buffer(1)]],                                    \
      const device ushort *V             [[buffer(2)]],                                    \
      const device float  *L             [[buffer(4)]],                                    \
      const device ushort *dO            [[buffer(5)]],                                    \
      const device float  *D_vec         [[buffer(6)]],                                    \
      device float        *dQ            [[buffer(7)]],                                    \
      device float        *dK            [[buffer(8)]],                                    \
      device float        *dV            [[buffer(9)]],                                    \
      const constant AttnParams *params  [[buffer(10)]],                                   \
      const constant AttnMaskParams *mp  [[buffer(11), function_constant(has_mask)]],      \
      const device ushort *mask          [[buffer(12), function_constant(has_mask)]],      \
      const constant AttnVariantParams *vp [[buffer(13), function_constant(has_variant_params)]], \
      const device float  *sinks         [[buffer(14), function_constant(has_sinks)]],     \
      device float        *d_sinks       [[buffer(15), function_constant(has_d_sinks)]],   \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint  tid  [[thread_index_in_threadgroup]],                                          \
      uint  lane [[thread_index_in_simdgroup]],                                            \
      uint  sg   [[simdgroup_index_in_threadgroup]]) {                                     \
    threadgroup ushort K_s[BK * BD];                                                       \
    threadgroup ushort V_s[BK * BDV];                                                      \
    threadgroup float P_s[BQ][BK];                                                         \
    threadgroup float dS_s[BQ][BK];                                                        \
    threadgroup float sink_part[N_SG];                                                     \
    const AttnParams p = *params;                                                          \
    const long H_kv = p.H / p.gqa_factor, qL = p.qL, kL = p.kL;                            \
    const GradLayout gl = {{long(p.H) * qL, qL},                                           \
                           {long(p.H) * qL * BD, qL * BD, BD},                             \
                           {H_kv * kL * BD, kL * BD, BD},                                  \
                           {H_kv * kL * BDV, kL * BDV, BDV}};                              \
    attn_bwd_body<BD, BDV>(Q, K, V, L, dO, D_vec, dQ, dK, dV, p, gl, mp, mask, vp, sinks,  \
                           d_sinks, tgid, tid, lane, sg, K_s, V_s, P_s, dS_s, sink_part);   \
  }

// Packed documents (tilegrad's tg_attn_varlen_bwd, dK and dV accumulated):
// Q, dO [total_q, H, D | Dv], K, V [total_k, H_kv, D | Dv] through the
// params' strides (B = 1, qL = total_q, kL = total_k); L, D_vec [H,
// total_q]; dQ [total_q, H, D] (writes), dK, dV [total_k, H_kv, D | Dv]
// (accumulate atomically); cu_seqlens_q(16), cu_seqlens_k(17) int32
// [documents + 1]. Document d = tgid.z is the problem of B = 1, qL = len_q,
// kL = len_k, qL_off = len_k - len_q; a tile past its queries returns, a
// document with no keys gets dQ rows 0. Grid: (ceil(max len_q / 32), H,
// documents); align_Q, align_K and has_mask false.
#define TG_ATTN_VARLEN_BWD_KERNEL(NAME, BD, BDV)                                           \
  kernel void NAME(                                                                        \
      const device ushort *Q             [[buffer(0)]],                                    \
      const device ushort *K             [[buffer(1)]],                                    \
      const device ushort *V             [[buffer(2)]],                                    \
      const device float  *L             [[buffer(4)]],                                    \
      const device ushort *dO            [[buffer(5)]],                                    \
      const device float  *D_vec         [[buffer(6)]],                                    \
      device float        *dQ            [[buffer(7)]],                                    \
      device float        *dK            [[buffer(8)]],                                    \
      device float        *dV            [[buffer(9)]],                                    \
      const constant AttnParams *params  [[buffer(10)]],                                   \
      const constant AttnVariantParams *vp [[buffer(13), function_constant(has_variant_params)]], \
      const device float  *sinks         [[buffer(14), function_constant(has_sinks)]],     \
      device float        *d_sinks       [[buffer(15), function_constant(has_d_sinks)]],   \
      const device int    *cu_q          [[buffer(16)]],                                   \
      const device int    *cu_k          [[buffer(17)]],                                   \
      uint3 tgid [[threadgroup_position_in_grid]],                                         \
      uint  tid  [[thread_index_in_threadgroup]],                                          \
      uint  lane [[thread_index_in_simdgroup]],                                            \
      uint  sg   [[simdgroup_index_in_threadgroup]]) {                                     \
    threadgroup ushort K_s[BK * BD];                                                       \
    threadgroup ushort V_s[BK * BDV];                                                      \
    threadgroup float P_s[BQ][BK];                                                         \
    threadgroup float dS_s[BQ][BK];                                                        \
    threadgroup float sink_part[N_SG];                                                     \
    const int doc = int(tgid.z), q0 = cu_q[doc], k0 = cu_k[doc];                           \
    const int lq = cu_q[doc + 1] - q0, lk = cu_k[doc + 1] - k0;                             \
    if (int(tgid.x) * BQ >= lq) return; /* uniform: past this document's queries */       \
    AttnParams p = *params;                                                                \
    const long H = p.H, H_kv = p.H / p.gqa_factor;                                         \
    const GradLayout gl = {{0, long(p.qL)}, {0, BD, H * BD}, {0, BD, H_kv * BD},           \
                           {0, BDV, H_kv * BDV}};                                          \
    device float *dQd = dQ + q0 * gl.dQs[2];                                               \
    if (lk == 0) { /* no keys: dQ rows 0 */                                                \
      const int h = int(tgid.y), r0 = int(tgid.x) * BQ, n = min(BQ, lq - r0);              \
      for (int e = int(tid); e < n * BD; e += N_THREADS)                                   \
        dQd[h * gl.dQs[1] + (r0 + e / BD) * gl.dQs[2] + e % BD] = 0.0f;                    \
      return;                                                                              \
    }                                                                                      \
    p.B = 1, p.qL = lq, p.kL = lk, p.qL_off = lk - lq;                                     \
    p.NQ = (lq + BQ - 1) / BQ, p.NK = (lk + BK - 1) / BK;                                  \
    p.NQ_aligned = lq / BQ, p.NK_aligned = lk / BK, p.qL_rem = lq % BQ, p.kL_rem = lk % BK; \
    uint3 doc_tg = tgid; /* the document's grid: batch 0 */                                \
    doc_tg.z = 0;                                                                          \
    attn_bwd_body<BD, BDV>(Q + q0 * p.Q_strides[2], K + k0 * p.K_strides[2],              \
                           V + k0 * p.V_strides[2], L + q0, dO + q0 * p.O_strides[2],      \
                           D_vec + q0, dQd, dK + k0 * gl.dKs[2], dV + k0 * gl.dVs[2], p,   \
                           gl, nullptr, nullptr, vp, sinks, d_sinks, doc_tg, tid, lane, sg, \
                           K_s, V_s, P_s, dS_s, sink_part);                                \
  }

TG_ATTN_BWD_KERNEL(flash_attn_train_bwd_bf16_d64, 64, 64)
TG_ATTN_BWD_KERNEL(flash_attn_train_bwd_bf16_d256, 256, 256)
TG_ATTN_BWD_KERNEL(flash_attn_train_bwd_bf16_d192_dv128, 192, 128)
TG_ATTN_VARLEN_BWD_KERNEL(attn_varlen_bwd_bf16_d64, 64, 64)
TG_ATTN_VARLEN_BWD_KERNEL(attn_varlen_bwd_bf16_d256, 256, 256)
