/*
 * Forward -> backward round trip of the FA-2 training kernels.
 *
 * The O and L that tg_flash_attn_train_fwd_bf16 produces are fed, as a
 * training step does, to tg_flash_attn_train_bwd_compute_d_bf16 and
 * tg_flash_attn_train_bwd_bf16. The dQ, dK, dV that come out must be the
 * gradient of F(Q, K, V) = sum(O * dO) (O = softmax(S) V, exact) computed in
 * float64 from the same bf16 Q, K, V, dO. Unlike tests/test_attention.c, which
 * hands the backward a reference L and D_vec, nothing here comes from a
 * reference: the backward consumes what the forward left, through the same
 * layouts (head-major, or token-major [B, L, heads, D] through the strides,
 * as examples/tiny_model.c uses them).
 *
 * Tolerances (per element, rigorous to first order, doubled for the
 * neglected second-order terms; u = 2^-24, gamma(n) = (n + 2) u):
 *
 *   score   e_s  = |scale| gamma(D) sum_d|q k| + 4u(|s| + |scale q.k|) + u|s + m|
 *   L (f32 online softmax over T tiles of >= 16 keys, E = max e_s, R = max|s - max|)
 *           eps  = 2E + 2u(T + 2) + 2uR + gamma(kL)
 *           e_L  = 2(E + eps + u|L| + 2u|log l|)
 *   O       e_O  = 2(eps (sum_k P|V| + |O|) + u|O|), then the bf16 store:
 *           e_Ob = e_O + 2^-8 (|O| + e_O)            (bf16 unit roundoff 2^-8)
 *   D_vec   e_D  = sum_d e_Ob |dO| + gamma(D) sum_d (|O| + e_Ob)|dO|
 *   P       e_P  = P (e_s + e_L + u|s - L| + 2u)
 *   dP      e_dP = gamma(D) sum_d |dO V|
 *   dS      e_dS = |scale| c' (e_P|dP - D| + P(e_dP + e_D + u|dP - D|))
 *                  + |scale| P |dP - D| e_c' + 8u|dS|   (c' = 1 - t^2 with softcap)
 *   dQ      2 (sum_k e_dS|K| + gamma(kL) sum_k |dS K|)
 *   dK      2 (sum_i e_dS|Q| + gamma(n) sum_i |dS Q|)     n = rows of the group
 *   dV      2 (sum_i e_P|dO| + gamma(n) sum_i |P dO|)
 *
 * The bf16 store of O dominates: the gradients are expected to agree to
 * about 2^-8 of the magnitude of the terms that make them. A negative
 * control (L shifted by 1/32) must fail the same check, so the bounds are
 * not vacuous. The f64 reference gradient itself is checked against central
 * differences of F in f64 on sampled elements.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"

static const double U = 0x1.0p-24;
static double gam(double n) { return (n + 2) * U; }

typedef struct {
  const char *name;
  int B, H, H_kv, qL, kL, D;
  int causal;
  int off_delta; /* qL_off = kL - qL + off_delta */
  int mask;      /* 0 none; 1 [B,H,qL,kL] with -inf entries and fully -inf rows;
                    2 the same broadcast over batch and head */
  int tokmajor;  /* Q, O, dO as [B, qL, H, D]; K, V as [B, kL, H_kv, D] */
  float softcap; /* 1 = off */
} cfg;

typedef struct {
  cfg c;
  tg_attn_params p;
  tg_attn_mask_params mp;
  int64_t nQ, nK, nL, nM;
  tg_bf16 *Q, *K, *V, *dO, *mask;
  /* reference (head-major, contiguous) and bounds */
  double *dQr, *dKr, *dVr, *dQe, *dKe, *dVe, *Lr, *Le;
  int *row_empty; /* [B,H,qL] the row sees no key */
} problem;

static int64_t off3(const int64_t s[3], int64_t b, int64_t h, int64_t r) {
  return b * s[0] + h * s[1] + r * s[2];
}
static double bf(tg_bf16 x) { return tg_bf16_to_f32(x); }

