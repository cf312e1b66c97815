// flash_attn_vec_reduce.metal -- decode: reduce of split-KV flash-attention
// partials (tilegrad kernel 11), plain and fused with the TurboQuant
// Hadamard / sign undo.
//
// htmp, for nrows rows, nwg workgroups and value dim DV:
//   partial outputs: nrows*DV*nwg floats in groups of four; dims 4c..4c+3 of
//     row r, workgroup w at float offset ((r*(DV/4) + c)*nwg + w)*4
//   then (S, M) pairs: S[r,w] at nrows*DV*nwg + (r*nwg + w)*2, M[r,w] after it
// Reduce, per row:  Mg = max_w M[w];  a_w = exp(M[w] - Mg) (0 if M[w] = -inf)
//   St = sum_w S[w] a_w;  dst[r,d] = (sum_w part[w,d] a_w) / St, 0 if St == 0.
// A workgroup with M = -inf is skipped: its partials are never read (the
// original multiplied them by 0, turning NaN/inf garbage into NaN).
// Undo (fused kernels): y = H x / sqrt(DV) (Sylvester order), y[j] *= sign(j),
// sign bit j = (T[j >> 3] >> (j & 7)) & 1 of the D1 table below.
//
// Host names and buffers (both families):
//   flash_attn_vec_reduce_dk256 / _dk512                 (DV = 256 / 512)
//   flash_attn_vec_reduce_tq_hb_undo_dk256 / _dk512
//   buffer(0) params {uint nrows}   buffer(1) htmp   buffer(2) dst / output
//   buffer(3) uint nwg              threadgroup(0): DV floats (fused only)
// Grid: threadgroups (nrows, 1, 1); threadgroup a multiple of 32 threads,
// e.g. 32 * min(nwg, 32) as the seed's dispatcher does (any nwg >= 1 works:
// lanes stride over the workgroups).
// Lanes index workgroups (simd_max / simd_sum fold them); simdgroups take the
// float4 chunks of the row in turn.
#include <metal_stdlib>
using namespace metal;

struct VecReduceParams {
  uint nrows;
};

// TurboQuant D1 sign table (tilegrad's contract): DV = 256 uses 32 bytes.
constant uchar tq_d1_signs[64] = {
    0xa7, 0x3b, 0x91, 0xf4, 0x6d, 0xc2, 0x58, 0x0e, 0xb3, 0x7f, 0x24, 0xd6, 0x89, 0x45, 0xea, 0x1c,
    0x63, 0xaf, 0xd8, 0x52, 0x97, 0x0b, 0xe1, 0x3d, 0x76, 0xc4, 0x19, 0xfe, 0x4a, 0x85, 0x2c, 0xdb,
    0xd3, 0x4e, 0xa8, 0x17, 0x9c, 0x5b, 0xe6, 0x31, 0x72, 0xb9, 0x0d, 0xf5, 0x43, 0x8a, 0x6e, 0xc7,
    0x58, 0x2f, 0x94, 0xe1, 0xb6, 0x3d, 0x0a, 0x7c, 0xc5, 0x61, 0xd8, 0x4f, 0xa3, 0x97, 0x1e, 0x85};

// Weight of workgroup w (0 for an empty one).
static inline float wg_weight(float M, float Mg) { return M == -INFINITY ? 0.0f : exp(M - Mg); }

// Reduces row `row` into dst[0 .. DV) (device memory, plain reduce) or, with
// TO_TG, into the threadgroup row buffer x (fused undo); lane 0 of the
// simdgroup that owns a float4 chunk stores it.
template <int DV, bool TO_TG>
static inline void reduce_row(const device float *htmp, uint nrows, uint nwg, uint row,
                              uint lane, uint sg, uint n_sg, device float *dst,
                              threadgroup float *x) {
  const device float *SM = htmp + (ulong)nrows * DV * nwg + (ulong)row * nwg * 2;
  float mx = -INFINITY;
  for (uint w = lane; w < nwg; w += 32) mx = fmax(mx, SM[2 * w + 1]);
  const float Mg = simd_max(mx);
  float st = 0.0f;
  for (uint w = lane; w < nwg; w += 32) {
    const float a = wg_weight(SM[2 * w + 1], Mg);
    if (a != 0.0f) st += SM[2 * w] * a;
  }
  const float St = simd_sum(st);
  const device float4 *part = (const device float4 *)htmp + (ulong)row * (DV / 4) * nwg;
  for (uint c = sg; c < uint(DV / 4); c += n_sg) {  // uniform per simdgroup
    float4 acc = float4(0.0f);
    if (St != 0.0f)
      for (uint w = lane; w < nwg; w += 32) {
        const float a = wg_weight(SM[2 * w + 1], Mg);
        if (a != 0.0f) acc += part[c * nwg + w] * a;
      }
    acc = simd_sum(acc);
    const float4 v = St == 0.0f ? float4(0.0f) : acc / St;
    if (lane == 0) {
      if (TO_TG) {
        x[4 * c + 0] = v.x; x[4 * c + 1] = v.y; x[4 * c + 2] = v.z; x[4 * c + 3] = v.w;
      } else {
        ((device float4 *)dst)[c] = v;
      }
    }
  }
}

