/*
 * Threads around the library:
 *  - the default thread count: the cgroup CPU quota reader (engine/threads.c)
 *    on fake cgroup trees, v2 and v1, nested limits, no limit, unreadable
 *    files; a context with no thread count set never starts more threads
 *    than OpenMP's default;
 *  - one context entered by two threads at once: the second call gets
 *    TG_ERR_BUSY with its outputs untouched, and the first call's result is
 *    the serial one;
 *  - several contexts in several threads at once give the same bits as
 *    serial runs;
 *  - the work plans count the process's CPUs even where OpenMP has bound
 *    the initial thread to one place (ctest's test_threads.bound);
 *  - tg_dispatch_grids runs every item once, rank by rank across the grids.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <omp.h>

#include "engine.h"
#include "tilegrad_testing.h"
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

/* With OMP_PLACES and OMP_PROC_BIND set (test_threads.bound), the runtime
 * binds the initial thread to its first place before main: the plans must
 * still count every place's CPUs (capped by the cgroup quota), not the
 * bound thread's own mask. Without places this only checks the bounds. */
static void test_plan_cpus_all_places(void **state) {
  int place_cpus = 0;
  for (int p = 0; p < omp_get_num_places(); p++) place_cpus += omp_get_place_num_procs(p);
  const int quota = tg_cgroup_cpu_limit("/sys/fs/cgroup", "/proc/self/cgroup");
  const int plan = tg_plan_cpus();
  printf("  plan CPUs: %d (places %d with %d CPUs, quota %d)\n", plan, omp_get_num_places(),
         place_cpus, quota);
  assert_true(plan >= 1 && plan <= omp_get_num_procs());
  if (place_cpus > 0)
    assert_int_equal(plan, quota > 0 && quota < place_cpus ? quota : place_cpus);
}

/* A context's plan CPUs (tg_ctx_plan_cpus): the machine's in deterministic
 * mode whatever the threads, else capped by the threads; a forced count
 * (tg_testing_plan_cpus, as the suites use) wins either way. */
static void test_ctx_plan_cpus(void **state) {
  tg_testing_plan_cpus(0);
  const int machine = tg_plan_cpus();
  tg_ctx *ctx = NULL;
  assert_int_equal(tg_ctx_create(&ctx), TG_OK);
  const int threads[] = {1, 2, 3, machine, machine + 5};
  for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
    assert_int_equal(tg_ctx_set_threads(ctx, threads[i]), TG_OK);
    assert_int_equal(tg_ctx_set_deterministic(ctx, 0), TG_OK);
    assert_int_equal(tg_ctx_plan_cpus(ctx), threads[i] < machine ? threads[i] : machine);
    assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
    assert_int_equal(tg_ctx_plan_cpus(ctx), machine);
  }
  tg_testing_plan_cpus(7);
  assert_int_equal(tg_ctx_set_deterministic(ctx, 0), TG_OK);
  assert_int_equal(tg_ctx_set_threads(ctx, 1), TG_OK);
  assert_int_equal(tg_ctx_plan_cpus(ctx), 7);
  tg_testing_plan_cpus(0);
  assert_int_equal(tg_ctx_plan_cpus(NULL), machine);
  tg_ctx_destroy(ctx);
}

/* tg_dispatch_grids: every item of every grid runs once, at 1-3 threads;
 * on one thread in rank order, item r of every grid (the grids of most
 * items first, ties in the order given) before item r + 1 of any. Grids of
 * unequal, equal and no items. */
enum { GRIDS = 5, MAX_ITEMS = 8 };
typedef struct {
  int id;
  int64_t nx, ny;
  int *counts;      /* [GRIDS][MAX_ITEMS] */
  int *seq, *at;    /* one thread: (grid, item) in the order run */
} grid_probe;

static void count_item(const void *args, int64_t x, int64_t y, int64_t z, void *scratch) {
  (void)scratch;
  const grid_probe *g = args;
  const int64_t item = x + g->nx * (y + g->ny * z);
#pragma omp atomic
  g->counts[g->id * MAX_ITEMS + item]++;
  if (omp_get_num_threads() == 1) {
    g->seq[2 * *g->at] = g->id, g->seq[2 * *g->at + 1] = (int)item;
    ++*g->at;
  }
}

