#include "attn_problem.h"
#include "tilegrad_testing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double attn_dot(const float *a, const float *b, int64_t D, double *abs_sum) {
  double s = 0, as = 0;
  for (int64_t d = 0; d < D; d++) {
    const double x = (double)a[d] * b[d];
    s += x;
    as += fabs(x);
  }
  *abs_sum = as;
  return s;
}

/* --- configs --------------------------------------------------------------- */
attn_cfg attn_random_cfg(tu_rng *r, const attn_cfg_limits *lim) {
  attn_cfg c = {.name = "random"};
  c.B = tu_int(r, 1, 2);
  c.H_kv = tu_int(r, 1, 3);
  c.H = c.H_kv * tu_int(r, 1, 3);
  c.qL = tu_int(r, 0, 3) == 0 ? tu_int(r, lim->long_lo, lim->long_hi) : tu_int(r, 1, 130);
  c.kL = tu_int(r, 0, 3) == 0 ? tu_int(r, lim->long_lo, lim->long_hi) : tu_int(r, 1, 130);
  c.D = 8 * tu_int(r, 1, 20);
  c.causal = tu_int(r, 0, 1);
  c.qL_off_delta = tu_int(r, 0, 3) == 0 ? tu_int(r, -20, 20) : 0;
  c.mask = tu_int(r, 0, 2);
  c.layout = tu_int(r, 0, 1) ? ATTN_STRIDED : ATTN_HEAD_MAJOR;
  c.softcap = tu_int(r, 0, 3) == 0 ? (float)tu_uniform(r, 0.5, 10) : 1.0f;
  if (lim->dropout) c.dropout_p = tu_int(r, 0, 1) ? (float)tu_uniform(r, 0, 0.95) : 0.0f;
  return c;
}

attn_variants attn_random_variants(tu_rng *r, const attn_cfg *c) {
  attn_variants v = {0};
  const int w[4] = {1, tu_int(r, 2, 15), tu_int(r, 16, 200), c->kL + tu_int(r, 0, 20)};
  v.window = tu_int(r, 0, 2) ? w[tu_int(r, 0, 3)] : 0;
  v.Dv = tu_int(r, 0, 2) ? (tu_int(r, 0, 15) ? 8 * tu_int(r, 1, 40) : 512) : 0;
  v.sinks = tu_int(r, 0, 2);
  return v;
}

void attn_variants_str(const attn_variants *v, char *buf, size_t size) {
  snprintf(buf, size, "W=%d Dv=%d sinks=%d", v->window, v->Dv, v->sinks);
}

void attn_cfg_str(const attn_cfg *c, char *buf, size_t size) {
  snprintf(buf, size,
           "B=%d H=%d H_kv=%d qL=%d kL=%d D=%d causal=%d off+%d mask=%d layout=%d softcap=%g "
           "p=%g",
           c->B, c->H, c->H_kv, c->qL, c->kL, c->D, c->causal, c->qL_off_delta, c->mask,
           c->layout, (double)c->softcap, (double)c->dropout_p);
}

const attn_run_mode attn_modes[ATTN_N_MODES] = {
    {"kv", TG_ATTN_SCHEDULE_KV, 0},
    {"atomic", TG_ATTN_SCHEDULE_ATOMIC, 0},
    {"deterministic", TG_ATTN_SCHEDULE_ATOMIC, 1},
};

tg_ctx *attn_mode_ctx(int threads, tg_isa isa, const attn_run_mode *m) {
  tg_ctx *ctx = tu_ctx(threads, isa);
  assert_int_equal(tg_ctx_set_deterministic(ctx, m->det), TG_OK);
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, m->schedule), TG_OK);
  return ctx;
}

attn_runs attn_runs_of(int problem, int n_problems) {
  attn_runs runs = {.step = 1};
  runs.n_combos = tu_isas(runs.isas) * tu_n_thread_counts * ATTN_N_MODES;
  if (tu_short()) {
    runs.next = problem % runs.n_combos;
    runs.step = n_problems;
  }
  return runs;
}

const attn_run *attn_runs_next(attn_runs *runs) {
  attn_run *run = &runs->run;
  tg_ctx_destroy(run->ctx);
  run->ctx = NULL;
  if (runs->next >= runs->n_combos) return NULL;
  const int j = runs->next, per_isa = tu_n_thread_counts * ATTN_N_MODES;
  runs->next += runs->step;
  run->isa = runs->isas[j / per_isa];
  run->threads = tu_thread_counts[j % per_isa / ATTN_N_MODES];
  run->mode = &attn_modes[j % ATTN_N_MODES];
  run->ctx = attn_mode_ctx(run->threads, run->isa, run->mode);
  snprintf(run->what, sizeof run->what, "[%s, %d threads, %s]", tg_isa_name(run->isa),
           run->threads, run->mode->name);
  return run;
}

/* --- the reference ------------------------------------------------------------ */

