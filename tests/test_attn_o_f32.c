/*
 * tg_attn_options.flags and its flag TG_ATTN_OPT_O_F32 (docs/KERNELS.md,
 * "CPU extension"): tg_attn_train_fwd with bf16 inputs stores O as f32.
 *
 * What is checked (each at 1, 2 and 3 threads on the ISA under test):
 *
 *  * the f32 O is the value the bf16 O is rounded from: rounding it to bf16
 *    (RNE, tg_f32_to_bf16) gives the flagless bf16 O bit for bit, and L is
 *    bitwise the same, over GQA, causal with qL_off, an additive mask,
 *    softcapping, dropout and the three precision modes; O through strides
 *    (token-major rows with a gap) counts them in elements, the gaps are not
 *    written;
 *  * with dtype f32 the flag changes nothing (bitwise);
 *  * the backward and tg_attn_dropout_keep ignore it (bitwise);
 *  * a flags word with any other bit is TG_ERR_BAD_PARAMS from the three
 *    entry points that take options, naming "flags", with nothing written;
 *  * the aliasing check counts the f32 O's extent: an L placed past the
 *    bf16 extent but inside the f32 one is TG_ERR_ALIAS, nothing written.
 *
 * The comparisons are exact: the flag only changes the store of the row the
 * kernel has computed in f32 either way.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"

typedef struct {
  int B, H, H_kv, qL, kL, D;
  int causal, qL_off;
  int mask;       /* additive bf16 mask [B, H, qL, kL] */
  float softcap;  /* 1 = off */
  float dropout_p;
  tg_attn_precision precision;
  int token_major; /* O (and Q) as [B, qL, H, D + 8]: strided rows with a gap */
} cfg;

static const cfg CASES[] = {
    {1, 2, 2, 37, 53, 16, 0, 0, 0, 1.0f, 0.0f, TG_ATTN_PRECISION_EXACT, 0},
    {2, 4, 2, 70, 45, 32, 1, 45 - 70 + 9, 0, 1.0f, 0.0f, TG_ATTN_PRECISION_EXACT, 1},
    {1, 6, 3, 33, 80, 64, 1, -5, 1, 5.0f, 0.0f, TG_ATTN_PRECISION_SPLIT, 0},
    {2, 2, 1, 64, 64, 8, 0, 0, 1, 1.0f, 0.2f, TG_ATTN_PRECISION_BF16, 1},
    {1, 8, 2, 129, 97, 128, 1, 0, 0, 30.0f, 0.1f, TG_ATTN_PRECISION_EXACT, 0},
};

/* One problem's buffers: inputs of type dtype, contiguous except Q / O rows
 * when token_major. */
typedef struct {
  cfg c;
  tg_dtype dt;
  size_t es;            /* element size of the inputs */
  tg_attn_params p;
  tg_attn_mask_params mp;
  int64_t nQ, nK, nL, nM; /* elements of Q / O (with gaps), K / V, L, mask */
  void *Q, *K, *V, *mask;
  tg_attn_options opt;
} prob;

static void fill_inputs(tu_rng *r, void *x, int64_t n, tg_dtype dt, double lo, double hi) {
  if (dt == TG_DTYPE_BF16)
    tu_fill_bf16(r, x, n, lo, hi);
  else
    tu_fill_f32(r, x, n, lo, hi);
}

