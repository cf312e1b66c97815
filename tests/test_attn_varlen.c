/*
 * Varlen attention (tg_attn_varlen_fwd, _bwd, _bwd_step): packed documents.
 *
 * The contract is that each document is its own problem: with the plans
 * sized for one CPU (every document's share is then 1, as a dense call's
 * plan), each document's O, L, dQ, dK, dV, d_sinks are bitwise those of a
 * dense B = 1 call on its rows -- whose kernels the dense suites hold to f64
 * references -- on every ISA table, at 1, 2 and 3 threads, in deterministic
 * mode, for f32 and bf16 inputs, GQA, causal with len_q != len_k, windows,
 * softcap, sinks, dropout, Dv != D, each document's own additive mask (with
 * -inf rows: tg_attn_varlen.mask), documents of length 1 and empty ones.
 * With the plans for 16 CPUs (large documents split into key ranges and
 * query groups, the sums' second passes) the results are checked against
 * an f64 reference of the packed row with the bound below. Bad offsets are
 * refused with nothing written, and a NaN stays in its document.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"
#include "tilegrad_testing.h"

typedef struct {
  const char *name;
  int H, H_kv, D, Dv, causal, window, dtype, grad_dtype, precision;
  float softcap, dropout_p;
  int sinks, mask; /* mask: each document's own additive [len_q, len_k] */
  int n_docs;
  int lq[8], lk[8];
} vcase;

/* A packed problem: contiguous [total, heads, D] tensors. */
typedef struct {
  vcase c;
  int32_t cu_q[9], cu_k[9];
  int64_t tq, tk;
  size_t e; /* input element bytes */
  void *Q, *K, *V, *dO, *mask;
  float *sinks;
  tg_attn_params p;
  tg_attn_options opt;
  tg_attn_varlen docs;
} packed;

typedef struct {
  void *O, *dQ, *dK, *dV;
  float *L, *d_sinks;
} outs;

static void *fill(tu_rng *r, int dtype, int64_t n) {
  if (dtype == TG_DTYPE_F32) {
    float *x = tu_alloc(sizeof(float) * (size_t)n);
    tu_fill_f32(r, x, n, -1.5, 1.5);
    return x;
  }
  tg_bf16 *x = tu_alloc(sizeof(tg_bf16) * (size_t)n);
  tu_fill_bf16(r, x, n, -1.5, 1.5);
  return x;
}

static void set_strides(tg_attn_params *p, int64_t H, int64_t H_kv, int64_t D, int64_t Dv) {
  const int64_t q[3] = {0, D, H * D}, k[3] = {0, D, H_kv * D}, v[3] = {0, Dv, H_kv * Dv},
                o[3] = {0, Dv, H * Dv};
  memcpy(p->Q_strides, q, sizeof q), memcpy(p->K_strides, k, sizeof k);
  memcpy(p->V_strides, v, sizeof v), memcpy(p->O_strides, o, sizeof o);
}

