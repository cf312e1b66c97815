/* tg_cross_entropy_fwd_bwd_ex: PyTorch's cross-entropy (int64 targets with
 * ignore_index, a double count, label smoothing eps, a grad scale, strided
 * rows, f32 or bf16). Per non-ignored row t, target y, b = grad_scale / count:
 *   m = max_j l_j, e_j = exp(l_j - m), S = sum_j e_j, p_j = e_j / S,
 *   loss_t = (1 - eps)(log S - (l_y - m)) + eps (log S - (mean_j l_j - m))
 *   grad[t,j] = (p_j - (1 - eps)[j == y]) b - eps / V b           (writes)
 *   loss_out[0] += sum_t loss_t / count                        (accumulates)
 * ignored rows: grad row 0 exactly; the gaps between strided rows are never
 * written.
 *
 * Reference: f64 from those formulas with running error bounds
 * (tests/common/errbound.h), modelled as tests/common/refs.c models the seed
 * kernel (whose analysis, in tests/test_cross_entropy.c, covers the online
 * max's extra roundings): every f32 operation of the kernel rounds once; b
 * is the double quotient rounded once to f32; eps / V * b is two f32
 * roundings; the smoothing term's mean is an f32 sum of the row (any order:
 * gamma_{V-1} of sum |l_j|), then divided in double; loss_t's combination,
 * the sum over rows and the division by count are in double (their error,
 * ~2^-52 of the magnitudes, is added as 2^-50 of them), rounded once to f32
 * with the prefill. No fudge factor. bf16 is tested bitwise: its grad is the
 * RNE bf16 of the f32 grad of the widened logits, its loss that loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "errbound.h"
#include "testutil.h"

static const double U = 0x1p-24;

enum { FILL_PLAIN, FILL_HUGE, FILL_NEGINF, FILL_NEGINF_TARGET };

typedef struct {
  uint32_t n_pos, V;
  uint64_t ld; /* row stride, >= V */
  int64_t ignore;
  double count;
  float eps, scale, prefill;
} ce_problem;

/* One row of the reference: grad values / bounds into g, ge; returns loss_t. */
static eb ref_row(const ce_problem *P, const float *l, int64_t y, double *g, double *ge) {
  const int64_t V = P->V;
  const eb b = eb_round(P->scale / P->count, fabs(P->scale / P->count) * 0x1p-52);
  const eb shift = P->eps != 0.0f ? eb_mul(eb_div(eb_in(P->eps), eb_in((float)V)), b)
                                  : (eb){0, 0};
  const eb hit = eb_sub(eb_in(1.0f), eb_in(P->eps)); /* 1 - eps in f32 */
  float m = -INFINITY;
  int has_nan = 0;
  for (int64_t j = 0; j < V; j++) {
    m = l[j] > m ? l[j] : m;
    has_nan |= isnan(l[j]);
  }
  if (m == -INFINITY) { /* no softmax: the equal-logits limit, or NaN */
    const eb p = has_nan ? (eb){NAN, 0} : eb_div(eb_in(1.0f), eb_in((float)V));
    for (int64_t j = 0; j < V; j++) {
      eb gj = eb_mul(eb_sub(p, j == y ? hit : eb_in(0.0f)), b);
      if (P->eps != 0.0f) gj = eb_sub(gj, shift);
      g[j] = gj.v, ge[j] = gj.e;
    }
    return (eb){has_nan ? NAN : INFINITY, 0};
  }
  eb_sum s = {0}, zs = {0};
  for (int64_t j = 0; j < V; j++) {
    eb_sum_add(&s, l[j] == -INFINITY ? (eb){0, 0} : eb_exp(eb_sub(eb_in(l[j]), eb_in(m))));
    eb_sum_add(&zs, eb_in(l[j]));
  }
  const eb S = eb_sum_get(&s), inv_S = eb_div(eb_in(1.0f), S);
  for (int64_t j = 0; j < V; j++) {
    const eb e = l[j] == -INFINITY ? (eb){0, 0} : eb_exp(eb_sub(eb_in(l[j]), eb_in(m)));
    const eb p = eb_mul(e, inv_S);
    eb gj = j == y ? eb_mul(eb_sub(p, hit), b) : eb_mul(p, b);
    if (P->eps != 0.0f) gj = eb_sub(gj, shift);
    g[j] = gj.v, ge[j] = gj.e;
  }
  const eb log_S = eb_log(S), nll = eb_sub(log_S, eb_sub(eb_in(l[y]), eb_in(m)));
  if (P->eps == 0.0f) return nll;
  const eb zsum = eb_sum_get(&zs);
  const double eps = P->eps, mean = zsum.v / V;
  const double v = (1 - eps) * nll.v + eps * (log_S.v - (mean - m));
  if (!isfinite(v)) return (eb){v, 0};
  const double mag = (1 - eps) * fabs(nll.v) + eps * (fabs(log_S.v) + fabs(mean) + fabs(m));
  return (eb){v, (1 - eps) * nll.e + eps * (log_S.e + zsum.e / V) + 0x1p-50 * mag};
}

