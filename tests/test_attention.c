/*
 * FA-2 family (contract kernels 1-3 and the training forward) against an f64
 * reference.
 *
 * Tolerances. Every comparison uses a per-element bound computed in f64 next
 * to the reference: a first-order forward error bound of the f32 algorithm,
 * with u = 2^-24 (f32 unit roundoff) and gamma(n) = (n + 2) u for a sum of n
 * terms in any order (the classic bound, |fl(sum) - sum| <= gamma(n) sum|terms|):
 *
 *   qk  = Q.K            e_qk = gamma(D) sum_d |Q K|
 *   s   = score(qk)      e_s  = |scale| e_qk + 4u(|s| + |scale qk|) (+ u|s| mask add)
 *   P   = exp(s - L)     e_P  = P (e_s + u|s - L| + 2u)      (expf is < 2 ulp)
 *   dP  = dO.V           e_dP = gamma(D) sum_d |dO V|
 *   dS  = scale P (dP - Dv) (1 - t^2 with softcap)
 *                        e_dS = |scale| (e_P |dP - Dv| + P (e_dP + u|dP - Dv|)) + 8u|dS|
 *   dQ  = sum_k dS K     e    = sum_k e_dS |K| + gamma(kL) sum_k |dS K|
 *   dK  = pre + sum dS Q e    = sum e_dS |Q| + gamma(n + 1) (|pre| + sum |dS Q|)
 *   dV  = pre + sum P dO e    = sum e_P |dO| + gamma(n + 1) (|pre| + sum |P dO|)
 *
 * and the test passes iff |got - ref| <= 2 e (the factor 2 covers the
 * neglected second-order terms). The bound scales with the magnitude of the
 * summed terms, not with the result, because dQ and dK cancel towards 0. It
 * is loose enough for any summation order and tight enough that a missing,
 * duplicated or mis-masked term (an error of the order of a whole term) fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"

static const double U = 0x1.0p-24;
static double gam(double n) { return (n + 2) * U; }

/* One test problem: sizes, layout and features. */
typedef struct {
  const char *name;
  int B, H, H_kv, qL, kL, D;
  int causal;
  int qL_off_delta;   /* qL_off = kL - qL + delta (0 = bottom-right aligned) */
  int mask;           /* 0 none, 1 full [B,H,qL,kL], 2 broadcast over batch and head */
  int strided;        /* Q/dO as [B, L, H, D]; K/V rows padded */
  float softcap;      /* 1 = off */
} cfg;

typedef struct {
  cfg c;
  tg_attn_params p;
  tg_attn_mask_params mp;
  int64_t nQ, nK, nM, nL, nOut, nKout;
  tg_bf16 *Q, *K, *V, *dO, *mask;
  float *L, *Dv, *dK0, *dV0;
  double *dQr, *dKr, *dVr, *dQe, *dKe, *dVe; /* reference and its error bound */
  double *Or, *Oe, *Lr, *Le; /* forward: O [B,H,qL,D] and L [B,H,qL], bounds */
} problem;

static int64_t off3(const int64_t s[3], int64_t b, int64_t h, int64_t r) {
  return b * s[0] + h * s[1] + r * s[2];
}

static int visible(const problem *pb, int64_t b, int64_t h, int64_t i, int64_t k,
                   double *madd) {
  *madd = 0;
  if (pb->c.causal && k > i + pb->p.qL_off) return 0;
  if (pb->mask) {
    double m = tg_bf16_to_f32(pb->mask[off3(pb->mp.M_strides, b, h, i) + k]);
    if (m == -INFINITY) return 0;
    *madd = m;
  }
  return 1;
}

/* Score in f64 and its error bound; t = tanh for softcap. */
static double ref_score(const problem *pb, int64_t b, int64_t h, int64_t i, int64_t k,
                        int *vis, double *t, double *err) {
  const tg_attn_params *p = &pb->p;
  const int64_t hk = h / p->gqa_factor;
  const tg_bf16 *q = pb->Q + off3(p->Q_strides, b, h, i);
  const tg_bf16 *kk = pb->K + off3(p->K_strides, b, hk, k);
  double qk = 0, aqk = 0;
  for (int d = 0; d < p->D; d++) {
    double x = (double)tg_bf16_to_f32(q[d]) * tg_bf16_to_f32(kk[d]);
    qk += x;
    aqk += fabs(x);
  }
  double s = p->scale * qk;
  *t = 0;
  if (pb->c.softcap != 1.0f) {
    *t = tanh(s / pb->c.softcap);
    s = pb->c.softcap * *t;
  }
  double madd;
  *vis = visible(pb, b, h, i, k, &madd);
  *err = fabs(p->scale) * gam(p->D) * aqk + 4 * U * (fabs(s) + fabs(p->scale * qk)) +
         U * fabs(s + madd);
  return s + madd;
}

/*
 * Forward reference for row i: O = sum_k exp(s_k - m) V_k / l, L = m + log l.
 * Bound of an f32 online softmax over key tiles of at least 16 keys (T tile
 * steps): each final weight exp(s_k - m) carries a relative error of at most
 * eps = se_k + E + (T + 2) 2u + 2u R (E = max score bound, R = max |s - m|;
 * every rescale exp(m_old - m_new) adds u|dm| + 2u and the dm add up to <= R).
 * O: (eps + gamma(kL)) (sum P|V| / l + |O|) + u|O|, doubled for second-order
 * terms, plus the bf16 rounding of the output, 2^-8 (|O| + e).
 * L: 2 (E + eps + gamma(kL) + u|L| + 2u|log l|).
 */