static void build(packed *pk, const vcase *c, tu_rng *r) {
  memset(pk, 0, sizeof *pk);
  pk->c = *c;
  for (int d = 0; d < c->n_docs; d++) {
    pk->cu_q[d + 1] = pk->cu_q[d] + c->lq[d];
    pk->cu_k[d + 1] = pk->cu_k[d] + c->lk[d];
  }
  pk->tq = pk->cu_q[c->n_docs], pk->tk = pk->cu_k[c->n_docs];
  pk->e = c->dtype == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
  pk->Q = fill(r, c->dtype, pk->tq * c->H * c->D);
  pk->K = fill(r, c->dtype, pk->tk * c->H_kv * c->D);
  pk->V = fill(r, c->dtype, pk->tk * c->H_kv * c->Dv);
  pk->dO = fill(r, c->dtype, pk->tq * c->H * c->Dv);
  if (c->sinks) {
    pk->sinks = tu_alloc(sizeof(float) * (size_t)c->H);
    tu_fill_f32(r, pk->sinks, c->H, -1, 1);
  }
  assert_int_equal(tg_attn_params_init(&pk->p, 1, c->H, c->H_kv, (int)pk->tq, (int)pk->tk, c->D,
                                       (float)(1 / sqrt(c->D))),
                   TG_OK);
  if (c->softcap) pk->p.softcapping = c->softcap;
  set_strides(&pk->p, c->H, c->H_kv, c->D, c->Dv);
  pk->opt = (tg_attn_options){.dropout_p = c->dropout_p, .dropout_seed = 1234,
                              .dropout_offset = 77, .window = (uint32_t)c->window,
                              .v_head_dim = (uint32_t)c->Dv, .sinks = pk->sinks};
  if (c->mask) { /* values in [-2, 2], one in 8 -inf, each document's row 2 all -inf */
    int64_t n = 0;
    for (int d = 0; d < c->n_docs; d++) n += (int64_t)c->lq[d] * c->lk[d];
    float *m = tu_alloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t e = 0; e < n; e++) m[e] = tu_int(r, 0, 7) ? (float)tu_uniform(r, -2, 2) : -INFINITY;
    for (int d = 0, at = 0; d < c->n_docs; at += c->lq[d] * c->lk[d], d++)
      for (int k = 0; c->lq[d] > 2 && k < c->lk[d]; k++) m[at + 2 * c->lk[d] + k] = -INFINITY;
    if (c->dtype == TG_DTYPE_F32) {
      pk->mask = m;
    } else {
      tg_bf16 *b = tu_alloc(sizeof(tg_bf16) * (size_t)(n ? n : 1));
      for (int64_t e = 0; e < n; e++) b[e] = tg_f32_to_bf16(m[e]);
      free(m);
      pk->mask = b;
    }
  }
  pk->docs = (tg_attn_varlen){pk->cu_q, pk->cu_k, c->n_docs, 0, pk->mask};
}

static void destroy(packed *pk) {
  free(pk->Q), free(pk->K), free(pk->V), free(pk->dO), free(pk->sinks), free(pk->mask);
}

static outs alloc_outs(const packed *pk) {
  const vcase *c = &pk->c;
  const size_t ge = c->grad_dtype == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
  outs o = {tu_alloc(pk->e * (size_t)(pk->tq * c->H * c->Dv)),
            tu_alloc(ge * (size_t)(pk->tq * c->H * c->D)),
            tu_alloc(ge * (size_t)(pk->tk * c->H_kv * c->D)),
            tu_alloc(ge * (size_t)(pk->tk * c->H_kv * c->Dv)),
            tu_alloc(sizeof(float) * (size_t)(pk->tq * c->H)),
            tu_alloc(sizeof(float) * (size_t)c->H)};
  memset(o.O, 0xff, pk->e * (size_t)(pk->tq * c->H * c->Dv)); /* NaN in both types */
  memset(o.dQ, 0xff, ge * (size_t)(pk->tq * c->H * c->D));
  memset(o.dK, 0xff, ge * (size_t)(pk->tk * c->H_kv * c->D));
  memset(o.dV, 0xff, ge * (size_t)(pk->tk * c->H_kv * c->Dv));
  tu_poison_f32(o.L, pk->tq * c->H);
  memset(o.d_sinks, 0, sizeof(float) * (size_t)c->H);
  return o;
}

static void free_outs(outs *o) {
  free(o->O), free(o->dQ), free(o->dK), free(o->dV), free(o->L), free(o->d_sinks);
}

/* Every thread count, or with TG_TEST_SHORT (qemu, ASan) the last one only
 * (3: several threads and an odd count; the Release run takes them all). */
static int runs_at(int t) { return !tu_short() || t == tu_n_thread_counts - 1; }

static tg_ctx *make_ctx(int threads, int precision) {
  tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
  tg_ctx_set_deterministic(ctx, 1);
  assert_int_equal(tg_ctx_set_attn_precision(ctx, (tg_attn_precision)precision), TG_OK);
  return ctx;
}

