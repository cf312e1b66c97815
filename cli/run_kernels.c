/* `tilegrad run`'s table of kernels and their adapters; see run_kernels.h. */
#include "run_kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_call.h"
#include "run_shapes.h" /* run_sym_find: the bound size symbols */

/* --- lookups in the table ----------------------------------------------------- */
int run_buf_index(const kernel_spec *k, const char *name) {
  for (int i = 0; i < RUN_MAX_BUFS && k->bufs[i].name; i++)
    if (!strcmp(k->bufs[i].name, name)) return i;
  return -1;
}

int run_param_index(const kernel_spec *k, const char *name) {
  for (int i = 0; i < RUN_MAX_PARAMS && k->params[i].name; i++)
    if (!strcmp(k->params[i].name, name)) return i;
  return -1;
}

const char *run_type_name(buf_type t) {
  switch (t) {
    case BT_F32: return "f32";
    case BT_BF16: return "bf16";
    case BT_IDS: return "u32";
  }
  return "?";
}

/* --- adapter helpers ---------------------------------------------------------
 * Names passed here come from the table, so a miss is a bug in this file. */
static void internal_error(const char *what, const char *name) {
  fprintf(stderr, "tilegrad run: internal error: no %s '%s' in the kernel table\n", what,
          name);
  abort();
}

/* Data pointer of a buffer (NULL for an absent optional input). */
static void *B(run_call *c, const char *name) {
  const int i = run_buf_index(c->k, name);
  if (i < 0) internal_error("buffer", name);
  return c->bufs[i].arr.data;
}

static const npy_array *A(run_call *c, const char *name) {
  const int i = run_buf_index(c->k, name);
  if (i < 0) internal_error("buffer", name);
  return &c->bufs[i].arr;
}

/* A bound size symbol; all symbols are in [0, INT32_MAX] (checked when bound). */
static int64_t S(run_call *c, const char *name) {
  const run_sym *s = run_sym_find(c, name);
  if (!s) internal_error("bound size symbol", name);
  return s->value;
}
static uint32_t U(run_call *c, const char *name) { return (uint32_t)S(c, name); }