static void forward_reference(problem *pb, int64_t b, int64_t h, int64_t i, const double *s,
                              const double *se, const int *vis, double mx, double sum) {
  const tg_attn_params *p = &pb->p;
  const int64_t D = p->D, kL = p->kL, hk = h / p->gqa_factor;
  const int64_t row = (b * p->H + h) * p->qL + i;
  if (!(sum > 0)) { /* no visible key: O = 0 exactly, L = -inf */
    pb->Lr[row] = -INFINITY;
    return;
  }
  double E = 0, R = 0;
  for (int64_t k = 0; k < kL; k++)
    if (vis[k]) {
      E = fmax(E, se[k]);
      R = fmax(R, mx - s[k]);
    }
  const double T = (double)((kL + 15) / 16);
  const double eps = 2 * E + (T + 2) * 2 * U + 2 * U * R + gam(kL);
  double *O = pb->Or + row * D, *Oe = pb->Oe + row * D;
  for (int64_t k = 0; k < kL; k++) {
    if (!vis[k]) continue;
    const double w = exp(s[k] - mx) / sum;
    const tg_bf16 *Vk = pb->V + off3(p->V_strides, b, hk, k);
    for (int64_t d = 0; d < D; d++) {
      O[d] += w * tg_bf16_to_f32(Vk[d]);
      Oe[d] += w * fabs(tg_bf16_to_f32(Vk[d]));
    }
  }
  for (int64_t d = 0; d < D; d++) {
    const double e = 2 * (eps * (Oe[d] + fabs(O[d])) + U * fabs(O[d]));
    Oe[d] = e + 0x1p-8 * (fabs(O[d]) + e); /* bf16: p = 8, u = 2^-8 */
  }
  pb->Lr[row] = mx + log(sum);
  pb->Le[row] = 2 * (E + eps + U * fabs(pb->Lr[row]) + 2 * U * fabs(log(sum)));
}

/* Builds inputs, L (exact logsumexp rounded to f32) and D_vec (from a bf16
 * rounded reference O), then the f64 reference gradients with bounds. */
