// softmax.metal -- softmax backward (tilegrad kernel 6), f32.
//
//   grad_in[r, j] = sm[r, j] * (grad_out[r, j] - sum_k sm[r, k] * grad_out[r, k])
//
// Host name softmax_backward.
//   buffer(0)  sm        float[n_rows, row_len]
//   buffer(1)  grad_out  float[n_rows, row_len]
//   buffer(2)  grad_in   float[n_rows, row_len]  (writes)
//   buffer(3)  params    uint[2] = {n_rows, row_len}
// Grid: one threadgroup per row (n_rows, 1, 1); threadgroup <= 1024 threads.
#include <metal_stdlib>
using namespace metal;

kernel void softmax_backward(
    const device float *sm       [[buffer(0)]],
    const device float *grad_out [[buffer(1)]],
    device float       *grad_in  [[buffer(2)]],
    const device uint  *params   [[buffer(3)]],
    uint row     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const uint n_rows = params[0], len = params[1];
  threadgroup float partial[32];  // one per simdgroup
  if (row >= n_rows) return;      // uniform
  const ulong base = (ulong)row * len;

  // dot = sum_j sm * grad_out: per thread, per simdgroup, then across simdgroups.
  float acc = 0.0f;
  for (uint j = tid; j < len; j += tg_size) acc += sm[base + j] * grad_out[base + j];
  acc = simd_sum(acc);
  if (tid % 32 == 0) partial[tid / 32] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint n_sg = (tg_size + 31) / 32;
  const float dot = simd_sum(tid % 32 < n_sg ? partial[tid % 32] : 0.0f);

  for (uint j = tid; j < len; j += tg_size)
    grad_in[base + j] = sm[base + j] * (grad_out[base + j] - dot);
}