/* Score of (b, h, i, k) in f64 with its f32 error bound:
 * e_s = |scale| gamma(D) sum_d |q k| + 4u(|s| + |scale q.k|) + u|s + m|
 * (scale q.k, the softcap's division, tanhf and product: 4u; the f32 mask
 * add: u), and with softcap the error of t = tanh(scale q.k / softcap). */
static attn_key score(const attn_problem *pb, int64_t b, int64_t h, int64_t i, int64_t k) {
  const tg_attn_params *p = &pb->p;
  const float *q = pb->Q + attn_off3(p->Q_strides, b, h, i);
  const float *kk = pb->K + attn_off3(p->K_strides, b, h / p->gqa_factor, k);
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
  key.vis = !(pb->c.causal && k > i + p->qL_off) &&
            !(pb->v.window && k <= i + p->qL_off - pb->v.window);
  if (key.vis && pb->mask) {
    m = pb->mask[attn_off3(pb->mp.M_strides, b, h, i) + k];
    if (m == -INFINITY) key.vis = 0;
  }
  if (!key.vis) m = 0;
  key.err = ez + 4 * U * (fabs(s) + (isinf(qk) ? 0 : fabs(p->scale * qk))) + U * fabs(s + m);
  key.s = s + m;
  return key;
}

/*
 * Forward reference for a row with score maximum mx (over the visible keys
 * and the sink): O = sum_k z_k exp(s_k - mx) V_k / l with l = sum_k exp(s_k
 * - mx) + exp(s_h - mx), L = mx + log l, D_vec = O.dO. Bound of an f32
 * online softmax over key tiles of at least 16 keys (T <= ceil(kL/16) tile
 * steps, one more for the sink, however the kernel folds it in): each final
 * weight exp(s_k - mx) carries a relative error of at most
 *   eps = 2E + 2u(T + 2) + 2uR + gamma(passes kL + n_sink) + u_P
 * (E = max score bound, R = max |s - mx| over the keys and the sink; every
 * rescale exp(m_old - m_new) adds u|dm| + 2u and the dm add up to <= R; u_P
 * the precision mode's forward one, u_P_fwd; n_sink = 1 with a sink, its
 * e^{s_h} one more term; passes = the bf16 parts P.V runs in, each pass over the keys adding kL
 * terms to the f32 sums, 1 on the f32 GEMM).
 *   O: e_O = 2((eps + e_r)(sum_k w z|V| + |O|) + u|O|), e_r = 3u with
 *      dropout (1/(1-p) rounded in f32: 2u; O * it: u). Stored in bf16,
 *      plus its rounding, 2^-8 min(|O| + e_O, 2|O|): the rounding of a value
 *      within e_O of O (tests/test_attention.c, the round trip), or, where
 *      that is smaller, 2^-8 |O| doubled for the second order
 *      (tests/test_attn_ext.c's precision modes); both are bounds, the
 *      smaller is kept.
 *   L: e_L = 2(E + eps + u|L| + 2u|log l|).
 *   D_vec: e_D = sum_d e_O|dO| + gamma(Dv) sum_d (|O| + e_O)|dO|.
 * Underflow: a weight far below the row's largest term (a sink of 100
 * against scores near 0: e^-100) is subnormal in f32, where a rounding is
 * off by up to 2^-150 absolute, not u relative (errbound.h's ETA), and the
 * bf16 dot units of the precision modes flush it to zero (2^-126). Each
 * weight gets an absolute error tiny (attn_tiny: 2^-146, eight such
 * roundings, or 2^-126 in a precision mode), and each product or sum that
 * lands in the subnormal range one of eta (attn_eta: 2^-149, or 2^-126
 * where the dot units flush results), so e_O gains 2 (tiny sum_k z_k
 * max_d|V_k| + (n + T + 2) eta) over the n terms, D_vec Dv eta, and a bf16
 * O half bf16's least subnormal, 2^-134; negligible beside any normal
 * value's bound.
 * A row that sees no key has O = 0 and D_vec = 0 exactly and L = -inf, or
 * L = s_h (l = 1) with a finite sink. A NaN or +inf sink: L, O, D_vec NaN.
 */
/* Whether the pass's products may flush subnormal operands and results (a
 * precision mode, or parts on a bf16 unit). */
static int attn_flushes(const attn_problem *pb, int backward) {
  return (backward ? pb->u_P_bwd : pb->u_P_fwd) > 0 ||
         (backward ? pb->parts_bwd : pb->parts_fwd) > 0;
}
/* How many times its K terms a sum of the pass's products adds (parts). */
static double attn_passes(const attn_problem *pb, int backward) {
  const int parts = backward ? pb->parts_bwd : pb->parts_fwd;
  return parts > 1 ? parts : 1;
}
static double attn_tiny(const attn_problem *pb) { return attn_flushes(pb, 0) ? 0x1.0p-126 : 0x1.0p-146; }
static double attn_eta(const attn_problem *pb, int backward) {
  return attn_flushes(pb, backward) ? 0x1.0p-126 : 0x1.0p-149;
}
/* The absolute error of the backward's P = exp(s - L) in f32 where it is
 * subnormal (expf within 2 ulp, and the roundings around it: 8 of 2^-149). */
