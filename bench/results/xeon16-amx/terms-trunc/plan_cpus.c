/*
 * The backward at THREADS threads with its KV schedule planned for each of
 * the CPU counts given (tg_testing_plan_cpus: fewer key ranges and query
 * groups, so fewer, larger work items), alternating the plans round by
 * round; per shape the median over the rounds of each plan's fastest of 3
 * calls, and its ratio to the first plan's.
 *
 *   plan_cpus THREADS exact|bf16 ROUNDS "B,H,Hkv,L,D,causal;..." CPUS...
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilegrad.h"
#include "tilegrad_testing.h"

enum { MAX_PLANS = 8, MAX_ROUNDS = 64 };

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: plan_cpus THREADS exact|bf16 ROUNDS SHAPES CPUS...\n");
    return 2;
  }
  const int threads = atoi(argv[1]), rounds = atoi(argv[3]), n_plans = argc - 5;
  const int bf16 = !strcmp(argv[2], "bf16");
  if (rounds < 1 || rounds > MAX_ROUNDS || n_plans > MAX_PLANS) return 2;
  tg_ctx *ctx;
  if (tg_ctx_create(&ctx) || tg_ctx_set_threads(ctx, threads) ||
      tg_ctx_set_attn_precision(ctx, bf16 ? TG_ATTN_PRECISION_BF16 : TG_ATTN_PRECISION_EXACT))
    return 2;
  printf("threads %d, %s, %d rounds: median ms per plan (ratio to plan %s)\n", threads, argv[2],
         rounds, argv[5]);
  char *shapes = strdup(argv[4]);
  for (char *spec = strtok(shapes, ";"); spec; spec = strtok(NULL, ";")) {
    int B, H, Hkv, L, D, causal;
    if (sscanf(spec, "%d,%d,%d,%d,%d,%d", &B, &H, &Hkv, &L, &D, &causal) != 6) return 2;
    tg_attn_params p;
    if (tg_attn_params_init(&p, B, H, Hkv, L, L, D, 1.0f / sqrtf((float)D))) return 2;
    const size_t nq = (size_t)B * H * L * D, nk = (size_t)B * Hkv * L * D, rows = (size_t)B * H * L;
    uint16_t *Q = malloc(2 * nq), *K = malloc(2 * nk), *V = malloc(2 * nk), *dO = malloc(2 * nq),
             *O = malloc(2 * nq);
    float *lse = malloc(4 * rows), *delta = malloc(4 * rows), *dQ = malloc(4 * nq),
          *dK = malloc(4 * nk), *dV = malloc(4 * nk);
    uint32_t s = 777;
    for (size_t i = 0; i < nq; i++) s = s * 1103515245u + 12345u, Q[i] = 0x3f00 ^ (s >> 16 & 0x80ff), dO[i] = Q[i] ^ 0x0100;
    for (size_t i = 0; i < nk; i++) s = s * 1103515245u + 12345u, K[i] = 0x3f00 ^ (s >> 16 & 0x80ff), V[i] = K[i] ^ 0x0100;
    for (size_t i = 0; i < rows; i++) delta[i] = 0.01f;
    if (tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, O, lse, &p, NULL, NULL, causal, NULL)) return 2;
    double t[MAX_PLANS][MAX_ROUNDS];
    for (int r = -1; r < rounds; r++)
      for (int k = 0; k < n_plans; k++) {
        tg_testing_plan_cpus(atoi(argv[5 + k]));
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
          const double t0 = seconds();
          if (tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q, K, V, lse, dO, delta, dQ, dK, dV, &p, NULL,
                                NULL, causal, NULL))
            return 2;
          const double dt = seconds() - t0;
          best = dt < best ? dt : best;
        }
        if (r >= 0) t[k][r] = best;
      }
    printf("%-20s", spec);
    double m0 = 0;
    for (int k = 0; k < n_plans; k++) {
      qsort(t[k], (size_t)rounds, sizeof(double), by_value);
      const double m = t[k][rounds / 2];
      if (k == 0) m0 = m;
      printf("  plan %s %7.2f ms (%.3f)", argv[5 + k], 1e3 * m, m / m0);
    }
    printf("\n");
    fflush(stdout);
    free(Q), free(K), free(V), free(dO), free(O), free(lse), free(delta), free(dQ), free(dK), free(dV);
  }
  tg_testing_plan_cpus(0);
  free(shapes);
  return 0;
}
