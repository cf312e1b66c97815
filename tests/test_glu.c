/* Gated linear units (tg_glu_forward, tg_glu_backward), silu and gelu_tanh.
 *
 * Reference: f64 from the formulas, with S(z) = 1 / (1 + e^-z) and its
 * complement Sc(z) = 1 / (1 + e^z) (each without cancellation; for
 * gelu_tanh 0.5 (1 + tanh(z/2)) = S(z), which in f64 too would cancel to 0
 * where the f32 result is still normal):
 *   silu:      z = g,                             act = g S,  act' = S (1 + g Sc)
 *   gelu_tanh: z = 2 sqrt(2/pi) (g + 0.044715 g^3), act = g S,
 *              act' = S + T, T = g S Sc z',  z' = 2 sqrt(2/pi) (1 + 3 * 0.044715 g^2)
 *   y = act * up,  dup = dy * act,  dgate = (dy * up) * act'
 *
 * Tolerance (first order in u = 2^-24, then x 1.01; row_ops.c's operations
 * one by one, no FMA but in exp_f32):
 *   - z: exact for silu; for gelu_tanh g*g*g, *a, +g (same signs: no
 *     cancellation), *K2 and the two constants' roundings: <= 7u relative.
 *     S and Sc move by |z| Sc and |z| S times that (the derivatives of
 *     ln S and ln Sc): <= 7u |z| relative each.
 *   - e = exp(-|z|) within 2 ulp (exp_f32's contract) = 4u; 1 + e: 3u (e's
 *     error scaled by e / (1 + e) <= 1/2, and a rounding); r = 1/(1+e):
 *     4u; e r: 9u. So S and Sc are within eS = 9u + 7u|z| each.
 *   - act = g S: eS + u; y = act up, dup = dy act: eS + 2u relative.
 *   - silu': g Sc (eS + u), 1 + g Sc adds u |1 + g Sc|, S (...) another eS
 *     and u: |err| <= S ((2 eS + 2u)(1 + |g Sc|)) in absolute terms (the
 *     sum may cancel near g = -1.28: the bound is absolute in act').
 *   - gelu': S Sc: 2 eS + u; *g: +u; z' = K2 (1 + A3 g^2): 6u (no
 *     cancellation); T: 2 eS + 8u; S + T: |err| <= (2 eS + 9u)(S + |T|).
 *   - dgate = (dy up) act': |dy up| |err(act')| + 2u |dgate|.
 *   - underflow: where e is subnormal (|z| > 87.3) its error is 2 ulp of
 *     the subnormals, 2^-148 absolute, carried by |g up| (y), |dy g| (dup)
 *     and |dy up| (1 + 64 |g| z') (dgate); plus 2^-148 per rounding that
 *     underflows: floors of 2^-140 of those magnitudes cover both.
 * A bf16 output is the f32 one rounded once: + 2^-8 (|ref| + the f32
 * bound) + 2^-134.
 * The outputs are compared bitwise across thread counts (elementwise), not
 * across ISAs (exp_f32's FMA bits differ between tables).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_elems.h"
#include "testutil.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define U 0x1p-24
#define K2 1.5957691216057308 /* 2 sqrt(2/pi) */
#define A 0.044715

/* The f64 reference of one element and its bounds (see the top). */
typedef struct {
  double y, dup, dg, ey, edup, edg;
  double may[3]; /* NaN: y, dup, dg may be NaN (tu_check_ieee's `may`), else 0 */
} glu_ref;

/* An infinite factor times one that is f32-subnormal or 0 in f64 may
 * meet that factor as an exact 0 in f32 (S underflows sooner): inf * 0. */
static double may_nan(double inf_side, double small_side) {
  return isinf(inf_side) && fabs(small_side) < 0x1p-126 ? NAN : 0;
}

