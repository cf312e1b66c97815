/* f32 products of the exact-mode backward (64 x 64 tiles), 1 thread: hot
 * operands, and operands rotated over NSET copies (L2- or L3-resident) */
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include "micro.h"
enum { MAXSET = 96 };
int main(int argc, char **argv) {
  tg_isa isa; if (tg_isa_from_name(argc > 1 ? argv[1] : "avx512", &isa) != TG_OK || !tg_isa_available(isa)) return 0;
  const tg_micro_ops *o = tg_micro_table(isa);
  const int T = 64;
  for (int D = 128; D <= 256; D *= 2) {
    static float *A[MAXSET], *B[MAXSET], *C[MAXSET];
    for (int s = 0; s < MAXSET; s++) {
      A[s] = aligned_alloc(64, 4 * T * T); B[s] = aligned_alloc(64, 4 * T * D); C[s] = aligned_alloc(64, 4 * T * D);
      for (int i = 0; i < T * T; i++) A[s][i] = 0.001f * (i % 7);
      for (int i = 0; i < T * D; i++) B[s][i] = 0.002f * (i % 5), C[s][i] = 0;
    }
    const int nsets[] = {1, 4, 96};
    for (int ni = 0; ni < 3; ni++) {
      const int ns = nsets[ni];
      for (int v = 0; v < 3; v++) {
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
          double t0 = omp_get_wtime(); int n = 0;
          do { for (int s = 0; s < 96; s++) { int k = s % ns;
            if (v == 0) o->mm_nn(T, D, T, A[k], T, B[k], D, C[k], D, 1);
            else if (v == 1) o->mm_tn_acc(T, D, T, A[k], T, B[k], D, C[k], D);
            else o->mm_nn(T, T, D, B[k], D, C[k], T, A[k], T, 0); } n += 96;
          } while (omp_get_wtime() - t0 < 0.05);
          double us = (omp_get_wtime() - t0) / n * 1e6; if (us < best) best = us;
        }
        const char *nm[] = {"mm_nn dS.K (C += 64x64 . 64xD)", "mm_tn dS^T.Q (C += 64x64^T . 64xD)", "mm_nn Q.K^T (64xD . Dx64)"};
        printf("%s D=%d sets=%2d %-36s %7.2f us %7.1f GFLOP/s\n", argv[1], D, ns, nm[v], best, 2.0 * T * T * D / best * 1e-3);
      }
    }
    for (int s = 0; s < MAXSET; s++) free(A[s]), free(B[s]), free(C[s]);
  }
  return 0;
}
