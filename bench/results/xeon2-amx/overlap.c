/*
 * Can the tile unit's products and the AVX-512 row work run at once on one
 * core? One thread, operands in L1: n steps of a 2 x 2 tile block (4 tile
 * loads, 4 TDPBF16PS), n steps of V vectors of exp-like work (10 dependent
 * FMAs, a scalef, a store each), then both interleaved step by step, and
 * in phases of CH steps of each (today's kernels: a whole product, then
 * the rows).
 *
 *   cc -O2 -mavx512f -mamx-tile -mamx-bf16 overlap.c -o overlap && ./overlap
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tilecfg;

static float rows[4096] __attribute__((aligned(64)));
static uint16_t tiles[16 * 32 * 64] __attribute__((aligned(64)));

static inline void amx_step(long i) {
  const int o = (int)(i & 7) * 1024;
  _tile_loadd(4, tiles + o, 64);
  _tile_loadd(5, tiles + o + 512, 64);
  _tile_loadd(6, tiles + o + 8192, 64);
  _tile_loadd(7, tiles + o + 8192 + 512, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

static inline __m512 vector_step(int V, long i, __m512 acc) {
  for (int v = 0; v < V; v++) {
    const long at = i * V + v;
    const __m512 x = _mm512_load_ps(rows + (at & 255) * 16);
    __m512 p = _mm512_set1_ps(1.1f);
    for (int k = 0; k < 10; k++) p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(0.3f));
    acc = _mm512_add_ps(acc, _mm512_scalef_ps(p, x));
    _mm512_store_ps(rows + ((at + 128) & 255) * 16, p);
  }
  return acc;
}

int main(void) {
  syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
  _Alignas(64) tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  for (int i = 0; i < 16 * 32 * 64; i++) tiles[i] = 0x3f80;
  for (int i = 0; i < 4096; i++) rows[i] = -0.01f * (float)(i % 100);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const long n = 400000;
  __m512 acc = _mm512_setzero_ps();
  const int sweep[][2] = {{2, 256}, {4, 16}, {4, 256}, {4, 4096}, {4, 16384}, {8, 256}};
  for (size_t s = 0; s < sizeof sweep / sizeof sweep[0]; s++) {
    const int V = sweep[s][0], CH = sweep[s][1];
    double t0 = seconds();
    for (long i = 0; i < n; i++) amx_step(i);
    const double t_amx = seconds() - t0;
    t0 = seconds();
    for (long i = 0; i < n; i++) acc = vector_step(V, i, acc);
    const double t_vec = seconds() - t0;
    t0 = seconds();
    for (long i = 0; i < n; i++) amx_step(i), acc = vector_step(V, i, acc);
    const double t_mixed = seconds() - t0;
    t0 = seconds();
    for (long i = 0; i < n; i += CH) {
      for (long j = i; j < i + CH; j++) amx_step(j);
      for (long j = i; j < i + CH; j++) acc = vector_step(V, j, acc);
    }
    const double t_phases = seconds() - t0;
    printf("V %d, phases of %5d steps: tile unit %.1f ms, vectors %.1f ms, interleaved %.1f ms, "
           "in phases %.1f ms (sum %.1f, max %.1f)\n",
           V, CH, 1e3 * t_amx, 1e3 * t_vec, 1e3 * t_mixed, 1e3 * t_phases,
           1e3 * (t_amx + t_vec), 1e3 * (t_amx > t_vec ? t_amx : t_vec));
  }
  float out[16];
  _mm512_storeu_ps(out, acc);
  _tile_release();
  return out[0] == 12345.0f; /* keeps acc live */
}
