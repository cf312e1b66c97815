/* Twins of causal_attention_backward (metal/causal_attention.metal) and the
 * decode reduces flash_attn_vec_reduce_dk256/_dk512 and
 * flash_attn_vec_reduce_tq_hb_undo_dk256/_dk512 (metal/flash_attn_vec_reduce.metal).
 *
 * causal: GQA, head dims below / above a simdgroup, sequences longer than the
 * 256-key chunk (the seed's 2048 cap is gone: the chunked passes are what is
 * exercised), grad_K/grad_V accumulating onto non-zero values. Bound: a
 * running error bound in double (u = 2^-24): each score within
 * gamma_D scale sum|q k| + 2u|s| per side; P = exp(s - m)/Z then differs by
 * P (2 es + 2 sum_k P_k es_k + 2 gamma_{n+1} + 8u (1 + |s - m|)); dP by
 * 2 gamma_D sum|dO v|; delta and dS by their propagation plus 4u per
 * operation; the gradients add 2 gamma_n of the absolute sum of their terms.
 *
 * decode: nwg = 1, 5, 32 and 40 (> 32 lanes: lanes stride), empty workgroups
 * (M = -inf, partials NaN: must not leak), a row of only empty workgroups
 * (zeros). The weights a_w = expf(M_w - Mg) are the same f32 operations on
 * both sides, so only the sums' order differs: 2 gamma_{nwg+1} relative to
 * the absolute sums, / St. The fused kernel's Walsh-Hadamard stage performs
 * the C engine's butterflies exactly, so fused(htmp) must equal, bit for bit,
 * the C engine's tg_fwht_sign_undo_f32 applied to the Metal plain reduce. */
#include "twin_test.h"