static const double attn_P_tiny = 0x1.0p-146;

static void forward_row(attn_problem *pb, const attn_row *r, double mx) {
  const tg_attn_params *p = &pb->p;
  const int64_t Dv = pb->vdim, kL = p->kL;
  const attn_key *key = r->key;
  const double sink = pb->sinks ? pb->sinks[r->h] : -INFINITY;
  const int has_sink = sink > -INFINITY && sink < INFINITY;
  double *O = pb->Or + r->row * Dv, *Oe = pb->Oe + r->row * Dv;
  double l = has_sink ? exp(sink - mx) : 0;
  int seen = 0;
  for (int64_t k = 0; k < kL; k++)
    if (key[k].vis) l += exp(key[k].s - mx), seen = 1;
  pb->empty[r->row] = !seen;
  if (isnan(sink) || sink == INFINITY) { /* softmax of a NaN or +inf logit */
    pb->Lr[r->row] = pb->Dr[r->row] = NAN;
    for (int64_t d = 0; d < Dv; d++) O[d] = NAN;
    return;
  }
  if (!(l > 0)) {
    pb->Lr[r->row] = -INFINITY;
    return;
  }
  double E = 0, R = has_sink ? mx - sink : 0;
  for (int64_t k = 0; k < kL; k++)
    if (key[k].vis) {
      E = fmax(E, key[k].err);
      R = fmax(R, mx - key[k].s);
    }
  const double T = (double)((kL + 15) / 16 + has_sink);
  const double eps = 2 * E + (T + 2) * 2 * U + 2 * U * R +
                     gam(attn_passes(pb, 0) * (double)kL + has_sink) + pb->u_P_fwd;
  const double e_r = pb->keep ? 3 * U : 0;
  double underflow = 0; /* sum_k z_k max_d |V_k| */
  int64_t terms = 0;
  for (int64_t k = 0; k < kL; k++) {
    if (!key[k].vis || r->z[k] == 0) continue;
    terms++;
    const double wz = exp(key[k].s - mx) / l * r->z[k];
    const float *Vk = pb->V + attn_off3(p->V_strides, r->b, r->hk, k);
    double vmax = 0;
    for (int64_t d = 0; d < Dv; d++) {
      O[d] += wz * Vk[d];
      Oe[d] += wz * fabs(Vk[d]); /* sum w z |V|, turned into the bound below */
      vmax = fmax(vmax, fabs(Vk[d]));
    }
    underflow += r->z[k] * vmax;
  }
  double Dvec = 0, eD = 0;
  for (int64_t d = 0; d < Dv; d++) {
    const double e = 2 * ((eps + e_r) * (Oe[d] + fabs(O[d])) + U * fabs(O[d]) +
                          attn_tiny(pb) * underflow + (double)(terms + T + 2) * attn_eta(pb, 0));
    Oe[d] = pb->bf16 ? e + BF16_U * fmin(fabs(O[d]) + e, 2 * fabs(O[d])) + 0x1.0p-134 : e;
    Dvec += O[d] * r->dO[d];
    eD += Oe[d] * fabs(r->dO[d]) + gam(Dv) * (fabs(O[d]) + Oe[d]) * fabs(r->dO[d]) +
          attn_eta(pb, 0);
  }
  pb->Dr[r->row] = Dvec;
  pb->De[r->row] = eD;
  pb->Lr[r->row] = mx + log(l);
  pb->Le[r->row] = 2 * (E + eps + U * fabs(pb->Lr[r->row]) + 2 * U * fabs(log(l)));
}

/* dQ_i += sum_k dS_k K_k, dK_k += dS_k Q_i, dV_k += P_k z_k dO_i, with the
 * error terms sum e_dS|K| + gamma(kL) sum|dS K| (dQ), sum e_dS|Q| and sum
 * e_Pz|dO| (dK, dV); the gamma terms of dK and dV need the whole column, so
 * their sums of |terms| go to sK, sV. With dropout e_Pz = z e_P + 3u P z
 * (else e_P). In a precision mode P z and dS enter the products with
 * u_P_bwd of relative error more, and the bf16 dot units flush parts below 2^-126 to
 * zero: an absolute error of up to 2^-126 per P or dS operand, which a
 * relative bound does not cover; every product that lands in the subnormal
 * range carries eta more (attn_eta, at the forward). A subnormal P (a sink
 * far above the scores) carries its absolute 2^-146 in e_P (attn_P_tiny),
 * and so into dS through e_P |z dP - D|. */
