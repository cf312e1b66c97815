/*
 * Machine ceilings for `tilegrad bench`, measured at a given OpenMP thread
 * count: one copy of each microbenchmark per thread inside one parallel
 * region, aggregate throughput reported.
 *
 *   f32 FMA peak   12 independent FMA chains per thread (zmm, ymm or a portable
 *                  vector fallback; 16 of 4-lane FMLA on aarch64); 2 FLOP per
 *                  lane per FMA.
 *   bf16 dot peak  12 independent vdpbf16ps zmm chains per thread; 2 FLOP per
 *                  bf16 pair = 64 FLOP per instruction. 0 where the CPU has no
 *                  AVX512_BF16. On aarch64: 16 BFMMLA chains (32 FLOP per
 *                  instruction), 0 without FEAT_BF16.
 *   AMX peak       4 independent tdpbf16ps tile chains per thread (16384 FLOP
 *                  each); 0 where the amx table cannot run.
 *   triad          a[i] = b[i] + 2*c[i] over three f32 arrays (default 256 MiB
 *                  each); bytes counted as 3 streams (read b, read c, write a),
 *                  the STREAM convention -- the write-allocate read of a is not
 *                  counted.
 *
 * Each ceiling is the best of several short repetitions (~0.2 s per ceiling,
 * in two interleaved rounds after a 0.25 s warm-up).
 * Everything here is compiled with the baseline flags of the build: the wide
 * variants use function-level target attributes and run only where
 * __builtin_cpu_supports says the CPU has the ISA.
 */
#ifndef TG_BENCH_PEAK_H
#define TG_BENCH_PEAK_H

#include <stddef.h>

#include "tilegrad.h"

typedef struct {
  int threads;
  /* f32 FMA: best variant, and each variant measured (0 = not available) */
  double fma_gflops;
  const char *fma_variant; /* "avx512f", "avx2+fma", "portable" or "neon" */
  double fma_avx512_gflops, fma_avx2_gflops, fma_neon_gflops, fma_portable_gflops;
  /* bf16 dot (vdpbf16ps zmm; BFMMLA on aarch64); 0 = no such unit */
  double bf16_gflops;
  const char *bf16_instr; /* the instruction and its FLOP, for the report */
  /* AMX-BF16 tiles (tdpbf16ps); 0 where the library cannot run its amx table */
  double amx_gflops;
  /* triad, 3-stream bytes */
  double triad_gbs;
  size_t triad_array_bytes; /* bytes per array */
} tg_peaks;

/* Each returns aggregate GFLOP/s over `threads` threads, or 0 when the CPU
 * lacks the ISA. seconds: rough total time budget (e.g. 0.2). */
double tg_peak_fma_avx512(int threads, double seconds);
double tg_peak_fma_avx2(int threads, double seconds);
double tg_peak_fma_neon(int threads, double seconds);
double tg_peak_fma_portable(int threads, double seconds);
double tg_peak_bf16_dot(int threads, double seconds);
double tg_peak_amx_bf16(int threads, double seconds);

/* GB/s (3 streams) of a[i] = b[i] + 2*c[i] with three arrays of array_bytes
 * each; < 0 if the arrays cannot be allocated. */
double tg_peak_triad(int threads, size_t array_bytes, double seconds);

/* All of the above; returns 0 on success, -1 if the triad arrays could not be
 * allocated (triad_gbs is then 0, everything else is filled). */
int tg_peaks_measure(tg_peaks *out, int threads, size_t triad_array_bytes);

/* The ceiling of the FA-2 backward step in GFLOP/s for a precision mode:
 * exact, 2/5 of the FLOPs at the bf16 unit's peak, 3/5 at the f32 FMA
 * peak (time-weighted: 1 / (0.4/bf16 + 0.6/fma)), or, with exact_parts
 * (the table runs those 3/5 as three bf16 parts at that D), all at the
 * bf16 unit with the 3/5 three times (bf16 / 2.2); split, the 3/5 twice
 * there (bf16 / 1.6); bf16, all once (bf16). The FMA peak alone when there
 * is no bf16 unit. */
double tg_peaks_attn_ceiling(const tg_peaks *p, tg_attn_precision mode, int exact_parts);

/* The forward's (tg_attn_train_fwd: Q.K^T and P.V, 4*B*H*qL*kL*D FLOPs)
 * ceiling likewise: exact, half at the bf16 unit and half at the FMA peak,
 * or, with exact_parts (the table runs P.V on bf16 parts at that D: split
 * mode's two), all at the bf16 unit with P.V twice (bf16 / 1.5), as split;
 * bf16, all once. */
double tg_peaks_attn_fwd_ceiling(const tg_peaks *p, tg_attn_precision mode, int exact_parts);

#endif /* TG_BENCH_PEAK_H */
