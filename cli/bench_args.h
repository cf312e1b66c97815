/* `tilegrad bench`: its command line, parsed once into tg_bench_opts. */
#ifndef TG_CLI_BENCH_ARGS_H
#define TG_CLI_BENCH_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "bench.h"

/* What tg_cli_bench_parse_args found. */
enum {
  BENCH_ARGS_RUN = 0,  /* *o holds the options: run the bench */
  BENCH_ARGS_HELP = 1, /* --help or -h: print tg_cli_bench_usage, exit 0 */
  BENCH_ARGS_BAD = 2   /* a usage error, the message in msg: exit 2 */
};

/* Parses bench's command line (argv[0] "bench") into *o: "--opt value" or
 * "--opt=value"; --quick, --deterministic and --help/-h take no value. Every
 * number (--threads, --reps, --triad-mib and each field of --shapes) goes
 * through the CLI's one number parser (num.h: decimal only, range-checked);
 * --shapes items have 6 fields, or 7 with a sliding window W, and H a
 * multiple of Hkv. An unknown option, a missing value, a value given to a
 * flag and a bad --isa or --section value are refused. The arguments are read in order and the first --help or error
 * ends the parse; a repeated option keeps its last value.
 * Returns a BENCH_ARGS_* code. On BENCH_ARGS_BAD, msg holds "what: why" (it
 * is "" otherwise). Only on BENCH_ARGS_RUN does *o hold anything to free
 * (tg_cli_bench_opts_free); o->json points into argv. Touches no file: the
 * --json location is tg_cli_bench_check_json's. */
int tg_cli_bench_parse_args(int argc, char **argv, tg_bench_opts *o, char *msg,
                            size_t msglen);

/* Checks that o->json (if set) can be written, through outfile.h's checks
 * (missing or unwritable directory, a directory or device at the path), so
 * that a bad path fails before the bench and not after it. Returns 0, or
 * -1 with the message in msg. */
int tg_cli_bench_check_json(const tg_bench_opts *o, char *msg, size_t msglen);

/* Frees what tg_cli_bench_parse_args allocated in *o (its --shapes list). */
void tg_cli_bench_opts_free(tg_bench_opts *o);

/* `tilegrad bench --help`. */
void tg_cli_bench_usage(FILE *out);

#endif /* TG_CLI_BENCH_ARGS_H */
