/*
 * What the work plans read of the machine. A plan (how finely a kernel
 * splits its work into items, and so in what order some sums run) may
 * depend on the machine but never on the thread count of a call: results
 * stay bitwise identical across thread counts in deterministic mode.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#include "engine.h"
#include "tilegrad_testing.h"

static atomic_int testing_cpus; /* tg_testing_plan_cpus; 0: off */

void tg_testing_plan_cpus(int n) {
  atomic_store_explicit(&testing_cpus, n > 0 ? n : 0, memory_order_relaxed);
}

int tg_plan_cpus(void) {
  static atomic_int cached; /* 0: not read yet; racing readers compute the same */
  const int forced = atomic_load_explicit(&testing_cpus, memory_order_relaxed);
  if (forced > 0) return forced;
  int n = atomic_load_explicit(&cached, memory_order_relaxed);
  if (n > 0) return n;
  n = 0;
#if defined(__linux__)
  cpu_set_t set; /* the first 1024 CPUs: a larger machine is planned as 1024 */
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    n = online > 0 && online < 1 << 20 ? (int)online : 1;
  }
  const int quota = tg_cgroup_cpu_limit("/sys/fs/cgroup", "/proc/self/cgroup");
  if (quota > 0 && quota < n) n = quota;
  atomic_store_explicit(&cached, n, memory_order_relaxed);
  return n;
}