/* The varlen forward and step into o. */
static void run_varlen(tg_ctx *ctx, const packed *pk, outs *o) {
  const vcase *c = &pk->c;
  tg_attn_options opt = pk->opt;
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, c->dtype, pk->Q, pk->K, pk->V, o->O, o->L,
                                           &pk->p, &pk->docs, c->causal, &opt),
                   TG_OK);
  opt.d_sinks = c->sinks ? o->d_sinks : NULL;
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_bwd_step(ctx, c->dtype, c->grad_dtype, pk->Q, pk->K,
                                                pk->V, o->O, o->L, pk->dO, o->dQ, o->dK, o->dV,
                                                &pk->p, &pk->docs, c->causal, &opt),
                   TG_OK);
}

/* Element bytes of the gradients. */
static size_t grad_bytes(const vcase *c) {
  return c->grad_dtype == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
}

/* Document d as a dense B = 1 call on its rows, compared bit for bit with
 * the packed results (L, dQ are [H, len] / [H, len, D] there, dK, dV
 * [H_kv, len, D]); empty documents against their contract. Returns the
 * mismatches. */
static int compare_doc(tg_ctx *ctx, const packed *pk, const outs *o, int d, uint64_t counter,
                       float *d_sinks_sum) {
  const vcase *c = &pk->c;
  const int64_t H = c->H, Hk = c->H_kv, D = c->D, Dv = c->Dv, lq = c->lq[d], lk = c->lk[d];
  const int64_t q0 = pk->cu_q[d], k0 = pk->cu_k[d];
  const size_t e = pk->e, ge = grad_bytes(c);
  int bad = 0;
  if (!lq || !lk) {
    /* no keys: O 0, L the sink or -inf, dQ 0; no queries: dK, dV 0 */
    for (int64_t i = 0; i < lq; i++)
      for (int64_t h = 0; h < H; h++) {
        const char *orow = (const char *)o->O + (size_t)(((q0 + i) * H + h) * Dv) * e;
        for (size_t b = 0; b < (size_t)Dv * e; b++) bad += orow[b] != 0;
        const float want = c->sinks ? pk->sinks[h] : -INFINITY;
        bad += memcmp(&o->L[h * pk->tq + q0 + i], &want, sizeof want) != 0;
        const char *g = (const char *)o->dQ + (size_t)(((q0 + i) * H + h) * D) * ge;
        for (size_t b = 0; b < (size_t)D * ge; b++) bad += g[b] != 0;
      }
    for (int64_t j = 0; j < (lq ? 0 : lk); j++) {
      const char *gk = (const char *)o->dK + (size_t)((k0 + j) * Hk * D) * ge;
      const char *gv = (const char *)o->dV + (size_t)((k0 + j) * Hk * Dv) * ge;
      for (size_t b = 0; b < (size_t)(Hk * D) * ge; b++) bad += gk[b] != 0;
      for (size_t b = 0; b < (size_t)(Hk * Dv) * ge; b++) bad += gv[b] != 0;
    }
    if (bad) printf("  [%s] empty document %d: %d bytes off\n", c->name, d, bad);
    return bad;
  }
  tg_attn_params p;
  assert_int_equal(tg_attn_params_init(&p, 1, (int)H, (int)Hk, (int)lq, (int)lk, (int)D,
                                       pk->p.scale),
                   TG_OK);
  p.softcapping = pk->p.softcapping;
  set_strides(&p, H, Hk, D, Dv);
  tg_attn_options opt = pk->opt;
  opt.dropout_offset = counter;
  void *O = tu_alloc(e * (size_t)(lq * H * Dv)), *dQ = tu_alloc(ge * (size_t)(lq * H * D));
  void *dK = tu_alloc(ge * (size_t)(lk * Hk * D)), *dV = tu_alloc(ge * (size_t)(lk * Hk * Dv));
  float *L = tu_alloc(sizeof(float) * (size_t)(lq * H));
  const void *Q = (const char *)pk->Q + (size_t)(q0 * H * D) * e;
  const void *K = (const char *)pk->K + (size_t)(k0 * Hk * D) * e;
  const void *V = (const char *)pk->V + (size_t)(k0 * Hk * Dv) * e;
  const void *dO = (const char *)pk->dO + (size_t)(q0 * H * Dv) * e;
  /* the document's mask as a dense [1, 1, len_q, len_k] one */
  int64_t m0 = 0;
  for (int j = 0; j < d; j++) m0 += (int64_t)c->lq[j] * c->lk[j];
  const tg_attn_mask_params mp = {{0, 0, lk}};
  const tg_attn_mask_params *mpp = pk->mask ? &mp : NULL;
  const void *mask = pk->mask ? (const char *)pk->mask + (size_t)m0 * e : NULL;
  TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, c->dtype, Q, K, V, O, L, &p, mpp, mask,
                                          c->causal, &opt),
                   TG_OK);
  opt.d_sinks = d_sinks_sum;
  TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_step(ctx, c->dtype, c->grad_dtype, Q, K, V, O, L, dO,
                                               dQ, dK, dV, &p, mpp, mask, c->causal, &opt),
                   TG_OK);
  bad += memcmp(O, (const char *)o->O + (size_t)(q0 * H * Dv) * e, e * (size_t)(lq * H * Dv)) != 0;
  for (int64_t h = 0; h < H; h++) {
    bad += memcmp(L + h * lq, o->L + h * pk->tq + q0, sizeof(float) * (size_t)lq) != 0;
    for (int64_t i = 0; i < lq; i++) /* dense dQ [H, lq, D], packed [total, H, D] */
      bad += memcmp((const char *)dQ + (size_t)((h * lq + i) * D) * ge,
                    (const char *)o->dQ + (size_t)(((q0 + i) * H + h) * D) * ge,
                    ge * (size_t)D) != 0;
  }
  for (int64_t h = 0; h < Hk; h++)
    for (int64_t j = 0; j < lk; j++) {
      bad += memcmp((const char *)dK + (size_t)((h * lk + j) * D) * ge,
                    (const char *)o->dK + (size_t)(((k0 + j) * Hk + h) * D) * ge,
                    ge * (size_t)D) != 0;
      bad += memcmp((const char *)dV + (size_t)((h * lk + j) * Dv) * ge,
                    (const char *)o->dV + (size_t)(((k0 + j) * Hk + h) * Dv) * ge,
                    ge * (size_t)Dv) != 0;
    }
  if (bad) printf("  [%s] document %d (%lld x %lld): %d rows differ\n", c->name, d,
                  (long long)lq, (long long)lk, bad);
  free(O), free(dQ), free(dK), free(dV), free(L);
  return bad;
}