/* grad [n_pos * ld] (gaps: want NaN-free untouched, checked separately) and
 * loss_out = prefill + sum_t loss_t / count. */
static void ref_ce(const ce_problem *P, const float *logits, const int64_t *tg, double *g,
                   double *ge, double *loss, double *loss_e) {
  double v = P->prefill, e = 0, mag = fabs(P->prefill);
  for (uint32_t t = 0; t < P->n_pos; t++) {
    const int64_t o = (int64_t)t * (int64_t)P->ld;
    if (tg[t] == P->ignore) {
      for (int64_t j = 0; j < P->V; j++) g[o + j] = ge[o + j] = 0;
      continue;
    }
    const eb lt = ref_row(P, logits + o, tg[t], g + o, ge + o);
    v += lt.v / P->count;
    e += lt.e / P->count;
    mag += fabs(lt.v) / P->count;
  }
  if (!isfinite(v)) {
    *loss = v, *loss_e = 0;
    return;
  }
  *loss = v;
  *loss_e = e + 0x1p-50 * mag + U * (fabs(v) + e) + EB_ETA;
}

/* The bound checks of a strided grad: rows' elements against the reference,
 * gaps unchanged (they hold the poison NaN: compare bits with `gap`). */
static int check_grad(const char *what, const ce_problem *P, const float *got, const double *want,
                      const double *bound) {
  for (uint32_t t = 0; t < P->n_pos; t++) {
    const int64_t o = (int64_t)t * (int64_t)P->ld;
    if (!tu_check_ieee(what, got + o, want + o, bound + o, NULL, P->V)) {
      print_error("  (row %u)\n", t);
      return 0;
    }
    if (t + 1 < P->n_pos)
      for (uint64_t j = P->V; j < P->ld; j++)
        if (!isnan(got[o + (int64_t)j])) {
          print_error("%s: gap element [%u, %llu] written\n", what, t, (unsigned long long)j);
          return 0;
        }
  }
  return 1;
}

static tg_status run_ex(tg_ctx *ctx, tg_dtype dt, const ce_problem *P, const void *logits,
                        const int64_t *tg, void *grad, float *loss) {
  const tg_ce_options o = {P->ignore, P->eps, P->scale, 0, 0};
  return tg_cross_entropy_fwd_bwd_ex(ctx, dt, logits, tg, grad, loss, P->n_pos, P->V, P->ld,
                                     P->count, &o);
}

/* One random case at every thread count x ISA x deterministic flag, out of
 * place and in place, f32 against the reference and bf16 bitwise against
 * the f32 run of its widened logits. */