static void build(problem *pb, const cfg *c, tu_rng *r) {
  memset(pb, 0, sizeof *pb);
  pb->c = *c;
  tg_attn_params *p = &pb->p;
  assert_int_equal(tg_attn_params_init(p, c->B, c->H, c->H_kv, c->qL, c->kL, c->D,
                                       (float)(1.0 / sqrt(c->D))),
                   TG_OK);
  p->qL_off += c->qL_off_delta;
  p->softcapping = c->softcap;
  const int64_t B = c->B, H = c->H, Hk = c->H_kv, qL = c->qL, kL = c->kL, D = c->D;
  if (c->strided) { /* Q, dO as [B, qL, H, D]; K, V rows padded by 8 */
    int64_t qs[3] = {qL * H * D, D, H * D}, ks[3] = {Hk * kL * (D + 8), kL * (D + 8), D + 8};
    memcpy(p->Q_strides, qs, sizeof qs);
    memcpy(p->O_strides, qs, sizeof qs);
    memcpy(p->K_strides, ks, sizeof ks);
    memcpy(p->V_strides, ks, sizeof ks);
  }
  pb->nQ = B * H * qL * D;
  pb->nK = c->strided ? B * Hk * kL * (D + 8) : B * Hk * kL * D;
  pb->nL = B * H * qL;
  pb->nOut = pb->nQ;
  pb->nKout = B * Hk * kL * D;
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
    for (int64_t e = 0; e < pb->nM; e++) {
      double x = tu_uniform(r, 0, 1);
      pb->mask[e] = tg_f32_to_bf16(x < 0.2 ? -INFINITY : (float)tu_uniform(r, -3, 1));
    }
    /* fully masked rows */
    for (int64_t row = 0; row < pb->nM / kL; row += 3)
      for (int64_t k = 0; k < kL; k++) pb->mask[row * kL + k] = 0xFF80; /* -inf */
  }
  pb->L = tu_alloc(sizeof(float) * pb->nL);
  pb->Dv = tu_alloc(sizeof(float) * pb->nL);
  pb->dK0 = tu_alloc(sizeof(float) * pb->nKout);
  pb->dV0 = tu_alloc(sizeof(float) * pb->nKout);
  tu_fill_f32(r, pb->dK0, pb->nKout, -1, 1);
  tu_fill_f32(r, pb->dV0, pb->nKout, -1, 1);

  pb->Or = calloc(pb->nOut, sizeof(double));
  pb->Oe = calloc(pb->nOut, sizeof(double));
  pb->Lr = calloc(pb->nL, sizeof(double));
  pb->Le = calloc(pb->nL, sizeof(double));
  pb->dQr = calloc(pb->nOut, sizeof(double));
  pb->dQe = calloc(pb->nOut, sizeof(double));
  pb->dKr = calloc(pb->nKout, sizeof(double));
  pb->dKe = calloc(pb->nKout, sizeof(double));
  pb->dVr = calloc(pb->nKout, sizeof(double));
  pb->dVe = calloc(pb->nKout, sizeof(double));
  double *sK = calloc(pb->nKout, sizeof(double)), *sV = calloc(pb->nKout, sizeof(double));
  double *s = malloc(sizeof(double) * kL), *se = malloc(sizeof(double) * kL);
  double *t = malloc(sizeof(double) * kL), *P = malloc(sizeof(double) * kL);
  double *Pe = malloc(sizeof(double) * kL), *dS = malloc(sizeof(double) * kL);
  double *dSe = malloc(sizeof(double) * kL);
  int *vis = malloc(sizeof(int) * kL);
  double *O = malloc(sizeof(double) * D);

  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < qL; i++) {
        const int64_t hk = h / p->gqa_factor, row = (b * H + h) * qL + i;
        const tg_bf16 *dOi = pb->dO + off3(p->O_strides, b, h, i);
        const tg_bf16 *Qi = pb->Q + off3(p->Q_strides, b, h, i);
        double mx = -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          s[k] = ref_score(pb, b, h, i, k, &vis[k], &t[k], &se[k]);
          if (vis[k] && s[k] > mx) mx = s[k];
        }
        double sum = 0;
        for (int64_t k = 0; k < kL; k++) sum += vis[k] ? exp(s[k] - mx) : 0;
        const float L = sum > 0 ? (float)(mx + log(sum)) : -INFINITY;
        forward_reference(pb, b, h, i, s, se, vis, mx, sum);
        pb->L[row] = L;
        /* O = softmax . V, rounded to bf16 as the forward would store it */
        for (int64_t d = 0; d < D; d++) O[d] = 0;
        for (int64_t k = 0; k < kL; k++) {
          P[k] = (vis[k] && L != -INFINITY) ? exp(s[k] - (double)L) : 0;
          Pe[k] = P[k] * (se[k] + U * fabs(s[k] - L) + 2 * U);
          const tg_bf16 *Vk = pb->V + off3(p->V_strides, b, hk, k);
          for (int64_t d = 0; d < D; d++) O[d] += P[k] * tg_bf16_to_f32(Vk[d]);
        }
        double Dv = 0;
        for (int64_t d = 0; d < D; d++)
          Dv += (double)tg_bf16_to_f32(tg_f32_to_bf16((float)O[d])) * tg_bf16_to_f32(dOi[d]);
        pb->Dv[row] = (float)Dv;
        for (int64_t k = 0; k < kL; k++) {
          const tg_bf16 *Vk = pb->V + off3(p->V_strides, b, hk, k);
          double dP = 0, adP = 0;
          for (int64_t d = 0; d < D; d++) {
            double x = (double)tg_bf16_to_f32(dOi[d]) * tg_bf16_to_f32(Vk[d]);
            dP += x;
            adP += fabs(x);
          }
          const double diff = dP - pb->Dv[row];
          const double sc = pb->c.softcap != 1.0f ? 1 - t[k] * t[k] : 1;
          dS[k] = p->scale * P[k] * diff * sc;
          dSe[k] = fabs(p->scale) * (Pe[k] * fabs(diff) + P[k] * (gam(D) * adP + U * fabs(diff))) +
                   8 * U * fabs(dS[k]);
        }
        for (int64_t k = 0; k < kL; k++) {
          if (P[k] == 0) continue;
          const tg_bf16 *Kk = pb->K + off3(p->K_strides, b, hk, k);
          const int64_t ko = ((b * Hk + hk) * kL + k) * D;
          for (int64_t d = 0; d < D; d++) {
            const double kd = tg_bf16_to_f32(Kk[d]), qd = tg_bf16_to_f32(Qi[d]);
            const double od = tg_bf16_to_f32(dOi[d]);
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
  const double n = (double)(H / Hk) * qL + 1;
  for (int64_t e = 0; e < pb->nKout; e++) {
    pb->dKr[e] += pb->dK0[e];
    pb->dVr[e] += pb->dV0[e];
    pb->dKe[e] = 2 * (pb->dKe[e] + gam(n) * (fabs(pb->dK0[e]) + sK[e]));
    pb->dVe[e] = 2 * (pb->dVe[e] + gam(n) * (fabs(pb->dV0[e]) + sV[e]));
  }
  for (int64_t e = 0; e < pb->nOut; e++) pb->dQe[e] *= 2;
  free(sK), free(sV), free(s), free(se), free(t), free(P), free(Pe), free(dS), free(dSe);
  free(vis), free(O);
}

static void destroy(problem *pb) {
  free(pb->Q), free(pb->K), free(pb->V), free(pb->dO), free(pb->mask), free(pb->L);
  free(pb->Dv), free(pb->dK0), free(pb->dV0), free(pb->dQr), free(pb->dKr), free(pb->dVr);
  free(pb->dQe), free(pb->dKe), free(pb->dVe), free(pb->Or), free(pb->Oe), free(pb->Lr);
  free(pb->Le);
}

typedef struct { float *dQ, *dK, *dV; } outputs;

static tg_status run_bwd(tg_ctx *ctx, const problem *pb, outputs *o) {
  tu_poison_f32(o->dQ, pb->nOut);
  memcpy(o->dK, pb->dK0, sizeof(float) * pb->nKout);
  memcpy(o->dV, pb->dV0, sizeof(float) * pb->nKout);
  return tg_flash_attn_train_bwd_bf16(ctx, pb->Q, pb->K, pb->V, pb->L, pb->dO, pb->Dv,
                                      o->dQ, o->dK, o->dV, &pb->p,
                                      pb->mask ? &pb->mp : NULL, pb->mask, pb->c.causal);
}

static outputs alloc_outputs(const problem *pb) {
  outputs o = {tu_alloc(sizeof(float) * pb->nOut), tu_alloc(sizeof(float) * pb->nKout),
               tu_alloc(sizeof(float) * pb->nKout)};
  return o;
}
static void free_outputs(outputs *o) { free(o->dQ), free(o->dK), free(o->dV); }

/* dQ, dK, dV against the reference bounds (all three, reporting each). */
static int check_grads(const problem *pb, const outputs *o) {
  const int q = tu_check_bound("dQ", o->dQ, pb->dQr, pb->dQe, pb->nOut);
  const int k = tu_check_bound("dK", o->dK, pb->dKr, pb->dKe, pb->nKout);
  const int v = tu_check_bound("dV", o->dV, pb->dVr, pb->dVe, pb->nKout);
  return q && k && v;
}

static const cfg configs[] = {
    /* name                    B  H Hkv qL  kL   D  causal off mask str softcap */
    {"single element",         1, 1, 1, 1,   1,   8, 0, 0, 0, 0, 1.0f},
    {"ragged tails",           2, 3, 3, 70,  45,  24, 0, 0, 0, 0, 1.0f},
    {"gqa causal qL<kL",       1, 4, 2, 37,  100, 64, 1, 0, 0, 0, 1.0f},
    {"causal qL>kL",           1, 2, 1, 90,  30,  16, 1, 0, 0, 0, 1.0f},
    {"causal qL_off=0 (seed)", 1, 2, 2, 40,  75,  8,  1, -35, 0, 0, 1.0f},
    {"mask -inf, full",        2, 2, 1, 33,  47,  32, 0, 0, 1, 0, 1.0f},
    {"mask broadcast + causal",2, 3, 1, 65,  65,  40, 1, 0, 2, 0, 1.0f},
    {"strided layouts",        2, 4, 2, 50,  67,  48, 1, 0, 0, 1, 1.0f},
    {"D=256",                  1, 2, 1, 20,  33,  256, 0, 0, 0, 0, 1.0f},
    {"D=512 gqa",              1, 2, 1, 9,   70,  512, 1, 0, 1, 0, 1.0f},
    {"softcap",                1, 2, 2, 45,  45,  16, 1, 0, 1, 0, 5.0f},
    {"multi-tile",             1, 2, 1, 200, 150, 128, 1, 0, 0, 1, 1.0f},
    /* >= 8 key tiles of 64: the KV schedule splits keys into ranges and sums
     * dQ partials */
    {"key ranges causal mask", 1, 2, 1, 70,  600, 16, 1, 0, 1, 0, 1.0f},
    {"key ranges x4 strided",  1, 2, 2, 40, 1100, 8,  0, 0, 0, 1, 1.0f},
    /* causal ranges that early q-tiles never reach (their partial rows are
     * skipped), and q rows that see no key at all (qL > kL) */
    {"key ranges causal qL=kL",1, 2, 1, 600, 600, 24, 1, 0, 0, 0, 1.0f},
    {"key ranges causal qL>kL",1, 1, 1, 700, 530, 16, 1, 0, 0, 1, 1.0f},
};

/* The ways the backward can run: both schedules, and deterministic mode. */
typedef struct { const char *name; tg_attn_schedule schedule; int det; } run_mode;
static const run_mode modes[] = {
    {"kv", TG_ATTN_SCHEDULE_KV, 0},
    {"atomic", TG_ATTN_SCHEDULE_ATOMIC, 0},
    {"deterministic", TG_ATTN_SCHEDULE_ATOMIC, 1}, /* det overrides the schedule */
};
enum { N_MODES = sizeof modes / sizeof modes[0] };

/* Every config, at 1/2/3 threads, on every ISA, in every run mode. */
static void test_bwd_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 1);
  tg_isa isas[4];
  const int nisa = tu_isas(isas);
  int failures = 0;
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    problem pb;
    build(&pb, &configs[ci], &r);
    outputs o = alloc_outputs(&pb);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++)
        for (int mi = 0; mi < N_MODES; mi++) {
          tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
          tg_ctx_set_deterministic(ctx, modes[mi].det);
          assert_int_equal(tg_ctx_set_attn_schedule(ctx, modes[mi].schedule), TG_OK);
          TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
          char what[160];
          snprintf(what, sizeof what, "%s [%s, %d threads, %s]", pb.c.name,
                   tg_isa_name(isas[ii]), tu_thread_counts[ti], modes[mi].name);
          if (!check_grads(&pb, &o)) {
            printf("  ^ in %s\n", what);
            failures++;
          }
          tg_ctx_destroy(ctx);
        }
    free_outputs(&o);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d configuration runs out of bound", failures);
}