static const vcase cases[] = {
    {"f32 causal gqa 2, ragged, length 1 and empty", 4, 2, 64, 64, 1, 0, TG_DTYPE_F32,
     TG_DTYPE_F32, 0, 0, 0, 0, 0, 5, {1, 0, 37, 130, 64}, {1, 0, 37, 130, 64}},
    {"bf16 causal qL != kL per document, window 16, softcap 30, bf16 grads", 4, 4, 32, 32, 1,
     16, TG_DTYPE_BF16, TG_DTYPE_BF16, 0, 30.0f, 0, 0, 0, 3, {5, 40, 17}, {9, 40, 33}},
    {"f32 full, Dv 32 != D 48, sinks, dropout 0.1", 2, 1, 48, 32, 0, 0, TG_DTYPE_F32,
     TG_DTYPE_F32, 0, 0, 0.1f, 1, 0, 4, {20, 3, 50, 1}, {24, 7, 50, 2}},
    {"bf16 mode, gqa 3, no-key and no-query documents", 6, 2, 64, 64, 1, 0, TG_DTYPE_BF16,
     TG_DTYPE_F32, TG_ATTN_PRECISION_BF16, 0, 0, 0, 0, 4, {33, 6, 0, 70}, {33, 0, 5, 90}},
    {"f32 documents' masks (-inf rows), gqa 2", 4, 2, 32, 32, 0, 0, TG_DTYPE_F32, TG_DTYPE_F32,
     0, 0, 0, 0, 1, 3, {40, 7, 128}, {33, 9, 128}},
    {"bf16 causal documents' masks, sinks", 2, 2, 64, 64, 1, 0, TG_DTYPE_BF16, TG_DTYPE_F32, 0,
     0, 0, 1, 1, 3, {16, 70, 5}, {16, 70, 9}},
};

