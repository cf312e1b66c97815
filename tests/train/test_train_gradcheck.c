/*
 * Finite-difference gradient check of the whole tiny-model training step
 * (examples/tiny_model.c): every parameter gradient that tm_forward_backward
 * produces through tilegrad's kernels (embedding and position tables, both
 * RMSNorm weights, Wq, Wk, Wv, Wo, the output projection; tied and separate)
 * against central differences of the same model's loss computed in float64
 * by a plain, independent reference forward (loops, no tilegrad, no BLAS).
 *
 * What is compared, per parameter tensor X:
 *
 *   rel(X) = ||g_X - g_fd,X||_2 / ||g_fd,X||_2  <= 2^-5   (Wq, Wk: 2^-4)
 *
 * and the loss: |loss_tilegrad - loss_f64| <= 2^-7 max(1, loss_f64).
 *
 * Why these bounds. The tilegrad step is not the f64 model: it rounds Q, K,
 * V to bf16 for the attention forward, stores O in bf16 (then widens it for
 * the Wo product) and rounds dO to bf16 for the backward; everything else is
 * f32 (error ~2^-24, negligible here). bf16 keeps 8 significant bits: unit
 * roundoff u = 2^-8. To first order each rounding perturbs a gradient by at
 * most u times the size of the terms it multiplies, and a gradient tensor
 * passes through at most five of them (Q/K/V, O, dO), so rel(X) is a small
 * multiple of u: the median observed is 2^-10 .. 2^-8.5 depending on the
 * tensor. Wq and Wk get their gradient only through the score gradient
 * dS = P (dP - D_vec), where D_vec = rowsum(O dO) comes from the bf16 O and
 * nearly cancels dP on rows whose attention is peaked; their relative error
 * is larger and more spread (median 2^-8). Over 240 seeded runs (120 seeds,
 * both configurations), the worst rel(X) was 2^-7.0 for the other tensors
 * and 2^-6.1 for Wq/Wk: the bounds leave a margin of 4, and still reject
 * real mistakes (a dropped term, a missing scale, a transposed product or a
 * wrong index give rel(X) of order 1). The loss sees the roundings once, in
 * the logits: observed <= 2^-11 max(1, loss) (60 runs).
 *
 * Why h = 2^-12 (relative to max(1, |p|)). The central difference has
 * truncation error h^2/6 |f'''| and rounding error ~ eps64 |f| / h with
 * eps64 = 2^-53 (times the modest growth of the f64 sums). At h ~ 2.4e-4 both
 * are ~1e-8 |f| or less, ~5 orders below the 2^-5 tolerance. The test checks
 * this instead of assuming it: it also takes differences at 2h and requires
 * ||g_fd(h) - g_fd(2h)|| / ||g_fd(h)|| <= 1e-5 for every tensor (that
 * difference is 3x the truncation error of g_fd(h), plus both rounding
 * errors), so the reference gradient is accurate to better than 1e-5
 * (observed: ~1e-7).
 *
 * The tilegrad step runs at 1, 2 and 3 threads on every ISA this CPU has
 * (each run must pass); the f64 reference is computed once.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tiny_model.h"

/* per-tensor relative gradient error: 2^-5, and 2^-4 for Wq and Wk */
static double rel_tol(int tensor) {
  return tensor == TM_WQ || tensor == TM_WK ? 0x1p-4 : 0x1p-5;
}
static const double LOSS_TOL = 0x1p-7;  /* loss, times max(1, loss) */
static const double FD_H = 0x1p-12;     /* step, times max(1, |p|) */
static const double FD_SELF_TOL = 1e-5; /* ||fd(h) - fd(2h)|| / ||fd(h)|| */

typedef struct {
  const char *name;
  tm_config c;
  int pads; /* every pads-th target is padding (0 = none) */
} gc_cfg;

/* --- the f64 reference forward ------------------------------------------------ */
typedef struct {
  tm_config c;
  tm_tensor t[TM_NTENSORS];
  const uint32_t *ids, *tgt;
  /* scratch */
  double *h0, *n1, *q, *k, *v, *o, *h1, *n2, *s;
} ref;