/* One context for every config, forwards then backwards: the dQ partial
 * workspace it keeps holds the previous call's rows, which must never leak
 * into a later result. */
static void test_bwd_reused_context(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  enum { N = sizeof configs / sizeof configs[0] };
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  int failures = 0;
  for (int i = 0; i < 2 * N; i++) {
    problem pb;
    build(&pb, &configs[i < N ? i : 2 * N - 1 - i], &r);
    outputs o = alloc_outputs(&pb);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
    if (!check_grads(&pb, &o)) {
      printf("  ^ in %s, call %d on one context\n", pb.c.name, i);
      failures++;
    }
    free_outputs(&o);
    destroy(&pb);
  }
  tg_ctx_destroy(ctx);
  if (failures) TU_FAIL("%d calls on a reused context out of bound", failures);
}

/* Random configurations: fresh shapes and features every run. */
static void test_bwd_random_configs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 2);
  int failures = 0;
  for (int it = 0; it < 6; it++) {
    cfg c = {.name = "random"};
    c.B = tu_int(&r, 1, 2);
    c.H_kv = tu_int(&r, 1, 3);
    c.H = c.H_kv * tu_int(&r, 1, 3);
    c.qL = tu_int(&r, 0, 3) == 0 ? tu_int(&r, 400, 700) : tu_int(&r, 1, 130);
    c.kL = tu_int(&r, 0, 3) == 0 ? tu_int(&r, 400, 700) : tu_int(&r, 1, 130);
    c.D = 8 * tu_int(&r, 1, 20);
    c.causal = tu_int(&r, 0, 1);
    c.qL_off_delta = tu_int(&r, 0, 3) == 0 ? tu_int(&r, -20, 20) : 0;
    c.mask = tu_int(&r, 0, 2);
    c.strided = tu_int(&r, 0, 1);
    c.softcap = tu_int(&r, 0, 3) == 0 ? (float)tu_uniform(&r, 0.5, 10) : 1.0f;
    problem pb;
    build(&pb, &c, &r);
    outputs o = alloc_outputs(&pb);
    tg_ctx *ctx = tu_ctx(tu_int(&r, 1, 3), TG_ISA_AUTO);
    const run_mode *mode = &modes[tu_int(&r, 0, N_MODES - 1)];
    tg_ctx_set_deterministic(ctx, mode->det);
    tg_ctx_set_attn_schedule(ctx, mode->schedule);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
    if (!check_grads(&pb, &o)) {
      printf("  ^ in B=%d H=%d H_kv=%d qL=%d kL=%d D=%d causal=%d off+%d mask=%d "
             "strided=%d softcap=%g %s\n",
             c.B, c.H, c.H_kv, c.qL, c.kL, c.D, c.causal, c.qL_off_delta, c.mask,
             c.strided, (double)c.softcap, mode->name);
      failures++;
    }
    tg_ctx_destroy(ctx);
    free_outputs(&o);
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d random configurations out of bound", failures);
}

