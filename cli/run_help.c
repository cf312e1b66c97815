/* `tilegrad run`'s help; see run_help.h. */
#include "run_help.h"

#include <string.h>

#include "isa_names.h"
#include "run.h"

static const char *role_name(buf_role r) {
  switch (r) {
    case ROLE_IN: return "in";
    case ROLE_OPT_IN: return "in?";
    case ROLE_OUT: return "out";
    case ROLE_ACC: return "acc";
    case ROLE_INOUT: return "inout";
  }
  return "?";
}

static const char *ptype_name(param_type t) {
  switch (t) {
    case P_BOOL: return "0|1";
    case P_I32: return "int";
    case P_U32: return "uint";
    case P_FLOAT: return "float";
  }
  return "?";
}

void run_kernel_help(FILE *out, const kernel_spec *k) {
  fprintf(out, "%s\n    %s\n", k->name, k->summary);
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_spec *b = &k->bufs[i];
    char shape[64];
    if (b->shape[0] == '=') snprintf(shape, sizeof shape, "same as %s", b->shape + 1);
    else if (!strcmp(b->shape, "*")) snprintf(shape, sizeof shape, "any shape");
    else snprintf(shape, sizeof shape, "[%s]", b->shape);
    if (b->note)
      fprintf(out, "    %-5s %-12s %-4s %-18s %s\n", role_name(b->role), b->name,
              run_type_name(b->type), shape, b->note);
    else
      fprintf(out, "    %-5s %-12s %-4s %s\n", role_name(b->role), b->name,
              run_type_name(b->type), shape);
  }
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++) {
    const param_spec *p = &k->params[i];
    char def[48];
    if (!p->def) snprintf(def, sizeof def, "required");
    else if (!p->def[0]) snprintf(def, sizeof def, "optional");
    else snprintf(def, sizeof def, "default %s", p->def);
    fprintf(out, "    param %-12s %-5s %-17s %s\n", p->name, ptype_name(p->type), def,
            p->help);
  }
}

void tg_cli_run_list(FILE *out) {
  for (int i = 0; i < run_kernel_count(); i++)
    fprintf(out, "  %-36s %s\n", run_kernel_at(i)->name, run_kernel_at(i)->summary);
}

static void run_usage(FILE *out) {
  char isa_names[TG_CLI_ISA_NAMES_LEN], isa_tables[TG_CLI_ISA_TABLES_LEN];
  fprintf(out,
          "usage: tilegrad run <kernel> --in NAME=file.npy ... --out NAME=file.npy ...\n"
          "                    [--param k=v ...] [--threads N] [--deterministic]\n"
          "                    [--isa %s]\n"
          "                    [--window W] [--sinks FILE] [--v-head-dim Dv] [--quiet]\n"
          "       tilegrad run --help            all kernels and their buffers\n"
          "       tilegrad run <kernel> --help   one kernel\n"
          "\n"
          "--isa:\n"
          "%s"
          "\n"
          "Buffer names are the C parameter names of include/tilegrad.h. Sizes come from\n"
          "the input arrays' shapes; other scalars from --param. Roles: in = input,\n"
          "in? = optional input, out = written output, acc = accumulated output (starts\n"
          "from --in NAME=file if given, else zeros), inout = modified in place.\n"
          "dtypes: f32 '<f4'; bf16 raw bits '<u2' (also '<V2', 'bfloat16');\n"
          "u32 '<u4' or non-negative '<i4'. Outputs are written as '<f4' / '<u2'.\n"
          "\n"
          "Attention variants (flash_attn_train_fwd_bf16 and flash_attn_train_bwd_bf16):\n"
          "  --window W        sliding window: key k is visible to query i only if\n"
          "                    k > i + qL_off - W (with causal=1: the W keys up to the\n"
          "                    diagonal); same as --param window=W; 0 = none\n"
          "  --sinks FILE      .npy [H] f32, one sink logit s_h per query head: e^s_h joins\n"
          "                    every row's softmax denominator (L includes it); same as\n"
          "                    --in sinks=FILE. The backward's --out d_sinks=FILE gives its\n"
          "                    gradient ([H] f32, accumulated onto --in d_sinks if given)\n"
          "  --v-head-dim Dv   V, O, dO and dV have Dv columns (a multiple of 8, at most\n"
          "                    512), Q, K, dQ and dK keep D; same as --param v_head_dim=Dv.\n"
          "                    Without it V must have D columns\n"
          "\n"
          "Outputs: at least one --out is required. Every output location is checked\n"
          "before anything is computed; each output is written to a temporary file\n"
          "next to its target and all are renamed over their targets only when every\n"
          "one is complete, so a failed or interrupted run (Ctrl-C, SIGTERM, a full\n"
          "disk, ulimit -f) changes no file. Two outputs may not name one file, and an\n"
          "output may not replace an input file, except an inout or acc buffer's own\n"
          "--in (updated in place). A symlink at a target is followed; a directory,\n"
          "device or FIFO there is refused.\n"
          "Numbers (--param, --threads) are decimal: no octal leading zeros, no hex,\n"
          "no inf/nan; a float must fit float32 and not underflow to 0 or a subnormal.\n"
          "Exit status: 0 ok, 1 the kernel returned an error, 2 bad arguments or files.\n",
          tg_cli_isa_names(isa_names, sizeof isa_names, "|"),
          tg_cli_isa_tables(isa_tables, sizeof isa_tables, "  "));
}

int tg_cli_run_help(FILE *out, const char *name) {
  if (name) {
    const kernel_spec *k = run_find_kernel(name);
    if (!k) return -1;
    run_kernel_help(out, k);
    return 0;
  }
  run_usage(out);
  fprintf(out, "\nkernels:\n");
  for (int i = 0; i < run_kernel_count(); i++) {
    fprintf(out, "\n");
    run_kernel_help(out, run_kernel_at(i));
  }
  return 0;
}
