/*
 * The training driver shared by examples/train_tiny.c and `tilegrad train`:
 * a built-in, deterministically generated character corpus, options, and the
 * loop (sample a batch, forward + backward, AdamW, print the loss).
 */
#ifndef TINY_TRAIN_H
#define TINY_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "tiny_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- corpus ------------------------------------------------------------------
 * English-like sentences from a small grammar (subject, verb, object,
 * optional place/time phrase; a third of them continue with a clause that
 * repeats the sentence's nouns in swapped roles, which only attention can
 * predict). Characters: newline, space, ',', '.', 'a'..'z'. */
#define TT_VOCAB 30
uint32_t tt_encode(char ch); /* unknown characters map to ' ' */
char tt_decode(uint32_t id);
/* Writes exactly n characters of corpus (no terminator) generated from seed. */
void tt_corpus(char *buf, int64_t n, uint64_t seed);

/* --- the driver ------------------------------------------------------------------ */
typedef struct {
  tm_config cfg;
  tm_adam adam;
  int steps;     /* optimizer steps */
  float warmup;  /* fraction of steps with linear warm-up; then cosine to lr/10 */
  uint64_t seed; /* init and batch sampling (the corpus is fixed) */
  int threads;   /* tilegrad + sgemm-slice (OpenMP) threads; 0 = OpenMP default */
  int deterministic;
  int log_every;  /* print a line every this many steps */
  int eval_every; /* held-out loss every this many steps (0 = start and end only) */
  int sample;     /* characters to generate after training (0 = none) */
} tt_options;

void tt_default_options(tt_options *o);
/* Prints the options for `prog`. */
void tt_usage(FILE *out, const char *prog);
/* Parses argv[1..argc-1]. Returns 0 to run, 1 after printing --help, 2 on a
 * bad option (message on stderr). */
int tt_parse(tt_options *o, int argc, char **argv, const char *prog);
/* Trains and prints the loss curve to stdout. Returns a process exit code. */
int tt_run(const tt_options *o);
/* parse + run. Unless the user set them, first re-executes the program with
 * OMP_WAIT_POLICY=passive and, where OpenBLAS fell back to its generic
 * kernels, OPENBLAS_CORETYPE (see tiny_train.c); the new argv is
 * exec_prefix (if not NULL) followed by argv. */
int tt_main(int argc, char **argv, const char *prog, const char *exec_prefix);

#ifdef __cplusplus
}
#endif
#endif /* TINY_TRAIN_H */
