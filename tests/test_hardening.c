/*
 * Hardening checks that cut across kernels:
 *
 *  1. TG_ERR_NO_MEMORY. Every allocation of libtilegrad goes through one
 *     function (engine/mem.c), and the test hook of include/tilegrad_testing.h
 *     makes its k-th call from now on return NULL. For every entry point,
 *     allocation k = 0, 1, 2, ... of the call is made to fail, on a fresh
 *     context each time, until the call makes no more allocations; every
 *     injected failure must give TG_ERR_NO_MEMORY, a message, every output
 *     byte (accumulating outputs included) unchanged, and no allocation after
 *     the failed one (the hook's count). Then the same context must succeed.
 *     Runs under the sanitizers too (ASan checks that nothing leaks on the
 *     failure paths). The attention entry points run with the variants on
 *     as well (window, Dv != D, sinks, d_sinks).
 *  2. Refused calls that the per-kernel suites do not cover: the attention
 *     forward's full params table (the backward's exists in test_attention.c)
 *     for both entry points in both modes (the backward on both dK/dV
 *     schedules) with every output snapshotted,
 *     tg_attn_params_init leaving *p untouched, tg_ctx_set_isa and
 *     tg_ctx_set_attn_schedule with bogus values (state unchanged).
 *  3. Determinism of every accumulating output in one place: FA-2 dK/dV (with
 *     GQA, causal, a mask with -inf and softcapping; the ATOMIC schedule asked
 *     for in deterministic mode, and the KV schedule's key ranges), fused RMSNorm
 *     grad_weight, split dw, embedding grad, cross-entropy loss, causal
 *     attention grad_K/grad_V -- accumulating onto non-zero outputs,
 *     deterministic mode, bitwise identical across 1/2/3/5/5/7 threads (5
 *     twice: across runs), on every ISA.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"
#include "tilegrad_testing.h"

/* An output buffer and its snapshot. */
typedef struct {
  void *p;
  size_t bytes;
  void *snap;
} outbuf;

/* One entry point under injection: env holds its buffers. */
typedef struct {
  const char *name;
  int threads, det;
  tg_attn_schedule sched; /* FA-2 backward: KV (default) or ATOMIC */
  tg_status (*call)(tg_ctx *ctx, void *env);
  void *env;
  outbuf out[4];
  int nout;
} inj_case;

static void snap_all(inj_case *c) {
  for (int i = 0; i < c->nout; i++) memcpy(c->out[i].snap, c->out[i].p, c->out[i].bytes);
}
static int same_all(const inj_case *c) {
  for (int i = 0; i < c->nout; i++)
    if (memcmp(c->out[i].snap, c->out[i].p, c->out[i].bytes)) return 0;
  return 1;
}

/* Fails allocation 0, 1, 2, ... of the call; returns how many it failed. */
static int run_injected(inj_case *c) {
  int k = 0;
  for (;; k++) {
    tg_ctx *ctx = tu_ctx(c->threads, TG_ISA_AUTO);
    assert_int_equal(tg_ctx_set_deterministic(ctx, c->det), TG_OK);
    assert_int_equal(tg_ctx_set_attn_schedule(ctx, c->sched), TG_OK);
    snap_all(c);
    int failed;
    tg_testing_alloc_arm(k);
    const tg_status st = c->call(ctx, c->env);
    const long long made = tg_testing_alloc_disarm(&failed);
    if (!failed) { /* the call made k allocations, all served */
      if (made != k)
        TU_FAIL("%s: %lld allocations counted without a failure at %d", c->name, made, k);
      TU_EXPECT_STATUS(ctx, st, TG_OK);
      tg_ctx_destroy(ctx);
      break;
    }
    if (made != k + 1) /* nothing is allocated after a failure */
      TU_FAIL("%s: allocation %d failed, then %lld more were made", c->name, k, made - k - 1);
    if (st != TG_ERR_NO_MEMORY)
      TU_FAIL("%s (threads %d, det %d): allocation %d failed but status %d (%s), message '%s'",
              c->name, c->threads, c->det, k, (int)st, tg_status_str(st),
              tg_ctx_last_error(ctx));
    if (!strstr(tg_ctx_last_error(ctx), "allocate"))
      TU_FAIL("%s: allocation %d failed with message '%s'", c->name, k, tg_ctx_last_error(ctx));
    if (!same_all(c))
      TU_FAIL("%s (threads %d, det %d): allocation %d failed and an output was written",
              c->name, c->threads, c->det, k);
    /* the failed context recovers: the same call succeeds on it */
    snap_all(c);
    TU_EXPECT_STATUS(ctx, c->call(ctx, c->env), TG_OK);
    tg_ctx_destroy(ctx);
  }
  printf("  %-40s threads %d det %d sched %d: %d allocation(s), each failure refused "
         "cleanly\n",
         c->name, c->threads, c->det, (int)c->sched, k);
  return k;
}

/* --- the entry points' environments --------------------------------------------- */
typedef struct {
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_bf16 *Q, *K, *V, *dO, *mask, *O;
  float *L, *Dv, *dQ, *dK, *dV;
  int causal;
  int64_t nq, nk, nrow, nm;
  /* the variants' calls: p with V, O, dO of Dv = D / 2 columns (inside the
   * same buffers), a window, sinks [H] and d_sinks [H] */
  tg_attn_params pv;
  tg_attn_options opt;
  float *sinks, *d_sinks;
} attn_env;

