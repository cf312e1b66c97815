#include <stdio.h>
#include <omp.h>
int main(void) {
  volatile int sink = 0;
  for (int mode = 0; mode < 2; mode++) {
    double t0 = omp_get_wtime();
    for (int r = 0; r < 2000; r++) {
      #pragma omp parallel num_threads(mode ? 8 : 16)
      { sink++; }
      #pragma omp parallel num_threads(16)
      { sink++; }
    }
    printf("%s: %.2f us per pair of regions\n", mode ? "alternating 8,16" : "constant 16", (omp_get_wtime() - t0) / 2000 * 1e6);
  }
}