static void test_dispatch_grids_order(void **state) {
  (void)state;
  const int64_t dims[GRIDS][3] = {{2, 1, 3}, {0, 4, 1}, {4, 2, 1}, {6, 1, 1}, {1, 1, 1}};
  int counts[GRIDS * MAX_ITEMS], seq[2 * GRIDS * MAX_ITEMS], at = 0;
  grid_probe probes[GRIDS];
  tg_grid grids[GRIDS];
  int items[GRIDS], total = 0;
  for (int i = 0; i < GRIDS; i++) {
    probes[i] = (grid_probe){i, dims[i][0], dims[i][1], counts, seq, &at};
    grids[i] = (tg_grid){dims[i][0], dims[i][1], dims[i][2], count_item, &probes[i]};
    items[i] = (int)(dims[i][0] * dims[i][1] * dims[i][2]);
    total += items[i];
  }
  /* the expected order: the grids by items, most first, stable; then rank by rank */
  int order[GRIDS], want[2 * GRIDS * MAX_ITEMS], n = 0;
  for (int i = 0; i < GRIDS; i++) order[i] = i;
  for (int i = 1; i < GRIDS; i++)
    for (int j = i; j > 0 && items[order[j - 1]] < items[order[j]]; j--) {
      const int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  for (int r = 0; r < MAX_ITEMS; r++)
    for (int i = 0; i < GRIDS; i++)
      if (r < items[order[i]]) want[n++] = order[i], want[n++] = r;
  assert_int_equal(n, 2 * total);
  tg_ctx *ctx = NULL;
  assert_int_equal(tg_ctx_create(&ctx), TG_OK);
  for (int threads = 1; threads <= 3; threads++) {
    assert_int_equal(tg_ctx_set_threads(ctx, threads), TG_OK);
    memset(counts, 0, sizeof counts);
    at = 0;
    assert_int_equal(tg_dispatch_grids(ctx, grids, GRIDS, 64), TG_OK);
    for (int i = 0; i < GRIDS; i++)
      for (int k = 0; k < MAX_ITEMS; k++)
        assert_int_equal(counts[i * MAX_ITEMS + k], k < items[i] ? 1 : 0);
    if (threads == 1) {
      assert_int_equal(at, total);
      assert_memory_equal(seq, want, sizeof(int) * 2 * (size_t)total);
    }
  }
  tg_ctx_destroy(ctx);
}

/* A transpose big enough to take a while (tens of ms), on a given context. */
enum { TR_ROWS = 1536, TR_COLS = 2048 };
typedef struct {
  tg_ctx *ctx;
  const float *in;
  float *out;
  tg_status st;
  volatile int *started, *done;
} tr_job;

static void *run_transposes(void *arg) {
  tr_job *j = arg;
  *j->started = 1;
  j->st = TG_OK;
  /* the main thread's probes may hold the context for a moment too: those
   * calls are refused with TG_ERR_BUSY and tried again */
  for (int rep = 0; rep < 20 && j->st == TG_OK; rep++)
    do j->st = tg_transpose_2d(j->ctx, j->in, j->out, TR_ROWS, TR_COLS);
    while (j->st == TG_ERR_BUSY);
  *j->done = 1;
  return NULL;
}

static void test_context_busy(void **state) {
  const size_t n = (size_t)TR_ROWS * TR_COLS;
  float *in = tu_alloc(sizeof(float) * n), *out = tu_alloc(sizeof(float) * n);
  float *mine = tu_alloc(sizeof(float) * 64);
  tu_rng r = tu_rng_make(tu_seed() + 7);
  tu_fill_f32(&r, in, (int64_t)n, -1, 1);
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  volatile int started = 0, done = 0;
  tr_job job = {ctx, in, out, TG_OK, &started, &done};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, run_transposes, &job), 0);
  while (!started) {
  }
  /* while the other thread is inside the context: BUSY, nothing written */
  int busy = 0, other = 0;
  const float src[64] = {1};
  while (!done) {
    for (int i = 0; i < 64; i++) mine[i] = 42.0f;
    const tg_status st = tg_transpose_2d(ctx, src, mine, 8, 8);
    if (st == TG_ERR_BUSY) {
      busy++;
      for (int i = 0; i < 64; i++)
        if (mine[i] != 42.0f) TU_FAIL("a call refused with TG_ERR_BUSY wrote its output");
    } else if (st == TG_OK) {
      other++; /* between two of the other thread's calls */
    } else {
      TU_FAIL("unexpected status %d (%s)", (int)st, tg_status_str(st));
    }
  }
  pthread_join(th, NULL);
  printf("  concurrent calls on one context: %d refused with TG_ERR_BUSY, %d ran between\n",
         busy, other);
  assert_int_equal(job.st, TG_OK);
  assert_true(busy > 0);
  for (int64_t i = 0; i < TR_ROWS; i++)
    for (int64_t c = 0; c < TR_COLS; c++)
      if (out[c * TR_ROWS + i] != in[i * TR_COLS + c]) TU_FAIL("transpose wrong at %lld", (long long)i);
  assert_int_equal(tg_transpose_2d(ctx, src, mine, 8, 8), TG_OK); /* released */
  tg_ctx_destroy(ctx);
  free(in), free(out), free(mine);
}

