/* RoPE forward and backward (tg_rope_forward, tg_rope_backward).
 *
 * Reference: f64 from the formulas of include/tilegrad.h, on the values the
 * kernel reads (bf16 widened exactly): for output j of a row, p1 = x[j]
 * cos[j] and p2 = the partner's product with its sign,
 *   rotate-half fwd: j < h: p2 = -x[j+h] sin[j];   j >= h: p2 = x[j-h] sin[j]
 *               bwd: j < h: p2 = dy[j+h] sin[j+h]; j >= h: p2 = -dy[j-h] sin[j-h]
 *   pairs: the same with the partner j ^ 1 (j even for "j < h"),
 * y[j] = p1 + p2, and y[j] = x[j] for j >= R.
 *
 * Tolerance, u = 2^-24. The kernel forms fl(fl(p1) + fl(p2)) in f32 (no
 * FMA: the row op is built without contraction), so
 *   |y32 - y| <= u|p1| + u|p2| + u(|p1| + |p2|)(1 + u) <= 2.0001 u (|p1| + |p2|),
 * plus 2^-148 for the three roundings should they underflow. A bf16 y is
 * y32 rounded once to nearest: at most half a bf16 ulp, 2^-8 |y32| <=
 * 2^-8 (|y| + the f32 part), or 2^-134 among the subnormals. The
 * pass-through features are exact (f32 or same-dtype copies), or one bf16
 * rounding of an f32 x. Every table computes the same roundings, so the
 * outputs are also compared bitwise across ISAs and thread counts.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_elems.h"
#include "testutil.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define U 0x1p-24

/* Strides (batch, head, row) of a [B, H, L, D] tensor in view v:
 * 0 contiguous, 1 [B, L, H, D] storage (HF's q.transpose(1, 2)), 2 padded. */
static void view_strides(int v, int64_t B, int64_t H, int64_t L, int64_t D, int64_t s[3]) {
  (void)B;
  if (v == 0) {
    s[2] = D, s[1] = L * D, s[0] = H * L * D;
  } else if (v == 1) {
    s[1] = D, s[2] = H * D, s[0] = L * H * D;
  } else {
    s[2] = D + 3, s[1] = L * (D + 3) + 5, s[0] = H * s[1] + 7;
  }
}

static int64_t extent(const tg_rope_params *p, const int64_t s[3]) {
  return (p->B - 1) * s[0] + (p->H - 1) * s[1] + (p->L - 1) * s[2] + p->D;
}

typedef struct {
  int B, H, L, D, R, layout;
  int xt, yt, tt; /* dtypes */
  int xview, yview, tbatch, in_place, backward, specials;
} rope_case;