/* Score of (b, h, i, k) in f64: value (with the mask added), visibility,
 * tanh for softcap, its f32 error bound, and the error of the tanh. */
static double score(const problem *pb, int64_t b, int64_t h, int64_t i, int64_t k, int *vis,
                    double *t, double *err, double *terr) {
  const tg_attn_params *p = &pb->p;
  const tg_bf16 *q = pb->Q + off3(p->Q_strides, b, h, i);
  const tg_bf16 *kk = pb->K + off3(p->K_strides, b, h / p->gqa_factor, k);
  double qk = 0, aqk = 0;
  for (int d = 0; d < p->D; d++) {
    qk += bf(q[d]) * bf(kk[d]);
    aqk += fabs(bf(q[d]) * bf(kk[d]));
  }
  double s = p->scale * qk;
  const double ez = fabs(p->scale) * gam(p->D) * aqk;
  *t = 0;
  *terr = 0;
  if (p->softcapping != 1.0f) {
    *t = tanh(s / p->softcapping);
    *terr = ez / p->softcapping + 4 * U;
    s = p->softcapping * *t;
  }
  double m = 0;
  *vis = !(pb->c.causal && k > i + p->qL_off);
  if (*vis && pb->mask) {
    m = bf(pb->mask[off3(pb->mp.M_strides, b, h, i) + k]);
    if (m == -INFINITY) *vis = 0;
  }
  if (!*vis) m = 0;
  *err = ez + 4 * U * (fabs(s) + fabs(p->scale * qk)) + U * fabs(s + m);
  return s + m;
}

