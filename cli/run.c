/*
 * `tilegrad run <kernel> --in NAME=file.npy ... --out NAME=file.npy ...`
 *
 * Runs one contract kernel on .npy buffers, e.g. buffers dumped around a
 * Metal dispatch, so the CPU result can be compared with the GPU's.
 *
 * Design: every kernel is one row of kernel_table (its buffers with role,
 * dtype and shape rule, and its scalar parameters) plus one small adapter
 * that turns the bound buffers/sizes/params into the C call. The generic
 * part below does everything else:
 *   1. parse the command line and every --param value (cli/num.h), check
 *      every --out location (cli/outfile.h), then load every --in array,
 *   2. check dtypes and match each input's shape against its rule, binding
 *      the rule's size symbols (B, H, qL, ...) and refusing disagreements,
 *   3. bind size symbols given as --param (e.g. vocab_size),
 *   4. run the kernel's check hook if it has one, then allocate the outputs
 *      from their rules (accumulating outputs start from their --in array if
 *      one was given, else zeros),
 *   5. call the adapter, report a library error, write the --out arrays to
 *      temporaries and rename them over their targets: all of them or none.
 * The shape checks in step 2 are what keep the kernels in bounds: the C API
 * takes sizes, not array lengths.
 *
 * Shape rules: comma-separated dims; a dim is a size symbol ("qL"), a symbol
 * that may also be 1 and then broadcasts ("B|1"; leading broadcast dims may
 * be left out of the array altogether), or an integer literal ("1").
 * "*" accepts any shape; "=src" means "the shape of buffer src".
 */
/* POSIX + XSI (fileno, stat, realpath, mkstemp, fsync, link, sigaction);
 * the same in every CLI file, so tests can compile them into one unit. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "isa_names.h"
#include "npy.h"
#include "num.h"
#include "outfile.h"
#include "tilegrad.h"

#define RUN_MAX_BUFS 12
#define RUN_MAX_PARAMS 8
#define RUN_MAX_SYMS 24
#define RUN_MAX_RULE_DIMS 8

/* --- the table's types ------------------------------------------------------ */
typedef enum {
  ROLE_IN,     /* required input */
  ROLE_OPT_IN, /* optional input (NULL to the kernel when absent) */
  ROLE_OUT,    /* output the kernel writes */
  ROLE_ACC,    /* output the kernel accumulates into: --in gives its start, else zeros */
  ROLE_INOUT   /* required input modified in place; --out writes the result */
} buf_role;

typedef enum {
  BT_F32,  /* float32 */
  BT_BF16, /* raw bfloat16 bits */
  BT_IDS   /* uint32 ids/targets; int32 files accepted (negatives refused on read) */
} buf_type;

typedef struct {
  const char *name;  /* the C parameter name in include/tilegrad.h */
  buf_role role;
  buf_type type;
  const char *shape; /* shape rule, see the top of this file */
  const char *note;  /* extra help text or NULL */
} buf_spec;

typedef enum {
  P_BOOL,  /* 0/1 (also true/false) */
  P_I32,   /* int32 */
  P_U32,   /* uint32 */
  P_FLOAT  /* float */
} param_type;

typedef struct {
  const char *name;
  param_type type;
  /* Default as text; NULL = required; "" = the adapter derives it when the
   * param is absent (help says how). A param named like a size symbol binds
   * that symbol. */
  const char *def;
  const char *help;
} param_spec;

typedef struct run_call run_call;

typedef struct {
  const char *name;    /* Metal host name without tg_ */
  const char *summary; /* one line */
  buf_spec bufs[RUN_MAX_BUFS];       /* in C argument order; ends at name NULL */
  param_spec params[RUN_MAX_PARAMS]; /* ends at name NULL */
  tg_status (*adapter)(run_call *c);
  /* Optional: checks the inputs against the params before the outputs are
   * allocated (a mismatch must not cost an allocation sized by the params). */
  tg_status (*check)(run_call *c);
} kernel_spec;

/* --- one invocation's state --------------------------------------------------- */
typedef struct {
  const char *in_path, *out_path;
  npy_array arr; /* data NULL when absent */
} run_buf;

typedef struct {
  const char *given; /* text from --param, or NULL */
  int64_t i;         /* parsed value of an int/bool param */
  double f;          /* parsed value of a float param (ints: the same as double) */
} run_param;

typedef struct {
  char name[32];
  int64_t value;
  char from[TG_OUT_PATH + 320]; /* buffer or param that fixed it, for messages */
} run_sym;

struct run_call {
  const kernel_spec *k;
  tg_ctx *ctx;
  run_buf bufs[RUN_MAX_BUFS];
  run_param params[RUN_MAX_PARAMS];
  run_sym syms[RUN_MAX_SYMS];
  int n_syms;
  int cli_failed;       /* the adapter refused the inputs (message in err) */
  tg_outset outs;       /* the --out files, all written or none */
  int out_index[RUN_MAX_BUFS]; /* buffer -> its entry in outs, -1 = none */
  char err[NPY_ERR_LEN + 256];
};