/* Every document bitwise its own dense problem (plans for one CPU). */
static void test_documents_are_their_own_problems(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed());
  tg_testing_plan_cpus(1);
  int failures = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    packed pk;
    build(&pk, &cases[ci], &r);
    for (int t = 0; t < tu_n_thread_counts; t++) {
      if (!runs_at(t)) continue;
      tg_ctx *ctx = make_ctx(tu_thread_counts[t], cases[ci].precision);
      outs o = alloc_outs(&pk);
      run_varlen(ctx, &pk, &o);
      float *d_sinks = tu_alloc(sizeof(float) * (size_t)pk.c.H);
      memset(d_sinks, 0, sizeof(float) * (size_t)pk.c.H);
      uint64_t counter = pk.opt.dropout_offset;
      for (int d = 0; d < pk.c.n_docs; d++) {
        failures += compare_doc(ctx, &pk, &o, d, counter, pk.c.sinks ? d_sinks : NULL);
        counter += ((uint64_t)pk.c.H * (uint64_t)pk.c.lq[d] * (uint64_t)pk.c.lk[d] + 3) / 4;
      }
      /* d_sinks: the dense calls' sums in document order, f32 at each
       * call; the packed pass sums every row in f64: a bound, not bits */
      for (int h = 0; pk.c.sinks && h < pk.c.H; h++)
        if (!(fabs(d_sinks[h] - o.d_sinks[h]) <= 1e-5 * (1 + fabs(d_sinks[h])))) {
          printf("  [%s] d_sinks[%d] %g vs the dense calls' %g\n", pk.c.name, h,
                 (double)o.d_sinks[h], (double)d_sinks[h]);
          failures++;
        }
      free(d_sinks);
      free_outs(&o);
      tg_ctx_destroy(ctx);
    }
    destroy(&pk);
  }
  tu_plan_fixed();
  if (failures) TU_FAIL("%d mismatches against the documents' dense calls", failures);
}

/* --- the f64 reference of a packed row -------------------------------------
 * Each document's rows by the definition (f32 inputs; no dropout or sinks
 * here: those are the dense suites'), with each output's sum of absolute
 * terms a[]: |got - want| <= 4 * gamma(n) * a with n the terms of its
 * longest chain (D for a score, the document's keys for a softmax sum and
 * O, its gqa * len_q rows for dK, dV), gamma(n) = n u / (1 - n u), u = 2^-24;
 * 4: the score's, the softmax's and the product's roundings compose, each
 * within gamma of its own sum (the dense suites derive these per term). */
typedef struct {
  double *O, *L, *dQ, *dK, *dV;     /* values */
  double *aO, *adQ, *adK, *adV;     /* sums of |terms| */
} vref;

