/* tg_causal_attention_backward (contract section 10): token-major, GQA,
 * scale 1/sqrt(D), causal, softmax recomputed from Q and K; grad_Q writes,
 * grad_K / grad_V accumulate.
 *
 * Reference: f64, written from the equations (tests/common/refs.c, shared
 * with tests/test_nan_inputs.c), per (position i, head h):
 *   s_j = scale q.k_j, P = softmax(s), dP_j = dO.v_j, delta = dO.O (O = sum_j P_j v_j,
 *   so delta = sum_j P_j dP_j),
 *   dS_j = P_j (dP_j - delta), dQ = scale sum_j dS_j k_j,
 *   dK_j += scale dS_j q, dV_j += P_j dO.
 *
 * The kernel (kernels/causal_attention.c) runs the FA-2 engine: pass 1 is
 * the training forward's tile loop, giving each row's logsumexp L and
 * delta = dO . O; pass 2 the FA-2 backward with P = exp(s - L).
 *
 * Tolerance (u = 2^-24), a first-order forward error bound of that
 * algorithm, propagated through the steps and evaluated per element in f64
 * (gamma_n ~ n*u for a sum of n terms, applied to the sum of the terms'
 * magnitudes). With n = i + 1 visible keys, T = ceil(n / 16) key tiles at
 * most (every ISA's attn_bk is >= 16; isa/tuning.h has 48 and 64), R = max_j
 * (m - s_j), m = max_j s_j, and exp within 2 ulp (4u):
 *   es_j  = (D + 2) u A_j,  A_j = scale sum_d |q_d k_jd|, Es = max_j es_j
 *           (dot of D terms, times the rounded f32 scale)
 *   L     = m + log sum_j exp(s_j - m), in pass 1 from the online softmax:
 *           each term exp(s_j - m_t) rounds s_j - m_t (<= R u) and the exp
 *           (4u); each of <= T rescales exp(m_old - m_new) rounds its
 *           difference (these telescope to <= R u in all), the exp (4u) and
 *           the product (u); the n-term sum (n u): l within (2R + n + 5T + 4) u
 *           relatively; log(l) (2u ln n), m + log(l) (u |L|), and s moved by
 *           Es moves L by <= Es:
 *           |dL| <= Es + (2R + n + 5T + 4 + 2 ln n + |L|) u
 *   rho   = 2 Es + (3R + n + 5T + 8 + 3 ln n + |L|) u
 *           relative error of P_j = exp(s_j - L) in pass 2: es_j, dL, the
 *           rounding of s_j - L (<= (R + ln n) u) and the exp (4u)
 *   edp_j = (D + 1) u M_j,  M_j = sum_d |dO_d v_jd|
 *   edelta= (rho + (n + T + D + 2) u) sum_j P_j M_j
 *           delta = dO . O with O from pass 1: its weights within rho, the
 *           n-term P.V sums with <= T rescales and the 1/l scaling
 *           ((n + T + 2) u sum_j P_j |v_jd|), the D-term dot (D u)
 *   eds_j = rho P_j |dP_j - delta| + P_j (edp_j + edelta) + 3u P_j (|dP_j| + |delta|)
 *           (dP_j - delta, the product by P_j and by scale)
 *   dQ_d: scale sum_j eds_j |k_jd|         + (n + 3) u scale sum_j |dS_j k_jd|
 *   dK_d: scale sum eds |q_d|              + (N + 3) u (|prefill| + sum scale |dS q_d|)
 *   dV_d: sum rho P |dO_d|                 + (N + 2) u (|prefill| + sum P |dO_d|)
 * where N is the number of (i, h) contributions to that key row; the sums
 * over key tiles and the dQ partials of the key ranges are n - 1 (N)
 * additions in some fixed order, which gamma_n (gamma_N) covers. We allow
 * twice the first-order bound (second-order terms, the reference's own
 * rounding).
 *
 * Changed with the engine (was: the scalar two-pass kernel, P = exp(s - m)/Z
 * with rho = 2 Es + (2R + n + 5) u and edelta = sum_j P_j (rho |dP_j| +
 * edp_j) + (n + 1) u sum_j P_j |dP_j|, eds with 2u): L now carries the
 * online softmax's rescales and two exp (T, R and |L| terms), and delta is
 * computed from O, so its bound weighs M_j rather than |dP_j|. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"

typedef struct {
  uint32_t S, H, Hkv, D;
  double qk_range; /* Q and K uniform in +-qk_range */
} ca_case;

