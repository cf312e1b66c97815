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
 *           e_Ob = e_O + 2^-8 min(|O| + e_O, 2|O|)   (bf16 unit roundoff 2^-8:
 *                  the rounding of a value within e_O of O, or 2^-8|O| doubled
 *                  for the second order where that is smaller)
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
 *
 * The problems and the reference with these bounds come from
 * tests/common/attn_problem.c (its row function attn_step_row: P and dS
 * carry the errors of the forward's L and O), shared with the other FA-2
 * suites.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_problem.h"

/* Masks: 25 % -inf entries, the others in [-2, 1); rows 1, 5, 9, ... all -inf. */
static const attn_suite suite = {.bf16 = 1, .mask_ninf = 0.25, .mask_lo = -2, .mask_row0 = 1,
                                 .mask_step = 4, .acc = ATTN_ACC_NONE, .row = attn_step_row};

/* forward; compute_d (token-major: over [B, qL, H] rows, then one transpose
 * per batch to [H, qL]); backward. L_shift != 0 perturbs L before the
 * backward (negative control). */
static void round_trip(tg_ctx *ctx, const attn_problem *pb, attn_outputs *o, float L_shift) {
  const tg_attn_params *p = &pb->p;
  const tg_attn_mask_params *mp = pb->maskb ? &pb->mp : NULL;
  for (int64_t e = 0; e < pb->nQ; e++) o->O[e] = 0xFFFF; /* NaN */
  tu_poison_f32(o->L, pb->nL);
  tu_poison_f32(o->Dv, pb->nL);
  tu_poison_f32(o->dQ, pb->nQ);
  memset(o->dK, 0, sizeof(float) * pb->nKout);
  memset(o->dV, 0, sizeof(float) * pb->nKout);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_train_fwd_bf16(ctx, pb->Qb, pb->Kb, pb->Vb, o->O, o->L, p, mp,
                                                pb->maskb, pb->c.causal),
                   TG_OK);
  const uint32_t B = p->B, H = p->H, qL = p->qL, D = p->D;
  if (pb->c.layout == ATTN_TOKEN_MAJOR) {
    TU_EXPECT_STATUS(
        ctx,
        tg_flash_attn_train_bwd_compute_d_bf16(ctx, o->O, pb->dOb, o->Dtok, B, qL, H, D),
        TG_OK);
    for (uint32_t b = 0; b < B; b++)
      TU_EXPECT_STATUS(ctx,
                       tg_transpose_2d(ctx, o->Dtok + (int64_t)b * qL * H,
                                       o->Dv + (int64_t)b * H * qL, qL, H),
                       TG_OK);
  } else {
    TU_EXPECT_STATUS(
        ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, o->O, pb->dOb, o->Dv, B, H, qL, D),
        TG_OK);
  }
  if (L_shift != 0)
    for (int64_t e = 0; e < pb->nL; e++) o->L[e] += L_shift;
  TU_EXPECT_STATUS(
      ctx,
      tg_flash_attn_train_bwd_bf16(ctx, pb->Qb, pb->Kb, pb->Vb, o->L, pb->dOb, o->Dv, o->dQ,
                                   o->dK, o->dV, p, mp, pb->maskb, pb->c.causal),
      TG_OK);
}

/* L within its bound (-inf exactly where the row sees no key), the O rows of
 * those rows exactly 0 and their dQ rows exactly 0, then dQ, dK, dV. */
static int check(const attn_problem *pb, const attn_outputs *o, const char *what) {
  const tg_attn_params *p = &pb->p;
  int ok = attn_check_L(pb, o->L);
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++) {
        const int64_t row = (b * p->H + h) * p->qL + i;
        const tg_bf16 *Oi = o->O + attn_off3(p->O_strides, b, h, i);
        if (pb->Lr[row] != -INFINITY) continue;
        int zero = 1;
        for (int64_t d = 0; d < p->D; d++) zero &= Oi[d] == 0 && o->dQ[row * p->D + d] == 0;
        if (!zero) {
          printf("  row %lld sees no key but O/dQ are not 0\n", (long long)row);
          ok = 0;
        }
      }
  ok &= attn_check_grads(pb, o->dQ, o->dK, o->dV);
  if (!ok) printf("  ^ in %s\n", what);
  return ok;
}

/* Largest |got - ref| / bound over dQ, dK, dV (how much of the bound is used). */
static double used_bound(const attn_problem *pb, const attn_outputs *o) {
  double w = 0;
  for (int64_t e = 0; e < pb->nQ; e++)
    w = fmax(w, fabs(o->dQ[e] - pb->dQr[e]) / fmax(pb->dQe[e], 1e-300));
  for (int64_t e = 0; e < pb->nKout; e++) {
    w = fmax(w, fabs(o->dK[e] - pb->dKr[e]) / fmax(pb->dKe[e], 1e-300));
    w = fmax(w, fabs(o->dV[e] - pb->dVr[e]) / fmax(pb->dVe[e], 1e-300));
  }
  return w;
}

