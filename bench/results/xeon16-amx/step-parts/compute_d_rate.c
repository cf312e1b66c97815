/*
 * compute_d (bf16 O, dO -> D per row) alone: the fastest of 50 calls for
 * H heads of L rows of head dim D at `threads` threads, as elements per
 * second and bytes read per second (O and dO, 2 bytes each).
 *
 *   compute_d_rate H L D THREADS
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
  if (argc != 5) return 2;
  const int H = atoi(argv[1]), L = atoi(argv[2]), D = atoi(argv[3]), threads = atoi(argv[4]);
  tg_ctx *ctx;
  if (tg_ctx_create(&ctx) || tg_ctx_set_threads(ctx, threads)) return 2;
  const size_t n = (size_t)H * L * D;
  uint16_t *O = malloc(2 * n), *dO = malloc(2 * n);
  float *Dv = malloc(sizeof(float) * (size_t)H * L);
  for (size_t i = 0; i < n; i++) O[i] = 0x3f80 ^ (rand() & 0x7f), dO[i] = 0x3e80 ^ (rand() & 0x7f);
  double best = 1e30;
  for (int r = 0; r < 50; r++) {
    const double t0 = seconds();
    if (tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, Dv, 1, H, L, D)) return 1;
    const double t = seconds() - t0;
    best = t < best ? t : best;
  }
  printf("H %d L %d D %d, %d threads: %.3f ms, %.2f G elements/s, %.1f GB/s read\n", H, L, D,
         threads, best * 1e3, (double)n / best / 1e9, 4.0 * (double)n / best / 1e9);
  return 0;
}
