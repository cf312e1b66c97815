/*
 * The library's one allocator (engine.h: tg_mem_alloc / tg_mem_free), and
 * the test hook that makes its k-th call fail (include/tilegrad_testing.h).
 *
 * Every buffer libtilegrad allocates -- the context, its scratch and
 * workspace, the per-call partials and losses -- comes from here, so one
 * counter sees all of them and a test can fail each in turn without
 * interposing malloc. The hook costs one relaxed atomic load per allocation
 * while disarmed; allocations may happen on any thread (a kernel's OpenMP
 * region included), so the counters are atomics.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "engine.h"
#include "tilegrad_testing.h"

static atomic_int fail_armed;            /* count allocations (tg_testing_alloc_arm) */
static atomic_llong fail_at = -1;        /* the allocation number that returns NULL */
static atomic_llong alloc_count;         /* allocations since the arm */
static atomic_int alloc_failed;          /* the one at fail_at was refused */

void tg_testing_alloc_arm(long long fail_at_k) {
  atomic_store(&fail_at, fail_at_k);
  atomic_store(&alloc_count, 0);
  atomic_store(&alloc_failed, 0);
  atomic_store(&fail_armed, 1);
}

long long tg_testing_alloc_disarm(int *failed) {
  atomic_store(&fail_armed, 0);
  if (failed) *failed = atomic_load(&alloc_failed);
  return atomic_load(&alloc_count);
}

/* While armed: counts this allocation and says whether it is the one to refuse. */
static int injected_failure(void) {
  if (!atomic_load_explicit(&fail_armed, memory_order_relaxed)) return 0;
  const long long k = atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
  if (k != atomic_load_explicit(&fail_at, memory_order_relaxed)) return 0;
  atomic_store_explicit(&alloc_failed, 1, memory_order_relaxed);
  return 1;
}

void *tg_mem_alloc(size_t bytes, size_t align) {
  if (injected_failure()) return NULL;
  /* aligned_alloc takes sizes that are multiples of the alignment (C11;
   * ASan enforces it); 0 bytes still get a block of their own */
  const size_t rounded = bytes ? (bytes + align - 1) & ~(align - 1) : align;
  if (rounded < bytes) return NULL; /* bytes + align - 1 wrapped */
  return aligned_alloc(align, rounded);
}

void tg_mem_free(void *p) { free(p); }