static void build(problem *pb, const cfg *c, tu_rng *r) {
  memset(pb, 0, sizeof *pb);
  pb->c = *c;
  tg_attn_params *p = &pb->p;
  assert_int_equal(tg_attn_params_init(p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                                       (float)(1.0 / sqrt(c->D))),
                   TG_OK);
  p->qL_off += c->off_delta;
  p->softcapping = c->softcap;
  const int64_t B = c->B, H = c->H, Hk = c->H_kv, qL = c->qL, kL = c->kL, D = c->D;
  if (c->tokmajor) {
    const int64_t qs[3] = {qL * H * D, D, H * D}, ks[3] = {kL * Hk * D, D, Hk * D};
    memcpy(p->Q_strides, qs, sizeof qs);
    memcpy(p->O_strides, qs, sizeof qs);
    memcpy(p->K_strides, ks, sizeof ks);
    memcpy(p->V_strides, ks, sizeof ks);
  }
  pb->nQ = B * H * qL * D;
  pb->nK = B * Hk * kL * D;
  pb->nL = B * H * qL;
  pb->Q = tu_alloc(2 * pb->nQ);
  pb->dO = tu_alloc(2 * pb->nQ);
  pb->K = tu_alloc(2 * pb->nK);
  pb->V = tu_alloc(2 * pb->nK);
  tu_fill_bf16(r, pb->Q, pb->nQ, -2, 2);
  tu_fill_bf16(r, pb->K, pb->nK, -2, 2);
  tu_fill_bf16(r, pb->V, pb->nK, -1, 1);
  tu_fill_bf16(r, pb->dO, pb->nQ, -1, 1);
  if (c->mask) {
    pb->mp.M_strides[2] = kL;
    pb->mp.M_strides[1] = c->mask == 2 ? 0 : qL * kL;
    pb->mp.M_strides[0] = c->mask == 2 ? 0 : H * qL * kL;
    pb->nM = c->mask == 2 ? qL * kL : B * H * qL * kL;
    pb->mask = tu_alloc(2 * pb->nM);
    for (int64_t e = 0; e < pb->nM; e++)
      pb->mask[e] = tg_f32_to_bf16(
          tu_uniform(r, 0, 1) < 0.25 ? -INFINITY : (float)tu_uniform(r, -2, 1));
    for (int64_t row = 1; row < pb->nM / kL; row += 4) /* fully masked rows */
      for (int64_t k = 0; k < kL; k++) pb->mask[row * kL + k] = 0xFF80;
  }

  pb->dQr = calloc(pb->nQ, sizeof(double));
  pb->dQe = calloc(pb->nQ, sizeof(double));
  pb->dKr = calloc(pb->nK, sizeof(double));
  pb->dKe = calloc(pb->nK, sizeof(double));
  pb->dVr = calloc(pb->nK, sizeof(double));
  pb->dVe = calloc(pb->nK, sizeof(double));
  pb->Lr = calloc(pb->nL, sizeof(double));
  pb->Le = calloc(pb->nL, sizeof(double));
  pb->row_empty = calloc(pb->nL, sizeof(int));
  double *sK = calloc(pb->nK, sizeof(double)), *sV = calloc(pb->nK, sizeof(double));
  double *s = malloc(sizeof(double) * kL), *se = malloc(sizeof(double) * kL);
  double *t = malloc(sizeof(double) * kL), *te = malloc(sizeof(double) * kL);
  double *P = malloc(sizeof(double) * kL), *Pe = malloc(sizeof(double) * kL);
  double *dS = malloc(sizeof(double) * kL), *dSe = malloc(sizeof(double) * kL);
  int *vis = malloc(sizeof(int) * kL);
  double *O = malloc(sizeof(double) * D), *OA = malloc(sizeof(double) * D);
  const double T = (double)((kL + 15) / 16);

  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < qL; i++) {
        const int64_t hk = h / p->gqa_factor, row = (b * H + h) * qL + i;
        const tg_bf16 *Qi = pb->Q + off3(p->Q_strides, b, h, i);
        const tg_bf16 *dOi = pb->dO + off3(p->O_strides, b, h, i);
        double mx = -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          s[k] = score(pb, b, h, i, k, &vis[k], &t[k], &se[k], &te[k]);
          if (vis[k] && s[k] > mx) mx = s[k];
        }
        if (mx == -INFINITY) { /* sees no key: O = 0, L = -inf, no gradient */
          pb->row_empty[row] = 1;
          pb->Lr[row] = -INFINITY;
          continue;
        }
        double l = 0, E = 0, R = 0;
        for (int64_t k = 0; k < kL; k++)
          if (vis[k]) {
            l += exp(s[k] - mx);
            E = fmax(E, se[k]);
            R = fmax(R, mx - s[k]);
          }
        const double L = mx + log(l);
        const double eps = 2 * E + 2 * U * (T + 2) + 2 * U * R + gam(kL);
        pb->Lr[row] = L;
        pb->Le[row] = 2 * (E + eps + U * fabs(L) + 2 * U * fabs(log(l)));
        for (int64_t d = 0; d < D; d++) O[d] = OA[d] = 0;
        for (int64_t k = 0; k < kL; k++) {
          P[k] = vis[k] ? exp(s[k] - L) : 0;
          Pe[k] = P[k] * (se[k] + pb->Le[row] + U * fabs(s[k] - L) + 2 * U);
          const tg_bf16 *Vk = pb->V + off3(p->V_strides, b, hk, k);
          for (int64_t d = 0; d < D; d++) {
            O[d] += P[k] * bf(Vk[d]);
            OA[d] += P[k] * fabs(bf(Vk[d]));
          }
        }
        /* D_vec = O . dO (exact) and the bound of the kernel's bf16-O version */
        double Dv = 0, eD = 0;
        for (int64_t d = 0; d < D; d++) {
          const double eO = 2 * (eps * (OA[d] + fabs(O[d])) + U * fabs(O[d]));
          const double eOb = eO + 0x1p-8 * (fabs(O[d]) + eO);
          Dv += O[d] * bf(dOi[d]);
          eD += eOb * fabs(bf(dOi[d])) + gam(D) * (fabs(O[d]) + eOb) * fabs(bf(dOi[d]));
        }
        for (int64_t k = 0; k < kL; k++) {
          if (!vis[k]) {
            dS[k] = dSe[k] = 0;
            continue;
          }
          const tg_bf16 *Vk = pb->V + off3(p->V_strides, b, hk, k);
          double dP = 0, adP = 0;
          for (int64_t d = 0; d < D; d++) {
            dP += bf(dOi[d]) * bf(Vk[d]);
            adP += fabs(bf(dOi[d]) * bf(Vk[d]));
          }
          const double diff = dP - Dv, sc = p->softcapping != 1.0f ? 1 - t[k] * t[k] : 1;
          const double esc = p->softcapping != 1.0f ? 2 * fabs(t[k]) * te[k] + U : 0;
          dS[k] = p->scale * P[k] * diff * sc;
          dSe[k] = fabs(p->scale) * sc *
                       (Pe[k] * fabs(diff) + P[k] * (gam(D) * adP + eD + U * fabs(diff))) +
                   fabs(p->scale) * P[k] * fabs(diff) * esc + 8 * U * fabs(dS[k]);
        }
        for (int64_t k = 0; k < kL; k++) {
          if (!vis[k]) continue;
          const tg_bf16 *Kk = pb->K + off3(p->K_strides, b, hk, k);
          const int64_t ko = ((b * Hk + hk) * kL + k) * D;
          for (int64_t d = 0; d < D; d++) {
            const double kd = bf(Kk[d]), qd = bf(Qi[d]), od = bf(dOi[d]);
            pb->dQr[row * D + d] += dS[k] * kd;
            pb->dQe[row * D + d] += dSe[k] * fabs(kd) + gam(kL) * fabs(dS[k] * kd);
            pb->dKr[ko + d] += dS[k] * qd;
            pb->dKe[ko + d] += dSe[k] * fabs(qd);
            sK[ko + d] += fabs(dS[k] * qd);
            pb->dVr[ko + d] += P[k] * od;
            pb->dVe[ko + d] += Pe[k] * fabs(od);
            sV[ko + d] += fabs(P[k] * od);
          }
        }
      }
  const double n = (double)(H / Hk) * qL;
  for (int64_t e = 0; e < pb->nK; e++) {
    pb->dKe[e] = 2 * (pb->dKe[e] + gam(n) * sK[e]);
    pb->dVe[e] = 2 * (pb->dVe[e] + gam(n) * sV[e]);
  }
  for (int64_t e = 0; e < pb->nQ; e++) pb->dQe[e] *= 2;
  free(sK), free(sV), free(s), free(se), free(t), free(te), free(P), free(Pe), free(dS);
  free(dSe), free(vis), free(O), free(OA);
}