/* Two contexts, two threads, at once: the same bits as one after the other
 * (an RMSNorm backward with its accumulated grad_weight, 2 OpenMP threads
 * each). */
typedef struct {
  tg_ctx *ctx;
  const float *x, *w, *dy;
  float *dx, *dw;
  tg_status st;
} rms_job;
enum { RMS_ROWS = 300, RMS_DIM = 1000 };
static void *run_rms(void *arg) {
  rms_job *j = arg;
  j->st = tg_rms_norm_backward(j->ctx, j->x, j->w, j->dy, j->dx, j->dw, RMS_ROWS, RMS_DIM,
                               1e-5f);
  return NULL;
}

static void test_contexts_in_parallel(void **state) {
  const int64_t n = (int64_t)RMS_ROWS * RMS_DIM;
  tu_rng r = tu_rng_make(tu_seed() + 9);
  float *x = tu_alloc(sizeof(float) * n), *dy = tu_alloc(sizeof(float) * n);
  float *w = tu_alloc(sizeof(float) * RMS_DIM);
  tu_fill_f32(&r, x, n, -1, 1), tu_fill_f32(&r, dy, n, -1, 1), tu_fill_f32(&r, w, RMS_DIM, -1, 1);
  float *dx[2][2], *dw[2][2]; /* [serial/parallel][job] */
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++) {
      dx[m][j] = tu_alloc(sizeof(float) * n);
      dw[m][j] = calloc(RMS_DIM, sizeof(float));
    }
  rms_job jobs[2][2];
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++) {
      jobs[m][j] = (rms_job){tu_ctx(2, TG_ISA_AUTO), x, w, dy, dx[m][j], dw[m][j], TG_OK};
      assert_int_equal(tg_ctx_set_deterministic(jobs[m][j].ctx, 1), TG_OK);
    }
  run_rms(&jobs[0][0]), run_rms(&jobs[0][1]); /* serial */
  pthread_t th[2];
  for (int j = 0; j < 2; j++) assert_int_equal(pthread_create(&th[j], NULL, run_rms, &jobs[1][j]), 0);
  for (int j = 0; j < 2; j++) pthread_join(th[j], NULL);
  for (int j = 0; j < 2; j++) {
    assert_int_equal(jobs[0][j].st, TG_OK);
    assert_int_equal(jobs[1][j].st, TG_OK);
    assert_memory_equal(dx[0][j], dx[1][j], sizeof(float) * n);
    assert_memory_equal(dw[0][j], dw[1][j], sizeof(float) * RMS_DIM);
  }
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++) tg_ctx_destroy(jobs[m][j].ctx), free(dx[m][j]), free(dw[m][j]);
  free(x), free(dy), free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_v2),
      cmocka_unit_test(test_v1),
      cmocka_unit_test(test_unreadable),
      cmocka_unit_test(test_default_within_openmp),
      cmocka_unit_test(test_plan_cpus_all_places),
      cmocka_unit_test(test_ctx_plan_cpus),
      cmocka_unit_test(test_dispatch_grids_order),
      cmocka_unit_test(test_context_busy),
      cmocka_unit_test(test_contexts_in_parallel),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