static void attn_env_make(attn_env *e, tu_rng *r, int B, int H, int Hkv, int qL, int kL,
                          int D, int masked, int causal) {
  memset(e, 0, sizeof *e);
  assert_int_equal(tg_attn_params_init(&e->p, B, H, Hkv, qL, kL, D, 0.25f), TG_OK);
  e->causal = causal;
  e->nq = (int64_t)B * H * qL * D;
  e->nk = (int64_t)B * Hkv * kL * D;
  e->nrow = (int64_t)B * H * qL;
  e->Q = tu_alloc(2 * e->nq), e->dO = tu_alloc(2 * e->nq), e->O = tu_alloc(2 * e->nq);
  e->K = tu_alloc(2 * e->nk), e->V = tu_alloc(2 * e->nk);
  tu_fill_bf16(r, e->Q, e->nq, -2, 2);
  tu_fill_bf16(r, e->dO, e->nq, -1, 1);
  tu_fill_bf16(r, e->K, e->nk, -2, 2);
  tu_fill_bf16(r, e->V, e->nk, -1, 1);
  tu_fill_bf16(r, e->O, e->nq, -1, 1);
  if (masked) {
    const int64_t s[3] = {(int64_t)H * qL * kL, (int64_t)qL * kL, kL};
    memcpy(e->mp.M_strides, s, sizeof s);
    e->nm = (int64_t)B * H * qL * kL;
    e->mask = tu_alloc(2 * e->nm);
    for (int64_t i = 0; i < e->nm; i++)
      e->mask[i] = tg_f32_to_bf16(tu_uniform(r, 0, 1) < 0.2 ? -INFINITY
                                                            : (float)tu_uniform(r, -2, 1));
  }
  e->L = tu_alloc(sizeof(float) * e->nrow), e->Dv = tu_alloc(sizeof(float) * e->nrow);
  e->dQ = tu_alloc(sizeof(float) * e->nq);
  e->dK = tu_alloc(sizeof(float) * e->nk), e->dV = tu_alloc(sizeof(float) * e->nk);
  tu_fill_f32(r, e->L, e->nrow, 1, 3);
  tu_fill_f32(r, e->Dv, e->nrow, -1, 1);
  tu_fill_f32(r, e->dQ, e->nq, -1, 1);
  tu_fill_f32(r, e->dK, e->nk, -1, 1);
  tu_fill_f32(r, e->dV, e->nk, -1, 1);
  e->pv = e->p;
  const int Dv = D / 2;
  const int64_t vs[3] = {(int64_t)Hkv * kL * Dv, (int64_t)kL * Dv, Dv};
  const int64_t os[3] = {(int64_t)H * qL * Dv, (int64_t)qL * Dv, Dv};
  memcpy(e->pv.V_strides, vs, sizeof vs);
  memcpy(e->pv.O_strides, os, sizeof os);
  e->sinks = tu_alloc(sizeof(float) * H), e->d_sinks = tu_alloc(sizeof(float) * H);
  tu_fill_f32(r, e->sinks, H, -2, 2);
  tu_fill_f32(r, e->d_sinks, H, -1, 1);
  e->opt = (tg_attn_options){.window = 100, .v_head_dim = (uint32_t)Dv, .sinks = e->sinks,
                             .d_sinks = e->d_sinks};
}

static void attn_env_free(attn_env *e) {
  free(e->Q), free(e->K), free(e->V), free(e->dO), free(e->mask), free(e->O);
  free(e->L), free(e->Dv), free(e->dQ), free(e->dK), free(e->dV);
  free(e->sinks), free(e->d_sinks);
}

static tg_status call_attn_bwd(tg_ctx *ctx, void *v) {
  attn_env *e = v;
  return tg_flash_attn_train_bwd_bf16(ctx, e->Q, e->K, e->V, e->L, e->dO, e->Dv, e->dQ,
                                      e->dK, e->dV, &e->p, e->mask ? &e->mp : NULL, e->mask,
                                      e->causal);
}
static tg_status call_attn_fwd(tg_ctx *ctx, void *v) {
  attn_env *e = v;
  return tg_flash_attn_train_fwd_bf16(ctx, e->Q, e->K, e->V, e->O, e->L, &e->p,
                                      e->mask ? &e->mp : NULL, e->mask, e->causal);
}
static tg_status call_attn_bwd_variants(tg_ctx *ctx, void *v) {
  attn_env *e = v;
  return tg_attn_train_bwd(ctx, TG_DTYPE_BF16, e->Q, e->K, e->V, e->L, e->dO, e->Dv, e->dQ,
                           e->dK, e->dV, &e->pv, e->mask ? &e->mp : NULL, e->mask, e->causal,
                           &e->opt);
}
static tg_status call_attn_fwd_variants(tg_ctx *ctx, void *v) {
  attn_env *e = v;
  return tg_attn_train_fwd(ctx, TG_DTYPE_BF16, e->Q, e->K, e->V, e->O, e->L, &e->pv,
                           e->mask ? &e->mp : NULL, e->mask, e->causal, &e->opt);
}
static tg_status call_compute_d(tg_ctx *ctx, void *v) {
  attn_env *e = v;
  return tg_flash_attn_train_bwd_compute_d_bf16(ctx, e->O, e->dO, e->Dv, e->p.B, e->p.H,
                                                e->p.qL, e->p.D);
}