static void accumulate_row(attn_problem *pb, const attn_row *r, double *sK, double *sV) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, Dv = pb->vdim, kL = p->kL, Hk = p->H / p->gqa_factor;
  const int flush = attn_flushes(pb, 1);
  const double tiny = flush ? 0x1.0p-126 : 0.0, eta = attn_eta(pb, 1);
  const double gam_q = gam(attn_passes(pb, 1) * (double)kL); /* dQ's sum over the keys */
  const float *Qi = pb->Q + attn_off3(p->Q_strides, r->b, r->h, r->i);
  for (int64_t k = 0; k < kL; k++) {
    if (!r->dense && r->P[k] == 0) continue; /* no term */
    const float *Kk = pb->K + attn_off3(p->K_strides, r->b, r->hk, k);
    const int64_t ko = ((r->b * Hk + r->hk) * kL + k) * D, vo = ko / D * Dv;
    const double dS = r->dS[k], Pz = r->P[k] * r->z[k];
    double dSe = r->dSe[k], Pze = r->z[k] * r->Pe[k] + (pb->keep ? 3 * U * Pz : 0);
    if (flush) {
      Pze = Pze + pb->u_P_bwd * Pz + tiny;
      dSe = dSe + pb->u_P_bwd * fabs(dS) + tiny; /* dS as a product operand */
    }
    for (int64_t d = 0; d < D; d++) {
      const double kd = Kk[d], qd = Qi[d];
      pb->dQr[r->row * D + d] += dS * kd;
      pb->dQe[r->row * D + d] += dSe * fabs(kd) + gam_q * fabs(dS * kd) + eta;
      pb->dKr[ko + d] += dS * qd;
      pb->dKe[ko + d] += dSe * fabs(qd) + eta;
      sK[ko + d] += fabs(dS * qd);
    }
    for (int64_t d = 0; d < Dv; d++) {
      const double od = r->dO[d];
      pb->dVr[vo + d] += Pz * od;
      pb->dVe[vo + d] += Pze * fabs(od) + eta;
      sV[vo + d] += fabs(Pz * od);
    }
  }
}

static void free_reference(attn_problem *pb) {
  free(pb->Lr), free(pb->Le), free(pb->Or), free(pb->Oe), free(pb->Dr), free(pb->De);
  free(pb->dQr), free(pb->dKr), free(pb->dVr), free(pb->dQe), free(pb->dKe), free(pb->dVe);
  free(pb->dsr), free(pb->dse), free(pb->empty);
}

static double *zeros(int64_t n) {
  double *x = calloc((size_t)(n ? n : 1), sizeof(double));
  if (!x) fail_msg("out of memory");
  return x;
}

static void widen(float *dst, const tg_bf16 *src, int64_t n) {
  for (int64_t e = 0; e < n; e++) dst[e] = tg_bf16_to_f32(src[e]);
}

/* d_sinks: each row's term t = e^{s_h - L} D_vec (from the L and D_vec the
 * backward takes, bounds e_L, e_D) with e_t = e_P|D_vec| + P e_D + u|t| +
 * 2^-146 (|D_vec| + 1) (subnormal P and t, as at the forward),
 * e_P = P (e_L + u|s_h - L| + 2u) (expf within 2 ulp); summed with d_sinks0
 * (n = B qL + 1 terms, any order): 2 (sum e_t + gamma(n) (|d0| + sum|t|)). A
 * sink of -inf has no terms (P = 0, the contract); P = 0 (L = +inf) is an
 * exact zero term. Otherwise IEEE arithmetic: a row handed L = -inf with a
 * finite sink (no forward gives that: L >= s_h) has P = +inf. */
static void sink_term(attn_problem *pb, const attn_row *r, double *abs_sum) {
  const double sink = pb->sinks[r->h];
  const double L = r->given[0], eL = r->given[1], Dvec = r->given[2], eD = r->given[3];
  if (sink == -INFINITY) return;
  const double P = exp(sink - L), t = P * Dvec;
  if (P == 0) return;
  pb->dsr[r->h] -= t;
  pb->dse[r->h] += P * (eL + U * fabs(sink - L) + 2 * U) * fabs(Dvec) + P * eD + U * fabs(t) +
                   0x1.0p-146 * (fabs(Dvec) + 1);
  abs_sum[r->h] += fabs(t);
}

