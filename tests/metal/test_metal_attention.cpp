/* Twins of the FlashAttention-2 training kernels (metal/flash_attn_train_fwd.metal,
 * metal/flash_attn_train_bwd.metal): forward (O, L), compute_d, and the main
 * backward (dQ writes, dK/dV accumulate atomically), head dims 64 and 256,
 * against the C engine on small problems covering ragged tails (qL, kL not
 * multiples of 32/16) and aligned tiles, GQA, causal with qL != kL (positive
 * and negative qL_off, rows that see no key), additive bf16 masks with -inf
 * entries and a fully masked row, mask broadcast (stride 0), softcapping, and
 * strided views (Q/O in [B, L, H, D] layout, padded K/V rows).
 *
 * Tolerances: a running error bound in double over the exact inputs (the bf16
 * values), u = 2^-24, gamma_n = n u/(1 - n u). Per score, each side's S is
 * within es = gamma_D scale sum|q k| + 6u(|S| + |mask|) of exact; P = exp(S - L)
 * then differs by P (2 es + 4u (1 + |S - L|)) between the sides (libm and the
 * engine's vector exp are within 1 ulp); dP by 2 gamma_D sum|dO v|; dS by the
 * propagation of those through P (dP - D) (1 - tanh^2) scale plus 2u per
 * operation; dQ, dK, dV, D and the forward's O, L then add 2 gamma_n of the
 * absolute sum of their n terms (different summation orders, atomics in any
 * order). The forward's O is bf16: one bf16 rounding step (2^-7 |O|) is
 * added, since f32 values a hair apart can round to neighbouring bf16s. */
#include "twin_test.h"

namespace m_bwd {
#include "flash_attn_train_bwd.metal.cc"
}
namespace m_fwd {
#include "flash_attn_train_fwd.metal.cc"
}
#include "metal_shim_end.h"

#include <cstddef>

using tt::Buf;
using tt::gam;
using tt::U;

/* The ABI: the Metal struct and tilegrad's C struct are the same bytes. */
static_assert(sizeof(m_bwd::AttnParams) == sizeof(tg_attn_params), "AttnParams size");
static_assert(offsetof(m_bwd::AttnParams, qL_off) == offsetof(tg_attn_params, qL_off), "qL_off");
static_assert(offsetof(m_bwd::AttnParams, O_strides) == offsetof(tg_attn_params, O_strides), "O_strides");
static_assert(offsetof(m_bwd::AttnParams, softcapping) == offsetof(tg_attn_params, softcapping), "softcapping");
static_assert(sizeof(m_bwd::AttnMaskParams) == sizeof(tg_attn_mask_params), "AttnMaskParams");
static_assert(sizeof(m_fwd::AttnParams) == sizeof(tg_attn_params), "fwd AttnParams");

struct Problem {
  const char *name;
  int B, H, Hkv, qL, kL, D;
  bool causal, mask, strided;
  float softcap;
  int qL_off_delta; /* added to the default kL - qL */
};

static void (*fwd_kernel(int D))() {
  return D == 64 ? +[] { m_fwd::flash_attn_train_fwd_bf16_d64(); }
                 : +[] { m_fwd::flash_attn_train_fwd_bf16_d256(); };
}
static void (*bwd_kernel(int D))() {
  return D == 64 ? +[] { m_bwd::flash_attn_train_bwd_bf16_d64(); }
                 : +[] { m_bwd::flash_attn_train_bwd_bf16_d256(); };
}

