// rope.metal -- rotary position embedding, forward and backward (tilegrad
// kernel 12, HF transformers' apply_rotary_pos_emb on one of q, k).
//
// Host names and buffers (tilegrad.h's tg_rope_forward / tg_rope_backward):
//   rope_forward   x(0)  cos(1) sin(2) y(3)  params(4) = RopeParams (tg_rope_params)
//   rope_backward  dy(0) cos(1) sin(2) dx(3) params(4)   (x_* describe dy, y_* dx)
// x, y [B, H, L, D] through params' element strides (batch, head, row; D
// contiguous); cos, sin [B or 1, L, R] through theirs (batch stride 0 =
// broadcast). Elements are float or bfloat bits (ushort) per the params'
// dtypes (0 bf16, 1 f32), f32 arithmetic, one round-to-nearest-even to y.
// Grid: one thread per (k, l, b*H + h): threads_per_grid.x >= R/2 + (D - R),
// .y = L, .z = B*H (any threadgroup shape; threads past the ends return).
// Thread k < R/2 owns one rotated pair -- it reads both inputs before it
// writes both outputs, so y == x (in place, as the host API allows) is
// race-free -- and thread R/2 + m copies pass-through feature R + m.
//   rotate-half, h = R/2: y[k] = x[k] c[k] - x[k+h] s[k],
//                         y[k+h] = x[k+h] c[k+h] + x[k] s[k+h]
//   pairs: the same with (2k, 2k+1)
//   backward (the transpose): dx[k] = dy[k] c[k] + dy[k+h] s[k+h],
//                             dx[k+h] = dy[k+h] c[k+h] - dy[k] s[k]
#include <metal_stdlib>
using namespace metal;

struct RopeParams {
  int B, H, L, D;
  int rotary_dim;       // R: even, 2 <= R <= D
  int layout;           // 0 rotate-half, 1 interleaved pairs
  int x_dtype, y_dtype; // 0 bf16, 1 f32
  int table_dtype;
  uint flags;           // 0
  long x_strides[3], y_strides[3];  // batch, head, row
  long cos_strides[2], sin_strides[2];  // batch (0 = broadcast), row
};
static_assert(sizeof(RopeParams) == 120, "RopeParams is tg_rope_params, 120 bytes");
static_assert(__builtin_offsetof(RopeParams, x_strides) == 40, "RopeParams.x_strides");
static_assert(__builtin_offsetof(RopeParams, cos_strides) == 88, "RopeParams.cos_strides");

static inline float rope_load(const device uchar *p, int dtype, long i) {
  if (dtype == 1) return ((const device float *)p)[i];
  return as_type<float>(uint(((const device ushort *)p)[i]) << 16);
}

static inline ushort rope_bf16(float x) {  // nearest even, NaN -> 0x7FC0
  uint u = as_type<uint>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ushort(0x7FC0);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return ushort(u >> 16);
}

static inline void rope_store(device uchar *p, int dtype, long i, float v) {
  if (dtype == 1)
    ((device float *)p)[i] = v;
  else
    ((device ushort *)p)[i] = rope_bf16(v);
}

static inline void rope_thread(const device uchar *x, const device uchar *cs,
                               const device uchar *sn, device uchar *y,
                               const constant RopeParams &p, uint3 pos, bool backward) {
  const int h2 = p.rotary_dim / 2;
  const uint bh = pos.z, l = pos.y, k = pos.x;
  if (l >= uint(p.L) || bh >= uint(p.B * p.H) || k >= uint(h2 + p.D - p.rotary_dim)) return;
  const long b = bh / uint(p.H), h = bh % uint(p.H);
  const long xo = b * p.x_strides[0] + h * p.x_strides[1] + long(l) * p.x_strides[2];
  const long yo = b * p.y_strides[0] + h * p.y_strides[1] + long(l) * p.y_strides[2];
  if (k >= uint(h2)) {  // pass-through feature
    const long j = p.rotary_dim + long(k - h2);
    rope_store(y, p.y_dtype, yo + j, rope_load(x, p.x_dtype, xo + j));
    return;
  }
  const long co = b * p.cos_strides[0] + long(l) * p.cos_strides[1];
  const long so = b * p.sin_strides[0] + long(l) * p.sin_strides[1];
  const long i0 = p.layout == 0 ? long(k) : 2 * long(k);  // the pair (i0, i1)
  const long i1 = p.layout == 0 ? long(k) + h2 : 2 * long(k) + 1;
  const float x0 = rope_load(x, p.x_dtype, xo + i0), x1 = rope_load(x, p.x_dtype, xo + i1);
  const float c0 = rope_load(cs, p.table_dtype, co + i0), c1 = rope_load(cs, p.table_dtype, co + i1);
  const float s0 = rope_load(sn, p.table_dtype, so + i0), s1 = rope_load(sn, p.table_dtype, so + i1);
  float y0, y1;
  if (!backward) {
    y0 = x0 * c0 - x1 * s0;
    y1 = x1 * c1 + x0 * s1;
  } else {
    y0 = x0 * c0 + x1 * s1;
    y1 = x1 * c1 - x0 * s0;
  }
  rope_store(y, p.y_dtype, yo + i0, y0);
  rope_store(y, p.y_dtype, yo + i1, y1);
}

kernel void rope_forward(const device uchar *x [[buffer(0)]], const device uchar *cs [[buffer(1)]],
                         const device uchar *sn [[buffer(2)]], device uchar *y [[buffer(3)]],
                         const constant RopeParams *pp [[buffer(4)]],
                         uint3 pos [[thread_position_in_grid]]) {
  const constant RopeParams &p = *pp;
  rope_thread(x, cs, sn, y, p, pos, false);
}

kernel void rope_backward(const device uchar *dy [[buffer(0)]], const device uchar *cs [[buffer(1)]],
                          const device uchar *sn [[buffer(2)]], device uchar *dx [[buffer(3)]],
                          const constant RopeParams *pp [[buffer(4)]],
                          uint3 pos [[thread_position_in_grid]]) {
  const constant RopeParams &p = *pp;
  rope_thread(dy, cs, sn, dx, p, pos, true);
}
