/*
 * metal_shim.h -- the Metal Shading Language surface that tilegrad's .metal
 * twins use, as C++17 for clang++ (Debian), so the twins compile and run on
 * Linux under the threadgroup simulator (metal_sim.h).
 *
 * What lives here (no keyword macros: those are in metal_shim_keywords.h,
 * which <metal_stdlib> pulls in, and metal_shim_end.h removes them again):
 *   - scalar types uint/ushort/uchar, `half` and `bfloat` (storage structs
 *     with round-to-nearest-even conversions), vectors via clang's
 *     ext_vector_type (float2..4, uint2..4, ...; swizzles work, multi-argument
 *     constructors such as float4(a,b,c,d) do not -- see metal/README.md);
 *   - namespace metal: math (exp, log, rsqrt, tanh, max, ... with precise::
 *     and fast:: aliases), as_type<>, numeric_limits, mem_flags,
 *     threadgroup_barrier, simdgroup_barrier, simd_sum/max/min,
 *     simd_shuffle/_xor/_down, simd_broadcast, simd_any/all, and
 *     atomic_fetch_add_explicit & co. on atomic_float / atomic_uint /
 *     atomic_int with real host atomics;
 *   - the hooks the simulator implements (mtl_sim::barrier, simd_exchange,
 *     the kernel-argument proxies).
 */
#ifndef TG_METAL_SHIM_H
#define TG_METAL_SHIM_H

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

/* ---- scalar and vector types ------------------------------------------ */
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;

#define MTL_SHIM_VECTORS(T, name)                                  \
  typedef T name##2 __attribute__((ext_vector_type(2)));           \
  typedef T name##3 __attribute__((ext_vector_type(3)));           \
  typedef T name##4 __attribute__((ext_vector_type(4)));
MTL_SHIM_VECTORS(float, float)
MTL_SHIM_VECTORS(int, int)
MTL_SHIM_VECTORS(uint, uint)
MTL_SHIM_VECTORS(short, short)
MTL_SHIM_VECTORS(ushort, ushort)
MTL_SHIM_VECTORS(char, char)
MTL_SHIM_VECTORS(uchar, uchar)
#undef MTL_SHIM_VECTORS

namespace mtl_shim_detail {
inline uint32_t f2u(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float u2f(uint32_t u) { return __builtin_bit_cast(float, u); }
}  // namespace mtl_shim_detail

/* bfloat (Metal 3.1): 16-bit storage, float arithmetic. Narrowing rounds to
 * nearest even; NaN stays a (quiet) NaN. */
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  bfloat(float f) {
    uint32_t u = mtl_shim_detail::f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
      bits = (uint16_t)((u >> 16) | 0x40u);
      return;
    }
    u += 0x7FFFu + ((u >> 16) & 1u);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const { return mtl_shim_detail::u2f((uint32_t)bits << 16); }
};

/* half: IEEE binary16 storage, float arithmetic, round to nearest even. */
struct half {
  uint16_t bits;
  half() = default;
  half(float f) {
    const uint32_t u = mtl_shim_detail::f2u(f), sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) { bits = (uint16_t)(sign | 0x7E00u); return; }
    if (a >= 0x477FF000u) { bits = (uint16_t)(sign | 0x7C00u); return; } /* rounds to inf */
    if (a < 0x38800000u) { /* subnormal half (or zero): scale to an integer, RNE */
      const float m = mtl_shim_detail::u2f(a) * 16777216.0f; /* 2^24 = 1/min subnormal */
      bits = (uint16_t)(sign | (uint32_t)std::nearbyint(m));
      return;
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 (<< 13) */
    r += 0xFFFu + ((r >> 13) & 1u);
    bits = (uint16_t)(sign | (r >> 13));
  }
  operator float() const {
    const uint32_t sign = (uint32_t)(bits & 0x8000u) << 16, e = (bits >> 10) & 0x1F,
                   m = bits & 0x3FFu;
    if (e == 0) {
      const float v = (float)m * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
    if (e == 31) return mtl_shim_detail::u2f(sign | 0x7F800000u | (m << 13));
    return mtl_shim_detail::u2f(sign | ((e + 112) << 23) | (m << 13));
  }
};

/* ---- simulator hooks (implemented in metal_sim.h) ---------------------- */
namespace mtl_sim {
/* combine(in, out, extra, present): the last lane of a simdgroup to arrive
 * at a simd operation computes every lane's result. Slots are 32 bytes. */
typedef unsigned char Slot[32];
typedef void (*combine_fn)(const Slot *in, Slot *out, const uint32_t *extra, uint32_t present);
void simd_exchange(const void *in, size_t size, uint32_t extra, combine_fn fn, void *out);
void barrier();
[[noreturn]] void fail(const char *fmt, ...);
}  // namespace mtl_sim

/* ---- namespace metal ----------------------------------------------------- */
namespace metal {
using std::numeric_limits;

enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) {
  return (mem_flags)((unsigned)a | (unsigned)b);
}
inline void threadgroup_barrier(mem_flags) { mtl_sim::barrier(); }

template <class To, class From>
inline To as_type(From f) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  return __builtin_bit_cast(To, f);
}