static int run_errorf(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run_errorf(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* run_errorf for the command-line parser: returns the exit code. */
static int usage_errorf(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_errorf(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return RUN_EXIT_USAGE;
}

/* For adapters: refuse the inputs with a CLI-level message (exit code 2). */
static tg_status run_refuse(run_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static tg_status run_refuse(run_call *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  c->cli_failed = 1;
  return TG_ERR_BAD_SHAPE;
}

/* --- adapter helpers ---------------------------------------------------------
 * Names passed here come from the table, so a miss is a bug in this file. */
static int buf_index(const kernel_spec *k, const char *name) {
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++)
    if (!strcmp(k->bufs[i].name, name)) return i;
  return -1;
}

static int param_index(const kernel_spec *k, const char *name) {
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++)
    if (!strcmp(k->params[i].name, name)) return i;
  return -1;
}

static void internal_error(const char *what, const char *name) {
  fprintf(stderr, "tilegrad run: internal error: no %s '%s' in the kernel table\n", what,
          name);
  abort();
}

/* Data pointer of a buffer (NULL for an absent optional input). */
static void *B(run_call *c, const char *name) {
  const int i = buf_index(c->k, name);
  if (i < 0) internal_error("buffer", name);
  return c->bufs[i].arr.data;
}

static const npy_array *A(run_call *c, const char *name) {
  const int i = buf_index(c->k, name);
  if (i < 0) internal_error("buffer", name);
  return &c->bufs[i].arr;
}

static const run_sym *sym_find(const run_call *c, const char *name) {
  for (int i = 0; i < c->n_syms; i++)
    if (!strcmp(c->syms[i].name, name)) return &c->syms[i];
  return NULL;
}

/* A bound size symbol; all symbols are in [0, INT32_MAX] (checked when bound). */
static int64_t S(run_call *c, const char *name) {
  const run_sym *s = sym_find(c, name);
  if (!s) internal_error("bound size symbol", name);
  return s->value;
}
static uint32_t U(run_call *c, const char *name) { return (uint32_t)S(c, name); }

static const run_param *P(run_call *c, const char *name) {
  const int i = param_index(c->k, name);
  if (i < 0) internal_error("param", name);
  return &c->params[i];
}
static int given(run_call *c, const char *name) { return P(c, name)->given != NULL; }
static double PF(run_call *c, const char *name) { return P(c, name)->f; }
static int64_t PI(run_call *c, const char *name) { return P(c, name)->i; }

/* --- adapters: one per kernel ------------------------------------------------- */

/* 1. D_out[b,h,i] = sum_d O*dO */
static tg_status run_flash_attn_train_bwd_compute_d_bf16(run_call *c) {
  return tg_flash_attn_train_bwd_compute_d_bf16(c->ctx, B(c, "O"), B(c, "dO"), B(c, "D_out"),
                                                U(c, "B"), U(c, "H"), U(c, "qL"), U(c, "D"));
}

/* tg_attn_params for contiguous Q/K/V/O from the bound sizes, then the
 * scale / softcapping / qL_off params (defaults 1/sqrt(D), 1.0, kL - qL). */
static tg_status attn_params_from(run_call *c, tg_attn_params *p) {
  const double scale = given(c, "scale") ? PF(c, "scale") : 1.0 / sqrt((double)S(c, "D"));
  const tg_status s = tg_attn_params_init(p, (int)S(c, "B"), (int)S(c, "H"), (int)S(c, "H_kv"),
                                          (int)S(c, "qL"), (int)S(c, "kL"), (int)S(c, "D"),
                                          (float)scale);
  if (s != TG_OK)
    return run_refuse(c,
                      "tg_attn_params_init refused B=%lld H=%lld H_kv=%lld qL=%lld kL=%lld "
                      "D=%lld: %s (H must be a multiple of H_kv, sizes >= 1)",
                      (long long)S(c, "B"), (long long)S(c, "H"), (long long)S(c, "H_kv"),
                      (long long)S(c, "qL"), (long long)S(c, "kL"), (long long)S(c, "D"),
                      tg_status_str(s));
  p->softcapping = (float)PF(c, "softcapping");
  if (given(c, "qL_off")) p->qL_off = (int32_t)PI(c, "qL_off");
  return TG_OK;
}

/* Mask strides from the mask array's own shape: [B|1, H|1, qL, kL] (leading
 * dims may be absent); a dim of 1 broadcasts with stride 0. */
static const tg_bf16 *attn_mask_from(run_call *c, tg_attn_mask_params *mp) {
  const npy_array *m = A(c, "mask");
  if (!m->data) return NULL;
  const int lead = 4 - m->ndim; /* number of left-out leading dims */
  const int64_t Bm = lead >= 1 ? 1 : m->shape[0];
  const int64_t Hm = lead >= 2 ? 1 : m->shape[1 - lead];
  const int64_t qL = S(c, "qL"), kL = S(c, "kL");
  mp->M_strides[2] = kL;
  mp->M_strides[1] = Hm == 1 ? 0 : qL * kL;
  mp->M_strides[0] = Bm == 1 ? 0 : Hm * qL * kL;
  return m->data;
}

/* 2. FA-2 backward */
static tg_status run_flash_attn_train_bwd_bf16(run_call *c) {
  tg_attn_params p;
  tg_attn_mask_params mp;
  const tg_status s = attn_params_from(c, &p);
  if (s != TG_OK) return s;
  const tg_bf16 *mask = attn_mask_from(c, &mp);
  return tg_flash_attn_train_bwd_bf16(c->ctx, B(c, "Q"), B(c, "K"), B(c, "V"), B(c, "L"),
                                      B(c, "dO"), B(c, "D_vec"), B(c, "dQ"), B(c, "dK"),
                                      B(c, "dV"), &p, mask ? &mp : NULL, mask,
                                      (int)PI(c, "causal"));
}

/* training forward: O, L from Q, K, V */
static tg_status run_flash_attn_train_fwd_bf16(run_call *c) {
  tg_attn_params p;
  tg_attn_mask_params mp;
  const tg_status s = attn_params_from(c, &p);
  if (s != TG_OK) return s;
  const tg_bf16 *mask = attn_mask_from(c, &mp);
  return tg_flash_attn_train_fwd_bf16(c->ctx, B(c, "Q"), B(c, "K"), B(c, "V"), B(c, "O"),
                                      B(c, "L"), &p, mask ? &mp : NULL, mask,
                                      (int)PI(c, "causal"));
}

/* RMSNorm forward (r_out always produced here) */
static tg_status run_rms_norm_forward_f32(run_call *c) {
  return tg_rms_norm_forward_f32(c->ctx, B(c, "x"), B(c, "w"), B(c, "y"), B(c, "r_out"),
                                 U(c, "rows"), U(c, "dim"), (float)PF(c, "eps"));
}

/* 3. cast, any shape */
static tg_status run_f32_to_bf16_cast(run_call *c) {
  return tg_f32_to_bf16_cast(c->ctx, B(c, "src"), B(c, "dst"), (uint64_t)A(c, "src")->count);
}

/* 4. RMSNorm split */
static tg_status run_rms_norm_compute_rms_inv_f32(run_call *c) {
  return tg_rms_norm_compute_rms_inv_f32(c->ctx, B(c, "x"), B(c, "r_out"), U(c, "rows"),
                                         U(c, "dim"), (float)PF(c, "eps"));
}
static tg_status run_rms_norm_backward_dx_f32(run_call *c) {
  return tg_rms_norm_backward_dx_f32(c->ctx, B(c, "x"), B(c, "w"), B(c, "dy"), B(c, "r"),
                                     B(c, "dx"), U(c, "rows"), U(c, "dim"));
}
static tg_status run_rms_norm_backward_dw_f32(run_call *c) {
  return tg_rms_norm_backward_dw_f32(c->ctx, B(c, "x"), B(c, "dy"), B(c, "r"), B(c, "dw"),
                                     U(c, "rows"), U(c, "dim"));
}

/* 5. fused RMSNorm backward */
static tg_status run_rms_norm_backward(run_call *c) {
  return tg_rms_norm_backward(c->ctx, B(c, "input"), B(c, "weight"), B(c, "grad_out"),
                              B(c, "grad_input"), B(c, "grad_weight"), U(c, "n_groups"),
                              U(c, "dim"), (float)PF(c, "eps"));
}

/* 6. softmax backward */
static tg_status run_softmax_backward(run_call *c) {
  return tg_softmax_backward(c->ctx, B(c, "sm"), B(c, "grad_out"), B(c, "grad_in"),
                             U(c, "n_rows"), U(c, "row_len"));
}

/* 7. embedding backward; vocab_size from grad_weight's --in or --param */
static tg_status run_embedding_backward(run_call *c) {
  return tg_embedding_backward(c->ctx, B(c, "grad_out"), B(c, "ids"), B(c, "grad_weight"),
                               U(c, "vocab_size"), U(c, "seq_len"), U(c, "dim"));
}

/* 8. cross entropy; pad_id default: none (0xFFFFFFFF); count default: the
 * number of non-pad targets */
static tg_status run_cross_entropy_fwd_bwd(run_call *c) {
  const uint32_t *targets = B(c, "targets");
  const uint32_t n_pos = U(c, "n_pos");
  const uint32_t pad_id = given(c, "pad_id") ? (uint32_t)PI(c, "pad_id") : UINT32_MAX;
  uint32_t count = 0;
  if (given(c, "count")) {
    count = (uint32_t)PI(c, "count");
  } else {
    for (uint32_t t = 0; t < n_pos; t++) count += targets[t] != pad_id;
  }
  return tg_cross_entropy_fwd_bwd(c->ctx, B(c, "logits"), targets, B(c, "grad"),
                                  B(c, "loss_out"), n_pos, U(c, "vocab"), pad_id, count);
}

/* 9. transpose */
static tg_status run_transpose_2d(run_call *c) {
  return tg_transpose_2d(c->ctx, B(c, "input"), B(c, "output"), U(c, "rows"), U(c, "cols"));
}

/* 10. naive causal attention backward, token-major [seq, heads*head_dim]:
 * the head split comes from --param head_dim (or n_heads / n_kv_heads). */
static tg_status run_causal_attention_backward(run_call *c) {
  const int64_t qcols = S(c, "QC"), kcols = S(c, "KC");
  int64_t hd = given(c, "head_dim") ? PI(c, "head_dim") : 0;
  if (!hd && given(c, "n_heads") && PI(c, "n_heads") > 0 && qcols % PI(c, "n_heads") == 0)
    hd = qcols / PI(c, "n_heads");
  if (!hd && given(c, "n_kv_heads") && PI(c, "n_kv_heads") > 0 &&
      kcols % PI(c, "n_kv_heads") == 0)
    hd = kcols / PI(c, "n_kv_heads");
  if (hd <= 0)
    return run_refuse(c, "causal_attention_backward: give --param head_dim=N (or n_heads=N) "
                         "to split Q's %lld columns into heads",
                      (long long)qcols);
  if (qcols % hd || kcols % hd)
    return run_refuse(c, "causal_attention_backward: head_dim %lld does not divide Q's %lld "
                         "or K's %lld columns",
                      (long long)hd, (long long)qcols, (long long)kcols);
  const int64_t nh = qcols / hd, nkv = kcols / hd;
  if ((given(c, "n_heads") && PI(c, "n_heads") != nh) ||
      (given(c, "n_kv_heads") && PI(c, "n_kv_heads") != nkv))
    return run_refuse(c, "causal_attention_backward: with head_dim %lld, Q has %lld heads "
                         "and K %lld, which disagrees with --param n_heads/n_kv_heads",
                      (long long)hd, (long long)nh, (long long)nkv);
  return tg_causal_attention_backward(c->ctx, B(c, "grad_out"), B(c, "Q"), B(c, "K"),
                                      B(c, "V"), B(c, "grad_Q"), B(c, "grad_K"), B(c, "grad_V"),
                                      U(c, "seq"), (uint32_t)nh, (uint32_t)nkv, (uint32_t)hd);
}

/* 11. decode reduce. htmp is flat: nrows*head_dim*nwg partial outputs, then
 * nrows*nwg (S, M) pairs; nwg defaults to what htmp's length implies. */
static tg_status decode_nwg(run_call *c, const char *fn, uint32_t *nwg_out) {
  const int64_t n = A(c, "htmp")->count, nrows = S(c, "nrows"), dv = S(c, "head_dim");
  if (nrows < 1 || dv < 1)
    return run_refuse(c, "%s: nrows and head_dim must be >= 1", fn);
  const int64_t per_wg = nrows * (dv + 2); /* floats per workgroup */
  int64_t nwg = given(c, "nwg") ? PI(c, "nwg") : n / per_wg;
  if (nwg < 1 || nwg > INT32_MAX || nwg * per_wg != n)
    return run_refuse(c,
                      "%s: htmp has %lld floats; nrows=%lld, head_dim=%lld need "
                      "nwg*nrows*(head_dim+2) = %lld*nwg%s",
                      fn, (long long)n, (long long)nrows, (long long)dv, (long long)per_wg,
                      given(c, "nwg") ? " with the given --param nwg" : "");
  *nwg_out = (uint32_t)nwg;
  return TG_OK;
}

/* The check hook of both decode kernels: htmp's length against the params,
 * before dst (nrows x head_dim, sized by the params alone) is allocated. */
static tg_status decode_check(run_call *c) {
  uint32_t nwg;
  return decode_nwg(c, c->k->name, &nwg);
}

static tg_status run_flash_attn_vec_reduce(run_call *c) {
  uint32_t nwg;
  const tg_status s = decode_nwg(c, "flash_attn_vec_reduce", &nwg);
  if (s != TG_OK) return s;
  return tg_flash_attn_vec_reduce(c->ctx, B(c, "htmp"), B(c, "dst"), U(c, "nrows"),
                                  U(c, "head_dim"), nwg);
}

static tg_status run_flash_attn_vec_reduce_tq_hb_undo(run_call *c) {
  uint32_t nwg;
  const tg_status s = decode_nwg(c, "flash_attn_vec_reduce_tq_hb_undo", &nwg);
  if (s != TG_OK) return s;
  return tg_flash_attn_vec_reduce_tq_hb_undo(c->ctx, B(c, "htmp"), B(c, "output"),
                                             U(c, "nrows"), U(c, "head_dim"), nwg);
}

static tg_status run_fwht_sign_undo_f32(run_call *c) {
  return tg_fwht_sign_undo_f32(c->ctx, B(c, "data"), U(c, "num_heads"), U(c, "head_dim"));
}

/* --- the table -------------------------------------------------------------------
 * Shapes use the contract's names: B batch, H query heads, H_kv kv heads,
 * qL/kL query/key lengths, D head dim. */
#define END_BUFS {NULL, 0, 0, NULL, NULL}
#define END_PARAMS {NULL, 0, NULL, NULL}

/* What the attention forward and backward share: the optional mask and the
 * parameters of the score S. */
#define ATTN_MASK_BUF                                  \
  {"mask", ROLE_OPT_IN, BT_BF16, "B|1,H|1,qL,kL",      \
   "additive; a dim of 1 (or left out) broadcasts"}
#define ATTN_SCORE_PARAMS                                                              \
  {{"causal", P_BOOL, "0", "1: key k is visible to query i iff k <= i + qL_off"},      \
   {"scale", P_FLOAT, "", "score scale (default 1/sqrt(D))"},                          \
   {"softcapping", P_FLOAT, "1.0", "tanh softcap c (1.0 = off)"},                      \
   {"qL_off", P_I32, "", "causal offset (default kL - qL; 0 = the seed's behaviour)"}, \
   END_PARAMS}

static const kernel_spec kernel_table[] = {
    {"flash_attn_train_bwd_compute_d_bf16",
     "FA-2 backward pre-pass: D_out[b,h,i] = sum_d O[b,h,i,d]*dO[b,h,i,d]",
     {{"O", ROLE_IN, BT_BF16, "B,H,qL,D", "forward output"},
      {"dO", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"D_out", ROLE_OUT, BT_F32, "B,H,qL", NULL},
      END_BUFS},
     {END_PARAMS},
     run_flash_attn_train_bwd_compute_d_bf16, NULL},

    {"flash_attn_train_bwd_bf16",
     "FA-2 backward: dQ (writes), dK/dV (accumulate) from Q,K,V,L,dO,D_vec",
     {{"Q", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"K", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"V", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"L", ROLE_IN, BT_F32, "B,H,qL", "natural-log logsumexp from the forward"},
      {"dO", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"D_vec", ROLE_IN, BT_F32, "B,H,qL", "from flash_attn_train_bwd_compute_d_bf16"},
      {"dQ", ROLE_OUT, BT_F32, "B,H,qL,D", NULL},
      {"dK", ROLE_ACC, BT_F32, "B,H_kv,kL,D", NULL},
      {"dV", ROLE_ACC, BT_F32, "B,H_kv,kL,D", NULL},
      ATTN_MASK_BUF,
      END_BUFS},
     ATTN_SCORE_PARAMS,
     run_flash_attn_train_bwd_bf16, NULL},

    {"flash_attn_train_fwd_bf16",
     "FA-2 training forward: O = softmax(S).V (bf16), L = logsumexp(S), S as in the backward",
     {{"Q", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"K", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"V", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"O", ROLE_OUT, BT_BF16, "B,H,qL,D", "written as '<u2' bf16 bits"},
      {"L", ROLE_OUT, BT_F32, "B,H,qL", "natural-log logsumexp (-inf: no visible key)"},
      ATTN_MASK_BUF,
      END_BUFS},
     ATTN_SCORE_PARAMS,
     run_flash_attn_train_fwd_bf16, NULL},

    {"rms_norm_forward_f32",
     "y[b,k] = x[b,k]*r[b]*w[k], r_out[b] = 1/sqrt(mean_j x[b,j]^2 + eps)",
     {{"x", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"w", ROLE_IN, BT_F32, "dim", NULL},
      {"y", ROLE_OUT, BT_F32, "rows,dim", NULL},
      {"r_out", ROLE_OUT, BT_F32, "rows", "input r of the backward kernels"},
      END_BUFS},
     {{"eps", P_FLOAT, NULL, "added to mean(x^2), e.g. 1e-6"}, END_PARAMS},
     run_rms_norm_forward_f32, NULL},

    {"f32_to_bf16_cast",
     "dst = bf16(src), round to nearest even (any shape; dst keeps src's shape)",
     {{"src", ROLE_IN, BT_F32, "*", NULL},
      {"dst", ROLE_OUT, BT_BF16, "=src", "written as '<u2' bf16 bits"},
      END_BUFS},
     {END_PARAMS},
     run_f32_to_bf16_cast, NULL},

    {"rms_norm_compute_rms_inv_f32",
     "r_out[b] = 1/sqrt(mean_j x[b,j]^2 + eps)",
     {{"x", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"r_out", ROLE_OUT, BT_F32, "rows", NULL},
      END_BUFS},
     {{"eps", P_FLOAT, NULL, "added to mean(x^2), e.g. 1e-6"}, END_PARAMS},
     run_rms_norm_compute_rms_inv_f32, NULL},

    {"rms_norm_backward_dx_f32",
     "dx[b,k] = r[b]*(dy[b,k]*w[k] - x[b,k]*s[b]*r[b]^2/dim), s[b] = sum_i dy*x*w",
     {{"x", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"w", ROLE_IN, BT_F32, "dim", NULL},
      {"dy", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"r", ROLE_IN, BT_F32, "rows", "from rms_norm_compute_rms_inv_f32"},
      {"dx", ROLE_OUT, BT_F32, "rows,dim", NULL},
      END_BUFS},
     {END_PARAMS},
     run_rms_norm_backward_dx_f32, NULL},

    {"rms_norm_backward_dw_f32",
     "dw[i] = sum_b dy[b,i]*x[b,i]*r[b] (writes)",
     {{"x", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"dy", ROLE_IN, BT_F32, "rows,dim", NULL},
      {"r", ROLE_IN, BT_F32, "rows", NULL},
      {"dw", ROLE_OUT, BT_F32, "dim", NULL},
      END_BUFS},
     {END_PARAMS},
     run_rms_norm_backward_dw_f32, NULL},

    {"rms_norm_backward",
     "fused RMSNorm backward: grad_input (writes), grad_weight (accumulates)",
     {{"input", ROLE_IN, BT_F32, "n_groups,dim", NULL},
      {"weight", ROLE_IN, BT_F32, "dim", NULL},
      {"grad_out", ROLE_IN, BT_F32, "n_groups,dim", NULL},
      {"grad_input", ROLE_OUT, BT_F32, "n_groups,dim", NULL},
      {"grad_weight", ROLE_ACC, BT_F32, "dim", NULL},
      END_BUFS},
     {{"eps", P_FLOAT, NULL, "added to mean(x^2), e.g. 1e-6"}, END_PARAMS},
     run_rms_norm_backward, NULL},

    {"softmax_backward",
     "grad_in = sm*(grad_out - sum_j sm*grad_out) per row",
     {{"sm", ROLE_IN, BT_F32, "n_rows,row_len", "softmax output"},
      {"grad_out", ROLE_IN, BT_F32, "n_rows,row_len", NULL},
      {"grad_in", ROLE_OUT, BT_F32, "n_rows,row_len", NULL},
      END_BUFS},
     {END_PARAMS},
     run_softmax_backward, NULL},

    {"embedding_backward",
     "grad_weight[ids[t],:] += grad_out[t,:] (accumulates)",
     {{"grad_out", ROLE_IN, BT_F32, "seq_len,dim", NULL},
      {"ids", ROLE_IN, BT_IDS, "seq_len", "uint32 or non-negative int32"},
      {"grad_weight", ROLE_ACC, BT_F32, "vocab_size,dim", NULL},
      END_BUFS},
     {{"vocab_size", P_U32, "",
       "rows of grad_weight (required unless --in grad_weight=... gives it)"},
      END_PARAMS},
     run_embedding_backward, NULL},

    {"cross_entropy_fwd_bwd",
     "loss_out[0] += mean CE over non-pad rows (accumulates); grad = (softmax-onehot)/count",
     {{"logits", ROLE_IN, BT_F32, "n_pos,vocab", NULL},
      {"targets", ROLE_IN, BT_IDS, "n_pos", "uint32 or non-negative int32"},
      {"grad", ROLE_OUT, BT_F32, "n_pos,vocab", NULL},
      {"loss_out", ROLE_ACC, BT_F32, "1", NULL},
      END_BUFS},
     {{"pad_id", P_U32, "", "target id that marks padding (default: none, 0xFFFFFFFF)"},
      {"count", P_U32, "", "divisor (default: the number of non-pad targets)"},
      END_PARAMS},
     run_cross_entropy_fwd_bwd, NULL},

    {"transpose_2d",
     "output[c,r] = input[r,c]",
     {{"input", ROLE_IN, BT_F32, "rows,cols", NULL},
      {"output", ROLE_OUT, BT_F32, "cols,rows", NULL},
      END_BUFS},
     {END_PARAMS},
     run_transpose_2d, NULL},

    {"causal_attention_backward",
     "naive causal attention backward, token-major f32 (grad_Q writes, grad_K/V accumulate)",
     {{"grad_out", ROLE_IN, BT_F32, "seq,QC", "QC = n_heads*head_dim"},
      {"Q", ROLE_IN, BT_F32, "seq,QC", NULL},
      {"K", ROLE_IN, BT_F32, "seq,KC", "KC = n_kv_heads*head_dim"},
      {"V", ROLE_IN, BT_F32, "seq,KC", NULL},
      {"grad_Q", ROLE_OUT, BT_F32, "seq,QC", NULL},
      {"grad_K", ROLE_ACC, BT_F32, "seq,KC", NULL},
      {"grad_V", ROLE_ACC, BT_F32, "seq,KC", NULL},
      END_BUFS},
     {{"head_dim", P_U32, "", "head dim (give this, or n_heads / n_kv_heads)"},
      {"n_heads", P_U32, "", "query heads (default QC/head_dim)"},
      {"n_kv_heads", P_U32, "", "kv heads (default KC/head_dim)"},
      END_PARAMS},
     run_causal_attention_backward, NULL},

    {"flash_attn_vec_reduce",
     "decode reduce of split-KV partials: dst[r,:] = sum_w a_w*part[r,w,:] / sum_w a_w*S_w",
     {{"htmp", ROLE_IN, BT_F32, "*",
       "flat: nrows*head_dim*nwg partials (groups of 4), then nrows*nwg (S,M)"},
      {"dst", ROLE_OUT, BT_F32, "nrows,head_dim", NULL},
      END_BUFS},
     {{"nrows", P_U32, NULL, "rows of dst"},
      {"head_dim", P_U32, NULL, "value dim DV, a multiple of 4"},
      {"nwg", P_U32, "", "workgroups (default: implied by htmp's length)"},
      END_PARAMS},
     run_flash_attn_vec_reduce, decode_check},

    {"flash_attn_vec_reduce_tq_hb_undo",
     "decode reduce, then normalised Walsh-Hadamard transform and D1 sign undo",
     {{"htmp", ROLE_IN, BT_F32, "*", "as flash_attn_vec_reduce"},
      {"output", ROLE_OUT, BT_F32, "nrows,head_dim", NULL},
      END_BUFS},
     {{"nrows", P_U32, NULL, "rows of dst"},
      {"head_dim", P_U32, NULL, "value dim DV: 256 or 512"},
      {"nwg", P_U32, "", "workgroups (default: implied by htmp's length)"},
      END_PARAMS},
     run_flash_attn_vec_reduce_tq_hb_undo, decode_check},

    {"fwht_sign_undo_f32",
     "in place: FWHT, * 1/sqrt(head_dim), D1 sign undo (head_dim 256 or 512)",
     {{"data", ROLE_INOUT, BT_F32, "num_heads,head_dim", "--in the input, --out the result"},
      END_BUFS},
     {END_PARAMS},
     run_fwht_sign_undo_f32, NULL},
};

static const int n_kernels = (int)(sizeof kernel_table / sizeof kernel_table[0]);

static const kernel_spec *find_kernel(const char *name) {
  if (!strncmp(name, "tg_", 3)) name += 3; /* accept the C name too */
  for (int i = 0; i < n_kernels; i++)
    if (!strcmp(kernel_table[i].name, name)) return &kernel_table[i];
  return NULL;
}

/* --- help --------------------------------------------------------------------- */
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

static const char *type_name(buf_type t) {
  switch (t) {
    case BT_F32: return "f32";
    case BT_BF16: return "bf16";
    case BT_IDS: return "u32";
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

static void kernel_help(FILE *out, const kernel_spec *k) {
  fprintf(out, "%s\n    %s\n", k->name, k->summary);
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_spec *b = &k->bufs[i];
    char shape[64];
    if (b->shape[0] == '=') snprintf(shape, sizeof shape, "same as %s", b->shape + 1);
    else if (!strcmp(b->shape, "*")) snprintf(shape, sizeof shape, "any shape");
    else snprintf(shape, sizeof shape, "[%s]", b->shape);
    if (b->note)
      fprintf(out, "    %-5s %-12s %-4s %-18s %s\n", role_name(b->role), b->name,
              type_name(b->type), shape, b->note);
    else
      fprintf(out, "    %-5s %-12s %-4s %s\n", role_name(b->role), b->name,
              type_name(b->type), shape);
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
  for (int i = 0; i < n_kernels; i++)
    fprintf(out, "  %-36s %s\n", kernel_table[i].name, kernel_table[i].summary);
}

static void run_usage(FILE *out) {
  char isa_names[TG_CLI_ISA_NAMES_LEN];
  fprintf(out,
          "usage: tilegrad run <kernel> --in NAME=file.npy ... --out NAME=file.npy ...\n"
          "                    [--param k=v ...] [--threads N] [--deterministic]\n"
          "                    [--isa %s]\n"
          "                    [--quiet]\n"
          "       tilegrad run --help            all kernels and their buffers\n"
          "       tilegrad run <kernel> --help   one kernel\n"
          "\n"
          "Buffer names are the C parameter names of include/tilegrad.h. Sizes come from\n"
          "the input arrays' shapes; other scalars from --param. Roles: in = input,\n"
          "in? = optional input, out = written output, acc = accumulated output (starts\n"
          "from --in NAME=file if given, else zeros), inout = modified in place.\n"
          "dtypes: f32 '<f4'; bf16 raw bits '<u2' (also '<V2', 'bfloat16');\n"
          "u32 '<u4' or non-negative '<i4'. Outputs are written as '<f4' / '<u2'.\n"
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
          tg_cli_isa_names(isa_names, sizeof isa_names, "|"));
}

int tg_cli_run_help(FILE *out, const char *name) {
  if (name) {
    const kernel_spec *k = find_kernel(name);
    if (!k) return -1;
    kernel_help(out, k);
    return 0;
  }
  run_usage(out);
  fprintf(out, "\nkernels:\n");
  for (int i = 0; i < n_kernels; i++) {
    fprintf(out, "\n");
    kernel_help(out, &kernel_table[i]);
  }
  return 0;
}

/* --- shape rules ------------------------------------------------------------------ */
typedef struct {
  char sym[32];      /* symbol name, or "" for a literal */
  int64_t literal;
  int broadcast;     /* "SYM|1" */
} rule_dim;

/* Splits a rule like "B|1,H|1,qL,kL" (not "*" or "=x"); returns the dim count. */
static int parse_rule(const char *rule, rule_dim dims[RUN_MAX_RULE_DIMS]) {
  int n = 0;
  const char *p = rule;
  while (*p && n < RUN_MAX_RULE_DIMS) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    rule_dim *d = &dims[n++];
    memset(d, 0, sizeof *d);
    if (len >= 2 && !strncmp(p + len - 2, "|1", 2)) {
      d->broadcast = 1;
      len -= 2;
    }
    if (*p >= '0' && *p <= '9') {
      d->literal = strtoll(p, NULL, 10);
    } else {
      if (len >= sizeof d->sym) len = sizeof d->sym - 1;
      memcpy(d->sym, p, len);
    }
    p = end ? end + 1 : p + strlen(p);
  }
  return n;
}

static int bind_sym(run_call *c, const char *name, int64_t v, const char *from) {
  const run_sym *s = sym_find(c, name);
  if (s) {
    if (s->value != v)
      return run_errorf(c, "size %s is %lld from %s but %lld from %s", name,
                        (long long)s->value, s->from, (long long)v, from);
    return 0;
  }
  if (v > INT32_MAX)
    return run_errorf(c, "size %s = %lld (from %s) is larger than the kernels take (%d)",
                      name, (long long)v, from, INT32_MAX);
  if (c->n_syms == RUN_MAX_SYMS) return run_errorf(c, "too many size symbols");
  run_sym *t = &c->syms[c->n_syms++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->value = v;
  snprintf(t->from, sizeof t->from, "%s", from);
  return 0;
}

/* Matches an input array against its buffer's rule, binding symbols. */
static int bind_input(run_call *c, int bi) {
  const buf_spec *b = &c->k->bufs[bi];
  const npy_array *a = &c->bufs[bi].arr;
  char from[TG_OUT_PATH + 300], sb[256];
  snprintf(from, sizeof from, "%s (%s, shape %s)", b->name, c->bufs[bi].in_path,
           npy_shape_str(a, sb, sizeof sb));
  if (!strcmp(b->shape, "*")) return 0;
  if (b->shape[0] == '=') {
    const npy_array *ref = &c->bufs[buf_index(c->k, b->shape + 1)].arr;
    int same = ref->ndim == a->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = ref->shape[i] == a->shape[i];
    if (!same)
      return run_errorf(c, "%s must have the shape of %s %s", from, b->shape + 1,
                        npy_shape_str(ref, sb, sizeof sb));
    return 0;
  }
  rule_dim dims[RUN_MAX_RULE_DIMS];
  const int nd = parse_rule(b->shape, dims);
  int lead = nd - a->ndim; /* leading dims the array leaves out */
  int ok = lead >= 0;
  for (int i = 0; ok && i < lead; i++) ok = dims[i].broadcast;
  if (!ok)
    return run_errorf(c, "%s: expected %d dims [%s]", from, nd, b->shape);
  for (int i = lead; i < nd; i++) {
    const int64_t v = a->shape[i - lead];
    const rule_dim *d = &dims[i];
    if (!d->sym[0]) {
      if (v != d->literal)
        return run_errorf(c, "%s: dim %d must be %lld", from, i - lead, (long long)d->literal);
      continue;
    }
    if (d->broadcast && v == 1) continue; /* broadcasts; binds nothing */
    if (bind_sym(c, d->sym, v, from)) return -1;
  }
  return 0;
}

/* Allocates output bi (zero-filled) from its rule and the bound symbols. */
static int alloc_output(run_call *c, int bi) {
  const buf_spec *b = &c->k->bufs[bi];
  const npy_dtype dt = b->type == BT_F32 ? NPY_F32 : b->type == BT_BF16 ? NPY_BF16 : NPY_U32;
  char err[NPY_ERR_LEN];
  int64_t shape[NPY_MAX_DIMS];
  int nd;
  if (b->shape[0] == '=') {
    const npy_array *ref = &c->bufs[buf_index(c->k, b->shape + 1)].arr;
    nd = ref->ndim;
    for (int i = 0; i < nd; i++) shape[i] = ref->shape[i];
  } else {
    rule_dim dims[RUN_MAX_RULE_DIMS];
    nd = parse_rule(b->shape, dims);
    for (int i = 0; i < nd; i++) {
      if (!dims[i].sym[0]) {
        shape[i] = dims[i].literal;
        continue;
      }
      const run_sym *s = sym_find(c, dims[i].sym);
      if (!s) {
        if (param_index(c->k, dims[i].sym) >= 0)
          return run_errorf(c, "cannot tell size %s of %s: give --param %s=N%s", dims[i].sym,
                            b->name, dims[i].sym,
                            b->role == ROLE_ACC ? " or its start value with --in" : "");
        return run_errorf(c, "cannot tell size %s of %s", dims[i].sym, b->name);
      }
      shape[i] = s->value;
    }
  }
  if (npy_alloc(&c->bufs[bi].arr, dt, nd, shape, b->name, err, sizeof err))
    return run_errorf(c, "%s", err);
  return 0;
}

/* --- params ------------------------------------------------------------------------ */
/* Parses one param's text (given or its default) with the CLI's one number
 * parser (num.h): decimal only, range of the param's type, float32 range
 * without underflow for floats. */
static int parse_param(run_call *c, int pi, const char *text, const char *what) {
  const param_spec *ps = &c->k->params[pi];
  run_param *p = &c->params[pi];
  char opt[96], label[TG_NUM_LABEL_LEN];
  snprintf(opt, sizeof opt, "%s %s", what, ps->name);
  tg_num_label(label, sizeof label, opt, '=', text);
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

/* --- the command ------------------------------------------------------------------ */
static double now_seconds(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

/* The options that are not buffers or params. */
typedef struct {
  int threads; /* -1 = not given */
  int deterministic, quiet, have_isa;
  tg_isa isa;
} run_opts;

enum { PARSE_GO_ON = -1, PARSE_HELP = -2 };

/* Step 1: the command line (argv[0] "run", argv[1] the kernel) into c and o.
 * Touches no file. Returns PARSE_GO_ON, PARSE_HELP, or RUN_EXIT_USAGE with
 * the message in c->err. */
static int parse_command_line(run_call *c, int argc, char **argv, run_opts *o) {
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
    static const char *const valued[] = {"--in", "--out", "--param", "--threads", "--isa"};
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
    if (split_assign(val, name, sizeof name, &value)) {
      tg_num_label(label, sizeof label, opt, ' ', val);
      return usage_errorf(c, "%s: expected NAME=%s", label,
                          strcmp(opt, "--param") ? "file.npy" : "value");
    }
    if (!strcmp(opt, "--param")) {
      const int pi = param_index(k, name);
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
      if (c->params[pi].given) return usage_errorf(c, "--param %s given twice", name);
      c->params[pi].given = value;
      continue;
    }
    const int is_in = !strcmp(opt, "--in");
    const int bi = buf_index(k, name);
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
    if (*slot) return usage_errorf(c, "%s %s given twice", opt, name);
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

/* Checks every --out location (outfile.h: writable directory, not a
 * directory or device, no two outputs on one file), then refuses an output
 * that would replace an input file, except its own buffer's --in where the
 * kernel updates that buffer in place (inout and acc buffers). Runs before
 * any input is read. */
static int check_outputs(run_call *c) {
  const kernel_spec *k = c->k;
  tg_outset_init(&c->outs);
  for (int i = 0; i < RUN_MAX_BUFS; i++) c->out_index[i] = -1;
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (!c->bufs[i].out_path) continue;
    char what[64];
    snprintf(what, sizeof what, "--out %s", k->bufs[i].name);
    const int oi = tg_outset_add(&c->outs, what, c->bufs[i].out_path, c->err, sizeof c->err);
    if (oi < 0) return -1;
    c->out_index[i] = oi;
  }
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    struct stat st;
    if (!c->bufs[i].in_path || stat(c->bufs[i].in_path, &st) != 0) continue;
    for (int j = 0; j < RUN_MAX_BUFS && k->bufs[j].name; j++) {
      if (c->out_index[j] < 0 ||
          !tg_out_is_file(&c->outs.o[c->out_index[j]], st.st_dev, st.st_ino))
        continue;
      if (i == j) continue; /* inout/acc: --in and --out of one buffer, in place */
      return run_errorf(c,
                        "--out %s=%s would replace the input --in %s=%s: %s does not work "
                        "in place on these buffers (only an inout or acc buffer may name "
                        "its own --in file); give another file name",
                        k->bufs[j].name, c->bufs[j].out_path, k->bufs[i].name,
                        c->bufs[i].in_path, k->name);
    }
  }
  return 0;
}

/* Everything after loading; split out so main can free in one place. */
static int run_prepare_and_call(run_call *c, int quiet) {
  const kernel_spec *k = c->k;
  /* 2. dtypes and shapes of the inputs */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_spec *b = &k->bufs[i];
    run_buf *rb = &c->bufs[i];
    if (!rb->in_path) {
      if (b->role == ROLE_IN || b->role == ROLE_INOUT)
        return run_errorf(c, "missing input: --in %s=file.npy (%s %s [%s])", b->name,
                          type_name(b->type), b->name, b->shape);
      continue;
    }
    const npy_dtype t = rb->arr.dtype;
    const int ok = b->type == BT_F32    ? t == NPY_F32
                   : b->type == BT_BF16 ? t == NPY_BF16
                                        : (t == NPY_U32 || t == NPY_I32);
    if (!ok)
      return run_errorf(c, "%s: %s must be %s, the file holds %s%s", rb->in_path, b->name,
                        b->type == BT_F32 ? "float32 ('<f4')"
                        : b->type == BT_BF16 ? "bfloat16 bits ('<u2')"
                                             : "uint32/int32",
                        npy_dtype_name(t),
                        b->type == BT_BF16 && t == NPY_F32
                            ? " (convert first, e.g. with `tilegrad run f32_to_bf16_cast`)"
                            : "");
    if (t == NPY_I32) rb->arr.dtype = NPY_U32; /* non-negative: same bits */
  }
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++)
    if (c->bufs[i].in_path && bind_input(c, i)) return -1;
  /* 3. size symbols given as params (parsed with the command line) */
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++) {
    const param_spec *ps = &k->params[i];
    const run_param *p = &c->params[i];
    if (!p->given) continue;
    char from[64];
    snprintf(from, sizeof from, "--param %s", ps->name);
    /* only size symbols that appear in a rule bind */
    for (int j = 0; j < RUN_MAX_BUFS && k->bufs[j].name; j++) {
      rule_dim dims[RUN_MAX_RULE_DIMS];
      const char *rule = k->bufs[j].shape;
      if (rule[0] == '=' || !strcmp(rule, "*")) continue;
      const int nd = parse_rule(rule, dims);
      int uses = 0;
      for (int d = 0; d < nd; d++) uses |= !strcmp(dims[d].sym, ps->name);
      if (uses) {
        if (bind_sym(c, ps->name, p->i, from)) return -1;
        break;
      }
    }
  }
  /* the kernel's own checks of inputs against params, before allocating */
  if (k->check && k->check(c) != TG_OK) return -1;
  /* 4. outputs */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const buf_role r = k->bufs[i].role;
    if (r == ROLE_OUT || (r == ROLE_ACC && !c->bufs[i].in_path))
      if (alloc_output(c, i)) return -1;
  }
  /* 5. the call */
  const double t0 = now_seconds();
  const tg_status s = k->adapter(c);
  const double t1 = now_seconds();
  if (c->cli_failed) return -1;
  if (s != TG_OK) {
    fprintf(stderr, "tilegrad run %s: kernel error %d: %s\n  %s\n", k->name, (int)s,
            tg_status_str(s), tg_ctx_last_error(c->ctx));
    return 1;
  }
  if (!quiet) fprintf(stderr, "tilegrad run %s: ok (%.3f ms)\n", k->name, (t1 - t0) * 1e3);
  /* 6. every output to its temporary, then all renamed at once, or none */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (c->out_index[i] < 0) continue;
    FILE *f = tg_outset_open(&c->outs, c->out_index[i], c->err, sizeof c->err);
    if (!f || npy_write_stream(f, c->bufs[i].out_path, &c->bufs[i].arr, c->err,
                               sizeof c->err)) {
      tg_outset_discard(&c->outs);
      return -1;
    }
  }
  if (tg_outset_commit(&c->outs, c->err, sizeof c->err)) return -1;
  for (int i = 0; !quiet && i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    const run_buf *rb = &c->bufs[i];
    char sb[256];
    if (rb->out_path)
      fprintf(stderr, "  wrote %s %s %s -> %s\n", k->bufs[i].name,
              npy_dtype_name(rb->arr.dtype), npy_shape_str(&rb->arr, sb, sizeof sb),
              rb->out_path);
  }
  return 0;
}

