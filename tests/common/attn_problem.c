#include "attn_problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double attn_dot(const tg_bf16 *a, const tg_bf16 *b, int64_t D, double *abs_sum) {
  double s = 0, as = 0;
  for (int64_t d = 0; d < D; d++) {
    const double x = attn_bf(a[d]) * attn_bf(b[d]);
    s += x;
    as += fabs(x);
  }
  *abs_sum = as;
  return s;
}

/* Score of (b, h, i, k) in f64 with its f32 error bound:
 * e_s = |scale| gamma(D) sum_d |q k| + 4u(|s| + |scale q.k|) + u|s + m|, and
 * with softcap the error of t = tanh(scale q.k / softcap). */
static attn_key score(const attn_problem *pb, int64_t b, int64_t h, int64_t i, int64_t k) {
  const tg_attn_params *p = &pb->p;
  const tg_bf16 *q = pb->Q + attn_off3(p->Q_strides, b, h, i);
  const tg_bf16 *kk = pb->K + attn_off3(p->K_strides, b, h / p->gqa_factor, k);
  double aqk;
  const double qk = attn_dot(q, kk, p->D, &aqk);
  double s = p->scale * qk;
  /* an infinite product (from an infinite input) is exact, and so is what
   * the f32 score makes of it: scale * inf, tanh(+-inf) = +-1 */
  const double ez = isinf(qk) ? 0 : fabs(p->scale) * gam(p->D) * aqk;
  attn_key key = {0};
  if (p->softcapping != 1.0f) {
    key.t = tanh(s / p->softcapping);
    key.terr = ez / p->softcapping + 4 * U;
    s = p->softcapping * key.t;
  }
  double m = 0;
  key.vis = !(pb->c.causal && k > i + p->qL_off);
  if (key.vis && pb->mask) {
    m = attn_bf(pb->mask[attn_off3(pb->mp.M_strides, b, h, i) + k]);
    if (m == -INFINITY) key.vis = 0;
  }
  if (!key.vis) m = 0;
  key.err = ez + 4 * U * (fabs(s) + (isinf(qk) ? 0 : fabs(p->scale * qk))) + U * fabs(s + m);
  key.s = s + m;
  return key;
}

/*
 * Forward reference for a row with score maximum mx: O = sum_k exp(s_k - mx)
 * V_k / l, L = mx + log l. Bound of an f32 online softmax over key tiles of at
 * least 16 keys (T tile steps): each final weight exp(s_k - mx) carries a
 * relative error of at most eps = se_k + E + (T + 2) 2u + 2u R (E = max score
 * bound, R = max |s - mx|; every rescale exp(m_old - m_new) adds u|dm| + 2u and
 * the dm add up to <= R).
 * O: (eps + gamma(kL)) (sum P|V| / l + |O|) + u|O|, doubled for second-order
 * terms, plus the bf16 rounding of the output, 2^-8 (|O| + e).
 * L: 2 (E + eps + gamma(kL) + u|L| + 2u|log l|).
 * A row that sees no key has O = 0 exactly and L = -inf.
 */
static void forward_row(attn_problem *pb, const attn_row *r, double mx) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, kL = p->kL;
  const attn_key *key = r->key;
  double l = 0;
  for (int64_t k = 0; k < kL; k++) l += key[k].vis ? exp(key[k].s - mx) : 0;
  if (!(l > 0)) {
    pb->Lr[r->row] = -INFINITY;
    return;
  }
  double E = 0, R = 0;
  for (int64_t k = 0; k < kL; k++)
    if (key[k].vis) {
      E = fmax(E, key[k].err);
      R = fmax(R, mx - key[k].s);
    }
  const double T = (double)((kL + 15) / 16);
  const double eps = 2 * E + (T + 2) * 2 * U + 2 * U * R + gam(kL);
  double *O = pb->Or + r->row * D, *Oe = pb->Oe + r->row * D;
  for (int64_t k = 0; k < kL; k++) {
    if (!key[k].vis) continue;
    const double w = exp(key[k].s - mx) / l;
    const tg_bf16 *Vk = pb->V + attn_off3(p->V_strides, r->b, r->hk, k);
    for (int64_t d = 0; d < D; d++) {
      O[d] += w * attn_bf(Vk[d]);
      Oe[d] += w * fabs(attn_bf(Vk[d]));
    }
  }
  for (int64_t d = 0; d < D; d++) {
    const double e = 2 * (eps * (Oe[d] + fabs(O[d])) + U * fabs(O[d]));
    Oe[d] = e + 0x1p-8 * (fabs(O[d]) + e); /* bf16: p = 8, u = 2^-8 */
  }
  pb->Lr[r->row] = mx + log(l);
  pb->Le[r->row] = 2 * (E + eps + U * fabs(pb->Lr[r->row]) + 2 * U * fabs(log(l)));
}

