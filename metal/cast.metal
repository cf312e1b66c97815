// cast.metal -- f32 -> bf16 elementwise cast (tilegrad kernel 3).
//
// Host name f32_to_bf16_cast.
//   buffer(0)  src     float[n]
//   buffer(1)  dst     bf16[n]  (raw bits as ushort; writes)
//   buffer(2)  n       uint     (element count, guards the tail)
// Grid: threadgroups = ceil(n / 256), threadgroup = 256 threads (any size
// works: one thread per element, tid = thread_position_in_grid).
//
// Rounding is tilegrad's contract, done with integer ops so it does not
// depend on the GPU's native bfloat conversion: round to nearest even, any
// NaN -> 0x7FC0, +-Inf stay +-Inf, finite values past the bf16 range -> +-Inf.
#include <metal_stdlib>
using namespace metal;

static inline ushort tg_float_to_bf16(float x) {
  uint u = as_type<uint>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ushort(0x7FC0);  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);                               // RNE
  return ushort(u >> 16);
}

kernel void f32_to_bf16_cast(
    const device float *src   [[buffer(0)]],
    device ushort      *dst   [[buffer(1)]],
    const constant uint *n    [[buffer(2)]],
    uint tid                  [[thread_position_in_grid]]) {
  if (tid < *n) dst[tid] = tg_float_to_bf16(src[tid]);
}