static double gam(double n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

static void reference(const packed *pk, vref *v) {
  const vcase *c = &pk->c;
  const int64_t H = c->H, Hk = c->H_kv, D = c->D, Dv = c->Dv, g = H / Hk;
  const float *Q = pk->Q, *K = pk->K, *V = pk->V, *dO = pk->dO;
  const double scale = pk->p.scale;
  v->O = calloc((size_t)(pk->tq * H * Dv), 8), v->aO = calloc((size_t)(pk->tq * H * Dv), 8);
  v->L = calloc((size_t)(pk->tq * H), 8);
  v->dQ = calloc((size_t)(pk->tq * H * D), 8), v->adQ = calloc((size_t)(pk->tq * H * D), 8);
  v->dK = calloc((size_t)(pk->tk * Hk * D), 8), v->adK = calloc((size_t)(pk->tk * Hk * D), 8);
  v->dV = calloc((size_t)(pk->tk * Hk * Dv), 8), v->adV = calloc((size_t)(pk->tk * Hk * Dv), 8);
  double *P = malloc(sizeof(double) * 4096), *dS = malloc(sizeof(double) * 4096);
  for (int d = 0; d < c->n_docs; d++) {
    const int64_t q0 = pk->cu_q[d], k0 = pk->cu_k[d], lq = c->lq[d], lk = c->lk[d];
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < lq; i++) {
        const int64_t hk = h / g, qi = (q0 + i) * H + h;
        double mx = -INFINITY, sum = 0, Dvec = 0;
        for (int64_t j = 0; j < lk; j++) {
          const int vis = !c->causal || j <= i + lk - lq;
          double s = 0;
          for (int64_t x = 0; x < D; x++) s += (double)Q[qi * D + x] * K[((k0 + j) * Hk + hk) * D + x];
          P[j] = vis ? s * scale : -INFINITY;
          if (P[j] > mx) mx = P[j];
        }
        for (int64_t j = 0; j < lk; j++) sum += P[j] = mx == -INFINITY ? 0 : exp(P[j] - mx);
        v->L[h * pk->tq + q0 + i] = sum ? mx + log(sum) : -INFINITY;
        for (int64_t j = 0; j < lk; j++) P[j] = sum ? P[j] / sum : 0;
        for (int64_t x = 0; x < Dv; x++) {
          double o = 0, a = 0;
          for (int64_t j = 0; j < lk; j++) {
            const double t = P[j] * V[((k0 + j) * Hk + hk) * Dv + x];
            o += t, a += fabs(t);
          }
          v->O[qi * Dv + x] = o, v->aO[qi * Dv + x] = a;
          Dvec += o * dO[qi * Dv + x];
        }
        for (int64_t j = 0; j < lk; j++) {
          double dp = 0;
          for (int64_t x = 0; x < Dv; x++) dp += (double)dO[qi * Dv + x] * V[((k0 + j) * Hk + hk) * Dv + x];
          dS[j] = P[j] * (dp - Dvec);
          const double adS = P[j] * (fabs(dp) + fabs(Dvec));
          for (int64_t x = 0; x < D; x++) {
            const int64_t kj = ((k0 + j) * Hk + hk) * D + x;
            v->dQ[qi * D + x] += scale * dS[j] * K[kj];
            v->adQ[qi * D + x] += scale * adS * fabs(K[kj]);
            v->dK[kj] += scale * dS[j] * Q[qi * D + x];
            v->adK[kj] += scale * adS * fabs(Q[qi * D + x]);
          }
          for (int64_t x = 0; x < Dv; x++) {
            const int64_t vj = ((k0 + j) * Hk + hk) * Dv + x;
            v->dV[vj] += P[j] * dO[qi * Dv + x];
            v->adV[vj] += P[j] * fabs(dO[qi * Dv + x]);
          }
        }
      }
  }
  free(P), free(dS);
}

static int check(const char *what, const float *got, const double *want, const double *a,
                 int64_t n, double terms) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const double bound = 4 * gam(terms) * a[i] + 0x1p-120;
    if (!(fabs(got[i] - want[i]) <= bound)) {
      if (bad++ < 3)
        printf("  %s[%lld] = %.9g, want %.9g (bound %.3g)\n", what, (long long)i,
               (double)got[i], want[i], bound);
    }
  }
  return bad;
}

/* Plans for 16 CPUs: the long document's keys split into ranges and query
 * groups, their second passes in the packed call; against f64. */
