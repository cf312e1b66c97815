/* `tilegrad bench`'s command line: the parser, the --json location check and
 * the help text; see bench_args.h. */
#include "bench_args.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "isa_names.h"
#include "num.h"
#include "outfile.h"

enum { DEFAULT_REPS = 5, DEFAULT_TRIAD_MIB = 256 };

void tg_cli_bench_usage(FILE *f) {
  char isa_names[TG_CLI_ISA_NAMES_LEN], isa_tables[TG_CLI_ISA_TABLES_LEN];
  fprintf(f,
          "usage: tilegrad bench [options]\n"
          "\n"
          "Times the FlashAttention-2 backward step (one tg_attn_train_bwd_step call)\n"
          "and the memory-bound kernels, as a fraction of this machine's measured\n"
          "ceilings (f32 FMA peak, bf16 dot peak, triad bandwidth) at the same\n"
          "thread count. A sliding-window shape's FLOP counts only its visible (i, k) pairs.\n"
          "\n"
          "options (\"--opt value\" or \"--opt=value\"):\n"
          "  --threads N        OpenMP threads for kernels and ceilings, 1-4096 (default:\n"
          "                     OpenMP's default, i.e. OMP_NUM_THREADS or all cores)\n"
          "  --quick            small shapes (< 20 s in all at 2 threads), their\n"
          "                     batch times ceil(threads / 2)\n"
          "  --shapes LIST      custom attention shapes 'B,H,Hkv,L,D,causal[,W];...'\n"
          "                     (qL = kL = L, sizes 1-2^30, H a multiple of Hkv,\n"
          "                     causal 0 or 1, W a sliding window, 0 = none), e.g.\n"
          "                     '1,8,8,2048,128,1' or '1,2,2,16384,128,1;1,2,2,16384,128,1,1024'\n"
          "  --reps N           timed repetitions per case, median reported (default %d,\n"
          "                     at most 100000; one untimed warm-up run comes first)\n"
          "  --json FILE        also write all results as JSON to FILE (its location is\n"
          "                     checked before the bench starts)\n"
          "  --isa I            %s (default:\n"
          "                     auto, or $TG_ISA)\n"
          "%s"
          "  --deterministic    run the kernels in deterministic mode\n"
          "  --precision P      exact | split | bf16: the attention's products that take\n"
          "                     P or dS (tg_ctx_set_attn_precision; default exact)\n"
          "  --section S        attn | mem | all (default all: attn and mem); mem: one\n"
          "                     row per memory-bound kernel (cast, RMSNorm, softmax,\n"
          "                     embedding, cross-entropy, transpose, decode reduce, FWHT,\n"
          "                     RoPE of q and k, SwiGLU and GeGLU); peaks: the\n"
          "                     ceilings only; window: sliding windows at L 8192-32768\n"
          "                     with the causal step of the same heads, and their L*W\n"
          "                     share (long: ~1750 GFLOP a repetition; --quick: L 4096)\n"
          "  --triad-mib N      size of each of the 3 triad arrays in MiB (default %d,\n"
          "                     at most 2^20; keep the 3 arrays well above the L3 size)\n"
          "  --help             this text\n"
          "\n"
          "Numbers are decimal integers (no leading zeros, no hex); a bad one is refused\n"
          "with exit 2 before anything is measured.\n",
          DEFAULT_REPS, tg_cli_isa_names(isa_names, sizeof isa_names, "|"),
          tg_cli_isa_tables(isa_tables, sizeof isa_tables, "                     "),
          DEFAULT_TRIAD_MIB);
}

static int refuse(char *msg, size_t msglen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *msg, size_t msglen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, msglen, fmt, ap);
  va_end(ap);
  return BENCH_ARGS_BAD;
}

/* text[0..len) in single quotes for a message, cut to its first 64 chars. */
#define QUOTED_LEN 72
static const char *quoted(char buf[QUOTED_LEN], const char *text, size_t len) {
  snprintf(buf, QUOTED_LEN, "'%.*s%s'", (int)(len > 64 ? 64 : len), text,
           len > 64 ? "..." : "");
  return buf;
}

/* An integer option's value in [lo, hi]; the message names the option and
 * the value ("--reps 010: leading zero ..."). */
static int parse_integer(const char *opt, const char *val, int64_t lo, int64_t hi,
                         int64_t *out, char *msg, size_t msglen) {
  char label[TG_NUM_LABEL_LEN];
  tg_num_label(label, sizeof label, opt, ' ', val);
  return tg_num_int(label, val, lo, hi, out, msg, msglen) ? BENCH_ARGS_BAD : BENCH_ARGS_RUN;
}

/* Drops the blanks around text, in place. */
static char *trim_blanks(char *text) {
  while (*text == ' ') text++;
  size_t len = strlen(text);
  while (len && text[len - 1] == ' ') text[--len] = '\0';
  return text;
}

