/* One `tilegrad run` invocation's state, shared by the command (cli/run.c),
 * its parser (cli/run_args.c), the shape rules (cli/run_shapes.c) and the
 * kernels' adapters (cli/run_kernels.c). */
#ifndef TG_CLI_RUN_CALL_H
#define TG_CLI_RUN_CALL_H

#include <stdint.h>

#include "npy.h"
#include "outfile.h"
#include "run_kernels.h"
#include "tilegrad.h"

#define RUN_MAX_SYMS 24

typedef struct {
  const char *in_path, *out_path;
  npy_array arr; /* data NULL when absent */
} run_buf;

typedef struct {
  const char *given; /* text from --param (or its option, below), or NULL */
  const char *via;   /* the option that gave it ("--window"), or NULL for --param */
  int64_t i;         /* parsed value of an int/bool param */
  double f;          /* parsed value of a float param (ints: the same as double) */
} run_param;

typedef struct {
  char name[32];
  int64_t value;
  char from[TG_OUT_PATH + 320]; /* buffer or param that fixed it, for messages */
} run_sym;

struct run_call {
  const kernel_spec *k;
  tg_ctx *ctx;
  run_buf bufs[RUN_MAX_BUFS];
  run_param params[RUN_MAX_PARAMS];
  run_sym syms[RUN_MAX_SYMS];
  int n_syms;
  int cli_failed;       /* the adapter refused the inputs (message in err) */
  tg_outset outs;       /* the --out files, all written or none */
  int out_index[RUN_MAX_BUFS]; /* buffer -> its entry in outs, -1 = none */
  char err[NPY_ERR_LEN + 256];
};

/* The message into c->err; returns -1. */
int run_errorf(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For adapters: refuse the inputs with a CLI-level message (exit code 2). */
tg_status run_refuse(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* TG_CLI_RUN_CALL_H */