/* The row kernels share one environment: [rows, dim] f32 tensors. */
typedef struct {
  uint32_t rows, dim, vocab;
  float *x, *w, *dy, *r, *dx, *dw, *y, *gw, *loss;
  uint32_t *ids;
  tg_bf16 *bf;
  float *big; /* decode: htmp */
  float *dec_out;
  uint32_t nwg, dec_dim;
} row_env;

static tg_status call_cast(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_f32_to_bf16_cast(c, e->x, e->bf, (uint64_t)e->rows * e->dim);
}
static tg_status call_rms_fwd(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_rms_norm_forward_f32(c, e->x, e->w, e->y, e->r, e->rows, e->dim, 1e-5f);
}
static tg_status call_rms_inv(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_rms_norm_compute_rms_inv_f32(c, e->x, e->r, e->rows, e->dim, 1e-5f);
}
static tg_status call_rms_dx(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_rms_norm_backward_dx_f32(c, e->x, e->w, e->dy, e->w, e->dx, e->rows, e->dim);
}
static tg_status call_rms_dw(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_rms_norm_backward_dw_f32(c, e->x, e->dy, e->w, e->dw, e->rows, e->dim);
}
static tg_status call_rms_fused(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_rms_norm_backward(c, e->x, e->w, e->dy, e->dx, e->gw, e->rows, e->dim, 1e-5f);
}
static tg_status call_softmax(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_softmax_backward(c, e->x, e->dy, e->dx, e->rows, e->dim);
}
static tg_status call_embedding(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_embedding_backward(c, e->dy, e->ids, e->gw, e->vocab, e->rows, e->dim);
}
static tg_status call_ce(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_cross_entropy_fwd_bwd(c, e->x, e->ids, e->dx, e->loss, e->rows, e->dim, 1,
                                  e->rows);
}
static tg_status call_transpose(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_transpose_2d(c, e->x, e->dx, e->rows, e->dim);
}
static tg_status call_causal(tg_ctx *c, void *v) {
  row_env *e = v; /* seq = rows, 4 heads / 2 kv heads of dim/4 */
  return tg_causal_attention_backward(c, e->dy, e->x, e->w, e->w, e->dx, e->gw, e->dw,
                                      e->rows, 4, 2, e->dim / 4);
}
static tg_status call_dec_reduce(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_flash_attn_vec_reduce(c, e->big, e->dec_out, 3, e->dec_dim, e->nwg);
}
static tg_status call_dec_undo(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_flash_attn_vec_reduce_tq_hb_undo(c, e->big, e->dec_out, 3, e->dec_dim, e->nwg);
}
static tg_status call_fwht(tg_ctx *c, void *v) {
  row_env *e = v;
  return tg_fwht_sign_undo_f32(c, e->dec_out, 3, e->dec_dim);
}

#define OUT(buf, n) ((outbuf){(buf), (n), tu_alloc(n)})

static void free_case(inj_case *c) {
  for (int i = 0; i < c->nout; i++) free(c->out[i].snap);
}