static void rms_norm64(const double *x, const double *w, double *y, int rows, int C,
                       double eps) {
  for (int r = 0; r < rows; r++) {
    double ss = 0;
    for (int j = 0; j < C; j++) ss += x[r * C + j] * x[r * C + j];
    const double inv = 1 / sqrt(ss / C + eps);
    for (int j = 0; j < C; j++) y[r * C + j] = x[r * C + j] * inv * w[j];
  }
}

/* y[N, M] = x[N, K] W[K, M] */
static void matmul64(const double *x, const double *W, double *y, int N, int K, int M) {
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) {
      double a = 0;
      for (int l = 0; l < K; l++) a += x[i * K + l] * W[l * M + j];
      y[i * M + j] = a;
    }
}

static double ref_loss(ref *R, const double *P) {
  const tm_config *c = &R->c;
  const int B = c->batch, T = c->seq_len, N = B * T, C = c->dim, V = c->vocab;
  const int H = c->n_heads, Hk = c->n_kv_heads, Dh = c->head_dim;
  const int HD = H * Dh, KD = Hk * Dh, g = H / Hk;
  const double *E = P + R->t[TM_EMB].offset, *Pos = P + R->t[TM_POS].offset;
  for (int t = 0; t < N; t++)
    for (int j = 0; j < C; j++)
      R->h0[t * C + j] = E[(int64_t)R->ids[t] * C + j] + Pos[(t % T) * C + j];
  rms_norm64(R->h0, P + R->t[TM_NORM1].offset, R->n1, N, C, c->eps);
  matmul64(R->n1, P + R->t[TM_WQ].offset, R->q, N, C, HD);
  matmul64(R->n1, P + R->t[TM_WK].offset, R->k, N, C, KD);
  matmul64(R->n1, P + R->t[TM_WV].offset, R->v, N, C, KD);
  const double scale = 1 / sqrt((double)Dh);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) { /* causal: keys 0..i */
        const double *qi = R->q + (b * T + i) * HD + h * Dh;
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) {
          const double *kj = R->k + (b * T + j) * KD + (h / g) * Dh;
          double d = 0;
          for (int e = 0; e < Dh; e++) d += qi[e] * kj[e];
          R->s[j] = scale * d;
          mx = fmax(mx, R->s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; j++) sum += (R->s[j] = exp(R->s[j] - mx));
        double *oi = R->o + (b * T + i) * HD + h * Dh;
        for (int e = 0; e < Dh; e++) oi[e] = 0;
        for (int j = 0; j <= i; j++) {
          const double *vj = R->v + (b * T + j) * KD + (h / g) * Dh;
          for (int e = 0; e < Dh; e++) oi[e] += R->s[j] / sum * vj[e];
        }
      }
  matmul64(R->o, P + R->t[TM_WO].offset, R->h1, N, HD, C);
  for (int e = 0; e < N * C; e++) R->h1[e] += R->h0[e];
  rms_norm64(R->h1, P + R->t[TM_NORM2].offset, R->n2, N, C, c->eps);
  double total = 0;
  int count = 0;
  for (int t = 0; t < N; t++) {
    if (R->tgt[t] == TM_PAD_ID) continue;
    double mx = -INFINITY;
    for (int u = 0; u < V; u++) {
      double z = 0;
      for (int j = 0; j < C; j++)
        z += R->n2[t * C + j] *
             (c->tied ? E[u * C + j] : P[R->t[TM_WOUT].offset + j * V + u]);
      R->s[u] = z;
      mx = fmax(mx, z);
    }
    double sum = 0;
    for (int u = 0; u < V; u++) sum += exp(R->s[u] - mx);
    total += mx + log(sum) - R->s[R->tgt[t]];
    count++;
  }
  return count ? total / count : 0;
}

/* --- the check ------------------------------------------------------------------ */
static double norm2(const double *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
  return sqrt(s);
}

