/* `tilegrad run`: run one contract kernel on .npy buffers. */
#ifndef TG_CLI_RUN_H
#define TG_CLI_RUN_H

#include <stddef.h>
#include <stdio.h>

/* Exit codes of `tilegrad run`. */
enum {
  RUN_EXIT_OK = 0,
  RUN_EXIT_KERNEL = 1, /* the library refused the call (status + last error printed) */
  RUN_EXIT_USAGE = 2   /* bad command line, unreadable/mismatched .npy, write failure */
};

/* argv[0] is "run". Returns a process exit code. */
int tg_cli_run_main(int argc, char **argv);

/* The command-line half of tg_cli_run_main, for the fuzzer and tests: parses
 * the options, buffer names and --param values (numbers included) and
 * returns the exit code the command would give for them (0 = acceptable;
 * --help counts as 0), with its message in msg. Touches no file: paths are
 * not checked. */
int tg_cli_run_check_args(int argc, char **argv, char *msg, size_t msglen);

/* Help for one kernel (name) or for all kernels (name NULL). Returns 0, or -1
 * if name is not a known kernel. */
int tg_cli_run_help(FILE *out, const char *name);

/* One line per kernel: name and summary. */
void tg_cli_run_list(FILE *out);

#endif /* TG_CLI_RUN_H */