static void check_case(const rope_case *k, uint64_t seed) {
  tu_rng rng = tu_rng_make(tu_seed() + seed);
  tg_rope_params p;
  assert_int_equal(tg_rope_params_init(&p, k->B, k->H, k->L, k->D, k->R, k->layout), TG_OK);
  p.x_dtype = k->xt, p.y_dtype = k->yt, p.table_dtype = k->tt;
  view_strides(k->xview, k->B, k->H, k->L, k->D, p.x_strides);
  if (k->in_place)
    memcpy(p.y_strides, p.x_strides, sizeof p.x_strides);
  else
    view_strides(k->yview, k->B, k->H, k->L, k->D, p.y_strides);
  const int64_t R = k->R, h = R / 2, D = k->D;
  const int64_t crow = R + (k->xview == 2 ? 2 : 0), srow = R;
  const int64_t nt = k->tbatch ? k->B : 1;
  p.cos_strides[1] = crow, p.cos_strides[0] = k->tbatch ? k->L * crow : 0;
  p.sin_strides[1] = srow, p.sin_strides[0] = k->tbatch ? k->L * srow : 0;
  const int64_t nx = extent(&p, p.x_strides), ny = extent(&p, p.y_strides);
  const int64_t nc = nt * k->L * crow, ns = nt * k->L * srow;
  void *x = tu_alloc(nx * te_size(k->xt)), *c = tu_alloc(nc * te_size(k->tt));
  void *s = tu_alloc(ns * te_size(k->tt));
  te_fill(&rng, x, k->xt, nx, -3, 3);
  te_fill(&rng, c, k->tt, nc, -1.5, 1.5); /* any values: the halves are not assumed equal */
  te_fill(&rng, s, k->tt, ns, -1.5, 1.5);
  if (k->specials) { /* a NaN and an inf in x, an inf in each table */
    te_put(x, k->xt, (int64_t)(tu_next(&rng) % nx), NAN);
    te_put(x, k->xt, (int64_t)(tu_next(&rng) % nx), -INFINITY);
    te_put(c, k->tt, (int64_t)(tu_next(&rng) % nc), INFINITY);
    te_put(s, k->tt, (int64_t)(tu_next(&rng) % ns), -INFINITY);
  }
  /* reference over the logical [B, H, L, D] */
  const int64_t n = (int64_t)k->B * k->H * k->L * D;
  double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
  float *got = tu_alloc(n * sizeof(float));
  uint8_t *addressed = calloc((size_t)ny, 1);
  for (int64_t b = 0; b < k->B; b++)
    for (int64_t hh = 0; hh < k->H; hh++)
      for (int64_t l = 0; l < k->L; l++) {
        const int64_t xo = b * p.x_strides[0] + hh * p.x_strides[1] + l * p.x_strides[2];
        const int64_t yo = b * p.y_strides[0] + hh * p.y_strides[1] + l * p.y_strides[2];
        const int64_t tb = k->tbatch ? b : 0;
        const int64_t co = tb * p.cos_strides[0] + l * crow, so = tb * p.sin_strides[0] + l * srow;
        for (int64_t j = 0; j < D; j++) {
          const int64_t o = ((b * k->H + hh) * k->L + l) * D + j;
          addressed[yo + j] = 1;
          const double xj = te_get(x, k->xt, xo + j);
          if (j >= R) {
            want[o] = xj;
            bound[o] = k->yt == TG_DTYPE_BF16 && k->xt == TG_DTYPE_F32
                           ? 0x1p-8 * fabs(xj) + 0x1p-134 : 0;
            continue;
          }
          const int first = k->layout == TG_ROPE_ROTATE_HALF ? j < h : j % 2 == 0;
          const int64_t partner = k->layout == TG_ROPE_ROTATE_HALF ? (first ? j + h : j - h)
                                                                   : (j ^ 1);
          const double xp = te_get(x, k->xt, xo + partner);
          const double p1 = xj * te_get(c, k->tt, co + j);
          double p2;
          if (!k->backward)
            p2 = (first ? -1 : 1) * xp * te_get(s, k->tt, so + j);
          else
            p2 = (first ? 1 : -1) * xp * te_get(s, k->tt, so + partner);
          want[o] = p1 + p2;
          bound[o] = 2.0001 * U * (fabs(p1) + fabs(p2)) + 0x1p-148;
          if (k->yt == TG_DTYPE_BF16) bound[o] += 0x1p-8 * (fabs(want[o]) + bound[o]) + 0x1p-134;
        }
      }
  void *y = tu_alloc(ny * te_size(k->yt)), *y0 = tu_alloc(ny * te_size(k->yt));
  void *yfirst = tu_alloc(ny * te_size(k->yt));
  if (k->in_place)
    memcpy(y0, x, nx * te_size(k->xt));
  else
    te_poison(y0, k->yt, ny);
  char what[256];
  snprintf(what, sizeof what,
           "%s %s B%d H%d L%d D%d R%d x%s y%s t%s view %d/%d tbatch %d inplace %d specials %d",
           k->backward ? "bwd" : "fwd", k->layout ? "pairs" : "half", k->B, k->H, k->L, k->D,
           k->R, k->xt ? "f32" : "bf16", k->yt ? "f32" : "bf16", k->tt ? "f32" : "bf16",
           k->xview, k->in_place ? k->xview : k->yview, k->tbatch, k->in_place, k->specials);
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  int first_run = 1;
  for (int ii = 0; ii < n_isas; ii++)
    for (int ti = 0; ti < tu_n_thread_counts; ti++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      memcpy(y, y0, ny * te_size(k->yt));
      void *in = k->in_place ? y : x;
      const tg_status st = k->backward ? tg_rope_backward(ctx, in, c, s, y, &p)
                                       : tg_rope_forward(ctx, in, c, s, y, &p);
      TU_EXPECT_STATUS(ctx, st, TG_OK);
      for (int64_t b = 0; b < k->B; b++)
        for (int64_t hh = 0; hh < k->H; hh++)
          for (int64_t l = 0; l < k->L; l++) {
            const int64_t yo = b * p.y_strides[0] + hh * p.y_strides[1] + l * p.y_strides[2];
            for (int64_t j = 0; j < D; j++)
              got[((b * k->H + hh) * k->L + l) * D + j] = (float)te_get(y, k->yt, yo + j);
          }
      if (!tu_check_ieee("rope", got, want, bound, NULL, n))
        TU_FAIL("%s threads=%d isa=%s", what, tu_thread_counts[ti], tg_isa_name(isas[ii]));
      for (int64_t i = 0; i < ny; i++) /* the gaps between y's rows: untouched */
        if (!addressed[i] && memcmp((char *)y + i * te_size(k->yt), (char *)y0 + i * te_size(k->yt),
                                    te_size(k->yt)))
          TU_FAIL("%s: element %lld of y's storage outside its rows was written", what,
                  (long long)i);
      if (first_run)
        memcpy(yfirst, y, ny * te_size(k->yt)), first_run = 0;
      else if (memcmp(yfirst, y, ny * te_size(k->yt)))
        TU_FAIL("%s: threads=%d isa=%s differs bitwise from the first run", what,
                tu_thread_counts[ti], tg_isa_name(isas[ii]));
      tg_ctx_destroy(ctx);
    }
  void *ptrs[] = {x, c, s, want, bound, got, addressed, y, y0, yfirst};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
}