/* math: float scalars, plus elementwise float2/3/4 for the common ones. The
 * simulator evaluates with glibc (correctly rounded or within 1 ulp); Metal's
 * default (fast) math may differ by a few ulps: see metal/README.md. */
#define MTL_SHIM_UNARY(name, expr)                                        \
  inline float name(float x) { return expr; }                             \
  inline float2 name(float2 v) { return float2{name(v.x), name(v.y)}; }   \
  inline float3 name(float3 v) { return float3{name(v.x), name(v.y), name(v.z)}; } \
  inline float4 name(float4 v) { return float4{name(v.x), name(v.y), name(v.z), name(v.w)}; }
MTL_SHIM_UNARY(exp, std::exp(x))
MTL_SHIM_UNARY(exp2, std::exp2(x))
MTL_SHIM_UNARY(log, std::log(x))
MTL_SHIM_UNARY(log2, std::log2(x))
MTL_SHIM_UNARY(sqrt, std::sqrt(x))
MTL_SHIM_UNARY(rsqrt, 1.0f / std::sqrt(x))
MTL_SHIM_UNARY(tanh, std::tanh(x))
MTL_SHIM_UNARY(fabs, std::fabs(x))
MTL_SHIM_UNARY(abs, std::fabs(x))
MTL_SHIM_UNARY(floor, std::floor(x))
MTL_SHIM_UNARY(ceil, std::ceil(x))
MTL_SHIM_UNARY(trunc, std::trunc(x))
MTL_SHIM_UNARY(round, std::round(x))
#undef MTL_SHIM_UNARY

#define MTL_SHIM_BINARY(name, expr)                                                 \
  inline float name(float x, float y) { return expr; }                              \
  inline float2 name(float2 a, float2 b) { return float2{name(a.x, b.x), name(a.y, b.y)}; } \
  inline float4 name(float4 a, float4 b) {                                          \
    return float4{name(a.x, b.x), name(a.y, b.y), name(a.z, b.z), name(a.w, b.w)};  \
  }
MTL_SHIM_BINARY(fmax, std::fmax(x, y))
MTL_SHIM_BINARY(fmin, std::fmin(x, y))
MTL_SHIM_BINARY(max, std::fmax(x, y))
MTL_SHIM_BINARY(min, std::fmin(x, y))
MTL_SHIM_BINARY(pow, std::pow(x, y))
MTL_SHIM_BINARY(divide, x / y)
#undef MTL_SHIM_BINARY
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float clamp(float x, float lo, float hi) { return fmin(fmax(x, lo), hi); }
inline float select(float a, float b, bool c) { return c ? b : a; }
inline bool isinf(float x) { return std::isinf(x); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isfinite(float x) { return std::isfinite(x); }
inline bool signbit(float x) { return std::signbit(x); }
inline float copysign(float x, float y) { return std::copysign(x, y); }
/* integer min/max/clamp */
template <class T, class = typename std::enable_if<std::is_integral<T>::value>::type>
inline T max(T a, T b) { return a > b ? a : b; }
template <class T, class = typename std::enable_if<std::is_integral<T>::value>::type>
inline T min(T a, T b) { return a < b ? a : b; }
template <class T, class = typename std::enable_if<std::is_integral<T>::value>::type>
inline T clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }

