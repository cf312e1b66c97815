/*
 * Running error bounds for f64 references of f32 kernels: an `eb` carries
 * the exact value of a formula and a rigorous bound on how far any f32
 * evaluation of it can be (standard rounding-error analysis, Higham ch. 2-4),
 * with u = 2^-24 and ETA = 2^-150 for results in the subnormal range:
 *   rounding:   e + u(|v| + e) + ETA
 *   products:   |a| e_b + |b| e_a + e_a e_b,  quotients (e_a + |q| e_b)/(|b| - e_b)
 *   libm (expf, logf, 1 ulp): 2u relative + 2 ETA
 *   sums of n terms in any order: sum e_i + gamma_{n-1} sum(|v_i| + e_i),
 *   gamma_k = k u / (1 - k u).
 * Inputs holding NaN or +-inf (tests/test_nan_inputs.c): v follows IEEE
 * arithmetic, and a value that is NaN or infinite carries no bound (e = 0):
 * an infinity here comes from an input, not from an overflow of finite
 * values, so the f32 evaluation meets the same one exactly (x * inf, inf + x,
 * 1 / inf = 0 ...), and what it makes finite again is exact.
 */
#ifndef TG_ERRBOUND_H
#define TG_ERRBOUND_H

#include <math.h>
#include <stdint.h>

static const double EB_U = 0x1p-24;
static const double EB_ETA = 0x1p-150;

typedef struct {
  double v; /* exact value of the formula */
  double e; /* bound on |f32 evaluation - v| */
} eb;

static inline eb eb_in(float x) { return (eb){x, 0}; }
static inline eb eb_round(double v, double e) {
  if (!isfinite(v)) return (eb){v, 0};
  return (eb){v, e + EB_U * (fabs(v) + e) + EB_ETA};
}
static inline eb eb_libm(double v, double e) {
  if (!isfinite(v)) return (eb){v, 0};
  return (eb){v, e + 2 * EB_U * (fabs(v) + e) + 2 * EB_ETA};
}
static inline eb eb_mul(eb a, eb b) {
  return eb_round(a.v * b.v, fabs(a.v) * b.e + fabs(b.v) * a.e + a.e * b.e);
}
static inline eb eb_add(eb a, eb b) { return eb_round(a.v + b.v, a.e + b.e); }
static inline eb eb_sub(eb a, eb b) { return eb_round(a.v - b.v, a.e + b.e); }
static inline eb eb_div(eb a, eb b) { /* requires |b.v| > b.e */
  const double q = a.v / b.v;
  return eb_round(q, (a.e + fabs(q) * b.e) / (fabs(b.v) - b.e));
}
static inline eb eb_sqrt(eb a) { /* requires a.v > 0 */
  const double s = sqrt(a.v);
  return eb_round(s, a.e / s);
}
static inline eb eb_exp(eb a) {
  const double v = exp(a.v);
  return eb_libm(v, v > 0 ? v * expm1(a.e) : exp(a.v + a.e));
}
static inline eb eb_log(eb a) { /* requires a.v > a.e */
  return eb_libm(log(a.v), -log1p(-a.e / a.v));
}

/* sum of n terms, any order */
typedef struct {
  double v, e, mag;
  int64_t n;
} eb_sum;
static inline void eb_sum_add(eb_sum *s, eb t) {
  s->v += t.v;
  s->e += t.e;
  s->mag += fabs(t.v) + t.e;
  s->n++;
}
static inline eb eb_sum_get(const eb_sum *s) {
  if (!isfinite(s->v)) return (eb){s->v, 0};
  const double k = s->n > 1 ? (double)(s->n - 1) : 0.0;
  return (eb){s->v, s->e + k * EB_U / (1 - k * EB_U) * s->mag + k * EB_ETA};
}

#endif /* TG_ERRBOUND_H */