/* dQ_i += sum_k dS_k K_k, dK_k += dS_k Q_i, dV_k += P_k dO_i, with the error
 * terms sum e_dS|K| + gamma(kL) sum|dS K| (dQ), sum e_dS|Q| and sum e_P|dO|
 * (dK, dV); the gamma terms of dK and dV need the whole column, so their
 * sums of |terms| go to sK, sV. */
static void accumulate_row(attn_problem *pb, const attn_row *r, double *sK, double *sV) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, kL = p->kL, Hk = p->H / p->gqa_factor;
  const tg_bf16 *Qi = pb->Q + attn_off3(p->Q_strides, r->b, r->h, r->i);
  for (int64_t k = 0; k < kL; k++) {
    if (!r->dense && r->P[k] == 0) continue; /* no term */
    const tg_bf16 *Kk = pb->K + attn_off3(p->K_strides, r->b, r->hk, k);
    const int64_t ko = ((r->b * Hk + r->hk) * kL + k) * D;
    const double dS = r->dS[k], dSe = r->dSe[k], P = r->P[k], Pe = r->Pe[k];
    for (int64_t d = 0; d < D; d++) {
      const double kd = attn_bf(Kk[d]), qd = attn_bf(Qi[d]), od = attn_bf(r->dO[d]);
      pb->dQr[r->row * D + d] += dS * kd;
      pb->dQe[r->row * D + d] += dSe * fabs(kd) + gam(kL) * fabs(dS * kd);
      pb->dKr[ko + d] += dS * qd;
      pb->dKe[ko + d] += dSe * fabs(qd);
      sK[ko + d] += fabs(dS * qd);
      pb->dVr[ko + d] += P * od;
      pb->dVe[ko + d] += Pe * fabs(od);
      sV[ko + d] += fabs(P * od);
    }
  }
}

static void free_reference(attn_problem *pb) {
  free(pb->Lr), free(pb->Le), free(pb->Or), free(pb->Oe);
  free(pb->dQr), free(pb->dKr), free(pb->dVr), free(pb->dQe), free(pb->dKe), free(pb->dVe);
}

void attn_reference(attn_problem *pb, attn_row_fn *row_fn, int dense) {
  const tg_attn_params *p = &pb->p;
  const int64_t B = p->B, H = p->H, qL = p->qL, kL = p->kL;
  free_reference(pb);
  pb->Lr = calloc(pb->nL, sizeof(double));
  pb->Le = calloc(pb->nL, sizeof(double));
  pb->Or = calloc(pb->nQ, sizeof(double));
  pb->Oe = calloc(pb->nQ, sizeof(double));
  pb->dQr = calloc(pb->nQ, sizeof(double));
  pb->dQe = calloc(pb->nQ, sizeof(double));
  pb->dKr = calloc(pb->nKout, sizeof(double));
  pb->dKe = calloc(pb->nKout, sizeof(double));
  pb->dVr = calloc(pb->nKout, sizeof(double));
  pb->dVe = calloc(pb->nKout, sizeof(double));
  double *sK = calloc(pb->nKout, sizeof(double)), *sV = calloc(pb->nKout, sizeof(double));
  attn_key *key = malloc(sizeof(attn_key) * kL);
  attn_row r = {.key = key,
                .P = malloc(sizeof(double) * kL),
                .Pe = malloc(sizeof(double) * kL),
                .dS = malloc(sizeof(double) * kL),
                .dSe = malloc(sizeof(double) * kL),
                .dense = dense};
  for (r.b = 0; r.b < B; r.b++)
    for (r.h = 0; r.h < H; r.h++)
      for (r.i = 0; r.i < qL; r.i++) {
        r.hk = r.h / p->gqa_factor;
        r.row = (r.b * H + r.h) * qL + r.i;
        r.dO = pb->dO + attn_off3(p->O_strides, r.b, r.h, r.i);
        double mx = -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          key[k] = score(pb, r.b, r.h, r.i, k);
          if (key[k].vis && key[k].s > mx) mx = key[k].s;
        }
        forward_row(pb, &r, mx);
        row_fn(pb, &r);
        accumulate_row(pb, &r, sK, sV);
      }
  /* dK, dV: sums over the gqa qL rows of a group, plus dK0, dV0 where the
   * backward accumulates onto them (one more term) */
  const double n = (double)p->gqa_factor * qL + (pb->dK0 != NULL);
  for (int64_t e = 0; e < pb->nKout; e++) {
    const double k0 = pb->dK0 ? pb->dK0[e] : 0, v0 = pb->dV0 ? pb->dV0[e] : 0;
    pb->dKr[e] += k0;
    pb->dVr[e] += v0;
    pb->dKe[e] = 2 * (pb->dKe[e] + gam(n) * (fabs(k0) + sK[e]));
    pb->dVe[e] = 2 * (pb->dVe[e] + gam(n) * (fabs(v0) + sV[e]));
  }
  for (int64_t e = 0; e < pb->nQ; e++) pb->dQe[e] *= 2;
  free(sK), free(sV), free(key), free(r.P), free(r.Pe), free(r.dS), free(r.dSe);
}