static void test_no_memory_every_entry_point(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 70);
  int total = 0;

  /* context creation: its one allocation fails -> TG_ERR_NO_MEMORY, *out = NULL */
  tg_ctx *ctx = (tg_ctx *)&r;
  int failed;
  tg_testing_alloc_arm(0);
  const tg_status cst = tg_ctx_create(&ctx);
  tg_testing_alloc_disarm(&failed);
  assert_true(failed);
  assert_int_equal(cst, TG_ERR_NO_MEMORY);
  assert_null(ctx);
  total++;

  /* attention: kL = 520 is 9 key tiles, so the KV schedule splits each kv
   * head's keys into ranges and allocates dQ partials besides the scratch; the
   * ATOMIC schedule (not deterministic) is the Metal grid with omp atomic */
  attn_env a;
  attn_env_make(&a, &r, 1, 4, 2, 70, 520, 32, 1, 1);
  for (int det = 0; det <= 1; det++)
    for (int threads = 1; threads <= 3; threads += 2)
      for (int sched = TG_ATTN_SCHEDULE_KV; sched <= TG_ATTN_SCHEDULE_ATOMIC; sched++) {
        inj_case bwd = {"tg_flash_attn_train_bwd_bf16", threads, det, (tg_attn_schedule)sched,
                        call_attn_bwd, &a,
                        {OUT(a.dQ, 4 * a.nq), OUT(a.dK, 4 * a.nk), OUT(a.dV, 4 * a.nk)}, 3};
        total += run_injected(&bwd);
        free_case(&bwd);
        if (sched) continue;
        inj_case fwd = {"tg_flash_attn_train_fwd_bf16", threads, det, TG_ATTN_SCHEDULE_KV,
                        call_attn_fwd, &a, {OUT(a.O, 2 * a.nq), OUT(a.L, 4 * a.nrow)}, 2};
        total += run_injected(&fwd);
        free_case(&fwd);
      }
  /* the same with the variants on: window 100 (tiles skipped), Dv = D / 2,
   * sinks and d_sinks (an accumulated output that must stay unchanged) */
  for (int det = 0; det <= 1; det++)
    for (int threads = 1; threads <= 3; threads += 2)
      for (int sched = TG_ATTN_SCHEDULE_KV; sched <= TG_ATTN_SCHEDULE_ATOMIC; sched++) {
        inj_case bwd = {"tg_attn_train_bwd (variants)", threads, det, (tg_attn_schedule)sched,
                        call_attn_bwd_variants, &a,
                        {OUT(a.dQ, 4 * a.nq), OUT(a.dK, 4 * a.nk), OUT(a.dV, 4 * a.nk),
                         OUT(a.d_sinks, 4 * a.p.H)},
                        4};
        total += run_injected(&bwd);
        free_case(&bwd);
        if (sched) continue;
        inj_case fwd = {"tg_attn_train_fwd (variants)", threads, det, TG_ATTN_SCHEDULE_KV,
                        call_attn_fwd_variants, &a, {OUT(a.O, 2 * a.nq), OUT(a.L, 4 * a.nrow)},
                        2};
        total += run_injected(&fwd);
        free_case(&fwd);
      }
  inj_case cd = {"tg_flash_attn_train_bwd_compute_d_bf16", 2, 0, TG_ATTN_SCHEDULE_KV,
                 call_compute_d, &a, {OUT(a.Dv, 4 * a.nrow)}, 1};
  total += run_injected(&cd);
  free_case(&cd);
  attn_env_free(&a);

  /* row kernels: 300 x 64 */
  row_env e = {.rows = 300, .dim = 64, .vocab = 50, .nwg = 5, .dec_dim = 256};
  const int64_t n = (int64_t)e.rows * e.dim;
  float *bufs[] = {e.x = tu_alloc(4 * n),   e.w = tu_alloc(4 * n),  e.dy = tu_alloc(4 * n),
                   e.r = tu_alloc(4 * n),   e.dx = tu_alloc(4 * n), e.dw = tu_alloc(4 * n),
                   e.y = tu_alloc(4 * n),   e.gw = tu_alloc(4 * n), e.loss = tu_alloc(4),
                   e.big = tu_alloc(4 * 3 * 5 * (256 + 2)), e.dec_out = tu_alloc(4 * 3 * 256)};
  e.ids = tu_alloc(4 * e.rows);
  e.bf = tu_alloc(2 * n);
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0] - 3; i++) tu_fill_f32(&r, bufs[i], n, 0.1, 1);
  tu_fill_f32(&r, e.big, 3 * 5 * 256, -1, 1);
  for (int i = 0; i < 3 * 5; i++) e.big[3 * 5 * 256 + 2 * i] = 1, e.big[3 * 5 * 256 + 2 * i + 1] = 0;
  tu_fill_f32(&r, e.dec_out, 3 * 256, -1, 1);
  *e.loss = 0.5f;
  for (uint32_t t = 0; t < e.rows; t++) e.ids[t] = (uint32_t)tu_int(&r, 0, (int)e.vocab - 1);
  memset(e.bf, 0x5A, 2 * n);
  const struct {
    const char *name;
    tg_status (*call)(tg_ctx *, void *);
    outbuf out[3];
    int nout;
  } rk[] = {
      {"tg_f32_to_bf16_cast", call_cast, {OUT(e.bf, 2 * n)}, 1},
      {"tg_rms_norm_forward_f32", call_rms_fwd, {OUT(e.y, 4 * n), OUT(e.r, 4 * e.rows)}, 2},
      {"tg_rms_norm_compute_rms_inv_f32", call_rms_inv, {OUT(e.r, 4 * e.rows)}, 1},
      {"tg_rms_norm_backward_dx_f32", call_rms_dx, {OUT(e.dx, 4 * n)}, 1},
      {"tg_rms_norm_backward_dw_f32", call_rms_dw, {OUT(e.dw, 4 * e.dim)}, 1},
      {"tg_rms_norm_backward", call_rms_fused, {OUT(e.dx, 4 * n), OUT(e.gw, 4 * e.dim)}, 2},
      {"tg_softmax_backward", call_softmax, {OUT(e.dx, 4 * n)}, 1},
      {"tg_embedding_backward", call_embedding, {OUT(e.gw, 4 * (int64_t)e.vocab * e.dim)}, 1},
      {"tg_cross_entropy_fwd_bwd", call_ce, {OUT(e.dx, 4 * n), OUT(e.loss, 4)}, 2},
      {"tg_transpose_2d", call_transpose, {OUT(e.dx, 4 * n)}, 1},
      {"tg_causal_attention_backward", call_causal,
       {OUT(e.dx, 4 * n), OUT(e.gw, 2 * n), OUT(e.dw, 2 * n)}, 3},
      {"tg_flash_attn_vec_reduce", call_dec_reduce, {OUT(e.dec_out, 4 * 3 * 256)}, 1},
      {"tg_flash_attn_vec_reduce_tq_hb_undo", call_dec_undo, {OUT(e.dec_out, 4 * 3 * 256)}, 1},
      {"tg_fwht_sign_undo_f32", call_fwht, {OUT(e.dec_out, 4 * 3 * 256)}, 1},
  };
  for (size_t i = 0; i < sizeof rk / sizeof rk[0]; i++) {
    for (int det = 0; det <= 1; det++) {
      inj_case c = {rk[i].name, 3, det, TG_ATTN_SCHEDULE_KV, rk[i].call, &e, {{0}}, rk[i].nout};
      memcpy(c.out, rk[i].out, sizeof rk[i].out);
      total += run_injected(&c);
    }
    for (int o = 0; o < rk[i].nout; o++) free(rk[i].out[o].snap);
  }
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  free(e.ids), free(e.bf);
  /* scratch (attention, decode, fused RMSNorm), per-call heap buffers (CE,
   * causal attention, deterministic RMSNorm) and the context itself all
   * allocate: the test must have injected a good number of failures */
  printf("  %d allocation failures injected in all\n", total);
  assert_true(total >= 10);
}

