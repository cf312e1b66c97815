/*
 * Machine ceilings for `tilegrad bench` (see peak.h for the definitions).
 *
 * The compute kernels are 12 independent accumulator chains per thread: enough
 * to cover FMA latency (4-5 cycles) times two FMA ports, few enough to stay in
 * registers (12 + 2 constants fit the 16 ymm/xmm registers of AVX2/SSE2). The
 * chains are acc = acc*m + c with m just below 1, so values converge to c/(1-m)
 * and never overflow or turn subnormal. Each variant is compiled with a
 * function-level target attribute and runs only after __builtin_cpu_supports
 * says yes, so the build itself needs no -march flag.
 */
#include "peak.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#define TG_PEAK_X86 1
#include <immintrin.h>
#elif defined(__aarch64__)
#define TG_PEAK_ARM64 1
#include <arm_neon.h>
#endif

/* One sink slot per thread, a cache line apart, so the results stay live. */
#define SINK_STRIDE 16
#define SINK_MAX 1024
static volatile float g_sink[SINK_MAX * SINK_STRIDE];

typedef void (*chain_fn)(long iters, int tid);

/* --- the chain kernels ------------------------------------------------------ */

#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define REP16(X) REP12(X) X(12) X(13) X(14) X(15)
#define X_1_TO_15(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