void attn_build(attn_problem *pb, const attn_cfg *c, const attn_suite *s, tu_rng *r) {
  memset(pb, 0, sizeof *pb);
  pb->c = *c;
  tg_attn_params *p = &pb->p;
  assert_int_equal(tg_attn_params_init(p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                                       (float)(1.0 / sqrt(c->D))),
                   TG_OK);
  p->qL_off += c->qL_off_delta;
  p->softcapping = c->softcap;
  const int64_t B = c->B, H = c->H, Hk = c->H_kv, qL = c->qL, kL = c->kL, D = c->D;
  const int64_t Dk = c->layout == ATTN_STRIDED ? D + 8 : D; /* K, V row pitch */
  if (c->layout != ATTN_HEAD_MAJOR) {
    const int64_t qs[3] = {qL * H * D, D, H * D};
    const int64_t ks[2][3] = {{Hk * kL * Dk, kL * Dk, Dk}, {kL * Hk * D, D, Hk * D}};
    const int tok = c->layout == ATTN_TOKEN_MAJOR;
    memcpy(p->Q_strides, qs, sizeof qs);
    memcpy(p->O_strides, qs, sizeof qs);
    memcpy(p->K_strides, ks[tok], sizeof ks[tok]);
    memcpy(p->V_strides, ks[tok], sizeof ks[tok]);
  }
  pb->nQ = B * H * qL * D;
  pb->nK = B * Hk * kL * Dk;
  pb->nKout = B * Hk * kL * D;
  pb->nL = B * H * qL;
  pb->Q = tu_alloc(2 * pb->nQ);
  pb->dO = tu_alloc(2 * pb->nQ);
  pb->K = tu_alloc(2 * pb->nK);
  pb->V = tu_alloc(2 * pb->nK);
  tu_fill_bf16(r, pb->Q, pb->nQ, -2, 2);
  tu_fill_bf16(r, pb->dO, pb->nQ, -1, 1);
  tu_fill_bf16(r, pb->K, pb->nK, -2, 2);
  tu_fill_bf16(r, pb->V, pb->nK, -1, 1);
  if (c->mask) {
    pb->mp.M_strides[2] = kL;
    pb->mp.M_strides[1] = c->mask == 2 ? 0 : qL * kL;
    pb->mp.M_strides[0] = c->mask == 2 ? 0 : H * qL * kL;
    pb->nM = c->mask == 2 ? qL * kL : B * H * qL * kL;
    pb->mask = tu_alloc(2 * pb->nM);
    for (int64_t e = 0; e < pb->nM; e++)
      pb->mask[e] = tg_f32_to_bf16(tu_uniform(r, 0, 1) < s->mask_ninf
                                       ? -INFINITY
                                       : (float)tu_uniform(r, s->mask_lo, 1));
    for (int64_t row = s->mask_row0; row < pb->nM / kL; row += s->mask_step)
      for (int64_t k = 0; k < kL; k++) pb->mask[row * kL + k] = 0xFF80; /* -inf */
  }
  if (s->ref_inputs) {
    pb->L = tu_alloc(sizeof(float) * pb->nL);
    pb->Dv = tu_alloc(sizeof(float) * pb->nL);
    pb->dK0 = tu_alloc(sizeof(float) * pb->nKout);
    pb->dV0 = tu_alloc(sizeof(float) * pb->nKout);
    tu_fill_f32(r, pb->dK0, pb->nKout, -1, 1);
    tu_fill_f32(r, pb->dV0, pb->nKout, -1, 1);
  }
  attn_reference(pb, s->row, 0);
}