static void run_problem(tg_ctx *ctx, const Problem &pb) {
  std::printf("%s: B=%d H=%d H_kv=%d qL=%d kL=%d D=%d%s%s%s softcap=%g\n", pb.name, pb.B, pb.H,
              pb.Hkv, pb.qL, pb.kL, pb.D, pb.causal ? " causal" : "", pb.mask ? " mask" : "",
              pb.strided ? " strided" : "", pb.softcap);
  const int B = pb.B, H = pb.H, Hkv = pb.Hkv, qL = pb.qL, kL = pb.kL, D = pb.D, G = H / Hkv;
  tt::Rng rng(tt::seed() + (uint64_t)(qL * 1000 + kL * 7 + D + H * 13 + pb.causal));
  tg_attn_params p;
  tg_attn_params_init(&p, B, H, Hkv, qL, kL, D, 1.0f / std::sqrt((float)D));
  p.softcapping = pb.softcap;
  p.qL_off += pb.qL_off_delta;
  size_t nQ = (size_t)B * H * qL * D, nK = (size_t)B * Hkv * kL * D;
  if (pb.strided) { /* Q, O, dO as [B, qL, H, D]; K, V rows padded by 8 */
    const int64_t qs[3] = {(int64_t)qL * H * D, D, (int64_t)H * D};
    const int64_t ks[3] = {(int64_t)Hkv * kL * (D + 8), (int64_t)kL * (D + 8), D + 8};
    for (int a = 0; a < 3; a++) p.Q_strides[a] = p.O_strides[a] = qs[a], p.K_strides[a] = p.V_strides[a] = ks[a];
    nK = (size_t)B * Hkv * kL * (D + 8);
  }
  auto qoff = [&](int b, int h, int i) { return (size_t)(b * p.Q_strides[0] + h * p.Q_strides[1] + i * p.Q_strides[2]); };
  auto ooff = [&](int b, int h, int i) { return (size_t)(b * p.O_strides[0] + h * p.O_strides[1] + i * p.O_strides[2]); };
  auto koff = [&](int b, int h, int k) { return (size_t)(b * p.K_strides[0] + h * p.K_strides[1] + k * p.K_strides[2]); };

  Buf<uint16_t> Q(nQ), K(nK), V(nK), dO(nQ), O_c(nQ), O_m(nQ);
  tt::fill_bf16(rng, Q, -1.5, 1.5);
  tt::fill_bf16(rng, K, -1.5, 1.5);
  tt::fill_bf16(rng, V, -1, 1);
  tt::fill_bf16(rng, dO, -1, 1);
  O_c.fill(0);
  O_m.fill(0);
  tg_attn_mask_params mp = {{0, (int64_t)qL * kL, kL}}; /* broadcast over batch */
  Buf<uint16_t> mask(pb.mask ? (size_t)H * qL * kL : 1);
  if (pb.mask) {
    for (size_t e = 0; e < mask.n; e++)
      mask[e] = rng.next() % 10 == 0 ? 0xFF80 /* -inf */ : tt::f2bf((float)rng.uni(-2, 2));
    for (int h = 0; h < H; h++)
      for (int k = 0; k < kL; k++) mask[((size_t)h * qL + 3) * kL + k] = 0xFF80; /* row 3 fully masked */
  }
  const tg_attn_mask_params *mpp = pb.mask ? &mp : nullptr;
  const tg_bf16 *maskp = pb.mask ? mask.p : nullptr;
  auto bind_common = [&](mtl_sim::Dispatch &d) {
    d.grid((uint)p.NQ, (uint)H, (uint)B).tg(128).buffer(10, &p);
    if (pb.mask) d.buffer(11, &mp).buffer(12, mask.p);
    d.constant(200, qL % 32 == 0).constant(201, kL % 16 == 0).constant(300, pb.mask).constant(301, pb.causal);
  };

  /* exact scores: s[b][h][i][k] (double), with per-side error es */
  const size_t nS = (size_t)B * H * qL * kL;
  std::vector<double> S(nS), ES(nS), T(nS), ESX(nS);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qL; i++)
        for (int k = 0; k < kL; k++) {
          double qk = 0, aqk = 0;
          for (int d = 0; d < D; d++) {
            const double t = (double)tt::bf2f(Q[qoff(b, h, i) + d]) * tt::bf2f(K[koff(b, h / G, k) + d]);
            qk += t, aqk += std::fabs(t);
          }
          double s = p.scale * qk, t = 0, m = 0;
          const double esx = gam(D) * p.scale * aqk + 2 * U * std::fabs(s);
          double es = esx;
          if (pb.softcap != 1.0f) t = std::tanh(s / pb.softcap), s = pb.softcap * t, es += 4 * U * std::fabs(s);
          if (pb.causal && k > i + p.qL_off) s = -INFINITY;
          if (pb.mask && s != -INFINITY) {
            m = tt::bf2f(mask[((size_t)h * qL + i) * kL + k]);
            s = m == -INFINITY ? -INFINITY : s + m;
          }
          const size_t e = (((size_t)b * H + h) * qL + i) * kL + k;
          S[e] = s, T[e] = t, ESX[e] = esx, ES[e] = es + 6 * U * (std::fabs(s) + std::fabs(m));
        }

  /* ---- forward ---- */
  Buf<float> L_c((size_t)B * H * qL), L_m((size_t)B * H * qL);
  TT_C(ctx, tg_flash_attn_train_fwd_bf16(ctx, Q.p, K.p, V.p, O_c.p, L_c.p, &p, mpp, maskp, pb.causal));
  {
    mtl_sim::Dispatch d;
    bind_common(d);
    d.buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p).buffer(3, O_m.p).buffer(4, L_m.p);
    if (tt::run(d, fwd_kernel(D), "flash_attn_train_fwd")) {
      std::vector<float> Oc((size_t)B * H * qL * D), Om(Oc.size());
      std::vector<double> bo(Oc.size()), bl(L_c.n);
      const int ntiles = (kL + 15) / 16 + 1;
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
          for (int i = 0; i < qL; i++) {
            const size_t r = ((size_t)b * H + h) * qL + i;
            double mx = -INFINITY, l = 0, rho_max = 0;
            for (int k = 0; k < kL; k++) mx = std::max(mx, S[r * kL + k]);
            std::vector<double> P(kL, 0), rho(kL, 0);
            if (mx != -INFINITY)
              for (int k = 0; k < kL; k++) {
                if (S[r * kL + k] == -INFINITY) continue;
                P[k] = std::exp(S[r * kL + k] - mx), l += P[k];
                rho[k] = 2 * ES[r * kL + k] + 4 * U * (1 + std::fabs(S[r * kL + k] - mx)) + 4 * U * ntiles;
                rho_max = std::max(rho_max, rho[k]);
              }
            const double Lx = l > 0 ? mx + std::log(l) : -INFINITY;
            bl[r] = 2 * (rho_max + gam(kL + 2)) + 8 * U * std::fabs(Lx) + 1e-30;
            for (int d = 0; d < D; d++) {
              double o = 0, mag = 0, err = 0;
              for (int k = 0; k < kL; k++) {
                if (P[k] == 0) continue;
                const double v = tt::bf2f(V[koff(b, h / G, k) + d]);
                o += P[k] / l * v, mag += P[k] / l * std::fabs(v), err += P[k] / l * rho[k] * std::fabs(v);
              }
              const size_t e = r * D + d;
              Oc[e] = tt::bf2f(O_c[ooff(b, h, i) + d]);
              Om[e] = tt::bf2f(O_m[ooff(b, h, i) + d]);
              bo[e] = 1.01 * (2 * err + 2 * gam(kL + 2) * mag + 2 * std::fabs(o) * (rho_max + gam(kL + 2))) +
                      0x1p-7 * std::fabs(o) + 1e-30;
            }
          }
      tt::check("forward L", L_m.p, L_c.p, [&](size_t e) { return bl[e]; }, L_c.n);
      tt::check("forward O (bf16)", Om.data(), Oc.data(), [&](size_t e) { return bo[e]; }, Oc.size());
    }
  }

  /* ---- compute_d on contiguous copies of O (the engine's) and dO ---- */
  const size_t nRows = (size_t)B * H * qL;
  Buf<uint16_t> Oq(nRows * D), dOq(nRows * D);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qL; i++)
        for (int d = 0; d < D; d++) {
          const size_t e = ((((size_t)b * H + h) * qL + i) * D) + d;
          Oq[e] = O_c[ooff(b, h, i) + d], dOq[e] = dO[ooff(b, h, i) + d];
        }
  Buf<float> Dv_c(nRows), Dv_m(nRows);
  TT_C(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, Oq.p, dOq.p, Dv_c.p, B, H, qL, D));
  {
    uint32_t cp[4] = {(uint32_t)B, (uint32_t)H, (uint32_t)qL, (uint32_t)D};
    uint tgs = 1;
    while (tgs < (uint)D) tgs *= 2;
    mtl_sim::Dispatch d;
    d.grid(qL, 1, B * H).tg(std::min(256u, tgs)).buffer(0, Oq.p).buffer(1, dOq.p).buffer(2, Dv_m.p).buffer(3, cp);
    if (tt::run(d, [] { m_bwd::flash_attn_train_bwd_compute_d_bf16(); }, "compute_d")) {
      /* bf16 x bf16 products are exact in f32: only the sums differ */
      tt::check("compute_d", Dv_m.p, Dv_c.p, [&](size_t r) {
        double mag = 0;
        for (int d = 0; d < D; d++) mag += std::fabs((double)tt::bf2f(Oq[r * D + d]) * tt::bf2f(dOq[r * D + d]));
        return 2 * gam(D) * mag + 1e-37;
      }, nRows);
    }
  }

  /* ---- backward, both sides fed the engine's L and D ---- */
  Buf<float> dQ_c(nRows * D), dQ_m(nRows * D), dK_c((size_t)B * Hkv * kL * D), dK_m(dK_c.n),
      dV_c(dK_c.n), dV_m(dK_c.n);
  dQ_c.fill(NAN);
  dQ_m.fill(NAN);
  tt::fill_uniform(rng, dK_c, -0.5, 0.5);
  tt::fill_uniform(rng, dV_c, -0.5, 0.5);
  dK_m.copy_from(dK_c);
  dV_m.copy_from(dV_c);
  std::vector<float> dK0(dK_c.p, dK_c.p + dK_c.n), dV0(dV_c.p, dV_c.p + dV_c.n);
  TT_C(ctx, tg_flash_attn_train_bwd_bf16(ctx, Q.p, K.p, V.p, L_c.p, dO.p, Dv_c.p, dQ_c.p, dK_c.p, dV_c.p,
                                         &p, mpp, maskp, pb.causal));
  mtl_sim::Dispatch d;
  bind_common(d);
  d.buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p).buffer(4, L_c.p).buffer(5, dO.p).buffer(6, Dv_c.p)
      .buffer(7, dQ_m.p).buffer(8, dK_m.p).buffer(9, dV_m.p);
  if (!tt::run(d, bwd_kernel(D), "flash_attn_train_bwd")) return;

  /* running bounds */
  std::vector<double> bq(dQ_c.n, 0), mq(dQ_c.n, 0), bk(dK_c.n, 0), mk(dK_c.n, 0), bv(dK_c.n, 0),
      mv(dK_c.n, 0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qL; i++) {
        const size_t r = ((size_t)b * H + h) * qL + i;
        const double Li = L_c[r], Di = Dv_c[r];
        for (int k = 0; k < kL; k++) {
          const size_t e = r * kL + k;
          const double s = S[e];
          if (s == -INFINITY || Li == -INFINITY) continue;
          const double P = std::exp(s - Li);
          const double eP = P * (2 * ES[e] + 4 * U * (1 + std::fabs(s - Li)));
          double dp = 0, adp = 0;
          for (int dd = 0; dd < D; dd++) {
            const double t = (double)tt::bf2f(dO[ooff(b, h, i) + dd]) * tt::bf2f(V[koff(b, h / G, k) + dd]);
            dp += t, adp += std::fabs(t);
          }
          const double g = P * (dp - Di);
          double eg = eP * std::fabs(dp - Di) + P * (2 * gam(D) * adp + 4 * U * (std::fabs(dp) + std::fabs(Di)));
          double gs = g, egs = eg;
          if (pb.softcap != 1.0f) {
            const double t = T[e], f = 1 - t * t;
            const double dt = 2 * ESX[e] / pb.softcap + 8 * U * std::fabs(t);
            gs = g * f, egs = eg * f + std::fabs(g) * (2 * std::fabs(t) * dt + 4 * U);
          }
          const double ds = p.scale * gs, eds = p.scale * egs + 4 * U * std::fabs(ds);
          for (int dd = 0; dd < D; dd++) {
            const double kv = tt::bf2f(K[koff(b, h / G, k) + dd]), qv = tt::bf2f(Q[qoff(b, h, i) + dd]);
            const double ov = tt::bf2f(dO[ooff(b, h, i) + dd]);
            const size_t qe = r * D + dd, ke = ((((size_t)b * Hkv + h / G) * kL) + k) * D + dd;
            bq[qe] += eds * std::fabs(kv), mq[qe] += std::fabs(ds * kv);
            bk[ke] += eds * std::fabs(qv), mk[ke] += std::fabs(ds * qv);
            bv[ke] += eP * std::fabs(ov), mv[ke] += std::fabs(P * ov);
          }
        }
      }
  const double nkv = (double)G * qL + 2;
  tt::check("backward dQ", dQ_m.p, dQ_c.p, [&](size_t e) { return 1.01 * (bq[e] + 2 * gam(kL + 2) * mq[e]) + 1e-30; }, dQ_c.n);
  tt::check("backward dK", dK_m.p, dK_c.p, [&](size_t e) {
    return 1.01 * (bk[e] + 2 * gam(nkv) * (mk[e] + std::fabs(dK0[e]))) + 1e-30; }, dK_c.n);
  tt::check("backward dV", dV_m.p, dV_c.p, [&](size_t e) {
    return 1.01 * (bv[e] + 2 * gam(nkv) * (mv[e] + std::fabs(dV0[e]))) + 1e-30; }, dV_c.n);
  if (pb.mask) { /* the fully masked row 3 has exact zeros in dQ */
    bool zero = true;
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int dd = 0; dd < D; dd++) zero &= dQ_m[((((size_t)b * H + h) * qL) + 3) * D + dd] == 0.0f;
    tt::expect(zero, "fully masked row: dQ must be exactly 0");
  }
}

int main() {
  tt::Ctx ctx;
  const Problem problems[] = {
      {"tails", 1, 2, 2, 37, 37, 64, false, false, false, 1.0f, 0},
      {"gqa causal mask", 2, 4, 2, 40, 50, 64, true, true, false, 1.0f, 0},
      {"d256 causal qL>kL softcap", 1, 2, 1, 33, 20, 256, true, false, false, 20.0f, 0},
      {"aligned strided mask", 2, 2, 1, 64, 32, 64, false, true, true, 1.0f, 0},
      {"d256 strided causal mask qL_off-3", 1, 3, 3, 35, 35, 256, true, true, true, 1.0f, -3},
  };
  for (const auto &pb : problems) run_problem(ctx, pb);
  return tt::finish("metal_attention");
}
