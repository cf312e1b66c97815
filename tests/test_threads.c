/*
 * The default thread count: the cgroup CPU quota reader (engine/context.c)
 * on fake cgroup trees, v2 and v1, nested limits, no limit, unreadable
 * files; and that a context with no thread count set never starts more
 * threads than OpenMP's default.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <omp.h>

#include "engine.h"
#include "testutil.h"

static char root[256];

static void put(const char *rel, const char *text) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  /* mkdir -p of the file's directory */
  for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int limit(void) {
  char proc[512];
  snprintf(proc, sizeof proc, "%s/proc_self_cgroup", root);
  return tg_cgroup_cpu_limit(root, proc);
}

static int setup(void **state) {
  snprintf(root, sizeof root, "/tmp/tg-cgroup-XXXXXX");
  assert_non_null(mkdtemp(root));
  return 0;
}

static int teardown(void **state) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_v2(void **state) {
  put("proc_self_cgroup", "0::/a/b\n");
  assert_int_equal(limit(), 0); /* no cpu.max anywhere */
  put("a/b/cpu.max", "max 100000\n");
  assert_int_equal(limit(), 0); /* "max" = no quota */
  put("a/b/cpu.max", "150000 100000\n");
  assert_int_equal(limit(), 2); /* 1.5 CPUs -> 2 threads */
  put("a/cpu.max", "100000 100000\n");
  assert_int_equal(limit(), 1); /* a tighter parent wins */
  put("a/b/cpu.max", "garbage\n");
  assert_int_equal(limit(), 1);
}

static void test_v1(void **state) {
  put("proc_self_cgroup", "12:memory:/x\n3:cpu,cpuacct:/job/7\n");
  put("cpu/job/7/cpu.cfs_quota_us", "-1\n");
  put("cpu/job/7/cpu.cfs_period_us", "100000\n");
  assert_int_equal(limit(), 0);
  put("cpu/job/7/cpu.cfs_quota_us", "400000\n");
  assert_int_equal(limit(), 4);
  /* "cpuacct" alone is not the cpu controller */
  put("proc_self_cgroup", "3:cpuacct:/job/7\n");
  assert_int_equal(limit(), 0);
}

static void test_unreadable(void **state) {
  assert_int_equal(tg_cgroup_cpu_limit(root, "/nonexistent/tg/cgroup"), 0);
  put("proc_self_cgroup", "not a cgroup line\n");
  assert_int_equal(limit(), 0);
}

/* A context with no thread count runs at most OpenMP's default. */
static void test_default_within_openmp(void **state) {
  tg_ctx *ctx = tu_ctx(0, TG_ISA_AUTO);
  const int n = tg_threads(ctx);
  printf("  default threads: %d (OpenMP default %d)\n", n, omp_get_max_threads());
  assert_true(n >= 1 && n <= omp_get_max_threads());
  assert_int_equal(tg_ctx_set_threads(ctx, 5), TG_OK);
  assert_int_equal(tg_threads(ctx), 5); /* an explicit count is kept */
  tg_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_v2),
      cmocka_unit_test(test_v1),
      cmocka_unit_test(test_unreadable),
      cmocka_unit_test(test_default_within_openmp),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
