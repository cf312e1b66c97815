/*
 * The backward (bf16 inputs, dK, dV written) of one shape at several
 * thread counts with its KV schedule planned for a fixed CPU count
 * (tg_testing_plan_cpus: the same work items, so the same work, at every
 * count), the counts alternating round by round; per count the median
 * over the rounds of the fastest of 3 calls, and the speedup over the
 * first count.
 *
 *   sweep exact|bf16 PLAN_CPUS ROUNDS B,H,Hkv,L,D,causal THREADS...
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilegrad.h"
#include "tilegrad_testing.h"

enum { MAX_COUNTS = 8, MAX_ROUNDS = 64 };

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
    fprintf(stderr, "usage: sweep exact|bf16 PLAN_CPUS ROUNDS SHAPE THREADS...\n");
    return 2;
  }
  const int bf16 = !strcmp(argv[1], "bf16"), rounds = atoi(argv[3]), n = argc - 5;
  int B, H, Hkv, L, D, causal;
  if (rounds < 1 || rounds > MAX_ROUNDS || n > MAX_COUNTS ||
      sscanf(argv[4], "%d,%d,%d,%d,%d,%d", &B, &H, &Hkv, &L, &D, &causal) != 6)
    return 2;
  tg_testing_plan_cpus(atoi(argv[2]));
  tg_ctx *ctx;
  tg_attn_params p;
  tg_attn_options opt = {0};
  opt.flags = TG_ATTN_OPT_DKV_WRITE;
  if (tg_ctx_create(&ctx) ||
      tg_ctx_set_attn_precision(ctx, bf16 ? TG_ATTN_PRECISION_BF16 : TG_ATTN_PRECISION_EXACT) ||
      tg_attn_params_init(&p, B, H, Hkv, L, L, D, 1.0f / sqrtf((float)D)))
    return 2;
  const size_t nq = (size_t)B * H * L * D, nk = (size_t)B * Hkv * L * D, rows = (size_t)B * H * L;
  uint16_t *Q = malloc(2 * nq), *K = malloc(2 * nk), *V = malloc(2 * nk), *dO = malloc(2 * nq),
           *O = malloc(2 * nq);
  float *lse = malloc(4 * rows), *delta = malloc(4 * rows), *dQ = malloc(4 * nq),
        *dK = malloc(4 * nk), *dV = malloc(4 * nk);
  uint32_t s = 777;
  for (size_t i = 0; i < nq; i++) s = s * 1103515245u + 12345u, Q[i] = 0x3f00 ^ (s >> 16 & 0x80ff), dO[i] = Q[i] ^ 0x0100;
  for (size_t i = 0; i < nk; i++) s = s * 1103515245u + 12345u, K[i] = 0x3f00 ^ (s >> 16 & 0x80ff), V[i] = K[i] ^ 0x0100;
  for (size_t i = 0; i < rows; i++) delta[i] = 0.01f;
  if (tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, O, lse, &p, NULL, NULL, causal, NULL))
    return 1;
  static double t[MAX_COUNTS][MAX_ROUNDS];
  for (int r = 0; r < rounds; r++)
    for (int c = 0; c < n; c++) {
      tg_ctx_set_threads(ctx, atoi(argv[5 + c]));
      double best = 1e30;
      for (int k = 0; k < 3; k++) {
        const double t0 = seconds();
        if (tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q, K, V, lse, dO, delta, dQ, dK, dV, &p, NULL,
                              NULL, causal, &opt))
          return 1;
        const double dt = seconds() - t0;
        best = dt < best ? dt : best;
      }
      t[c][r] = best;
    }
  printf("%s %s, plan for %s CPUs, %d rounds: threads ms speedup\n", argv[4], argv[1], argv[2],
         rounds);
  double first = 0;
  for (int c = 0; c < n; c++) {
    qsort(t[c], (size_t)rounds, sizeof(double), by_value);
    const double med = t[c][rounds / 2];
    if (c == 0) first = med;
    printf("  %3s %9.2f %6.2fx\n", argv[5 + c], med * 1e3, first / med);
  }
  return 0;
}
