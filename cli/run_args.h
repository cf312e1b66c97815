/* `tilegrad run`'s command line: options, buffer names and --param values
 * into a run_call (cli/run_args.c; tg_cli_run_check_args in run.h is its
 * entry point for the fuzzer and tests). */
#ifndef TG_CLI_RUN_ARGS_H
#define TG_CLI_RUN_ARGS_H

#include "run_call.h"
#include "tilegrad.h"

/* The options that are not buffers or params. */
typedef struct {
  int threads; /* -1 = not given */
  int deterministic, quiet, have_isa;
  tg_isa isa;
} run_opts;

enum { PARSE_GO_ON = -1, PARSE_HELP = -2 };

/* Step 1: the command line (argv[0] "run", argv[1] the kernel, already in
 * c->k) into c and o, every --param value parsed and checked. Touches no
 * file. Returns PARSE_GO_ON, PARSE_HELP, or RUN_EXIT_USAGE with the message
 * in c->err. */
int run_parse_command_line(run_call *c, int argc, char **argv, run_opts *o);

#endif /* TG_CLI_RUN_ARGS_H */
