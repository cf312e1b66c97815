/*
 * Before/after of two builds of libtilegrad in one process, call by call.
 *
 *   ab_calls LIB_A LIB_B THREADS PRECISION PAIRS "B,H,Hkv,L,D,causal[,DOC];..."
 *
 * Both libraries are loaded side by side (dlopen, RTLD_LOCAL: each keeps
 * its own symbols and OpenMP teams come from the one libgomp). For every
 * shape, bf16 inputs, the training forward (tg_attn_train_fwd) and then
 * the backward (tg_attn_train_bwd) run on A and on B alternately, in the
 * order A B, B A, A B, ... after two warm-up pairs, so a slow stretch of
 * the machine lands on both sides of a pair alike. Printed per shape: the
 * median over the pairs of time(B) / time(A), for the forward and for the
 * backward, and each side's median ms. PRECISION: exact, split or bf16.
 *
 *   ab_calls LIB_A LIB_B THREADS PRECISION bits "B,H,Hkv,L,D,causal;..."
 *
 * compares instead: one forward and backward per shape on each build, and
 * whether O, L, dQ, dK and dV have the same bits (a change meant to keep
 * them; TG_ISA= picks the table of both).
 *
 * A shape with a seventh field, "1,H,Hkv,L,D,causal,DOC", is one row of L
 * packed with documents of DOC keys (the last one shorter where DOC does
 * not divide L; DOC = L: the row as one document): the varlen entry
 * points on the packed [L, H, D] layout, tg_attn_varlen_fwd and
 * tg_attn_varlen_bwd_step (D = rowsum(dO o O) and bf16 gradients, as the
 * torch op runs it), B = 1.
 *
 * AB_DKV_WRITE=1: the backward writes dK, dV (TG_ATTN_OPT_DKV_WRITE, as
 * the torch op and vs_torch.py run it) instead of adding to them; both
 * builds must know the flag.
 *
 * AB_PLAN_CPUS=N: both builds plan their work for N CPUs
 * (tg_testing_plan_cpus), whatever this machine has: on 2 cores the work
 * (the time at 2 threads) of the 16-CPU plan of a 16-core machine.
 *
 * Why: on the lent Xeon, runs of one binary in separate processes drifted
 * by up to 25% within minutes (the minimum of 9 rounds of one unchanged
 * backward read 26.8 and 38.3 ms), while the per-pair ratios of this tool
 * stayed within 0.95-1.05 for two builds of the same kernels. Built and run
 * by bench/ab_compare.sh -c.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilegrad.h"

typedef struct {
  tg_status (*ctx_create)(tg_ctx **);
  tg_status (*set_threads)(tg_ctx *, int);
  tg_status (*set_precision)(tg_ctx *, tg_attn_precision);
  __typeof__(tg_attn_params_init) *params_init;
  __typeof__(tg_attn_train_fwd) *fwd;
  __typeof__(tg_attn_train_bwd) *bwd;
  __typeof__(tg_attn_varlen_fwd) *varlen_fwd;           /* NULL: not in this build */
  __typeof__(tg_attn_varlen_bwd_step) *varlen_bwd_step; /* NULL: not in this build */
  tg_ctx *ctx;
} build;

static void *need(void *lib, const char *path, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "ab_calls: %s has no %s\n", path, name);
    exit(2);
  }
  return p;
}

