/*
 * The tilegrad engine: what every kernel uses.
 *
 *   - the context (threads, determinism, ISA) and error reporting,
 *   - checked 64-bit shape arithmetic,
 *   - grid dispatch: a Metal grid of threadgroups run as OpenMP work items,
 *     each with its own aligned scratch,
 *   - atomic f32 adds for what Metal threadgroups did to each other.
 *
 * Internal header: not installed.
 */
#ifndef TG_ENGINE_H
#define TG_ENGINE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "tilegrad.h"
#include "tuning.h"

/* Longest message tg_ctx_last_error keeps; a longer one ends in "..." */
#define TG_ERRMSG_LEN 2048

struct tg_ctx {
  int threads;        /* 0 = OpenMP default */
  int deterministic;  /* fixed-order accumulation */
  tg_isa isa;         /* resolved: never TG_ISA_AUTO */
  tg_attn_schedule attn_schedule;
  tg_attn_precision attn_precision;
  const tg_isa_ops *ops;
  void *scratch;      /* per-thread scratch, reused across calls */
  size_t scratch_bytes;
  void *workspace;    /* one shared buffer (attention dQ partials), reused */
  size_t workspace_bytes;
  atomic_int busy;    /* a call is inside the context (TG_ENTER) */
  char err[TG_ERRMSG_LEN];
};

/* --- memory ------------------------------------------------------------------
 * Every allocation of the library goes through these two (engine/mem.c), so
 * tests can make any one of them fail (include/tilegrad_testing.h). `align`
 * is a power of two, at least sizeof(void *); the block is rounded up to a
 * multiple of it. NULL when out of memory. */
void *tg_mem_alloc(size_t bytes, size_t align);
void tg_mem_free(void *p); /* NULL is a no-op */