static prob make(const cfg *c, tg_dtype dt, tu_rng *r) {
  prob pb = {.c = *c, .dt = dt, .es = dt == TG_DTYPE_BF16 ? 2 : 4};
  tg_attn_params_init(&pb.p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                      1.0f / sqrtf((float)c->D));
  pb.p.qL_off = c->qL_off;
  pb.p.softcapping = c->softcap;
  const int64_t row = c->D + 8;
  if (c->token_major) { /* [B, qL, H, D + 8]: stride along the heads D + 8 */
    const int64_t s[3] = {(int64_t)c->qL * c->H * row, row, (int64_t)c->H * row};
    memcpy(pb.p.Q_strides, s, sizeof s);
    memcpy(pb.p.O_strides, s, sizeof s);
    pb.nQ = (int64_t)c->B * c->qL * c->H * row;
  } else {
    pb.nQ = (int64_t)c->B * c->H * c->qL * c->D;
  }
  pb.nK = (int64_t)c->B * c->H_kv * c->kL * c->D;
  pb.nL = (int64_t)c->B * c->H * c->qL;
  pb.nM = pb.nL * c->kL;
  pb.Q = tu_alloc(pb.es * pb.nQ);
  pb.K = tu_alloc(pb.es * pb.nK);
  pb.V = tu_alloc(pb.es * pb.nK);
  fill_inputs(r, pb.Q, pb.nQ, dt, -2, 2);
  fill_inputs(r, pb.K, pb.nK, dt, -2, 2);
  fill_inputs(r, pb.V, pb.nK, dt, -1, 1);
  if (c->mask) {
    const int64_t s[3] = {(int64_t)c->H * c->qL * c->kL, (int64_t)c->qL * c->kL, c->kL};
    memcpy(pb.mp.M_strides, s, sizeof s);
    pb.mask = tu_alloc(pb.es * pb.nM);
    fill_inputs(r, pb.mask, pb.nM, dt, -3, 1);
  }
  pb.opt.dropout_p = c->dropout_p;
  pb.opt.dropout_seed = 0x0123456789abcdefull;
  return pb;
}

static void destroy(prob *pb) {
  free(pb->Q), free(pb->K), free(pb->V), free(pb->mask);
}

static tg_status fwd(tg_ctx *ctx, const prob *pb, void *O, float *L, uint32_t flags) {
  tg_attn_options o = pb->opt;
  o.flags = flags;
  return tg_attn_train_fwd(ctx, pb->dt, pb->Q, pb->K, pb->V, O, L, &pb->p,
                           pb->c.mask ? &pb->mp : NULL, pb->mask, pb->c.causal, &o);
}

/* Every stored row of O: (b, h, i) -> element offset through O_strides. */
static int64_t o_row(const prob *pb, int b, int h, int i) {
  const int64_t *s = pb->p.O_strides;
  return b * s[0] + h * s[1] + i * s[2];
}

static void test_o_f32_rounds_to_the_bf16_o(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed());
  for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
    prob pb = make(&CASES[ci], TG_DTYPE_BF16, &r);
    const cfg *c = &pb.c;
    tg_bf16 *Ob = tu_alloc(2 * pb.nQ);
    float *Of = tu_alloc(4 * pb.nQ), *Lb = tu_alloc(4 * pb.nL), *Lf = tu_alloc(4 * pb.nL);
    for (int t = 0; t < tu_n_thread_counts; t++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[t], TG_ISA_AUTO);
      assert_int_equal(tg_ctx_set_attn_precision(ctx, c->precision), TG_OK);
      memset(Ob, 0xAB, 2 * pb.nQ);
      tu_poison_f32(Of, pb.nQ); /* the gaps keep NaN: nothing writes there */
      TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, Ob, Lb, 0), TG_OK);
      TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, Of, Lf, TG_ATTN_OPT_O_F32), TG_OK);
      if (memcmp(Lb, Lf, 4 * pb.nL))
        fail_msg("case %zu, %d threads: L differs with TG_ATTN_OPT_O_F32", ci,
                 tu_thread_counts[t]);
      int64_t stored = 0;
      for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
          for (int i = 0; i < c->qL; i++)
            for (int d = 0; d < c->D; d++) {
              const int64_t k = o_row(&pb, b, h, i) + d;
              if (tg_f32_to_bf16(Of[k]) != Ob[k])
                fail_msg("case %zu, %d threads: O[%d,%d,%d,%d]: f32 %.9g rounds to 0x%04x, "
                         "the bf16 O is 0x%04x",
                         ci, tu_thread_counts[t], b, h, i, d, (double)Of[k],
                         tg_f32_to_bf16(Of[k]), Ob[k]);
              stored++;
            }
      int64_t nan_left = 0; /* the gaps between token-major rows */
      for (int64_t k = 0; k < pb.nQ; k++) nan_left += isnan(Of[k]);
      assert_int_equal(nan_left, pb.nQ - stored);
      tg_ctx_destroy(ctx);
    }
    free(Ob), free(Of), free(Lb), free(Lf);
    destroy(&pb);
  }
}

