/*
 * Grid dispatch: each Metal threadgroup of an nx * ny * nz grid becomes one
 * iteration of an OpenMP dynamic loop over the flattened grid.
 *
 * Why a `parallel for schedule(dynamic)` and not one `omp task` per group:
 * both give the same semantics (independent groups, any order, any thread),
 * but the loop costs one atomic increment per group where tasks cost an
 * allocation and a queue push; dynamic scheduling balances groups of unequal
 * cost (causal attention) just as tasks would.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

/* Grows ctx's scratch to `total` bytes (64-byte aligned). */
static tg_status reserve_scratch(tg_ctx *ctx, size_t total) {
  if (total <= ctx->scratch_bytes) return TG_OK;
  void *p = tg_mem_alloc(total, 64);
  if (!p)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "engine: cannot allocate %zu bytes of scratch",
                   total);
  tg_mem_free(ctx->scratch);
  ctx->scratch = p;
  ctx->scratch_bytes = total;
  return TG_OK;
}

tg_status tg_workspace(tg_ctx *ctx, size_t bytes, void **out) {
  if (bytes > SIZE_MAX - 64)
    return tg_fail(ctx, TG_ERR_OVERFLOW, "engine: workspace size overflows");
  if (bytes > ctx->workspace_bytes) {
    tg_mem_free(ctx->workspace); /* first: the old and new buffers are never both held */
    ctx->workspace = tg_mem_alloc(bytes, 64);
    ctx->workspace_bytes = ctx->workspace ? bytes : 0;
    if (!ctx->workspace)
      return tg_fail(ctx, TG_ERR_NO_MEMORY, "engine: cannot allocate %zu bytes of workspace",
                     bytes);
  }
  *out = ctx->workspace;
  return TG_OK;
}

tg_status tg_dispatch(tg_ctx *ctx, int64_t nx, int64_t ny, int64_t nz,
                      size_t scratch_bytes, tg_group_fn fn, const void *args) {
  int64_t groups;
  if (!tg_mul_ok(&groups, 3, nx, ny, nz))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "engine: grid %lld x %lld x %lld overflows",
                   (long long)nx, (long long)ny, (long long)nz);
  if (groups == 0) return TG_OK;
  /* The team is the thread count whatever the grid (its extra threads find
   * no group): calls with grids of different sizes then keep libgomp's
   * team size, whose changes are dear. On the lent 16-core Xeon a pair of
   * empty regions of 8 and 16 threads took 0.38-0.48 ms against 8-9 us for
   * two of 16 (bench/results/xeon16-amx/README.md, "one team size"). One
   * group, or one thread, runs on the calling thread. */
  const int nthreads = groups == 1 ? 1 : tg_threads(ctx);
  const size_t stride = tg_align64(scratch_bytes);
  size_t total;
  if (__builtin_mul_overflow(stride, (size_t)nthreads, &total))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "engine: scratch size overflows");
  tg_status st = reserve_scratch(ctx, total);
  if (st != TG_OK) return st;
  char *const base = ctx->scratch;
  if (nthreads == 1) {
    for (int64_t g = 0; g < groups; g++) fn(args, g % nx, (g / nx) % ny, g / nx / ny, base);
    return TG_OK;
  }

#pragma omp parallel num_threads(nthreads)
  {
    /* base is NULL when no kernel has needed scratch yet (NULL + 0 is UB) */
    void *mine = base ? base + (size_t)omp_get_thread_num() * stride : NULL;
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < groups; g++) {
      const int64_t x = g % nx, yz = g / nx;
      fn(args, x, yz % ny, yz / ny, mine);
    }
  }
  return TG_OK;
}

/* The items in rank order (tg_dispatch_grids). With the grids sorted by
 * item count, most first (order[j]: the j-th; sizes s_0 >= s_1 >= ...),
 * ranks [s_c, s_{c-1}) hold c grids' items each (s_n = 0): segment j holds
 * c = n - j grids, ranks from rank0[j], its first item at start[j]. */