static void destroy(problem *pb) {
  free(pb->Q), free(pb->K), free(pb->V), free(pb->dO), free(pb->mask);
  free(pb->dQr), free(pb->dKr), free(pb->dVr), free(pb->dQe), free(pb->dKe), free(pb->dVe);
  free(pb->Lr), free(pb->Le), free(pb->row_empty);
}

typedef struct {
  tg_bf16 *O;
  float *L, *Dtok, *Dv, *dQ, *dK, *dV;
} outputs;

static outputs alloc_outputs(const problem *pb) {
  outputs o = {tu_alloc(2 * pb->nQ),
               tu_alloc(sizeof(float) * pb->nL),
               tu_alloc(sizeof(float) * pb->nL),
               tu_alloc(sizeof(float) * pb->nL),
               tu_alloc(sizeof(float) * pb->nQ),
               tu_alloc(sizeof(float) * pb->nK),
               tu_alloc(sizeof(float) * pb->nK)};
  return o;
}
static void free_outputs(outputs *o) {
  free(o->O), free(o->L), free(o->Dtok), free(o->Dv), free(o->dQ), free(o->dK), free(o->dV);
}

/* forward; compute_d (token-major: over [B, qL, H] rows, then one transpose
 * per batch to [H, qL]); backward. L_shift != 0 perturbs L before the
 * backward (negative control). */