static void test_f32_against_reference(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 1);
  static const vcase big[] = {
      {"f32 causal gqa 2, a long document among short ones", 4, 2, 32, 32, 1, 0, TG_DTYPE_F32,
       TG_DTYPE_F32, 0, 0, 0, 0, 0, 4, {700, 3, 64, 1}, {700, 3, 64, 1}},
      {"f32 full, qL != kL", 2, 2, 16, 24, 0, 0, TG_DTYPE_F32, TG_DTYPE_F32, 0, 0, 0, 0, 0, 3,
       {300, 17, 40}, {260, 30, 41}},
  };
  int failures = 0;
  for (size_t ci = 0; ci < sizeof big / sizeof big[0]; ci++) {
    packed pk;
    build(&pk, &big[ci], &r);
    vref v;
    reference(&pk, &v);
    int64_t maxl = 0, maxq = 0;
    for (int d = 0; d < pk.c.n_docs; d++) {
      maxl = pk.c.lk[d] > maxl ? pk.c.lk[d] : maxl;
      maxq = pk.c.lq[d] > maxq ? pk.c.lq[d] : maxq;
    }
    const double fwd_terms = pk.c.D + maxl + pk.c.Dv + 8;
    const double bwd_terms = fwd_terms + (double)(pk.c.H / pk.c.H_kv) * maxq;
    for (int t = 0; t < tu_n_thread_counts; t++) {
      if (!runs_at(t)) continue;
      tg_ctx *ctx = make_ctx(tu_thread_counts[t], 0);
      outs o = alloc_outs(&pk);
      run_varlen(ctx, &pk, &o);
      const int64_t H = pk.c.H, Hk = pk.c.H_kv;
      failures += check("O", o.O, v.O, v.aO, pk.tq * H * pk.c.Dv, fwd_terms);
      failures += check("dQ", o.dQ, v.dQ, v.adQ, pk.tq * H * pk.c.D, bwd_terms);
      failures += check("dK", o.dK, v.dK, v.adK, pk.tk * Hk * pk.c.D, bwd_terms);
      failures += check("dV", o.dV, v.dV, v.adV, pk.tk * Hk * pk.c.Dv, bwd_terms);
      for (int64_t i = 0; i < pk.tq * H; i++)
        if (!(fabs(o.L[i] - v.L[i]) <= 4 * gam(fwd_terms) * (fabs(v.L[i]) + 1))) failures++;
      free_outs(&o);
      tg_ctx_destroy(ctx);
    }
    free(v.O), free(v.aO), free(v.L), free(v.dQ), free(v.adQ), free(v.dK), free(v.adK);
    free(v.dV), free(v.adV);
    destroy(&pk);
  }
  if (failures) TU_FAIL("%d elements out of bound", failures);
}

