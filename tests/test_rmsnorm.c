/* RMSNorm backward: the three-kernel split (rms_inv, dx, dw) and the fused
 * kernel (grad_input writes, grad_weight accumulates).
 *
 * Reference: f64, written from the formulas (not from kernel code), in
 * tests/common/refs.c (shared with tests/test_nan_inputs.c):
 *   r[b]    = 1 / sqrt(sum_j x[b,j]^2 / dim + eps)
 *   s[b]    = sum_i dy[b,i] * x[b,i] * w[i]
 *   dx[b,k] = r[b] * (dy[b,k] * w[k] - x[b,k] * (s[b] * r[b] * r[b] / dim))
 *   dw[i]   = sum_b dy[b,i] * x[b,i] * r[b]
 *
 * Tolerance: alongside each reference value the test carries a bound on the
 * error of ANY f32 evaluation of that formula (standard rounding-error
 * analysis, Higham ch. 2-4, evaluated per element in f64 -- a "running error
 * bound"): u = 2^-24;
 *   - inputs are exact (they are the f32 values the kernel reads);
 *   - an f32 op on values within e of the exact v rounds once: e' = (propagated
 *     e) + u*(|v| + e) + 2^-150 (the last term covers subnormal underflow);
 *     products propagate |a|eb + |b|ea + ea*eb, quotients (ea + |q| eb) /
 *     (|b| - eb), sqrt ea / sqrt(a);
 *   - a sum of n terms in ANY order (serial, lanes + tree, atomics) is within
 *     sum e_i + gamma_{n-1} * sum(|v_i| + e_i), gamma_k = k u / (1 - k u).
 * The bound is rigorous (not first-order), so it is used as is, with no
 * fudge factor; the f64 reference's own error is ~2^-29 of it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"


/* --- reference (tests/common/refs.c) ----------------------------------------- */
typedef struct {
  uint32_t rows, dim;
  float eps;
  float *x, *w, *dy, *r32; /* r32: reference r rounded to f32, input of dx/dw */
  double *r, *r_e;         /* r[rows] and its bound (rms_inv, eps given) */
  double *dx, *dx_e;       /* dx[rows, dim] from r computed in f32 (fused) */
  double *dx2, *dx2_e;     /* dx from the given r32 (split dx kernel) */
  double *dw, *dw_e;       /* dw[dim] from r32 (split dw kernel) */
  double *gw, *gw_e;       /* prefill + sum_b x*r*dy, r computed (fused) */
  float *gw_pre;           /* fused grad_weight prefill */
} rms_case;

static rms_case make_case(uint32_t rows, uint32_t dim, uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  const int64_t n = (int64_t)rows * dim;
  rms_case c = {.rows = rows, .dim = dim};
  c.eps = tu_int(&rng, 0, 3) == 0 ? 0.0f : (float)tu_uniform(&rng, 1e-6, 1e-2);
  c.x = tu_alloc(n * sizeof(float));
  c.dy = tu_alloc(n * sizeof(float));
  c.w = tu_alloc(dim * sizeof(float));
  c.r32 = tu_alloc(rows * sizeof(float));
  c.gw_pre = tu_alloc(dim * sizeof(float));
  c.r = tu_alloc(rows * sizeof(double));
  c.r_e = tu_alloc(rows * sizeof(double));
  c.dx = tu_alloc(n * sizeof(double));
  c.dx_e = tu_alloc(n * sizeof(double));
  c.dx2 = tu_alloc(n * sizeof(double));
  c.dx2_e = tu_alloc(n * sizeof(double));
  c.dw = tu_alloc(dim * sizeof(double));
  c.dw_e = tu_alloc(dim * sizeof(double));
  c.gw = tu_alloc(dim * sizeof(double));
  c.gw_e = tu_alloc(dim * sizeof(double));
  /* rows of very different scales, so eps matters in some of them */
  for (uint32_t b = 0; b < rows; b++) {
    const double scale = (const double[]){1e-3, 1.0, 1.0, 30.0}[tu_int(&rng, 0, 3)];
    tu_fill_f32(&rng, c.x + (int64_t)b * dim, dim, -2 * scale, 2 * scale);
  }
  tu_fill_f32(&rng, c.dy, n, -1, 1);
  tu_fill_f32(&rng, c.w, dim, -1.5, 1.5);
  for (uint32_t i = 0; i < dim; i++) /* non-zero prefill */
    c.gw_pre[i] = (float)(tu_uniform(&rng, 0.5, 2) * (tu_next(&rng) & 1 ? 1 : -1));

  ref_rms_forward(c.x, c.w, rows, dim, c.eps, NULL, NULL, c.r, c.r_e);
  for (uint32_t b = 0; b < rows; b++) c.r32[b] = (float)c.r[b];
  ref_rms_dx(c.x, c.w, c.dy, c.r32, rows, dim, c.dx2, c.dx2_e);
  ref_rms_dw(c.x, c.dy, c.r32, rows, dim, c.dw, c.dw_e);
  ref_rms_fused(c.x, c.w, c.dy, c.gw_pre, rows, dim, c.eps, c.dx, c.dx_e, c.gw, c.gw_e);
  return c;
}