static const run_param *P(run_call *c, const char *name) {
  const int i = run_param_index(c->k, name);
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

/* The attention variants of the forward and backward (tg_attn_options):
 * --window W, --v-head-dim Dv (V, O, dO, dV then have Dv columns: their
 * strides are recomputed here) and --sinks FILE, with d_sinks wanted when
 * its --out is given. Everything else in *opt zero: no dropout, no flags. */
static void attn_options_from(run_call *c, tg_attn_params *p, tg_attn_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->window = (uint32_t)PI(c, "window");
  const int64_t dv = S(c, "Dv"), qL = S(c, "qL"), kL = S(c, "kL");
  const int64_t H = S(c, "H"), H_kv = S(c, "H_kv");
  if (dv != S(c, "D")) {
    opt->v_head_dim = (uint32_t)dv;
    p->V_strides[0] = H_kv * kL * dv, p->V_strides[1] = kL * dv, p->V_strides[2] = dv;
    p->O_strides[0] = H * qL * dv, p->O_strides[1] = qL * dv, p->O_strides[2] = dv;
  }
  opt->sinks = B(c, "sinks");
  const int ds = run_buf_index(c->k, "d_sinks");
  if (ds >= 0 && c->bufs[ds].out_path) opt->d_sinks = c->bufs[ds].arr.data;
}

/* The check hook of the attention forward and backward: the value head dim
 * (bound as Dv from V's columns) against --v-head-dim, and d_sinks against
 * sinks, before any output is allocated. */
static tg_status attn_check(run_call *c) {
  const int64_t dv = S(c, "Dv"), d = S(c, "D");
  const char *v_from = run_sym_find(c, "Dv")->from;
  const int64_t asked = PI(c, "v_head_dim"); /* 0: not given, Dv = D */
  if (asked && (asked % 8 || asked > 512))
    return run_refuse(c, "--v-head-dim %lld: the value head dim must be a multiple of 8, "
                         "at most 512",
                      (long long)asked);
  if (asked && asked != dv)
    return run_refuse(c, "--v-head-dim %lld, but %s has %lld columns", (long long)asked,
                      v_from, (long long)dv);
  if (!asked && dv != d)
    return run_refuse(c, "%s has %lld columns but Q and K have D = %lld: a value head dim "
                         "other than D needs --v-head-dim %lld",
                      v_from, (long long)dv, (long long)d, (long long)dv);
  const int ds = run_buf_index(c->k, "d_sinks");
  if (ds >= 0 && (c->bufs[ds].out_path || c->bufs[ds].in_path) && !B(c, "sinks"))
    return run_refuse(c, "d_sinks is the gradient of the sink logits: it needs --sinks "
                         "FILE ([H] f32, the forward's sinks)");
  return TG_OK;
}

/* 2. FA-2 backward (through tg_attn_train_bwd for the variants; with none
 * it is tg_flash_attn_train_bwd_bf16, same bits) */
static tg_status run_flash_attn_train_bwd_bf16(run_call *c) {
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_attn_options opt;
  const tg_status s = attn_params_from(c, &p);
  if (s != TG_OK) return s;
  attn_options_from(c, &p, &opt);
  const tg_bf16 *mask = attn_mask_from(c, &mp);
  return tg_attn_train_bwd(c->ctx, TG_DTYPE_BF16, B(c, "Q"), B(c, "K"), B(c, "V"), B(c, "L"),
                           B(c, "dO"), B(c, "D_vec"), B(c, "dQ"), B(c, "dK"), B(c, "dV"), &p,
                           mask ? &mp : NULL, mask, (int)PI(c, "causal"), &opt);
}

/* training forward: O, L from Q, K, V (through tg_attn_train_fwd, as the
 * backward) */
static tg_status run_flash_attn_train_fwd_bf16(run_call *c) {
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_attn_options opt;
  const tg_status s = attn_params_from(c, &p);
  if (s != TG_OK) return s;
  attn_options_from(c, &p, &opt);
  const tg_bf16 *mask = attn_mask_from(c, &mp);
  return tg_attn_train_fwd(c->ctx, TG_DTYPE_BF16, B(c, "Q"), B(c, "K"), B(c, "V"), B(c, "O"),
                           B(c, "L"), &p, mask ? &mp : NULL, mask, (int)PI(c, "causal"), &opt);
}

/* varlen attention: packed [total, heads, D] tensors from the bound sizes
 * (qL, kL: the totals), the documents from cu_seqlens_q/k (N1 = documents
 * + 1), and the score params and variants as the dense kernels take them. */
static tg_status varlen_from(run_call *c, tg_attn_params *p, tg_attn_options *opt,
                             tg_attn_varlen *docs) {
  const double scale = given(c, "scale") ? PF(c, "scale") : 1.0 / sqrt((double)S(c, "D"));
  const int64_t H = S(c, "H"), H_kv = S(c, "H_kv"), D = S(c, "D"), dv = S(c, "Dv");
  const tg_status s = tg_attn_params_init(p, 1, (int)H, (int)H_kv, (int)S(c, "qL"),
                                          (int)S(c, "kL"), (int)D, (float)scale);
  if (s != TG_OK)
    return run_refuse(c, "tg_attn_params_init refused H=%lld H_kv=%lld D=%lld: %s (H must be "
                         "a multiple of H_kv)",
                      (long long)H, (long long)H_kv, (long long)D, tg_status_str(s));
  p->softcapping = (float)PF(c, "softcapping");
  const int64_t q[3] = {0, D, H * D}, k[3] = {0, D, H_kv * D}, v[3] = {0, dv, H_kv * dv},
                o[3] = {0, dv, H * dv};
  memcpy(p->Q_strides, q, sizeof q), memcpy(p->K_strides, k, sizeof k);
  memcpy(p->V_strides, v, sizeof v), memcpy(p->O_strides, o, sizeof o);
  memset(opt, 0, sizeof *opt);
  opt->window = (uint32_t)PI(c, "window");
  opt->v_head_dim = dv != D ? (uint32_t)dv : 0;
  opt->sinks = B(c, "sinks");
  const int ds = run_buf_index(c->k, "d_sinks");
  if (ds >= 0 && c->bufs[ds].out_path) opt->d_sinks = c->bufs[ds].arr.data;
  *docs = (tg_attn_varlen){B(c, "cu_seqlens_q"), B(c, "cu_seqlens_k"), (int32_t)(S(c, "N1") - 1),
                           0, NULL};
  return TG_OK;
}

static tg_status run_attn_varlen_fwd(run_call *c) {
  tg_attn_params p;
  tg_attn_options opt;
  tg_attn_varlen docs;
  const tg_status s = varlen_from(c, &p, &opt, &docs);
  if (s != TG_OK) return s;
  return tg_attn_varlen_fwd(c->ctx, TG_DTYPE_BF16, B(c, "Q"), B(c, "K"), B(c, "V"), B(c, "O"),
                            B(c, "L"), &p, &docs, (int)PI(c, "causal"), &opt);
}

static tg_status run_attn_varlen_bwd_step(run_call *c) {
  tg_attn_params p;
  tg_attn_options opt;
  tg_attn_varlen docs;
  const tg_status s = varlen_from(c, &p, &opt, &docs);
  if (s != TG_OK) return s;
  return tg_attn_varlen_bwd_step(c->ctx, TG_DTYPE_BF16, TG_DTYPE_F32, B(c, "Q"), B(c, "K"),
                                 B(c, "V"), B(c, "O"), B(c, "L"), B(c, "dO"), B(c, "dQ"),
                                 B(c, "dK"), B(c, "dV"), &p, &docs, (int)PI(c, "causal"), &opt);
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
/* The variants' options are params and buffers too; `tilegrad run` also
 * takes them as --window W, --v-head-dim Dv and --sinks FILE (run_args.c). */
#define ATTN_SINKS_BUF                                                      \
  {"sinks", ROLE_OPT_IN, BT_F32, "H",                                       \
   "--sinks FILE: sink logit s_h per query head, joins every row's softmax"}
#define ATTN_SCORE_PARAMS                                                              \
  {{"causal", P_BOOL, "0", "1: key k is visible to query i iff k <= i + qL_off"},      \
   {"scale", P_FLOAT, "", "score scale (default 1/sqrt(D))"},                          \
   {"softcapping", P_FLOAT, "1.0", "tanh softcap c (1.0 = off)"},                      \
   {"qL_off", P_I32, "", "offset of causal and window (default kL - qL; 0: the seed's)"}, \
   {"window", P_U32, "0",                                                              \
    "--window W: key k visible to query i only if k > i + qL_off - W (0 = none)"},     \
   {"v_head_dim", P_U32, "0",                                                          \
    "--v-head-dim Dv: columns of V, O, dO, dV (multiple of 8, <= 512; 0 = D)"},        \
   END_PARAMS}

#define VARLEN_BUFS                                                                  \
  {"cu_seqlens_q", ROLE_IN, BT_IDS, "N1",                                            \
   "int32 [documents + 1]: 0, ..., total_q; document d's queries are rows "          \
   "[cu[d], cu[d+1])"},                                                              \
      {"cu_seqlens_k", ROLE_IN, BT_IDS, "N1", "int32 [documents + 1]: 0, ..., total_k"}
#define VARLEN_PARAMS                                                                  \
  {{"causal", P_BOOL, "0", "1: causal within each document, bottom-right aligned"},    \
   {"scale", P_FLOAT, "", "score scale (default 1/sqrt(D))"},                          \
   {"softcapping", P_FLOAT, "1.0", "tanh softcap c (1.0 = off)"},                      \
   {"window", P_U32, "0", "--window W: within each document, as the dense kernels'"},  \
   {"v_head_dim", P_U32, "0",                                                          \
    "--v-head-dim Dv: columns of V, O, dO, dV (multiple of 8, <= 512; 0 = D)"},        \
   END_PARAMS}

static const kernel_spec kernel_table[] = {
    {"flash_attn_train_bwd_compute_d_bf16",
     "FA-2 backward pre-pass: D_out[b,h,i] = sum_d O[b,h,i,d]*dO[b,h,i,d]",
     {{"O", ROLE_IN, BT_BF16, "B,H,qL,D", "forward output (D: its columns, Dv if V had Dv)"},
      {"dO", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"D_out", ROLE_OUT, BT_F32, "B,H,qL", NULL},
      END_BUFS},
     {END_PARAMS},
     run_flash_attn_train_bwd_compute_d_bf16, NULL},

    {"flash_attn_train_bwd_bf16",
     "FA-2 backward: dQ (writes), dK/dV (accumulate) from Q,K,V,L,dO,D_vec",
     {{"Q", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"K", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"V", ROLE_IN, BT_BF16, "B,H_kv,kL,Dv", "Dv = D unless --v-head-dim"},
      {"L", ROLE_IN, BT_F32, "B,H,qL", "natural-log logsumexp from the forward (with the sink)"},
      {"dO", ROLE_IN, BT_BF16, "B,H,qL,Dv", NULL},
      {"D_vec", ROLE_IN, BT_F32, "B,H,qL", "from flash_attn_train_bwd_compute_d_bf16"},
      {"dQ", ROLE_OUT, BT_F32, "B,H,qL,D", NULL},
      {"dK", ROLE_ACC, BT_F32, "B,H_kv,kL,D", NULL},
      {"dV", ROLE_ACC, BT_F32, "B,H_kv,kL,Dv", NULL},
      ATTN_MASK_BUF,
      ATTN_SINKS_BUF,
      {"d_sinks", ROLE_ACC, BT_F32, "H",
       "d_sinks[h] -= sum_{b,i} e^(s_h - L[b,h,i]) D_vec[b,h,i]; needs --sinks"},
      END_BUFS},
     ATTN_SCORE_PARAMS,
     run_flash_attn_train_bwd_bf16, attn_check},

    {"flash_attn_train_fwd_bf16",
     "FA-2 training forward: O = softmax(S).V (bf16), L = logsumexp(S), S as in the backward",
     {{"Q", ROLE_IN, BT_BF16, "B,H,qL,D", NULL},
      {"K", ROLE_IN, BT_BF16, "B,H_kv,kL,D", NULL},
      {"V", ROLE_IN, BT_BF16, "B,H_kv,kL,Dv", "Dv = D unless --v-head-dim"},
      {"O", ROLE_OUT, BT_BF16, "B,H,qL,Dv", "written as '<u2' bf16 bits"},
      {"L", ROLE_OUT, BT_F32, "B,H,qL",
       "natural-log logsumexp, with the sink (no visible key: -inf, or s_h)"},
      ATTN_MASK_BUF,
      ATTN_SINKS_BUF,
      END_BUFS},
     ATTN_SCORE_PARAMS,
     run_flash_attn_train_fwd_bf16, attn_check},

    {"attn_varlen_fwd",
     "packed documents' FA-2 forward (bf16): each document's queries see its own keys",
     {{"Q", ROLE_IN, BT_BF16, "qL,H,D", "[total_q, H, D]: the documents one after another"},
      {"K", ROLE_IN, BT_BF16, "kL,H_kv,D", NULL},
      {"V", ROLE_IN, BT_BF16, "kL,H_kv,Dv", "Dv = D unless --v-head-dim"},
      {"O", ROLE_OUT, BT_BF16, "qL,H,Dv", "written as '<u2' bf16 bits"},
      {"L", ROLE_OUT, BT_F32, "H,qL", "natural-log logsumexp, [H, total_q]"},
      VARLEN_BUFS,
      ATTN_SINKS_BUF,
      END_BUFS},
     VARLEN_PARAMS,
     run_attn_varlen_fwd, attn_check},

    {"attn_varlen_bwd_step",
     "packed documents' FA-2 backward step: dQ, dK, dV (f32) from O, L, dO",
     {{"Q", ROLE_IN, BT_BF16, "qL,H,D", NULL},
      {"K", ROLE_IN, BT_BF16, "kL,H_kv,D", NULL},
      {"V", ROLE_IN, BT_BF16, "kL,H_kv,Dv", NULL},
      {"O", ROLE_IN, BT_BF16, "qL,H,Dv", "from attn_varlen_fwd"},
      {"L", ROLE_IN, BT_F32, "H,qL", "from attn_varlen_fwd"},
      {"dO", ROLE_IN, BT_BF16, "qL,H,Dv", NULL},
      {"dQ", ROLE_OUT, BT_F32, "qL,H,D", NULL},
      {"dK", ROLE_OUT, BT_F32, "kL,H_kv,D", NULL},
      {"dV", ROLE_OUT, BT_F32, "kL,H_kv,Dv", NULL},
      VARLEN_BUFS,
      ATTN_SINKS_BUF,
      {"d_sinks", ROLE_ACC, BT_F32, "H", "needs --sinks"},
      END_BUFS},
     VARLEN_PARAMS,
     run_attn_varlen_bwd_step, attn_check},

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

const kernel_spec *run_find_kernel(const char *name) {
  if (!strncmp(name, "tg_", 3)) name += 3; /* accept the C name too */
  for (int i = 0; i < n_kernels; i++)
    if (!strcmp(kernel_table[i].name, name)) return &kernel_table[i];
  return NULL;
}

int run_kernel_count(void) { return n_kernels; }

const kernel_spec *run_kernel_at(int i) { return &kernel_table[i]; }