/* clang-format off */
static const attn_cfg configs[] = {
    /* name                          B  H Hkv qL   kL   D  causal off mask layout      softcap p */
    {"full qL!=kL",                  2, 2, 2, 37,  53,  16, 0,   0,  0,   ATTN_HEAD_MAJOR,  1.0f, 0},
    {"causal qL<kL gqa",             1, 4, 2, 45,  100, 32, 1,   0,  0,   ATTN_HEAD_MAJOR,  1.0f, 0},
    {"causal qL>kL (-inf rows)",     1, 2, 1, 80,  30,  24, 1,   0,  0,   ATTN_HEAD_MAJOR,  1.0f, 0},
    {"mask -inf rows, gqa",          2, 4, 1, 33,  47,  16, 0,   0,  1,   ATTN_HEAD_MAJOR,  1.0f, 0},
    {"mask bcast + causal qL<kL",    1, 3, 3, 40,  70,  8,  1,   0,  2,   ATTN_HEAD_MAJOR,  1.0f, 0},
    {"token-major causal gqa",       2, 4, 2, 70,  70,  16, 1,   0,  0,   ATTN_TOKEN_MAJOR, 1.0f, 0},
    {"token-major mask, qL!=kL",     1, 2, 1, 50,  81,  32, 0,   0,  1,   ATTN_TOKEN_MAJOR, 1.0f, 0},
    {"softcap causal gqa",           1, 4, 2, 30,  45,  16, 1,   0,  1,   ATTN_HEAD_MAJOR,  4.0f, 0},
    {"multi-tile",                   1, 2, 1, 150, 140, 64, 1,   0,  0,   ATTN_TOKEN_MAJOR, 1.0f, 0},
};
/* clang-format on */

static void test_round_trip(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 101);
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  int failures = 0;
  double worst = 0;
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    attn_problem pb;
    attn_build(&pb, &configs[ci], &suite, &r);
    attn_outputs o = attn_alloc_outputs(&pb);
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
    attn_free_outputs(&o);
    attn_destroy(&pb);
  }
  printf("  round trip: largest |err| / bound = %.3g\n", worst);
  if (failures) TU_FAIL("%d round-trip runs out of bound", failures);
}

/* Negative control: the same check must reject a backward fed an L that is
 * off by 1/32 (every P off by ~3 %), in every configuration. */
static void test_bounds_reject_a_wrong_L(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 102);
  for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++) {
    attn_problem pb;
    attn_build(&pb, &configs[ci], &suite, &r);
    attn_outputs o = attn_alloc_outputs(&pb);
    tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
    round_trip(ctx, &pb, &o, 0x1p-5f);
    const double used = used_bound(&pb, &o);
    printf("  L + 1/32, %s: largest |err| / bound = %.3g\n", pb.c.name, used);
    if (!(used > 1))
      TU_FAIL("%s: the bounds accept a backward with L off by 1/32", pb.c.name);
    tg_ctx_destroy(ctx);
    attn_free_outputs(&o);
    attn_destroy(&pb);
  }
}

/* F = sum(O * dO) in f64 (O exact) for the FD check of the reference. */
static double F_of(const attn_problem *pb, const double *Q, const double *K, const double *V) {
  const tg_attn_params *p = &pb->p;
  const int64_t kL = p->kL, D = p->D;
  double F = 0, *s = malloc(sizeof(double) * kL);
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t i = 0; i < p->qL; i++) {
        const int64_t hk = h / p->gqa_factor;
        const double *Qi = Q + attn_off3(p->Q_strides, b, h, i);
        double mx = -INFINITY;
        for (int64_t k = 0; k < kL; k++) {
          const double *Kk = K + attn_off3(p->K_strides, b, hk, k);
          double qk = 0;
          for (int64_t d = 0; d < D; d++) qk += Qi[d] * Kk[d];
          s[k] = p->scale * qk;
          if (p->softcapping != 1.0f) s[k] = p->softcapping * tanh(s[k] / p->softcapping);
          int vis = !(pb->c.causal && k > i + p->qL_off);
          if (vis && pb->mask) {
            const double m = pb->mask[attn_off3(pb->mp.M_strides, b, h, i) + k];
            if (m == -INFINITY) vis = 0;
            s[k] += m;
          }
          if (!vis) s[k] = -INFINITY;
          mx = fmax(mx, s[k]);
        }
        if (mx == -INFINITY) continue;
        double l = 0;
        for (int64_t k = 0; k < kL; k++) l += exp(s[k] - mx);
        const float *dOi = pb->dO + attn_off3(p->O_strides, b, h, i);
        for (int64_t k = 0; k < kL; k++) {
          if (s[k] == -INFINITY) continue;
          const double w = exp(s[k] - mx) / l;
          const double *Vk = V + attn_off3(p->V_strides, b, hk, k);
          for (int64_t d = 0; d < D; d++) F += w * Vk[d] * dOi[d];
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
    attn_cfg c = configs[picks[pi]];
    c.B = 1;
    c.qL = c.qL < 20 ? c.qL : 20;
    c.kL = c.kL < 24 ? c.kL : 24;
    attn_problem pb;
    attn_build(&pb, &c, &suite, &r);
    double *Q = malloc(sizeof(double) * pb.nQ), *K = malloc(sizeof(double) * pb.nK);
    double *V = malloc(sizeof(double) * pb.nK);
    for (int64_t e = 0; e < pb.nQ; e++) Q[e] = pb.Q[e];
    for (int64_t e = 0; e < pb.nK; e++) K[e] = pb.K[e], V[e] = pb.V[e];
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
        const int64_t e = attn_off3(which == 0 ? p->Q_strides : p->K_strides, b, hh, i) + d;
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
    attn_destroy(&pb);
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