/* Fully masked rows (L = -inf) give exactly zero dQ and no dK/dV change. */
static void test_bwd_fully_masked_rows_are_zero(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 3);
  const cfg c = {"all masked", 1, 2, 1, 20, 10, 16, 1, -30, 0, 0, 1.0f}; /* i+off < 0 */
  problem pb;
  build(&pb, &c, &r);
  outputs o = alloc_outputs(&pb);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, &o), TG_OK);
  for (int64_t e = 0; e < pb.nOut; e++) assert_true(o.dQ[e] == 0.0f);
  assert_memory_equal(o.dK, pb.dK0, sizeof(float) * pb.nKout);
  assert_memory_equal(o.dV, pb.dV0, sizeof(float) * pb.nKout);
  tg_ctx_destroy(ctx);
  free_outputs(&o);
  destroy(&pb);
}

/* Deterministic mode: bitwise identical across runs and 1/2/3/5 threads
 * (9 key tiles: two key ranges, so the dQ partial sum is covered). */
static void test_bwd_deterministic_bitwise(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 4);
  const cfg c = {"det", 2, 4, 2, 150, 530, 64, 1, 0, 1, 0, 1.0f};
  problem pb;
  build(&pb, &c, &r);
  outputs first = alloc_outputs(&pb), o = alloc_outputs(&pb);
  const int threads[] = {1, 2, 3, 5, 2};
  for (int ti = 0; ti < 5; ti++) {
    tg_ctx *ctx = tu_ctx(threads[ti], TG_ISA_AUTO);
    tg_ctx_set_deterministic(ctx, 1);
    TU_EXPECT_STATUS(ctx, run_bwd(ctx, &pb, ti ? &o : &first), TG_OK);
    if (ti) {
      assert_memory_equal(o.dQ, first.dQ, sizeof(float) * pb.nOut);
      assert_memory_equal(o.dK, first.dK, sizeof(float) * pb.nKout);
      assert_memory_equal(o.dV, first.dV, sizeof(float) * pb.nKout);
    }
    tg_ctx_destroy(ctx);
  }
  free_outputs(&first);
  free_outputs(&o);
  destroy(&pb);
}

/* --- bad input: status + message, nothing written ------------------------- */
static void test_bwd_bad_input_writes_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 5);
  const cfg c = {"bad", 1, 2, 1, 33, 17, 16, 0, 0, 1, 0, 1.0f};
  problem pb;
  build(&pb, &c, &r);
  outputs o = alloc_outputs(&pb);
  tu_fill_f32(&r, o.dQ, pb.nOut, -1, 1);
  tu_fill_f32(&r, o.dK, pb.nKout, -1, 1);
  tu_fill_f32(&r, o.dV, pb.nKout, -1, 1);
  float *sQ = tu_alloc(sizeof(float) * pb.nOut), *sK = tu_alloc(sizeof(float) * pb.nKout);
  float *sV = tu_alloc(sizeof(float) * pb.nKout);
  memcpy(sQ, o.dQ, sizeof(float) * pb.nOut);
  memcpy(sK, o.dK, sizeof(float) * pb.nKout);
  memcpy(sV, o.dV, sizeof(float) * pb.nKout);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);