void attn_reference(attn_problem *pb, attn_row_fn *row_fn, int dense) {
  const tg_attn_params *p = &pb->p;
  const int64_t B = p->B, H = p->H, qL = p->qL, kL = p->kL;
  if (pb->bf16) {
    widen(pb->Q, pb->Qb, pb->nQ), widen(pb->dO, pb->dOb, pb->nO);
    widen(pb->K, pb->Kb, pb->nK), widen(pb->V, pb->Vb, pb->nV);
    if (pb->mask) widen(pb->mask, pb->maskb, pb->nM);
  }
  free_reference(pb);
  pb->Lr = zeros(pb->nL), pb->Le = zeros(pb->nL), pb->Dr = zeros(pb->nL);
  pb->De = zeros(pb->nL);
  pb->Or = zeros(pb->nO), pb->Oe = zeros(pb->nO), pb->dQr = zeros(pb->nQ);
  pb->dQe = zeros(pb->nQ);
  pb->dKr = zeros(pb->nKout), pb->dKe = zeros(pb->nKout), pb->dVr = zeros(pb->nVout);
  pb->dVe = zeros(pb->nVout);
  pb->dsr = zeros(H), pb->dse = zeros(H);
  pb->empty = tu_alloc((size_t)pb->nL);
  double *sK = zeros(pb->nKout), *sV = zeros(pb->nVout), *z = zeros(kL), *sS = zeros(H);
  double given[4];
  attn_key *key = tu_alloc(sizeof(attn_key) * kL);
  attn_row r = {.key = key, .z = z, .P = zeros(kL), .Pe = zeros(kL), .dS = zeros(kL),
                .dSe = zeros(kL), .given = given, .dense = dense};
  const double kept = 1.0 / (1.0 - (double)pb->c.dropout_p);
  for (r.b = 0; r.b < B; r.b++)
    for (r.h = 0; r.h < H; r.h++)
      for (r.i = 0; r.i < qL; r.i++) {
        r.hk = r.h / p->gqa_factor;
        r.row = (r.b * H + r.h) * qL + r.i;
        r.dO = pb->dO + attn_off3(p->O_strides, r.b, r.h, r.i);
        double mx = pb->sinks && pb->sinks[r.h] > -INFINITY ? pb->sinks[r.h] : -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          key[k] = score(pb, r.b, r.h, r.i, k);
          if (key[k].vis && key[k].s > mx) mx = key[k].s;
          z[k] = !pb->keep ? 1.0 : pb->keep[r.row * kL + k] ? kept : 0.0;
        }
        forward_row(pb, &r, mx);
        row_fn(pb, &r);
        accumulate_row(pb, &r, sK, sV);
        if (pb->sinks) sink_term(pb, &r, sS);
      }
  /* dK, dV: sums over the gqa qL rows of a group, plus dK0, dV0 where the
   * backward accumulates onto them (one more term) */
  const double n = attn_passes(pb, 1) * (double)p->gqa_factor * qL + (pb->dK0 != NULL);
  for (int64_t e = 0; e < pb->nKout; e++) {
    const double k0 = pb->dK0 ? pb->dK0[e] : 0;
    pb->dKr[e] += k0;
    pb->dKe[e] = 2 * (pb->dKe[e] + gam(n) * (fabs(k0) + sK[e]));
  }
  for (int64_t e = 0; e < pb->nVout; e++) {
    const double v0 = pb->dV0 ? pb->dV0[e] : 0;
    pb->dVr[e] += v0;
    pb->dVe[e] = 2 * (pb->dVe[e] + gam(n) * (fabs(v0) + sV[e]));
  }
  for (int64_t e = 0; e < pb->nQ; e++) pb->dQe[e] *= 2;
  if (pb->sinks)
    for (int64_t h = 0; h < H; h++) {
      const double d0 = pb->d_sinks0[h];
      pb->dsr[h] += d0;
      pb->dse[h] = 2 * (pb->dse[h] + gam((double)(B * qL + 1)) * (fabs(d0) + sS[h]));
    }
  free(sK), free(sV), free(z), free(sS), free(key);
  free(r.P), free(r.Pe), free(r.dS), free(r.dSe);
}

/* --- problems ------------------------------------------------------------------ */