namespace precise {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
using metal::rsqrt; using metal::tanh; using metal::divide; using metal::pow;
using metal::max; using metal::min; using metal::fabs;
}  // namespace precise
namespace fast {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
using metal::rsqrt; using metal::tanh; using metal::divide; using metal::pow;
using metal::max; using metal::min; using metal::fabs;
}  // namespace fast

/* ---- simd-group functions: 32 lanes, evaluated by the simulator --------- */
namespace simd_detail {
template <class T> inline T load(const mtl_sim::Slot s) { T v; std::memcpy(&v, s, sizeof v); return v; }
template <class T> inline void store(mtl_sim::Slot s, T v) { std::memcpy(s, &v, sizeof v); }
inline bool has(uint32_t present, int lane) { return (present >> lane) & 1u; }

/* butterfly tree over 32 lanes (absent lanes hold the identity): every lane
 * gets bitwise the same result, as on the GPU. */
template <class T, class Op>
inline void tree(const mtl_sim::Slot *in, mtl_sim::Slot *out, uint32_t present, T ident, Op op) {
  T v[32];
  for (int i = 0; i < 32; i++) v[i] = has(present, i) ? load<T>(in[i]) : ident;
  for (int off = 16; off > 0; off >>= 1) {
    T w[32];
    for (int i = 0; i < 32; i++) w[i] = op(v[i], v[i ^ off]);
    for (int i = 0; i < 32; i++) v[i] = w[i];
  }
  for (int i = 0; i < 32; i++) store<T>(out[i], v[i]);
}
template <class T> void c_sum(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *, uint32_t p) {
  tree<T>(in, out, p, T(0), [](T a, T b) { return a + b; });
}
template <class T> void c_max(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *, uint32_t p) {
  tree<T>(in, out, p, std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::lowest(),
          [](T a, T b) { return b > a ? b : a; });
}
template <class T> void c_min(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *, uint32_t p) {
  tree<T>(in, out, p, std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::max(),
          [](T a, T b) { return b < a ? b : a; });
}
/* out[i] = in[src(i)] where src comes from extra[] (already resolved by the caller's op) */
template <class T> void c_shuffle(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *x, uint32_t p) {
  for (int i = 0; i < 32; i++) {
    if (!has(p, i)) continue;
    const int src = (int)(x[i] & 31u);
    std::memcpy(out[i], in[has(p, src) ? src : i], sizeof(T));
  }
}
template <class T> void c_shuffle_xor(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *x, uint32_t p) {
  for (int i = 0; i < 32; i++) {
    if (!has(p, i)) continue;
    const int src = i ^ (int)(x[i] & 31u);
    std::memcpy(out[i], in[has(p, src) ? src : i], sizeof(T));
  }
}
template <class T> void c_shuffle_down(const mtl_sim::Slot *in, mtl_sim::Slot *out, const uint32_t *x, uint32_t p) {
  for (int i = 0; i < 32; i++) {
    if (!has(p, i)) continue;
    const int src = i + (int)x[i];
    std::memcpy(out[i], in[src < 32 && has(p, src) ? src : i], sizeof(T));
  }
}
template <class T> inline T run(T v, uint32_t extra, mtl_sim::combine_fn fn) {
  static_assert(sizeof(T) <= sizeof(mtl_sim::Slot), "simd value too large");
  T r;
  mtl_sim::simd_exchange(&v, sizeof v, extra, fn, &r);
  return r;
}
}  // namespace simd_detail

template <class T> inline T simd_sum(T v) { return simd_detail::run(v, 0, &simd_detail::c_sum<T>); }
template <class T> inline T simd_max(T v) { return simd_detail::run(v, 0, &simd_detail::c_max<T>); }
template <class T> inline T simd_min(T v) { return simd_detail::run(v, 0, &simd_detail::c_min<T>); }
template <class T> inline T simd_shuffle(T v, ushort lane) {
  return simd_detail::run(v, lane, &simd_detail::c_shuffle<T>);
}
template <class T> inline T simd_broadcast(T v, ushort lane) {
  return simd_detail::run(v, lane, &simd_detail::c_shuffle<T>);
}
template <class T> inline T simd_shuffle_xor(T v, ushort mask) {
  return simd_detail::run(v, mask, &simd_detail::c_shuffle_xor<T>);
}
template <class T> inline T simd_shuffle_down(T v, ushort delta) {
  return simd_detail::run(v, delta, &simd_detail::c_shuffle_down<T>);
}
inline bool simd_any(bool b) { return simd_max<uint>(b ? 1u : 0u) != 0; }
inline bool simd_all(bool b) { return simd_min<uint>(b ? 1u : 0u) != 0; }
inline void simdgroup_barrier(mem_flags) { (void)simd_sum<uint>(0); }

