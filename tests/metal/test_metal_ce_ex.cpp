/* Twin of tg_cross_entropy_fwd_bwd_ex: metal/cross_entropy.metal's
 * cross_entropy_fwd_bwd_ex_{f32,bf16} through the simulator against the C
 * engine, on strided rows with ignored rows, label smoothing, a grad scale
 * and a non-integer count, threadgroups smaller and larger than a
 * simdgroup, and the edge rows (-inf, +-1e30, all -inf).
 *
 * Tolerances (u = 2^-24, gamma_n = n u / (1 - n u)), as the seed's twin
 * (test_metal_rows.cpp) derives them: p_j differs by p (2 gamma_V + 10u)
 * (the sums in other orders, expf vs the engine's exp), then
 * (p - (1 - eps)[j == y]) b - eps/V b rounds three times per side: 6u of
 * (p + 1) b + eps/V b. loss_t: 2 gamma_V + 8u, plus 4u of |log S| + |z_y - m|;
 * with smoothing also eps (2 gamma_V sum_j |z_j| / V + 4u (|mean| + |m|));
 * the GPU's atomic f32 adds of loss_t / count: gamma_{n_pos + 2} of the sum
 * of |terms|. bf16 grads: the two f32 values within that bound may round to
 * neighbouring bf16 values: plus 2^-8 of |grad|. */
#include "twin_test.h"

