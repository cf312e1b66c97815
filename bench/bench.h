/* `tilegrad bench`: its options and the entry point called by the CLI
 * (cli/main.c, which fills the options with cli/bench_args.h's parser). */
#ifndef TG_BENCH_H
#define TG_BENCH_H

#include <stddef.h>

#include "tilegrad.h"

/* One attention shape: qL = kL = L; causal 0 or 1; window W >= 1 is a
 * sliding window (tg_attn_options.window), 0 none. */
typedef struct {
  int B, H, Hkv, L, D, causal, window;
} tg_bench_shape;

/* Bits of tg_bench_opts.sections; 0 measures the ceilings only. WINDOW: the
 * long sliding-window shapes with their causal partners (not in "all"). */
enum { TG_BENCH_SECTION_ATTN = 1, TG_BENCH_SECTION_MEM = 2, TG_BENCH_SECTION_WINDOW = 4 };

typedef struct {
  int threads;            /* 1..4096, or 0 = OpenMP's default */
  int reps;               /* timed repetitions per case */
  size_t triad_mib;       /* size of each triad array */
  const char *json;       /* JSON output path, or NULL */
  int isa_set;            /* --isa given: isa is to be set on the context */
  tg_isa isa;
  int sections;           /* TG_BENCH_SECTION_* bits */
  tg_bench_shape *shapes; /* --shapes (heap), or NULL for the built-in list */
  int nshapes;
  int quick;              /* small shapes and buffers */
  int deterministic;
  tg_attn_precision precision; /* --precision (default exact) */
} tg_bench_opts;

/* Runs the bench with options already checked (every value in the range the
 * parser allows); returns a process exit code. */
int tg_bench_main(const tg_bench_opts *o);

#endif