static glu_ref ref_elem(int act, double g, double up, double dy) {
  const double z = act == TG_GLU_SILU ? g : K2 * (g + A * g * g * g);
  const double S = 1 / (1 + exp(-z)), Sc = 1 / (1 + exp(z));
  const double eS = 9 * U + (act == TG_GLU_SILU || !isfinite(z) ? 0 : 7 * U * fabs(z));
  /* +-inf gates: the limits (0 where S = 0; no g Sc where Sc = 0) */
  const double a = S == 0 ? -0.0 : g * S;
  double da, eda;
  if (act == TG_GLU_SILU) {
    const double gsc = Sc == 0 ? 0 : g * Sc;
    da = S == 0 ? -0.0 : S * (1 + gsc);
    eda = S * (2 * eS + 2 * U) * (1 + fabs(gsc));
  } else {
    const double zp = K2 * (1 + 3 * A * g * g);
    const double T = S * Sc == 0 ? 0 : g * S * Sc * zp; /* the limit where S Sc is 0 */
    da = S + T;
    eda = (2 * eS + 9 * U) * (S + fabs(T));
  }
  const double zp_floor = act == TG_GLU_SILU ? 2 : K2 * (1 + 3 * A * 64 * 64);
  const double gf = isfinite(g) ? fabs(g) : 0; /* the floors' magnitudes */
  glu_ref r;
  r.y = a * up;
  r.dup = dy * a;
  r.dg = dy * up * da;
  r.ey = 1.01 * (eS + 2 * U) * fabs(r.y) + 0x1p-140 * (gf * fabs(up) + 1);
  r.edup = 1.01 * (eS + 2 * U) * fabs(r.dup) + 0x1p-140 * (fabs(dy) * gf + 1);
  r.edg = 1.01 * (fabs(dy * up) * eda + 2 * U * fabs(r.dg)) +
          0x1p-140 * (fabs(dy * up) * (1 + 64 * gf * zp_floor) + 1);
  r.may[0] = may_nan(up, a);
  r.may[1] = may_nan(dy, a);
  r.may[2] = may_nan(dy * up, da);
  /* an infinite gate with a finite result: the limit, exactly */
  if (!isfinite(r.ey)) r.ey = 0;
  if (!isfinite(r.edup)) r.edup = 0;
  if (!isfinite(r.edg)) r.edg = 0;
  return r;
}

static double bf16_bound(double want, double e) { return e + 0x1p-8 * (fabs(want) + e) + 0x1p-134; }

/* gate values: mostly moderate, a few at the ends of the range */
static float gate_value(tu_rng *rng) {
  const int k = tu_int(rng, 0, 39);
  static const float far[] = {-1e30f, -3e4f, -1000.0f, -100.0f, -90.0f, -88.5f, -20.0f, -9.5f,
                              -1.278f, 1e-30f,  -1e-30f,  9.5f,     20.0f,   88.5f,  100.0f, 1e30f,
                              1e38f,   -1e38f,   0.0f,    -0.0f};
  if (k < 20) return far[tu_int(rng, 0, 19)];
  return (float)tu_uniform(rng, -7, 7);
}

typedef struct {
  int act, dtype;
  uint32_t rows, cols;
  int fused;    /* gate and up as the two chunks of one [rows, 2 cols] buffer */
  int pad;      /* extra stride on the outputs */
  int in_place; /* fwd: 1 y == gate, 2 y == up; bwd: 1 dgate == gate, 2 dup == up, 3 both */
  int specials; /* NaN and inf in the inputs */
} glu_case;