static void round_trip(tg_ctx *ctx, const problem *pb, outputs *o, float L_shift) {
  const tg_attn_params *p = &pb->p;
  const tg_attn_mask_params *mp = pb->mask ? &pb->mp : NULL;
  for (int64_t e = 0; e < pb->nQ; e++) o->O[e] = 0xFFFF; /* NaN */
  tu_poison_f32(o->L, pb->nL);
  tu_poison_f32(o->Dv, pb->nL);
  tu_poison_f32(o->dQ, pb->nQ);
  memset(o->dK, 0, sizeof(float) * pb->nK);
  memset(o->dV, 0, sizeof(float) * pb->nK);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_fwd_bf16(ctx, pb->Q, pb->K, pb->V, o->O, o->L, p, mp,
                                                pb->mask, pb->c.causal),
                   TG_OK);
  const uint32_t B = p->B, H = p->H, qL = p->qL, D = p->D;
  if (pb->c.tokmajor) {
    TU_EXPECT_STATUS(
        ctx,
        tg_flash_attn_train_bwd_compute_d_bf16(ctx, o->O, pb->dO, o->Dtok, B, qL, H, D),
        TG_OK);
    for (uint32_t b = 0; b < B; b++)
      TU_EXPECT_STATUS(ctx,
                       tg_transpose_2d(ctx, o->Dtok + (int64_t)b * qL * H,
                                       o->Dv + (int64_t)b * H * qL, qL, H),
                       TG_OK);
  } else {
    TU_EXPECT_STATUS(
        ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, o->O, pb->dO, o->Dv, B, H, qL, D),
        TG_OK);
  }
  if (L_shift != 0)
    for (int64_t e = 0; e < pb->nL; e++) o->L[e] += L_shift;
  TU_EXPECT_STATUS(
      ctx,
      tg_flash_attn_train_bwd_bf16(ctx, pb->Q, pb->K, pb->V, o->L, pb->dO, o->Dv, o->dQ,
                                   o->dK, o->dV, p, mp, pb->mask, pb->c.causal),
      TG_OK);
}

/* L within its bound (-inf exactly where the row sees no key), the O rows of
 * those rows exactly 0 and their dQ rows exactly 0, then dQ, dK, dV. */
static int check(const problem *pb, const outputs *o, const char *what) {
  const tg_attn_params *p = &pb->p;
  int ok = 1;
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++) {
        const int64_t row = (b * p->H + h) * p->qL + i;
        const tg_bf16 *Oi = o->O + off3(p->O_strides, b, h, i);
        if (pb->row_empty[row]) {
          int zero = o->L[row] == -INFINITY;
          for (int64_t d = 0; d < p->D; d++)
            zero &= Oi[d] == 0 && o->dQ[row * p->D + d] == 0;
          if (!zero) {
            printf("  row %lld sees no key but L/O/dQ are not -inf/0/0\n", (long long)row);
            ok = 0;
          }
        } else if (!(fabs(o->L[row] - pb->Lr[row]) <= pb->Le[row])) {
          printf("  L[%lld] = %.9g, want %.9g +- %.3g\n", (long long)row, (double)o->L[row],
                 pb->Lr[row], pb->Le[row]);
          ok = 0;
        }
      }
  const int q = tu_check_bound("dQ", o->dQ, pb->dQr, pb->dQe, pb->nQ);
  const int k = tu_check_bound("dK", o->dK, pb->dKr, pb->dKe, pb->nK);
  const int v = tu_check_bound("dV", o->dV, pb->dVr, pb->dVe, pb->nK);
  ok = ok && q && k && v;
  if (!ok) printf("  ^ in %s\n", what);
  return ok;
}

/* Largest |got - ref| / bound over dQ, dK, dV (how much of the bound is used). */
static double used_bound(const problem *pb, const outputs *o) {
  double w = 0;
  for (int64_t e = 0; e < pb->nQ; e++)
    w = fmax(w, fabs(o->dQ[e] - pb->dQr[e]) / fmax(pb->dQe[e], 1e-300));
  for (int64_t e = 0; e < pb->nK; e++) {
    w = fmax(w, fabs(o->dK[e] - pb->dKr[e]) / fmax(pb->dKe[e], 1e-300));
    w = fmax(w, fabs(o->dV[e] - pb->dVr[e]) / fmax(pb->dVe[e], 1e-300));
  }
  return w;
}