static void open_build(build *b, const char *path, int threads, tg_attn_precision precision) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "ab_calls: %s\n", dlerror());
    exit(2);
  }
  b->ctx_create = need(lib, path, "tg_ctx_create");
  b->set_threads = need(lib, path, "tg_ctx_set_threads");
  b->set_precision = need(lib, path, "tg_ctx_set_attn_precision");
  b->params_init = need(lib, path, "tg_attn_params_init");
  b->fwd = need(lib, path, "tg_attn_train_fwd");
  b->bwd = need(lib, path, "tg_attn_train_bwd");
  b->varlen_fwd = (__typeof__(tg_attn_varlen_fwd) *)dlsym(lib, "tg_attn_varlen_fwd");
  b->varlen_bwd_step = (__typeof__(tg_attn_varlen_bwd_step) *)dlsym(lib, "tg_attn_varlen_bwd_step");
  const char *plan = getenv("AB_PLAN_CPUS");
  if (plan && *plan) { /* both builds plan for that many CPUs */
    void (*plan_cpus)(int) = (void (*)(int))need(lib, path, "tg_testing_plan_cpus");
    plan_cpus(atoi(plan));
  }
  if (b->ctx_create(&b->ctx) || b->set_threads(b->ctx, threads) ||
      b->set_precision(b->ctx, precision)) {
    fprintf(stderr, "ab_calls: %s: context set-up failed\n", path);
    exit(2);
  }
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *x, int n) { /* sorts x */
  qsort(x, (size_t)n, sizeof *x, by_value);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* A bf16 of uniform [-amp, amp), from a 32-bit LCG state. */
static uint16_t random_bf16(uint32_t *s, float amp) {
  *s = *s * 1103515245u + 12345u;
  const float f = amp * ((float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f);
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

enum { MAX_PAIRS = 256 };

/* One shape's problem: dense [B, H, L, D] or (docs.n_docs > 0) one packed
 * row of documents. */
typedef struct {
  tg_attn_params p;
  int causal;
  tg_attn_varlen docs; /* n_docs 0: dense */
} problem;

/* The forward: O (bf16) and L. */
static tg_status run_fwd(const build *b, const problem *pb, const uint16_t *Q, const uint16_t *K,
                         const uint16_t *V, void *O, float *lse) {
  if (pb->docs.n_docs)
    return b->varlen_fwd(b->ctx, TG_DTYPE_BF16, Q, K, V, O, lse, &pb->p, &pb->docs, pb->causal,
                         NULL);
  return b->fwd(b->ctx, TG_DTYPE_BF16, Q, K, V, O, lse, &pb->p, NULL, NULL, pb->causal, NULL);
}

/* The backward: dense, tg_attn_train_bwd from a fixed D_vec (f32 dQ, dK,
 * dV; dK, dV added to); packed, tg_attn_varlen_bwd_step from O (bf16). */
static tg_status run_bwd(const build *b, const problem *pb, const uint16_t *Q, const uint16_t *K,
                         const uint16_t *V, const void *O, const float *lse, const uint16_t *dO,
                         const float *delta, void *dQ, void *dK, void *dV,
                         const tg_attn_options *opt) {
  if (pb->docs.n_docs)
    return b->varlen_bwd_step(b->ctx, TG_DTYPE_BF16, TG_DTYPE_BF16, Q, K, V, O, lse, dO, dQ, dK,
                              dV, &pb->p, &pb->docs, pb->causal, opt);
  return b->bwd(b->ctx, TG_DTYPE_BF16, Q, K, V, lse, dO, delta, dQ, dK, dV, &pb->p, NULL, NULL,
                pb->causal, opt);
}

/* bits mode: one forward and backward of a shape on each build, then which
 * outputs differ in any bit; returns 1 if one does, 2 on an error. */
static int compare_shape(build ab[2], const char *spec, const problem *pb, const uint16_t *Q,
                         const uint16_t *K, const uint16_t *V, const uint16_t *dO,
                         const float *delta, size_t nq, size_t nk, size_t rows) {
  const size_t ge = pb->docs.n_docs ? 2 : 4; /* the gradients' bytes */
  const size_t bytes[5] = {2 * nq, 4 * rows, ge * nq, ge * nk, ge * nk};
  const char *names[5] = {"O", "L", "dQ", "dK", "dV"};
  void *out[2][5] = {{0}};
  int rc = 0;
  for (int w = 0; w < 2 && !rc; w++) {
    for (int i = 0; i < 5; i++) out[w][i] = calloc(1, bytes[i]); /* dK, dV accumulate */
    for (int i = 0; i < 5; i++) rc |= !out[w][i] ? 2 : 0;
    if (!rc && (run_fwd(&ab[w], pb, Q, K, V, out[w][0], out[w][1]) ||
                run_bwd(&ab[w], pb, Q, K, V, out[w][0], out[w][1], dO, delta, out[w][2],
                        out[w][3], out[w][4], NULL)))
      rc = 2;
    if (rc) fprintf(stderr, "ab_calls: %s failed on build %c\n", spec, 'A' + w);
  }
  if (!rc) {
    printf("%-20s", spec);
    for (int i = 0; i < 5; i++)
      if (memcmp(out[0][i], out[1][i], bytes[i])) printf(" %s differs", names[i]), rc = 1;
    printf("%s\n", rc ? "" : " same bits");
  }
  for (int w = 0; w < 2; w++)
    for (int i = 0; i < 5; i++) free(out[w][i]);
  return rc;
}

/* One shape: `pairs` alternating pairs after two warm-up pairs (0: bits
 * mode, compare_shape); 2 on an error. */
static int run_shape(build ab[2], const char *spec, int pairs) {
  int B, H, Hkv, L, D, causal, doc = 0;
  const int fields = sscanf(spec, "%d,%d,%d,%d,%d,%d,%d", &B, &H, &Hkv, &L, &D, &causal, &doc);
  if (fields < 6 || (fields == 7 && (doc < 1 || B != 1 || L < 1))) {
    fprintf(stderr, "ab_calls: shape '%s' is not B,H,Hkv,L,D,causal or 1,H,Hkv,L,D,causal,DOC\n",
            spec);
    return 2;
  }
  problem pb = {.causal = causal};
  if (ab[0].params_init(&pb.p, B, H, Hkv, L, L, D, 1.0f / sqrtf((float)D))) {
    fprintf(stderr, "ab_calls: shape '%s' refused\n", spec);
    return 2;
  }
  int32_t *cu = NULL;
  if (doc) { /* packed rows: [L, H, D], documents of doc keys */
    if (!ab[0].varlen_fwd || !ab[1].varlen_fwd || !ab[0].varlen_bwd_step ||
        !ab[1].varlen_bwd_step) {
      fprintf(stderr, "ab_calls: %s: a build has no varlen entry points\n", spec);
      return 2;
    }
    const int n = (L + doc - 1) / doc;
    cu = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int i = 0; i <= n; i++) cu[i] = i * doc < L ? i * doc : L;
    pb.docs = (tg_attn_varlen){cu, cu, n, 0, NULL};
    const int64_t qs[3] = {0, D, (int64_t)H * D}, ks[3] = {0, D, (int64_t)Hkv * D};
    memcpy(pb.p.Q_strides, qs, sizeof qs), memcpy(pb.p.O_strides, qs, sizeof qs);
    memcpy(pb.p.K_strides, ks, sizeof ks), memcpy(pb.p.V_strides, ks, sizeof ks);
  }
  const size_t nq = (size_t)B * H * L * D, nk = (size_t)B * Hkv * L * D, rows = (size_t)B * H * L;
  uint16_t *Q = malloc(2 * nq), *K = malloc(2 * nk), *V = malloc(2 * nk), *dO = malloc(2 * nq),
           *O = malloc(2 * nq);
  float *lse = malloc(4 * rows), *delta = malloc(4 * rows), *dQ = malloc(4 * nq),
        *dK = malloc(4 * nk), *dV = malloc(4 * nk);
  uint32_t s = 12345;
  for (size_t i = 0; i < nq; i++) Q[i] = random_bf16(&s, 2.0f), dO[i] = random_bf16(&s, 0.5f);
  for (size_t i = 0; i < nk; i++) K[i] = random_bf16(&s, 2.0f), V[i] = random_bf16(&s, 1.0f);
  for (size_t i = 0; i < rows; i++) delta[i] = 0.01f; /* any fixed D_vec */
  if (pairs == 0) {
    const int rc = compare_shape(ab, spec, &pb, Q, K, V, dO, delta, nq, nk, rows);
    free(Q), free(K), free(V), free(dO), free(O), free(lse), free(delta), free(dQ), free(dK),
        free(dV), free(cu);
    return rc;
  }
  double t_fwd[2][MAX_PAIRS], t_bwd[2][MAX_PAIRS], r_fwd[MAX_PAIRS], r_bwd[MAX_PAIRS];
  const char *write = getenv("AB_DKV_WRITE");
  const tg_attn_options dkv_write = {.flags = TG_ATTN_OPT_DKV_WRITE};
  const tg_attn_options *opt = write && atoi(write) ? &dkv_write : NULL;
  for (int it = -2; it < pairs; it++)
    for (int k = 0; k < 2; k++) {
      const int w = (it & 1) ? 1 - k : k; /* A B, then B A */
      const double t0 = seconds();
      tg_status st = run_fwd(&ab[w], &pb, Q, K, V, O, lse);
      const double t1 = seconds();
      if (!st) st = run_bwd(&ab[w], &pb, Q, K, V, O, lse, dO, delta, dQ, dK, dV, opt);
      const double t2 = seconds();
      if (st) {
        fprintf(stderr, "ab_calls: %s failed on build %c (status %d)\n", spec, 'A' + w, (int)st);
        free(cu);
        return 2;
      }
      if (it >= 0) t_fwd[w][it] = t1 - t0, t_bwd[w][it] = t2 - t1;
    }
  for (int i = 0; i < pairs; i++)
    r_fwd[i] = t_fwd[1][i] / t_fwd[0][i], r_bwd[i] = t_bwd[1][i] / t_bwd[0][i];
  const double rf = median(r_fwd, pairs), rb = median(r_bwd, pairs);
  printf("%-20s fwd B/A %.3f (A %8.2f, B %8.2f ms)   bwd B/A %.3f (A %8.2f, B %8.2f ms)\n", spec,
         rf, 1e3 * median(t_fwd[0], pairs), 1e3 * median(t_fwd[1], pairs), rb,
         1e3 * median(t_bwd[0], pairs), 1e3 * median(t_bwd[1], pairs));
  fflush(stdout);
  free(Q), free(K), free(V), free(dO), free(O), free(lse), free(delta), free(dQ), free(dK), free(dV),
      free(cu);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: ab_calls LIB_A LIB_B THREADS exact|split|bf16 PAIRS|bits "
                    "\"B,H,Hkv,L,D,causal[,DOC];...\"\n");
    return 2;
  }
  const int threads = atoi(argv[3]), pairs = strcmp(argv[5], "bits") ? atoi(argv[5]) : 0;
  const char *names[] = {"exact", "split", "bf16"};
  const tg_attn_precision modes[] = {TG_ATTN_PRECISION_EXACT, TG_ATTN_PRECISION_SPLIT,
                                     TG_ATTN_PRECISION_BF16};
  int m = 0;
  while (m < 3 && strcmp(argv[4], names[m])) m++;
  if (m == 3 || threads < 1 || (pairs < 1 && strcmp(argv[5], "bits")) || pairs > MAX_PAIRS) {
    fprintf(stderr, "ab_calls: bad THREADS, PRECISION or PAIRS (1..%d, or bits)\n", MAX_PAIRS);
    return 2;
  }
  build ab[2];
  open_build(&ab[0], argv[1], threads, modes[m]);
  open_build(&ab[1], argv[2], threads, modes[m]);
  printf("A = %s\nB = %s\nthreads %d, precision %s, ", argv[1], argv[2], threads, names[m]);
  if (pairs)
    printf("%d pairs per shape (medians)\n", pairs);
  else
    printf("outputs compared bit for bit\n");
  int rc = 0; /* 2: an error; 1: a shape's outputs differ (bits mode) */
  char *list = strdup(argv[6]);
  for (char *spec = strtok(list, ";"); spec && rc < 2; spec = strtok(NULL, ";")) {
    const int r = run_shape(ab, spec, pairs);
    rc = r > rc ? r : rc;
  }
  free(list);
  return rc;
}
