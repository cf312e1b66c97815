#include "refs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "errbound.h"
#include "testutil.h"

static const double U = 0x1p-24;

/* --- 1. compute_d ------------------------------------------------------------------
 * Products of bf16 are exact in f32; a sum of D terms in any order is within
 * gamma(D) = (D + 2) u of the sum of their magnitudes. */
void ref_compute_d(const tg_bf16 *O, const tg_bf16 *dO, int64_t rows, int64_t D, double *want,
                   double *bound) {
  for (int64_t i = 0; i < rows; i++) {
    double s = 0, a = 0;
    for (int64_t d = 0; d < D; d++) {
      const double x = (double)tg_bf16_to_f32(O[i * D + d]) * tg_bf16_to_f32(dO[i * D + d]);
      s += x;
      a += fabs(x);
    }
    want[i] = s;
    bound[i] = (D + 2) * U * a;
  }
}

/* --- 3. cast: the nearest of the two bf16 neighbours, compared in f64; ties
 * to the even mantissa. Independent of the kernel's bit trick. */
uint16_t ref_bf16(float x) {
  if (isnan(x)) return 0x7FC0;
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  if ((u & 0xFFFF) == 0) return lo;
  const double dlo = fabs((double)x - tg_bf16_to_f32(lo));
  const double dhi = fabs((double)tg_bf16_to_f32(hi) - x); /* hi may be inf */
  if ((lo & 0x7F80) == 0x7F00 && (lo & 0x7F) == 0x7F) { /* next is inf */
    /* halfway point to 2^128 decides overflow, as IEEE rounding does */
    const double half = ldexp(1.0, 128) - ldexp(1.0, 127 - 8);
    return fabs((double)x) >= half ? (uint16_t)((lo & 0x8000) | 0x7F80) : lo;
  }
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

/* --- 4-5. RMSNorm (running error bounds, errbound.h) --------------------------------- */
/* r = 1 / sqrt(sum_j x[j]^2 / dim + eps) */
static eb rms_inv(const float *x, uint32_t dim, float eps) {
  eb_sum ss = {0};
  for (uint32_t j = 0; j < dim; j++) eb_sum_add(&ss, eb_mul(eb_in(x[j]), eb_in(x[j])));
  return eb_div(eb_in(1.0f), eb_sqrt(eb_add(eb_div(eb_sum_get(&ss), eb_in((float)dim)),
                                            eb_in(eps))));
}

/* dx row from r (an exact input or a computed value with its bound):
 * s = sum dy x w, dx[k] = r (dy[k] w[k] - x[k] (s r r / dim)) */
static void rms_dx_row(const float *x, const float *w, const float *dy, eb r, uint32_t dim,
                       double *out, double *out_e) {
  eb_sum s = {0};
  for (uint32_t i = 0; i < dim; i++)
    eb_sum_add(&s, eb_mul(eb_mul(eb_in(dy[i]), eb_in(x[i])), eb_in(w[i])));
  const eb coeff = eb_div(eb_mul(eb_mul(eb_sum_get(&s), r), r), eb_in((float)dim));
  for (uint32_t k = 0; k < dim; k++) {
    const eb d = eb_mul(r, eb_sub(eb_mul(eb_in(dy[k]), eb_in(w[k])),
                                  eb_mul(eb_in(x[k]), coeff)));
    out[k] = d.v;
    out_e[k] = d.e;
  }
}

void ref_rms_forward(const float *x, const float *w, uint32_t rows, uint32_t dim, float eps,
                     double *y, double *y_e, double *r, double *r_e) {
  for (uint32_t b = 0; b < rows; b++) {
    const int64_t o = (int64_t)b * dim;
    const eb rb = rms_inv(x + o, dim, eps);
    r[b] = rb.v;
    r_e[b] = rb.e;
    if (!y) continue;
    for (uint32_t k = 0; k < dim; k++) { /* (x r) w, the kernel's order */
      const eb yk = eb_mul(eb_mul(eb_in(x[o + k]), rb), eb_in(w[k]));
      y[o + k] = yk.v;
      y_e[o + k] = yk.e;
    }
  }
}

void ref_rms_dx(const float *x, const float *w, const float *dy, const float *r, uint32_t rows,
                uint32_t dim, double *dx, double *dx_e) {
  for (uint32_t b = 0; b < rows; b++) {
    const int64_t o = (int64_t)b * dim;
    rms_dx_row(x + o, w, dy + o, eb_in(r[b]), dim, dx + o, dx_e + o);
  }
}

void ref_rms_dw(const float *x, const float *dy, const float *r, uint32_t rows, uint32_t dim,
                double *dw, double *dw_e) {
  eb_sum *acc = calloc(dim, sizeof *acc);
  if (!acc) fail_msg("out of memory");
  for (uint32_t b = 0; b < rows; b++)
    for (uint32_t i = 0; i < dim; i++) {
      const int64_t e = (int64_t)b * dim + i;
      eb_sum_add(&acc[i], eb_mul(eb_mul(eb_in(dy[e]), eb_in(x[e])), eb_in(r[b])));
    }
  for (uint32_t i = 0; i < dim; i++) {
    const eb a = eb_sum_get(&acc[i]);
    dw[i] = a.v;
    dw_e[i] = a.e;
  }
  free(acc);
}

void ref_rms_fused(const float *x, const float *w, const float *dy, const float *gw_pre,
                   uint32_t rows, uint32_t dim, float eps, double *dx, double *dx_e, double *gw,
                   double *gw_e) {
  eb_sum *acc = calloc(dim, sizeof *acc);
  if (!acc) fail_msg("out of memory");
  for (uint32_t i = 0; i < dim; i++) eb_sum_add(&acc[i], eb_in(gw_pre[i]));
  for (uint32_t b = 0; b < rows; b++) {
    const int64_t o = (int64_t)b * dim;
    const eb r = rms_inv(x + o, dim, eps);
    rms_dx_row(x + o, w, dy + o, r, dim, dx + o, dx_e + o);
    for (uint32_t i = 0; i < dim; i++)
      eb_sum_add(&acc[i], eb_mul(eb_mul(eb_in(x[o + i]), r), eb_in(dy[o + i])));
  }
  for (uint32_t i = 0; i < dim; i++) {
    const eb g = eb_sum_get(&acc[i]);
    gw[i] = g.v;
    gw_e[i] = g.e;
  }
  free(acc);
}

/* --- 6. softmax backward: dot = sum sm go, out = sm (go - dot) ------------------------ */
void ref_softmax_backward(const float *sm, const float *go, uint32_t rows, uint32_t len,
                          double *want, double *bound) {
  for (uint32_t b = 0; b < rows; b++) {
    const int64_t o = (int64_t)b * len;
    eb_sum s = {0};
    for (uint32_t i = 0; i < len; i++) eb_sum_add(&s, eb_mul(eb_in(sm[o + i]), eb_in(go[o + i])));
    const eb dot = eb_sum_get(&s);
    for (uint32_t j = 0; j < len; j++) {
      const eb g = eb_mul(eb_in(sm[o + j]), eb_sub(eb_in(go[o + j]), dot));
      want[o + j] = g.v;
      bound[o + j] = g.e;
    }
  }
}

/* --- 7. embedding backward ------------------------------------------------------------
 * Element (v, d) is the f32 sum of the prefill and the n contributions of
 * the tokens with id v: within gamma_n of the sum of |terms|; allowed
 * 2 n u sum|terms| (tests/test_embedding.c). */
void ref_embedding_backward(const float *grad_out, const uint32_t *ids, const float *pre,
                            uint32_t vocab, uint32_t seq, uint32_t dim, double *want,
                            double *bound) {
  const int64_t nw = (int64_t)vocab * dim;
  double *sumabs = calloc(nw, sizeof(double));
  int64_t *cnt = calloc(vocab, sizeof(int64_t));
  if (!sumabs || !cnt) fail_msg("out of memory");
  for (int64_t i = 0; i < nw; i++) {
    want[i] = pre[i];
    sumabs[i] = fabs(pre[i]);
  }
  for (int64_t t = 0; t < seq; t++) {
    const int64_t v = ids[t];
    cnt[v]++;
    for (int64_t d = 0; d < dim; d++) {
      want[v * dim + d] += grad_out[t * dim + d];
      sumabs[v * dim + d] += fabs(grad_out[t * dim + d]);
    }
  }
  for (int64_t v = 0; v < vocab; v++)
    for (int64_t d = 0; d < dim; d++)
      bound[v * dim + d] = 2.0 * (double)cnt[v] * U * sumabs[v * dim + d];
  free(sumabs);
  free(cnt);
}

/* --- 8. cross-entropy (running bounds; tests/test_cross_entropy.c) -------------------
 * One row: the grad row and loss_t; m = max_j l_j (NaN entries skipped, as
 * in the kernel; a NaN still reaches S and so every output). */
static eb ce_row(const float *l, int64_t V, uint32_t y, uint32_t count, double *g, double *g_e) {
  float m = -INFINITY;
  int has_nan = 0;
  for (int64_t j = 0; j < V; j++) {
    m = l[j] > m ? l[j] : m;
    has_nan |= isnan(l[j]);
  }
  const eb inv_count = eb_div(eb_in(1.0f), eb_in((float)count));
  if (m == -INFINITY) { /* contract: no softmax; the equal-logits limit, or NaN */
    const eb p = has_nan ? (eb){NAN, 0} : eb_div(eb_in(1.0f), eb_in((float)V));
    for (int64_t j = 0; j < V; j++) {
      const eb gj = eb_mul(eb_sub(p, eb_in(j == y ? 1.0f : 0.0f)), inv_count);
      g[j] = gj.v;
      g_e[j] = gj.e;
    }
    return (eb){has_nan ? NAN : INFINITY, 0};
  }
  eb_sum s = {0};
  for (int64_t j = 0; j < V; j++)
    eb_sum_add(&s, l[j] == -INFINITY ? (eb){0, 0} : eb_exp(eb_sub(eb_in(l[j]), eb_in(m))));
  const eb S = eb_sum_get(&s);
  const eb inv_S = eb_div(eb_in(1.0f), S);
  for (int64_t j = 0; j < V; j++) {
    const eb e = l[j] == -INFINITY ? (eb){0, 0} : eb_exp(eb_sub(eb_in(l[j]), eb_in(m)));
    const eb gj = eb_mul(eb_sub(eb_mul(e, inv_S), eb_in(j == y ? 1.0f : 0.0f)), inv_count);
    g[j] = gj.v;
    g_e[j] = gj.e;
  }
  /* a -inf target has probability 0: loss log S - (-inf) = +inf, grad finite */
  return eb_sub(eb_log(S), eb_sub(eb_in(l[y]), eb_in(m)));
}

void ref_cross_entropy(const float *logits, const uint32_t *targets, uint32_t n_pos, uint32_t V,
                       uint32_t pad_id, uint32_t count, float prefill, double *grad,
                       double *grad_e, double *loss, double *loss_e) {
  /* the loss: an f32 sum of the prefill and loss_t / count (the kernel sums
   * in f64, more accurately) */
  eb_sum sum = {0};
  eb_sum_add(&sum, eb_in(prefill));
  for (uint32_t t = 0; t < n_pos; t++) {
    const int64_t o = (int64_t)t * V;
    if (targets[t] == pad_id) {
      for (int64_t j = 0; j < V; j++) grad[o + j] = grad_e[o + j] = 0;
      continue;
    }
    const eb lt = ce_row(logits + o, V, targets[t], count, grad + o, grad_e + o);
    eb_sum_add(&sum, eb_div(lt, eb_in((float)count)));
  }
  const eb l = eb_sum_get(&sum);
  *loss = l.v;
  *loss_e = l.e;
}

/* --- 10. causal attention backward (the bound: tests/test_causal_attention.c) ------ */
void ref_causal_attention_backward(const float *dO, const float *Q, const float *K,
                                   const float *V, const float *preK, const float *preV,
                                   uint32_t S_, uint32_t H_, uint32_t Hkv_, uint32_t D_,
                                   int dense, double *wQ, double *bQ, double *wK, double *bK,
                                   double *wV, double *bV) {
  const int64_t S = S_, H = H_, Hkv = Hkv_, D = D_, hpk = H / Hkv;
  const int64_t ldq = H * D, ldk = Hkv * D, nk = S * ldk;
  const double scale = 1.0 / sqrt((double)D);
  double *s = tu_alloc(S * sizeof(double)), *P = tu_alloc(S * sizeof(double));
  double *dP = tu_alloc(S * sizeof(double)), *dS = tu_alloc(S * sizeof(double));
  double *eds = tu_alloc(S * sizeof(double)), *edp = tu_alloc(S * sizeof(double));
  double *O = tu_alloc(D * sizeof(double));
  /* dK/dV: value, sum of |terms| (prefill included), propagated error */
  double *magK = tu_alloc(nk * sizeof(double)), *propK = tu_alloc(nk * sizeof(double));
  double *magV = tu_alloc(nk * sizeof(double)), *propV = tu_alloc(nk * sizeof(double));
  for (int64_t e = 0; e < nk; e++) {
    wK[e] = preK[e];
    wV[e] = preV[e];
    magK[e] = fabs(preK[e]);
    magV[e] = fabs(preV[e]);
    propK[e] = propV[e] = 0.0;
  }
  for (int64_t i = 0; i < S; i++)
    for (int64_t h = 0; h < H; h++) {
      /* keys j < n are visible; the dense reference takes every key */
      const int64_t g = h / hpk, n = i + 1, nj = dense ? S : n;
      const float *q = Q + i * ldq + h * D, *dOi = dO + i * ldq + h * D;
      double m = -INFINITY, Es = 0;
      int has_nan = 0;
      for (int64_t j = 0; j < nj; j++) {
        if (j >= n) {
          s[j] = -INFINITY;
          continue;
        }
        const float *k = K + j * ldk + g * D;
        double acc = 0, mag = 0;
        for (int64_t d = 0; d < D; d++) {
          acc += (double)q[d] * k[d];
          mag += fabs((double)q[d] * k[d]);
        }
        s[j] = scale * acc;
        m = s[j] > m ? s[j] : m;
        has_nan |= isnan(s[j]);
        if (isfinite(s[j])) Es = fmax(Es, (D + 2) * U * scale * mag);
      }
      /* contract: every visible score -inf is a row that sees no key */
      const int no_key = !has_nan && m == -INFINITY;
      if (no_key && !dense) {
        for (int64_t d = 0; d < D; d++) wQ[i * ldq + h * D + d] = bQ[i * ldq + h * D + d] = 0;
        continue;
      }
      double Z = 0, R = 0;
      for (int64_t j = 0; j < n; j++) {
        Z += exp(s[j] - m);
        if (isfinite(s[j])) R = fmax(R, m - s[j]);
      }
      const double T = ceil(n / 16.0), Lse = m + log(Z);
      const double rho = 2 * Es + (3 * R + n + 5 * T + 8 + 3 * log((double)n) + fabs(Lse)) * U;
      for (int64_t j = 0; j < nj; j++) P[j] = no_key ? 0.0 : exp(s[j] - m) / Z;
      /* a pair enters where it has a term: P != 0, or every pair (dense) */
#define TERM(j) (dense || P[j] != 0)
      /* delta = dO . O as the kernel forms it (O = sum_j P_j V_j: = sum_j P_j
       * dP_j, but the two differ in IEEE arithmetic when dO holds an
       * infinity); a row that sees no key has O = 0 */
      for (int64_t d = 0; d < D; d++) O[d] = 0;
      for (int64_t j = 0; j < nj; j++)
        if (TERM(j) && !no_key)
          for (int64_t d = 0; d < D; d++) O[d] += P[j] * V[j * ldk + g * D + d];
      double delta = 0, sum_pm = 0;
      for (int64_t d = 0; d < D; d++) delta += (double)dOi[d] * O[d];
      for (int64_t j = 0; j < nj; j++) {
        const float *v = V + j * ldk + g * D;
        double acc = 0, mag = 0;
        for (int64_t d = 0; d < D; d++) {
          acc += (double)dOi[d] * v[d];
          mag += fabs((double)dOi[d] * v[d]);
        }
        dP[j] = acc;
        edp[j] = (D + 1) * U * mag;
        if (P[j] != 0) sum_pm += P[j] * mag;
      }
      const double edelta = (rho + (n + T + D + 2) * U) * sum_pm;
      for (int64_t j = 0; j < nj; j++) {
        dS[j] = P[j] * (dP[j] - delta);
        eds[j] = rho * P[j] * fabs(dP[j] - delta) + P[j] * (edp[j] + edelta) +
                 3 * U * P[j] * (fabs(dP[j]) + fabs(delta));
      }
      /* dQ[i,h,:] */
      for (int64_t d = 0; d < D; d++) {
        double acc = 0, mag = 0, prop = 0;
        for (int64_t j = 0; j < nj; j++) {
          if (!TERM(j)) continue;
          const double kd = K[j * ldk + g * D + d];
          acc += dS[j] * kd;
          mag += fabs(dS[j] * kd);
          prop += eds[j] * fabs(kd);
        }
        wQ[i * ldq + h * D + d] = scale * acc;
        bQ[i * ldq + h * D + d] = 2.0 * (scale * prop + (n + 3) * U * scale * mag);
      }
      /* dK[j,g,:], dV[j,g,:] */
      for (int64_t j = 0; j < nj; j++) {
        if (!TERM(j)) continue;
        for (int64_t d = 0; d < D; d++) {
          const int64_t e = j * ldk + g * D + d;
          wK[e] += scale * dS[j] * q[d];
          magK[e] += scale * fabs(dS[j] * q[d]);
          propK[e] += scale * eds[j] * fabs(q[d]);
          wV[e] += P[j] * dOi[d];
          magV[e] += P[j] * fabs(dOi[d]);
          propV[e] += rho * P[j] * fabs(dOi[d]);
        }
      }
#undef TERM
    }
  for (int64_t j = 0; j < S; j++)
    for (int64_t e = j * ldk; e < (j + 1) * ldk; e++) {
      const double N = (double)(S - j) * hpk; /* contributions to key row j */
      bK[e] = 2.0 * (propK[e] + (N + 3) * U * magK[e]);
      bV[e] = 2.0 * (propV[e] + (N + 2) * U * magV[e]);
    }
  free(s), free(P), free(dP), free(dS), free(eds), free(edp), free(O);
  free(magK), free(propK), free(magV), free(propV);
}

/* --- 11. decode ------------------------------------------------------------------------ */
const uint8_t ref_tq_d1_signs[64] = {
    0xa7, 0x3b, 0x91, 0xf4, 0x6d, 0xc2, 0x58, 0x0e, 0xb3, 0x7f, 0x24, 0xd6, 0x89,
    0x45, 0xea, 0x1c, 0x63, 0xaf, 0xd8, 0x52, 0x97, 0x0b, 0xe1, 0x3d, 0x76, 0xc4,
    0x19, 0xfe, 0x4a, 0x85, 0x2c, 0xdb, 0xd3, 0x4e, 0xa8, 0x17, 0x9c, 0x5b, 0xe6,
    0x31, 0x72, 0xb9, 0x0d, 0xf5, 0x43, 0x8a, 0x6e, 0xc7, 0x58, 0x2f, 0x94, 0xe1,
    0xb6, 0x3d, 0x0a, 0x7c, 0xc5, 0x61, 0xd8, 0x4f, 0xa3, 0x97, 0x1e, 0x85};

static int popcount64(uint64_t x) {
  int n = 0;
  for (; x; x &= x - 1) n++;
  return n;
}

/* Against the O(D^2) Hadamard matrix. Each output is a sum of D terms +-x_i
 * by a log2(D)-deep tree of f32 additions whose partial sums are bounded by
 * sum|x_i|, then one multiply by the rounded 1/sqrt(D):
 * (log2 D + 2) u sum|x_i| / sqrt(D); allowed twice that. */
void ref_fwht_sign_undo(const float *x, uint32_t nh, uint32_t D, double *want, double *bound) {
  int logd = 0;
  while ((1u << logd) < D) logd++;
  for (uint32_t h = 0; h < nh; h++) {
    const float *xr = x + (int64_t)h * D;
    double sumabs = 0;
    for (uint32_t i = 0; i < D; i++) sumabs += fabs(xr[i]);
    for (uint32_t j = 0; j < D; j++) {
      double acc = 0;
      for (uint32_t i = 0; i < D; i++) acc += (popcount64(i & j) & 1 ? -1.0 : 1.0) * xr[i];
      acc /= sqrt((double)D);
      const int neg = (ref_tq_d1_signs[j >> 3] >> (j & 7)) & 1;
      want[(int64_t)h * D + j] = neg ? -acc : acc;
      bound[(int64_t)h * D + j] = 2.0 * (logd + 2) * U * sumabs / sqrt((double)D);
    }
  }
}

/* Bound (tests/test_decode.c), from the f32 htmp: with X = max_w (Mg - M_w)
 * over non-empty workgroups, N_d = sum_w |part_w,d| a_w:
 * 2 (nwg + 5 + X) u (N_d / St + |dst_d|). */
void ref_vec_reduce(const float *htmp, uint32_t nrows, uint32_t DV, uint32_t nwg, double *want,
                    double *bound) {
  const int64_t n_part = (int64_t)nrows * DV * nwg;
  double *a = tu_alloc(nwg * sizeof(double));
  for (int64_t r = 0; r < nrows; r++) {
    const float *SM = htmp + n_part + r * nwg * 2;
    double Mg = -INFINITY;
    for (int64_t w = 0; w < nwg; w++) Mg = SM[2 * w + 1] > Mg ? SM[2 * w + 1] : Mg;
    double St = 0, X = 0;
    for (int64_t w = 0; w < nwg; w++) {
      const double M = SM[2 * w + 1];
      if (M == -INFINITY) continue; /* empty: never read */
      /* the f32 weight, as the kernel has it: rounding it costs less than
       * the 2u counted for expf, and a weight that underflows in f32 is an
       * exact 0, which multiplies its S and partials (0 * NaN is NaN) */
      a[w] = (float)exp(M - Mg);
      St += SM[2 * w] * a[w];
      X = Mg - M > X ? Mg - M : X;
    }
    for (int64_t d = 0; d < DV; d++) {
      double num = 0, N = 0;
      for (int64_t w = 0; w < nwg; w++) {
        if (SM[2 * w + 1] == -INFINITY) continue;
        const double p = htmp[((r * (DV / 4) + d / 4) * nwg + w) * 4 + d % 4];
        num += p * a[w];
        N += fabs(p) * a[w];
      }
      const double o = St == 0 ? 0.0 : num / St; /* St == 0: the contract's 0 */
      want[r * DV + d] = o;
      bound[r * DV + d] = St == 0 ? 0.0 : 2.0 * ((double)nwg + 5.0 + X) * U * (N / St + fabs(o));
    }
  }
  free(a);
}
