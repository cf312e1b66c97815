/* Micro: AMX GEMM variants, C[M,N] += A[M,K] . B[K,N] (bf16 pairs), 1 thread. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "ops.h"
static const tg_isa_ops *lib;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
#define SYNC() __asm__ volatile("" ::: "memory")
#define LD(t, p, s) do { SYNC(); _tile_loadd(t, p, s); SYNC(); } while (0)
static void configure(void) { _Alignas(64) cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16; SYNC(); _tile_loadconfig(&c); SYNC(); }
static inline void pf_tile(const void *p, int64_t stride) { const char *c = p; for (int r = 0; r < 16; r++) _mm_prefetch(c + r * stride, _MM_HINT_T0); }

/* one 32x32 block, B given by (base of column j, stride in bytes, byte step per 16 pairs) */
static inline void block(int K, const uint16_t *A, int64_t lda, const char *b0, const char *b1, int64_t sb, int64_t bstep,
                         float *C, int64_t ldc, int pf, const char *pfa, const char *pfb0, const char *pfb1) {
  const int64_t sa = 2 * lda, sc = 4 * ldc;
  LD(0, C, sc); LD(1, C + 16, sc); LD(2, C + 16 * ldc, sc); LD(3, C + 16 * ldc + 16, sc);
  for (int k = 0; k < K; k += 32) {
    const int64_t kb = (int64_t)(k / 32) * bstep;
    if (pf && k + 32 < K) { pf_tile(A + k + 32, sa); pf_tile(A + 16 * lda + k + 32, sa); pf_tile(b0 + kb + bstep, sb); pf_tile(b1 + kb + bstep, sb); }
    LD(4, A + k, sa); LD(5, A + 16 * lda + k, sa); LD(6, b0 + kb, sb); LD(7, b1 + kb, sb);
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, C, sc); _tile_stored(1, C + 16, sc); _tile_stored(2, C + 16 * ldc, sc); _tile_stored(3, C + 16 * ldc + 16, sc);
}
/* variant: 0 i-outer row-major B; 1 +prefetch; 2 j-outer; 3 j-outer+prefetch; 4 panel B i-outer; 5 panel B j-outer; 6 panel+pf j-outer */
static void gemm(int v, int M, int N, int K, const uint16_t *A, const uint32_t *B, const uint32_t *Bt, float *C) {
  if (v == 7) { lib->mm_bf16_pairs(M, N, K, A, K, B, N, C, N, 1); configure(); return; }
  if (v == 8) { lib->bf16_dot_begin(); lib->mm_bf16_pairs(M, N, K, A, K, B, N, C, N, 1); return; }
  const int panel = v >= 4, pf = v == 1 || v == 3 || v == 6, jouter = v == 2 || v == 3 || v == 5 || v == 6;
  const int64_t sb = panel ? 64 : 4 * (int64_t)N, bstep = panel ? 16 * 64 : 16 * 4 * (int64_t)N;
  for (int o = 0; o < (jouter ? N / 32 : M / 32); o++)
    for (int in = 0; in < (jouter ? M / 32 : N / 32); in++) {
      const int i = (jouter ? in : o) * 32, j = (jouter ? o : in) * 32;
      const char *b0 = panel ? (const char *)(Bt + (int64_t)(j / 16) * (K / 2) * 16) : (const char *)(B + j);
      const char *b1 = panel ? (const char *)(Bt + (int64_t)(j / 16 + 1) * (K / 2) * 16) : (const char *)(B + j + 16);
      block(K, A + (int64_t)i * K, K, b0, b1, sb, bstep, C + (int64_t)i * N + j, N, pf, 0, 0, 0);
    }
}
int main(void) {
  lib = tg_isa_table(TG_ISA_AMX);
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no amx\n"); return 1; }
  configure();
  /* register-only peak */
  { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    double best = 1e30; const int n = 2000000;
    for (int r = 0; r < 3; r++) { double t0 = now();
      for (int i = 0; i < n; i++) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
      _Alignas(64) float c[256]; _tile_stored(0, c, 64); double t = now() - t0; if (t < best) best = t; }
    printf("peak %.1f GFLOP/s\n", 4.0 * n * 16384 / best * 1e-9); }
  const int Ms[] = {64, 128}, Ns[] = {128, 256, 512}, Ks[] = {64, 128, 256, 512};
  uint16_t *A = aligned_alloc(64, 2 * 128 * 512);
  uint32_t *B = aligned_alloc(64, 4 * 256 * 512), *Bt = aligned_alloc(64, 4 * 256 * 512);
  float *C = aligned_alloc(64, 4 * 128 * 512);
  for (int i = 0; i < 128 * 512; i++) A[i] = 0x3f80 + (i % 7);
  for (int i = 0; i < 256 * 512; i++) B[i] = Bt[i] = 0x3f803f80u + (i % 5);
  memset(C, 0, 4 * 128 * 512);
  for (double t0 = now(); now() - t0 < 2.0;) gemm(0, 128, 256, 256, A, B, Bt, C);
  for (int mi = 0; mi < 2; mi++) for (int ni = 0; ni < 3; ni++) for (int ki = 0; ki < 4; ki++) {
    const int M = Ms[mi], N = Ns[ni], K = Ks[ki];
    const double flop = 2.0 * M * N * K; const int reps = (int)(1e10 / flop) + 1;
    printf("M %4d N %4d K %4d:", M, N, K);
    for (int v = 0; v < 9; v++) {
      double best = 1e30;
      for (int r = 0; r < 5; r++) { double t0 = now(); for (int i = 0; i < reps; i++) gemm(v, M, N, K, A, B, Bt, C);
        double t = now() - t0; if (t < best) best = t; }
      printf(" v%d %6.1f", v, flop * reps / best * 1e-9);
    }
    printf("\n"); fflush(stdout);
  }
  return 0;
}