/* ------------------------------------------------------------------------------
 * 2. refused calls not covered by the per-kernel suites
 * ---------------------------------------------------------------------------- */
static void test_attention_refusals_all_outputs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 80);
  attn_env a;
  attn_env_make(&a, &r, 2, 2, 1, 33, 17, 16, 1, 0);
  float *sdQ = tu_alloc(4 * a.nq), *sdK = tu_alloc(4 * a.nk), *sdV = tu_alloc(4 * a.nk);
  tg_bf16 *sO = tu_alloc(2 * a.nq);
  float *sL = tu_alloc(4 * a.nrow);
  memcpy(sdQ, a.dQ, 4 * a.nq), memcpy(sdK, a.dK, 4 * a.nk), memcpy(sdV, a.dV, 4 * a.nk);
  memcpy(sO, a.O, 2 * a.nq), memcpy(sL, a.L, 4 * a.nrow);
  const tg_attn_params good = a.p;
  const tg_attn_mask_params mgood = a.mp;
  const struct {
    const char *what;
    int field, status;
    int64_t value;
  } edits[] = {
      /* field: 0 B, 1 H, 2 D, 3 qL, 4 kL, 5 gqa, 6 NQ, 7 NK, 8 NQ_al, 9 NK_al, 10 qL_rem,
       * 11 kL_rem, 12 scale(nan), 13 scale(inf), 14 softcap, 15 Q_strides[i], 16
       * K_strides[0], 17 V_strides[1], 18 O_strides[2], 19 M_strides[2] */
      {"B = 0", 0, TG_ERR_BAD_SHAPE, 0},
      {"B = INT32_MIN", 0, TG_ERR_BAD_SHAPE, INT32_MIN},
      {"H = 0", 1, TG_ERR_BAD_SHAPE, 0},
      {"H = 3 (gqa 2)", 1, TG_ERR_BAD_SHAPE, 3},
      {"D = -8", 2, TG_ERR_BAD_SHAPE, -8},
      {"D = 12", 2, TG_ERR_UNSUPPORTED, 12},
      {"D = 520", 2, TG_ERR_UNSUPPORTED, 520},
      {"D = INT32_MAX", 2, TG_ERR_UNSUPPORTED, INT32_MAX},
      {"qL = 0", 3, TG_ERR_BAD_SHAPE, 0},
      {"kL = -1", 4, TG_ERR_BAD_SHAPE, -1},
      {"gqa_factor = 0", 5, TG_ERR_BAD_SHAPE, 0},
      {"gqa_factor = 4 (H 2)", 5, TG_ERR_BAD_SHAPE, 4},
      {"NQ + 1", 6, TG_ERR_BAD_PARAMS, 3},
      {"NK = 0", 7, TG_ERR_BAD_PARAMS, 0},
      {"NQ_aligned = 0", 8, TG_ERR_BAD_PARAMS, 0},
      {"NK_aligned = 2", 9, TG_ERR_BAD_PARAMS, 2},
      {"qL_rem = 0", 10, TG_ERR_BAD_PARAMS, 0},
      {"kL_rem = 17", 11, TG_ERR_BAD_PARAMS, 17},
      {"scale = NaN", 12, TG_ERR_BAD_PARAMS, 0},
      {"scale = -inf", 13, TG_ERR_BAD_PARAMS, 0},
      {"softcapping = -0", 14, TG_ERR_BAD_PARAMS, 0},
      {"Q_strides[0] = -1", 15, TG_ERR_BAD_PARAMS, -1},
      {"Q_strides[0] = INT64_MAX", 15, TG_ERR_OVERFLOW, INT64_MAX},
      {"K_strides[0] = INT64_MIN", 16, TG_ERR_BAD_PARAMS, INT64_MIN},
      {"K_strides[0] = INT64_MAX - 100", 16, TG_ERR_OVERFLOW, INT64_MAX - 100},
      {"V_strides[1] = -2^40 (H_kv 1: unused, still refused)", 17, TG_ERR_BAD_PARAMS,
       -(INT64_C(1) << 40)},
      {"O_strides[2] = INT64_MAX / 32", 18, TG_ERR_OVERFLOW, INT64_MAX / 32},
      {"M_strides[2] = -1", 19, TG_ERR_BAD_PARAMS, -1},
      {"M_strides[2] = INT64_MAX / 20", 19, TG_ERR_OVERFLOW, INT64_MAX / 20},
  };
  for (int det = 0; det <= 1; det++)
    for (int causal = 0; causal <= 1; causal++)
      for (int entry = 0; entry < 3; entry++) { /* bwd (KV), fwd, bwd (ATOMIC) */
        tg_ctx *ctx = tu_ctx(det ? 3 : 2, TG_ISA_AUTO);
        assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
        assert_int_equal(tg_ctx_set_attn_schedule(ctx, entry == 2 ? TG_ATTN_SCHEDULE_ATOMIC
                                                                  : TG_ATTN_SCHEDULE_KV),
                         TG_OK);
        a.causal = causal;
        tg_status (*call)(tg_ctx *, void *) = entry == 1 ? call_attn_fwd : call_attn_bwd;
        for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
          a.p = good, a.mp = mgood;
          const int64_t v = edits[i].value;
          switch (edits[i].field) {
            case 0: a.p.B = (int32_t)v; break;
            case 1: a.p.H = (int32_t)v; break;
            case 2: a.p.D = (int32_t)v; break;
            case 3: a.p.qL = (int32_t)v; break;
            case 4: a.p.kL = (int32_t)v; break;
            case 5: a.p.gqa_factor = (int32_t)v; break;
            case 6: a.p.NQ = (int32_t)v; break;
            case 7: a.p.NK = (int32_t)v; break;
            case 8: a.p.NQ_aligned = (int32_t)v; break;
            case 9: a.p.NK_aligned = (int32_t)v; break;
            case 10: a.p.qL_rem = (int32_t)v; break;
            case 11: a.p.kL_rem = (int32_t)v; break;
            case 12: a.p.scale = NAN; break;
            case 13: a.p.scale = -INFINITY; break;
            case 14: a.p.softcapping = -0.0f; break;
            case 15: a.p.Q_strides[0] = v; break;
            case 16: a.p.K_strides[0] = v; break;
            case 17: a.p.V_strides[1] = v; break;
            case 18: a.p.O_strides[2] = v; break;
            case 19: a.mp.M_strides[2] = v; break;
          }
          const tg_status st = call(ctx, &a);
          if (st != (tg_status)edits[i].status || !tg_ctx_last_error(ctx)[0])
            TU_FAIL("%s, %s, det %d causal %d: status %d (%s) want %d, message '%s'",
                    entry ? "fwd" : "bwd", edits[i].what, det, causal, (int)st,
                    tg_status_str(st), edits[i].status, tg_ctx_last_error(ctx));
        }
        a.p = good, a.mp = mgood;
        /* pointer refusals: each buffer NULL, mask / mask params unpaired, no ctx */
        tg_bf16 *keep_mask = a.mask;
        a.mask = NULL; /* mask params given (mp) without mask */
        const tg_status s1 =
            entry ? tg_flash_attn_train_fwd_bf16(ctx, a.Q, a.K, a.V, a.O, a.L, &a.p, &a.mp,
                                                 NULL, causal)
                  : tg_flash_attn_train_bwd_bf16(ctx, a.Q, a.K, a.V, a.L, a.dO, a.Dv, a.dQ,
                                                 a.dK, a.dV, &a.p, &a.mp, NULL, causal);
        a.mask = keep_mask;
        TU_EXPECT_STATUS(ctx, s1, TG_ERR_NULL_ARG);
        if (entry) {
          void *ptrs[5] = {a.Q, a.K, a.V, a.O, a.L};
          for (int k = 0; k < 5; k++) {
            void *pp[5];
            memcpy(pp, ptrs, sizeof pp);
            pp[k] = NULL;
            TU_EXPECT_STATUS(ctx,
                             tg_flash_attn_train_fwd_bf16(ctx, pp[0], pp[1], pp[2], pp[3], pp[4],
                                                          &a.p, NULL, NULL, causal),
                             TG_ERR_NULL_ARG);
          }
          TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, a.Q, a.K, a.V, a.O, a.L,
                                                             NULL, NULL, NULL, causal),
                           TG_ERR_NULL_ARG);
          assert_int_equal(tg_flash_attn_train_fwd_bf16(NULL, a.Q, a.K, a.V, a.O, a.L, &a.p,
                                                        NULL, NULL, causal),
                           TG_ERR_NULL_ARG);
        } else {
          void *ptrs[9] = {a.Q, a.K, a.V, a.L, a.dO, a.Dv, a.dQ, a.dK, a.dV};
          for (int k = 0; k < 9; k++) {
            void *pp[9];
            memcpy(pp, ptrs, sizeof pp);
            pp[k] = NULL;
            TU_EXPECT_STATUS(ctx,
                             tg_flash_attn_train_bwd_bf16(
                                 ctx, pp[0], pp[1], pp[2], pp[3], pp[4], pp[5], pp[6], pp[7], pp[8], &a.p, NULL, NULL, causal),
                             TG_ERR_NULL_ARG);
          }
        }
        if (memcmp(sdQ, a.dQ, 4 * a.nq) || memcmp(sdK, a.dK, 4 * a.nk) ||
            memcmp(sdV, a.dV, 4 * a.nk) || memcmp(sO, a.O, 2 * a.nq) ||
            memcmp(sL, a.L, 4 * a.nrow))
          TU_FAIL("%s det %d causal %d: a refused call wrote an output", entry ? "fwd" : "bwd",
                  det, causal);
        tg_ctx_destroy(ctx);
      }
  free(sdQ), free(sdK), free(sdV), free(sO), free(sL);
  attn_env_free(&a);
}

