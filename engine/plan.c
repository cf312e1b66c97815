/*
 * What the work plans read of the machine. A plan (how finely a kernel
 * splits its work into items, and so in what order some sums run; how much
 * of it stays in cache at once) may depend on the machine but never on the
 * thread count of a call: results stay bitwise identical across thread
 * counts in deterministic mode.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "engine.h"
#include "tilegrad_testing.h"

static atomic_int testing_cpus;          /* tg_testing_plan_cpus; 0: off */
static atomic_llong testing_l2_bytes = -1; /* tg_testing_plan_l2_bytes; -1: off */

void tg_testing_plan_cpus(int n) {
  atomic_store_explicit(&testing_cpus, n > 0 ? n : 0, memory_order_relaxed);
}

void tg_testing_plan_l2_bytes(long long bytes) {
  atomic_store_explicit(&testing_l2_bytes, bytes >= 0 ? bytes : -1, memory_order_relaxed);
}

/* The CPUs come from OpenMP (omp_get_num_procs: libgomp and libomp count
 * the affinity mask the process started with), not from the calling
 * thread's own mask: with OMP_PROC_BIND or OMP_PLACES set, the runtime
 * binds the initial thread to its first place before main, so that
 * thread's mask holds one place (one CPU where the places are threads or
 * the machine has no SMT). Plans read from it were made for 1 CPU: on the
 * lent 16-CPU Xeon with OMP_PLACES=cores OMP_PROC_BIND=spread, the
 * 1,6,2,384,128 backward had 4 work items instead of 8 and took 1.8x the
 * time at 16 threads. */
int tg_plan_cpus(void) {
  static atomic_int cached; /* 0: not read yet; racing readers compute the same */
  const int forced = atomic_load_explicit(&testing_cpus, memory_order_relaxed);
  if (forced > 0) return forced;
  int n = atomic_load_explicit(&cached, memory_order_relaxed);
  if (n > 0) return n;
  n = omp_get_num_procs();
  if (n < 1) n = 1;
  const int quota = tg_cgroup_cpu_limit("/sys/fs/cgroup", "/proc/self/cgroup");
  if (quota > 0 && quota < n) n = quota;
  atomic_store_explicit(&cached, n, memory_order_relaxed);
  return n;
}

/* tilegrad.h; tg_testing_plan_cpus forces it as it forces tg_plan_cpus. */
int tg_ctx_plan_cpus(const tg_ctx *ctx) {
  const int cpus = tg_plan_cpus();
  if (!ctx || ctx->deterministic ||
      atomic_load_explicit(&testing_cpus, memory_order_relaxed) > 0)
    return cpus;
  const int threads = tg_threads(ctx);
  return threads < cpus ? threads : cpus;
}

/* CPUs in a sysfs CPU list such as "0", "0,64" or "0-3,8-11"; 0 if malformed. */
static long count_cpu_list(const char *s) {
  long n = 0;
  while (*s && *s != '\n') {
    char *end;
    const long lo = strtol(s, &end, 10);
    long hi = lo;
    if (end == s || lo < 0) return 0;
    if (*end == '-') {
      s = end + 1;
      hi = strtol(s, &end, 10);
      if (end == s || hi < lo) return 0;
    }
    n += hi - lo + 1;
    s = end + (*end == ',');
  }
  return n;
}

/* Linux: cpu0's level-2 data or unified cache from sysfs, divided by the
 * CPUs that share it (SMT siblings, or a cluster); 0 if not found. */
static long long l2_from_sysfs(void) {
  for (int i = 0; i < 16; i++) {
    char path[96], buf[256];
    long long level = 0, kib = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (!f) return 0; /* the index directories are numbered without gaps */
    if (fscanf(f, "%lld", &level) != 1) level = 0;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
    if (level != 2 || !(f = fopen(path, "r"))) continue;
    const int instruction = fgets(buf, sizeof buf, f) && strncmp(buf, "Instruction", 11) == 0;
    fclose(f);
    if (instruction) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if (!(f = fopen(path, "r"))) return 0;
    const int ok = fscanf(f, "%lldK", &kib) == 1 && kib > 0;
    fclose(f);
    if (!ok) return 0;
    long sharers = 1;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/shared_cpu_list", i);
    if ((f = fopen(path, "r"))) {
      if (fgets(buf, sizeof buf, f) && count_cpu_list(buf) > 0) sharers = count_cpu_list(buf);
      fclose(f);
    }
    return kib * 1024 / sharers;
  }
  return 0;
}

long long tg_plan_l2_bytes(void) {
  static atomic_llong cached = -1; /* -1: not read yet; racing readers compute the same */
  const long long forced = atomic_load_explicit(&testing_l2_bytes, memory_order_relaxed);
  if (forced >= 0) return forced;
  long long b = atomic_load_explicit(&cached, memory_order_relaxed);
  if (b >= 0) return b;
  b = l2_from_sysfs();
#if defined(_SC_LEVEL2_CACHE_SIZE)
  if (b <= 0) b = sysconf(_SC_LEVEL2_CACHE_SIZE) > 0 ? sysconf(_SC_LEVEL2_CACHE_SIZE) : 0;
#endif
  if (b <= 0) b = TG_PLAN_L2_DEFAULT;
  atomic_store_explicit(&cached, b, memory_order_relaxed);
  return b;
}