typedef struct {
  const tg_grid *grids;
  const int64_t *order, *start, *rank0;
  int64_t n;
} grid_list;

static int64_t grid_items(const tg_grid *g) { return g->nx * g->ny * g->nz; }

static void run_item(const grid_list *l, int64_t g, void *scratch) {
  int64_t lo = 0, hi = l->n - 1; /* the last segment with start[lo] <= g */
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (l->start[mid] <= g) lo = mid;
    else hi = mid - 1;
  }
  const int64_t c = l->n - lo, off = g - l->start[lo];
  const tg_grid *gr = &l->grids[l->order[off % c]];
  const int64_t i = l->rank0[lo] + off / c, x = i % gr->nx, yz = i / gr->nx;
  gr->fn(gr->args, x, yz % gr->ny, yz / gr->ny, scratch);
}

/* A grid's item count and its index in the call, as sorted (by_items). */
typedef struct {
  int64_t items, index;
} grid_key;

/* Most items first; ties in the order given (a call's documents, heaviest
 * first). */
static int by_items(const void *a, const void *b) {
  const grid_key *x = a, *y = b;
  if (x->items != y->items) return x->items > y->items ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

tg_status tg_dispatch_grids(tg_ctx *ctx, const tg_grid *grids, int64_t n,
                            size_t scratch_bytes) {
  if (n <= 0) return TG_OK;
  if ((uint64_t)n > SIZE_MAX / (5 * sizeof(int64_t)))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "engine: %lld grids overflow", (long long)n);
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t items;
    if (!tg_mul_ok(&items, 3, grids[i].nx, grids[i].ny, grids[i].nz) ||
        __builtin_add_overflow(total, items, &total))
      return tg_fail(ctx, TG_ERR_OVERFLOW, "engine: the grids' items overflow");
  }
  /* [n] grid keys (sorted), then order, start, rank0 [n] each */
  grid_key *keys = tg_mem_alloc(sizeof(int64_t) * 5 * (size_t)n, 64);
  if (!keys)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "engine: cannot allocate the list of %lld grids",
                   (long long)n);
  int64_t *order = (int64_t *)(void *)(keys + n), *start = order + n, *rank0 = start + n;
  for (int64_t i = 0; i < n; i++) keys[i] = (grid_key){grid_items(&grids[i]), i};
  qsort(keys, (size_t)n, sizeof *keys, by_items);
  for (int64_t j = 0; j < n; j++) order[j] = keys[j].index;
  for (int64_t j = 0, at = 0; j < n; j++) {
    const int64_t c = n - j, lo = j ? keys[c].items : 0;
    start[j] = at, rank0[j] = lo;
    at += c * (keys[c - 1].items - lo); /* ranks [lo, s_{c-1}) */
  }
  const int nthreads = total <= 1 ? 1 : tg_threads(ctx);
  const size_t stride = tg_align64(scratch_bytes);
  size_t bytes;
  tg_status st = TG_OK;
  if (__builtin_mul_overflow(stride, (size_t)nthreads, &bytes))
    st = tg_fail(ctx, TG_ERR_OVERFLOW, "engine: scratch size overflows");
  if (st == TG_OK) st = reserve_scratch(ctx, bytes);
  if (st != TG_OK || total == 0) {
    tg_mem_free(keys);
    return st;
  }
  const grid_list l = {grids, order, start, rank0, n};
  char *const base = ctx->scratch;
  if (nthreads == 1) {
    for (int64_t g = 0; g < total; g++) run_item(&l, g, base);
  } else {
#pragma omp parallel num_threads(nthreads)
    {
      void *mine = base ? base + (size_t)omp_get_thread_num() * stride : NULL;
#pragma omp for schedule(dynamic, 1)
      for (int64_t g = 0; g < total; g++) run_item(&l, g, mine);
    }
  }
  tg_mem_free(keys);
  return TG_OK;
}
