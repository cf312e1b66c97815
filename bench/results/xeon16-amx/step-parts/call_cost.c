/*
 * What a call costs apart from its work: the fastest of 200 calls of a tiny
 * compute_d (1 row of 8) and a tiny cast (16 elements) at THREADS threads,
 * and compute_d over L rows of head dim 512 for L = 64 ... 4096 at 1 thread
 * (fixed cost + per-row cost), bf16 inputs in L2 or L3.
 *
 *   call_cost THREADS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tilegrad.h"

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  tg_ctx *ctx;
  if (tg_ctx_create(&ctx) || tg_ctx_set_threads(ctx, atoi(argv[1]))) return 2;
  enum { D = 512, LMAX = 4096 };
  uint16_t *O = malloc(2 * (size_t)D * LMAX), *dO = malloc(2 * (size_t)D * LMAX), *h = malloc(64);
  float *Dv = malloc(4 * LMAX), f[16] = {0};
  for (size_t i = 0; i < (size_t)D * LMAX; i++) O[i] = 0x3f80 ^ (rand() & 0x7f), dO[i] = 0x3e80;
  double best_d = 1e30, best_c = 1e30;
  for (int r = 0; r < 200; r++) {
    double t0 = seconds();
    tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, Dv, 1, 1, 1, 8);
    double t1 = seconds();
    tg_f32_to_bf16_cast(ctx, f, h, 16);
    double t2 = seconds();
    best_d = t1 - t0 < best_d ? t1 - t0 : best_d;
    best_c = t2 - t1 < best_c ? t2 - t1 : best_c;
  }
  printf("%s threads: a tiny compute_d %.1f us, a tiny cast %.1f us\n", argv[1], best_d * 1e6,
         best_c * 1e6);
  tg_ctx_set_threads(ctx, 1);
  for (int L = 64; L <= LMAX; L *= 4) {
    double best = 1e30;
    for (int r = 0; r < 50; r++) {
      const double t0 = seconds();
      tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, Dv, 1, 1, L, D);
      const double t = seconds() - t0;
      best = t < best ? t : best;
    }
    printf("  1 thread, compute_d of %4d rows x %d: %8.1f us, %.2f ns a row\n", L, D, best * 1e6,
           best * 1e9 / L);
  }
  return 0;
}