/* dtype triples (x, y, tables): all f32, all bf16, the promotions a front
 * asks for (bf16 x with f32 tables gives f32 y) and the odd ones */
static const int dtypes[][3] = {{1, 1, 1}, {0, 0, 0}, {0, 1, 1}, {0, 0, 1}, {1, 0, 0}, {0, 1, 0}};

static void test_rope_shapes(void **state) {
  /* B, H, L, D, R: head dims 8..512, odd L, partial rotary (Phi-2: 80 of
   * which 32; R = D/2; R = 2), one head (a GQA k), long rows */
  const int shapes[][5] = {{1, 1, 1, 8, 8},     {2, 3, 7, 16, 16},   {1, 4, 33, 64, 64},
                           {2, 2, 5, 80, 32},   {1, 3, 9, 128, 128}, {1, 2, 3, 96, 48},
                           {2, 1, 17, 256, 256}, {1, 2, 3, 512, 512}, {1, 5, 4, 24, 2},
                           {3, 2, 6, 40, 20},   {1, 8, 65, 128, 64}, {1, 2, 130, 64, 64}};
  const int n_shapes = sizeof shapes / sizeof shapes[0];
  uint64_t seed = 1;
  for (int layout = 0; layout <= 1; layout++)
    for (int bwd = 0; bwd <= 1; bwd++)
      for (int si = 0; si < n_shapes; si++) {
        if (tu_short() && si % 3 == 2) continue; /* short: two thirds of the shapes */
        const int *sh = shapes[si];
        const int *dt = dtypes[(si + layout + 2 * bwd) % 6];
        rope_case k = {sh[0], sh[1], sh[2], sh[3], sh[4], layout, dt[0], dt[1], dt[2],
                       .xview = si % 3, .yview = (si + 1 + bwd) % 3, .tbatch = (si / 2) % 2,
                       .backward = bwd};
        check_case(&k, seed++);
        if (dt[0] == dt[1] && si % 2 == 0) { /* in place, same layout */
          k.in_place = 1;
          check_case(&k, seed++);
        }
      }
}

/* NaN and inf in x and in both tables reach exactly the outputs whose
 * formula reads them (the IEEE f64 reference: NaN where it is NaN, the
 * infinity where it is infinite, within the bound elsewhere). */
static void test_rope_specials(void **state) {
  uint64_t seed = 100;
  for (int layout = 0; layout <= 1; layout++)
    for (int bwd = 0; bwd <= 1; bwd++)
      for (int d = 0; d < 3; d++) {
        const int *dt = dtypes[d];
        rope_case k = {2, 3, 5, 24, 16, layout, dt[0], dt[1], dt[2], .xview = d,
                       .yview = (d + 1) % 3, .tbatch = d % 2, .backward = bwd, .specials = 1};
        check_case(&k, seed++);
      }
}