static void randomize(tm_model *m, tu_rng *r) {
  const tm_config *c = tm_get_config(m);
  float *P = tm_params(m);
  for (int ti = 0; ti < TM_NTENSORS; ti++) {
    const tm_tensor t = tm_get_tensor(m, (tm_tensor_id)ti);
    double lo = -1, hi = 1;
    switch (ti) {
      case TM_NORM1:
      case TM_NORM2:
        lo = 0.5, hi = 1.5;
        break;
      case TM_POS:
        lo = -0.5, hi = 0.5;
        break;
      case TM_WQ:
      case TM_WK:
      case TM_WV:
      case TM_WOUT:
        hi = 1.7 / sqrt((double)c->dim), lo = -hi;
        break;
      case TM_WO:
        hi = 1.7 / sqrt((double)c->n_heads * c->head_dim), lo = -hi;
        break;
      default:
        break;
    }
    tu_fill_f32(r, P + t.offset, t.count, lo, hi);
  }
}

static void gradcheck(const gc_cfg *g, tu_rng *r) {
  const tm_config *c = &g->c;
  const int N = c->batch * c->seq_len;
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  tm_model *m = NULL;
  char err[256];
  if (tm_create(&m, c, ctx, 1, err, sizeof err) != TG_OK) TU_FAIL("tm_create: %s", err);
  randomize(m, r);
  uint32_t *ids = tu_alloc(sizeof(uint32_t) * N), *tgt = tu_alloc(sizeof(uint32_t) * N);
  for (int t = 0; t < N; t++) {
    ids[t] = (uint32_t)tu_int(r, 0, c->vocab - 1);
    tgt[t] =
        (g->pads && t % g->pads == 1) ? TM_PAD_ID : (uint32_t)tu_int(r, 0, c->vocab - 1);
  }

  /* reference: central differences of the f64 loss at h and 2h */
  const int64_t np = tm_n_params(m);
  ref R = {.c = *c, .ids = ids, .tgt = tgt};
  for (int ti = 0; ti < TM_NTENSORS; ti++) R.t[ti] = tm_get_tensor(m, (tm_tensor_id)ti);
  const int64_t NC = (int64_t)N * c->dim, NH = (int64_t)N * c->n_heads * c->head_dim;
  const int64_t NK = (int64_t)N * c->n_kv_heads * c->head_dim;
  R.h0 = tu_alloc(8 * NC), R.n1 = tu_alloc(8 * NC), R.h1 = tu_alloc(8 * NC);
  R.n2 = tu_alloc(8 * NC), R.q = tu_alloc(8 * NH), R.o = tu_alloc(8 * NH);
  R.k = tu_alloc(8 * NK), R.v = tu_alloc(8 * NK);
  R.s = tu_alloc(8 * (size_t)(c->seq_len > c->vocab ? c->seq_len : c->vocab));
  double *P = tu_alloc(8 * np), *fd = tu_alloc(8 * np), *fd2 = tu_alloc(8 * np);
  for (int64_t i = 0; i < np; i++) P[i] = tm_params(m)[i];
  const double loss64 = ref_loss(&R, P);
  for (int64_t i = 0; i < np; i++) {
    const double p0 = P[i], h = FD_H * fmax(1, fabs(p0));
    double f[4];
    const double steps[4] = {h, -h, 2 * h, -2 * h};
    for (int s = 0; s < 4; s++) {
      P[i] = p0 + steps[s];
      f[s] = ref_loss(&R, P);
    }
    P[i] = p0;
    fd[i] = (f[0] - f[1]) / (2 * h);
    fd2[i] = (f[2] - f[3]) / (4 * h);
  }

  int failures = 0;
  double worst_self = 0;
  for (int ti = 0; ti < TM_NTENSORS; ti++) { /* is the reference accurate? */
    const tm_tensor t = tm_get_tensor(m, (tm_tensor_id)ti);
    if (!t.count) continue;
    double *d = tu_alloc(8 * t.count);
    for (int64_t i = 0; i < t.count; i++) d[i] = fd[t.offset + i] - fd2[t.offset + i];
    const double self = norm2(d, t.count) / norm2(fd + t.offset, t.count);
    free(d);
    worst_self = fmax(worst_self, self);
    if (!(self <= FD_SELF_TOL)) {
      printf("  %s: finite differences at h and 2h differ by %.3g (> %g)\n", t.name, self,
             FD_SELF_TOL);
      failures++;
    }
  }

  printf(
      "  %s: %lld parameters, f64 loss %.6f; finite differences at h and 2h agree to "
      "%.2g (relative, worst tensor)\n",
      g->name, (long long)np, loss64, worst_self);

  /* tilegrad: the step at 1, 2, 3 threads on every ISA */
  double worst[TM_NTENSORS] = {0}, worst_loss = 0;
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  for (int run = 0; run < nisa * tu_n_thread_counts; run++) {
    const int threads = tu_thread_counts[run % tu_n_thread_counts];
    const tg_isa isa = isas[run / tu_n_thread_counts];
    TU_EXPECT_STATUS(ctx, tg_ctx_set_threads(ctx, threads), TG_OK);
    TU_EXPECT_STATUS(ctx, tg_ctx_set_isa(ctx, isa), TG_OK);
    tm_set_threads(m, threads);
    float loss = NAN;
    TU_EXPECT_STATUS(ctx, tm_forward_backward(m, ids, tgt, &loss), TG_OK);
    const double dl = fabs(loss - loss64);
    worst_loss = fmax(worst_loss, dl);
    if (!(dl <= LOSS_TOL * fmax(1, loss64))) {
      printf("  [%s, %d threads] loss %.7f, f64 %.7f: |diff| %.3g > %.3g\n",
             tg_isa_name(isa), threads, (double)loss, loss64, dl,
             LOSS_TOL * fmax(1, loss64));
      failures++;
    }
    const float *G = tm_grads(m);
    for (int k = 0; k < TM_NTENSORS; k++) {
      const tm_tensor t = tm_get_tensor(m, (tm_tensor_id)k);
      if (!t.count) continue;
      double *d = tu_alloc(8 * t.count);
      for (int64_t i = 0; i < t.count; i++) d[i] = G[t.offset + i] - fd[t.offset + i];
      const double rel = norm2(d, t.count) / norm2(fd + t.offset, t.count);
      free(d);
      worst[k] = fmax(worst[k], rel);
      if (!(rel <= rel_tol(k))) {
        printf("  [%s, %d threads] %s: ||g - g_fd|| / ||g_fd|| = %.3g > %.3g\n",
               tg_isa_name(isa), threads, t.name, rel, rel_tol(k));
        failures++;
      }
    }
  }
  printf(
      "  %s: |loss - f64 loss| <= %.2g; per-tensor relative gradient error (worst of "
      "1/2/3 threads, all ISAs):\n   ",
      g->name, worst_loss);
  for (int k = 0; k < TM_NTENSORS; k++)
    if (tm_get_tensor(m, (tm_tensor_id)k).count)
      printf(" %s %.2g (2^%.1f)", tm_get_tensor(m, (tm_tensor_id)k).name, worst[k],
             log2(worst[k]));
  printf("\n");
  free(R.h0), free(R.n1), free(R.h1), free(R.n2), free(R.q), free(R.o), free(R.k),
      free(R.v);
  free(R.s), free(P), free(fd), free(fd2), free(ids), free(tgt);
  tm_destroy(m);
  tg_ctx_destroy(ctx);
  if (failures) TU_FAIL("%s: %d gradient-check failures", g->name, failures);
}

/* clang-format off */
static const gc_cfg configs[] = {
    /* V, C, H, Hkv, Dh, T, B, tied, eps */
    {"separate output, GQA 4/2, padded targets", {11, 16, 4, 2, 8, 13, 2, 0, 1e-5f}, 5},
    {"tied output, MHA 2/2",                     {9,  16, 2, 2, 8, 10, 2, 1, 1e-5f}, 0},
};
/* clang-format on */

static void test_gradcheck_separate(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 201);
  gradcheck(&configs[0], &r);
}

static void test_gradcheck_tied(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 202);
  gradcheck(&configs[1], &r);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gradcheck_separate),
      cmocka_unit_test(test_gradcheck_tied),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