/* clang-format off */
static const cfg configs[] = {
    /* name                          B  H Hkv qL   kL  D  causal off mask tok softcap */
    {"full qL!=kL",                  2, 2, 2, 37,  53, 16, 0, 0,   0,  0,  1.0f},
    {"causal qL<kL gqa",             1, 4, 2, 45,  100, 32, 1, 0,  0,  0,  1.0f},
    {"causal qL>kL (-inf rows)",     1, 2, 1, 80,  30, 24, 1, 0,   0,  0,  1.0f},
    {"mask -inf rows, gqa",          2, 4, 1, 33,  47, 16, 0, 0,   1,  0,  1.0f},
    {"mask bcast + causal qL<kL",    1, 3, 3, 40,  70, 8,  1, 0,   2,  0,  1.0f},
    {"token-major causal gqa",       2, 4, 2, 70,  70, 16, 1, 0,   0,  1,  1.0f},
    {"token-major mask, qL!=kL",     1, 2, 1, 50,  81, 32, 0, 0,   1,  1,  1.0f},
    {"softcap causal gqa",           1, 4, 2, 30,  45, 16, 1, 0,   1,  0,  4.0f},
    {"multi-tile",                   1, 2, 1, 150, 140, 64, 1, 0,  0,  1,  1.0f},
};
/* clang-format on */

static void test_round_trip(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 101);
  tg_isa isas[4];
  const int nisa = tu_isas(isas);
  int failures = 0;
  double worst = 0;
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    problem pb;
    build(&pb, &configs[ci], &r);
    outputs o = alloc_outputs(&pb);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++)
        for (int det = 0; det < 2; det++) {
          tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
          tg_ctx_set_deterministic(ctx, det);
          round_trip(ctx, &pb, &o, 0);
          char what[200];
          snprintf(what, sizeof what, "%s [%s, %d threads, det=%d]", pb.c.name,
                   tg_isa_name(isas[ii]), tu_thread_counts[ti], det);
          if (!check(&pb, &o, what)) failures++;
          worst = fmax(worst, used_bound(&pb, &o));
          tg_ctx_destroy(ctx);
        }
    free_outputs(&o);
    destroy(&pb);
  }
  printf("  round trip: largest |err| / bound = %.3g\n", worst);
  if (failures) TU_FAIL("%d round-trip runs out of bound", failures);
}

/* Negative control: the same check must reject a backward fed an L that is
 * off by 1/32 (every P off by ~3 %), in every configuration. */
static void test_bounds_reject_a_wrong_L(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 102);
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    problem pb;
    build(&pb, &configs[ci], &r);
    outputs o = alloc_outputs(&pb);
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    round_trip(ctx, &pb, &o, 0x1p-5f);
    const double used = used_bound(&pb, &o);
    printf("  L + 1/32, %s: largest |err| / bound = %.3g\n", pb.c.name, used);
    if (!(used > 1))
      TU_FAIL("%s: the bounds accept a backward with L off by 1/32", pb.c.name);
    tg_ctx_destroy(ctx);
    free_outputs(&o);
    destroy(&pb);
  }
}

/* F = sum(O * dO) in f64 (O exact) for the FD check of the reference. */
static double F_of(const problem *pb, const double *Q, const double *K, const double *V) {
  const tg_attn_params *p = &pb->p;
  const int64_t kL = p->kL, D = p->D;
  double F = 0, *s = malloc(sizeof(double) * kL);
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++) {
        const int64_t hk = h / p->gqa_factor;
        const double *Qi = Q + off3(p->Q_strides, b, h, i);
        double mx = -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          const double *Kk = K + off3(p->K_strides, b, hk, k);
          double qk = 0;
          for (int64_t d = 0; d < D; d++) qk += Qi[d] * Kk[d];
          s[k] = p->scale * qk;
          if (p->softcapping != 1.0f) s[k] = p->softcapping * tanh(s[k] / p->softcapping);
          int vis = !(pb->c.causal && k > i + p->qL_off);
          if (vis && pb->mask) {
            const double m = bf(pb->mask[off3(pb->mp.M_strides, b, h, i) + k]);
            if (m == -INFINITY) vis = 0;
            s[k] += m;
          }
          if (!vis) s[k] = -INFINITY;
          mx = fmax(mx, s[k]);
        }
        if (mx == -INFINITY) continue;
        double l = 0;
        for (int64_t k = 0; k < kL; k++) l += exp(s[k] - mx);
        const tg_bf16 *dOi = pb->dO + off3(p->O_strides, b, h, i);
        for (int64_t k = 0; k < kL; k++) {
          if (s[k] == -INFINITY) continue;
          const double w = exp(s[k] - mx) / l;
          const double *Vk = V + off3(p->V_strides, b, hk, k);
          for (int64_t d = 0; d < D; d++) F += w * Vk[d] * bf(dOi[d]);
        }
      }
  free(s);
  return F;
}