void attn_destroy(attn_problem *pb) {
  free(pb->Q), free(pb->K), free(pb->V), free(pb->dO), free(pb->mask);
  free(pb->L), free(pb->Dv), free(pb->dK0), free(pb->dV0);
  free_reference(pb);
}

/* P and its bound from pb->L (see attn_bwd_row_given). Bound: e_P = P (e_s
 * + u|s - L| + 2u) (expf is < 2 ulp). */
static void bwd_probs(attn_problem *pb, const attn_row *r) {
  const int64_t kL = pb->p.kL;
  const double L = pb->L[r->row];
  for (int64_t k = 0; k < kL; k++) {
    const attn_key *key = &r->key[k];
    if (r->dense) /* the kernel's exp(s - L) with s = -inf where invisible, L = -inf as +inf */
      r->P[k] = exp((key->vis ? key->s : -INFINITY) - (L == -INFINITY ? INFINITY : L));
    else
      r->P[k] = key->vis && L != -INFINITY ? exp(key->s - L) : 0;
    r->Pe[k] = r->P[k] * (key->err + U * fabs(key->s - L) + 2 * U);
  }
}

/* dS and its bound from pb->Dv: e_dS = |scale| (e_P |dP - Dv| + P (e_dP +
 * u|dP - Dv|)) + 8u|dS|, e_dP = gamma(D) sum |dO V|. */
static void bwd_ds(attn_problem *pb, const attn_row *r) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, kL = p->kL;
  for (int64_t k = 0; k < kL; k++) {
    if (!r->dense && r->P[k] == 0) continue; /* no term */
    const tg_bf16 *Vk = pb->V + attn_off3(p->V_strides, r->b, r->hk, k);
    double adP;
    const double diff = attn_dot(r->dO, Vk, D, &adP) - pb->Dv[r->row];
    const double sc = p->softcapping != 1.0f ? 1 - r->key[k].t * r->key[k].t : 1;
    r->dS[k] = p->scale * r->P[k] * diff * sc;
    r->dSe[k] = fabs(p->scale) * (r->Pe[k] * fabs(diff) +
                                  r->P[k] * (gam(D) * adP + U * fabs(diff))) +
                8 * U * fabs(r->dS[k]);
  }
}

void attn_bwd_row_given(attn_problem *pb, const attn_row *r) {
  bwd_probs(pb, r);
  bwd_ds(pb, r);
}

void attn_bwd_row(attn_problem *pb, const attn_row *r) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, kL = p->kL;
  pb->L[r->row] = (float)pb->Lr[r->row];
  bwd_probs(pb, r);
  double Dv = 0;
  for (int64_t d = 0; d < D; d++) {
    double O = 0;
    for (int64_t k = 0; k < kL; k++)
      O += r->P[k] * attn_bf(pb->V[attn_off3(p->V_strides, r->b, r->hk, k) + d]);
    Dv += attn_bf(tg_f32_to_bf16((float)O)) * attn_bf(r->dO[d]);
  }
  pb->Dv[r->row] = (float)Dv;
  bwd_ds(pb, r);
}

attn_outputs attn_alloc_outputs(const attn_problem *pb) {
  attn_outputs o = {tu_alloc(2 * pb->nQ),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nQ),
                    tu_alloc(sizeof(float) * pb->nKout),
                    tu_alloc(sizeof(float) * pb->nKout)};
  return o;
}

void attn_free_outputs(attn_outputs *o) {
  free(o->O), free(o->L), free(o->Dtok), free(o->Dv), free(o->dQ), free(o->dK), free(o->dV);
}

int attn_check_grads(const attn_problem *pb, const attn_outputs *o) {
  const int q = tu_check_bound("dQ", o->dQ, pb->dQr, pb->dQe, pb->nQ);
  const int k = tu_check_bound("dK", o->dK, pb->dKr, pb->dKe, pb->nKout);
  const int v = tu_check_bound("dV", o->dV, pb->dVr, pb->dVe, pb->nKout);
  return q && k && v;
}