static void free_case(rms_case *c) {
  void *p[] = {c->x,    c->dy,  c->w,  c->r32, c->gw_pre, c->r,  c->r_e, c->dx,
               c->dx_e, c->dx2, c->dx2_e, c->dw, c->dw_e, c->gw, c->gw_e};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* Every kernel on one case at every thread count x ISA (x deterministic for
 * the fused kernel). */
static void check_case(uint32_t rows, uint32_t dim, uint64_t k) {
  rms_case c = make_case(rows, dim, k);
  const int64_t n = (int64_t)rows * dim;
  float *r = tu_alloc(rows * sizeof(float));
  float *dx = tu_alloc(n * sizeof(float));
  float *dw = tu_alloc(dim * sizeof(float));
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  char what[160];
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      snprintf(what, sizeof what, "%ux%u eps=%g threads=%d isa=%s", rows, dim,
               (double)c.eps, tu_thread_counts[ti], tg_isa_name(isas[ii]));

      tu_poison_f32(r, rows);
      TU_EXPECT_STATUS(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, c.x, r, rows, dim, c.eps),
                       TG_OK);
      if (!tu_check_bound("rms_inv r", r, c.r, c.r_e, rows)) TU_FAIL("rms_inv %s", what);

      tu_poison_f32(dx, n);
      TU_EXPECT_STATUS(ctx,
                       tg_rms_norm_backward_dx_f32(ctx, c.x, c.w, c.dy, c.r32, dx, rows, dim),
                       TG_OK);
      if (!tu_check_bound("split dx", dx, c.dx2, c.dx2_e, n)) TU_FAIL("split dx %s", what);

      tu_poison_f32(dw, dim);
      TU_EXPECT_STATUS(ctx, tg_rms_norm_backward_dw_f32(ctx, c.x, c.dy, c.r32, dw, rows, dim),
                       TG_OK);
      if (!tu_check_bound("split dw", dw, c.dw, c.dw_e, dim)) TU_FAIL("split dw %s", what);

      for (int det = 0; det <= 1; det++) {
        assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
        tu_poison_f32(dx, n);
        memcpy(dw, c.gw_pre, dim * sizeof(float));
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward(ctx, c.x, c.w, c.dy, dx, dw, rows, dim,
                                                   c.eps),
                         TG_OK);
        if (!tu_check_bound("fused grad_input", dx, c.dx, c.dx_e, n))
          TU_FAIL("fused grad_input %s det=%d", what, det);
        if (!tu_check_bound("fused grad_weight", dw, c.gw, c.gw_e, dim))
          TU_FAIL("fused grad_weight %s det=%d", what, det);
      }
      tg_ctx_destroy(ctx);
    }
  free(r);
  free(dx);
  free(dw);
  free_case(&c);
}

