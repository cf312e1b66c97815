/*
 * metal_sim.h -- a threadgroup simulator for Metal compute kernels compiled
 * as C++ through metal_shim.h.
 *
 * Model
 *   - A dispatch is `threadgroups` x `threads per threadgroup` (Metal's
 *     dispatchThreadgroups). Threadgroups are handed to `workers` OS threads
 *     (default 2) and run in parallel: device-memory atomics are real host
 *     atomics racing across threadgroups, as on the GPU.
 *   - Inside a threadgroup every Metal thread is a fiber (ucontext) with its
 *     own stack (guard page below it). A fiber runs until it reaches a
 *     threadgroup_barrier, a simd-group operation, or returns; then the next
 *     one runs. A barrier releases when every thread of the group is waiting
 *     at one; a simd operation completes when every lane of the 32-wide
 *     simdgroup (fewer in a partial last simdgroup) has arrived at the same
 *     operation, and the last arriving lane computes all lanes' results.
 *   - The order in which ready fibers run is shuffled (seeded) at every step,
 *     so a data race on threadgroup memory between two barriers shows up as a
 *     wrong or run-to-run different result instead of being hidden by one
 *     fixed order.
 *   - Strict checks, reported as a failed dispatch (never a hang):
 *       * a barrier or simd operation that not every thread reaches (a thread
 *         returned early, or threads wait at different synchronisation
 *         points) -- "deadlock" with every thread's state;
 *       * lanes of one simdgroup at different simd operations;
 *       * threads at different barrier counts when a barrier releases;
 *       * more than 32 KiB of threadgroup memory, more than 1024 threads;
 *       * an unset function constant read by the kernel;
 *       * a buffer bound at a misaligned address for the kernel's type.
 *   - Threadgroup memory is a per-threadgroup arena, filled with 0xFF bytes
 *     (NaN for floats) before each threadgroup, so reading memory that no
 *     thread wrote shows up as NaN / huge values.
 *
 * Kernel arguments: the shim's attribute macros turn every kernel parameter
 * into one with a default argument (a proxy that reads the running thread's
 * context), so the simulator calls the kernel *by name with no arguments*:
 *     mtl_sim::Dispatch d;  d.groups = {..}; d.threads = {..};
 *     d.buffer(0, src).buffer(1, dst).constant(300, true);
 *     bool ok = d.run([] { my_kernel(); });   // d.error says why not
 * Buffers are bound by Metal buffer index; [[threadgroup(n)]] memory lengths
 * by d.tg_memory(n, bytes); function constants by d.constant(index, value).
 */
#ifndef TG_METAL_SIM_H
#define TG_METAL_SIM_H

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "metal_shim.h"

namespace mtl_sim {

enum SysVal {
  SV_TPIG,   /* thread_position_in_grid */
  SV_TPITG,  /* thread_position_in_threadgroup */
  SV_TGPIG,  /* threadgroup_position_in_grid */
  SV_TPTG,   /* threads_per_threadgroup */
  SV_TGPG,   /* threadgroups_per_grid */
  SV_TPG,    /* threads_per_grid */
  SV_TIITG,  /* thread_index_in_threadgroup */
  SV_TIISG,  /* thread_index_in_simdgroup */
  SV_SGIITG, /* simdgroup_index_in_threadgroup */
  SV_TPSG,   /* threads_per_simdgroup */
  SV_SGPTG   /* simdgroups_per_threadgroup */
};

enum FiberState { F_READY, F_RUNNING, F_BARRIER, F_SIMD, F_DONE };

struct Group;
struct Dispatch;

struct Fiber {
  ucontext_t ctx;
  FiberState st = F_DONE;
  Group *g = nullptr;
  uint3 tpitg{0, 0, 0};
  uint index = 0, lane = 0, sg = 0;
  unsigned barriers = 0;
  char *stack = nullptr;
};

struct SimdEx {
  int arrived = 0, nlanes = 0;
  combine_fn fn = nullptr;
  size_t size = 0;
  uint32_t present = 0;
  Slot in[32], out[32];
  uint32_t extra[32];
};

enum { TG_MEM_LIMIT = 32768, STACK_BYTES = 128 * 1024 };

struct Group {
  Dispatch *d = nullptr;
  void (*entry)() = nullptr;
  uint3 tgpig{0, 0, 0};
  uint n = 0;
  std::vector<Fiber> f;
  std::vector<SimdEx> sx;
  int bar_arrived = 0;
  uint done = 0;
  ucontext_t sched;
  alignas(64) unsigned char arena[TG_MEM_LIMIT];
  size_t arena_used = 0;
  std::vector<std::pair<const void *, size_t>> locals; /* MTL_TG_LOCAL key -> offset */
  std::map<int, size_t> dyn;                           /* [[threadgroup(n)]] -> offset */
  bool failed = false;
  std::string err;
  ~Group() {
    for (auto &fb : f)
      if (fb.stack) munmap(fb.stack, STACK_BYTES);
  }
};

inline thread_local Fiber *g_cur = nullptr;
inline int zero[1] = {0};

struct FcValue {
  bool set = false;
  unsigned char bytes[8] = {0};
};

struct Dispatch {
  uint3 groups{1, 1, 1};  /* threadgroups per grid */
  uint3 threads{1, 1, 1}; /* threads per threadgroup */
  int workers = 2;
  uint64_t seed = 0x5eed;
  bool shuffle = true;
  std::map<int, void *> bufs;
  std::map<int, size_t> tgmem;
  std::map<int, FcValue> fcs;
  std::string error;

