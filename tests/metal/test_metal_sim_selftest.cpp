/* The simulator's own semantics: barriers and threadgroup memory, the simd
 * functions (full and partial simdgroups), device atomics across parallel
 * threadgroups, function constants (an optional one too), [[threadgroup(n)]]
 * memory, and the strict checks (divergent barrier / simd op, early return,
 * too much threadgroup memory, a data race made visible by the shuffled
 * schedule). */
#include "twin_test.h"

namespace st {
#include "selftest.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;

static void test_barrier_and_race() {
  std::printf("barrier / threadgroup memory\n");
  const uint n = 96, groups = 3;
  Buf<float> in(n * groups), out(n * groups);
  for (uint i = 0; i < n * groups; i++) in[i] = (float)i;
  mtl_sim::Dispatch d;
  d.grid(groups, 1, 1).tg(n).buffer(0, in.p).buffer(1, out.p);
  if (tt::run(d, [] { st::st_reverse(); }, "st_reverse")) {
    bool ok = true;
    for (uint g = 0; g < groups; g++)
      for (uint t = 0; t < n; t++) ok &= out[g * n + t] == in[g * n + n - 1 - t];
    tt::expect(ok, "st_reverse: wrong result");
    if (ok) std::printf("  ok reverse through threadgroup memory\n");
  }
  /* without the barrier, some thread reads a slot before its writer ran */
  int bad_runs = 0;
  for (uint64_t s = 1; s <= 4; s++) {
    d.seed = s;
    out.fill(0);
    if (!tt::run(d, [] { st::st_reverse_racy(); }, "st_reverse_racy")) return;
    bool ok = true;
    for (uint g = 0; g < groups; g++)
      for (uint t = 0; t < n; t++) ok &= out[g * n + t] == in[g * n + n - 1 - t];
    bad_runs += !ok;
  }
  tt::expect(bad_runs > 0, "racy kernel was not exposed by the shuffled schedule");
  if (bad_runs) std::printf("  ok missing barrier exposed (%d of 4 seeds)\n", bad_runs);
}

static void test_simd() {
  std::printf("simd functions\n");
  for (uint n : {64u, 48u, 7u, 5u}) { /* full, partial last simdgroup, single partial */
    Buf<float> in(n), out(n * 6);
    tt::Rng r(tt::seed() + n);
    for (uint i = 0; i < n; i++) in[i] = (float)r.range(-1000, 1000) * 0.25f;
    if (n == 5) /* all -inf in a partial simdgroup: max must stay -inf */
      for (uint i = 0; i < n; i++) in[i] = -INFINITY;
    mtl_sim::Dispatch d;
    d.grid(1, 1, 1).tg(n).buffer(0, in.p).buffer(1, out.p);
    if (!tt::run(d, [] { st::st_simd(); }, "st_simd")) continue;
    bool ok = true;
    for (uint t = 0; t < n; t++) {
      const uint sg = t / 32, l0 = sg * 32, l1 = std::min(n, l0 + 32);
      float sum = 0, mx = -INFINITY, mn = INFINITY; /* quarter-integers: sums are exact */
      for (uint i = l0; i < l1; i++) sum += in[i], mx = std::max(mx, in[i]), mn = std::min(mn, in[i]);
      const uint x = l0 + ((t - l0) ^ 5u), b = l0 + 3;
      const float want[6] = {sum, mx, mn, x < l1 ? in[x] : in[t], b < l1 ? in[b] : in[t],
                             (float)(sg * 100 + t % 32)};
      for (int k = 0; k < 6; k++)
        if (out[t * 6 + k] != want[k]) {
          if (ok) tt::fail("st_simd n=%u: thread %u op %d: got %g want %g", n, t, k, out[t * 6 + k], want[k]);
          ok = false;
        }
    }
    if (ok) std::printf("  ok simd_sum/max/min/shuffle_xor/broadcast, %u threads\n", n);
  }
}

static void test_atomics() {
  std::printf("device atomics across parallel threadgroups\n");
  Buf<uint32_t> count(1);
  Buf<float> sum(1);
  count[0] = 0;
  sum[0] = 0;
  mtl_sim::Dispatch d;
  d.grid(40, 1, 1).tg(256).buffer(0, count.p).buffer(1, sum.p);
  d.workers = 2;
  if (!tt::run(d, [] { st::st_atomics(); }, "st_atomics")) return;
  tt::expect(count[0] == 40 * 256 && sum[0] == 40 * 256 * 0.5f, "atomic totals wrong");
  if (count[0] == 40 * 256) std::printf("  ok 10240 atomic adds (uint and float)\n");
}

static void expect_failure(mtl_sim::Dispatch &d, void (*k)(), const char *what, const char *needle) {
  if (d.run(k)) {
    tt::fail("%s: simulator accepted it", what);
    return;
  }
  if (d.error.find(needle) == std::string::npos) {
    tt::fail("%s: unexpected error text: %s", what, d.error.c_str());
    return;
  }
  std::printf("  ok %s rejected: %.110s...\n", what, d.error.c_str());
}

static void test_strict() {
  std::printf("strict checks\n");
  Buf<float> out(64);
  mtl_sim::Dispatch d;
  d.grid(1, 1, 1).tg(64).buffer(0, out.p);
  expect_failure(d, [] { st::st_divergent_barrier(); }, "divergent barrier", "deadlock");
  expect_failure(d, [] { st::st_early_return(); }, "early return before a barrier", "deadlock");
  expect_failure(d, [] { st::st_divergent_simd(); }, "half-simdgroup simd_sum", "deadlock");
  expect_failure(d, [] { st::st_too_much_tgmem(); }, "48 KB of threadgroup memory", "limit");
  Buf<int> io(32);
  mtl_sim::Dispatch f;
  f.grid(1, 1, 1).tg(32).buffer(0, io.p).tg_memory(0, 32 * sizeof(int));
  expect_failure(f, [] { st::st_fc_dyn(); }, "unset function constant", "function constant 7");
  f.constant(7, true).constant(8, 1000);
  if (tt::run(f, [] { st::st_fc_dyn(); }, "st_fc_dyn")) {
    bool ok = true;
    for (int t = 0; t < 32; t++) ok &= io[t] == 1000 + (t + 1) % 32;
    tt::expect(ok, "function constants / threadgroup(0) memory: wrong values");
    if (ok) std::printf("  ok function constants 7, 8 and threadgroup(0) memory\n");
  }
  /* optional constant 9: unset, true, false -> 0, 1, 0 (at every use, so the
   * same compiled kernel follows each dispatch's values) */
  mtl_sim::Dispatch o;
  o.grid(1, 1, 1).tg(32).buffer(0, io.p);
  const int expected[3] = {0, 1, 0};
  for (int step = 0; step < 3; step++) {
    if (step > 0) o.constant(9, step == 1);
    io.fill(-1);
    if (!tt::run(o, [] { st::st_fc_optional(); }, "st_fc_optional")) break;
    bool ok = true;
    for (int t = 0; t < 32; t++) ok &= io[t] == expected[step];
    tt::expect(ok, "optional function constant: wrong value");
    if (ok && step == 2) std::printf("  ok optional function constant 9 (unset, true, false)\n");
  }
}

int main() {
  test_barrier_and_race();
  test_simd();
  test_atomics();
  test_strict();
  return tt::finish("metal_sim_selftest");
}