static void check_case(uint32_t n_pos, uint32_t V, int fill, int strided, int smooth,
                       uint64_t k) {
  tu_rng rng = tu_rng_make(tu_seed() + k);
  ce_problem P = {n_pos, V, strided ? V + (uint64_t)tu_int(&rng, 1, 37) : V, -100, 0, 0, 1, 0};
  const int64_t n = (int64_t)(n_pos - 1) * (int64_t)P.ld + V;
  float *logits = tu_alloc(n * sizeof(float)), *grad = tu_alloc(n * sizeof(float));
  float *wide = tu_alloc(n * sizeof(float)), *g32 = tu_alloc(n * sizeof(float));
  tg_bf16 *l16 = tu_alloc(n * sizeof(tg_bf16)), *g16 = tu_alloc(n * sizeof(tg_bf16));
  int64_t *tg = tu_alloc(n_pos * sizeof(int64_t));
  double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
  /* ignore_index: torch's -100, a valid class id (that class is ignored,
   * as in torch), or INT64_MIN */
  const int ign = tu_int(&rng, 0, 2);
  P.ignore = ign == 0 ? -100 : ign == 1 ? tu_int(&rng, 0, (int)V - 1) : INT64_MIN;
  tu_poison_f32(logits, n);
  uint32_t kept = 0;
  for (uint32_t t = 0; t < n_pos; t++) {
    float *l = logits + (int64_t)t * (int64_t)P.ld;
    const double spread = tu_int(&rng, 0, 1) ? 3.0 : 30.0;
    tu_fill_f32(&rng, l, V, -spread, spread);
    int64_t y = tu_int(&rng, 0, (int)V - 1);
    if (tu_int(&rng, 0, 3) == 0) y = P.ignore;
    kept += y != P.ignore;
    tg[t] = y;
    for (int64_t j = 0; j < V; j++) {
      const int r = tu_int(&rng, 0, 9);
      if (fill == FILL_HUGE && r < 4) l[j] = r < 2 ? 1e30f : -1e30f;
      if ((fill == FILL_NEGINF || fill == FILL_NEGINF_TARGET) && r < 3 && j != y)
        l[j] = -INFINITY;
    }
    if (fill == FILL_NEGINF_TARGET && y != P.ignore && V > 1 && tu_int(&rng, 0, 1))
      l[y] = -INFINITY;
  }
  /* count: the caller's (HF's num_items_in_batch: any positive double) */
  P.count = kept + tu_uniform(&rng, 0.25, 3.0);
  P.eps = smooth ? (float)tu_uniform(&rng, 0.0, 1.0) : 0.0f;
  P.scale = tu_int(&rng, 0, 1) ? 1.0f : (float)tu_uniform(&rng, -4.0, 4.0);
  P.prefill = (float)tu_uniform(&rng, 0.5, 3.0);
  double lw, lw_e;
  ref_ce(&P, logits, tg, want, bound, &lw, &lw_e);
  /* bf16 inputs: the logits rounded (gaps stay NaN), and their f32 widening */
  for (int64_t i = 0; i < n; i++) {
    l16[i] = tg_f32_to_bf16(logits[i]);
    wide[i] = tg_bf16_to_f32(l16[i]);
  }

  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (int ti = 0; ti < tu_n_thread_counts; ti++)
    for (int ii = 0; ii < n_isas; ii++)
      for (int det = 0; det <= 1; det++)
        for (int inplace = 0; inplace <= 1; inplace++) {
          tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
          assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
          char what[200];
          snprintf(what, sizeof what,
                   "%ux%u ld=%llu fill=%d ignore=%lld count=%g eps=%g scale=%g threads=%d "
                   "isa=%s det=%d inplace=%d",
                   n_pos, V, (unsigned long long)P.ld, fill, (long long)P.ignore, P.count,
                   (double)P.eps, (double)P.scale, tu_thread_counts[ti],
                   tg_isa_name(isas[ii]), det, inplace);
          /* f32 against the reference */
          if (inplace) {
            memcpy(grad, logits, n * sizeof(float));
          } else {
            tu_poison_f32(grad, n);
          }
          float got = P.prefill;
          TU_EXPECT_STATUS(ctx, run_ex(ctx, TG_DTYPE_F32, &P,
                                       inplace ? (const void *)grad : logits, tg, grad, &got),
                           TG_OK);
          if (!check_grad(what, &P, grad, want, bound)) TU_FAIL("grad %s", what);
          if (!tu_check_ieee("loss", &got, &lw, &lw_e, NULL, 1)) TU_FAIL("loss %s", what);
          /* bf16: the RNE of the f32 run on the widened logits, bitwise */
          tu_poison_f32(g32, n);
          float loss32 = P.prefill, loss16 = P.prefill;
          TU_EXPECT_STATUS(ctx, run_ex(ctx, TG_DTYPE_F32, &P, wide, tg, g32, &loss32), TG_OK);
          if (inplace)
            memcpy(g16, l16, n * sizeof(tg_bf16));
          else
            for (int64_t i = 0; i < n; i++) g16[i] = 0x7FC1; /* a NaN the kernel never writes */
          TU_EXPECT_STATUS(ctx, run_ex(ctx, TG_DTYPE_BF16, &P, inplace ? (void *)g16 : l16, tg,
                                       g16, &loss16),
                           TG_OK);
          if (memcmp(&loss16, &loss32, sizeof loss16))
            TU_FAIL("bf16 loss %.9g != f32 loss of the widened logits %.9g: %s",
                    (double)loss16, (double)loss32, what);
          for (uint32_t t = 0; t < n_pos; t++)
            for (uint64_t j = 0; j < P.ld && (t + 1 < n_pos || j < V); j++) {
              const int64_t i = (int64_t)t * (int64_t)P.ld + (int64_t)j;
              const uint16_t w = j < V ? tg_f32_to_bf16(g32[i]) : inplace ? l16[i] : 0x7FC1;
              if (g16[i] != w)
                TU_FAIL("bf16 grad[%u, %llu] = 0x%04x, want 0x%04x (f32 %.9g): %s", t,
                        (unsigned long long)j, g16[i], w, (double)g32[i], what);
            }
          tg_ctx_destroy(ctx);
        }
  free(logits), free(grad), free(wide), free(g32), free(l16), free(g16), free(tg);
  free(want), free(bound);
}