typedef struct {
  float *dO, *Q, *K, *V, *preK, *preV;
  double *wQ, *bQ, *wK, *bK, *wV, *bV;
} ca_data;

static void reference(const ca_case *c, ca_data *t) {
  ref_causal_attention_backward(t->dO, t->Q, t->K, t->V, t->preK, t->preV, c->S, c->H, c->Hkv,
                                c->D, 0, t->wQ, t->bQ, t->wK, t->bK, t->wV, t->bV);
}

static void make_data(const ca_case *c, uint64_t k, ca_data *t) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t nq = (int64_t)c->S * c->H * c->D, nk = (int64_t)c->S * c->Hkv * c->D;
  t->dO = tu_alloc(nq * sizeof(float));
  t->Q = tu_alloc(nq * sizeof(float));
  t->K = tu_alloc(nk * sizeof(float));
  t->V = tu_alloc(nk * sizeof(float));
  t->preK = tu_alloc(nk * sizeof(float));
  t->preV = tu_alloc(nk * sizeof(float));
  tu_fill_f32(&rng, t->dO, nq, -1.0, 1.0);
  tu_fill_f32(&rng, t->Q, nq, -c->qk_range, c->qk_range);
  tu_fill_f32(&rng, t->K, nk, -c->qk_range, c->qk_range);
  tu_fill_f32(&rng, t->V, nk, -1.0, 1.0);
  for (int64_t e = 0; e < nk; e++) { /* non-zero prefill, mixed signs */
    t->preK[e] = (float)(tu_next(&rng) & 1 ? 1 : -1) * (float)tu_uniform(&rng, 0.1, 1.0);
    t->preV[e] = (float)(tu_next(&rng) & 1 ? 1 : -1) * (float)tu_uniform(&rng, 0.1, 1.0);
  }
  t->wQ = t->bQ = t->wK = t->bK = t->wV = t->bV = NULL;
}

static void free_data(ca_data *t) {
  free(t->dO); free(t->Q); free(t->K); free(t->V); free(t->preK); free(t->preV);
  free(t->wQ); free(t->bQ); free(t->wK); free(t->bK); free(t->wV); free(t->bV);
}

static void run_case(const ca_case *c, uint64_t k) {
  ca_data t;
  make_data(c, k, &t);
  const int64_t nq = (int64_t)c->S * c->H * c->D, nk = (int64_t)c->S * c->Hkv * c->D;
  t.wQ = tu_alloc(nq * sizeof(double));
  t.bQ = tu_alloc(nq * sizeof(double));
  t.wK = tu_alloc(nk * sizeof(double));
  t.bK = tu_alloc(nk * sizeof(double));
  t.wV = tu_alloc(nk * sizeof(double));
  t.bV = tu_alloc(nk * sizeof(double));
  reference(c, &t);

  float *gQ = tu_alloc(nq * sizeof(float));
  float *gK = tu_alloc(nk * sizeof(float)), *gV = tu_alloc(nk * sizeof(float));
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  char what[200];
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++)
      for (int det = 0; det < 2; det++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tg_ctx_set_deterministic(ctx, det);
        tu_poison_f32(gQ, nq);
        memcpy(gK, t.preK, nk * sizeof(float));
        memcpy(gV, t.preV, nk * sizeof(float));
        TU_EXPECT_STATUS(ctx,
                         tg_causal_attention_backward(ctx, t.dO, t.Q, t.K, t.V, gQ, gK, gV,
                                                      c->S, c->H, c->Hkv, c->D),
                         TG_OK);
        snprintf(what, sizeof what,
                 "causal S=%u H=%u Hkv=%u D=%u range=%g threads=%d isa=%s det=%d", c->S,
                 c->H, c->Hkv, c->D, c->qk_range, tu_thread_counts[ti],
                 tg_isa_name(isas[ii]), det);
        int ok = tu_check_bound("grad_Q", gQ, t.wQ, t.bQ, nq);
        ok &= tu_check_bound("grad_K", gK, t.wK, t.bK, nk);
        ok &= tu_check_bound("grad_V", gV, t.wV, t.bV, nk);
        if (!ok) TU_FAIL("%s", what);
        tg_ctx_destroy(ctx);
      }
  free(gQ);
  free(gK);
  free(gV);
  free_data(&t);
}