static void test_f32_dtype_unchanged_by_the_flag(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 1);
  for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
    prob pb = make(&CASES[ci], TG_DTYPE_F32, &r);
    float *O0 = tu_alloc(4 * pb.nQ), *O1 = tu_alloc(4 * pb.nQ);
    float *L0 = tu_alloc(4 * pb.nL), *L1 = tu_alloc(4 * pb.nL);
    memset(O0, 0, 4 * pb.nQ), memset(O1, 0, 4 * pb.nQ);
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, O0, L0, 0), TG_OK);
    TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, O1, L1, TG_ATTN_OPT_O_F32), TG_OK);
    assert_memory_equal(O0, O1, 4 * pb.nQ);
    assert_memory_equal(L0, L1, 4 * pb.nL);
    tg_ctx_destroy(ctx);
    free(O0), free(O1), free(L0), free(L1);
    destroy(&pb);
  }
}

/* The backward on the cases with contiguous Q and dO (no token-major rows). */
static void test_backward_and_keep_ignore_the_flag(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 2);
  const size_t cases[] = {0, 2, 4};
  for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
    const cfg *c = &CASES[cases[n]];
    prob pb = make(c, TG_DTYPE_BF16, &r);
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    tg_ctx_set_deterministic(ctx, 1);
    tg_bf16 *O = tu_alloc(2 * pb.nQ), *dO = tu_alloc(2 * pb.nQ);
    float *L = tu_alloc(4 * pb.nL), *Dv = tu_alloc(4 * pb.nL);
    tu_fill_bf16(&r, dO, pb.nQ, -1, 1);
    TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, O, L, 0), TG_OK);
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_bwd_compute_d(ctx, pb.dt, O, dO, Dv, c->B, c->H, c->qL, c->D),
                     TG_OK);
    float *g[2][3];
    const int64_t ng[3] = {pb.nQ, pb.nK, pb.nK};
    for (int f = 0; f < 2; f++) {
      for (int j = 0; j < 3; j++) g[f][j] = calloc((size_t)ng[j], 4);
      tg_attn_options o = pb.opt;
      o.flags = f ? TG_ATTN_OPT_O_F32 : 0;
      TU_EXPECT_STATUS(ctx,
                       tg_attn_train_bwd(ctx, pb.dt, pb.Q, pb.K, pb.V, L, dO, Dv, g[f][0], g[f][1],
                                         g[f][2], &pb.p, c->mask ? &pb.mp : NULL, pb.mask,
                                         c->causal, &o),
                       TG_OK);
    }
    for (int j = 0; j < 3; j++) {
      assert_memory_equal(g[0][j], g[1][j], 4 * (size_t)ng[j]);
      free(g[0][j]), free(g[1][j]);
    }
    uint8_t *k0 = tu_alloc((size_t)pb.nM), *k1 = tu_alloc((size_t)pb.nM);
    tg_attn_options o = pb.opt;
    TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, &o, c->B, c->H, c->qL, c->kL, k0), TG_OK);
    o.flags = TG_ATTN_OPT_O_F32;
    TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, &o, c->B, c->H, c->qL, c->kL, k1), TG_OK);
    assert_memory_equal(k0, k1, (size_t)pb.nM);
    free(k0), free(k1), free(O), free(dO), free(L), free(Dv);
    tg_ctx_destroy(ctx);
    destroy(&pb);
  }
}