static void test_ex_sizes(void **state) {
  /* vocab 1, tiny, off the 16-lane grid, ragged chunk tails (1024-element
   * chunks), many short rows, a Llama vocab */
  const uint32_t sizes[][2] = {{1, 1},   {3, 1},     {1, 7},    {3, 17},  {7, 300},
                               {200, 100}, {300, 33}, {2, 9000}, {5, 2049}, {3, 32000}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int strided = 0; strided <= 1; strided++)
      for (int smooth = 0; smooth <= 1; smooth++)
        check_case(sizes[s][0], sizes[s][1], FILL_PLAIN, strided, smooth,
                   100 + 4 * s + 2 * strided + smooth);
}

static void test_ex_special_logits(void **state) {
  for (int smooth = 0; smooth <= 1; smooth++) {
    check_case(40, 33, FILL_HUGE, 1, smooth, 200 + smooth);
    check_case(3, 3000, FILL_HUGE, 0, smooth, 202 + smooth);
    check_case(40, 33, FILL_NEGINF, 1, smooth, 204 + smooth);
    check_case(3, 5000, FILL_NEGINF, 0, smooth, 206 + smooth);
    check_case(30, 20, FILL_NEGINF_TARGET, 1, smooth, 208 + smooth);
  }
}

/* +inf and NaN logits: NaN in that row's grad and in the loss (never
 * hidden), with and without smoothing; the other rows stay finite. A row of
 * only -inf: the equal-logits limit, loss +inf. */