static void test_rmsnorm_sizes(void **state) {
  /* 1x1, dims off the 16-lane and 256-column grids, one row, one column,
   * many short rows (row blocks; fused: 256 capped blocks), a row past the
   * 8 Ki-element group size. */
  const uint32_t sizes[][2] = {{1, 1},    {1, 7},    {2, 16},   {3, 17},  {5, 300},
                               {64, 33},  {17, 1000}, {300, 129}, {260, 64}, {4200, 3},
                               {1, 257},  {200, 1},  {3, 9000}, {97, 513}, {64, 4096}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    check_case(sizes[s][0], sizes[s][1], 100 + s);
}

/* Deterministic mode: fused grad_weight (and everything else) bitwise equal
 * across thread counts 1, 2, 3, 5 and across repeated runs. */
static void test_rmsnorm_deterministic(void **state) {
  const uint32_t sizes[][2] = {{1000, 77}, {4200, 3}, {33, 300}, {5, 5}};
  const int threads[] = {1, 2, 3, 5, 5};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const uint32_t rows = sizes[s][0], dim = sizes[s][1];
    const int64_t n = (int64_t)rows * dim;
    tu_rng rng = tu_rng_make(tu_seed() + 500 + s);
    float *x = tu_alloc(n * sizeof(float)), *dy = tu_alloc(n * sizeof(float));
    float *w = tu_alloc(dim * sizeof(float)), *pre = tu_alloc(dim * sizeof(float));
    float *gi = tu_alloc(n * sizeof(float)), *gw = tu_alloc(dim * sizeof(float));
    float *gi0 = tu_alloc(n * sizeof(float)), *gw0 = tu_alloc(dim * sizeof(float));
    float *dw = tu_alloc(dim * sizeof(float)), *dw0 = tu_alloc(dim * sizeof(float));
    float *r = tu_alloc(rows * sizeof(float));
    tu_fill_f32(&rng, x, n, -2, 2);
    tu_fill_f32(&rng, dy, n, -1, 1);
    tu_fill_f32(&rng, w, dim, -1, 1);
    tu_fill_f32(&rng, pre, dim, 0.5, 2);
    for (int ii = 0; ii < n_isas; ii++)
      for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        tg_ctx *ctx = tu_ctx(threads[t], isas[ii]);
        assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
        memcpy(gw, pre, dim * sizeof(float));
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward(ctx, x, w, dy, gi, gw, rows, dim, 1e-5f),
                         TG_OK);
        TU_EXPECT_STATUS(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, x, r, rows, dim, 1e-5f),
                         TG_OK);
        TU_EXPECT_STATUS(ctx, tg_rms_norm_backward_dw_f32(ctx, x, dy, r, dw, rows, dim),
                         TG_OK);
        if (ii == 0 && t == 0) {
          memcpy(gi0, gi, n * sizeof(float));
          memcpy(gw0, gw, dim * sizeof(float));
          memcpy(dw0, dw, dim * sizeof(float));
        } else if (memcmp(gw, gw0, dim * sizeof(float)) ||
                   memcmp(gi, gi0, n * sizeof(float)) ||
                   memcmp(dw, dw0, dim * sizeof(float))) {
          TU_FAIL("%ux%u: threads=%d isa=%s differs bitwise from threads=1 (%s)", rows,
                  dim, threads[t], tg_isa_name(isas[ii]),
                  memcmp(gw, gw0, dim * sizeof(float)) ? "grad_weight"
                  : memcmp(gi, gi0, n * sizeof(float)) ? "grad_input"
                                                       : "split dw");
        }
        tg_ctx_destroy(ctx);
      }
    float *p[] = {x, dy, w, pre, gi, gw, gi0, gw0, dw, dw0, r};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  }
}

/* --- bad input: right status, a message, no output byte changed ------------- */
enum { BR = 3, BD = 5 };
static float bx[BR * BD], bw[BD], bdy[BR * BD], br[BR];
static float o_r[BR], o_dx[BR * BD], o_dw[BD], o_gi[BR * BD], o_gw[BD];
static float s_r[BR], s_dx[BR * BD], s_dw[BD], s_gi[BR * BD], s_gw[BD];

