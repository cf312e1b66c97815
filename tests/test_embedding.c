/* tg_embedding_backward: grad_weight[ids[t], :] += grad_out[t, :]
 * (accumulates; repeated ids add up; a bad id writes nothing).
 *
 * Tolerance. Element (v, d) is the f32 sum of the prefill and the n
 * contributions of the tokens with id v: n roundings, so
 *   |got - exact| <= gamma_n * (|prefill| + sum |grad_out[t, d]|),
 *   gamma_n = n*u / (1 - n*u),  u = 2^-24.
 * We allow 2*n*u*sum|terms| (the factor 2 covers the 1/(1 - n*u) term for every
 * n used here and the f64 reference's own rounding; tests/common/refs.c).
 * Rows no token hits have n = 0: they must come back bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"

typedef enum { IDS_UNIFORM, IDS_SMALL_SET, IDS_ALL_SAME, IDS_SKEWED } id_mode;

typedef struct {
  uint32_t vocab, seq, dim;
  id_mode mode;
} emb_case;

static void make_ids(tu_rng *r, uint32_t *ids, const emb_case *c) {
  const uint32_t hot = (uint32_t)tu_int(r, 0, (int)c->vocab - 1);
  for (uint32_t t = 0; t < c->seq; t++) {
    switch (c->mode) {
      case IDS_UNIFORM: ids[t] = (uint32_t)tu_int(r, 0, (int)c->vocab - 1); break;
      case IDS_SMALL_SET: ids[t] = (uint32_t)tu_int(r, 0, c->vocab < 4 ? (int)c->vocab - 1 : 3); break;
      case IDS_ALL_SAME: ids[t] = hot; break;
      case IDS_SKEWED:
        ids[t] = tu_next(r) % 10 ? hot : (uint32_t)tu_int(r, 0, (int)c->vocab - 1);
        break;
    }
  }
}

static void run_case(const emb_case *c, uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t ng = (int64_t)c->seq * c->dim, nw = (int64_t)c->vocab * c->dim;
  float *g = tu_alloc(ng * sizeof(float));
  uint32_t *ids = tu_alloc(c->seq * sizeof(uint32_t));
  float *pre = tu_alloc(nw * sizeof(float));
  float *gw = tu_alloc(nw * sizeof(float));
  double *want = tu_alloc(nw * sizeof(double));
  double *bound = tu_alloc(nw * sizeof(double));
  tu_fill_f32(&rng, g, ng, -1.0, 1.0);
  make_ids(&rng, ids, c);
  /* non-zero prefill of mixed sign and magnitude */
  for (int64_t i = 0; i < nw; i++) {
    double v = tu_uniform(&rng, 0.5, 4.0);
    pre[i] = (float)(tu_next(&rng) & 1 ? v : -v);
  }
  ref_embedding_backward(g, ids, pre, c->vocab, c->seq, c->dim, want, bound);

  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  char what[160];
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++)
      for (int det = 0; det < 2; det++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tg_ctx_set_deterministic(ctx, det);
        memcpy(gw, pre, nw * sizeof(float));
        TU_EXPECT_STATUS(
            ctx, tg_embedding_backward(ctx, g, ids, gw, c->vocab, c->seq, c->dim), TG_OK);
        snprintf(what, sizeof what,
                 "embedding V=%u T=%u D=%u mode=%d threads=%d isa=%s det=%d", c->vocab,
                 c->seq, c->dim, (int)c->mode, tu_thread_counts[ti],
                 tg_isa_name(isas[ii]), det);
        if (!tu_check_bound(what, gw, want, bound, nw)) TU_FAIL("%s", what);
        tg_ctx_destroy(ctx);
      }
  free(g);
  free(ids);
  free(pre);
  free(gw);
  free(want);
  free(bound);
}

