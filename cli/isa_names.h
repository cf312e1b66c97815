/* The names --isa takes, from the library's ISA registry (tg_isa_count,
 * tg_isa_at, tg_isa_name), for the usage texts and messages of `tilegrad
 * run` and `tilegrad bench`. */
#ifndef TG_CLI_ISA_NAMES_H
#define TG_CLI_ISA_NAMES_H

#include <stddef.h>

/* Room for every name with its separator. */
#define TG_CLI_ISA_NAMES_LEN 256

/* "auto" and then this architecture's ISAs from least to most preferred,
 * joined by sep, into buf: "auto|portable|avx2|..." for sep "|",
 * "auto, portable, avx2, ..." for sep ", ". Returns buf. */
const char *tg_cli_isa_names(char *buf, size_t buflen, const char *sep);

/* Room for tg_cli_isa_tables' lines. */
#define TG_CLI_ISA_TABLES_LEN 1024

/* Lines for the --isa help, each starting with indent and wrapped before
 * column 79, ending in a newline: every table of the public tg_isa enum (the
 * library's names, and for another architecture's tables, which the library
 * does not name, the enum's), which of them this build has (tg_isa_count,
 * tg_isa_at) and which this CPU runs (tg_isa_available). Returns buf. */
const char *tg_cli_isa_tables(char *buf, size_t buflen, const char *indent);

#endif /* TG_CLI_ISA_NAMES_H */