static void snapshot(void) {
  memcpy(s_r, o_r, sizeof o_r);
  memcpy(s_dx, o_dx, sizeof o_dx);
  memcpy(s_dw, o_dw, sizeof o_dw);
  memcpy(s_gi, o_gi, sizeof o_gi);
  memcpy(s_gw, o_gw, sizeof o_gw);
}
static void expect_unchanged(const char *call) {
  if (memcmp(s_r, o_r, sizeof o_r) || memcmp(s_dx, o_dx, sizeof o_dx) ||
      memcmp(s_dw, o_dw, sizeof o_dw) || memcmp(s_gi, o_gi, sizeof o_gi) ||
      memcmp(s_gw, o_gw, sizeof o_gw))
    TU_FAIL("%s changed an output on failure", call);
}
#define EXPECT_FAIL(ctx, call, status)  \
  do {                                  \
    snapshot();                         \
    TU_EXPECT_STATUS(ctx, call, status); \
    expect_unchanged(#call);            \
  } while (0)

static void test_rmsnorm_bad_input(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  tu_fill_f32(&rng, bx, BR * BD, -1, 1);
  tu_fill_f32(&rng, bw, BD, -1, 1);
  tu_fill_f32(&rng, bdy, BR * BD, -1, 1);
  tu_fill_f32(&rng, br, BR, 0.5, 2);
  tu_fill_f32(&rng, o_r, BR, 1, 2);
  tu_fill_f32(&rng, o_dx, BR * BD, 1, 2);
  tu_fill_f32(&rng, o_dw, BD, 1, 2);
  tu_fill_f32(&rng, o_gi, BR * BD, 1, 2);
  tu_fill_f32(&rng, o_gw, BD, 1, 2);
  const uint32_t M = 0xFFFFFFFFu; /* M*M elements overflow int64 */
  const uint32_t H = 0x80000000u; /* M*H elements fit, their bytes do not */

  for (int det = 0; det <= 1; det++) {
    tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
    assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);

    /* 4a */
    snapshot();
    assert_int_equal(tg_rms_norm_compute_rms_inv_f32(NULL, bx, o_r, BR, BD, 1e-5f),
                     TG_ERR_NULL_ARG);
    expect_unchanged("rms_inv(NULL ctx)");
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, NULL, o_r, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, NULL, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, 0, BD, 1e-5f),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, BR, 0, 1e-5f),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, M, M, 1e-5f),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, M, H, 1e-5f),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, BR, BD, NAN),
                TG_ERR_BAD_PARAMS);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, BR, BD, INFINITY),
                TG_ERR_BAD_PARAMS);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, BR, BD, -INFINITY),
                TG_ERR_BAD_PARAMS);
    EXPECT_FAIL(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, bx, o_r, BR, BD, -1e-6f),
                TG_ERR_BAD_PARAMS);

    /* 4b */
    snapshot();
    assert_int_equal(tg_rms_norm_backward_dx_f32(NULL, bx, bw, bdy, br, o_dx, BR, BD),
                     TG_ERR_NULL_ARG);
    expect_unchanged("dx(NULL ctx)");
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, NULL, bw, bdy, br, o_dx, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, NULL, bdy, br, o_dx, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, NULL, br, o_dx, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, NULL, o_dx, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, br, NULL, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, br, o_dx, 0, BD),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, br, o_dx, BR, 0),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, br, o_dx, M, M),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dx_f32(ctx, bx, bw, bdy, br, o_dx, H, M),
                TG_ERR_OVERFLOW);

    /* 4c */
    snapshot();
    assert_int_equal(tg_rms_norm_backward_dw_f32(NULL, bx, bdy, br, o_dw, BR, BD),
                     TG_ERR_NULL_ARG);
    expect_unchanged("dw(NULL ctx)");
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, NULL, bdy, br, o_dw, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, NULL, br, o_dw, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, NULL, o_dw, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, br, NULL, BR, BD),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, br, o_dw, 0, BD),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, br, o_dw, BR, 0),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, br, o_dw, M, M),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_backward_dw_f32(ctx, bx, bdy, br, o_dw, M, H),
                TG_ERR_OVERFLOW);

    /* 5 */
    snapshot();
    assert_int_equal(tg_rms_norm_backward(NULL, bx, bw, bdy, o_gi, o_gw, BR, BD, 1e-5f),
                     TG_ERR_NULL_ARG);
    expect_unchanged("fused(NULL ctx)");
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, NULL, bw, bdy, o_gi, o_gw, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, NULL, bdy, o_gi, o_gw, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, NULL, o_gi, o_gw, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, NULL, o_gw, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, NULL, BR, BD, 1e-5f),
                TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, 0, BD, 1e-5f),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, BR, 0, 1e-5f),
                TG_ERR_BAD_SHAPE);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, M, M, 1e-5f),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, H, M, 1e-5f),
                TG_ERR_OVERFLOW);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, BR, BD, NAN),
                TG_ERR_BAD_PARAMS);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, BR, BD, INFINITY),
                TG_ERR_BAD_PARAMS);
    EXPECT_FAIL(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, BR, BD, -1.0f),
                TG_ERR_BAD_PARAMS);

    /* the context still works and clears its message */
    TU_EXPECT_STATUS(ctx, tg_rms_norm_backward(ctx, bx, bw, bdy, o_gi, o_gw, BR, BD, 1e-5f),
                     TG_OK);
    assert_string_equal(tg_ctx_last_error(ctx), "");
    assert_true(tu_all_finite(o_gi, BR * BD));
    tg_ctx_destroy(ctx);
  }
}

/* eps = 0 with a non-zero row is fine; an all-zero row with eps > 0 gives r =
 * 1/sqrt(eps) and dx = r * dy * w exactly (x = 0), dw contribution 0. */