#define CALL(P, MP, M)                                                                  \
  tg_flash_attn_train_bwd_bf16(ctx, pb.Q, pb.K, pb.V, pb.L, pb.dO, pb.Dv, o.dQ, o.dK,    \
                               o.dV, P, MP, M, 0)
  assert_int_equal(tg_flash_attn_train_bwd_bf16(NULL, pb.Q, pb.K, pb.V, pb.L, pb.dO, pb.Dv,
                                                o.dQ, o.dK, o.dV, &pb.p, &pb.mp, pb.mask, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(NULL, &pb.mp, pb.mask), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(&pb.p, NULL, pb.mask), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, CALL(&pb.p, &pb.mp, NULL), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_bf16(ctx, pb.Q, NULL, pb.V, pb.L, pb.dO, pb.Dv,
                                                o.dQ, o.dK, o.dV, &pb.p, NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_bf16(ctx, pb.Q, pb.K, pb.V, pb.L, pb.dO, pb.Dv,
                                                o.dQ, o.dK, NULL, &pb.p, NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  /* Each case: a copy of the params with one field broken. */
  tg_attn_params q;
  tg_attn_mask_params mq;
#define EXPECT_PARAMS(edit, status)                                                     \
  do {                                                                                  \
    q = pb.p;                                                                           \
    mq = pb.mp;                                                                         \
    edit;                                                                               \
    TU_EXPECT_STATUS(ctx, CALL(&q, &mq, pb.mask), status);                              \
  } while (0)
  EXPECT_PARAMS(q.B = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.qL = -1, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.kL = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.gqa_factor = 0, TG_ERR_BAD_SHAPE);
  EXPECT_PARAMS(q.gqa_factor = 3, TG_ERR_BAD_SHAPE); /* H = 2 */
  EXPECT_PARAMS(q.D = 12, TG_ERR_UNSUPPORTED);
  EXPECT_PARAMS(q.D = 520, TG_ERR_UNSUPPORTED);
  EXPECT_PARAMS(q.NQ += 1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NK = 1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NQ_aligned = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.NK_aligned = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.qL_rem = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.kL_rem = 0, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.scale = NAN, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.scale = INFINITY, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.softcapping = 0.0f, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.softcapping = -2.0f, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.Q_strides[1] = -1, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(q.V_strides[2] = INT64_MAX / 4, TG_ERR_OVERFLOW);
  EXPECT_PARAMS(q.O_strides[2] = INT64_MAX / 16, TG_ERR_OVERFLOW);
  EXPECT_PARAMS(mq.M_strides[2] = -5, TG_ERR_BAD_PARAMS);
  EXPECT_PARAMS(mq.M_strides[2] = INT64_MAX / 2, TG_ERR_OVERFLOW);
#undef EXPECT_PARAMS
#undef CALL
  assert_memory_equal(o.dQ, sQ, sizeof(float) * pb.nOut);
  assert_memory_equal(o.dK, sK, sizeof(float) * pb.nKout);
  assert_memory_equal(o.dV, sV, sizeof(float) * pb.nKout);
  tg_ctx_destroy(ctx);
  free(sQ), free(sK), free(sV);
  free_outputs(&o);
  destroy(&pb);
}

/* --- training forward ------------------------------------------------------ */
/* Runs the forward with O (through O_strides) and L poisoned; checks both. */
static int check_forward(tg_ctx *ctx, const problem *pb, const char *what) {
  const tg_attn_params *p = &pb->p;
  const int64_t B = p->B, H = p->H, qL = p->qL, D = p->D;
  const int64_t nO = pb->c.strided ? pb->nQ : pb->nOut; /* strided O as [B,qL,H,D] */
  tg_bf16 *O = tu_alloc(2 * nO);
  float *L = tu_alloc(sizeof(float) * pb->nL), *Of = tu_alloc(sizeof(float) * pb->nOut);
  for (int64_t e = 0; e < nO; e++) O[e] = 0xFFFF; /* bf16 NaN */
  tu_poison_f32(L, pb->nL);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_fwd_bf16(ctx, pb->Q, pb->K, pb->V, O, L, p,
                                                pb->mask ? &pb->mp : NULL, pb->mask,
                                                pb->c.causal),
                   TG_OK);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < qL; i++)
        for (int64_t d = 0; d < D; d++)
          Of[((b * H + h) * qL + i) * D + d] =
              tg_bf16_to_f32(O[off3(p->O_strides, b, h, i) + d]);
  int ok = tu_check_bound("O", Of, pb->Or, pb->Oe, pb->nOut);
  /* L: -inf rows must be exactly -inf */
  for (int64_t r = 0; r < pb->nL; r++)
    if ((pb->Lr[r] == -INFINITY) != (L[r] == -INFINITY)) {
      printf("  L[%lld] = %g, want %g\n", (long long)r, (double)L[r], pb->Lr[r]);
      ok = 0;
    }
  double *Lr = tu_alloc(sizeof(double) * pb->nL), *Le = tu_alloc(sizeof(double) * pb->nL);
  float *Lf = tu_alloc(sizeof(float) * pb->nL);
  for (int64_t r = 0; r < pb->nL; r++) { /* compare the finite ones */
    const int inf = pb->Lr[r] == -INFINITY;
    Lr[r] = inf ? 0 : pb->Lr[r];
    Le[r] = inf ? 0 : pb->Le[r];
    Lf[r] = inf ? 0.0f : L[r];
  }
  ok &= tu_check_bound("L", Lf, Lr, Le, pb->nL);
  if (!ok) printf("  ^ forward, %s\n", what);
  free(O), free(L), free(Of), free(Lr), free(Le), free(Lf);
  return ok;
}

static void test_fwd_against_reference(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 8);
  tg_isa isas[4];
  const int nisa = tu_isas(isas);
  int failures = 0;
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    problem pb;
    build(&pb, &configs[ci], &r);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        char what[160];
        snprintf(what, sizeof what, "%s [%s, %d threads]", pb.c.name, tg_isa_name(isas[ii]),
                 tu_thread_counts[ti]);
        failures += !check_forward(ctx, &pb, what);
        tg_ctx_destroy(ctx);
      }
    destroy(&pb);
  }
  if (failures) TU_FAIL("%d forward runs out of bound", failures);
}

