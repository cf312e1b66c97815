#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <omp.h>
#include "tilegrad.h"
int main(int argc, char **argv) {
  if (argc < 9) { fprintf(stderr, "B H Hkv L D causal reps threads [isa]\n"); return 2; }
  int B = atoi(argv[1]), H = atoi(argv[2]), Hkv = atoi(argv[3]), L = atoi(argv[4]), D = atoi(argv[5]);
  int causal = atoi(argv[6]), reps = atoi(argv[7]), th = atoi(argv[8]);
  int bf = argc > 9 && argv[9][0] == 'b';
  tg_ctx *ctx; tg_ctx_create(&ctx); tg_ctx_set_threads(ctx, th);
  if (argc > 10 && argv[10][0] == 'b') tg_ctx_set_attn_precision(ctx, TG_ATTN_PRECISION_BF16);
  size_t nq = (size_t)B * H * L * D, nk = (size_t)B * Hkv * L * D;
  float *Q = malloc(nq * 4), *K = malloc(nk * 4), *V = malloc(nk * 4), *O = malloc(nq * 4), *Lv = malloc((size_t)B * H * L * 4);
  srand(1);
  for (size_t i = 0; i < nq; i++) Q[i] = rand() / (float)RAND_MAX - 0.5f;
  for (size_t i = 0; i < nk; i++) K[i] = rand() / (float)RAND_MAX - 0.5f, V[i] = rand() / (float)RAND_MAX - 0.5f;
  if (bf) { /* bf16 copies in the same buffers' front halves */
    uint16_t *q16 = (uint16_t *)Q, *k16 = (uint16_t *)K, *v16 = (uint16_t *)V;
    for (size_t i = 0; i < nq; i++) { unsigned u; memcpy(&u, &Q[i], 4); q16[i] = u >> 16; }
    for (size_t i = 0; i < nk; i++) { unsigned u; memcpy(&u, &K[i], 4); k16[i] = u >> 16; memcpy(&u, &V[i], 4); v16[i] = u >> 16; }
  }
  tg_attn_params p; tg_attn_params_init(&p, B, H, Hkv, L, L, D, 1.0f / sqrtf(D));
  double best = 1e9, t[200];
  for (int r = 0; r <= reps; r++) {
    double t0 = omp_get_wtime();
    tg_status st = tg_attn_train_fwd(ctx, bf ? TG_DTYPE_BF16 : TG_DTYPE_F32, Q, K, V, O, Lv, &p, NULL, NULL, causal, NULL);
    double dt = omp_get_wtime() - t0;
    if (st) { fprintf(stderr, "err %d %s\n", st, tg_ctx_last_error(ctx)); return 1; }
    if (r) t[r - 1] = dt;
  }
  for (int i = 0; i < reps; i++) for (int j = i + 1; j < reps; j++) if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
  double med = t[reps / 2];
  double flop = 4.0 * B * H * (double)L * L * D * (causal ? 0.5 : 1.0);
  printf("fwd %d,%d,%d,%d,%d,%d th %d: median %.1f ms min %.1f ms  %.1f GFLOP/s  O[5]=%g\n", B, H, Hkv, L, D, causal, th, med * 1e3, t[0] * 1e3, flop / med / 1e9, O[5]);
  return 0;
}
