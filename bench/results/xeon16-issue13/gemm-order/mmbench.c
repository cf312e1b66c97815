/* the amx table's tile GEMM on the backward's product shapes (128 tiles), 1 thread */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "micro.h"
static double now(void) { return omp_get_wtime(); }
#define TIME(label, flop, stmt) do { for (int w = 0; w < 20; w++) { stmt; } double best = 1e9; \
  for (int rep = 0; rep < 5; rep++) { double t0 = now(); int n = 0; \
  do { for (int i = 0; i < 20; i++) { stmt; } n += 20; } while (now() - t0 < 0.05); double us = (now() - t0) / n * 1e6; if (us < best) best = us; } \
  printf("  %-30s %8.2f us  %7.1f GFLOP/s\n", label, best, (flop) / best * 1e-3); } while (0)
int main(void) {
  tg_isa isa; if (tg_isa_from_name("amx", &isa) != TG_OK || !tg_isa_available(isa)) { printf("no amx\n"); return 0; }
  const tg_micro_ops *o = tg_micro_table(isa);
  o->bf16_dot_begin();
  for (int D = 64; D <= 256; D *= 2) {
    const int BQ = 128, BK = 128;
    uint16_t *a = aligned_alloc(64, 2 * 256 * 256), *q = aligned_alloc(64, 2 * 256 * 256);
    uint32_t *bp = aligned_alloc(64, 4 * 256 * 256);
    float *C = aligned_alloc(64, 4 * 256 * 256);
    for (int i = 0; i < 256 * 256; i++) { a[i] = 0x3c00 + i % 64; q[i] = 0x3c00 + i % 32; bp[i] = 0x3c003c00u + i % 64; C[i] = 0; }
    printf("D=%d order=%s\n", D, getenv("TG_EXP_ORDER") ? getenv("TG_EXP_ORDER") : "0");
    TIME("S=Q.K^T 128x128xD", 2.0 * BQ * BK * D, o->mm_bf16_pairs(BQ, BK, D, q, D, bp, BK, C, BK, 0));
    TIME("dQ+=dS.K 128xDx128", 2.0 * BQ * BK * D, o->mm_bf16_pairs(BQ, D, BK, a, BK, bp, D, C, D, 1));
    TIME("dK+=dS^T.Q 128xDx64 (causal)", 2.0 * 64 * BK * D, o->mm_bf16_pairs(BK, D, 64, a, 64, bp, D, C, D, 1));
    TIME("dQ+=dS.K 64xDx128 (causal)", 2.0 * 64 * BK * D, o->mm_bf16_pairs(64, D, BK, a, BK, bp, D, C, D, 1));
    free(a); free(q); free(bp); free(C);
  }
  o->bf16_dot_end();
  return 0;
}