static void test_fwd_bad_input_writes_nothing(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 9);
  const cfg c = {"bad fwd", 1, 2, 1, 20, 17, 16, 0, 0, 1, 0, 1.0f};
  problem pb;
  build(&pb, &c, &r);
  tg_bf16 *O = tu_alloc(2 * pb.nOut);
  float *L = tu_alloc(sizeof(float) * pb.nL);
  memset(O, 0x5A, 2 * pb.nOut);
  memset(L, 0x5A, sizeof(float) * pb.nL);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  tg_attn_params q = pb.p;
  q.D = 20;
  assert_int_equal(tg_flash_attn_train_fwd_bf16(NULL, pb.Q, pb.K, pb.V, O, L, &pb.p, NULL,
                                                NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Q, pb.K, pb.V, NULL, L, &pb.p,
                                                     NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Q, pb.K, pb.V, O, NULL, &pb.p,
                                                     NULL, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Q, pb.K, pb.V, O, L, &pb.p,
                                                     &pb.mp, NULL, 0),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Q, pb.K, pb.V, O, L, &q, NULL,
                                                     NULL, 0),
                   TG_ERR_UNSUPPORTED);
  q = pb.p;
  q.kL_rem = 0;
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, pb.Q, pb.K, pb.V, O, L, &q, NULL,
                                                     NULL, 0),
                   TG_ERR_BAD_PARAMS);
  for (int64_t e = 0; e < pb.nOut; e++) assert_int_equal(O[e], 0x5A5A);
  for (int64_t e = 0; e < pb.nL; e++) {
    uint32_t u;
    memcpy(&u, &L[e], 4);
    assert_int_equal(u, 0x5A5A5A5Au);
  }
  tg_ctx_destroy(ctx);
  free(O), free(L);
  destroy(&pb);
}

/* --- kernel 1: D = rowsum(O * dO) ----------------------------------------------- */
static void test_compute_d(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 6);
  const int shapes[][4] = {{1, 1, 1, 8}, {2, 3, 37, 24}, {1, 4, 300, 64}, {1, 1, 5, 512},
                           {1, 2, 3, 7}};
  tg_isa isas[4];
  const int nisa = tu_isas(isas);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int64_t rows = (int64_t)shapes[si][0] * shapes[si][1] * shapes[si][2];
    const int64_t D = shapes[si][3];
    tg_bf16 *O = tu_alloc(2 * rows * D), *dO = tu_alloc(2 * rows * D);
    tu_fill_bf16(&r, O, rows * D, -3, 3);
    tu_fill_bf16(&r, dO, rows * D, -3, 3);
    double *want = tu_alloc(sizeof(double) * rows), *bound = tu_alloc(sizeof(double) * rows);
    for (int64_t i = 0; i < rows; i++) {
      double s = 0, a = 0;
      for (int64_t d = 0; d < D; d++) {
        double x = (double)tg_bf16_to_f32(O[i * D + d]) * tg_bf16_to_f32(dO[i * D + d]);
        s += x;
        a += fabs(x);
      }
      want[i] = s;
      bound[i] = gam(D) * a; /* products of bf16 are exact in f32 */
    }
    float *got = tu_alloc(sizeof(float) * rows);
    for (int ii = 0; ii < nisa; ii++)
      for (int ti = 0; ti < tu_n_thread_counts; ti++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tu_poison_f32(got, rows);
        TU_EXPECT_STATUS(ctx,
                         tg_flash_attn_train_bwd_compute_d_bf16(
                             ctx, O, dO, got, shapes[si][0], shapes[si][1], shapes[si][2],
                             shapes[si][3]),
                         TG_OK);
        if (!tu_check_bound("D_out", got, want, bound, rows))
          TU_FAIL("compute_d shape %zu, %s, %d threads", si, tg_isa_name(isas[ii]),
                  tu_thread_counts[ti]);
        tg_ctx_destroy(ctx);
      }
    free(O), free(dO), free(want), free(bound), free(got);
  }
}

static void test_compute_d_bad_input(void **state) {
  tg_bf16 O[16] = {0}, dO[16] = {0};
  float out[2] = {7, 7};
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  assert_int_equal(tg_flash_attn_train_bwd_compute_d_bf16(NULL, O, dO, out, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, NULL, dO, out, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, NULL, 1, 1, 2, 8),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, 0, 1, 2, 8),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, 1, 1, 2, 0),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, UINT32_MAX,
                                                          UINT32_MAX, UINT32_MAX, 8),
                   TG_ERR_OVERFLOW);
  /* a zero dim is BAD_SHAPE even where the other dims' product overflows */
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, UINT32_MAX,
                                                          UINT32_MAX, UINT32_MAX, 0),
                   TG_ERR_BAD_SHAPE);
  assert_true(out[0] == 7 && out[1] == 7);
  tg_ctx_destroy(ctx);
}

/* --- kernel 3: f32 -> bf16 ---------------------------------------------------------- */
/* Independent reference: the nearest of the two bf16 neighbours, compared in
 * f64; ties to the even mantissa. */