namespace m_causal {
#include "causal_attention.metal.cc"
}
namespace m_dec {
#include "flash_attn_vec_reduce.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;
using tt::gam;
using tt::U;

static void test_causal(tg_ctx *ctx, uint32_t seq, uint32_t nh, uint32_t nkv, uint32_t D, uint32_t tg) {
  std::printf("causal_attention_backward seq=%u heads=%u kv_heads=%u D=%u tg=%u\n", seq, nh, nkv, D, tg);
  tt::Rng rng(tt::seed() + seq * 101 + nh * 11 + D);
  const size_t nq = (size_t)seq * nh * D, nk = (size_t)seq * nkv * D;
  Buf<float> go(nq), Q(nq), K(nk), V(nk), gQ_c(nq), gQ_m(nq), gK_c(nk), gK_m(nk), gV_c(nk), gV_m(nk);
  tt::fill_uniform(rng, go, -1, 1);
  tt::fill_uniform(rng, Q, -2, 2);
  tt::fill_uniform(rng, K, -2, 2);
  tt::fill_uniform(rng, V, -1, 1);
  tt::fill_uniform(rng, gK_c, -0.5, 0.5);
  tt::fill_uniform(rng, gV_c, -0.5, 0.5);
  gK_m.copy_from(gK_c);
  gV_m.copy_from(gV_c);
  std::vector<float> gK0(gK_c.p, gK_c.p + nk), gV0(gV_c.p, gV_c.p + nk);
  TT_C(ctx, tg_causal_attention_backward(ctx, go.p, Q.p, K.p, V.p, gQ_c.p, gK_c.p, gV_c.p, seq, nh, nkv, D));
  uint32_t params[4] = {seq, nh, nkv, D};
  mtl_sim::Dispatch d;
  d.grid(seq, nh, 1).tg(tg).buffer(0, go.p).buffer(1, Q.p).buffer(2, K.p).buffer(3, V.p)
      .buffer(4, gQ_m.p).buffer(5, gK_m.p).buffer(6, gV_m.p).buffer(7, params);
  if (!tt::run(d, [] { m_causal::causal_attention_backward(); }, "causal_attention_backward")) return;

  const double scale = 1.0 / std::sqrt((double)D);
  const size_t ldq = (size_t)nh * D, ldk = (size_t)nkv * D;
  std::vector<double> bq(nq, 0), mq(nq, 0), bk(nk, 0), mk(nk, 0), bv(nk, 0), mv(nk, 0);
  std::vector<double> s(seq), es(seq), dp(seq), edp(seq), P(seq), eP(seq);
  for (uint32_t i = 0; i < seq; i++)
    for (uint32_t h = 0; h < nh; h++) {
      const uint32_t g = h / (nh / nkv), n = i + 1;
      const float *q = Q.p + i * ldq + h * D, *o = go.p + i * ldq + h * D;
      double m = -INFINITY;
      for (uint32_t j = 0; j < n; j++) {
        double qk = 0, a = 0, v = 0, av = 0;
        for (uint32_t c = 0; c < D; c++) {
          const double t = (double)q[c] * K[j * ldk + g * D + c], w = (double)o[c] * V[j * ldk + g * D + c];
          qk += t, a += std::fabs(t), v += w, av += std::fabs(w);
        }
        s[j] = scale * qk, es[j] = gam(D) * scale * a + 4 * U * std::fabs(s[j]);
        dp[j] = v, edp[j] = 2 * gam(D) * av;
        m = std::max(m, s[j]);
      }
      double Z = 0, esZ = 0;
      for (uint32_t j = 0; j < n; j++) Z += std::exp(s[j] - m);
      for (uint32_t j = 0; j < n; j++) esZ += std::exp(s[j] - m) / Z * 2 * es[j];
      double delta = 0, edelta = 0, mdelta = 0;
      for (uint32_t j = 0; j < n; j++) {
        P[j] = std::exp(s[j] - m) / Z;
        eP[j] = P[j] * (2 * es[j] + esZ + 2 * gam(n + 1) + 8 * U * (1 + std::fabs(s[j] - m)));
        delta += P[j] * dp[j], mdelta += std::fabs(P[j] * dp[j]);
        edelta += eP[j] * std::fabs(dp[j]) + P[j] * edp[j];
      }
      edelta += 2 * gam(n + 2) * mdelta;
      for (uint32_t j = 0; j < n; j++) {
        const double dS = P[j] * (dp[j] - delta);
        const double edS = eP[j] * std::fabs(dp[j] - delta) + P[j] * (edp[j] + edelta) +
                           4 * U * P[j] * (std::fabs(dp[j]) + std::fabs(delta));
        for (uint32_t c = 0; c < D; c++) {
          const double kv = K[j * ldk + g * D + c];
          const size_t qe = i * ldq + h * D + c, ke = j * ldk + g * D + c;
          bq[qe] += scale * edS * std::fabs(kv), mq[qe] += scale * std::fabs(dS * kv);
          bk[ke] += scale * edS * std::fabs(q[c]), mk[ke] += scale * std::fabs(dS * q[c]);
          bv[ke] += eP[j] * std::fabs(o[c]), mv[ke] += std::fabs(P[j] * o[c]);
        }
      }
    }
  const double nterm = (double)seq * (nh / nkv) + 2;
  tt::check("causal grad_Q", gQ_m.p, gQ_c.p, [&](size_t e) {
    return 1.01 * (bq[e] + 2 * gam(seq + 4) * mq[e]) + 1e-30; }, nq);
  tt::check("causal grad_K", gK_m.p, gK_c.p, [&](size_t e) {
    return 1.01 * (bk[e] + 2 * gam(nterm + 2) * (mk[e] + std::fabs(gK0[e]))) + 1e-30; }, nk);
  tt::check("causal grad_V", gV_m.p, gV_c.p, [&](size_t e) {
    return 1.01 * (bv[e] + 2 * gam(nterm + 2) * (mv[e] + std::fabs(gV0[e]))) + 1e-30; }, nk);
}

static void (*reduce_kernel(int DV))() {
  return DV == 256 ? +[] { m_dec::flash_attn_vec_reduce_dk256(); } : +[] { m_dec::flash_attn_vec_reduce_dk512(); };
}
static void (*undo_kernel(int DV))() {
  return DV == 256 ? +[] { m_dec::flash_attn_vec_reduce_tq_hb_undo_dk256(); }
                   : +[] { m_dec::flash_attn_vec_reduce_tq_hb_undo_dk512(); };
}

static void test_decode(tg_ctx *ctx, uint32_t nrows, uint32_t DV, uint32_t nwg) {
  std::printf("flash_attn_vec_reduce(_tq_hb_undo) nrows=%u DV=%u nwg=%u\n", nrows, DV, nwg);
  tt::Rng rng(tt::seed() + nrows + DV * 3 + nwg * 7);
  const size_t nh = (size_t)nrows * nwg * (DV + 2);
  Buf<float> htmp((nh + 3) / 4 * 4); /* float4 reads: keep the start 16-byte aligned */
  tt::fill_uniform(rng, htmp, -3, 3);
  float *SM = htmp.p + (size_t)nrows * DV * nwg;
  for (uint32_t r = 0; r < nrows; r++)
    for (uint32_t w = 0; w < nwg; w++) {
      float *sm = SM + ((size_t)r * nwg + w) * 2;
      sm[0] = (float)rng.uni(0.5, 20), sm[1] = (float)rng.uni(-4, 4);
      const bool empty = (r == 1) || (nwg > 1 && w % 4 == 3); /* row 1: only empty workgroups */
      if (empty) {
        sm[0] = 0, sm[1] = -INFINITY;
        for (uint32_t c = 0; c < DV / 4; c++)
          for (int k = 0; k < 4; k++) htmp[(((size_t)r * (DV / 4) + c) * nwg + w) * 4 + k] = NAN;
      }
    }
  Buf<float> red_c((size_t)nrows * DV), red_m((size_t)nrows * DV), und_c((size_t)nrows * DV), und_m((size_t)nrows * DV);
  TT_C(ctx, tg_flash_attn_vec_reduce(ctx, htmp.p, red_c.p, nrows, DV, nwg));
  TT_C(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp.p, und_c.p, nrows, DV, nwg));
  uint32_t prm[1] = {nrows}, nw[1] = {nwg};
  const uint tg = 32 * std::min(nwg, 8u);
  mtl_sim::Dispatch d;
  d.grid(nrows, 1, 1).tg(tg).buffer(0, prm).buffer(1, htmp.p).buffer(3, nw);
  d.buffer(2, red_m.p);
  if (!tt::run(d, reduce_kernel(DV), "flash_attn_vec_reduce")) return;
  d.buffer(2, und_m.p).tg_memory(0, DV * sizeof(float));
  if (!tt::run(d, undo_kernel(DV), "flash_attn_vec_reduce_tq_hb_undo")) return;