static void check_case(const glu_case *k, uint64_t seed) {
  tu_rng rng = tu_rng_make(tu_seed() + seed);
  const int t = k->dtype;
  const int64_t rows = k->rows, cols = k->cols;
  const int64_t gs = k->fused ? 2 * cols : cols + (k->pad ? 1 : 0);
  const int64_t us = k->fused ? 2 * cols : cols;
  const int64_t os = cols + (k->pad ? 5 : 0); /* y, dy, dgate, dup */
  const int64_t ngu = rows * (k->fused ? 2 * cols : gs) + cols, nout = rows * os;
  void *gbuf = tu_alloc(ngu * te_size(t)), *ubuf = k->fused ? gbuf : tu_alloc(rows * us * te_size(t));
  void *dy = tu_alloc(nout * te_size(t));
  const int64_t uoff = k->fused ? cols : 0;
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < ngu; i++) te_put(gbuf, t, i, gate_value(&rng));
  if (!k->fused)
    for (int64_t i = 0; i < rows * us; i++) te_put(ubuf, t, i, (float)tu_uniform(&rng, -3, 3));
  else
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < cols; j++) te_put(gbuf, t, r * us + uoff + j, (float)tu_uniform(&rng, -3, 3));
  for (int64_t i = 0; i < nout; i++) te_put(dy, t, i, (float)tu_uniform(&rng, -2, 2));
  if (k->specials) {
    te_put(gbuf, t, (int64_t)(tu_next(&rng) % cols), NAN);
    te_put(gbuf, t, (rows - 1) * gs + (int64_t)(tu_next(&rng) % cols), INFINITY);
    te_put(gbuf, t, (int64_t)(tu_next(&rng) % cols) * 0 + gs * (rows / 2), -INFINITY);
    te_put(ubuf, t, uoff + (rows / 2) * us + cols - 1, NAN);
    te_put(dy, t, (rows - 1) * os, INFINITY);
  }
  /* reference */
  double *w[3], *e[3], *may[3];
  for (int i = 0; i < 3; i++)
    w[i] = tu_alloc(n * sizeof(double)), e[i] = tu_alloc(n * sizeof(double)),
    may[i] = tu_alloc(n * sizeof(double));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) {
      const int64_t o = r * cols + j;
      const glu_ref f = ref_elem(k->act, te_get(gbuf, t, r * gs + j), te_get(ubuf, t, uoff + r * us + j),
                                 te_get(dy, t, r * os + j));
      w[0][o] = f.y, w[1][o] = f.dup, w[2][o] = f.dg;
      for (int i = 0; i < 3; i++) may[i][o] = f.may[i];
      e[0][o] = t == TG_DTYPE_F32 ? f.ey : bf16_bound(f.y, f.ey);
      e[1][o] = t == TG_DTYPE_F32 ? f.edup : bf16_bound(f.dup, f.edup);
      e[2][o] = t == TG_DTYPE_F32 ? f.edg : bf16_bound(f.dg, f.edg);
    }
  /* the runs: outputs in their own poisoned buffers, or over the inputs */
  const size_t gbytes = ngu * te_size(t), ubytes = k->fused ? 0 : rows * us * te_size(t);
  void *g0 = tu_alloc(gbytes), *u0 = ubytes ? tu_alloc(ubytes) : NULL;
  memcpy(g0, gbuf, gbytes);
  if (ubytes) memcpy(u0, ubuf, ubytes);
  void *o1 = tu_alloc(nout * te_size(t)), *o2 = tu_alloc(nout * te_size(t));
  const size_t fbytes = gbytes + ubytes + 2 * nout * te_size(t);
  void *f1 = tu_alloc(fbytes), *f2 = tu_alloc(fbytes);
  float *got = tu_alloc(n * sizeof(float));
  char what[200];
  snprintf(what, sizeof what, "%s %s %ux%u fused %d pad %d in_place %d specials %d",
           k->act ? "gelu_tanh" : "silu", t ? "f32" : "bf16", k->rows, k->cols, k->fused, k->pad,
           k->in_place, k->specials);
  for (int bwd = 0; bwd <= 1; bwd++) {
    if (k->in_place == 3 && !bwd) continue;
    for (int ti = 0; ti < tu_n_thread_counts; ti++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], TG_ISA_AUTO);
      memcpy(gbuf, g0, gbytes);
      if (ubytes) memcpy(ubuf, u0, ubytes);
      te_poison(o1, t, nout), te_poison(o2, t, nout);
      char *G = gbuf, *Up = (char *)ubuf + uoff * te_size(t);
      /* outputs: o1 / o2 at stride os, or the gate / up views */
      void *out1 = o1, *out2 = o2;
      int64_t s1 = os, s2 = os;
      if (!bwd && k->in_place == 1) out1 = G, s1 = gs;
      if (!bwd && k->in_place == 2) out1 = Up, s1 = us;
      if (bwd && (k->in_place & 1)) out1 = G, s1 = gs;
      if (bwd && (k->in_place & 2)) out2 = Up, s2 = us;
      tg_status st = bwd ? tg_glu_backward(ctx, G, Up, dy, out1, out2, k->act, t, k->rows, k->cols,
                                           gs, us, os, s1, s2)
                         : tg_glu_forward(ctx, G, Up, out1, k->act, t, k->rows, k->cols, gs, us, s1);
      TU_EXPECT_STATUS(ctx, st, TG_OK);
      for (int which = 0; which < (bwd ? 2 : 1); which++) {
        const void *o = which ? out2 : out1;
        const int64_t so = which ? s2 : s1;
        for (int64_t r = 0; r < rows; r++)
          for (int64_t j = 0; j < cols; j++) got[r * cols + j] = (float)te_get(o, t, r * so + j);
        const int ref = !bwd ? 0 : which ? 1 : 2; /* out1 of bwd: dgate; out2: dup */
        if (!tu_check_ieee(!bwd ? "y" : which ? "dup" : "dgate", got, w[ref], e[ref], may[ref], n))
          TU_FAIL("%s %s threads=%d", bwd ? "bwd" : "fwd", what, tu_thread_counts[ti]);
        /* nothing between the rows of a padded output was written */
        if (o == o1 || o == o2)
          for (int64_t r = 0; r < rows; r++)
            for (int64_t j = cols; j < so && r * so + j < nout; j++)
              if (!isnan(te_get(o, t, r * so + j))) TU_FAIL("%s: a gap of an output was written", what);
      }
      /* every run the same bits (elementwise; one ISA per context) */
      char *f = ti == 0 ? f1 : f2;
      memcpy(f, gbuf, gbytes);
      if (ubytes) memcpy(f + gbytes, ubuf, ubytes);
      memcpy(f + gbytes + ubytes, o1, nout * te_size(t));
      memcpy(f + gbytes + ubytes + nout * te_size(t), o2, nout * te_size(t));
      if (ti > 0 && memcmp(f1, f2, fbytes))
        TU_FAIL("%s: threads=%d differs bitwise from threads=1", what, tu_thread_counts[ti]);
      tg_ctx_destroy(ctx);
    }
  }
  void *ptrs[] = {gbuf, k->fused ? NULL : ubuf, dy, g0, u0, o1, o2, f1, f2, got,
                  w[0], w[1], w[2], e[0], e[1], e[2], may[0], may[1], may[2]};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
}