static void test_rmsnorm_zero_row(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  const uint32_t dim = 20;
  float x[2 * 20] = {0}, w[20], dy[2 * 20], gi[2 * 20], gw[20] = {0}, r[2];
  tu_rng rng = tu_rng_make(tu_seed() + 950);
  tu_fill_f32(&rng, x + dim, dim, -1, 1); /* row 0 zero, row 1 random */
  tu_fill_f32(&rng, w, dim, -1, 1);
  tu_fill_f32(&rng, dy, 2 * dim, -1, 1);
  const float eps = 0.25f; /* r = 2 exactly */
  TU_EXPECT_STATUS(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, x, r, 2, dim, eps), TG_OK);
  assert_true(r[0] == 2.0f);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_backward(ctx, x, w, dy, gi, gw, 1, dim, eps), TG_OK);
  for (uint32_t k = 0; k < dim; k++) {
    assert_true(gi[k] == 2.0f * (dy[k] * w[k]));
    assert_true(gw[k] == 0.0f);
  }
  TU_EXPECT_STATUS(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, x + dim, r, 1, dim, 0.0f),
                   TG_OK);
  assert_true(isfinite(r[0]) && r[0] > 0);
  tg_ctx_destroy(ctx);
}

/* Forward: y = x * r * w against the running-bound reference; r_out given or
 * NULL; outputs poisoned; bad input leaves y and r untouched. */
static void test_rmsnorm_forward(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  const uint32_t shapes[][2] = {{1, 1}, {3, 17}, {64, 300}, {7, 4099}};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const uint32_t rows = shapes[si][0], dim = shapes[si][1];
    const int64_t n = (int64_t)rows * dim;
    float *x = tu_alloc(sizeof(float) * n), *w = tu_alloc(sizeof(float) * dim);
    float *y = tu_alloc(sizeof(float) * n), *r = tu_alloc(sizeof(float) * rows);
    double *yw = tu_alloc(sizeof(double) * n), *ye = tu_alloc(sizeof(double) * n);
    double *rw = tu_alloc(sizeof(double) * rows), *re = tu_alloc(sizeof(double) * rows);
    tu_fill_f32(&rng, x, n, -3, 3);
    tu_fill_f32(&rng, w, dim, -2, 2);
    const float eps = 1e-5f;
    ref_rms_forward(x, w, rows, dim, eps, yw, ye, rw, re);
    for (int ii = 0; ii < n_isas; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++)
        for (int with_r = 0; with_r < 2; with_r++) {
          tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
          tu_poison_f32(y, n);
          tu_poison_f32(r, rows);
          TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, y, with_r ? r : NULL, rows,
                                                        dim, eps),
                           TG_OK);
          if (!tu_check_bound("y", y, yw, ye, n) ||
              (with_r && !tu_check_bound("r", r, rw, re, rows)))
            TU_FAIL("rms forward %ux%u threads=%d isa=%s", rows, dim, tu_thread_counts[ti],
                    tg_isa_name(isas[ii]));
          if (!with_r)
            for (uint32_t b = 0; b < rows; b++) assert_true(isnan(r[b])); /* untouched */
          tg_ctx_destroy(ctx);
        }
    free(x), free(w), free(y), free(r), free(yw), free(ye), free(rw), free(re);
  }
  /* bad input: status, message, nothing written */
  float x[4] = {1, 2, 3, 4}, w[2] = {1, 1}, y[4] = {9, 9, 9, 9}, r[2] = {9, 9};
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  assert_int_equal(tg_rms_norm_forward_f32(NULL, x, w, y, r, 2, 2, 1e-5f), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, NULL, w, y, r, 2, 2, 1e-5f),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, NULL, r, 2, 2, 1e-5f),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, y, r, 0, 2, 1e-5f),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, y, r, 2, 2, NAN),
                   TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, y, r, 2, 2, -1.0f),
                   TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_rms_norm_forward_f32(ctx, x, w, y, r, UINT32_MAX, UINT32_MAX, 0),
                   TG_ERR_OVERFLOW);
  for (int i = 0; i < 4; i++) assert_true(y[i] == 9);
  assert_true(r[0] == 9 && r[1] == 9);
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm_sizes),
      cmocka_unit_test(test_rmsnorm_deterministic),
      cmocka_unit_test(test_rmsnorm_bad_input),
      cmocka_unit_test(test_rmsnorm_zero_row),
      cmocka_unit_test(test_rmsnorm_forward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