static void test_undefined_flags_refused(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 3);
  prob pb = make(&CASES[0], TG_DTYPE_BF16, &r);
  const cfg *c = &pb.c;
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  float *O = tu_alloc(4 * pb.nQ), *L = tu_alloc(4 * pb.nL), *dQ = tu_alloc(4 * pb.nQ);
  float *dK = tu_alloc(4 * pb.nK), *dV = tu_alloc(4 * pb.nK), *Dv = tu_alloc(4 * pb.nL);
  uint8_t *keep = tu_alloc((size_t)pb.nM);
  float *outs[] = {O, L, dQ, dK, dV};
  const int64_t n[] = {pb.nQ, pb.nL, pb.nQ, pb.nK, pb.nK};
  for (int j = 0; j < 5; j++) tu_fill_f32(&r, outs[j], n[j], -1, 1);
  tu_fill_f32(&r, Dv, pb.nL, -1, 1);
  memset(keep, 7, (size_t)pb.nM);
  float *snap[5];
  for (int j = 0; j < 5; j++) {
    snap[j] = tu_alloc(4 * n[j]);
    memcpy(snap[j], outs[j], 4 * n[j]);
  }
  const uint32_t bad[] = {4u, 8u, 0x80000000u, TG_ATTN_OPT_O_F32 | 0x100u, 0xFFFFFFFFu};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tg_attn_options o = {.flags = bad[i]};
    TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, O, L, bad[i]), TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "flags"));
    assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_attn_train_fwd"));
    TU_EXPECT_STATUS(ctx,
                     tg_attn_train_bwd(ctx, pb.dt, pb.Q, pb.K, pb.V, L, pb.Q, Dv, dQ, dK, dV,
                                       &pb.p, NULL, NULL, c->causal, &o),
                     TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "flags"));
    TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, &o, c->B, c->H, c->qL, c->kL, keep),
                     TG_ERR_BAD_PARAMS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "flags"));
  }
  for (int j = 0; j < 5; j++) {
    assert_memory_equal(outs[j], snap[j], 4 * n[j]);
    free(snap[j]), free(outs[j]);
  }
  for (int64_t k = 0; k < pb.nM; k++) assert_int_equal(keep[k], 7);
  free(keep), free(Dv);
  tg_ctx_destroy(ctx);
  destroy(&pb);
}

/* One f32 block holds O and, right after the bf16 O's extent, L: apart for
 * bf16 O, overlapping for f32 O. */
static void test_alias_check_counts_f32_o(void **state) {
  (void)state;
  tu_rng r = tu_rng_make(tu_seed() + 4);
  prob pb = make(&CASES[0], TG_DTYPE_BF16, &r);
  const int64_t half = (pb.nQ + 1) / 2; /* floats covering the bf16 O */
  float *block = tu_alloc(4 * (size_t)(pb.nQ + pb.nL));
  float *L = block + half;
  tu_fill_f32(&r, block, pb.nQ + pb.nL, -1, 1);
  float *snap = tu_alloc(4 * (size_t)(pb.nQ + pb.nL));
  memcpy(snap, block, 4 * (size_t)(pb.nQ + pb.nL));
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, block, L, TG_ATTN_OPT_O_F32), TG_ERR_ALIAS);
  assert_memory_equal(block, snap, 4 * (size_t)(pb.nQ + pb.nL));
  TU_EXPECT_STATUS(ctx, fwd(ctx, &pb, block, L, 0), TG_OK); /* bf16 O: apart */
  tg_ctx_destroy(ctx);
  free(block), free(snap);
  destroy(&pb);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_o_f32_rounds_to_the_bf16_o),
      cmocka_unit_test(test_f32_dtype_unchanged_by_the_flag),
      cmocka_unit_test(test_backward_and_keep_ignore_the_flag),
      cmocka_unit_test(test_undefined_flags_refused),
      cmocka_unit_test(test_alias_check_counts_f32_o),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