static void test_embedding_values(void **state) {
  const emb_case cases[] = {
      {1, 1, 1, IDS_UNIFORM},        /* 1x1 */
      {5, 200, 3, IDS_SMALL_SET},    /* heavy repetition, narrow rows */
      {1000, 257, 67, IDS_UNIFORM},  /* dim not a multiple of 16, sparse rows */
      {50, 4096, 1, IDS_UNIFORM},    /* dim 1: only vocab blocks give threads work */
      {7, 3000, 300, IDS_ALL_SAME},  /* every token on one row */
      {64, 1000, 130, IDS_SKEWED},   /* 90% on one row, rest spread */
      {20000, 100, 17, IDS_UNIFORM}, /* large vocab, most rows untouched */
      {3, 33, 65, IDS_SMALL_SET},    /* one column past a 64-column block */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 10 + i);
}

/* ctx->deterministic: bitwise identical across thread counts 1, 2, 3, 5. */
static void test_embedding_deterministic(void **state) {
  const emb_case c = {37, 5000, 70, IDS_SKEWED};
  tu_rng rng = tu_rng_make(tu_seed() + 1);
  const int64_t ng = (int64_t)c.seq * c.dim, nw = (int64_t)c.vocab * c.dim;
  float *g = tu_alloc(ng * sizeof(float)), *pre = tu_alloc(nw * sizeof(float));
  float *first = tu_alloc(nw * sizeof(float)), *gw = tu_alloc(nw * sizeof(float));
  uint32_t *ids = tu_alloc(c.seq * sizeof(uint32_t));
  tu_fill_f32(&rng, g, ng, -1.0, 1.0);
  tu_fill_f32(&rng, pre, nw, -2.0, 2.0);
  make_ids(&rng, ids, &c);
  const int threads[] = {1, 2, 3, 5};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ii = 0; ii < n_isas; ii++)
    for (int ti = 0; ti < 4; ti++) {
      tg_ctx *ctx = tu_ctx(threads[ti], isas[ii]);
      tg_ctx_set_deterministic(ctx, 1);
      memcpy(gw, pre, nw * sizeof(float));
      TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, c.vocab, c.seq, c.dim),
                       TG_OK);
      if (ti == 0)
        memcpy(first, gw, nw * sizeof(float));
      else if (memcmp(first, gw, nw * sizeof(float)) != 0)
        TU_FAIL("embedding: deterministic result with %d threads (isa %s) differs from 1 "
                "thread",
                threads[ti], tg_isa_name(isas[ii]));
      tg_ctx_destroy(ctx);
    }
  free(g);
  free(pre);
  free(first);
  free(gw);
  free(ids);
}

static void test_embedding_bad_input(void **state) {
  tg_ctx *ctx = tu_ctx(3, TG_ISA_PORTABLE);
  enum { V = 4, T = 6, D = 5 };
  float g[T * D], gw[V * D], snap[V * D];
  uint32_t ids[T] = {0, 1, 2, 3, 2, 1};
  for (int i = 0; i < T * D; i++) g[i] = (float)(i + 1);
  for (int i = 0; i < V * D; i++) gw[i] = (float)(-i - 1);
  memcpy(snap, gw, sizeof gw);

  assert_int_equal(tg_embedding_backward(NULL, g, ids, gw, V, T, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, NULL, ids, gw, V, T, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, NULL, gw, V, T, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, NULL, V, T, D), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, 0, T, D), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, 0, D), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, T, 0), TG_ERR_BAD_SHAPE);
  /* grad_out [2^32-1, 2^32-1] and grad_weight [2^32-1, 2^31] overflow int64
   * bytes: refused before ids is read. */
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, 0xFFFFFFFFu, 0xFFFFFFFFu),
                   TG_ERR_OVERFLOW);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, 0xFFFFFFFFu, 1, 0x80000000u),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(gw, snap, sizeof gw);

  /* A bad id late in the sequence: nothing written, even for the good tokens
   * before it; the message names the position and the id. */
  ids[5] = V;
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, T, D), TG_ERR_BAD_INDEX);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "ids[5] = 4"));
  ids[5] = 1;
  ids[0] = 0xFFFFFFFFu;
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, T, D), TG_ERR_BAD_INDEX);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "ids[0] = 4294967295"));
  assert_memory_equal(gw, snap, sizeof gw);

  /* The boundary id vocab_size - 1 is fine, and the message is cleared. */
  ids[0] = V - 1;
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, V, T, D), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedding_values),
      cmocka_unit_test(test_embedding_deterministic),
      cmocka_unit_test(test_embedding_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