#if TG_PEAK_X86
__attribute__((target("avx512f"))) static void fma_avx512_kernel(long iters, int tid) {
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
#define DECL(j) __m512 a##j = _mm512_set1_ps(0.5f + 0.01f * (j));
  REP12(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = _mm512_fmadd_ps(a##j, m, c);
    REP12(STEP)
#undef STEP
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  g_sink[(tid % SINK_MAX) * SINK_STRIDE] += _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static void fma_avx2_kernel(long iters, int tid) {
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
#define DECL(j) __m256 a##j = _mm256_set1_ps(0.5f + 0.01f * (j));
  REP12(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = _mm256_fmadd_ps(a##j, m, c);
    REP12(STEP)
#undef STEP
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float t[8];
  _mm256_storeu_ps(t, s);
  g_sink[(tid % SINK_MAX) * SINK_STRIDE] += t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* vdpbf16ps: acc[l] += x[2l]*y[2l] + x[2l+1]*y[2l+1] over 16 f32 lanes. */
__attribute__((target("avx512f,avx512bf16"))) static void bf16_dot_kernel(long iters,
                                                                          int tid) {
  /* 0x3A83 ~ 1.0e-3 in bf16: the accumulators grow by ~2e-6 per step. */
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3A83);
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3A83 + 1);
#define DECL(j) __m512 a##j = _mm512_set1_ps(0.01f * (j));
  REP12(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = _mm512_dpbf16_ps(a##j, x, y);
    REP12(STEP)
#undef STEP
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  g_sink[(tid % SINK_MAX) * SINK_STRIDE] += _mm512_reduce_add_ps(s);
}

/* AMX-BF16: 4 independent C tiles (16 x 16 f32) fed by 2 A and 2 B tiles
 * (16 rows x 32 bf16) that stay in the tile registers; one tdpbf16ps is
 * 16 x 16 x 32 multiply-adds = 16384 FLOP. The tile configuration is the
 * thread's own (loaded here, released after). Runs only where the library
 * runs its amx table (tg_isa_available: CPUID, the OS's XCR0 and Linux's
 * permission request for the tile data). */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_tile_config;

__attribute__((target("amx-tile,amx-bf16"))) static void amx_dot_kernel(long iters, int tid) {
  amx_tile_config cfg __attribute__((aligned(64)));
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  uint16_t src[16 * 32] __attribute__((aligned(64)));
  for (int i = 0; i < 16 * 32; i++) src[i] = 0x3A83; /* ~1e-3 */
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float out[16 * 16] __attribute__((aligned(64)));
  _tile_stored(0, out, 64);
  _tile_release();
  g_sink[(tid % SINK_MAX) * SINK_STRIDE] += out[0];
}
#endif /* TG_PEAK_X86 */

/* Portable: GCC/Clang generic vectors of 4 floats (one SSE/NEON register),
 * mul + add (2 FLOP per lane; contracted to an FMA where the compiler may). */
typedef float tg_pv4 __attribute__((vector_size(16)));
static void fma_portable_kernel(long iters, int tid) {
  const tg_pv4 m = {0.9999999f, 0.9999999f, 0.9999999f, 0.9999999f};
  const tg_pv4 c = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
#define DECL(j) tg_pv4 a##j = {0.5f + 0.01f * (j), 0.5f, 0.5f, 0.5f};
  REP12(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = a##j * m + c;
    REP12(STEP)
#undef STEP
  }
  tg_pv4 s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));
  g_sink[(tid % SINK_MAX) * SINK_STRIDE] += s[0] + s[1] + s[2] + s[3];
}

#if TG_PEAK_ARM64
/* The 16 chains a0..a15 of a NEON kernel, summed into the thread's sink. */
#define SUM_INTO_A0(j) a0 = vaddq_f32(a0, a##j);
#define SINK_NEON16(tid)                                             \
  do {                                                               \
    X_1_TO_15(SUM_INTO_A0)                                           \
    g_sink[((tid) % SINK_MAX) * SINK_STRIDE] += vaddvq_f32(a0);      \
  } while (0)

/* FMLA on 4 lanes, 16 chains: a core with 4 FMA pipes of 4 cycles' latency
 * (Neoverse V1/V2, Apple's P cores) needs 16 in flight, where 12 would read
 * at most 3/4 of its peak. Explicit vfmaq_f32: the portable kernel's mul +
 * add is not contracted. */
static void fma_neon_kernel(long iters, int tid) {
  const float32x4_t m = vdupq_n_f32(0.9999999f), c = vdupq_n_f32(1e-7f);
#define DECL(j) float32x4_t a##j = vdupq_n_f32(0.5f + 0.01f * (j));
  REP16(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = vfmaq_f32(c, a##j, m);
    REP16(STEP)
#undef STEP
  }
  SINK_NEON16(tid);
}

/* BFMMLA: a 2 x 4 bf16 block times a 4 x 2 one into a 2 x 2 f32 block,
 * 16 multiply-adds = 32 FLOP per instruction; 16 chains, as FMLA's. Built
 * for FEAT_BF16 by the target attribute; run only where the library's
 * neonbf16 table can run. */
static volatile uint16_t bf16_one = 0x3f80, bf16_tiny = 0x33d6; /* 1.0, 1e-7 */
/* The operands' bits are read at run time: from constants gcc 12 builds
 * them with an FP16 fmov, which armv8.2-a+bf16 does not include. */
__attribute__((target("arch=armv8.2-a+bf16"))) static void bfmmla_kernel(long iters, int tid) {
  const bfloat16x8_t a = vreinterpretq_bf16_u16(vdupq_n_u16(bf16_one));
  const bfloat16x8_t b = vreinterpretq_bf16_u16(vdupq_n_u16(bf16_tiny));
#define DECL(j) float32x4_t a##j = vdupq_n_f32(0.01f * (j));
  REP16(DECL)
#undef DECL
  for (long i = 0; i < iters; i++) {
#define STEP(j) a##j = vbfmmlaq_f32(a##j, a, b);
    REP16(STEP)
#undef STEP
  }
  SINK_NEON16(tid);
}
#endif

/* --- the parallel runner ----------------------------------------------------- */

/* Runs fn(iters) once on every thread of one parallel region; returns the
 * wall time between the start barrier and the end barrier. */
static double run_once(chain_fn fn, long iters, int threads, int *nthr_out) {
  double t0 = 0.0, t1 = 0.0;
  int nthr = 1;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    nthr = omp_get_num_threads();
    /* (implicit barrier of single) */
#pragma omp master
    t0 = omp_get_wtime();
    fn(iters, omp_get_thread_num());
#pragma omp barrier
#pragma omp master
    t1 = omp_get_wtime();
  }
  if (nthr_out) *nthr_out = nthr;
  return t1 - t0;
}

/* Sizes one repetition to ~1/8 of the budget, then repeats it on all threads
 * until the budget is spent (at least 3 repetitions); best rate. The size is
 * calibrated on the calling thread alone (best of two timings per step), so a
 * stalled sibling thread -- a descheduled vCPU on a busy host -- cannot make
 * the repetitions tiny and the result all overhead. */
static double compute_peak(chain_fn fn, double flop_per_iter, int threads, double seconds) {
  if (threads < 1) threads = 1;
  if (seconds <= 0) seconds = 0.2;
  const double rep_target = seconds / 8.0;
  long iters = 1 << 12;
  for (int k = 0; k < 40; k++) {
    double t = 1e30;
    for (int j = 0; j < 2; j++) {
      double t0 = omp_get_wtime();
      fn(iters, 0);
      double dt = omp_get_wtime() - t0;
      if (dt < t) t = dt;
    }
    if (t >= rep_target * 0.5) break;
    double f = t > 1e-7 ? rep_target / t : 16.0;
    if (f > 16.0) f = 16.0;
    if (f < 2.0) f = 2.0;
    iters = (long)(iters * f);
  }
  int nthr = threads;
  double best = 0.0, spent = 0.0;
  (void)run_once(fn, iters / 4 + 1, threads, &nthr); /* wakes the team */
  for (int r = 0; r < 64 && (r < 3 || spent < seconds * 0.75); r++) {
    double t = run_once(fn, iters, threads, &nthr);
    spent += t;
    if (t > 0) {
      double g = flop_per_iter * (double)iters * nthr / t * 1e-9;
      if (g > best) best = g;
    }
  }
  return best;
}

#if TG_PEAK_X86
static int cpu_has(const char *what) {
  __builtin_cpu_init();
  if (!strcmp(what, "avx512f")) return __builtin_cpu_supports("avx512f");
  if (!strcmp(what, "avx2+fma"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!strcmp(what, "avx512bf16"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return 0;
}
#endif

double tg_peak_fma_avx512(int threads, double seconds) {
#if TG_PEAK_X86
  if (cpu_has("avx512f"))
    return compute_peak(fma_avx512_kernel, 12.0 * 16 * 2, threads, seconds);
#endif
  return 0.0;
}

double tg_peak_fma_avx2(int threads, double seconds) {
#if TG_PEAK_X86
  if (cpu_has("avx2+fma"))
    return compute_peak(fma_avx2_kernel, 12.0 * 8 * 2, threads, seconds);
#endif
  return 0.0;
}

double tg_peak_fma_neon(int threads, double seconds) {
#if TG_PEAK_ARM64
  return compute_peak(fma_neon_kernel, 16.0 * 4 * 2, threads, seconds);
#else
  (void)threads, (void)seconds;
  return 0.0;
#endif
}

double tg_peak_fma_portable(int threads, double seconds) {
  return compute_peak(fma_portable_kernel, 12.0 * 4 * 2, threads, seconds);
}

double tg_peak_bf16_dot(int threads, double seconds) {
#if TG_PEAK_X86
  /* 16 lanes x 2 bf16 pairs x 2 FLOP = 64 FLOP per vdpbf16ps */
  if (cpu_has("avx512bf16"))
    return compute_peak(bf16_dot_kernel, 12.0 * 64, threads, seconds);
#elif TG_PEAK_ARM64
  if (tg_isa_available(TG_ISA_NEON_BF16))
    return compute_peak(bfmmla_kernel, 16.0 * 32, threads, seconds);
#endif
  return 0.0;
}

double tg_peak_amx_bf16(int threads, double seconds) {
#if TG_PEAK_X86
  if (tg_isa_available(TG_ISA_AMX))
    return compute_peak(amx_dot_kernel, 4.0 * 16384, threads, seconds);
#endif
  return 0.0;
}

/* --- triad ------------------------------------------------------------------- */

static void *alloc64(size_t bytes) {
  size_t b = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, b ? b : 64);
}

double tg_peak_triad(int threads, size_t array_bytes, double seconds) {
  if (threads < 1) threads = 1;
  if (seconds <= 0) seconds = 0.2;
  const int64_t n = (int64_t)(array_bytes / sizeof(float));
  if (n < 1024) return -1.0;
  float *restrict a = alloc64((size_t)n * sizeof(float));
  float *restrict b = alloc64((size_t)n * sizeof(float));
  float *restrict c = alloc64((size_t)n * sizeof(float));
  if (!a || !b || !c) {
    free(a);
    free(b);
    free(c);
    return -1.0;
  }
  /* First touch with the same static schedule as the timed loop, so pages
   * land near the threads that stream them. */
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; i++) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = (float)(i & 7);
  }
  double best = 0.0, spent = 0.0;
  for (int r = 0; r < 50 && (r < 4 || spent < seconds); r++) {
    double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + 2.0f * c[i];
    double t = omp_get_wtime() - t0;
    spent += t;
    if (r > 0 && t > 0) { /* rep 0 is a warm-up */
      double g = 3.0 * (double)n * sizeof(float) / t * 1e-9;
      if (g > best) best = g;
    }
  }
  g_sink[0] += a[n / 2];
  free(a);
  free(b);
  free(c);
  return best;
}

/* --- all together -------------------------------------------------------------- */

int tg_peaks_measure(tg_peaks *p, int threads, size_t triad_array_bytes) {
  memset(p, 0, sizeof *p);
  if (threads < 1) threads = 1;
  p->threads = threads;
  /* Warm-up: wake every thread (idle vCPUs can take a while), let the cores
   * settle at their wide-vector clock. Seen on a 16-core VM: without it the
   * first variant measured came out at half its rate. */
  if (tg_peak_fma_avx512(threads, 0.25) <= 0.0 && tg_peak_fma_avx2(threads, 0.25) <= 0.0)
    (void)tg_peak_fma_portable(threads, 0.25);
  /* Two interleaved rounds, best of each: a transient slowdown (clock
   * change, a neighbour on a shared host) must hit both to lower a peak. */
  for (int round = 0; round < 2; round++) {
    double g;
    g = tg_peak_fma_avx512(threads, 0.1);
    if (g > p->fma_avx512_gflops) p->fma_avx512_gflops = g;
    g = tg_peak_fma_avx2(threads, 0.1);
    if (g > p->fma_avx2_gflops) p->fma_avx2_gflops = g;
    g = tg_peak_fma_neon(threads, 0.1);
    if (g > p->fma_neon_gflops) p->fma_neon_gflops = g;
    g = tg_peak_fma_portable(threads, 0.1);
    if (g > p->fma_portable_gflops) p->fma_portable_gflops = g;
    g = tg_peak_bf16_dot(threads, 0.1);
    if (g > p->bf16_gflops) p->bf16_gflops = g;
    g = tg_peak_amx_bf16(threads, 0.1);
    if (g > p->amx_gflops) p->amx_gflops = g;
  }
  p->fma_gflops = p->fma_portable_gflops;
  p->fma_variant = "portable";
#if TG_PEAK_ARM64
  p->bf16_instr = "bfmmla, 32 FLOP/instruction";
#else
  p->bf16_instr = "vdpbf16ps zmm, 64 FLOP/instruction";
#endif
  if (p->fma_neon_gflops > p->fma_gflops) {
    p->fma_gflops = p->fma_neon_gflops;
    p->fma_variant = "neon";
  }
  if (p->fma_avx2_gflops > p->fma_gflops) {
    p->fma_gflops = p->fma_avx2_gflops;
    p->fma_variant = "avx2+fma";
  }
  if (p->fma_avx512_gflops > p->fma_gflops) {
    p->fma_gflops = p->fma_avx512_gflops;
    p->fma_variant = "avx512f";
  }
  p->triad_array_bytes = triad_array_bytes;
  double t = tg_peak_triad(threads, triad_array_bytes, 0.2);
  p->triad_gbs = t > 0 ? t : 0.0;
  return t > 0 ? 0 : -1;
}

double tg_peaks_attn_ceiling(const tg_peaks *p, tg_attn_precision mode, int exact_parts) {
  if (p->fma_gflops <= 0) return 0.0;
  if (p->bf16_gflops <= 0) return p->fma_gflops;
  /* of the step's products, 2/5 (Q.K^T, dO.V^T) always run on the bf16
   * unit; the 3/5 that take P or dS run there too in bf16 mode, twice
   * (hi and lo) in split mode, and in exact mode on the FMA units or
   * three times (hi, lo, lo2) on the bf16 unit */
  if (mode == TG_ATTN_PRECISION_BF16) return p->bf16_gflops;
  if (mode == TG_ATTN_PRECISION_SPLIT) return p->bf16_gflops / 1.6;
  if (exact_parts) return p->bf16_gflops / 2.2;
  return 1.0 / (0.4 / p->bf16_gflops + 0.6 / p->fma_gflops);
}

double tg_peaks_attn_fwd_ceiling(const tg_peaks *p, tg_attn_precision mode, int exact_parts) {
  if (p->fma_gflops <= 0) return 0.0;
  if (p->bf16_gflops <= 0) return p->fma_gflops;
  /* of the forward's two products (as many FLOPs each), Q.K^T always runs
   * on the bf16 unit; O += P.V there too in bf16 mode, twice (hi and lo)
   * in split mode and in exact mode where the table runs it on parts
   * (split's two), else on the FMA units */
  if (mode == TG_ATTN_PRECISION_BF16) return p->bf16_gflops;
  if (mode == TG_ATTN_PRECISION_SPLIT || exact_parts) return p->bf16_gflops / 1.5;
  return 1.0 / (0.5 / p->bf16_gflops + 0.5 / p->fma_gflops);
}