/* Standard normal draws (Box-Muller): unit-variance inputs. */
static void fill_normal(tu_rng *r, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const double u1 = tu_uniform(r, 0x1p-53, 1), u2 = tu_uniform(r, 0, 1);
    x[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

/* x rounded to bf16 in place; the bf16 values in a new array. */
static tg_bf16 *round_to_bf16(float *x, int64_t n) {
  tg_bf16 *y = tu_alloc(sizeof(tg_bf16) * (size_t)n);
  for (int64_t e = 0; e < n; e++) {
    y[e] = tg_f32_to_bf16(x[e]);
    x[e] = tg_bf16_to_f32(y[e]);
  }
  return y;
}

void attn_build(attn_problem *pb, const attn_cfg *c, const attn_suite *s, tu_rng *r) {
  const attn_variants none = {0};
  attn_build_v(pb, c, &none, s, r);
}

void attn_build_v(attn_problem *pb, const attn_cfg *c, const attn_variants *v,
                  const attn_suite *s, tu_rng *r) {
  memset(pb, 0, sizeof *pb);
  pb->c = *c;
  pb->v = *v;
  pb->bf16 = s->bf16;
  pb->u_P_bwd = !s->bf16                                     ? 0.0
                : s->precision == TG_ATTN_PRECISION_SPLIT ? 0x1.0p-16
                : s->precision == TG_ATTN_PRECISION_BF16  ? BF16_U
                                                          : 0.0;
  if (s->bf16) {
    tg_isa isas[TU_MAX_ISAS];
    const int nisa = tu_isas(isas);
    for (int i = 0; i < nisa; i++) {
      const int f = tg_testing_attn_bf16_parts(isas[i], s->precision, c->D, 0);
      const int b = tg_testing_attn_bf16_parts(isas[i], s->precision, c->D, 1);
      pb->parts_fwd = f > pb->parts_fwd ? f : pb->parts_fwd;
      pb->parts_bwd = b > pb->parts_bwd ? b : pb->parts_bwd;
    }
  }
  /* exact mode's forward on two parts (split mode's hi + lo) */
  pb->u_P_fwd = s->precision == TG_ATTN_PRECISION_EXACT && pb->parts_fwd == 2 ? 0x1.0p-16
                                                                             : pb->u_P_bwd;
  tg_attn_params *p = &pb->p;
  assert_int_equal(tg_attn_params_init(p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                                       (float)(1.0 / sqrt(c->D))),
                   TG_OK);
  p->qL_off += c->qL_off_delta;
  p->softcapping = c->softcap;
  const int64_t B = c->B, H = c->H, Hk = c->H_kv, qL = c->qL, kL = c->kL, D = c->D;
  const int64_t Dv = v->Dv ? v->Dv : D;
  pb->vdim = Dv;
  /* strides of a tensor with n columns (Q, K: D; O, dO, V: Dv) in the layout;
   * K and V rows padded by 8 when strided */
  for (int t = 0; t < 4; t++) { /* Q, O, K, V */
    const int64_t n = t % 2 ? Dv : D, pitch = c->layout == ATTN_STRIDED ? n + 8 : n;
    const int64_t heads = t < 2 ? H : Hk, len = t < 2 ? qL : kL;
    const int64_t head_major[3] = {heads * len * n, len * n, n};
    const int64_t token_major[3] = {len * heads * n, n, heads * n};
    const int64_t padded[3] = {heads * len * pitch, len * pitch, pitch};
    int64_t *dst = t == 0 ? p->Q_strides : t == 1 ? p->O_strides : t == 2 ? p->K_strides
                                                                          : p->V_strides;
    const int64_t *src = c->layout == ATTN_HEAD_MAJOR ? head_major
                         : t < 2 || c->layout == ATTN_TOKEN_MAJOR ? token_major
                                                                  : padded;
    memcpy(dst, src, sizeof head_major);
  }
  const int64_t pad = c->layout == ATTN_STRIDED ? 8 : 0; /* K, V row padding */
  pb->nQ = B * H * qL * D;
  pb->nO = B * H * qL * Dv;
  pb->nK = B * Hk * kL * (D + pad);
  pb->nV = B * Hk * kL * (Dv + pad);
  pb->nKout = B * Hk * kL * D;
  pb->nVout = B * Hk * kL * Dv;
  pb->nL = B * H * qL;
  pb->Q = tu_alloc(sizeof(float) * pb->nQ);
  pb->dO = tu_alloc(sizeof(float) * pb->nO);
  pb->K = tu_alloc(sizeof(float) * pb->nK);
  pb->V = tu_alloc(sizeof(float) * pb->nV);
  if (s->normal) {
    fill_normal(r, pb->Q, pb->nQ);
    fill_normal(r, pb->dO, pb->nO);
    fill_normal(r, pb->K, pb->nK);
    fill_normal(r, pb->V, pb->nV);
  } else {
    tu_fill_f32(r, pb->Q, pb->nQ, -2, 2);
    tu_fill_f32(r, pb->dO, pb->nO, -1, 1);
    tu_fill_f32(r, pb->K, pb->nK, -2, 2);
    tu_fill_f32(r, pb->V, pb->nV, -1, 1);
  }
  if (c->mask) {
    pb->mp.M_strides[2] = kL;
    pb->mp.M_strides[1] = c->mask == 2 ? 0 : qL * kL;
    pb->mp.M_strides[0] = c->mask == 2 ? 0 : H * qL * kL;
    pb->nM = c->mask == 2 ? qL * kL : B * H * qL * kL;
    pb->mask = tu_alloc(sizeof(float) * pb->nM);
    for (int64_t e = 0; e < pb->nM; e++)
      pb->mask[e] = tu_uniform(r, 0, 1) < s->mask_ninf ? -INFINITY
                                                        : (float)tu_uniform(r, s->mask_lo, 1);
    for (int64_t row = s->mask_row0; row < pb->nM / kL; row += s->mask_step)
      for (int64_t k = 0; k < kL; k++) pb->mask[row * kL + k] = -INFINITY;
  }
  if (s->acc != ATTN_ACC_NONE) {
    pb->dK0 = tu_alloc(sizeof(float) * pb->nKout);
    pb->dV0 = tu_alloc(sizeof(float) * pb->nVout);
    if (s->acc == ATTN_ACC_RANDOM) {
      tu_fill_f32(r, pb->dK0, pb->nKout, -1, 1);
      tu_fill_f32(r, pb->dV0, pb->nVout, -1, 1);
    } else {
      memset(pb->dK0, 0, sizeof(float) * pb->nKout);
      memset(pb->dV0, 0, sizeof(float) * pb->nVout);
    }
  }
  if (s->options) {
    pb->opt = (tg_attn_options){.dropout_p = c->dropout_p,
                                .dropout_seed = tu_next(r),
                                .dropout_offset = tu_int(r, 0, 1)
                                                      ? tu_next(r)
                                                      : UINT64_MAX - (uint64_t)tu_int(r, 0, 1000)};
    if (c->dropout_p > 0) {
      pb->keep = tu_alloc((size_t)(pb->nL * kL));
      tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
      TU_EXPECT_STATUS(ctx, tg_attn_dropout_keep(ctx, &pb->opt, B, H, qL, kL, pb->keep), TG_OK);
      tg_ctx_destroy(ctx);
    }
    pb->opt.window = (uint32_t)v->window;
    pb->opt.v_head_dim = (uint32_t)v->Dv;
  } else if (v->window || v->Dv || v->sinks) {
    fail_msg("attn_build: the variants need attn_suite.options");
  }
  if (v->sinks) {
    static const float extreme[5] = {-INFINITY, 100, -100, 30, -30};
    const int first = tu_int(r, 0, 4);
    pb->sinks = tu_alloc(sizeof(float) * H);
    pb->d_sinks0 = tu_alloc(sizeof(float) * H);
    for (int64_t h = 0; h < H; h++)
      pb->sinks[h] = v->sinks == ATTN_SINKS_EXTREME && h < 5 ? extreme[(first + h) % 5]
                                                             : (float)tu_uniform(r, -3, 3);
    tu_fill_f32(r, pb->d_sinks0, H, -1, 1);
    pb->opt.sinks = pb->sinks;
  }
  if (s->bf16) {
    pb->Qb = round_to_bf16(pb->Q, pb->nQ), pb->dOb = round_to_bf16(pb->dO, pb->nO);
    pb->Kb = round_to_bf16(pb->K, pb->nK), pb->Vb = round_to_bf16(pb->V, pb->nV);
    if (pb->mask) pb->maskb = round_to_bf16(pb->mask, pb->nM);
  }
  pb->L = tu_alloc(sizeof(float) * pb->nL);
  pb->Dv = tu_alloc(sizeof(float) * pb->nL);
  attn_reference(pb, s->row, 0);
}

void attn_destroy(attn_problem *pb) {
  free(pb->Q), free(pb->K), free(pb->V), free(pb->dO), free(pb->mask);
  free(pb->Qb), free(pb->Kb), free(pb->Vb), free(pb->dOb), free(pb->maskb);
  free(pb->dK0), free(pb->dV0), free(pb->keep), free(pb->L), free(pb->Dv);
  free(pb->sinks), free(pb->d_sinks0);
  free_reference(pb);
}

/* --- row functions ----------------------------------------------------------------- */

/* P and its bound from pb->L (see attn_bwd_row_given). Bound: e_P = P (e_s
 * + u|s - L| + 2u) (expf is < 2 ulp), + 2^-146 where P is subnormal in f32
 * (attn_P_tiny). */
static void bwd_probs(attn_problem *pb, const attn_row *r) {
  const int64_t kL = pb->p.kL;
  const double L = pb->L[r->row];
  for (int64_t k = 0; k < kL; k++) {
    const attn_key *key = &r->key[k];
    if (r->dense) /* the kernel's exp(s - L) with s = -inf where invisible, L = -inf as +inf */
      r->P[k] = exp((key->vis ? key->s : -INFINITY) - (L == -INFINITY ? INFINITY : L));
    else
      r->P[k] = key->vis && L != -INFINITY ? exp(key->s - L) : 0;
    r->Pe[k] = r->P[k] * (key->err + U * fabs(key->s - L) + 2 * U) + attn_P_tiny;
  }
}

/* dS and its bound from pb->Dv: e_dS = |scale| (e_P |dP - Dv| + P (e_dP +
 * u|dP - Dv|)) + 8u|dS|, e_dP = gamma(D) sum |dO V|. */
static void bwd_ds(attn_problem *pb, const attn_row *r) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = pb->vdim, kL = p->kL; /* dP = dO.V: Dv terms */
  for (int64_t k = 0; k < kL; k++) {
    if (!r->dense && r->P[k] == 0) continue; /* no term */
    const float *Vk = pb->V + attn_off3(p->V_strides, r->b, r->hk, k);
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
  r->given[0] = pb->L[r->row], r->given[2] = pb->Dv[r->row]; /* as given: exact */
  r->given[1] = r->given[3] = 0;
}

void attn_bwd_row(attn_problem *pb, const attn_row *r) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = pb->vdim, kL = p->kL;
  pb->L[r->row] = (float)pb->Lr[r->row];
  bwd_probs(pb, r);
  double Dv = 0;
  for (int64_t d = 0; d < D; d++) {
    double O = 0;
    for (int64_t k = 0; k < kL; k++)
      O += r->P[k] * pb->V[attn_off3(p->V_strides, r->b, r->hk, k) + d];
    Dv += (double)tg_bf16_to_f32(tg_f32_to_bf16((float)O)) * r->dO[d];
  }
  pb->Dv[r->row] = (float)Dv;
  bwd_ds(pb, r);
  r->given[0] = pb->L[r->row], r->given[2] = pb->Dv[r->row];
  r->given[1] = r->given[3] = 0;
}

/*
 * P and dS of a training step, the backward fed the forward's L (bound e_L)
 * and D_vec (bound e_D, forward_row):
 *   P     e_P  = P (e_s + e_L + u|s - L| + 2u)           (exp within 2 ulp)
 *                + 2^-146                        (subnormal P: attn_P_tiny)
 *   dP    e_dP = gamma(D) sum_d|dO V|, and with dropout z dP: + 3u z|dP|
 *   dS = scale P (z dP - D) c'   (c' = 1 - t^2 with softcap t, error e_c =
 *                                 2|t| e_t + u)
 *         e_dS = |scale| c' (e_P|z dP - D| + P(z e_dP + e_D + u|z dP - D|))
 *                + |scale| P |z dP - D| e_c + 8u|dS|
 */
void attn_step_row(attn_problem *pb, const attn_row *r) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = pb->vdim, kL = p->kL; /* dP = dO.V: Dv terms */
  const double L = pb->Lr[r->row], Le = pb->Le[r->row], Dv = pb->Dr[r->row];
  const double eD = pb->De[r->row];
  r->given[0] = L, r->given[1] = Le, r->given[2] = Dv, r->given[3] = eD;
  const int soft = p->softcapping != 1.0f;
  for (int64_t k = 0; k < kL; k++) {
    const attn_key *key = &r->key[k];
    const double P = key->vis && L != -INFINITY ? exp(key->s - L) : 0;
    r->P[k] = P;
    if (P == 0) continue; /* no term */
    r->Pe[k] = P * (key->err + Le + U * fabs(key->s - L) + 2 * U) + attn_P_tiny;
    const float *Vk = pb->V + attn_off3(p->V_strides, r->b, r->hk, k);
    double adP;
    const double dP = attn_dot(r->dO, Vk, D, &adP), z = r->z[k];
    const double diff = z * dP - Dv;
    const double e_z = pb->keep ? 3 * U * z * fabs(dP) : 0;
    const double sc = soft ? 1 - key->t * key->t : 1;
    const double esc = soft ? 2 * fabs(key->t) * key->terr + U : 0;
    r->dS[k] = p->scale * P * diff * sc;
    r->dSe[k] = fabs(p->scale) * sc *
                    (r->Pe[k] * fabs(diff) + P * (z * gam(D) * adP + eD + U * fabs(diff) + e_z)) +
                fabs(p->scale) * P * fabs(diff) * esc + 8 * U * fabs(r->dS[k]);
  }
}