static void test_ex_inf_nan(void **state) {
  const float l[4 * 3] = {1.0f, NAN, 2.0f,  -INFINITY, NAN,  -INFINITY,
                          0.5f, INFINITY, 1.0f, 0.0f, 1.0f, 2.0f};
  for (int smooth = 0; smooth <= 1; smooth++)
    for (int dt = 0; dt <= 1; dt++)
      for (int row = 0; row < 3; row++) {
        tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
        const int64_t y[2] = {0, 2};
        const tg_ce_options o = {-100, smooth ? 0.25f : 0.0f, 1.0f, 0, 0};
        float g[6], loss = 0.5f;
        tg_bf16 l16[6], g16[6];
        const float *src = l + 3 * row; /* this row, then a finite one */
        float both[6];
        memcpy(both, src, 3 * sizeof(float));
        memcpy(both + 3, l + 9, 3 * sizeof(float));
        for (int j = 0; j < 6; j++) l16[j] = tg_f32_to_bf16(both[j]);
        TU_EXPECT_STATUS(ctx,
                         tg_cross_entropy_fwd_bwd_ex(ctx, dt ? TG_DTYPE_BF16 : TG_DTYPE_F32,
                                                     dt ? (const void *)l16 : both, y,
                                                     dt ? (void *)g16 : g, &loss, 2, 3, 0,
                                                     2.0, &o),
                         TG_OK);
        assert_true(isnan(loss));
        for (int j = 0; j < 6; j++) {
          const float gj = dt ? tg_bf16_to_f32(g16[j]) : g[j];
          if (j < 3 ? !isnan(gj) : !isfinite(gj))
            TU_FAIL("row %d smooth %d dtype %d: grad[%d] = %g", row, smooth, dt, j, (double)gj);
        }
        tg_ctx_destroy(ctx);
      }
  /* all -inf: p = 1/V; (p - (1 - eps)[j == y]) b - eps/V b, loss +inf */
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  float a[5], g[5], loss = 0.0f;
  for (int j = 0; j < 5; j++) a[j] = -INFINITY;
  const int64_t y = 3;
  const tg_ce_options o = {-100, 0.5f, 1.0f, 0, 0};
  TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd_ex(ctx, TG_DTYPE_F32, a, &y, g, &loss, 1, 5,
                                                    5, 4.0, &o),
                   TG_OK);
  assert_true(isinf(loss) && loss > 0);
  for (int j = 0; j < 5; j++) {
    const double want = (0.2 - (j == 3 ? 0.5 : 0.0)) / 4 - 0.5 / 5 / 4;
    if (fabs(g[j] - want) > 4 * U * 0.3) TU_FAIL("all -inf grad[%d] = %.9g want %.9g", j,
                                                 (double)g[j], want);
  }
  tg_ctx_destroy(ctx);
}

/* Every row ignored: grad 0 exactly (rows only: gaps untouched), loss_out
 * bit for bit the prefill (it adds 0 / count). */
static void test_ex_all_ignored(void **state) {
  const uint32_t n_pos = 9, V = 70, ld = 75;
  const int64_t n = (n_pos - 1) * ld + V;
  tu_rng rng = tu_rng_make(tu_seed() + 500);
  float *l = tu_alloc(n * sizeof(float)), *g = tu_alloc(n * sizeof(float));
  float *snap = tu_alloc(n * sizeof(float));
  int64_t t[9];
  tu_fill_f32(&rng, l, n, -5, 5);
  for (uint32_t i = 0; i < n_pos; i++) t[i] = -100;
  for (int ti = 0; ti < tu_n_thread_counts; ti++) {
    tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], TG_ISA_AUTO);
    for (int dt = 0; dt <= 1; dt++) {
      tu_poison_f32(g, n);
      memcpy(snap, g, n * sizeof(float));
      float loss = 1.75f;
      TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd_ex(ctx, dt ? TG_DTYPE_BF16 : TG_DTYPE_F32,
                                                        l, t, g, &loss, n_pos, V, ld, 3.0,
                                                        NULL),
                       TG_OK);
      assert_true(loss == 1.75f);
      const size_t es = dt ? 2 : 4;
      for (uint32_t r = 0; r < n_pos; r++)
        for (uint32_t j = 0; j < ld && (r + 1 < n_pos || j < V); j++) {
          const size_t at = (r * ld + j) * es;
          const int bad = j < V ? memcmp((const char *)g + at, "\0\0\0\0", es)
                                : memcmp((const char *)g + at, (const char *)snap + at, es);
          if (bad) TU_FAIL("all ignored dtype %d: grad [%u, %u] %s", dt, r, j,
                           j < V ? "not 0" : "(a gap) written");
        }
    }
    tg_ctx_destroy(ctx);
  }
  free(l), free(g), free(snap);
}