/* The f64 reference gradient is the derivative of F: central differences
 * on 12 sampled elements of each of Q, K, V in three configurations, with
 * h = 2^-16: truncation h^2/6 |F'''| ~ 3e-11 |F'''|, rounding ~ 2^-53 |F| / h
 * ~ 1e-11 |F|, both far below the 1e-7 (1 + |g|) tolerance (observed: ~1e-9). */
static void test_reference_is_the_gradient(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 103);
  const size_t picks[] = {3, 5, 7}; /* mask + gqa, token-major causal gqa, softcap */
  for (size_t pi = 0; pi < sizeof picks / sizeof picks[0]; pi++) {
    cfg c = configs[picks[pi]];
    c.B = 1;
    c.qL = c.qL < 20 ? c.qL : 20;
    c.kL = c.kL < 24 ? c.kL : 24;
    problem pb;
    build(&pb, &c, &r);
    double *Q = malloc(sizeof(double) * pb.nQ), *K = malloc(sizeof(double) * pb.nK);
    double *V = malloc(sizeof(double) * pb.nK);
    for (int64_t e = 0; e < pb.nQ; e++) Q[e] = bf(pb.Q[e]);
    for (int64_t e = 0; e < pb.nK; e++) K[e] = bf(pb.K[e]), V[e] = bf(pb.V[e]);
    const double h = 0x1p-16;
    double worst = 0;
    for (int which = 0; which < 3; which++)
      for (int s = 0; s < 12; s++) {
        double *X = which == 0 ? Q : which == 1 ? K : V;
        const tg_attn_params *p = &pb.p;
        const int64_t heads = which == 0 ? p->H : p->H / p->gqa_factor;
        const int64_t len = which == 0 ? p->qL : p->kL;
        const int64_t b = tu_int(&r, 0, p->B - 1), hh = tu_int(&r, 0, (int)heads - 1);
        const int64_t i = tu_int(&r, 0, (int)len - 1), d = tu_int(&r, 0, p->D - 1);
        const int64_t e = off3(which == 0 ? p->Q_strides : p->K_strides, b, hh, i) + d;
        const int64_t ref_i = ((b * heads + hh) * len + i) * p->D + d;
        const double ref = (which == 0 ? pb.dQr : which == 1 ? pb.dKr : pb.dVr)[ref_i];
        const double x0 = X[e];
        X[e] = x0 + h;
        const double Fp = F_of(&pb, Q, K, V);
        X[e] = x0 - h;
        const double Fm = F_of(&pb, Q, K, V);
        X[e] = x0;
        const double fd = (Fp - Fm) / (2 * h);
        worst = fmax(worst, fabs(fd - ref));
        if (!(fabs(fd - ref) <= 1e-7 * (1 + fabs(ref))))
          TU_FAIL("%s: reference d%c[%lld] = %.12g but central difference %.12g", c.name,
                  "QKV"[which], (long long)ref_i, ref, fd);
      }
    printf("  reference vs central differences (%s): max |diff| %.2g\n", c.name, worst);
    free(Q), free(K), free(V);
    destroy(&pb);
  }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_is_the_gradient),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_bounds_reject_a_wrong_L),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
