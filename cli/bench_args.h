/* `tilegrad bench`: the checks the CLI makes before the bench starts. */
#ifndef TG_CLI_BENCH_ARGS_H
#define TG_CLI_BENCH_ARGS_H

#include <stddef.h>

/* Walks bench's command line (argv[0] "bench"; the grammar of
 * bench/bench.c's parse_args: "--opt value" or "--opt=value") and refuses,
 * before any measurement:
 *   - a number that is not plain decimal or is out of range (--threads,
 *     --reps, --triad-mib and every field of --shapes), through the CLI's one
 *     number parser (num.h);
 *   - when check_files is set, a --json FILE whose location cannot take the
 *     file (outfile.h's checks: missing or unwritable directory, a directory
 *     or device at the path), so that a bad path fails at once and not after
 *     the whole bench.
 * Returns 0 to go on (what it does not know, e.g. an unknown option, is left
 * to the bench's own parser), or 2 with the message in msg. Touches no file
 * when check_files is 0 (the fuzzer). */
int tg_cli_bench_precheck(int argc, char **argv, int check_files, char *msg, size_t msglen);

#endif /* TG_CLI_BENCH_ARGS_H */
