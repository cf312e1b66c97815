/* `tilegrad run`'s help: the usage text and each kernel's buffers and params
 * (cli/run_help.c; tg_cli_run_help and tg_cli_run_list in run.h). */
#ifndef TG_CLI_RUN_HELP_H
#define TG_CLI_RUN_HELP_H

#include <stdio.h>

#include "run_kernels.h"

/* One kernel's help: its summary, then a line per buffer and param. */
void run_kernel_help(FILE *out, const kernel_spec *k);

#endif /* TG_CLI_RUN_HELP_H */