/* Bad offsets and shapes: refused with a message, nothing written. */
static void test_bad_input_writes_nothing(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 2);
  packed pk;
  build(&pk, &cases[0], &r);
  tg_ctx *ctx = make_ctx(2, 0);
  outs o = alloc_outs(&pk);
  const size_t o_bytes = pk.e * (size_t)(pk.tq * pk.c.H * pk.c.Dv);
  unsigned char *before = tu_alloc(o_bytes);
  memcpy(before, o.O, o_bytes);
  struct {
    const char *what;
    int32_t cu_q[6];
    int n_docs;
    tg_status want;
  } bad[] = {
      {"not monotone", {0, 1, 0, 38, 168, 232}, 5, TG_ERR_BAD_SHAPE},
      {"not from 0", {1, 1, 1, 38, 168, 232}, 5, TG_ERR_BAD_SHAPE},
      {"last != total", {0, 1, 1, 38, 168, 231}, 5, TG_ERR_BAD_SHAPE},
      {"past the tensor", {0, 1, 1, 38, 168, 300}, 5, TG_ERR_BAD_SHAPE},
      {"no documents", {0, 1, 1, 38, 168, 232}, 0, TG_ERR_BAD_SHAPE},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const tg_attn_varlen docs = {bad[i].cu_q, pk.cu_k, bad[i].n_docs, 0, NULL};
    TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, pk.c.dtype, pk.Q, pk.K, pk.V, o.O, o.L, &pk.p,
                                             &docs, 1, &pk.opt),
                     bad[i].want);
    TU_EXPECT_STATUS(ctx, tg_attn_varlen_bwd_step(ctx, pk.c.dtype, TG_DTYPE_F32, pk.Q, pk.K,
                                                  pk.V, pk.Q, o.L, pk.dO, o.dQ, o.dK, o.dV,
                                                  &pk.p, &docs, 1, &pk.opt),
                     bad[i].want);
    printf("  %s: %s\n", bad[i].what, tg_ctx_last_error(ctx));
  }
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, pk.c.dtype, pk.Q, pk.K, pk.V, o.O, o.L, &pk.p,
                                           NULL, 1, &pk.opt),
                   TG_ERR_NULL_ARG);
  tg_attn_params p2 = pk.p;
  p2.B = 2;
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, pk.c.dtype, pk.Q, pk.K, pk.V, o.O, o.L, &p2,
                                           &pk.docs, 1, &pk.opt),
                   TG_ERR_BAD_SHAPE);
  /* L over the offsets */
  const tg_attn_varlen alias = {(const int32_t *)o.L, pk.cu_k, pk.c.n_docs, 0, NULL};
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, pk.c.dtype, pk.Q, pk.K, pk.V, o.O, o.L, &pk.p,
                                           &alias, 1, &pk.opt),
                   TG_ERR_BAD_SHAPE); /* o.L holds NaNs: not an offset list from 0 */
  memcpy(o.L, pk.cu_q, sizeof pk.cu_q);
  TU_EXPECT_STATUS(ctx, tg_attn_varlen_fwd(ctx, pk.c.dtype, pk.Q, pk.K, pk.V, o.O, o.L, &pk.p,
                                           &alias, 1, &pk.opt),
                   TG_ERR_ALIAS);
  assert_memory_equal(before, o.O, o_bytes);
  free(before);
  free_outs(&o);
  tg_ctx_destroy(ctx);
  destroy(&pk);
}

/* A NaN in one document's queries reaches that document's O only. */
static void test_nan_stays_in_its_document(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 3);
  packed pk;
  build(&pk, &cases[0], &r);
  float *Q = pk.Q;
  const int64_t H = pk.c.H, D = pk.c.D, Dv = pk.c.Dv;
  Q[(pk.cu_q[3] + 5) * H * D] = NAN; /* document 3, row 5, head 0 */
  tg_ctx *ctx = make_ctx(2, 0);
  outs o = alloc_outs(&pk);
  run_varlen(ctx, &pk, &o);
  const float *O = o.O;
  int leaks = 0, nan_in_doc = 0;
  for (int64_t t = 0; t < pk.tq; t++)
    for (int64_t x = 0; x < H * Dv; x++) {
      const int in_doc = t >= pk.cu_q[3] && t < pk.cu_q[4];
      if (isnan(O[t * H * Dv + x])) in_doc ? nan_in_doc++ : leaks++;
    }
  assert_int_equal(leaks, 0);
  assert_true(nan_in_doc > 0);
  const float *dK = o.dK;
  for (int64_t j = 0; j < pk.tk * pk.c.H_kv * D; j++) {
    const int in_doc = j / (pk.c.H_kv * D) >= pk.cu_k[3] && j / (pk.c.H_kv * D) < pk.cu_k[4];
    if (!in_doc) assert_false(isnan(dK[j]));
  }
  free_outs(&o);
  tg_ctx_destroy(ctx);
  destroy(&pk);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_documents_are_their_own_problems),
      cmocka_unit_test(test_f32_against_reference),
      cmocka_unit_test(test_bad_input_writes_nothing),
      cmocka_unit_test(test_nan_stays_in_its_document),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