static void test_params_init_and_ctx_refusals(void **state) {
  tg_attn_params p, snap;
  memset(&p, 0x5A, sizeof p);
  memcpy(&snap, &p, sizeof p);
  const int bad[][7] = {/* B, H, H_kv, qL, kL, D, status */
                        {0, 1, 1, 1, 1, 8, TG_ERR_BAD_SHAPE},  {1, 0, 1, 1, 1, 8, TG_ERR_BAD_SHAPE},
                        {1, 1, 0, 1, 1, 8, TG_ERR_BAD_SHAPE},  {1, 1, 1, 0, 1, 8, TG_ERR_BAD_SHAPE},
                        {1, 1, 1, 1, -3, 8, TG_ERR_BAD_SHAPE}, {1, 1, 1, 1, 1, 0, TG_ERR_BAD_SHAPE},
                        {1, 4, 3, 1, 1, 8, TG_ERR_BAD_SHAPE},  {1, 2, 4, 1, 1, 8, TG_ERR_BAD_SHAPE}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(tg_attn_params_init(&p, bad[i][0], bad[i][1], bad[i][2], bad[i][3],
                                         bad[i][4], bad[i][5], 1.0f),
                     bad[i][6]);
    assert_memory_equal(&p, &snap, sizeof p);
  }
  assert_int_equal(tg_attn_params_init(NULL, 1, 1, 1, 1, 1, 8, 1.0f), TG_ERR_NULL_ARG);

  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_isa(ctx, (tg_isa)99), TG_ERR_UNSUPPORTED);
  assert_int_equal(tg_ctx_get_isa(ctx), TG_ISA_PORTABLE); /* unchanged */
  TU_EXPECT_STATUS(ctx, tg_ctx_set_isa(ctx, (tg_isa)-1), TG_ERR_UNSUPPORTED);
  assert_int_equal(tg_ctx_get_isa(ctx), TG_ISA_PORTABLE);
  assert_int_equal(tg_ctx_set_isa(NULL, TG_ISA_PORTABLE), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, (tg_attn_schedule)2), TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, (tg_attn_schedule)-1), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_ATOMIC); /* unchanged */
  assert_int_equal(tg_ctx_set_attn_schedule(NULL, TG_ATTN_SCHEDULE_KV), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_get_attn_schedule(NULL), TG_ATTN_SCHEDULE_KV);
  assert_int_equal(tg_ctx_set_deterministic(NULL, 1), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_get_isa(NULL), TG_ISA_AUTO);
  assert_non_null(tg_ctx_last_error(NULL));
  assert_non_null(tg_status_str((tg_status)1234));
  assert_non_null(tg_isa_name((tg_isa)1234));
  tg_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------
 * 3. determinism of every accumulating output
 * ---------------------------------------------------------------------------- */
