// embedding.metal -- embedding backward (tilegrad kernel 7), f32.
//
//   grad_weight[ids[t], :] += grad_out[t, :]     (repeated ids add up)
//
// Host name embedding_backward.
//   buffer(0)  grad_out     float[seq_len, dim]
//   buffer(1)  ids          uint[seq_len]
//   buffer(2)  grad_weight  atomic float[vocab_size, dim]  (accumulates)
//   buffer(3)  params       uint[3] = {vocab_size, seq_len, dim}
// Grid: threadgroups (ceil(dim / tg_size), seq_len, 1); threadgroup (tg_size,
// 1, 1), e.g. 256. Thread (x, t) adds column x of token t: the adds of one
// token are contiguous, and tokens sharing an id meet in device atomics.
// An id >= vocab_size is skipped (nothing written for that token): the GPU
// cannot return the C engine's TG_ERR_BAD_INDEX, but it must not write out
// of bounds either. Validate ids on the host when that matters.
#include <metal_stdlib>
using namespace metal;

kernel void embedding_backward(
    const device float  *grad_out    [[buffer(0)]],
    const device uint   *ids         [[buffer(1)]],
    device atomic_float *grad_weight [[buffer(2)]],
    const device uint   *params      [[buffer(3)]],
    uint2 gid [[thread_position_in_grid]]) {
  const uint vocab = params[0], seq_len = params[1], dim = params[2];
  const uint col = gid.x, t = gid.y;
  if (t >= seq_len || col >= dim) return;
  const uint id = ids[t];
  if (id >= vocab) return;
  atomic_fetch_add_explicit(&grad_weight[(ulong)id * dim + col],
                            grad_out[(ulong)t * dim + col], memory_order_relaxed);
}