/* --- bad input: right status, a message, nothing written ---------------------- */
enum { BB = 1, BH = 2, BL = 3, BD = 8 };
static float bx[BB * BH * BL * BD], bc[BL * BD], bs[BL * BD], by[BB * BH * BL * BD + 64];
static float sy[sizeof by / sizeof by[0]];

#define EXPECT_FAIL(ctx, call, status)                         \
  do {                                                         \
    memcpy(sy, by, sizeof by);                                 \
    TU_EXPECT_STATUS(ctx, call, status);                       \
    if (memcmp(sy, by, sizeof by)) TU_FAIL("%s wrote y", #call); \
  } while (0)

static void test_rope_bad_input(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  tu_fill_f32(&rng, bx, NELEM(bx), -1, 1);
  tu_fill_f32(&rng, bc, NELEM(bc), -1, 1);
  tu_fill_f32(&rng, bs, NELEM(bs), -1, 1);
  tu_fill_f32(&rng, by, NELEM(by), 5, 6);
  tg_rope_params p0, p;
  assert_int_equal(tg_rope_params_init(&p0, BB, BH, BL, BD, BD, TG_ROPE_ROTATE_HALF), TG_OK);
  /* tg_rope_params_init's own checks, *p untouched */
  p = p0;
  assert_int_equal(tg_rope_params_init(NULL, 1, 1, 1, 8, 8, 0), TG_ERR_NULL_ARG);
  assert_int_equal(tg_rope_params_init(&p, 0, 1, 1, 8, 8, 0), TG_ERR_BAD_SHAPE);
  assert_int_equal(tg_rope_params_init(&p, 1, 1, 1, 8, 7, 0), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_rope_params_init(&p, 1, 1, 1, 8, 10, 0), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_rope_params_init(&p, 1, 1, 1, 8, 8, 2), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_rope_params_init(&p, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 8, 8, 0),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(&p, &p0, sizeof p);

  for (int bwd = 0; bwd <= 1; bwd++) {
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    tg_status (*f)(tg_ctx *, const void *, const void *, const void *, void *,
                   const tg_rope_params *) = bwd ? tg_rope_backward : tg_rope_forward;
    memcpy(sy, by, sizeof by);
    assert_int_equal(f(NULL, bx, bc, bs, by, &p0), TG_ERR_NULL_ARG);
    if (memcmp(sy, by, sizeof by)) TU_FAIL("NULL ctx wrote y");
    EXPECT_FAIL(ctx, f(ctx, NULL, bc, bs, by, &p0), TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, f(ctx, bx, NULL, bs, by, &p0), TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, f(ctx, bx, bc, NULL, by, &p0), TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, f(ctx, bx, bc, bs, NULL, &p0), TG_ERR_NULL_ARG);
    EXPECT_FAIL(ctx, f(ctx, bx, bc, bs, by, NULL), TG_ERR_NULL_ARG);
#define WITH(field_assign, status)                       \
  do {                                                   \
    p = p0;                                              \
    field_assign;                                        \
    EXPECT_FAIL(ctx, f(ctx, bx, bc, bs, by, &p), status); \
  } while (0)
    WITH(p.B = 0, TG_ERR_BAD_SHAPE);
    WITH(p.H = 0, TG_ERR_BAD_SHAPE);
    WITH(p.L = -1, TG_ERR_BAD_SHAPE);
    WITH(p.D = 0, TG_ERR_BAD_SHAPE);
    WITH(p.rotary_dim = 7, TG_ERR_BAD_PARAMS);       /* odd */
    WITH(p.rotary_dim = 0, TG_ERR_BAD_PARAMS);
    WITH(p.rotary_dim = BD + 2, TG_ERR_BAD_PARAMS);  /* R > D */
    WITH(p.layout = 2, TG_ERR_BAD_PARAMS);
    WITH(p.x_dtype = 2, TG_ERR_BAD_PARAMS);
    WITH(p.y_dtype = -1, TG_ERR_BAD_PARAMS);
    WITH(p.table_dtype = 7, TG_ERR_BAD_PARAMS);
    WITH(p.flags = 1, TG_ERR_BAD_PARAMS);
    WITH(p.x_strides[1] = -1, TG_ERR_BAD_PARAMS);
    WITH(p.cos_strides[1] = -8, TG_ERR_BAD_PARAMS);
    WITH(p.sin_strides[0] = -1, TG_ERR_BAD_PARAMS);
    WITH(p.y_strides[2] = BD - 1, TG_ERR_BAD_PARAMS); /* y's rows overlap */
    WITH(p.y_strides[1] = 0, TG_ERR_BAD_PARAMS);      /* two heads on one row */
    WITH(p.x_strides[2] = INT64_MAX / 2, TG_ERR_OVERFLOW);
    WITH(p.cos_strides[1] = INT64_MAX, TG_ERR_OVERFLOW);
    WITH((p.B = 0x7FFFFFFF, p.H = 0x7FFFFFFF, p.L = 0x7FFFFFFF), TG_ERR_OVERFLOW);
    /* overlaps: y inside x, y over a table, in place with another layout or dtype */
    p = p0;
    EXPECT_FAIL(ctx, f(ctx, by + 1, bc, bs, by, &p), TG_ERR_ALIAS);
    EXPECT_FAIL(ctx, f(ctx, bx, by, bs, by, &p), TG_ERR_ALIAS);
    EXPECT_FAIL(ctx, f(ctx, bx, bc, by + 4, by, &p), TG_ERR_ALIAS);
    p.y_strides[2] = BD + 1, p.y_strides[1] = BL * (BD + 1), p.y_strides[0] = BH * BL * (BD + 1);
    EXPECT_FAIL(ctx, f(ctx, by, bc, bs, by, &p), TG_ERR_ALIAS);
    p = p0;
    p.y_dtype = TG_DTYPE_BF16;
    EXPECT_FAIL(ctx, f(ctx, by, bc, bs, by, &p), TG_ERR_ALIAS);
    /* the context still works, and its message is cleared */
    p = p0;
    TU_EXPECT_STATUS(ctx, f(ctx, bx, bc, bs, by, &p), TG_OK);
    assert_string_equal(tg_ctx_last_error(ctx), "");
    assert_true(tu_all_finite(by, BB * BH * BL * BD));
    tg_ctx_destroy(ctx);
  }
}

/* The real tables: cos/sin of position * inv_freq, halves equal (Llama);
 * rotating forward and then backward gives x back within the bound of two
 * f32 rotations (cos^2 + sin^2 = 1 up to the tables' own rounding). */
static void test_rope_roundtrip(void **state) {
  const int B = 1, H = 4, L = 37, D = 128, R = 128;
  tg_rope_params p;
  assert_int_equal(tg_rope_params_init(&p, B, H, L, D, R, TG_ROPE_ROTATE_HALF), TG_OK);
  float *x = tu_alloc(sizeof(float) * B * H * L * D), *y = tu_alloc(sizeof(float) * B * H * L * D);
  float *c = tu_alloc(sizeof(float) * L * R), *s = tu_alloc(sizeof(float) * L * R);
  tu_rng rng = tu_rng_make(tu_seed() + 950);
  tu_fill_f32(&rng, x, B * H * L * D, -2, 2);
  for (int l = 0; l < L; l++)
    for (int i = 0; i < R / 2; i++) {
      const double a = l * pow(10000.0, -2.0 * i / R);
      c[l * R + i] = c[l * R + i + R / 2] = (float)cos(a);
      s[l * R + i] = s[l * R + i + R / 2] = (float)sin(a);
    }
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_rope_forward(ctx, x, c, s, y, &p), TG_OK);
  TU_EXPECT_STATUS(ctx, tg_rope_backward(ctx, y, c, s, y, &p), TG_OK); /* in place */
  /* |x'-x| <= 2 rotations' rounding (4.0002 u (|x| + |x'|)-ish, |x| <= 2)
   * plus |cos^2 + sin^2 - 1| <= 4u of the tables: 2^-18 absolute is ample */
  for (int64_t i = 0; i < (int64_t)B * H * L * D; i++)
    if (fabs((double)y[i] - x[i]) > 0x1p-18)
      TU_FAIL("roundtrip [%lld]: %.9g != %.9g", (long long)i, (double)y[i], (double)x[i]);
  tg_ctx_destroy(ctx);
  free(x), free(y), free(c), free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rope_shapes),
      cmocka_unit_test(test_rope_specials),
      cmocka_unit_test(test_rope_bad_input),
      cmocka_unit_test(test_rope_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