template <int DV>
static inline void vec_reduce(const constant VecReduceParams *params, const device float *htmp,
                              device float *dst, const constant uint *nwg, uint row, uint lane,
                              uint sg, uint tg_size) {
  if (row >= params->nrows) return;
  reduce_row<DV, false>(htmp, params->nrows, *nwg, row, lane, sg, tg_size / 32,
                        dst + (ulong)row * DV, nullptr);
}

template <int DV>
static inline void vec_reduce_tq_hb_undo(const constant VecReduceParams *params,
                                         const device float *htmp, device float *output,
                                         const constant uint *nwg, threadgroup float *x,
                                         uint row, uint tid, uint lane, uint sg, uint tg_size) {
  if (row >= params->nrows) return;  // uniform
  reduce_row<DV, true>(htmp, params->nrows, *nwg, row, lane, sg, tg_size / 32, nullptr, x);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Walsh-Hadamard butterflies in natural order, one stage per barrier
  for (uint len = 1; len < uint(DV); len *= 2) {
    for (uint k = tid; k < uint(DV / 2); k += tg_size) {
      const uint j = (k / len) * 2 * len + k % len;
      const float u = x[j], v = x[j + len];
      x[j] = u + v;
      x[j + len] = u - v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  // 1/sqrt(DV), correctly rounded: 1/16 and 0x1.6a09e6p-5
  const float inv_sqrt = DV == 256 ? 0.0625f : 0.0441941738241592f;
  device float *out = output + (ulong)row * DV;
  for (uint j = tid; j < uint(DV); j += tg_size) {
    const float y = x[j] * inv_sqrt;
    out[j] = ((tq_d1_signs[j >> 3] >> (j & 7)) & 1) ? -y : y;
  }
}

#define TG_VEC_REDUCE_KERNEL(NAME, DV)                                          \
  kernel void NAME(const constant VecReduceParams *params [[buffer(0)]],        \
                   const device float *htmp               [[buffer(1)]],        \
                   device float *dst                      [[buffer(2)]],        \
                   const constant uint *nwg               [[buffer(3)]],        \
                   uint row     [[threadgroup_position_in_grid]],               \
                   uint lane    [[thread_index_in_simdgroup]],                  \
                   uint sg      [[simdgroup_index_in_threadgroup]],             \
                   uint tg_size [[threads_per_threadgroup]]) {                  \
    vec_reduce<DV>(params, htmp, dst, nwg, row, lane, sg, tg_size);             \
  }
#define TG_VEC_REDUCE_UNDO_KERNEL(NAME, DV)                                     \
  kernel void NAME(const constant VecReduceParams *params [[buffer(0)]],        \
                   const device float *htmp               [[buffer(1)]],        \
                   device float *output                   [[buffer(2)]],        \
                   const constant uint *nwg               [[buffer(3)]],        \
                   threadgroup float *x                   [[threadgroup(0)]],   \
                   uint row     [[threadgroup_position_in_grid]],               \
                   uint tid     [[thread_index_in_threadgroup]],                \
                   uint lane    [[thread_index_in_simdgroup]],                  \
                   uint sg      [[simdgroup_index_in_threadgroup]],             \
                   uint tg_size [[threads_per_threadgroup]]) {                  \
    vec_reduce_tq_hb_undo<DV>(params, htmp, output, nwg, x, row, tid, lane, sg, tg_size); \
  }

TG_VEC_REDUCE_KERNEL(flash_attn_vec_reduce_dk256, 256)
TG_VEC_REDUCE_KERNEL(flash_attn_vec_reduce_dk512, 512)
TG_VEC_REDUCE_UNDO_KERNEL(flash_attn_vec_reduce_tq_hb_undo_dk256, 256)
TG_VEC_REDUCE_UNDO_KERNEL(flash_attn_vec_reduce_tq_hb_undo_dk512, 512)
