// glu.metal -- gated linear units, SwiGLU / GeGLU (tilegrad kernel 13).
//
// Host names and buffers (tilegrad.h's tg_glu_forward / tg_glu_backward, in
// their argument order; the scalars travel in one GluParams):
//   glu_forward   gate(0) up(1) y(2) params(3)
//   glu_backward  gate(0) up(1) dy(2) dgate(3) dup(4) params(5)
// [rows, cols] row-major through GluParams' row strides (elements); float or
// bfloat bits (ushort) per dtype (0 bf16, 1 f32), f32 arithmetic, one
// round-to-nearest-even per output. act 0 silu, 1 gelu_tanh:
//   silu(g) = g S(g);  gelu_tanh(g) = g S(z), z = 2 sqrt(2/pi) (g + 0.044715 g^3)
//   (0.5 (1 + tanh(z/2)) = S(z), S the sigmoid)
//   y = act(gate) up;  dgate = dy up act'(gate);  dup = dy act(gate)
// S and 1 - S come from e = exp(-|z|) <= 1 (no overflow, no cancellation,
// as the C row ops); +-inf gates take the functions' limits.
// Grid: one thread per element, threads_per_grid.x >= cols, .y = rows.
// Each thread reads its element of every input before it writes, so the
// in-place cases the host API allows (y over gate or up, dgate over gate,
// dup over up) are race-free.
#include <metal_stdlib>
using namespace metal;

struct GluParams {
  uint rows, cols;
  int act, dtype;
  long gate_stride, up_stride, y_stride;  // y_stride: y (forward) or dy (backward)
  long dgate_stride, dup_stride;          // backward only
};

static inline float glu_load(const device uchar *p, int dtype, long i) {
  if (dtype == 1) return ((const device float *)p)[i];
  return as_type<float>(uint(((const device ushort *)p)[i]) << 16);
}

static inline void glu_store(device uchar *p, int dtype, long i, float v) {
  if (dtype == 1) {
    ((device float *)p)[i] = v;
    return;
  }
  uint u = as_type<uint>(v);
  u = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : u + 0x7FFFu + ((u >> 16) & 1u);
  ((device ushort *)p)[i] = ushort(u >> 16);
}

struct GluAct {
  float a, da;  // act(g), act'(g)
};

static inline GluAct glu_act(float g, int act) {
  const float z = act == 0 ? g : 1.59576912f * (g + 0.044715f * (g * g * g));
  const float e = precise::exp(-fabs(z)), r = 1.0f / (1.0f + e), er = e * r;
  const float S = z >= 0.0f ? r : er, Sc = z >= 0.0f ? er : r;
  GluAct o;
  o.a = S == 0.0f ? -0.0f : g * S;
  if (act == 0) {
    const float gsc = Sc == 0.0f ? 0.0f : g * Sc;
    o.da = S == 0.0f ? -0.0f : S * (1.0f + gsc);
  } else {  // past |g| = 64 S (1 - S) is exactly 0: clamp g there (no 0 * inf)
    const float gc = g > 64.0f ? 64.0f : g < -64.0f ? -64.0f : g;
    o.da = S + (gc * (S * Sc)) * (1.59576912f * (1.0f + 0.134145f * (gc * gc)));
  }
  return o;
}

kernel void glu_forward(const device uchar *gate [[buffer(0)]], const device uchar *up [[buffer(1)]],
                        device uchar *y [[buffer(2)]], const constant GluParams *pp [[buffer(3)]],
                        uint2 pos [[thread_position_in_grid]]) {
  const constant GluParams &p = *pp;
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  const long r = pos.y, c = pos.x;
  const float g = glu_load(gate, p.dtype, r * p.gate_stride + c);
  const float u = glu_load(up, p.dtype, r * p.up_stride + c);
  glu_store(y, p.dtype, r * p.y_stride + c, glu_act(g, p.act).a * u);
}

kernel void glu_backward(const device uchar *gate [[buffer(0)]], const device uchar *up [[buffer(1)]],
                         const device uchar *dy [[buffer(2)]], device uchar *dgate [[buffer(3)]],
                         device uchar *dup [[buffer(4)]], const constant GluParams *pp [[buffer(5)]],
                         uint2 pos [[thread_position_in_grid]]) {
  const constant GluParams &p = *pp;
  if (pos.x >= p.cols || pos.y >= p.rows) return;
  const long r = pos.y, c = pos.x;
  const float g = glu_load(gate, p.dtype, r * p.gate_stride + c);
  const float u = glu_load(up, p.dtype, r * p.up_stride + c);
  const float d = glu_load(dy, p.dtype, r * p.y_stride + c);
  const GluAct f = glu_act(g, p.act);
  glu_store(dup, p.dtype, r * p.dup_stride + c, d * f.a);
  glu_store(dgate, p.dtype, r * p.dgate_stride + c, (d * u) * f.da);
}
