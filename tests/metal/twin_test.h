/*
 * twin_test.h -- helpers shared by the Metal-twin tests: a seeded RNG,
 * guard-paged buffers (reading or writing one element past the end of a
 * buffer faults, like an out-of-bounds GPU access would corrupt), the C
 * engine context, and tolerance checks that print the worst element.
 *
 * Tolerance convention: each check passes iff for every element
 *     |metal - c| <= bound[i]      (and both are NaN, or neither is)
 * where the test derives bound[i] from the standard rounding-error bounds
 * (u = 2^-24, gamma_n = n u / (1 - n u)); see metal/README.md.
 */
#ifndef TG_TWIN_TEST_H
#define TG_TWIN_TEST_H

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "metal_sim.h"
#include "tilegrad.h"

namespace tt {

static const double U = 0x1p-24;
inline double gam(double n) { return n * U / (1 - n * U); }

/* ---- RNG (splitmix64), seed from TG_TEST_SEED or fixed ----------------- */
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uni(double lo, double hi) { return lo + (hi - lo) * (double)(next() >> 11) * 0x1p-53; }
  int range(int lo, int hi) { return lo + (int)(next() % (uint64_t)(hi - lo + 1)); }
};
inline uint64_t seed() {
  static uint64_t s = [] {
    const char *e = getenv("TG_TEST_SEED");
    uint64_t v = e ? strtoull(e, nullptr, 0) : 20240611ull;
    std::printf("seed %llu (TG_TEST_SEED to replay)\n", (unsigned long long)v);
    return v;
  }();
  return s;
}

/* ---- guard-paged buffers: the data ends exactly at a PROT_NONE page ------ */
template <class T>
struct Buf {
  T *p = nullptr;
  size_t n = 0;
  void *base = nullptr;
  size_t map_bytes = 0;
  explicit Buf(size_t count = 0) { alloc(count); }
  Buf(const Buf &) = delete;
  Buf &operator=(const Buf &) = delete;
  ~Buf() { release(); }
  void release() {
    if (base) munmap(base, map_bytes);
    base = nullptr;
    p = nullptr;
  }
  void alloc(size_t count) {
    release();
    n = count;
    const size_t pg = (size_t)getpagesize();
    const size_t bytes = count * sizeof(T);
    const size_t data_pages = (bytes + pg - 1) / pg + 1;
    map_bytes = (data_pages + 1) * pg;
    base = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { std::perror("mmap"); std::abort(); }
    char *guard = (char *)base + data_pages * pg;
    mprotect(guard, pg, PROT_NONE);
    /* exactly end-aligned: the first byte past the data faults (the start is
     * aligned to sizeof(T), and to 16 bytes whenever the size is a multiple) */
    p = (T *)(guard - bytes);
    std::memset((void *)p, 0xFF, bytes); /* poison */
  }
  T &operator[](size_t i) { return p[i]; }
  const T &operator[](size_t i) const { return p[i]; }
  T *data() { return p; }
  void fill(T v) { for (size_t i = 0; i < n; i++) p[i] = v; }
  void copy_from(const Buf &o) { std::memcpy((void *)p, o.p, n * sizeof(T)); }
};

inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void fill_uniform(Rng &r, Buf<float> &b, double lo, double hi) {
  for (size_t i = 0; i < b.n; i++) b[i] = (float)r.uni(lo, hi);
}
inline void fill_bf16(Rng &r, Buf<uint16_t> &b, double lo, double hi) {
  for (size_t i = 0; i < b.n; i++) b[i] = f2bf((float)r.uni(lo, hi));
}

/* ---- results ------------------------------------------------------------- */
inline int &failures() { static int f = 0; return f; }
inline void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("  FAIL: ");
  std::vprintf(fmt, ap);
  std::printf("\n");
  va_end(ap);
  failures()++;
}
inline void expect(bool ok, const char *what) { if (!ok) fail("%s", what); }

/* Dispatch and report the simulator's error, if any. */
inline bool run(mtl_sim::Dispatch &d, void (*entry)(), const char *what) {
  if (!d.run(entry)) {
    fail("%s: simulator: %s", what, d.error.c_str());
    return false;
  }
  return true;
}

/* |got - want| <= bound[i]; NaN must match NaN. Prints the worst element. */
inline bool check(const char *what, const float *got, const float *want,
                  const std::function<double(size_t)> &bound, size_t n) {
  double worst = -1;
  size_t wi = 0;
  bool bad = false;
  for (size_t i = 0; i < n; i++) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    if (gn || wn) {
      if (gn != wn) { bad = true; wi = i; worst = INFINITY; break; }
      continue;
    }
    if (got[i] == want[i]) continue; /* also equal infinities */
    const double b = bound(i), e = std::fabs((double)got[i] - (double)want[i]);
    const double ratio = b > 0 ? e / b : INFINITY;
    if (ratio > worst) { worst = ratio; wi = i; }
    if (!(e <= b)) bad = true;
  }
  if (bad) {
    fail("%s: element %zu: metal %.9g, C %.9g, |diff| %.3g > bound %.3g", what, wi,
         (double)got[wi], (double)want[wi], std::fabs((double)got[wi] - (double)want[wi]),
         bound(wi));
    return false;
  }
  std::printf("  ok %s (%zu elements, worst diff/bound %.3g)\n", what, n, worst < 0 ? 0.0 : worst);
  return true;
}
inline bool check_bitwise(const char *what, const void *got, const void *want, size_t bytes) {
  if (std::memcmp(got, want, bytes) != 0) {
    const unsigned char *g = (const unsigned char *)got, *w = (const unsigned char *)want;
    size_t i = 0;
    while (g[i] == w[i]) i++;
    fail("%s: first differing byte %zu (metal 0x%02x, C 0x%02x)", what, i, g[i], w[i]);
    return false;
  }
  std::printf("  ok %s (%zu bytes, bitwise)\n", what, bytes);
  return true;
}

struct Ctx {
  tg_ctx *c = nullptr;
  Ctx() {
    if (tg_ctx_create(&c) != TG_OK) { std::printf("tg_ctx_create failed\n"); std::exit(2); }
    tg_ctx_set_threads(c, 2);
  }
  ~Ctx() { tg_ctx_destroy(c); }
  operator tg_ctx *() const { return c; }
};
inline void expect_ok(tg_ctx *ctx, tg_status s, const char *call) {
  if (s != TG_OK) fail("%s -> %s (%s)", call, tg_status_str(s), tg_ctx_last_error(ctx));
}
#define TT_C(ctx, call) ::tt::expect_ok(ctx, (call), #call)

inline int finish(const char *suite) {
  if (failures()) {
    std::printf("%s: %d failure(s)\n", suite, failures());
    return 1;
  }
  std::printf("%s: all passed\n", suite);
  return 0;
}

}  // namespace tt

#endif /* TG_TWIN_TEST_H */