/* --- outputs and checks ------------------------------------------------------------- */
attn_outputs attn_alloc_outputs(const attn_problem *pb) {
  attn_outputs o = {tu_alloc(2 * pb->nO),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nL),
                    tu_alloc(sizeof(float) * pb->nQ),
                    tu_alloc(sizeof(float) * pb->nKout),
                    tu_alloc(sizeof(float) * pb->nVout)};
  return o;
}

void attn_free_outputs(attn_outputs *o) {
  free(o->O), free(o->L), free(o->Dtok), free(o->Dv), free(o->dQ), free(o->dK), free(o->dV);
}

int attn_check_L(const attn_problem *pb, const float *L) {
  int ok = 1;
  double *Lr = tu_alloc(sizeof(double) * pb->nL), *Le = tu_alloc(sizeof(double) * pb->nL);
  float *Lf = tu_alloc(sizeof(float) * pb->nL);
  for (int64_t r = 0; r < pb->nL; r++) { /* the finite ones against the bound */
    const int none = pb->Lr[r] == -INFINITY;
    if (none != (L[r] == -INFINITY)) {
      printf("  L[%lld] = %g, want %g\n", (long long)r, (double)L[r], pb->Lr[r]);
      ok = 0;
    }
    Lr[r] = none ? 0 : pb->Lr[r];
    Le[r] = none ? 0 : pb->Le[r];
    Lf[r] = none ? 0.0f : L[r];
  }
  ok &= tu_check_bound("L", Lf, Lr, Le, pb->nL);
  free(Lr), free(Le), free(Lf);
  return ok;
}

int attn_check_grads(const attn_problem *pb, const float *dQ, const float *dK, const float *dV) {
  const int q = tu_check_bound("dQ", dQ, pb->dQr, pb->dQe, pb->nQ);
  const int k = tu_check_bound("dK", dK, pb->dKr, pb->dKe, pb->nKout);
  const int v = tu_check_bound("dV", dV, pb->dVr, pb->dVe, pb->nVout);
  return q && k && v;
}

int attn_check_d_sinks(const attn_problem *pb, const float *d_sinks) {
  return !pb->sinks || tu_check_bound("d_sinks", d_sinks, pb->dsr, pb->dse, pb->p.H);
}