static void test_glu_shapes(void **state) {
  /* tails of the 16-lane vectors and of the 256-element exp chunks, one
   * element, a row past the 16 Ki-column work piece, many short rows */
  const uint32_t shapes[][2] = {{1, 1},   {1, 17},  {3, 16},    {5, 100},  {7, 1023},
                                {2, 257}, {300, 33}, {2, 16390}, {40, 300}, {9, 4100}};
  uint64_t seed = 1;
  for (int act = 0; act <= 1; act++)
    for (int t = 0; t <= 1; t++)
      for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        if (tu_short() && si % 3 == 2) continue; /* short: two thirds of the shapes */
        glu_case k = {act, t, shapes[si][0], shapes[si][1], .fused = si % 2, .pad = si % 3 == 1};
        check_case(&k, seed++);
        k.in_place = 1 + si % 3; /* 1, 2, 3 in turn */
        check_case(&k, seed++);
      }
}

static void test_glu_specials(void **state) {
  uint64_t seed = 200;
  for (int act = 0; act <= 1; act++)
    for (int t = 0; t <= 1; t++) {
      glu_case k = {act, t, 4, 37, .fused = t, .pad = 1 - t, .specials = 1};
      check_case(&k, seed++);
    }
}

/* Spot values against the formulas' known limits: silu(-100) ~ -3.7e-42
 * (no NaN, no 0 from 1/inf), gelu_tanh(-10) ~ -1.2e-37 still normal, large
 * positive gates pass through, and dgate's act' -> 1 there. */
static void test_glu_limits(void **state) {
  const float g[] = {-100.0f, -10.0f, 30.0f, 1e20f, -87.0f};
  const float u[] = {1, 1, 1, 1, 1}, dy[] = {1, 1, 1, 1, 1};
  float y[5], dg[5], du[5];
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_glu_forward(ctx, g, u, y, TG_GLU_SILU, TG_DTYPE_F32, 1, 5, 5, 5, 5), TG_OK);
  /* -3.7e-42 is subnormal: within the floor of 2^-140 |g| (see the top) */
  assert_true(y[0] < 0 && fabs(y[0] - -100 * exp(-100.0)) <= 100 * 0x1p-140);
  assert_true(isnormal(y[4]) && fabs(y[4] / (-87 * exp(-87.0)) - 1) < 1e-5);
  assert_true(y[2] == 30.0f && y[3] == 1e20f);
  TU_EXPECT_STATUS(ctx, tg_glu_backward(ctx, g, u, dy, dg, du, TG_GLU_GELU_TANH, TG_DTYPE_F32, 1,
                                        5, 5, 5, 5, 5, 5), TG_OK);
  assert_true(du[1] < 0 && isnormal(du[1]));
  assert_true(du[3] == 1e20f && dg[3] == 1.0f && dg[2] == 1.0f);
  for (int i = 0; i < 5; i++) assert_false(isnan(dg[i]) || isnan(du[i]));
  tg_ctx_destroy(ctx);
}

/* --- bad input: right status, a message, nothing written ---------------------- */
enum { BR = 3, BC = 5 };
static float bg[BR * 2 * BC], bu[BR * BC], bdy[BR * BC], o1[BR * BC + 8], o2[BR * BC + 8];
static float s1[NELEM(o1)], s2[NELEM(o2)], sg[NELEM(bg)], su[NELEM(bu)];