namespace m_ce {
#include "cross_entropy.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;
using tt::gam;
using tt::U;

static void test_ce_ex(tg_ctx *ctx, uint32_t n_pos, uint32_t vocab, uint32_t pad, uint32_t tg,
                       float eps, float scale, bool bf16, bool special) {
  std::printf("cross_entropy_fwd_bwd_ex %s n_pos=%u vocab=%u stride=+%u tg=%u eps=%g scale=%g%s\n",
              bf16 ? "bf16" : "f32", n_pos, vocab, pad, tg, (double)eps, (double)scale,
              special ? " (-inf, +-1e30, all -inf row)" : "");
  tt::Rng rng(tt::seed() + n_pos * 7 + vocab * 31 + pad + (bf16 ? 1 : 0) + (special ? 2 : 0));
  const uint64_t ld = vocab + pad;
  const size_t n = (size_t)(n_pos - 1) * ld + vocab;
  Buf<float> logits(n), g_c(n), g_m(n), loss_c(1), loss_m(1);
  Buf<uint16_t> l16(n), g16_c(n), g16_m(n);
  Buf<int64_t> tgt(n_pos);
  tt::fill_uniform(rng, logits, -6, 6);
  uint32_t kept = 0;
  for (uint32_t t = 0; t < n_pos; t++) {
    tgt[t] = (int64_t)(rng.next() % vocab);
    if (t % 4 == 1) tgt[t] = -100;
    kept += tgt[t] != -100;
  }
  if (special) {
    for (uint32_t j = 0; j < vocab; j++) logits[j] = j % 3 ? -INFINITY : logits[j];
    if (tgt[0] % 3) tgt[0] = 0; /* a finite target */
    logits[2 * ld + 1] = 1e30f, logits[2 * ld + 2] = -1e30f;
    for (uint32_t j = 0; j < vocab; j++) logits[3 * ld + j] = -INFINITY; /* all -inf */
    if (tgt[3] == -100) tgt[3] = 1;
  }
  if (bf16) /* bf16 inputs: both sides see the same rounded logits */
    for (size_t i = 0; i < n; i++) l16[i] = tt::f2bf(logits[i]), logits[i] = tt::bf2f(l16[i]);
  const double count = kept + 0.5;
  const tg_ce_options opt = {-100, eps, scale, 0, 0};
  loss_c[0] = loss_m[0] = 0.25f;
  g_c.fill(7.0f), g_m.fill(7.0f);
  for (size_t i = 0; i < n; i++) g16_c[i] = g16_m[i] = 0x40E0; /* 7.0 */
  TT_C(ctx, tg_cross_entropy_fwd_bwd_ex(ctx, bf16 ? TG_DTYPE_BF16 : TG_DTYPE_F32,
                                        bf16 ? (const void *)l16.p : logits.p, tgt.p,
                                        bf16 ? (void *)g16_c.p : g_c.p, loss_c.p, n_pos, vocab,
                                        ld, count, &opt));
  m_ce::ce_ex_params params = {n_pos, vocab, ld, (float)count, eps, scale, 0, -100};
  mtl_sim::Dispatch d;
  d.grid(n_pos, 1, 1).tg(tg).buffer(1, tgt.p).buffer(3, loss_m.p).buffer(4, &params);
  if (bf16) {
    d.buffer(0, l16.p).buffer(2, g16_m.p);
    if (!tt::run(d, [] { m_ce::cross_entropy_fwd_bwd_ex_bf16(); }, "ce_ex_bf16")) return;
    for (size_t i = 0; i < n; i++) g_c[i] = tt::bf2f(g16_c[i]), g_m[i] = tt::bf2f(g16_m[i]);
  } else {
    d.buffer(0, logits.p).buffer(2, g_m.p);
    if (!tt::run(d, [] { m_ce::cross_entropy_fwd_bwd_ex_f32(); }, "ce_ex_f32")) return;
  }
  const double b = scale / count, shift = eps / vocab * std::fabs(b);
  std::vector<double> gb(n, 0);
  double loss_bound = 0, loss_mag = 0.25;
  for (uint32_t t = 0; t < n_pos; t++) {
    const size_t o = (size_t)t * ld;
    if (t + 1 < n_pos)
      for (uint64_t j = vocab; j < ld; j++) gb[o + j] = 0; /* gaps: 7 on both sides */
    if (tgt[t] == -100) continue;                        /* zeros on both sides */
    const float *l = logits.p + o;
    double m = -INFINITY, zabs = 0, zs = 0;
    for (uint32_t j = 0; j < vocab; j++) m = std::max(m, (double)l[j]);
    if (m == -INFINITY) { /* equal-logits limit: the same formula, b rounded differently */
      for (uint32_t j = 0; j < vocab; j++) {
        const double v = (1.0 / vocab - (j == tgt[t] ? 1 - eps : 0.0)) * b - eps / vocab * b;
        gb[o + j] = 6 * U * (std::fabs(v) + shift) + (bf16 ? 0x1p-8 * std::fabs(v) : 0) + 1e-37;
      }
      continue;
    }
    double S = 0;
    for (uint32_t j = 0; j < vocab; j++) {
      S += std::exp((double)l[j] - m);
      zabs += std::fabs((double)l[j]), zs += l[j];
    }
    for (uint32_t j = 0; j < vocab; j++) {
      const double p = std::exp((double)l[j] - m) / S, oh = j == tgt[t] ? 1.0 : 0.0;
      double e = 1.01 * ((p * (2 * gam(vocab) + 10 * U) + 6 * U * (p + oh)) * std::fabs(b) +
                         6 * U * shift) + 1e-37;
      if (bf16) e += 0x1p-8 * (std::fabs((p - (1 - eps) * oh) * b - eps / vocab * b) + e);
      gb[o + j] = e;
    }
    const double logS = std::log(S), zy = (double)l[tgt[t]] - m;
    const double lt = (1 - eps) * (logS - zy) + eps * (logS - (zs / vocab - m));
    loss_bound += (2 * gam(vocab) + 8 * U + 4 * U * (std::fabs(logS) + std::fabs(zy)) +
                   eps * (2 * gam(vocab) * zabs / vocab + 4 * U * (std::fabs(zs / vocab) +
                                                                     std::fabs(m)))) / count;
    loss_mag += std::fabs(lt) / count;
  }
  loss_bound += 2 * gam(n_pos + 2) * loss_mag;
  char what[96];
  snprintf(what, sizeof what, "ce_ex grad %ux%u %s", n_pos, vocab, bf16 ? "bf16" : "f32");
  tt::check(what, g_m.p, g_c.p, [&](size_t i) { return gb[i]; }, n);
  snprintf(what, sizeof what, "ce_ex loss %ux%u %s", n_pos, vocab, bf16 ? "bf16" : "f32");
  tt::check(what, loss_m.p, loss_c.p, [&](size_t) { return loss_bound; }, 1);
}

int main() {
  tt::Ctx ctx;
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    test_ce_ex(ctx, 6, 300, 5, 128, 0.0f, 1.0f, bf16, false);
    test_ce_ex(ctx, 8, 33, 0, 64, 0.1f, 0.5f, bf16, true);
    test_ce_ex(ctx, 3, 5, 3, 16, 0.3f, -2.0f, bf16, false);
    test_ce_ex(ctx, 5, 7, 1, 16, 0.0f, 1.0f, bf16, true); /* all -inf row, sub-simdgroup tg */
    test_ce_ex(ctx, 4, 2100, 11, 256, 0.2f, 1.0f, bf16, false);
  }
  return tt::finish("metal_ce_ex");
}