static const int det_threads[] = {1, 2, 3, 5, 5, 7};
enum { N_DET = sizeof det_threads / sizeof det_threads[0] };

/* Runs `run` (which fills the outputs from fixed inputs) at each thread count
 * and ISA in deterministic mode and checks every output bitwise against the
 * first run of that ISA. */
typedef void (*det_run)(tg_ctx *ctx, void *env);

static void check_det(const char *name, det_run run, void *env, outbuf *out, int nout) {
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int ii = 0; ii < nisa; ii++)
    for (int t = 0; t < N_DET; t++) {
      tg_ctx *ctx = tu_ctx(det_threads[t], isas[ii]);
      assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
      run(ctx, env);
      for (int o = 0; o < nout; o++) {
        if (t == 0)
          memcpy(out[o].snap, out[o].p, out[o].bytes);
        else if (memcmp(out[o].snap, out[o].p, out[o].bytes))
          TU_FAIL("%s: output %d with %d threads (isa %s, run %d) differs bitwise from 1 "
                  "thread",
                  name, o, det_threads[t], tg_isa_name(isas[ii]), t);
      }
      tg_ctx_destroy(ctx);
    }
}

typedef struct {
  attn_env a;
  float *dK0, *dV0;
  tg_attn_schedule sched; /* asked for; deterministic mode must use KV anyway */
} det_attn;

static void run_det_attn(tg_ctx *ctx, void *v) {
  det_attn *d = v;
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, d->sched), TG_OK);
  tu_poison_f32(d->a.dQ, d->a.nq);
  memcpy(d->a.dK, d->dK0, 4 * d->a.nk);
  memcpy(d->a.dV, d->dV0, 4 * d->a.nk);
  TU_EXPECT_STATUS(ctx, call_attn_bwd(ctx, &d->a), TG_OK);
}

typedef struct {
  row_env e;
  float *pre_gw, *pre_dw, pre_loss;
  int which; /* 0 fused rms, 1 embedding, 2 CE, 3 causal */
} det_rows;

static void run_det_rows(tg_ctx *ctx, void *v) {
  det_rows *d = v;
  row_env *e = &d->e;
  const int64_t n = (int64_t)e->rows * e->dim;
  tu_poison_f32(e->dx, n);
  switch (d->which) {
    case 0:
      memcpy(e->gw, d->pre_gw, 4 * e->dim);
      TU_EXPECT_STATUS(ctx, call_rms_fused(ctx, e), TG_OK);
      TU_EXPECT_STATUS(ctx, call_rms_dw(ctx, e), TG_OK);
      break;
    case 1:
      memcpy(e->gw, d->pre_gw, 4 * (int64_t)e->vocab * e->dim);
      TU_EXPECT_STATUS(ctx, call_embedding(ctx, e), TG_OK);
      break;
    case 2:
      *e->loss = d->pre_loss;
      TU_EXPECT_STATUS(ctx, call_ce(ctx, e), TG_OK);
      break;
    case 3:
      memcpy(e->gw, d->pre_gw, 2 * n);
      memcpy(e->dw, d->pre_dw, 2 * n);
      TU_EXPECT_STATUS(ctx, call_causal(ctx, e), TG_OK);
      break;
  }
}

