/* `tilegrad run`'s command line; see run_args.h. */
#include "run_args.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isa_names.h"
#include "num.h"
#include "run.h"

/* run_errorf for the command-line parser: returns the exit code. */
static int usage_errorf(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_errorf(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return RUN_EXIT_USAGE;
}

/* --- params ------------------------------------------------------------------------ */
/* Parses one param's text (given or its default) with the CLI's one number
 * parser (num.h): decimal only, range of the param's type, float32 range
 * without underflow for floats. */
static int parse_param(run_call *c, int pi, const char *text, const char *what) {
  const param_spec *ps = &c->k->params[pi];
  run_param *p = &c->params[pi];
  char opt[96], label[TG_NUM_LABEL_LEN];
  if (p->via && p->given == text) {
    tg_num_label(label, sizeof label, p->via, ' ', text);
  } else {
    snprintf(opt, sizeof opt, "%s %s", what, ps->name);
    tg_num_label(label, sizeof label, opt, '=', text);
  }
  if (ps->type == P_FLOAT) return tg_num_float(label, text, &p->f, c->err, sizeof c->err);
  if (ps->type == P_BOOL && (!strcmp(text, "true") || !strcmp(text, "false"))) {
    p->i = text[0] == 't';
  } else {
    const int64_t lo = ps->type == P_I32 ? INT32_MIN : 0;
    const int64_t hi = ps->type == P_BOOL ? 1 : ps->type == P_I32 ? INT32_MAX : UINT32_MAX;
    if (tg_num_int(label, text, lo, hi, &p->i, c->err, sizeof c->err)) return -1;
  }
  p->f = (double)p->i;
  return 0;
}

/* Every param: the given text or the default, or a refusal when a required
 * one is missing. Needs no file, so it runs before any input is read. */
static int parse_params(run_call *c) {
  const kernel_spec *k = c->k;
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++) {
    const param_spec *ps = &k->params[i];
    const run_param *p = &c->params[i];
    if (p->given) {
      if (parse_param(c, i, p->given, "--param")) return -1;
    } else if (ps->def && ps->def[0]) {
      if (parse_param(c, i, ps->def, "default")) return -1;
    } else if (!ps->def) {
      return run_errorf(c, "missing --param %s=... (%s)", ps->name, ps->help);
    }
  }
  return 0;
}

/* --- the command line ---------------------------------------------------------- */
/* The attention variants' options, each a shorthand for a param or an input
 * buffer of the kernels that have it (cli/run_kernels.c's table). */
static const struct {
  const char *option, *name;
  int is_buffer; /* 1: --in NAME=value; 0: --param NAME=value */
  const char *what;
} k_shorthands[] = {
    {"--window", "window", 0, "sliding window"},
    {"--v-head-dim", "v_head_dim", 0, "value head dim"},
    {"--sinks", "sinks", 1, "attention sinks"},
};
enum { N_SHORTHANDS = sizeof k_shorthands / sizeof k_shorthands[0] };

/* "NAME=value" → name (copied into buf) and value; 0 on success. */
static int split_assign(const char *arg, char *name, size_t namelen, const char **value) {
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || (size_t)(eq - arg) >= namelen || !eq[1]) return -1;
  memcpy(name, arg, (size_t)(eq - arg));
  name[eq - arg] = '\0';
  *value = eq + 1;
  return 0;
}

/* Appends the kernel's input or output buffer names to buf. */
static void list_names(char *buf, size_t buflen, const kernel_spec *k, int outputs) {
  int first = 1;
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_role r = k->bufs[i].role;
    const int is_out = r == ROLE_OUT || r == ROLE_ACC || r == ROLE_INOUT;
    const int is_in = r != ROLE_OUT;
    if (outputs ? is_out : is_in) {
      const size_t used = strlen(buf);
      snprintf(buf + used, buflen - used, "%s%s", first ? "" : ", ", k->bufs[i].name);
      first = 0;
    }
  }
}

