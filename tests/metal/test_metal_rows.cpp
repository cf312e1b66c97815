/* Twins of the row kernels: RMSNorm backward (split and fused), softmax
 * backward, embedding backward, cross-entropy. Each runs through the
 * simulator on small shapes (tails: dims not a multiple of the threadgroup,
 * partial simdgroups, threadgroups smaller than a simdgroup) and is compared
 * with the C engine.
 *
 * Tolerances (u = 2^-24, gamma_n = n u / (1 - n u)). The Metal twin and the C
 * engine sum in different orders (simd trees vs 16-lane trees), so a sum of
 * n rounded terms t_i may differ by 2 gamma_{n+c} sum |t_i| (each side is
 * within gamma of the exact sum; c counts the roundings inside a term), and
 * every elementwise operation after it contributes 2u of its operands'
 * magnitudes (one rounding on each side). The bounds below are that
 * analysis written per kernel; elementwise work with identical inputs and
 * operations (embedding with distinct ids) is compared bitwise. */
#include "twin_test.h"

namespace m_rms {
#include "rms_norm.metal.cc"
}
namespace m_softmax {
#include "softmax.metal.cc"
}
namespace m_embedding {
#include "embedding.metal.cc"
}
namespace m_ce {
#include "cross_entropy.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;
using tt::gam;
using tt::U;

/* ---- RMSNorm ------------------------------------------------------------ */
static void test_rms(tg_ctx *ctx, uint32_t rows, uint32_t dim, uint32_t tg) {
  std::printf("rms_norm rows=%u dim=%u tg=%u\n", rows, dim, tg);
  tt::Rng rng(tt::seed() + rows * 7919 + dim);
  const size_t n = (size_t)rows * dim;
  Buf<float> x(n), dy(n), w(dim), r_c(rows), r_m(rows), dx_c(n), dx_m(n), dw_c(dim), dw_m(dim);
  tt::fill_uniform(rng, x, -2, 2);
  tt::fill_uniform(rng, dy, -1, 1);
  tt::fill_uniform(rng, w, -1.5, 1.5);
  const float eps = 1e-5f;
  float params2[2];
  char what[96];

  /* r: sum of dim squares (gamma_{dim+1}), then /dim, +eps, sqrt, 1/x: the
   * relative change of r is half that of the mean square, plus 4 roundings
   * per side. */
  TT_C(ctx, tg_rms_norm_compute_rms_inv_f32(ctx, x.p, r_c.p, rows, dim, eps));
  params2[0] = eps;
  params2[1] = (float)dim;
  {
    mtl_sim::Dispatch d;
    d.grid(rows, 1, 1).tg(tg).buffer(0, x.p).buffer(1, r_m.p).buffer(2, params2).tg_memory(0, tg * 4);
    if (tt::run(d, [] { m_rms::rms_norm_compute_rms_inv_f32(); }, "rms_inv")) {
      snprintf(what, sizeof what, "rms_norm_compute_rms_inv_f32 %ux%u", rows, dim);
      tt::check(what, r_m.p, r_c.p, [&](size_t b) { return r_c[b] * (gam(dim + 1) + 10 * U); }, rows);
    }
  }
  /* dx with the C engine's r as input on both sides. */
  TT_C(ctx, tg_rms_norm_backward_dx_f32(ctx, x.p, w.p, dy.p, r_c.p, dx_c.p, rows, dim));
  params2[0] = (float)dim;
  params2[1] = 0;
  {
    mtl_sim::Dispatch d;
    d.grid(rows, 1, 1).tg(tg).buffer(0, x.p).buffer(1, w.p).buffer(2, dy.p).buffer(3, r_c.p)
        .buffer(4, dx_m.p).buffer(5, params2).tg_memory(0, tg * 4);
    if (tt::run(d, [] { m_rms::rms_norm_backward_dx_f32(); }, "rms_dx")) {
      std::vector<double> bound(n);
      for (uint32_t b = 0; b < rows; b++) {
        double mag = 0, s = 0;
        for (uint32_t i = 0; i < dim; i++) {
          const double t = (double)dy[b * dim + i] * x[b * dim + i] * w[i];
          mag += std::fabs(t), s += t;
        }
        const double rb = r_c[b], ds = 2 * gam(dim + 2) * mag;
        const double coeff = s * rb * rb / dim, dcoeff = rb * rb / dim * ds + 6 * U * std::fabs(coeff);
        for (uint32_t k = 0; k < dim; k++) {
          const double xk = x[b * dim + k], t1 = std::fabs((double)dy[b * dim + k] * w[k]);
          bound[b * dim + k] = 1.01 * (rb * std::fabs(xk) * dcoeff +
                                       6 * U * rb * (t1 + std::fabs(xk * coeff))) + 1e-37;
        }
      }
      snprintf(what, sizeof what, "rms_norm_backward_dx_f32 %ux%u", rows, dim);
      tt::check(what, dx_m.p, dx_c.p, [&](size_t i) { return bound[i]; }, n);
    }
  }
  /* dw: a sum over rows of dy*x*r (2 roundings per term). */
  TT_C(ctx, tg_rms_norm_backward_dw_f32(ctx, x.p, dy.p, r_c.p, dw_c.p, rows, dim));
  params2[0] = (float)dim;
  params2[1] = (float)rows;
  {
    mtl_sim::Dispatch d;
    d.grid(dim, 1, 1).tg(tg).buffer(0, x.p).buffer(1, dy.p).buffer(2, r_c.p).buffer(3, dw_m.p)
        .buffer(4, params2).tg_memory(0, tg * 4);
    if (tt::run(d, [] { m_rms::rms_norm_backward_dw_f32(); }, "rms_dw")) {
      std::vector<double> bound(dim, 0);
      for (uint32_t b = 0; b < rows; b++)
        for (uint32_t i = 0; i < dim; i++)
          bound[i] += std::fabs((double)dy[b * dim + i] * x[b * dim + i] * r_c[b]);
      for (auto &v : bound) v = 2 * gam(rows + 2) * v + 1e-37;
      snprintf(what, sizeof what, "rms_norm_backward_dw_f32 %ux%u", rows, dim);
      tt::check(what, dw_m.p, dw_c.p, [&](size_t i) { return bound[i]; }, dim);
    }
  }
  /* fused: r computed inside (relative error e_r each side), grad_weight
   * accumulates onto a non-zero start with atomics in any order. */
  Buf<float> gi_c(n), gi_m(n), gw_c(dim), gw_m(dim);
  tt::fill_uniform(rng, gw_c, -0.5, 0.5);
  gw_m.copy_from(gw_c);
  std::vector<float> gw0(gw_c.p, gw_c.p + dim);
  TT_C(ctx, tg_rms_norm_backward(ctx, x.p, w.p, dy.p, gi_c.p, gw_c.p, rows, dim, eps));
  uint32_t pf[3] = {rows, dim, 0};
  std::memcpy(&pf[2], &eps, 4);
  {
    mtl_sim::Dispatch d;
    d.grid(rows, 1, 1).tg(tg).buffer(0, x.p).buffer(1, w.p).buffer(2, dy.p).buffer(3, gi_m.p)
        .buffer(4, gw_m.p).buffer(5, pf);
    if (tt::run(d, [] { m_rms::rms_norm_backward(); }, "rms_fused")) {
      const double er = 2 * (gam(dim + 1) + 10 * U); /* |dr|/r, both sides */
      std::vector<double> bi(n), bw(dim, 0);
      for (uint32_t b = 0; b < rows; b++) {
        double mag = 0, s = 0, ss = 0;
        for (uint32_t i = 0; i < dim; i++) {
          const double t = (double)dy[b * dim + i] * x[b * dim + i] * w[i];
          mag += std::fabs(t), s += t, ss += (double)x[b * dim + i] * x[b * dim + i];
        }
        const double rb = 1 / std::sqrt(ss / dim + eps), ds = 2 * gam(dim + 2) * mag;
        const double coeff = s * rb * rb / dim;
        const double dcoeff = rb * rb / dim * ds + 6 * U * std::fabs(coeff) + 2 * er * std::fabs(coeff);
        for (uint32_t k = 0; k < dim; k++) {
          const double xk = x[b * dim + k], t1 = std::fabs((double)dy[b * dim + k] * w[k]);
          bi[b * dim + k] = 1.01 * (rb * std::fabs(xk) * dcoeff + er * rb * (t1 + std::fabs(xk * coeff)) +
                                    6 * U * rb * (t1 + std::fabs(xk * coeff))) + 1e-37;
          bw[k] += std::fabs(xk * rb * dy[b * dim + k]) * (1 + er);
        }
      }
      for (uint32_t i = 0; i < dim; i++)
        bw[i] = 2 * gam(rows + 3) * (std::fabs(gw0[i]) + bw[i]) + er * bw[i] + 1e-37;
      snprintf(what, sizeof what, "rms_norm_backward grad_input %ux%u", rows, dim);
      tt::check(what, gi_m.p, gi_c.p, [&](size_t i) { return bi[i]; }, n);
      snprintf(what, sizeof what, "rms_norm_backward grad_weight %ux%u", rows, dim);
      tt::check(what, gw_m.p, gw_c.p, [&](size_t i) { return bw[i]; }, dim);
    }
  }
}

/* ---- softmax backward ---------------------------------------------------- */
static void test_softmax(tg_ctx *ctx, uint32_t rows, uint32_t len, uint32_t tg) {
  std::printf("softmax_backward rows=%u len=%u tg=%u\n", rows, len, tg);
  tt::Rng rng(tt::seed() + rows * 31 + len);
  const size_t n = (size_t)rows * len;
  Buf<float> sm(n), go(n), gi_c(n), gi_m(n);
  for (uint32_t b = 0; b < rows; b++) { /* real softmax rows */
    double z = 0;
    std::vector<double> e(len);
    for (uint32_t j = 0; j < len; j++) z += e[j] = std::exp(rng.uni(-4, 4));
    for (uint32_t j = 0; j < len; j++) sm[b * len + j] = (float)(e[j] / z);
  }
  tt::fill_uniform(rng, go, -1, 1);
  TT_C(ctx, tg_softmax_backward(ctx, sm.p, go.p, gi_c.p, rows, len));
  uint32_t params[2] = {rows, len};
  mtl_sim::Dispatch d;
  d.grid(rows, 1, 1).tg(tg).buffer(0, sm.p).buffer(1, go.p).buffer(2, gi_m.p).buffer(3, params);
  if (!tt::run(d, [] { m_softmax::softmax_backward(); }, "softmax_backward")) return;
  std::vector<double> bound(n);
  for (uint32_t b = 0; b < rows; b++) {
    double mag = 0, dot = 0;
    for (uint32_t j = 0; j < len; j++) {
      const double t = (double)sm[b * len + j] * go[b * len + j];
      mag += std::fabs(t), dot += t;
    }
    const double ddot = 2 * gam(len + 1) * mag;
    for (uint32_t j = 0; j < len; j++) {
      const double s = sm[b * len + j];
      bound[b * len + j] = 1.01 * std::fabs(s) * (ddot + 4 * U * (std::fabs((double)go[b * len + j]) + std::fabs(dot))) + 1e-37;
    }
  }
  char what[64];
  snprintf(what, sizeof what, "softmax_backward %ux%u", rows, len);
  tt::check(what, gi_m.p, gi_c.p, [&](size_t i) { return bound[i]; }, n);
}

/* ---- embedding backward --------------------------------------------------- */
static void test_embedding(tg_ctx *ctx, uint32_t vocab, uint32_t seq, uint32_t dim, bool repeat) {
  std::printf("embedding_backward vocab=%u seq=%u dim=%u %s\n", vocab, seq, dim,
              repeat ? "repeated ids" : "distinct ids");
  tt::Rng rng(tt::seed() + vocab + seq * 17 + dim * 131 + repeat);
  Buf<float> go((size_t)seq * dim), gw_c((size_t)vocab * dim), gw_m((size_t)vocab * dim);
  Buf<uint32_t> ids(seq);
  tt::fill_uniform(rng, go, -1, 1);
  tt::fill_uniform(rng, gw_c, -1, 1);
  gw_m.copy_from(gw_c);
  std::vector<float> gw0(gw_c.p, gw_c.p + gw_c.n);
  std::vector<uint32_t> perm(vocab);
  for (uint32_t i = 0; i < vocab; i++) perm[i] = i;
  for (uint32_t i = vocab - 1; i > 0; i--) std::swap(perm[i], perm[rng.next() % (i + 1)]);
  for (uint32_t t = 0; t < seq; t++) ids[t] = repeat ? (uint32_t)(rng.next() % 4) : perm[t];
  TT_C(ctx, tg_embedding_backward(ctx, go.p, ids.p, gw_c.p, vocab, seq, dim));
  uint32_t params[3] = {vocab, seq, dim};
  mtl_sim::Dispatch d;
  d.grid((dim + 63) / 64, seq, 1).tg(64).buffer(0, go.p).buffer(1, ids.p).buffer(2, gw_m.p).buffer(3, params);
  if (!tt::run(d, [] { m_embedding::embedding_backward(); }, "embedding_backward")) return;
  char what[96];
  snprintf(what, sizeof what, "embedding_backward %u tokens, dim %u", seq, dim);
  if (!repeat) { /* one add per element, the same add on both sides */
    tt::check_bitwise(what, gw_m.p, gw_c.p, gw_c.n * 4);
    return;
  }
  /* k adds onto w0 in any order: 2 gamma_k (|w0| + sum |g|) */
  std::vector<double> mag(gw_c.n);
  std::vector<int> cnt(vocab, 0);
  for (size_t i = 0; i < gw_c.n; i++) mag[i] = std::fabs((double)gw0[i]);
  for (uint32_t t = 0; t < seq; t++) {
    cnt[ids[t]]++;
    for (uint32_t c = 0; c < dim; c++) mag[(size_t)ids[t] * dim + c] += std::fabs((double)go[(size_t)t * dim + c]);
  }
  tt::check(what, gw_m.p, gw_c.p, [&](size_t i) { return 2 * gam(cnt[i / dim] + 1) * mag[i] + 1e-37; }, gw_c.n);
}

/* An id >= vocab: the C engine refuses the call; the twin skips that token. */
static void test_embedding_bad_id(tg_ctx *ctx) {
  std::printf("embedding_backward with an out-of-range id\n");
  const uint32_t vocab = 9, seq = 5, dim = 40;
  tt::Rng rng(tt::seed() + 99);
  Buf<float> go((size_t)seq * dim), gw_c((size_t)vocab * dim), gw_m((size_t)vocab * dim);
  Buf<uint32_t> ids(seq), ids_ok(seq - 1);
  Buf<float> go_ok((size_t)(seq - 1) * dim);
  tt::fill_uniform(rng, go, -1, 1);
  gw_c.fill(0);
  gw_m.fill(0);
  const uint32_t v[5] = {3, 7, vocab, 0, 8};
  for (uint32_t t = 0, k = 0; t < seq; t++) {
    ids[t] = v[t];
    if (v[t] < vocab) {
      ids_ok[k] = v[t];
      std::memcpy(go_ok.p + (size_t)k * dim, go.p + (size_t)t * dim, dim * 4);
      k++;
    }
  }
  if (tg_embedding_backward(ctx, go.p, ids.p, gw_c.p, vocab, seq, dim) != TG_ERR_BAD_INDEX)
    tt::fail("C engine accepted an out-of-range id");
  TT_C(ctx, tg_embedding_backward(ctx, go_ok.p, ids_ok.p, gw_c.p, vocab, seq - 1, dim));
  uint32_t params[3] = {vocab, seq, dim};
  mtl_sim::Dispatch d;
  d.grid(1, seq, 1).tg(64).buffer(0, go.p).buffer(1, ids.p).buffer(2, gw_m.p).buffer(3, params);
  if (tt::run(d, [] { m_embedding::embedding_backward(); }, "embedding_backward"))
    tt::check_bitwise("embedding_backward skips the bad token", gw_m.p, gw_c.p, gw_c.n * 4);
}

/* ---- cross-entropy ------------------------------------------------------- */
static void test_ce(tg_ctx *ctx, uint32_t n_pos, uint32_t vocab, uint32_t tg, bool special) {
  std::printf("cross_entropy_fwd_bwd n_pos=%u vocab=%u tg=%u%s\n", n_pos, vocab, tg,
              special ? " (pads, -inf, +-1e30, all -inf row)" : "");
  tt::Rng rng(tt::seed() + n_pos * 3 + vocab * 1009 + special);
  const size_t n = (size_t)n_pos * vocab;
  Buf<float> logits(n), g_c(n), g_m(n), loss_c(1), loss_m(1);
  Buf<uint32_t> tgt(n_pos);
  tt::fill_uniform(rng, logits, -6, 6);
  const uint32_t pad = vocab + 5;
  uint32_t count = 0;
  for (uint32_t t = 0; t < n_pos; t++) {
    tgt[t] = (uint32_t)(rng.next() % vocab);
    if (special && t % 4 == 1) tgt[t] = pad;
    count += tgt[t] != pad;
  }
  if (special) {
    for (uint32_t j = 0; j < vocab; j++) logits[0 * vocab + j] = j % 3 ? -INFINITY : logits[j];
    logits[2 * vocab + 1] = 1e30f, logits[2 * vocab + 2] = -1e30f;
    for (uint32_t j = 0; j < vocab; j++) logits[3 * vocab + j] = -INFINITY; /* all -inf */
    if (tgt[0] % 3) tgt[0] = 0;                                            /* finite target */
    if (tgt[3] == pad) tgt[3] = 1, count++;
  }
  loss_c[0] = loss_m[0] = 0.25f;
  TT_C(ctx, tg_cross_entropy_fwd_bwd(ctx, logits.p, tgt.p, g_c.p, loss_c.p, n_pos, vocab, pad, count));
  uint32_t params[4] = {n_pos, vocab, pad, count};
  mtl_sim::Dispatch d;
  d.grid(n_pos, 1, 1).tg(tg).buffer(0, logits.p).buffer(1, tgt.p).buffer(2, g_m.p).buffer(3, loss_m.p).buffer(4, params);
  if (!tt::run(d, [] { m_ce::cross_entropy_fwd_bwd(); }, "cross_entropy_fwd_bwd")) return;
  /* softmax in double: p_j. e_j = exp(l_j - m) differs by <= 2u per side
   * (glibc expf vs the engine's vector exp, both within 1 ulp), S by
   * 2 gamma_V relative: |dp| <= p (2 gamma_V + 10u); then (p - onehot)/count
   * rounds twice per side. loss_t: |d log S| <= 2 gamma_V + 8u, plus 4u of
   * |log S| + |l_y - m|; the GPU adds loss_t/count atomically in f32 in any
   * order (gamma_{n_pos+1} of the sum of |terms|). */
  std::vector<double> gb(n, 0);
  double loss_bound = 0, loss_mag = std::fabs(0.25);
  for (uint32_t t = 0; t < n_pos; t++) {
    if (tgt[t] == pad) continue;
    const float *l = logits.p + (size_t)t * vocab;
    double m = -INFINITY;
    for (uint32_t j = 0; j < vocab; j++) m = std::max(m, (double)l[j]);
    if (m == -INFINITY) continue; /* equal-logits limit: exact on both sides */
    double S = 0;
    for (uint32_t j = 0; j < vocab; j++) S += std::exp((double)l[j] - m);
    for (uint32_t j = 0; j < vocab; j++) {
      const double p = std::exp((double)l[j] - m) / S, oh = j == tgt[t];
      gb[(size_t)t * vocab + j] = 1.01 * (p * (2 * gam(vocab) + 10 * U) + 4 * U * (p + oh)) / count + 1e-37;
    }
    const double lt = std::log(S) - ((double)l[tgt[t]] - m);
    loss_bound += (2 * gam(vocab) + 8 * U + 4 * U * (std::fabs(std::log(S)) + std::fabs((double)l[tgt[t]] - m))) / count;
    loss_mag += std::fabs(lt) / count;
  }
  loss_bound += 2 * gam(n_pos + 2) * loss_mag;
  char what[96];
  snprintf(what, sizeof what, "cross_entropy grad %ux%u", n_pos, vocab);
  tt::check(what, g_m.p, g_c.p, [&](size_t i) { return gb[i]; }, n);
  snprintf(what, sizeof what, "cross_entropy loss %ux%u", n_pos, vocab);
  tt::check(what, loss_m.p, loss_c.p, [&](size_t) { return loss_bound; }, 1);
}

/* count == 0 writes nothing; a bad target poisons only its row and the loss. */
static void test_ce_edges() {
  std::printf("cross_entropy_fwd_bwd edge cases\n");
  const uint32_t n_pos = 3, vocab = 20;
  Buf<float> logits(n_pos * vocab), g(n_pos * vocab), loss(1);
  Buf<uint32_t> tgt(n_pos);
  for (size_t i = 0; i < logits.n; i++) logits[i] = (float)(i % 7);
  tgt[0] = 2, tgt[1] = vocab + 3, tgt[2] = 4;
  g.fill(7.0f);
  loss[0] = 1.0f;
  uint32_t params[4] = {n_pos, vocab, 99, 0};
  mtl_sim::Dispatch d;
  d.grid(n_pos, 1, 1).tg(32).buffer(0, logits.p).buffer(1, tgt.p).buffer(2, g.p).buffer(3, loss.p).buffer(4, params);
  if (!tt::run(d, [] { m_ce::cross_entropy_fwd_bwd(); }, "ce count=0")) return;
  bool untouched = loss[0] == 1.0f;
  for (size_t i = 0; i < g.n; i++) untouched &= g[i] == 7.0f;
  tt::expect(untouched, "count == 0 must write nothing");
  params[3] = 2;
  if (!tt::run(d, [] { m_ce::cross_entropy_fwd_bwd(); }, "ce bad target")) return;
  bool ok = std::isnan(loss[0]);
  for (uint32_t j = 0; j < vocab; j++) ok &= std::isnan(g[vocab + j]) && !std::isnan(g[j]) && !std::isnan(g[2 * vocab + j]);
  tt::expect(ok, "a target >= vocab must give a NaN row and a NaN loss, other rows finite");
  if (untouched && ok) std::printf("  ok count == 0 untouched; bad target -> NaN row and loss\n");
}

int main() {
  tt::Ctx ctx;
  test_rms(ctx, 5, 300, 128);
  test_rms(ctx, 3, 37, 16);
  test_rms(ctx, 40, 64, 64);
  test_softmax(ctx, 4, 1000, 256);
  test_softmax(ctx, 3, 5, 32);
  test_softmax(ctx, 2, 77, 48);
  test_embedding(ctx, 50, 30, 100, false);
  test_embedding(ctx, 8, 40, 70, true);
  test_embedding_bad_id(ctx);
  test_ce(ctx, 6, 300, 128, false);
  test_ce(ctx, 8, 33, 64, true);
  test_ce(ctx, 3, 5, 16, false);
  test_ce(ctx, 5, 7, 16, true); /* all -inf row in a sub-simdgroup threadgroup */
  test_ce_edges();
  return tt::finish("metal_rows");
}
