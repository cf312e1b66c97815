/* The thread count of a call: the context's, else OpenMP's default
 * capped by the cgroup CPU quota. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

/* The CPU quota in the cgroup file `dir`/cpu.max (v2: "max 100000" or
 * "<quota> <period>") or `dir`/cpu.cfs_quota_us + cpu.cfs_period_us (v1;
 * quota -1 = none), as whole CPUs rounded up; 0 when there is none. */
static int quota_in(const char *dir) {
  char path[4096 + 32];
  long long quota = -1, period = 0;
  snprintf(path, sizeof path, "%s/cpu.max", dir);
  FILE *f = fopen(path, "r");
  if (f) {
    char q[32] = "";
    if (fscanf(f, "%31s %lld", q, &period) != 2 || strcmp(q, "max") == 0 ||
        sscanf(q, "%lld", &quota) != 1)
      quota = -1;
    fclose(f);
  } else {
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    if ((f = fopen(path, "r"))) {
      if (fscanf(f, "%lld", &quota) != 1) quota = -1;
      fclose(f);
      snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
      if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%lld", &period) != 1) period = 0;
        fclose(f);
      }
    }
  }
  if (quota <= 0 || period <= 0) return 0;
  const long long cpus = (quota + period - 1) / period;
  return cpus > 1 << 20 ? 1 << 20 : (int)cpus;
}

/* Does the comma-separated controller list name "cpu"? */
static int lists_cpu(const char *list) {
  for (const char *p = list; *p;) {
    const size_t n = strcspn(p, ",");
    if (n == 3 && strncmp(p, "cpu", 3) == 0) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

int tg_cgroup_cpu_limit(const char *cgroup_root, const char *proc_self_cgroup) {
  FILE *f = fopen(proc_self_cgroup, "r");
  if (!f) return 0;
  int limit = 0;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    /* "<id>:<controllers>:<path>": v2 is "0::<path>"; v1 lists "cpu" */
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *controllers = c1 + 1;
    char *path = c2 + 1;
    path[strcspn(path, "\n")] = '\0';
    char dir[4096];
    if (controllers[0] == '\0')
      snprintf(dir, sizeof dir, "%s%s", cgroup_root, path);
    else if (lists_cpu(controllers))
      snprintf(dir, sizeof dir, "%s/cpu%s", cgroup_root, path);
    else
      continue;
    /* the tightest quota from this cgroup up to the root applies */
    for (;;) {
      const int q = quota_in(dir);
      if (q > 0 && (limit == 0 || q < limit)) limit = q;
      char *slash = strrchr(dir, '/');
      if (!slash || (size_t)(slash - dir) < strlen(cgroup_root)) break;
      *slash = '\0';
    }
  }
  fclose(f);
  return limit;
}

/* OpenMP's default (libgomp: the CPUs of the affinity mask, or
 * OMP_NUM_THREADS), capped by the cgroup CPU quota unless OMP_NUM_THREADS
 * asks for a number: a 2-CPU container on a 64-core host gets 2 threads,
 * not 64 time-sliced ones. The quota is read once per process. */
static int default_threads(void) {
  static int quota = -1; /* -1: not read yet; benign race: every reader computes the same */
  const int omp = omp_get_max_threads();
  if (getenv("OMP_NUM_THREADS")) return omp;
  if (quota < 0) quota = tg_cgroup_cpu_limit("/sys/fs/cgroup", "/proc/self/cgroup");
  return quota > 0 && quota < omp ? quota : omp;
}

int tg_threads(const tg_ctx *ctx) {
  return ctx->threads > 0 ? ctx->threads : default_threads();
}