/* ---- atomics (device or threadgroup memory: the same host atomics) ------ */
typedef enum {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST
} memory_order;
struct atomic_float { float v; };
struct atomic_uint { uint v; };
struct atomic_int { int v; };

inline float atomic_fetch_add_explicit(atomic_float *a, float x, memory_order) {
  uint32_t *p = reinterpret_cast<uint32_t *>(&a->v);
  uint32_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    const uint32_t nw = mtl_shim_detail::f2u(mtl_shim_detail::u2f(old) + x);
    if (__atomic_compare_exchange_n(p, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return mtl_shim_detail::u2f(old);
  }
}
inline float atomic_load_explicit(const atomic_float *a, memory_order) {
  return mtl_shim_detail::u2f(__atomic_load_n(reinterpret_cast<const uint32_t *>(&a->v), __ATOMIC_RELAXED));
}
inline void atomic_store_explicit(atomic_float *a, float x, memory_order) {
  __atomic_store_n(reinterpret_cast<uint32_t *>(&a->v), mtl_shim_detail::f2u(x), __ATOMIC_RELAXED);
}
inline float atomic_exchange_explicit(atomic_float *a, float x, memory_order) {
  return mtl_shim_detail::u2f(__atomic_exchange_n(reinterpret_cast<uint32_t *>(&a->v),
                                                  mtl_shim_detail::f2u(x), __ATOMIC_RELAXED));
}
#define MTL_SHIM_INT_ATOMICS(A, T)                                                        \
  inline T atomic_fetch_add_explicit(A *a, T x, memory_order) { return __atomic_fetch_add(&a->v, x, __ATOMIC_RELAXED); } \
  inline T atomic_fetch_sub_explicit(A *a, T x, memory_order) { return __atomic_fetch_sub(&a->v, x, __ATOMIC_RELAXED); } \
  inline T atomic_fetch_or_explicit(A *a, T x, memory_order) { return __atomic_fetch_or(&a->v, x, __ATOMIC_RELAXED); }   \
  inline T atomic_fetch_and_explicit(A *a, T x, memory_order) { return __atomic_fetch_and(&a->v, x, __ATOMIC_RELAXED); } \
  inline T atomic_fetch_max_explicit(A *a, T x, memory_order) {                           \
    T old = __atomic_load_n(&a->v, __ATOMIC_RELAXED);                                     \
    while (old < x && !__atomic_compare_exchange_n(&a->v, &old, x, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return old;                                                                           \
  }                                                                                       \
  inline T atomic_fetch_min_explicit(A *a, T x, memory_order) {                           \
    T old = __atomic_load_n(&a->v, __ATOMIC_RELAXED);                                     \
    while (old > x && !__atomic_compare_exchange_n(&a->v, &old, x, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return old;                                                                           \
  }                                                                                       \
  inline T atomic_load_explicit(const A *a, memory_order) { return __atomic_load_n(&a->v, __ATOMIC_RELAXED); } \
  inline void atomic_store_explicit(A *a, T x, memory_order) { __atomic_store_n(&a->v, x, __ATOMIC_RELAXED); } \
  inline T atomic_exchange_explicit(A *a, T x, memory_order) { return __atomic_exchange_n(&a->v, x, __ATOMIC_RELAXED); } \
  inline bool atomic_compare_exchange_weak_explicit(A *a, T *expected, T desired, memory_order, memory_order) { \
    return __atomic_compare_exchange_n(&a->v, expected, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
  }
MTL_SHIM_INT_ATOMICS(atomic_uint, uint)
MTL_SHIM_INT_ATOMICS(atomic_int, int)
#undef MTL_SHIM_INT_ATOMICS
}  // namespace metal

#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif

#endif /* TG_METAL_SHIM_H */
