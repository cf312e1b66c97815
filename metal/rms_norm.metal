// rms_norm.metal -- RMSNorm backward (tilegrad kernels 4 and 5), f32.
//
//   r[b]     = 1 / sqrt(mean_j x[b,j]^2 + eps)
//   s[b]     = sum_i dy[b,i] * x[b,i] * w[i]
//   dx[b,k]  = r[b] * (dy[b,k] * w[k] - x[b,k] * s[b] * r[b]^2 / dim)
//   dw[i]    = sum_b dy[b,i] * x[b,i] * r[b]
// x, dy, dx are [rows, dim] row-major; w, dw [dim]; r [rows].
//
// Host names and buffers (the seeds' ABI; params are float/uint arrays):
//   rms_norm_compute_rms_inv_f32  x(0) r_out(1) params(2) = float[2]{eps, dim}
//   rms_norm_backward_dx_f32      x(0) w(1) dy(2) r(3) dx(4) params(5) = float[2]{dim, 0}
//   rms_norm_backward_dw_f32      x(0) dy(1) r(2) dw(3) params(4) = float[2]{dim, rows}
//       these three also take threadgroup(0) memory of tg_size floats
//       (only ceil(tg_size/32) are used);
//       grid: one threadgroup per row (rms_inv, dx) or per feature (dw);
//       threadgroup: any size <= 1024 (256 is a good choice).
//   rms_norm_backward (fused)     input(0) weight(1) grad_out(2) grad_input(3)
//       grad_weight(4) (atomic f32, accumulates) params(5) = uint[3]{n_groups,
//       dim, as_type<uint>(eps)}; one threadgroup per row, <= 1024 threads.
// dim and rows travel as floats in the split kernels (as in the seed): exact
// up to 2^24.
//
// Row sums: each thread strides over the row, simd_sum folds a simdgroup,
// one partial per simdgroup goes through threadgroup memory and every
// simdgroup folds those again, so every thread ends with the same total.
// r uses precise sqrt and division (the contract's two correctly rounded
// operations), not the fast rsqrt.
#include <metal_stdlib>
using namespace metal;

// Sum of v over the threadgroup; scratch needs ceil(tg_size / 32) floats.
static inline float tg_sum(float v, threadgroup float *scratch, uint tid, uint tg_size) {
  v = simd_sum(v);
  const uint lane = tid % 32, sg = tid / 32, n_sg = (tg_size + 31) / 32;
  threadgroup_barrier(mem_flags::mem_threadgroup);  // scratch may hold a previous sum
  if (lane == 0) scratch[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_sum(lane < n_sg ? scratch[lane] : 0.0f);
}

static inline float rms_inv(float sum_sq, uint dim, float eps) {
  return precise::divide(1.0f, precise::sqrt(sum_sq / float(dim) + eps));
}

kernel void rms_norm_compute_rms_inv_f32(
    const device float *x       [[buffer(0)]],
    device float       *r_out   [[buffer(1)]],
    const device float *params  [[buffer(2)]],
    threadgroup float  *scratch [[threadgroup(0)]],
    uint row     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const float eps = params[0];
  const uint dim = uint(params[1]);
  const device float *xr = x + (ulong)row * dim;
  float acc = 0.0f;
  for (uint j = tid; j < dim; j += tg_size) acc += xr[j] * xr[j];
  const float sum_sq = tg_sum(acc, scratch, tid, tg_size);
  if (tid == 0) r_out[row] = rms_inv(sum_sq, dim, eps);
}

kernel void rms_norm_backward_dx_f32(
    const device float *x       [[buffer(0)]],
    const device float *w       [[buffer(1)]],
    const device float *dy      [[buffer(2)]],
    const device float *r       [[buffer(3)]],
    device float       *dx      [[buffer(4)]],
    const device float *params  [[buffer(5)]],
    threadgroup float  *scratch [[threadgroup(0)]],
    uint row     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const uint dim = uint(params[0]);
  const ulong base = (ulong)row * dim;
  float acc = 0.0f;
  for (uint i = tid; i < dim; i += tg_size) acc += dy[base + i] * x[base + i] * w[i];
  const float s = tg_sum(acc, scratch, tid, tg_size);
  const float rb = r[row];
  const float coeff = s * rb * rb / float(dim);
  for (uint k = tid; k < dim; k += tg_size)
    dx[base + k] = rb * (dy[base + k] * w[k] - x[base + k] * coeff);
}

kernel void rms_norm_backward_dw_f32(
    const device float *x       [[buffer(0)]],
    const device float *dy      [[buffer(1)]],
    const device float *r       [[buffer(2)]],
    device float       *dw      [[buffer(3)]],
    const device float *params  [[buffer(4)]],
    threadgroup float  *scratch [[threadgroup(0)]],
    uint feat    [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const uint dim = uint(params[0]);
  const uint rows = uint(params[1]);
  float acc = 0.0f;
  for (uint b = tid; b < rows; b += tg_size) {
    const ulong o = (ulong)b * dim + feat;
    acc += dy[o] * x[o] * r[b];
  }
  const float total = tg_sum(acc, scratch, tid, tg_size);
  if (tid == 0) dw[feat] = total;
}

kernel void rms_norm_backward(
    const device float *input        [[buffer(0)]],
    const device float *weight       [[buffer(1)]],
    const device float *grad_out     [[buffer(2)]],
    device float       *grad_input   [[buffer(3)]],
    device atomic_float *grad_weight [[buffer(4)]],
    const device uint  *params       [[buffer(5)]],
    uint row     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const uint n_groups = params[0];
  const uint dim = params[1];
  const float eps = as_type<float>(params[2]);
  threadgroup float scratch[32];  // one partial per simdgroup
  if (row >= n_groups) return;    // uniform for the whole threadgroup
  const ulong base = (ulong)row * dim;
  const device float *x = input + base;
  const device float *dy = grad_out + base;

  float sq = 0.0f, sdot = 0.0f;
  for (uint i = tid; i < dim; i += tg_size) {
    sq += x[i] * x[i];
    sdot += dy[i] * x[i] * weight[i];
  }
  const float r = rms_inv(tg_sum(sq, scratch, tid, tg_size), dim, eps);
  const float s = tg_sum(sdot, scratch, tid, tg_size);
  const float coeff = s * r * r / float(dim);
  for (uint i = tid; i < dim; i += tg_size) {
    grad_input[base + i] = r * (dy[i] * weight[i] - x[i] * coeff);
    atomic_fetch_add_explicit(&grad_weight[i], x[i] * r * dy[i], memory_order_relaxed);
  }
}