  /* plain reduce bound, and the per-element bound e_x the undo inherits */
  std::vector<double> bx((size_t)nrows * DV, 0), xabs((size_t)nrows * DV, 0);
  for (uint32_t r = 0; r < nrows; r++) {
    const float *sm = SM + (size_t)r * nwg * 2;
    float Mg = -INFINITY;
    for (uint32_t w = 0; w < nwg; w++) Mg = std::max(Mg, sm[2 * w + 1]);
    std::vector<double> a(nwg, 0);
    double St = 0, Sabs = 0;
    for (uint32_t w = 0; w < nwg; w++) {
      a[w] = sm[2 * w + 1] == -INFINITY ? 0.0 : (double)std::exp(sm[2 * w + 1] - Mg); /* the f32 weight */
      St += sm[2 * w] * a[w], Sabs += std::fabs(sm[2 * w] * a[w]);
    }
    if (St == 0) continue;
    for (uint32_t dd = 0; dd < DV; dd++) {
      double num = 0, nabs = 0;
      for (uint32_t w = 0; w < nwg; w++) {
        if (a[w] == 0) continue;
        const double pv = htmp[(((size_t)r * (DV / 4) + dd / 4) * nwg + w) * 4 + dd % 4];
        num += pv * a[w], nabs += std::fabs(pv * a[w]);
      }
      const double x = num / St;
      bx[(size_t)r * DV + dd] = 1.01 * (2 * gam(nwg + 1) * (nabs + std::fabs(x) * Sabs) / St + 4 * U * std::fabs(x)) + 1e-37;
      xabs[(size_t)r * DV + dd] = std::fabs(x);
    }
  }
  char what[96];
  snprintf(what, sizeof what, "vec_reduce_dk%u nwg=%u", DV, nwg);
  tt::check(what, red_m.p, red_c.p, [&](size_t e) { return bx[e]; }, red_c.n);
  std::vector<double> bu((size_t)nrows * DV);
  const double lg = std::log2((double)DV), isd = 1 / std::sqrt((double)DV);
  for (uint32_t r = 0; r < nrows; r++) {
    double ex = 0, xs = 0;
    for (uint32_t dd = 0; dd < DV; dd++) ex += bx[(size_t)r * DV + dd], xs += xabs[(size_t)r * DV + dd];
    for (uint32_t dd = 0; dd < DV; dd++)
      bu[(size_t)r * DV + dd] = 1.01 * (ex + 2 * lg * U * xs) * isd + 4 * U * xs * isd + 1e-37;
  }
  snprintf(what, sizeof what, "vec_reduce_tq_hb_undo_dk%u nwg=%u", DV, nwg);
  tt::check(what, und_m.p, und_c.p, [&](size_t e) { return bu[e]; }, und_c.n);
  /* fused == C undo applied to the Metal plain reduce, bitwise */
  TT_C(ctx, tg_fwht_sign_undo_f32(ctx, red_m.p, nrows, DV));
  snprintf(what, sizeof what, "tq_hb_undo_dk%u nwg=%u == fwht_sign_undo(reduce)", DV, nwg);
  tt::check_bitwise(what, und_m.p, red_m.p, red_m.n * 4);
}

int main() {
  tt::Ctx ctx;
  test_causal(ctx, 40, 4, 2, 64, 128);
  test_causal(ctx, 17, 3, 3, 48, 64);
  test_causal(ctx, 261, 2, 1, 16, 128); /* > one 256-key chunk, D < 32 */
  for (uint32_t DV : {256u, 512u})
    for (uint32_t nwg : {1u, 5u, 32u, 40u}) test_decode(ctx, 3, DV, nwg);
  return tt::finish("metal_decode_causal");
}