int run_parse_command_line(run_call *c, int argc, char **argv, run_opts *o) {
  const kernel_spec *k = c->k;
  memset(o, 0, sizeof *o);
  o->threads = -1;
  o->isa = TG_ISA_AUTO;
  char label[TG_NUM_LABEL_LEN];
  for (int ai = 2; ai < argc; ai++) {
    const char *a = argv[ai];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return PARSE_HELP;
    if (!strcmp(a, "--deterministic")) {
      o->deterministic = 1;
      continue;
    }
    if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
      o->quiet = 1;
      continue;
    }
    /* options with a value: "--opt value" or "--opt=value" */
    static const char *const valued[] = {"--in",     "--out",        "--param", "--threads",
                                         "--isa",    "--window",     "--sinks",
                                         "--v-head-dim"};
    const char *opt = NULL, *val = NULL;
    for (size_t v = 0; v < sizeof valued / sizeof valued[0]; v++) {
      const size_t n = strlen(valued[v]);
      if (!strcmp(a, valued[v])) {
        if (ai + 1 >= argc) return usage_errorf(c, "%s needs a value", a);
        opt = valued[v];
        val = argv[++ai];
      } else if (!strncmp(a, valued[v], n) && a[n] == '=') {
        opt = valued[v];
        val = a + n + 1;
      }
    }
    if (!opt) {
      tg_num_label(label, sizeof label, "argument", ' ', a);
      return usage_errorf(c, "unknown %s (see tilegrad run %s --help)", label, k->name);
    }
    if (!strcmp(opt, "--threads")) {
      int64_t v;
      tg_num_label(label, sizeof label, "--threads", ' ', val);
      if (tg_num_int(label, val, 0, 4096, &v, c->err, sizeof c->err)) {
        const size_t used = strlen(c->err);
        snprintf(c->err + used, sizeof c->err - used, " (0 = OpenMP default)");
        return RUN_EXIT_USAGE;
      }
      o->threads = (int)v;
      continue;
    }
    if (!strcmp(opt, "--isa")) {
      if (tg_isa_from_name(val, &o->isa) != TG_OK) {
        char names[TG_CLI_ISA_NAMES_LEN];
        tg_num_label(label, sizeof label, "--isa", ' ', val);
        return usage_errorf(c, "%s: expected one of %s", label,
                            tg_cli_isa_names(names, sizeof names, ", "));
      }
      o->have_isa = 1;
      continue;
    }
    char name[64];
    const char *value;
    const char *shorthand = NULL; /* the variant option, when opt is one */
    for (int v = 0; v < N_SHORTHANDS; v++) {
      if (strcmp(opt, k_shorthands[v].option)) continue;
      const int takes = k_shorthands[v].is_buffer ? run_buf_index(k, k_shorthands[v].name) >= 0
                                                  : run_param_index(k, k_shorthands[v].name) >= 0;
      if (!takes)
        return usage_errorf(c, "%s: %s has no %s (flash_attn_train_fwd_bf16 and "
                               "flash_attn_train_bwd_bf16 do)",
                            opt, k->name, k_shorthands[v].what);
      if (!val[0]) return usage_errorf(c, "%s needs a value", opt);
      shorthand = opt;
      snprintf(name, sizeof name, "%s", k_shorthands[v].name);
      value = val;
      opt = k_shorthands[v].is_buffer ? "--in" : "--param";
    }
    if (!shorthand && split_assign(val, name, sizeof name, &value)) {
      tg_num_label(label, sizeof label, opt, ' ', val);
      return usage_errorf(c, "%s: expected NAME=%s", label,
                          strcmp(opt, "--param") ? "file.npy" : "value");
    }
    if (!strcmp(opt, "--param")) {
      const int pi = run_param_index(k, name);
      if (pi < 0) {
        run_errorf(c, "unknown param '%s'", name);
        const size_t used = strlen(c->err);
        if (!k->params[0].name) {
          snprintf(c->err + used, sizeof c->err - used, " (this kernel takes none)");
        } else {
          snprintf(c->err + used, sizeof c->err - used, "; params:");
          for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++) {
            const size_t u = strlen(c->err);
            snprintf(c->err + u, sizeof c->err - u, " %s", k->params[i].name);
          }
        }
        return RUN_EXIT_USAGE;
      }
      const char *as_option = shorthand ? shorthand : c->params[pi].via;
      if (c->params[pi].given && !as_option)
        return usage_errorf(c, "--param %s given twice", name);
      if (c->params[pi].given)
        return usage_errorf(c, "%s given twice (it is --param %s)", as_option, name);
      c->params[pi].given = value;
      c->params[pi].via = shorthand;
      continue;
    }
    const int is_in = !strcmp(opt, "--in");
    const int bi = run_buf_index(k, name);
    const buf_role role = bi >= 0 ? k->bufs[bi].role : ROLE_IN;
    if (bi < 0 || (is_in && role == ROLE_OUT) ||
        (!is_in && (role == ROLE_IN || role == ROLE_OPT_IN))) {
      if (bi >= 0)
        run_errorf(c, "%s %s: %s is %s", opt, name, name,
                   is_in ? "an output the kernel overwrites (it takes no --in)"
                         : "an input (it takes no --out)");
      else
        run_errorf(c, "%s %s: no such buffer", opt, name);
      size_t used = strlen(c->err);
      snprintf(c->err + used, sizeof c->err - used, "\n  inputs: ");
      list_names(c->err, sizeof c->err, k, 0);
      used = strlen(c->err);
      snprintf(c->err + used, sizeof c->err - used, "\n  outputs: ");
      list_names(c->err, sizeof c->err, k, 1);
      return RUN_EXIT_USAGE;
    }
    /* A path the system cannot open is refused here, before a message
     * quoting all of it could crowd out the reason. */
    if (strlen(value) >= TG_OUT_PATH) {
      tg_num_label(label, sizeof label, opt, ' ', val);
      return usage_errorf(c, "%s: path of %zu bytes is longer than the system takes (%d)",
                          label, strlen(value), TG_OUT_PATH - 1);
    }
    const char **slot = is_in ? &c->bufs[bi].in_path : &c->bufs[bi].out_path;
    if (*slot) {
      const int sinks = is_in && run_buf_index(k, "sinks") == bi;
      return usage_errorf(c, "%s %s given twice%s", opt, name,
                          sinks ? " (--sinks is --in sinks)" : "");
    }
    *slot = value;
  }
  /* A run without --out computes and writes nothing, and exit 0 would read
   * as success; no documented use needs it (timing is `tilegrad bench`). */
  int outs = 0;
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) outs += c->bufs[i].out_path != NULL;
  if (!outs) {
    run_errorf(c, "no --out given: the run would write nothing; name at least one of: ");
    list_names(c->err, sizeof c->err, k, 1);
    const size_t used = strlen(c->err);
    snprintf(c->err + used, sizeof c->err - used, " (--out NAME=file.npy)");
    return RUN_EXIT_USAGE;
  }
  if (parse_params(c)) return RUN_EXIT_USAGE;
  return PARSE_GO_ON;
}

int tg_cli_run_check_args(int argc, char **argv, char *msg, size_t msglen) {
  if (msg && msglen) msg[0] = '\0';
  if (argc < 2) {
    if (msg && msglen) snprintf(msg, msglen, "no kernel given");
    return RUN_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return RUN_EXIT_OK;
  const kernel_spec *k = run_find_kernel(argv[1]);
  if (!k) {
    char label[TG_NUM_LABEL_LEN];
    if (msg && msglen)
      snprintf(msg, msglen, "unknown %s", tg_num_label(label, sizeof label, "kernel", ' ', argv[1]));
    return RUN_EXIT_USAGE;
  }
  run_call *c = calloc(1, sizeof *c);
  if (!c) return RUN_EXIT_USAGE;
  c->k = k;
  run_opts o;
  const int r = run_parse_command_line(c, argc, argv, &o);
  if (msg && msglen) snprintf(msg, msglen, "%s", c->err);
  free(c);
  return r == PARSE_GO_ON || r == PARSE_HELP ? RUN_EXIT_OK : r;
}