static void test_causal_small(void **state) {
  const ca_case cases[] = {
      {1, 1, 1, 1, 1.0},    /* one position: P = 1, dS = 0 */
      {7, 4, 2, 5, 1.0},    /* GQA 2, head_dim not a multiple of 8 */
      {33, 6, 3, 17, 1.0},  /* a key block boundary (32) crossed by one */
      {64, 8, 1, 64, 1.0},  /* MQA */
      {100, 3, 3, 24, 1.0}, /* MHA */
      {40, 2, 1, 32, 4.0},  /* peaked softmax: scores spread over tens */
      {1, 4, 2, 64, 1.0},   /* seq = 1 with GQA */
      {150, 4, 2, 8, 1.0},  /* ragged (not a multiple of 48 or 64), D = 8 */
      {97, 2, 1, 256, 1.0}, /* ragged, D = 256 */
      {200, 6, 2, 40, 2.0}, /* several key tiles, GQA 3 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 20 + i);
}

/* Longer than the Metal kernel's 2048-position threadgroup cap. */
static void test_causal_long(void **state) {
  const ca_case c = {2100, 2, 1, 4, 1.0};
  run_case(&c, 40);
}

/* ctx->deterministic: grad_Q, grad_K, grad_V bitwise identical across thread
 * counts 1, 2, 3, 5. */
static void check_deterministic(const ca_case c, uint64_t seed) {
  ca_data t;
  make_data(&c, seed, &t);
  const int64_t nq = (int64_t)c.S * c.H * c.D, nk = (int64_t)c.S * c.Hkv * c.D;
  float *gQ = tu_alloc(nq * sizeof(float)), *gK = tu_alloc(nk * sizeof(float));
  float *gV = tu_alloc(nk * sizeof(float)), *fQ = tu_alloc(nq * sizeof(float));
  float *fK = tu_alloc(nk * sizeof(float)), *fV = tu_alloc(nk * sizeof(float));
  const int threads[] = {1, 2, 3, 5};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ii = 0; ii < n_isas; ii++)
    for (int ti = 0; ti < 4; ti++) {
      tg_ctx *ctx = tu_ctx(threads[ti], isas[ii]);
      tg_ctx_set_deterministic(ctx, 1);
      tu_poison_f32(gQ, nq);
      memcpy(gK, t.preK, nk * sizeof(float));
      memcpy(gV, t.preV, nk * sizeof(float));
      TU_EXPECT_STATUS(ctx,
                       tg_causal_attention_backward(ctx, t.dO, t.Q, t.K, t.V, gQ, gK, gV, c.S,
                                                    c.H, c.Hkv, c.D),
                       TG_OK);
      if (ti == 0) {
        memcpy(fQ, gQ, nq * sizeof(float));
        memcpy(fK, gK, nk * sizeof(float));
        memcpy(fV, gV, nk * sizeof(float));
      } else {
        if (memcmp(fQ, gQ, nq * sizeof(float)))
          TU_FAIL("grad_Q with %d threads (isa %s) differs from 1 thread", threads[ti],
                  tg_isa_name(isas[ii]));
        if (memcmp(fK, gK, nk * sizeof(float)))
          TU_FAIL("grad_K with %d threads (isa %s) differs from 1 thread", threads[ti],
                  tg_isa_name(isas[ii]));
        if (memcmp(fV, gV, nk * sizeof(float)))
          TU_FAIL("grad_V with %d threads (isa %s) differs from 1 thread", threads[ti],
                  tg_isa_name(isas[ii]));
      }
      tg_ctx_destroy(ctx);
    }
  free(gQ); free(gK); free(gV); free(fQ); free(fK); free(fV);
  free_data(&t);
}

static void test_causal_deterministic(void **state) {
  check_deterministic((ca_case){300, 4, 2, 16, 1.0}, 50);
  /* 11 (64-key) to 15 (48-key) tiles: the backward splits them into key ranges whose dQ
   * partials are summed afterwards */
  check_deterministic((ca_case){700, 4, 2, 16, 1.0}, 51);
}

static void test_causal_bad_input(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  enum { S = 3, H = 4, HKV = 2, D = 2, NQ = S * H * D, NK = S * HKV * D };
  float dO[NQ], Q[NQ], K[NK], V[NK], gQ[NQ], gK[NK], gV[NK];
  float sQ[NQ], sK[NK], sV[NK];
  for (int i = 0; i < NQ; i++) dO[i] = Q[i] = gQ[i] = (float)i * 0.25f;
  for (int i = 0; i < NK; i++) K[i] = V[i] = gK[i] = (float)i, gV[i] = -(float)i;
  memcpy(sQ, gQ, sizeof gQ);
  memcpy(sK, gK, sizeof gK);
  memcpy(sV, gV, sizeof gV);
#define CALL(c, a0, a1, a2, a3, a4, a5, a6, s, h, hk, d) \
  tg_causal_attention_backward(c, a0, a1, a2, a3, a4, a5, a6, s, h, hk, d)
  assert_int_equal(CALL(NULL, dO, Q, K, V, gQ, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, NULL, Q, K, V, gQ, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, NULL, K, V, gQ, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, NULL, V, gQ, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, NULL, gQ, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, NULL, gK, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, NULL, gV, S, H, HKV, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, NULL, S, H, HKV, D), TG_ERR_NULL_ARG);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "grad_V"));
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, 0, H, HKV, D), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, S, 0, HKV, D), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, S, H, 0, D), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, S, H, HKV, 0), TG_ERR_BAD_SHAPE);
  /* GQA: n_heads must be a multiple of n_kv_heads */
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, S, 6, 4, 1), TG_ERR_BAD_SHAPE);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "n_kv_heads = 4"));
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, S, 2, 4, D), TG_ERR_BAD_SHAPE);
  /* Q [2^32-1, (2^32-1)*(2^32-1)] overflows; so do the row statistics
   * [2, n_heads, seq] for seq = n_heads = 2^30, head_dim = 1 although Q fits. */
  TU_EXPECT_STATUS(ctx,
                   CALL(ctx, dO, Q, K, V, gQ, gK, gV, 0xFFFFFFFFu, 0xFFFFFFFFu, 1, 0xFFFFFFFFu),
                   TG_ERR_OVERFLOW);
  TU_EXPECT_STATUS(ctx, CALL(ctx, dO, Q, K, V, gQ, gK, gV, 1u << 30, 1u << 30, 1, 1),
                   TG_ERR_OVERFLOW);
#undef CALL
  assert_memory_equal(gQ, sQ, sizeof gQ);
  assert_memory_equal(gK, sK, sizeof gK);
  assert_memory_equal(gV, sV, sizeof gV);
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  tu_plan_fixed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_causal_small),
      cmocka_unit_test(test_causal_long),
      cmocka_unit_test(test_causal_deterministic),
      cmocka_unit_test(test_causal_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