#define EXPECT_FAIL(ctx, call, status)                                            \
  do {                                                                            \
    memcpy(s1, o1, sizeof o1), memcpy(s2, o2, sizeof o2);                         \
    memcpy(sg, bg, sizeof bg), memcpy(su, bu, sizeof bu);                         \
    TU_EXPECT_STATUS(ctx, call, status);                                          \
    if (memcmp(s1, o1, sizeof o1) || memcmp(s2, o2, sizeof o2) ||                 \
        memcmp(sg, bg, sizeof bg) || memcmp(su, bu, sizeof bu))                   \
      TU_FAIL("%s wrote an output", #call);                                       \
  } while (0)

static void test_glu_bad_input(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  tu_fill_f32(&rng, bg, NELEM(bg), -1, 1);
  tu_fill_f32(&rng, bu, NELEM(bu), -1, 1);
  tu_fill_f32(&rng, bdy, NELEM(bdy), -1, 1);
  tu_fill_f32(&rng, o1, NELEM(o1), 5, 6);
  tu_fill_f32(&rng, o2, NELEM(o2), 5, 6);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  const int S = TG_GLU_SILU, F = TG_DTYPE_F32;
  memcpy(s1, o1, sizeof o1);
  assert_int_equal(tg_glu_forward(NULL, bg, bu, o1, S, F, BR, BC, BC, BC, BC), TG_ERR_NULL_ARG);
  assert_int_equal(tg_glu_backward(NULL, bg, bu, bdy, o1, o2, S, F, BR, BC, BC, BC, BC, BC, BC),
                   TG_ERR_NULL_ARG);
  assert_memory_equal(s1, o1, sizeof o1);
  /* forward */
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, NULL, bu, o1, S, F, BR, BC, BC, BC, BC), TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, NULL, o1, S, F, BR, BC, BC, BC, BC), TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, NULL, S, F, BR, BC, BC, BC, BC), TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, 2, F, BR, BC, BC, BC, BC), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, -1, F, BR, BC, BC, BC, BC), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, 2, BR, BC, BC, BC, BC), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, 0, BC, BC, BC, BC), TG_ERR_BAD_SHAPE);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, 0, BC, BC, BC), TG_ERR_BAD_SHAPE);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, BC, BC - 1, BC, BC), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, BC, BC, -BC, BC), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, BC, BC, BC, 0), TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, BC, INT64_MAX / 2, BC, BC),
              TG_ERR_OVERFLOW);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, 0xFFFFFFFFu, 0xFFFFFFFFu,
                                  0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu), TG_ERR_OVERFLOW);
  /* overlaps: y one element into gate; y over up at another stride; y
   * between the chunks' rows of another stride */
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, bg + 1, S, F, BR, BC, BC, BC, BC), TG_ERR_ALIAS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bu, bu, S, F, 2, BC, BC, BC, BC + 1), TG_ERR_ALIAS);
  EXPECT_FAIL(ctx, tg_glu_forward(ctx, bg, bg + BC, bg + 2, S, F, BR, BC, 2 * BC, 2 * BC, 2 * BC),
              TG_ERR_ALIAS);
  /* backward */
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, NULL, o1, o2, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, NULL, o2, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, NULL, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_NULL_ARG);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o2, 5, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o2, S, 3, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o2, S, F, BR, 0, BC, BC, BC, BC, BC),
              TG_ERR_BAD_SHAPE);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o2, S, F, BR, BC, BC, BC, 2, BC, BC),
              TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o2, S, F, BR, BC, BC, BC, BC, BC, BC - 1),
              TG_ERR_BAD_PARAMS);
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, o1 + 2, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_ALIAS); /* dgate, dup overlap */
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, bu, o2, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_ALIAS); /* dgate over up */
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, bg, S, F, BR, BC, BC, BC, BC, BC, BC),
              TG_ERR_ALIAS); /* dup over gate */
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, o1, (float *)bdy, S, F, BR, BC, BC, BC, BC,
                                   BC, BC), TG_ERR_ALIAS); /* dup over dy */
  EXPECT_FAIL(ctx, tg_glu_backward(ctx, bg, bu, bdy, bg, o2, S, F, BR, BC, BC, BC, BC, BC + 1, BC),
              TG_ERR_ALIAS); /* in place at another stride */
  /* allowed: the two chunks of one fused buffer, written in place */
  TU_EXPECT_STATUS(ctx, tg_glu_backward(ctx, bg, bg + BC, bdy, bg, bg + BC, S, F, BR, BC, 2 * BC,
                                        2 * BC, BC, 2 * BC, 2 * BC), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  TU_EXPECT_STATUS(ctx, tg_glu_forward(ctx, bg, bu, o1, S, F, BR, BC, 2 * BC, BC, BC), TG_OK);
  assert_true(tu_all_finite(o1, BR * BC));
  tg_ctx_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_glu_shapes),
      cmocka_unit_test(test_glu_specials),
      cmocka_unit_test(test_glu_limits),
      cmocka_unit_test(test_glu_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