/* Records a formatted message on ctx and returns s (for `return tg_fail(...)`). */
tg_status tg_fail(tg_ctx *ctx, tg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears the last error. */
void tg_begin(tg_ctx *ctx);

/* --- one call at a time per context ------------------------------------------
 * Every entry point that takes a context starts with TG_ENTER(ctx) (after
 * its NULL check): it claims the context with one atomic exchange for the
 * rest of the function -- released on every return by the cleanup attribute
 * -- and clears the last error. A context another thread is inside gives
 * TG_ERR_BUSY at once, with nothing written and no message (the context's
 * message belongs to the call that holds it): never a race on its scratch,
 * workspace or message. */
typedef struct {
  tg_ctx *ctx; /* NULL: not held */
} tg_call;
tg_call tg_enter(tg_ctx *ctx);
void tg_leave(tg_call *call);
#define TG_ENTER(ctx)                                                        \
  tg_call tg_call_ __attribute__((cleanup(tg_leave))) = tg_enter(ctx);      \
  if (!tg_call_.ctx) return TG_ERR_BUSY

/* Number of OpenMP threads a kernel launched on ctx will use: the context's
 * count if set, else OpenMP's default (affinity mask or OMP_NUM_THREADS)
 * capped by the cgroup CPU quota when OMP_NUM_THREADS is unset. */
int tg_threads(const tg_ctx *ctx);

/* Whole CPUs (rounded up) of the tightest cgroup CPU quota on the path from
 * this process's cgroup (read from the file proc_self_cgroup, normally
 * /proc/self/cgroup) up to the hierarchy's root under cgroup_root (normally
 * /sys/fs/cgroup): cgroup v2 cpu.max, or v1 cpu/cpu.cfs_quota_us over
 * cpu.cfs_period_us. 0 when no quota is set or nothing can be read. */
int tg_cgroup_cpu_limit(const char *cgroup_root, const char *proc_self_cgroup);

/* The L2 cache per CPU of this machine in bytes (engine/plan.c: cpu0's L2
 * from Linux sysfs over the CPUs sharing it, else sysconf, else
 * TG_PLAN_L2_DEFAULT, isa/tuning.h), for plans that size what they keep in
 * cache. Like tg_plan_cpus, never the thread count; tg_testing_plan_l2_bytes
 * forces it. */
long long tg_plan_l2_bytes(void);

/* --- checked arithmetic ----------------------------------------------------
 * Product of n non-negative int64 factors into *out; 0 on overflow. */
int tg_mul_ok(int64_t *out, int n, ...);

/* Element count of a contiguous tensor called `name` whose dims (at most 8)
 * are given;
 * refuses a zero dim (TG_ERR_BAD_SHAPE) and a count whose size in bytes
 * overflows int64 (TG_ERR_OVERFLOW). */
tg_status tg_shape_count(tg_ctx *ctx, const char *name, size_t elem_bytes,
                         int64_t *count, int ndims, ...);

/* --- aliasing ----------------------------------------------------------------
 * One buffer argument of an entry point as the byte range [p, p + bytes) it
 * may address (for strided tensors: from the lowest byte addressed to the
 * end of the highest element). NULL or 0 bytes: empty, overlaps nothing. */
typedef struct {
  const char *name;        /* the parameter's name in include/tilegrad.h */
  const void *p;
  uint64_t bytes;
  int written;             /* an output (written or accumulated) */
  const char *in_place_of; /* output only: the input (by name) it may start at
                            * exactly, the kernel computing in place; else NULL */
} tg_buf;

static inline tg_buf tg_in(const char *name, const void *p, uint64_t bytes) {
  return (tg_buf){name, p, bytes, 0, NULL};
}
static inline tg_buf tg_out(const char *name, const void *p, uint64_t bytes) {
  return (tg_buf){name, p, bytes, 1, NULL};
}
/* An output the kernel also computes exactly in place over `input`. */
static inline tg_buf tg_out_in_place(const char *name, const void *p, uint64_t bytes,
                                     const char *input) {
  return (tg_buf){name, p, bytes, 1, input};
}

/* Every entry point's validation ends its argument checks here, before
 * anything is written: TG_ERR_ALIAS (the message names both buffers, e.g.
 * "tg_transpose_2d: output overlaps input (...)") if an output shares a byte
 * with an input or with another output -- unless it is marked in place over
 * that input and starts at the same address. Inputs may overlap each other
 * (both only read). n buffers, n^2 / 2 comparisons: O(1) per call. */
tg_status tg_check_alias(tg_ctx *ctx, const char *fn, const tg_buf *bufs, int n);
/* Element count of an array (the bufs of tg_check_alias). */
#define TG_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* --- grid dispatch -----------------------------------------------------------
 * Runs fn(args, x, y, z, scratch) for every (x, y, z) of an nx * ny * nz grid
 * -- one call per Metal threadgroup -- on tg_threads(ctx) OpenMP threads, in
 * dynamic order. x varies fastest. scratch points to scratch_bytes of 64-byte
 * aligned memory private to the calling thread. Scratch is reserved before
 * any work starts, so TG_ERR_NO_MEMORY is returned with nothing written. */
typedef void (*tg_group_fn)(const void *args, int64_t x, int64_t y, int64_t z,
                            void *scratch);
tg_status tg_dispatch(tg_ctx *ctx, int64_t nx, int64_t ny, int64_t nz,
                      size_t scratch_bytes, tg_group_fn fn, const void *args);

/* Several grids in one OpenMP loop (varlen attention: one grid per
 * document): every (x, y, z) of every grid on one team in dynamic order;
 * scratch_bytes must cover every grid's fn. The items are handed out rank
 * by rank: item r of each grid (r counted as tg_dispatch counts, x
 * fastest) before item r + 1 of any, the grids of most items first (ties
 * in the order given). Callers order each grid's items heaviest first, so
 * the heaviest items of every grid start first and the light ones fill the
 * cores at the end. (Grid after grid, eight documents of 512 keys, each a
 * run from heavy to light items, left 16 threads waiting for 10-13% of the
 * backward on the 16-core Xeon: bench/results/xeon16-amx/packed/README.md.)
 * TG_ERR_NO_MEMORY with nothing run, as tg_dispatch. */
typedef struct {
  int64_t nx, ny, nz;
  tg_group_fn fn;
  const void *args;
} tg_grid;
tg_status tg_dispatch_grids(tg_ctx *ctx, const tg_grid *grids, int64_t n,
                            size_t scratch_bytes);
/* A shared buffer of at least `bytes` bytes (64-byte aligned) in *out,
 * kept on ctx for the next call (freed by tg_ctx_destroy): a buffer this
 * large comes fresh from mmap on every malloc, and faulting its pages in
 * costs more than the work done in it. Contents are undefined. */
tg_status tg_workspace(tg_ctx *ctx, size_t bytes, void **out);

/* --- accumulation ----------------------------------------------------------
 * dst[i] += src[i] for n elements; atomically (one `omp atomic` per element)
 * when `atomic` is set, which is how cross-threadgroup Metal atomics map. */
static inline void tg_add_f32(float *dst, const float *src, int64_t n, int atomic) {
  if (atomic) {
    for (int64_t i = 0; i < n; i++) {
#pragma omp atomic
      dst[i] += src[i];
    }
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
  }
}

/* Rounds n up to a multiple of 64 bytes (for carving scratch). */
static inline size_t tg_align64(size_t n) { return (n + 63) & ~(size_t)63; }

#endif /* TG_ENGINE_H */