static void test_deterministic_accumulators(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 90);
  /* FA-2 backward: GQA 3, causal, masked (with -inf), softcapping, some rows
   * seeing no key. Config 0 asks for the ATOMIC schedule (deterministic mode
   * must ignore it); config 1 has kL = 600 (10 key tiles): the KV schedule
   * splits the keys into ranges and sums dQ partials in a fixed order. */
  for (int cfg = 0; cfg < 2; cfg++) {
    det_attn da;
    attn_env_make(&da.a, &r, 2, 3, 1, 100, cfg ? 600 : 80, 24, 1, 1);
    da.sched = cfg ? TG_ATTN_SCHEDULE_KV : TG_ATTN_SCHEDULE_ATOMIC;
    da.a.p.softcapping = 15.0f;
    da.a.p.qL_off = cfg ? 300 : -10;
    da.dK0 = tu_alloc(4 * da.a.nk), da.dV0 = tu_alloc(4 * da.a.nk);
    tu_fill_f32(&r, da.dK0, da.a.nk, -1, 1);
    tu_fill_f32(&r, da.dV0, da.a.nk, -1, 1);
    { /* L from the forward, so P <= 1 and the gradients are meaningful */
      tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
      TU_EXPECT_STATUS(ctx, call_attn_fwd(ctx, &da.a), TG_OK);
      TU_EXPECT_STATUS(ctx, call_compute_d(ctx, &da.a), TG_OK);
      tg_ctx_destroy(ctx);
    }
    outbuf ao[3] = {OUT(da.a.dQ, 4 * da.a.nq), OUT(da.a.dK, 4 * da.a.nk),
                    OUT(da.a.dV, 4 * da.a.nk)};
    check_det(cfg ? "FA-2 backward dQ/dK/dV (KV, key ranges)"
                  : "FA-2 backward dQ/dK/dV (ATOMIC asked, deterministic)",
              run_det_attn, &da, ao, 3);
    assert_true(tu_all_finite(da.a.dK, da.a.nk) && tu_all_finite(da.a.dV, da.a.nk));
    for (int o = 0; o < 3; o++) free(ao[o].snap);
    free(da.dK0), free(da.dV0);
    attn_env_free(&da.a);
  }

  /* row kernels */
  det_rows d = {.e = {.rows = 777, .dim = 96, .vocab = 40}};
  row_env *e = &d.e;
  const int64_t n = (int64_t)e->rows * e->dim;
  e->x = tu_alloc(4 * n), e->w = tu_alloc(4 * n), e->dy = tu_alloc(4 * n);
  e->dx = tu_alloc(4 * n), e->dw = tu_alloc(4 * n), e->gw = tu_alloc(4 * n);
  e->r = tu_alloc(4 * n), e->loss = tu_alloc(4);
  d.pre_gw = tu_alloc(4 * n), d.pre_dw = tu_alloc(4 * n);
  e->ids = tu_alloc(4 * e->rows);
  tu_fill_f32(&r, e->x, n, -3, 3);
  tu_fill_f32(&r, e->w, n, -1, 1);
  tu_fill_f32(&r, e->dy, n, -1, 1);
  tu_fill_f32(&r, d.pre_gw, n, -1, 1);
  tu_fill_f32(&r, d.pre_dw, n, -1, 1);
  d.pre_loss = 1.25f;
  for (uint32_t t = 0; t < e->rows; t++) /* skewed ids: many repeats */
    e->ids[t] = (uint32_t)(tu_int(&r, 0, 3) == 0 ? tu_int(&r, 0, 39) : tu_int(&r, 0, 2));
  const struct {
    const char *name;
    int which;
    outbuf out[3];
    int nout;
  } k[] = {
      {"fused RMSNorm grad_input/grad_weight + split dw", 0,
       {OUT(e->dx, 4 * n), OUT(e->gw, 4 * e->dim), OUT(e->dw, 4 * e->dim)}, 3},
      {"embedding grad_weight", 1, {OUT(e->gw, 4 * (int64_t)e->vocab * e->dim)}, 1},
      {"cross-entropy loss/grad", 2, {OUT(e->loss, 4), OUT(e->dx, 4 * n)}, 2},
      {"causal attention grad_Q/grad_K/grad_V", 3,
       {OUT(e->dx, 4 * n), OUT(e->gw, 2 * n), OUT(e->dw, 2 * n)}, 3},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    d.which = k[i].which;
    if (d.which == 2) { /* CE reads x as logits, ids as targets (pad_id 1) */
      e->rows = 777, e->dim = 96;
      for (uint32_t t = 0; t < e->rows; t++) e->ids[t] = (uint32_t)tu_int(&r, 0, 95);
    }
    if (d.which == 3) e->rows = 200; /* causal: seq 200, 4 heads of 24 */
    outbuf out[3];
    memcpy(out, k[i].out, sizeof out);
    check_det(k[i].name, run_det_rows, &d, out, k[i].nout);
    if (d.which == 2) assert_true(isfinite(*e->loss) && *e->loss != d.pre_loss);
    for (int o = 0; o < k[i].nout; o++) free(k[i].out[o].snap);
  }
  free(e->x), free(e->w), free(e->dy), free(e->dx), free(e->dw), free(e->gw), free(e->r);
  free(e->loss), free(d.pre_gw), free(d.pre_dw), free(e->ids);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_memory_every_entry_point),
      cmocka_unit_test(test_attention_refusals_all_outputs),
      cmocka_unit_test(test_params_init_and_ctx_refusals),
      cmocka_unit_test(test_deterministic_accumulators),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