/* Bits: with eps = 0, f32, a contiguous layout and grad_scale 1 the ex entry
 * point gives the seed kernel's loss and grad exactly; and loss_out and grad
 * are bitwise identical across thread counts 1, 2, 3, 5 and repeated runs,
 * deterministic or not, on each ISA (f32 and bf16, with smoothing). */
static void test_ex_bits(void **state) {
  const uint32_t sizes[][2] = {{500, 200}, {12, 50257}, {3000, 5}};
  const int threads[] = {1, 2, 3, 5, 5};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const uint32_t n_pos = sizes[s][0], V = sizes[s][1];
    const int64_t n = (int64_t)n_pos * V;
    tu_rng rng = tu_rng_make(tu_seed() + 600 + s);
    float *l = tu_alloc(n * sizeof(float)), *g = tu_alloc(n * sizeof(float));
    float *g0 = tu_alloc(n * sizeof(float)), *gs = tu_alloc(n * sizeof(float));
    int64_t *t = tu_alloc(n_pos * sizeof(int64_t));
    uint32_t *t32 = tu_alloc(n_pos * sizeof(uint32_t));
    tu_fill_f32(&rng, l, n, -10, 10);
    for (uint32_t i = 0; i < n_pos; i++) {
      t[i] = tu_int(&rng, 0, 5) ? tu_int(&rng, 0, (int)V - 1) : -100;
      t32[i] = t[i] < 0 ? 0xFFFFFF9Cu : (uint32_t)t[i]; /* (uint32_t)-100 */
    }
    const float prefill = (float)tu_uniform(&rng, 0.5, 3);
    for (int ii = 0; ii < n_isas; ii++) {
      tg_ctx *c1 = tu_ctx(2, isas[ii]);
      float ls = prefill, le = prefill;
      TU_EXPECT_STATUS(c1, tg_cross_entropy_fwd_bwd(c1, l, t32, gs, &ls, n_pos, V, 0xFFFFFF9Cu,
                                                    n_pos),
                       TG_OK);
      TU_EXPECT_STATUS(c1, tg_cross_entropy_fwd_bwd_ex(c1, TG_DTYPE_F32, l, t, g, &le, n_pos, V,
                                                       V, (double)n_pos, NULL),
                       TG_OK);
      if (memcmp(&ls, &le, sizeof ls) || memcmp(g, gs, n * sizeof(float)))
        TU_FAIL("%ux%u isa=%s: ex (eps 0) differs from the seed entry point", n_pos, V,
                tg_isa_name(isas[ii]));
      tg_ctx_destroy(c1);
      for (int mode = 0; mode < 2; mode++) { /* 0: f32 eps 0.1; 1: bf16 in place */
        const tg_ce_options o = {-100, mode ? 0.0f : 0.1f, 0.5f, 0, 0};
        float loss0 = 0;
        for (int det = 1; det >= 0; det--)
          for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
            tg_ctx *ctx = tu_ctx(threads[k], isas[ii]);
            assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
            float loss = prefill;
            if (mode) /* bf16 logits in the first half of g, in place */
              for (int64_t i = 0; i < n; i++) ((tg_bf16 *)g)[i] = tg_f32_to_bf16(l[i]);
            TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd_ex(
                                      ctx, mode ? TG_DTYPE_BF16 : TG_DTYPE_F32,
                                      mode ? (const void *)g : l, t, g, &loss, n_pos, V, 0,
                                      n_pos + 0.5, &o),
                             TG_OK);
            const size_t bytes = n * (mode ? 2 : 4);
            if (det == 1 && k == 0) {
              loss0 = loss;
              memcpy(g0, g, bytes);
            } else if (memcmp(&loss, &loss0, sizeof loss) || memcmp(g, g0, bytes)) {
              TU_FAIL("%ux%u mode=%d det=%d threads=%d isa=%s: %s differs bitwise", n_pos, V,
                      mode, det, threads[k], tg_isa_name(isas[ii]),
                      memcmp(&loss, &loss0, sizeof loss) ? "loss" : "grad");
            }
            tg_ctx_destroy(ctx);
          }
      }
    }
    free(l), free(g), free(g0), free(gs), free(t), free(t32);
  }
}

