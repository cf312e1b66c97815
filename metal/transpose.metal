// transpose.metal -- 2-D transpose (tilegrad kernel 9).
//
// Host name transpose_2d: output[c, r] = input[r, c] (an exact copy).
//   buffer(0)  input   float[rows, cols]
//   buffer(1)  output  float[cols, rows]  (writes)
//   buffer(2)  params  uint[2] = {rows, cols}
// Grid: threadgroups = (ceil(cols / 32), ceil(rows / 32), 1),
//       threadgroup  = (32, 8, 1) threads.
// Each threadgroup stages one 32 x 32 tile through threadgroup memory (a
// padded row of 33 floats avoids bank conflicts on the transposed read), so
// both the global read and the global write are row-contiguous.
#include <metal_stdlib>
using namespace metal;

constant constexpr uint TILE = 32;  // tile edge
constant constexpr uint ROWS_PER_PASS = 8;  // threadgroup height

kernel void transpose_2d(
    const device float *input  [[buffer(0)]],
    device float       *output [[buffer(1)]],
    const device uint  *params [[buffer(2)]],
    uint2 tg  [[threadgroup_position_in_grid]],
    uint2 tid [[thread_position_in_threadgroup]]) {
  const uint rows = params[0];
  const uint cols = params[1];
  threadgroup float tile[TILE][TILE + 1];  // tile[r - r0][c - c0]

  // Read input rows r0..r0+31, columns c0..c0+31.
  const uint c0 = tg.x * TILE, r0 = tg.y * TILE;
  for (uint i = tid.y; i < TILE; i += ROWS_PER_PASS) {
    const uint r = r0 + i, c = c0 + tid.x;
    if (r < rows && c < cols) tile[i][tid.x] = input[(ulong)r * cols + c];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // Write output rows c0..c0+31 (= input columns), columns r0..r0+31.
  for (uint i = tid.y; i < TILE; i += ROWS_PER_PASS) {
    const uint c = c0 + i, r = r0 + tid.x;
    if (r < rows && c < cols) output[(ulong)c * rows + r] = tile[tid.x][i];
  }
}
