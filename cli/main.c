/*
 * The `tilegrad` command:
 *   tilegrad run <kernel> ...   run one kernel on .npy buffers (cli/run.c)
 *   tilegrad bench ...          benchmarks (command line: cli/bench_args.c;
 *                               the bench: bench/, tg_bench_main)
 *   tilegrad train ...          train the tiny example model (cli/train.c)
 *   tilegrad --version | --help
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_args.h"
#include "isa_names.h"
#include "npy.h"
#include "outfile.h"
#include "run.h"
#include "tilegrad.h"

int tg_cli_train_main(int argc, char **argv); /* cli/train.c */

static void usage(FILE *out) {
  char isa_names[TG_CLI_ISA_NAMES_LEN], isa_tables[TG_CLI_ISA_TABLES_LEN];
  fprintf(out,
          "usage: tilegrad <command> [args]\n"
          "\n"
          "commands:\n"
          "  run <kernel> --in NAME=file.npy ... --out NAME=file.npy ... [--param k=v ...]\n"
          "               [--threads N] [--deterministic] [--isa %s]\n"
          "        run one kernel on .npy buffers (e.g. dumped from the Metal kernels)\n"
          "        and write its outputs; `tilegrad run --help` lists the kernels,\n"
          "        `tilegrad run <kernel> --help` its buffers and params\n"
          "  bench [args]   benchmarks (`tilegrad bench --help`)\n"
          "  train [args]   train a tiny decoder block on a built-in corpus with\n"
          "                 tilegrad's kernels and BLAS; prints the falling loss\n"
          "                 (`tilegrad train --help`)\n"
          "\n"
          "options:\n"
          "  --version      print the version and the ISA this CPU gets\n"
          "  --help         this text\n"
          "\n"
          "--isa (run, bench; or TG_ISA=):\n"
          "%s"
          "\n"
          "kernels:\n",
          tg_cli_isa_names(isa_names, sizeof isa_names, "|"),
          tg_cli_isa_tables(isa_tables, sizeof isa_tables, "  "));
  tg_cli_run_list(out);
}

static int version(void) {
  printf("tilegrad %s\n", tg_version());
  tg_ctx *ctx = NULL;
  if (tg_ctx_create(&ctx) == TG_OK) {
    printf("isa: %s\n", tg_isa_name(tg_ctx_get_isa(ctx)));
    tg_ctx_destroy(ctx);
  }
  return 0;
}

/* `tilegrad bench`: its command line and the --json location are checked
 * before the bench runs (minutes), not found wrong after it. */
static int bench_command(int argc, char **argv) {
  tg_bench_opts opts;
  char msg[NPY_ERR_LEN];
  const int parsed = tg_cli_bench_parse_args(argc, argv, &opts, msg, sizeof msg);
  if (parsed == BENCH_ARGS_HELP) {
    tg_cli_bench_usage(stdout);
    return 0;
  }
  if (parsed == BENCH_ARGS_BAD) {
    fprintf(stderr, "tilegrad bench: %s\n", msg);
    return 2;
  }
  int rc = 2;
  if (tg_cli_bench_check_json(&opts, msg, sizeof msg))
    fprintf(stderr, "tilegrad bench: %s\n", msg);
  else
    rc = tg_bench_main(&opts);
  tg_cli_bench_opts_free(&opts);
  return rc;
}

int main(int argc, char **argv) {
  /* SIGINT/SIGTERM/SIGHUP remove the temporaries of unfinished outputs. */
  tg_out_signals_install();
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version"))
    return version();
  if (!strcmp(cmd, "run")) return tg_cli_run_main(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return bench_command(argc - 1, argv + 1);
  if (!strcmp(cmd, "train")) {
#ifdef TG_HAVE_TRAIN
    return tg_cli_train_main(argc - 1, argv + 1);
#else
    fprintf(stderr, "tilegrad train: not in this build (no BLAS was found when it was "
                    "configured; install libopenblas-dev and reconfigure)\n");
    return 2;
#endif
  }
  fprintf(stderr, "tilegrad: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