/* One --shapes item "B,H,Hkv,L,D,causal[,W]" into *s. item is a writable
 * copy of given[0..len), which the messages quote. */
static int parse_shape(const char *given, size_t len, char *item, tg_bench_shape *s,
                       char *msg, size_t msglen) {
  static const char *const names[7] = {"B", "H", "Hkv", "L", "D", "causal", "W"};
  static const int64_t lo[7] = {1, 1, 1, 1, 1, 0, 0};
  static const int64_t hi[7] = {1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1, 1 << 30};
  char q[QUOTED_LEN];
  quoted(q, given, len);
  int64_t v[7] = {0};
  int n = 1;
  for (const char *c = item; *c; c++) n += *c == ',';
  if (n != 6 && n != 7)
    return refuse(msg, msglen,
                  "--shapes %s: want 6 fields B,H,Hkv,L,D,causal (positive sizes, causal "
                  "0 or 1) or 7 with a sliding window W (0 = none)", q);
  char *field = item;
  for (int k = 0; k < n; k++) {
    char *comma = strchr(field, ',');
    if (comma) *comma = '\0';
    const char *text = trim_blanks(field);
    char opt[QUOTED_LEN + 32], label[TG_NUM_LABEL_LEN + sizeof opt];
    snprintf(opt, sizeof opt, "--shapes %s: field %s", q, names[k]);
    tg_num_label(label, sizeof label, opt, '=', text);
    if (tg_num_int(label, text, lo[k], hi[k], &v[k], msg, msglen)) return BENCH_ARGS_BAD;
    if (comma) field = comma + 1;
  }
  if (v[1] % v[2])
    return refuse(msg, msglen, "--shapes %s: H=%lld is not a multiple of Hkv=%lld", q,
                  (long long)v[1], (long long)v[2]);
  *s = (tg_bench_shape){(int)v[0], (int)v[1], (int)v[2], (int)v[3],
                        (int)v[4], (int)v[5], (int)v[6]};
  return BENCH_ARGS_RUN;
}

/* "B,H,Hkv,L,D,causal[,W];..." into o->shapes (replacing an earlier --shapes).
 * Items of blanks only are skipped ("a;b;" is two shapes); blanks around a
 * field are allowed. */
static int parse_shapes(const char *spec, tg_bench_opts *o, char *msg, size_t msglen) {
  free(o->shapes);
  o->shapes = NULL;
  o->nshapes = 0;
  const size_t speclen = strlen(spec);
  size_t items = 1;
  for (const char *c = spec; *c; c++) items += *c == ';';
  char *copy = malloc(speclen + 1);
  tg_bench_shape *shapes = calloc(items, sizeof *shapes);
  int n = 0, rc = BENCH_ARGS_RUN;
  if (!copy || !shapes) {
    rc = refuse(msg, msglen, "--shapes: out of memory");
    goto done;
  }
  memcpy(copy, spec, speclen + 1);
  for (char *item = copy; rc == BENCH_ARGS_RUN;) {
    char *semi = strchr(item, ';');
    if (semi) *semi = '\0';
    const size_t len = strlen(item);
    if (strspn(item, " ") < len)
      rc = parse_shape(spec + (item - copy), len, item, &shapes[n++], msg, msglen);
    if (!semi) break;
    item = semi + 1;
  }
  if (rc == BENCH_ARGS_RUN && n == 0) {
    char q[QUOTED_LEN];
    rc = refuse(msg, msglen, "--shapes: no usable shape in %s", quoted(q, spec, speclen));
  }
done:
  free(copy);
  if (rc != BENCH_ARGS_RUN) {
    free(shapes);
    return rc;
  }
  o->shapes = shapes;
  o->nshapes = n;
  return BENCH_ARGS_RUN;
}

typedef enum {
  OPT_HELP,
  OPT_QUICK,
  OPT_DETERMINISTIC,
  OPT_THREADS,
  OPT_REPS,
  OPT_TRIAD_MIB,
  OPT_JSON,
  OPT_ISA,
  OPT_SECTION,
  OPT_SHAPES,
  OPT_PRECISION
} bench_option;

static const struct {
  const char *name;
  bench_option id;
  int takes_value;
} k_options[] = {
    {"--help", OPT_HELP, 0},        {"-h", OPT_HELP, 0},
    {"--quick", OPT_QUICK, 0},      {"--deterministic", OPT_DETERMINISTIC, 0},
    {"--threads", OPT_THREADS, 1},  {"--reps", OPT_REPS, 1},
    {"--triad-mib", OPT_TRIAD_MIB, 1}, {"--json", OPT_JSON, 1},
    {"--isa", OPT_ISA, 1},          {"--section", OPT_SECTION, 1},
    {"--shapes", OPT_SHAPES, 1},    {"--precision", OPT_PRECISION, 1},
};