/* Bad input: right status, a message, grad and loss_out byte-identical. */
static float b_buf[40], b_snap[40], b_loss, b_loss_snap;
static void snapshot(void) {
  memcpy(b_snap, b_buf, sizeof b_buf);
  b_loss_snap = b_loss;
}
static void expect_unchanged(const char *call) {
  if (memcmp(b_snap, b_buf, sizeof b_buf) || memcmp(&b_loss_snap, &b_loss, sizeof b_loss))
    TU_FAIL("%s changed an output on failure", call);
}
#define EXPECT_FAIL(ctx, call, status, msg)                                     \
  do {                                                                          \
    snapshot();                                                                 \
    TU_EXPECT_STATUS(ctx, call, status);                                        \
    expect_unchanged(#call);                                                    \
    if (!strstr(tg_ctx_last_error(ctx), msg))                                   \
      TU_FAIL("%s: message '%s' lacks '%s'", #call, tg_ctx_last_error(ctx), msg); \
  } while (0)

static void test_ex_bad_input(void **state) {
  tu_rng rng = tu_rng_make(tu_seed() + 900);
  float l[12], *g = b_buf; /* g: 12 floats of the snapshot buffer */
  tu_fill_f32(&rng, l, 12, -2, 2);
  tu_fill_f32(&rng, b_buf, 40, 1, 2);
  b_loss = 0.75f;
  const int64_t ok[3] = {0, -100, 1};
  const int64_t neg[3] = {0, -1, 2};       /* -1: not ignore_index */
  const int64_t big[3] = {0, 1, 4};        /* == vocab */
  const int64_t pad5[3] = {0, 1, -100};    /* -100 with ignore_index 5 */
  const uint32_t M = 0xFFFFFFFFu;
  const tg_ce_options def = TG_CE_OPTIONS_INIT;
  tg_ce_options o;
  const tg_dtype F = TG_DTYPE_F32;
#define CALL(c, lg, tg, gr, lo, np, v, ld, cnt, op) \
  tg_cross_entropy_fwd_bwd_ex(c, F, lg, tg, gr, lo, np, v, ld, cnt, op)
  for (int det = 0; det <= 1; det++) {
    tg_ctx *ctx = tu_ctx(3, TG_ISA_PORTABLE);
    assert_int_equal(tg_ctx_set_deterministic(ctx, det), TG_OK);
    snapshot();
    assert_int_equal(CALL(NULL, l, ok, g, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_NULL_ARG);
    expect_unchanged("NULL ctx");
    EXPECT_FAIL(ctx, CALL(ctx, NULL, ok, g, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_NULL_ARG,
                "logits is NULL");
    EXPECT_FAIL(ctx, CALL(ctx, l, NULL, g, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_NULL_ARG,
                "targets");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, NULL, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_NULL_ARG,
                "grad");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, NULL, 3, 4, 0, 2.0, NULL), TG_ERR_NULL_ARG,
                "loss_out");
    EXPECT_FAIL(ctx, tg_cross_entropy_fwd_bwd_ex(ctx, (tg_dtype)7, l, ok, g, &b_loss, 3, 4, 0,
                                                 2.0, NULL),
                TG_ERR_BAD_PARAMS, "dtype");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 0, 4, 0, 2.0, NULL), TG_ERR_BAD_SHAPE, "n_pos");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 0, 0, 2.0, NULL), TG_ERR_BAD_SHAPE, "vocab");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 3, 2.0, NULL), TG_ERR_BAD_SHAPE,
                "row_stride");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, M, M, 0, 2.0, NULL), TG_ERR_OVERFLOW, "");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, (uint64_t)1 << 62, 2.0, NULL),
                TG_ERR_OVERFLOW, "row_stride");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, UINT64_MAX, 2.0, NULL), TG_ERR_OVERFLOW,
                "row_stride");
    const double counts[] = {0.0, -1.0, NAN, INFINITY, -0.0};
    for (size_t i = 0; i < 5; i++)
      EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 0, counts[i], NULL),
                  TG_ERR_BAD_PARAMS, "count");
    const float epss[] = {-0.1f, NAN, 1.5f, INFINITY, -INFINITY};
    for (size_t i = 0; i < 5; i++) {
      o = def, o.label_smoothing = epss[i];
      EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 0, 2.0, &o), TG_ERR_BAD_PARAMS,
                  "label_smoothing");
    }
    o = def, o.grad_scale = NAN;
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 0, 2.0, &o), TG_ERR_BAD_PARAMS,
                "grad_scale");
    o = def, o.grad_scale = -INFINITY;
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 0, 2.0, &o), TG_ERR_BAD_PARAMS,
                "grad_scale");
    o = def, o.flags = 4;
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, &b_loss, 3, 4, 0, 2.0, &o), TG_ERR_BAD_PARAMS, "flags");
    EXPECT_FAIL(ctx, CALL(ctx, l, neg, g, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_BAD_INDEX,
                "targets[1] = -1");
    EXPECT_FAIL(ctx, CALL(ctx, l, big, g, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_BAD_INDEX,
                "targets[2] = 4");
    o = def, o.ignore_index = 5;
    EXPECT_FAIL(ctx, CALL(ctx, l, pad5, g, &b_loss, 3, 4, 0, 2.0, &o), TG_ERR_BAD_INDEX,
                "targets[2] = -100");
    /* overlaps: grad one element into logits (here both in b_buf), grad
     * over the targets, loss_out inside grad or logits; a strided logits
     * whose extent reaches grad */
    EXPECT_FAIL(ctx, CALL(ctx, b_buf, ok, b_buf + 1, &b_loss, 3, 4, 0, 2.0, NULL), TG_ERR_ALIAS,
                "overlap");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, (void *)ok, &b_loss, 1, 4, 0, 2.0, NULL), TG_ERR_ALIAS,
                "overlap");
    EXPECT_FAIL(ctx, CALL(ctx, l, ok, g, g + 5, 3, 4, 0, 2.0, NULL), TG_ERR_ALIAS, "overlap");
    EXPECT_FAIL(ctx, CALL(ctx, b_buf + 20, ok, g, b_buf + 28, 3, 4, 0, 2.0, NULL), TG_ERR_ALIAS,
                "overlap");
    EXPECT_FAIL(ctx, CALL(ctx, b_buf, ok, b_buf + 20, &b_loss, 3, 4, 9, 2.0, NULL),
                TG_ERR_ALIAS, "overlap");

    /* accepted: in place, an out-of-range id equal to ignore_index, and a
     * strided layout whose rows end just before grad */
    o = def, o.ignore_index = 4;
    TU_EXPECT_STATUS(ctx, CALL(ctx, b_buf, big, b_buf, &b_loss, 3, 4, 0, 2.0, &o), TG_OK);
    assert_string_equal(tg_ctx_last_error(ctx), "");
    assert_true(tu_all_finite(b_buf, 12) && isfinite(b_loss));
    for (int j = 8; j < 12; j++) assert_true(b_buf[j] == 0.0f);
    TU_EXPECT_STATUS(ctx, CALL(ctx, b_buf, ok, b_buf + 20, &b_loss, 3, 4, 8, 2.0, NULL), TG_OK);
    tg_ctx_destroy(ctx);
  }
#undef CALL
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ex_sizes),       cmocka_unit_test(test_ex_special_logits),
      cmocka_unit_test(test_ex_inf_nan),     cmocka_unit_test(test_ex_all_ignored),
      cmocka_unit_test(test_ex_bits),        cmocka_unit_test(test_ex_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