  Dispatch &buffer(int i, const void *p) { bufs[i] = const_cast<void *>(p); return *this; }
  Dispatch &tg_memory(int i, size_t bytes) { tgmem[i] = bytes; return *this; }
  template <class T>
  Dispatch &constant(int i, T v) {
    static_assert(sizeof(T) <= 8, "function constant too large");
    FcValue fv;
    fv.set = true;
    std::memcpy(fv.bytes, &v, sizeof v);
    fcs[i] = fv;
    return *this;
  }
  Dispatch &grid(uint gx, uint gy, uint gz) { groups = uint3{gx, gy, gz}; return *this; }
  Dispatch &tg(uint tx, uint ty = 1, uint tz = 1) { threads = uint3{tx, ty, tz}; return *this; }
  bool run(void (*entry)());
};

/* ---- failure ---------------------------------------------------------------- */
inline void yield_to_scheduler(Fiber *f) { swapcontext(&f->ctx, &f->g->sched); }

[[noreturn]] inline void fail(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  Fiber *f = g_cur;
  if (!f) {
    std::fprintf(stderr, "metal_sim: %s (outside a kernel)\n", buf);
    std::abort();
  }
  Group &g = *f->g;
  if (!g.failed) {
    char where[160];
    snprintf(where, sizeof where, " [threadgroup (%u,%u,%u), thread (%u,%u,%u)]", g.tgpig.x,
             g.tgpig.y, g.tgpig.z, f->tpitg.x, f->tpitg.y, f->tpitg.z);
    g.failed = true;
    g.err = std::string(buf) + where;
  }
  f->st = F_DONE;
  yield_to_scheduler(f); /* never resumed */
  std::abort();
}

inline Fiber *cur(const char *what) {
  if (!g_cur) {
    std::fprintf(stderr, "metal_sim: %s called outside a simulated kernel\n", what);
    std::abort();
  }
  return g_cur;
}

/* ---- synchronisation ---------------------------------------------------------- */
inline void barrier() {
  Fiber *f = cur("threadgroup_barrier");
  Group &g = *f->g;
  f->st = F_BARRIER;
  f->barriers++;
  if (++g.bar_arrived == (int)g.n) {
    for (auto &o : g.f)
      if (o.barriers != f->barriers)
        fail("threadgroup_barrier: thread %u is at barrier #%u, thread %u at #%u", o.index,
             o.barriers, f->index, f->barriers);
    for (auto &o : g.f) o.st = F_READY;
    g.bar_arrived = 0;
  }
  yield_to_scheduler(f);
}

inline void simd_exchange(const void *in, size_t size, uint32_t extra, combine_fn fn, void *out) {
  Fiber *f = cur("simd operation");
  Group &g = *f->g;
  SimdEx &x = g.sx[f->sg];
  if (x.arrived == 0) {
    x.fn = fn;
    x.size = size;
  } else if (x.fn != fn || x.size != size) {
    fail("simdgroup %u: lanes are at different simd operations (divergent simd call)", f->sg);
  }
  std::memcpy(x.in[f->lane], in, size);
  x.extra[f->lane] = extra;
  f->st = F_SIMD;
  if (++x.arrived == x.nlanes) {
    fn(x.in, x.out, x.extra, x.present);
    x.arrived = 0;
    for (int l = 0; l < x.nlanes; l++) g.f[f->sg * 32 + l].st = F_READY;
  }
  yield_to_scheduler(f);
  std::memcpy(out, x.out[f->lane], size);
}

/* ---- threadgroup memory --------------------------------------------------------- */
inline void *tg_alloc(Group &g, size_t size, size_t align, const char *what) {
  size_t off = (g.arena_used + align - 1) / align * align;
  if (off + size > TG_MEM_LIMIT)
    fail("threadgroup memory: %s needs %zu bytes at offset %zu, over Metal's %d-byte limit", what,
         size, off, (int)TG_MEM_LIMIT);
  g.arena_used = off + size;
  return g.arena + off;
}

inline void *tg_local(const void *key, size_t size, size_t align) {
  Group &g = *cur("threadgroup variable")->g;
  for (auto &l : g.locals)
    if (l.first == key) return g.arena + l.second;
  void *p = tg_alloc(g, size, align < 16 ? 16 : align, "a threadgroup variable");
  g.locals.push_back({key, (size_t)((unsigned char *)p - g.arena)});
  return p;
}

/* ---- kernel-argument proxies ---------------------------------------------------- */
struct BufArg {
  int n;
  BufArg operator[](int) const { return *this; }
  void *ptr() const {
    Group &g = *cur("buffer argument")->g;
    auto it = g.d->bufs.find(n);
    return it == g.d->bufs.end() ? nullptr : it->second;
  }
  template <class T>
  operator T *() const {
    void *p = ptr();
    constexpr size_t al = alignof(typename std::conditional<std::is_void<T>::value, char, T>::type);
    if (((uintptr_t)p) % al != 0) fail("buffer(%d) is bound at %p, misaligned for its type", n, p);
    return static_cast<T *>(p);
  }
  template <class T, class = typename std::enable_if<!std::is_pointer<T>::value>::type>
  operator T &() const {
    void *p = ptr();
    if (!p) fail("buffer(%d) is used by reference but not bound", n);
    return *static_cast<T *>(p);
  }
};

struct TgArg {
  int n;
  TgArg operator[](int) const { return *this; }
  template <class T>
  operator T *() const {
    Group &g = *cur("threadgroup argument")->g;
    auto it = g.dyn.find(n);
    if (it == g.dyn.end()) fail("threadgroup(%d) memory length was not set by the host", n);
    return reinterpret_cast<T *>(g.arena + it->second);
  }
};

struct SysArg {
  SysVal k;
  SysArg operator[](int) const { return *this; }
  uint3 v3() const {
    Fiber *f = cur("attribute argument");
    const Group &g = *f->g;
    const uint3 T = g.d->threads, G = g.d->groups;
    switch (k) {
      case SV_TPIG: return g.tgpig * T + f->tpitg;
      case SV_TPITG: return f->tpitg;
      case SV_TGPIG: return g.tgpig;
      case SV_TPTG: return T;
      case SV_TGPG: return G;
      case SV_TPG: return G * T;
      case SV_TIITG: return uint3{f->index, 0, 0};
      case SV_TIISG: return uint3{f->lane, 0, 0};
      case SV_SGIITG: return uint3{f->sg, 0, 0};
      case SV_TPSG: return uint3{32, 0, 0};
      case SV_SGPTG: return uint3{(g.n + 31) / 32, 0, 0};
    }
    return uint3{0, 0, 0};
  }
  operator uint() const { return v3().x; }
  operator ushort() const { return (ushort)v3().x; }
  operator uint2() const { uint3 v = v3(); return uint2{v.x, v.y}; }
  operator uint3() const { return v3(); }
  operator ushort2() const { uint3 v = v3(); return ushort2{(ushort)v.x, (ushort)v.y}; }
  operator ushort3() const { uint3 v = v3(); return ushort3{(ushort)v.x, (ushort)v.y, (ushort)v.z}; }
};

/* [[function_constant(N)]] program-scope constants: read from the running
 * dispatch at every use. */
template <class T, int N>
struct FunctionConstant {
  bool defined() const {
    Group &g = *cur("function constant")->g;
    auto it = g.d->fcs.find(N);
    return it != g.d->fcs.end() && it->second.set;
  }
  operator T() const {
    Group &g = *cur("function constant")->g;
    auto it = g.d->fcs.find(N);
    if (it == g.d->fcs.end() || !it->second.set)
      fail("function constant %d is read by the kernel but was not set", N);
    T v;
    std::memcpy(&v, it->second.bytes, sizeof v);
    return v;
  }
};

/* ---- the scheduler ----------------------------------------------------------------- */
inline void fiber_main() {
  Fiber *f = g_cur;
  f->g->entry();
  f->st = F_DONE;
  f->g->done++;
  yield_to_scheduler(f);
  std::abort(); /* never resumed */
}

inline const char *state_name(FiberState s) {
  switch (s) {
    case F_READY: return "ready";
    case F_RUNNING: return "running";
    case F_BARRIER: return "at threadgroup_barrier";
    case F_SIMD: return "at a simd operation";
    case F_DONE: return "returned";
  }
  return "?";
}

inline void run_group(Group &g, std::mt19937_64 &rng) {
  Dispatch &d = *g.d;
  g.failed = false;
  g.err.clear();
  g.bar_arrived = 0;
  g.done = 0;
  g.arena_used = 0;
  g.locals.clear();
  g.dyn.clear();
  std::memset(g.arena, 0xFF, sizeof g.arena); /* poison: NaN floats */
  for (auto &kv : d.tgmem) {
    g_cur = nullptr;
    size_t off = (g.arena_used + 15) / 16 * 16;
    if (off + kv.second > TG_MEM_LIMIT) {
      g.failed = true;
      g.err = "threadgroup(" + std::to_string(kv.first) + ") length " +
              std::to_string(kv.second) + " exceeds the 32 KiB threadgroup memory";
      return;
    }
    g.dyn[kv.first] = off;
    g.arena_used = off + kv.second;
  }
  const uint3 T = d.threads;
  for (uint i = 0; i < g.n; i++) {
    Fiber &f = g.f[i];
    f.g = &g;
    f.index = i;
    f.lane = i % 32;
    f.sg = i / 32;
    f.tpitg = uint3{i % T.x, (i / T.x) % T.y, i / (T.x * T.y)};
    f.barriers = 0;
    f.st = F_READY;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack + getpagesize();
    f.ctx.uc_stack.ss_size = STACK_BYTES - getpagesize();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  for (size_t s = 0; s < g.sx.size(); s++) {
    SimdEx &x = g.sx[s];
    x.arrived = 0;
    x.nlanes = (int)std::min<uint>(32, g.n - (uint)s * 32);
    x.present = x.nlanes == 32 ? 0xFFFFFFFFu : ((1u << x.nlanes) - 1u);
  }
  std::vector<uint> order(g.n);
  for (uint i = 0; i < g.n; i++) order[i] = i;
  for (;;) {
    if (d.shuffle) std::shuffle(order.begin(), order.end(), rng);
    bool ran = false;
    for (uint i : order) {
      Fiber &f = g.f[i];
      if (f.st != F_READY) continue;
      f.st = F_RUNNING;
      g_cur = &f;
      swapcontext(&g.sched, &f.ctx);
      g_cur = nullptr;
      ran = true;
      if (g.failed) return;
    }
    if (g.done == g.n) return;
    if (!ran) { /* nobody can run: a barrier or simd op some thread never reaches */
      std::string m = "deadlock: a threadgroup_barrier or simd operation is not reached by every "
                      "thread (divergent control flow or an early return). States:";
      int shown = 0;
      for (auto &f : g.f) {
        if (shown++ >= 40) { m += " ..."; break; }
        m += " t" + std::to_string(f.index) + "=" + state_name(f.st);
      }
      char where[96];
      snprintf(where, sizeof where, " [threadgroup (%u,%u,%u)]", g.tgpig.x, g.tgpig.y, g.tgpig.z);
      g.failed = true;
      g.err = m + where;
      return;
    }
  }
}

inline bool Dispatch::run(void (*entry)()) {
  error.clear();
  const uint n = threads.x * threads.y * threads.z;
  if (n == 0 || n > 1024) {
    error = "threads per threadgroup must be 1..1024, got " + std::to_string(n);
    return false;
  }
  const uint64_t total = (uint64_t)groups.x * groups.y * groups.z;
  if (total == 0) return true;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  auto work = [&](int wid) {
    std::unique_ptr<Group> g(new Group());
    g->d = this;
    g->entry = entry;
    g->n = n;
    g->f.resize(n);
    g->sx.resize((n + 31) / 32);
    for (auto &f : g->f) {
      void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) { std::perror("mmap"); std::abort(); }
      mprotect(p, getpagesize(), PROT_NONE); /* guard page: stack overflow faults */
      f.stack = static_cast<char *>(p);
    }
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + (uint64_t)wid);
    for (;;) {
      if (stop.load()) return;
      const uint64_t i = next.fetch_add(1);
      if (i >= total) return;
      g->tgpig = uint3{(uint)(i % groups.x), (uint)((i / groups.x) % groups.y),
                       (uint)(i / ((uint64_t)groups.x * groups.y))};
      run_group(*g, rng);
      if (g->failed) {
        std::lock_guard<std::mutex> lk(mu);
        if (error.empty()) error = g->err;
        stop = true;
        return;
      }
    }
  };
  const int nw = (int)std::max<uint64_t>(1, std::min<uint64_t>((uint64_t)std::max(workers, 1), total));
  std::vector<std::thread> th;
  for (int w = 1; w < nw; w++) th.emplace_back(work, w);
  work(0);
  for (auto &t : th) t.join();
  return error.empty();
}

}  // namespace mtl_sim

#endif /* TG_METAL_SIM_H */