static const struct {
  const char *name;
  int sections;
} k_sections[] = {
    {"attn", TG_BENCH_SECTION_ATTN},
    {"mem", TG_BENCH_SECTION_MEM},
    {"window", TG_BENCH_SECTION_WINDOW},
    {"all", TG_BENCH_SECTION_ATTN | TG_BENCH_SECTION_MEM},
    {"peaks", 0},
};

/* The arguments in order, into *o (already holding the defaults). */
static int parse_each(int argc, char **argv, tg_bench_opts *o, char *msg, size_t msglen) {
  char q[QUOTED_LEN];
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    size_t opt = 0, n = 0;
    for (; opt < sizeof k_options / sizeof k_options[0]; opt++) {
      n = strlen(k_options[opt].name);
      if (!strncmp(arg, k_options[opt].name, n) && (arg[n] == '\0' || arg[n] == '=')) break;
    }
    if (opt == sizeof k_options / sizeof k_options[0])
      return refuse(msg, msglen, "unknown option %s (see tilegrad bench --help)",
                    quoted(q, arg, strlen(arg)));
    const char *name = k_options[opt].name;
    const char *val = arg[n] == '=' ? arg + n + 1 : NULL;
    if (!k_options[opt].takes_value && val) return refuse(msg, msglen, "%s takes no value", name);
    if (k_options[opt].takes_value && !val) {
      if (i + 1 >= argc) return refuse(msg, msglen, "%s needs a value", name);
      val = argv[++i];
    }
    int64_t v;
    int rc = BENCH_ARGS_RUN;
    switch (k_options[opt].id) {
      case OPT_HELP:
        return BENCH_ARGS_HELP;
      case OPT_QUICK:
        o->quick = 1;
        break;
      case OPT_DETERMINISTIC:
        o->deterministic = 1;
        break;
      case OPT_THREADS:
        if (!(rc = parse_integer(name, val, 1, 4096, &v, msg, msglen))) o->threads = (int)v;
        break;
      case OPT_REPS:
        if (!(rc = parse_integer(name, val, 1, 100000, &v, msg, msglen))) o->reps = (int)v;
        break;
      case OPT_TRIAD_MIB:
        if (!(rc = parse_integer(name, val, 1, 1 << 20, &v, msg, msglen)))
          o->triad_mib = (size_t)v;
        break;
      case OPT_JSON:
        o->json = val;
        break;
      case OPT_ISA: {
        char isa_names[TG_CLI_ISA_NAMES_LEN];
        if (tg_isa_from_name(val, &o->isa) != TG_OK)
          return refuse(msg, msglen, "--isa %s: want one of %s", quoted(q, val, strlen(val)),
                        tg_cli_isa_names(isa_names, sizeof isa_names, ", "));
        o->isa_set = 1;
        break;
      }
      case OPT_SECTION: {
        size_t s = 0;
        while (s < sizeof k_sections / sizeof k_sections[0] && strcmp(val, k_sections[s].name))
          s++;
        if (s == sizeof k_sections / sizeof k_sections[0])
          return refuse(msg, msglen, "--section %s: want attn, mem, window, peaks or all",
                        quoted(q, val, strlen(val)));
        o->sections = k_sections[s].sections;
        break;
      }
      case OPT_SHAPES:
        rc = parse_shapes(val, o, msg, msglen);
        break;
      case OPT_PRECISION: {
        int m = TG_ATTN_PRECISION_EXACT;
        while (m <= TG_ATTN_PRECISION_BF16 && strcmp(val, tg_attn_precision_name(m))) m++;
        if (m > TG_ATTN_PRECISION_BF16)
          return refuse(msg, msglen, "--precision %s: want exact, split or bf16",
                        quoted(q, val, strlen(val)));
        o->precision = (tg_attn_precision)m;
        break;
      }
    }
    if (rc != BENCH_ARGS_RUN) return rc;
  }
  return BENCH_ARGS_RUN;
}

int tg_cli_bench_parse_args(int argc, char **argv, tg_bench_opts *o, char *msg,
                            size_t msglen) {
  if (msg && msglen) msg[0] = '\0';
  *o = (tg_bench_opts){.reps = DEFAULT_REPS,
                       .triad_mib = DEFAULT_TRIAD_MIB,
                       .isa = TG_ISA_AUTO,
                       .sections = TG_BENCH_SECTION_ATTN | TG_BENCH_SECTION_MEM};
  const int rc = parse_each(argc, argv, o, msg, msglen);
  if (rc != BENCH_ARGS_RUN) tg_cli_bench_opts_free(o);
  return rc;
}

int tg_cli_bench_check_json(const tg_bench_opts *o, char *msg, size_t msglen) {
  if (!o->json) return 0;
  tg_outset set;
  tg_outset_init(&set);
  return tg_outset_add(&set, "--json", o->json, msg, msglen) < 0 ? -1 : 0;
}

void tg_cli_bench_opts_free(tg_bench_opts *o) {
  free(o->shapes);
  o->shapes = NULL;
  o->nshapes = 0;
}
