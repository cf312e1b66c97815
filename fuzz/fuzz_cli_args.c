/*
 * libFuzzer target: the CLI's argument parsers (cli/run.c's command line and
 * --param values, cli/bench_args.c's parser of bench's command line,
 * cli/num.c's number parser), without touching any file.
 *
 * Input: byte 0 picks the command (bit 0: run or bench); the rest is split
 * at NUL bytes into at most 48 arguments (an argument ends at a NUL or at the
 * end of the input). For run, argument 1 is the kernel name (the seeds in
 * fuzz/corpus_cli/ give real ones).
 *
 * Invariants (a violation is abort() with a FINDING line):
 *   - run's parser returns 0 or 2, bench's 0, 1 (--help) or 2; 2 comes with
 *     a non-empty message (bench's: and only 2), and the message is a
 *     NUL-terminated string within its buffer;
 *   - bench's options, when accepted, hold values in the ranges the parser
 *     promises (numbers, sections, shapes with H a multiple of Hkv);
 *   - tg_num_int accepts exactly the plain decimal integers: its value
 *     printed back with %lld is the text without a '+' (and "-0" is 0), and
 *     it lies in the range asked for;
 *   - tg_num_float accepts only text of the grammar in cli/num.h (no 'x',
 *     'n', 'i', blanks), and its value is 0 or a normal float32 that equals
 *     (float)strtod(text);
 *   - ASan/UBSan: no out-of-bounds access, overflow or leak anywhere in them.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_args.h"
#include "num.h"
#include "run.h"

#define MAX_ARGS 48

static void finding(const char *what, const char *text) {
  fprintf(stderr, "FINDING: %s: '%s'\n", what, text);
  abort();
}

/* help_rc: what the parser returns for --help (bench: 1, run: 0). */
static void check_message(int rc, int help_rc, const char *msg, size_t cap, const char *what) {
  if (rc != 0 && rc != 2 && rc != help_rc) finding("unexpected return code", what);
  if (memchr(msg, '\0', cap) == NULL) finding("message not terminated", what);
  if (rc == 2 && !msg[0]) finding("refusal without a message", what);
}

/* What tg_cli_bench_parse_args accepted, against the ranges it promises. */
static void check_bench_opts(const tg_bench_opts *o) {
  if (o->threads < 0 || o->threads > 4096) finding("bench threads out of range", "");
  if (o->reps < 1 || o->reps > 100000) finding("bench reps out of range", "");
  if (o->triad_mib < 1 || o->triad_mib > (1u << 20)) finding("bench triad-mib out of range", "");
  if (o->sections & ~(TG_BENCH_SECTION_ATTN | TG_BENCH_SECTION_MEM))
    finding("bench sections out of range", "");
  if ((o->shapes == NULL) != (o->nshapes == 0)) finding("bench shapes and count disagree", "");
  for (int i = 0; i < o->nshapes; i++) {
    const tg_bench_shape *s = &o->shapes[i];
    const int sizes[5] = {s->B, s->H, s->Hkv, s->L, s->D};
    for (int k = 0; k < 5; k++)
      if (sizes[k] < 1 || sizes[k] > (1 << 30)) finding("bench shape size out of range", "");
    if ((s->causal != 0 && s->causal != 1) || s->H % s->Hkv)
      finding("bench shape accepted with bad causal or H % Hkv", "");
  }
}

/* tg_num_int's result against printing it back. */
static void check_int(const char *text) {
  char err[512];
  int64_t v = 0;
  const int64_t lo = -1000000, hi = 4294967295LL;
  if (tg_num_int("x", text, lo, hi, &v, err, sizeof err) != 0) {
    if (!err[0]) finding("int refused without a message", text);
    return;
  }
  if (v < lo || v > hi) finding("int out of the range asked for", text);
  char back[32];
  snprintf(back, sizeof back, "%lld", (long long)v);
  const char *t = text[0] == '+' ? text + 1 : text;
  if (strcmp(back, t) && !(v == 0 && !strcmp(t, "-0"))) finding("int not plain decimal", text);
}

/* tg_num_float's result against the grammar and strtod. */
static void check_float(const char *text) {
  char err[512];
  double v = 0;
  if (tg_num_float("x", text, &v, err, sizeof err) != 0) {
    if (!err[0]) finding("float refused without a message", text);
    return;
  }
  if (!text[0] || strspn(text, "0123456789+-.eE") != strlen(text))
    finding("float accepted outside the decimal grammar", text);
  const float f = (float)v;
  if ((double)f != v) finding("float value is not a float32", text);
  if (f != 0.0f && !(fabsf(f) >= FLT_MIN && fabsf(f) <= FLT_MAX))
    finding("float accepted as subnormal or infinite", text);
  if (f != (float)strtod(text, NULL)) finding("float value differs from strtod", text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int bench = data[0] & 1;
  /* Copy the rest so every argument is NUL-terminated. */
  char *buf = malloc(size);
  if (!buf) return 0;
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = bench ? "bench" : "run";
  for (size_t i = 0; i < size - 1 && argc < MAX_ARGS + 1;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;

  static char msg[16384];
  memset(msg, 'U', sizeof msg); /* a missing terminator shows up */
  int rc;
  if (bench) {
    tg_bench_opts opts;
    rc = tg_cli_bench_parse_args(argc, argv, &opts, msg, sizeof msg);
    check_message(rc, BENCH_ARGS_HELP, msg, sizeof msg, "bench parse_args");
    if (rc != BENCH_ARGS_BAD && msg[0]) finding("bench message without a refusal", msg);
    if (rc == BENCH_ARGS_RUN) {
      check_bench_opts(&opts);
      tg_cli_bench_opts_free(&opts);
    }
  } else {
    rc = tg_cli_run_check_args(argc, argv, msg, sizeof msg);
    check_message(rc, 0, msg, sizeof msg, "run check_args");
  }
  for (int i = 1; i < argc; i++) {
    const char *eq = strchr(argv[i], '=');
    check_int(argv[i]);
    check_float(argv[i]);
    if (eq) {
      check_int(eq + 1);
      check_float(eq + 1);
    }
  }
  char label[TG_NUM_LABEL_LEN];
  if (argc > 1) tg_num_label(label, sizeof label, "--param p", '=', argv[argc - 1]);
  free(buf);
  return 0;
}