static uint16_t ref_bf16(float x) {
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

static void test_cast(void **state) {
  const uint32_t specials[] = {
      0x00000000, 0x80000000, 0x3F800000, 0x3F808000 /* tie -> even */, 0x3F818000,
      0x3F80C000, 0x3F807FFF, 0x7F7FFFFF /* max -> inf */, 0x7F7F7FFF, 0x7F800000,
      0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001 /* sNaN */, 0x00000001 /* denormal */,
      0x00008000, 0x00018000, 0x807FFFFF, 0x3EAAAAAB};
  const size_t ns = sizeof specials / sizeof specials[0];
  const int64_t n = 200003; /* several chunks and a ragged tail */
  float *src = tu_alloc(sizeof(float) * n);
  tg_bf16 *dst = tu_alloc(2 * n);
  tu_rng r = tu_rng_make(tu_seed() + 7);
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = i < (int64_t)ns ? specials[i] : (uint32_t)tu_next(&r);
    memcpy(&src[i], &u, 4);
  }
  tg_isa isas[4];
  const int nisa = tu_isas(isas);
  for (int ii = 0; ii < nisa; ii++)
    for (int ti = 0; ti < tu_n_thread_counts; ti++) {
      tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
      memset(dst, 0xAB, 2 * n);
      TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, (uint64_t)n), TG_OK);
      for (int64_t i = 0; i < n; i++)
        if (dst[i] != ref_bf16(src[i]))
          TU_FAIL("cast[%lld] of %a (0x%08x): got 0x%04x want 0x%04x (%s)", (long long)i,
                  (double)src[i], (unsigned)((uint32_t *)src)[i], dst[i], ref_bf16(src[i]),
                  tg_isa_name(isas[ii]));
      tg_ctx_destroy(ctx);
    }
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  memset(dst, 0xAB, 4);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, NULL, dst, 2), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, NULL, 2), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, 0), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, dst, UINT64_MAX / 2), TG_ERR_OVERFLOW);
  assert_int_equal(tg_f32_to_bf16_cast(NULL, src, dst, 2), TG_ERR_NULL_ARG);
  assert_true(dst[0] == 0xABAB && dst[1] == 0xABAB);
  tg_ctx_destroy(ctx);
  free(src), free(dst);
}

/* --- params ABI and context ------------------------------------------------------ */
static void test_params_init_and_ctx(void **state) {
  tg_attn_params p;
  assert_int_equal(sizeof p, 160);
  assert_int_equal(tg_attn_params_init(&p, 2, 8, 2, 100, 130, 64, 0.125f), TG_OK);
  assert_int_equal(p.gqa_factor, 4);
  assert_int_equal(p.NQ, 4);
  assert_int_equal(p.NQ_aligned, 3);
  assert_int_equal(p.qL_rem, 4);
  assert_int_equal(p.NK, 9);
  assert_int_equal(p.NK_aligned, 8);
  assert_int_equal(p.kL_rem, 2);
  assert_int_equal(p.qL_off, 30);
  assert_true(p.softcapping == 1.0f);
  assert_int_equal(p.Q_strides[0], 8 * 100 * 64);
  assert_int_equal(p.K_strides[1], 130 * 64);
  assert_int_equal(p.O_strides[2], 64);
  assert_int_equal(tg_attn_params_init(NULL, 1, 1, 1, 1, 1, 8, 1), TG_ERR_NULL_ARG);
  assert_int_equal(tg_attn_params_init(&p, 1, 3, 2, 1, 1, 8, 1), TG_ERR_BAD_SHAPE);
  assert_int_equal(tg_attn_params_init(&p, 1, 1, 1, 0, 1, 8, 1), TG_ERR_BAD_SHAPE);
  /* tiling of a length near INT32_MAX (computed in int64), and batch strides
   * heads * L * D beyond int64 (refused before *p is written) */
  assert_int_equal(tg_attn_params_init(&p, 1, 1, 1, INT32_MAX, 1, 8, 1), TG_OK);
  assert_int_equal(p.NQ, (INT32_MAX / 32) + 1);
  assert_int_equal(p.qL_rem, INT32_MAX % 32);
  const tg_attn_params before = p;
  assert_int_equal(tg_attn_params_init(&p, 1, 1 << 30, 1, 1 << 30, 1, 1 << 30, 1),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(&p, &before, sizeof p);

  tg_ctx *ctx;
  assert_int_equal(tg_ctx_create(&ctx), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  TU_EXPECT_STATUS(ctx, tg_ctx_set_threads(ctx, -1), TG_ERR_BAD_PARAMS);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_threads(ctx, 3), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  assert_int_equal(tg_ctx_set_threads(NULL, 1), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_KV);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, (tg_attn_schedule)7), TG_ERR_BAD_PARAMS);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_KV);
  TU_EXPECT_STATUS(ctx, tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
  assert_int_equal(tg_ctx_get_attn_schedule(ctx), TG_ATTN_SCHEDULE_ATOMIC);
  assert_int_equal(tg_ctx_set_attn_schedule(NULL, TG_ATTN_SCHEDULE_KV), TG_ERR_NULL_ARG);
  assert_int_equal(tg_ctx_create(NULL), TG_ERR_NULL_ARG);
  for (int s = 0; s <= 7; s++) assert_non_null(tg_status_str((tg_status)s));
  tg_ctx_destroy(ctx);
  tg_ctx_destroy(NULL);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_params_init_and_ctx),
      cmocka_unit_test(test_cast),
      cmocka_unit_test(test_compute_d),
      cmocka_unit_test(test_compute_d_bad_input),
      cmocka_unit_test(test_bwd_against_reference),
      cmocka_unit_test(test_bwd_random_configs),
      cmocka_unit_test(test_bwd_reused_context),
      cmocka_unit_test(test_bwd_fully_masked_rows_are_zero),
      cmocka_unit_test(test_bwd_deterministic_bitwise),
      cmocka_unit_test(test_bwd_bad_input_writes_nothing),
      cmocka_unit_test(test_fwd_against_reference),
      cmocka_unit_test(test_fwd_bad_input_writes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
