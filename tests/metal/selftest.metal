// selftest.metal -- small kernels that pin down the simulator's semantics
// (not a twin; compiled and run only by test_metal_sim_selftest.cpp).
#include <metal_stdlib>
using namespace metal;

constant bool fc_flag [[function_constant(7)]];
constant int fc_value [[function_constant(8)]];
constant bool fc_optional [[function_constant(9)]];  // may be left unset: false
constant bool fc_optional_on = is_function_constant_defined(fc_optional) && fc_optional;

// out[g*n + t] = in[g*n + (n-1-t)]: needs the barrier between write and read.
kernel void st_reverse(const device float *in [[buffer(0)]],
                       device float *out [[buffer(1)]],
                       uint t [[thread_index_in_threadgroup]],
                       uint g [[threadgroup_position_in_grid]],
                       uint n [[threads_per_threadgroup]]) {
  threadgroup float buf[1024];
  buf[t] = in[g * n + t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[g * n + t] = buf[n - 1 - t];
}

// The same without the barrier: a data race the shuffled scheduler exposes.
kernel void st_reverse_racy(const device float *in [[buffer(0)]],
                            device float *out [[buffer(1)]],
                            uint t [[thread_index_in_threadgroup]],
                            uint g [[threadgroup_position_in_grid]],
                            uint n [[threads_per_threadgroup]]) {
  threadgroup float buf[1024];
  buf[t] = in[g * n + t];
  out[g * n + t] = buf[n - 1 - t];
}

// Per-thread results of the simd functions: out[t*6 + k].
kernel void st_simd(const device float *in [[buffer(0)]],
                    device float *out [[buffer(1)]],
                    uint t [[thread_index_in_threadgroup]],
                    ushort lane [[thread_index_in_simdgroup]],
                    ushort sg [[simdgroup_index_in_threadgroup]]) {
  const float v = in[t];
  out[t * 6 + 0] = simd_sum(v);
  out[t * 6 + 1] = simd_max(v);
  out[t * 6 + 2] = simd_min(v);
  out[t * 6 + 3] = simd_shuffle_xor(v, ushort(5));
  out[t * 6 + 4] = simd_broadcast(v, ushort(3));
  out[t * 6 + 5] = float(sg * 100 + lane);
}

// Every thread of every threadgroup adds to two device atomics.
kernel void st_atomics(device atomic_uint *count [[buffer(0)]],
                       device atomic_float *sum [[buffer(1)]],
                       uint gid [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(count, 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(sum, 0.5f, memory_order_relaxed);
  (void)gid;
}

// A barrier inside a branch only some threads take (undefined on a GPU).
kernel void st_divergent_barrier(device float *out [[buffer(0)]],
                                 uint t [[thread_index_in_threadgroup]]) {
  if (t < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = 1.0f;
}

// An early return before a barrier the others reach.
kernel void st_early_return(device float *out [[buffer(0)]],
                            uint t [[thread_index_in_threadgroup]]) {
  if (t == 3) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = 1.0f;
}

// A simd_sum only half the simdgroup executes.
kernel void st_divergent_simd(device float *out [[buffer(0)]],
                              uint t [[thread_index_in_threadgroup]]) {
  float v = 1.0f;
  if (t % 32 < 16) v = simd_sum(v);
  out[t] = v;
}

// Function constants and dynamic threadgroup memory ([[threadgroup(0)]]).
kernel void st_fc_dyn(device int *out [[buffer(0)]],
                      threadgroup int *scratch [[threadgroup(0)]],
                      uint t [[thread_index_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
  scratch[t] = fc_flag ? fc_value + int(t) : -1;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = scratch[(t + 1) % n];
}

// An optional function constant through a derived program-scope constant.
kernel void st_fc_optional(device int *out [[buffer(0)]],
                           uint t [[thread_index_in_threadgroup]]) {
  out[t] = fc_optional_on ? 1 : 0;
}

// More threadgroup memory than Metal allows (32 KiB).
kernel void st_too_much_tgmem(device float *out [[buffer(0)]],
                              uint t [[thread_index_in_threadgroup]]) {
  threadgroup float a[6000];
  threadgroup float b[6000];
  a[t] = 1.0f;
  b[t] = 2.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = a[t] + b[t];
}