int tg_cli_run_check_args(int argc, char **argv, char *msg, size_t msglen) {
  if (msg && msglen) msg[0] = '\0';
  if (argc < 2) {
    if (msg && msglen) snprintf(msg, msglen, "no kernel given");
    return RUN_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return RUN_EXIT_OK;
  const kernel_spec *k = find_kernel(argv[1]);
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
  const int r = parse_command_line(c, argc, argv, &o);
  if (msg && msglen) snprintf(msg, msglen, "%s", c->err);
  free(c);
  return r == PARSE_GO_ON || r == PARSE_HELP ? RUN_EXIT_OK : r;
}

int tg_cli_run_main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    tg_cli_run_help(argc < 2 ? stderr : stdout, NULL);
    return argc < 2 ? RUN_EXIT_USAGE : RUN_EXIT_OK;
  }
  const kernel_spec *k = find_kernel(argv[1]);
  if (!k) {
    fprintf(stderr, "tilegrad run: unknown kernel '%s'; kernels:\n", argv[1]);
    tg_cli_run_list(stderr);
    return RUN_EXIT_USAGE;
  }

  run_call *c = calloc(1, sizeof *c);
  if (!c) {
    fprintf(stderr, "tilegrad run: out of memory\n");
    return RUN_EXIT_USAGE;
  }
  c->k = k;
  tg_outset_init(&c->outs);
  int rc = RUN_EXIT_USAGE;
  run_opts o;

  /* 1. the command line and params; then the output locations, before any
   * input is read or anything computed */
  const int pr = parse_command_line(c, argc, argv, &o);
  if (pr == PARSE_HELP) {
    kernel_help(stdout, k);
    rc = RUN_EXIT_OK;
    goto done;
  }
  if (pr != PARSE_GO_ON || check_outputs(c)) {
    fprintf(stderr, "tilegrad run %s: %s\n", k->name, c->err);
    goto done;
  }

  /* load the inputs */
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++) {
    if (!c->bufs[i].in_path) continue;
    char err[NPY_ERR_LEN];
    if (npy_read(c->bufs[i].in_path, &c->bufs[i].arr, err, sizeof err)) {
      fprintf(stderr, "tilegrad run: --in %s: %s\n", k->bufs[i].name, err);
      goto done;
    }
  }

  tg_status s = tg_ctx_create(&c->ctx);
  if (s != TG_OK) {
    fprintf(stderr, "tilegrad run: tg_ctx_create: %s\n", tg_status_str(s));
    goto done;
  }
  if (o.threads >= 0 && (s = tg_ctx_set_threads(c->ctx, o.threads)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --threads %d: %s: %s\n", o.threads, tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }
  if (o.deterministic && (s = tg_ctx_set_deterministic(c->ctx, 1)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --deterministic: %s: %s\n", tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }
  if (o.have_isa && (s = tg_ctx_set_isa(c->ctx, o.isa)) != TG_OK) {
    fprintf(stderr, "tilegrad run: --isa %s: %s: %s\n", tg_isa_name(o.isa), tg_status_str(s),
            tg_ctx_last_error(c->ctx));
    goto done;
  }

  const int r = run_prepare_and_call(c, o.quiet);
  if (r < 0) {
    fprintf(stderr, "tilegrad run %s: %s\n", k->name, c->err);
    rc = RUN_EXIT_USAGE;
  } else {
    rc = r == 0 ? RUN_EXIT_OK : RUN_EXIT_KERNEL;
  }

done:
  tg_outset_discard(&c->outs); /* after a commit there is nothing left to discard */
  for (int i = 0; i < RUN_MAX_BUFS; i++) npy_free(&c->bufs[i].arr);
  tg_ctx_destroy(c->ctx);
  free(c);
  return rc;
}
