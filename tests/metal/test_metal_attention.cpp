/* Twins of the FlashAttention-2 training kernels (metal/flash_attn_train_fwd.metal,
 * metal/flash_attn_train_bwd.metal): forward (O, L), compute_d, and the main
 * backward (dQ writes, dK/dV accumulate atomically), head dims 64 and 256 and
 * D = 192 with Dv = 128, against the C engine on small problems covering
 * ragged tails (qL, kL not multiples of 32/16) and aligned tiles, GQA, causal
 * with qL != kL (positive and negative qL_off, rows that see no key), additive
 * bf16 masks with -inf entries and a fully masked row, mask broadcast (stride
 * 0), softcapping, strided views (Q/O in [B, L, H, D] layout, padded K/V
 * rows), and the variants: sliding windows (causal and not, shifted qL_off,
 * W = 1 and W past every key), sinks (finite, -inf, NaN, +inf; d_sinks
 * accumulating), Dv != D and their combinations. Problems without variants
 * dispatch the kernels as a host written before the variants does (function
 * constants 302-304 unset) and call the bf16 entry points; the others call
 * tg_attn_train_* with tg_attn_options. Every result is also checked against the f64 reference
 * the bounds are built from (each side is within half the two-sided bound of
 * it, and rounding the reference to f32 fits in the other half).
 *
 * Tolerances: a running error bound in double over the exact inputs (the bf16
 * values), u = 2^-24, gamma_n = n u/(1 - n u). Per score, each side's S is
 * within es = gamma_D scale sum|q k| + 6u(|S| + |mask|) of exact; P = exp(S - L)
 * then differs by P (2 es + 4u (1 + |S - L|)) between the sides (libm and the
 * engine's vector exp are within 1 ulp); dP by 2 gamma_Dv sum|dO v|; dS by the
 * propagation of those through P (dP - D) (1 - tanh^2) scale plus 2u per
 * operation; dQ, dK, dV, D and the forward's O, L then add 2 gamma_n of the
 * absolute sum of their n terms (different summation orders, atomics in any
 * order). A sink is one more term of the forward's sum, with no score error;
 * d_sinks' terms -exp(s_h - L) D each carry 4u (1 + |s_h - L|) + 4u, and
 * their sum 2 gamma_n. The forward's O is bf16: one bf16 rounding step
 * (2^-7 |O|) is added, since f32 values a hair apart can round to
 * neighbouring bf16s. */
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

/* The variant kernels' extra struct (buffer 13) is tg_attn_options.window
 * and .v_head_dim in that order. */
static_assert(sizeof(m_fwd::AttnVariantParams) == 8 && sizeof(m_bwd::AttnVariantParams) == 8,
              "AttnVariantParams is 8 bytes");

enum Sinks {
  NO_SINKS,
  SINKS,         /* finite s_h per head, one head -inf (no sink); d_sinks wanted */
  SINKS_NONFINITE /* heads NaN, +inf, finite, -inf: forward only (the backward of
                   * a NaN L is not specified) */
};

struct Problem {
  const char *name;
  int B, H, Hkv, qL, kL, D, Dv; /* Dv 0 = D */
  bool causal, mask, strided;
  float softcap;
  int qL_off_delta; /* added to the default kL - qL */
  uint32_t window;  /* 0 = none */
  Sinks sinks;
};

static void (*fwd_kernel(int D, int Dv))() {
  if (D == 192 && Dv == 128) return +[] { m_fwd::flash_attn_train_fwd_bf16_d192_dv128(); };
  return D == 64 ? +[] { m_fwd::flash_attn_train_fwd_bf16_d64(); }
                 : +[] { m_fwd::flash_attn_train_fwd_bf16_d256(); };
}
static void (*bwd_kernel(int D, int Dv))() {
  if (D == 192 && Dv == 128) return +[] { m_bwd::flash_attn_train_bwd_bf16_d192_dv128(); };
  return D == 64 ? +[] { m_bwd::flash_attn_train_bwd_bf16_d64(); }
                 : +[] { m_bwd::flash_attn_train_bwd_bf16_d256(); };
}

/* Metal vs C, and Metal vs the f64 reference, within the same bound. */
static void check2(const char *what, const float *metal, const float *c, const float *ref,
                   const std::function<double(size_t)> &bound, size_t n) {
  tt::check(what, metal, c, bound, n);
  const std::string w = std::string(what) + " vs f64";
  tt::check(w.c_str(), metal, ref, bound, n);
}

static void run_problem(tg_ctx *ctx, const Problem &pb) {
  const int B = pb.B, H = pb.H, Hkv = pb.Hkv, qL = pb.qL, kL = pb.kL, D = pb.D, G = H / Hkv;
  const int Dv = pb.Dv ? pb.Dv : D;
  const bool variants = pb.window != 0 || pb.Dv != 0 || pb.sinks != NO_SINKS;
  std::printf("%s: B=%d H=%d H_kv=%d qL=%d kL=%d D=%d Dv=%d%s%s%s softcap=%g W=%u%s\n", pb.name, pb.B,
              pb.H, pb.Hkv, pb.qL, pb.kL, pb.D, Dv, pb.causal ? " causal" : "", pb.mask ? " mask" : "",
              pb.strided ? " strided" : "", pb.softcap, pb.window,
              pb.sinks == SINKS ? " sinks" : pb.sinks == SINKS_NONFINITE ? " sinks(NaN,+inf,-inf)" : "");
  tt::Rng rng(tt::seed() + (uint64_t)(qL * 1000 + kL * 7 + D + H * 13 + pb.causal + Dv * 3 + pb.window * 5));
  tg_attn_params p;
  tg_attn_params_init(&p, B, H, Hkv, qL, kL, D, 1.0f / std::sqrt((float)D));
  p.softcapping = pb.softcap;
  p.qL_off += pb.qL_off_delta;
  /* O, dO and V have Dv columns: init's strides are for D ones */
  p.O_strides[0] = (int64_t)H * qL * Dv, p.O_strides[1] = (int64_t)qL * Dv, p.O_strides[2] = Dv;
  p.V_strides[0] = (int64_t)Hkv * kL * Dv, p.V_strides[1] = (int64_t)kL * Dv, p.V_strides[2] = Dv;
  size_t nQ = (size_t)B * H * qL * D, nO = (size_t)B * H * qL * Dv, nK = (size_t)B * Hkv * kL * D,
         nV = (size_t)B * Hkv * kL * Dv;
  if (pb.strided) { /* Q, O, dO as [B, qL, H, D]; K, V rows padded by 8 */
    const int64_t qs[3] = {(int64_t)qL * H * D, D, (int64_t)H * D};
    const int64_t os[3] = {(int64_t)qL * H * Dv, Dv, (int64_t)H * Dv};
    const int64_t ks[3] = {(int64_t)Hkv * kL * (D + 8), (int64_t)kL * (D + 8), D + 8};
    const int64_t vs[3] = {(int64_t)Hkv * kL * (Dv + 8), (int64_t)kL * (Dv + 8), Dv + 8};
    for (int a = 0; a < 3; a++)
      p.Q_strides[a] = qs[a], p.O_strides[a] = os[a], p.K_strides[a] = ks[a], p.V_strides[a] = vs[a];
    nK = (size_t)B * Hkv * kL * (D + 8), nV = (size_t)B * Hkv * kL * (Dv + 8);
  }
  auto qoff = [&](int b, int h, int i) { return (size_t)(b * p.Q_strides[0] + h * p.Q_strides[1] + i * p.Q_strides[2]); };
  auto ooff = [&](int b, int h, int i) { return (size_t)(b * p.O_strides[0] + h * p.O_strides[1] + i * p.O_strides[2]); };
  auto koff = [&](int b, int h, int k) { return (size_t)(b * p.K_strides[0] + h * p.K_strides[1] + k * p.K_strides[2]); };
  auto voff = [&](int b, int h, int k) { return (size_t)(b * p.V_strides[0] + h * p.V_strides[1] + k * p.V_strides[2]); };

  Buf<uint16_t> Q(nQ), K(nK), V(nV), dO(nO), O_c(nO), O_m(nO);
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

  /* sinks: finite in [-1, 4] (comparable to the row sums' logs), head 1 -inf;
   * the non-finite set: NaN, +inf, finite, -inf, ... */
  Buf<float> sinks(H), dsinks_c(H), dsinks_m(H);
  for (int h = 0; h < H; h++) {
    sinks[h] = (float)rng.uni(-1, 4);
    if (pb.sinks == SINKS && h == 1) sinks[h] = -INFINITY;
    if (pb.sinks == SINKS_NONFINITE) sinks[h] = h % 4 == 0 ? NAN : h % 4 == 1 ? INFINITY : h % 4 == 3 ? -INFINITY : sinks[h];
  }
  tt::fill_uniform(rng, dsinks_c, -0.5, 0.5);
  dsinks_m.copy_from(dsinks_c);
  const bool with_sinks = pb.sinks != NO_SINKS;
  tg_attn_options opt = {};
  opt.window = pb.window;
  opt.v_head_dim = (uint32_t)pb.Dv;
  opt.sinks = with_sinks ? sinks.p : nullptr;
  opt.d_sinks = pb.sinks == SINKS ? dsinks_c.p : nullptr;
  const uint32_t vparams[2] = {pb.window, (uint32_t)pb.Dv}; /* AttnVariantParams */

  auto bind_common = [&](mtl_sim::Dispatch &d) {
    d.grid((uint)p.NQ, (uint)H, (uint)B).tg(128).buffer(10, &p);
    if (pb.mask) d.buffer(11, &mp).buffer(12, mask.p);
    d.constant(200, qL % 32 == 0).constant(201, kL % 16 == 0).constant(300, pb.mask).constant(301, pb.causal);
    if (pb.window != 0 || pb.Dv != 0) d.constant(302, true).buffer(13, vparams);
    if (with_sinks) d.constant(303, true).buffer(14, sinks.p);
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
          if (pb.window != 0 && (int64_t)k <= (int64_t)i + p.qL_off - (int64_t)pb.window) s = -INFINITY;
          if (pb.mask && s != -INFINITY) {
            m = tt::bf2f(mask[((size_t)h * qL + i) * kL + k]);
            s = m == -INFINITY ? -INFINITY : s + m;
          }
          const size_t e = (((size_t)b * H + h) * qL + i) * kL + k;
          S[e] = s, T[e] = t, ESX[e] = esx, ES[e] = es + 6 * U * (std::fabs(s) + std::fabs(m));
        }

  /* ---- forward ---- */
  Buf<float> L_c((size_t)B * H * qL), L_m((size_t)B * H * qL);
  if (variants)
    TT_C(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q.p, K.p, V.p, O_c.p, L_c.p, &p, mpp, maskp, pb.causal, &opt));
  else
    TT_C(ctx, tg_flash_attn_train_fwd_bf16(ctx, Q.p, K.p, V.p, O_c.p, L_c.p, &p, mpp, maskp, pb.causal));
  {
    mtl_sim::Dispatch d;
    bind_common(d);
    d.buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p).buffer(3, O_m.p).buffer(4, L_m.p);
    if (tt::run(d, fwd_kernel(D, Dv), "flash_attn_train_fwd")) {
      std::vector<float> Oc((size_t)B * H * qL * Dv), Om(Oc.size()), Oref(Oc.size()), Lref(L_c.n);
      std::vector<double> bo(Oc.size()), bl(L_c.n);
      const int ntiles = (kL + 15) / 16 + 1;
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
          for (int i = 0; i < qL; i++) {
            const size_t r = ((size_t)b * H + h) * qL + i;
            const double sink = with_sinks ? sinks[h] : -INFINITY;
            const bool bad_sink = std::isnan(sink) || sink == INFINITY;
            double mx = sink, l = 0, rho_max = 0;
            for (int k = 0; k < kL; k++) mx = std::max(mx, S[r * kL + k]);
            std::vector<double> P(kL, 0), rho(kL, 0);
            if (mx != -INFINITY && !bad_sink) {
              for (int k = 0; k < kL; k++) {
                if (S[r * kL + k] == -INFINITY) continue;
                P[k] = std::exp(S[r * kL + k] - mx), l += P[k];
                rho[k] = 2 * ES[r * kL + k] + 4 * U * (1 + std::fabs(S[r * kL + k] - mx)) + 4 * U * ntiles;
                rho_max = std::max(rho_max, rho[k]);
              }
              if (sink != -INFINITY) { /* one more term, exact input */
                l += std::exp(sink - mx);
                rho_max = std::max(rho_max, 4 * U * (1 + std::fabs(sink - mx)) + 4 * U * ntiles);
              }
            }
            const double Lx = bad_sink ? NAN : l > 0 ? mx + std::log(l) : -INFINITY;
            Lref[r] = (float)Lx;
            bl[r] = 2 * (rho_max + gam(kL + 3)) + 8 * U * std::fabs(Lx) + 1e-30;
            for (int d = 0; d < Dv; d++) {
              double o = 0, mag = 0, err = 0;
              for (int k = 0; k < kL; k++) {
                if (P[k] == 0) continue;
                const double v = tt::bf2f(V[voff(b, h / G, k) + d]);
                o += P[k] / l * v, mag += P[k] / l * std::fabs(v), err += P[k] / l * rho[k] * std::fabs(v);
              }
              const size_t e = r * Dv + d;
              Oc[e] = tt::bf2f(O_c[ooff(b, h, i) + d]);
              Om[e] = tt::bf2f(O_m[ooff(b, h, i) + d]);
              Oref[e] = bad_sink ? NAN : (float)o;
              bo[e] = 1.01 * (2 * err + 2 * gam(kL + 3) * mag + 2 * std::fabs(o) * (rho_max + gam(kL + 3))) +
                      0x1p-7 * std::fabs(o) + 1e-30;
            }
          }
      check2("forward L", L_m.p, L_c.p, Lref.data(), [&](size_t e) { return bl[e]; }, L_c.n);
      check2("forward O (bf16)", Om.data(), Oc.data(), Oref.data(), [&](size_t e) { return bo[e]; }, Oc.size());
    }
  }
  if (pb.sinks == SINKS_NONFINITE) return;

  /* ---- compute_d on contiguous copies of O (the engine's) and dO (Dv columns) ---- */
  const size_t nRows = (size_t)B * H * qL;
  Buf<uint16_t> Oq(nRows * Dv), dOq(nRows * Dv);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qL; i++)
        for (int d = 0; d < Dv; d++) {
          const size_t e = ((((size_t)b * H + h) * qL + i) * Dv) + d;
          Oq[e] = O_c[ooff(b, h, i) + d], dOq[e] = dO[ooff(b, h, i) + d];
        }
  Buf<float> Dv_c(nRows), Dv_m(nRows);
  TT_C(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, Oq.p, dOq.p, Dv_c.p, B, H, qL, Dv));
  {
    uint32_t cp[4] = {(uint32_t)B, (uint32_t)H, (uint32_t)qL, (uint32_t)Dv};
    uint tgs = 1;
    while (tgs < (uint)Dv) tgs *= 2;
    mtl_sim::Dispatch d;
    d.grid(qL, 1, B * H).tg(std::min(256u, tgs)).buffer(0, Oq.p).buffer(1, dOq.p).buffer(2, Dv_m.p).buffer(3, cp);
    if (tt::run(d, [] { m_bwd::flash_attn_train_bwd_compute_d_bf16(); }, "compute_d")) {
      /* bf16 x bf16 products are exact in f32: only the sums differ */
      std::vector<float> ref(nRows);
      std::vector<double> mag(nRows, 0);
      for (size_t r = 0; r < nRows; r++) {
        double acc = 0;
        for (int d = 0; d < Dv; d++) {
          const double t = (double)tt::bf2f(Oq[r * Dv + d]) * tt::bf2f(dOq[r * Dv + d]);
          acc += t, mag[r] += std::fabs(t);
        }
        ref[r] = (float)acc;
      }
      check2("compute_d", Dv_m.p, Dv_c.p, ref.data(), [&](size_t r) { return 2 * gam(Dv) * mag[r] + 1e-37; }, nRows);
    }
  }

  /* ---- backward, both sides fed the engine's L and D ---- */
  const size_t nKd = (size_t)B * Hkv * kL * D, nVd = (size_t)B * Hkv * kL * Dv;
  Buf<float> dQ_c(nRows * D), dQ_m(nRows * D), dK_c(nKd), dK_m(nKd), dV_c(nVd), dV_m(nVd);
  dQ_c.fill(NAN);
  dQ_m.fill(NAN);
  tt::fill_uniform(rng, dK_c, -0.5, 0.5);
  tt::fill_uniform(rng, dV_c, -0.5, 0.5);
  dK_m.copy_from(dK_c);
  dV_m.copy_from(dV_c);
  std::vector<float> dK0(dK_c.p, dK_c.p + dK_c.n), dV0(dV_c.p, dV_c.p + dV_c.n),
      ds0(dsinks_c.p, dsinks_c.p + H);
  if (variants)
    TT_C(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_BF16, Q.p, K.p, V.p, L_c.p, dO.p, Dv_c.p, dQ_c.p, dK_c.p,
                                dV_c.p, &p, mpp, maskp, pb.causal, &opt));
  else
    TT_C(ctx, tg_flash_attn_train_bwd_bf16(ctx, Q.p, K.p, V.p, L_c.p, dO.p, Dv_c.p, dQ_c.p, dK_c.p, dV_c.p,
                                           &p, mpp, maskp, pb.causal));
  mtl_sim::Dispatch d;
  bind_common(d);
  d.buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p).buffer(4, L_c.p).buffer(5, dO.p).buffer(6, Dv_c.p)
      .buffer(7, dQ_m.p).buffer(8, dK_m.p).buffer(9, dV_m.p);
  if (pb.sinks == SINKS) d.constant(304, true).buffer(15, dsinks_m.p);
  if (!tt::run(d, bwd_kernel(D, Dv), "flash_attn_train_bwd")) return;

  /* reference values and running bounds */
  std::vector<double> bq(dQ_c.n, 0), mq(dQ_c.n, 0), bk(nKd, 0), mk(nKd, 0), bv(nVd, 0), mv(nVd, 0);
  std::vector<double> rq(dQ_c.n, 0), rk(dK0.begin(), dK0.end()), rv(dV0.begin(), dV0.end());
  std::vector<double> rs(ds0.begin(), ds0.end()), bs(H, 0), ms(H, 0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < qL; i++) {
        const size_t r = ((size_t)b * H + h) * qL + i;
        const double Li = L_c[r], Di = Dv_c[r];
        if (pb.sinks == SINKS && sinks[h] != -INFINITY) { /* d_sinks term */
          const double ps = std::exp((double)sinks[h] - Li), t = -ps * Di;
          rs[h] += t, ms[h] += std::fabs(t);
          bs[h] += std::fabs(t) * (4 * U * (1 + std::fabs(sinks[h] - Li)) + 4 * U);
        }
        for (int k = 0; k < kL; k++) {
          const size_t e = r * kL + k;
          const double s = S[e];
          if (s == -INFINITY || Li == -INFINITY) continue;
          const double P = std::exp(s - Li);
          const double eP = P * (2 * ES[e] + 4 * U * (1 + std::fabs(s - Li)));
          double dp = 0, adp = 0;
          for (int dd = 0; dd < Dv; dd++) {
            const double t = (double)tt::bf2f(dO[ooff(b, h, i) + dd]) * tt::bf2f(V[voff(b, h / G, k) + dd]);
            dp += t, adp += std::fabs(t);
          }
          const double g = P * (dp - Di);
          double eg = eP * std::fabs(dp - Di) + P * (2 * gam(Dv) * adp + 4 * U * (std::fabs(dp) + std::fabs(Di)));
          double gs = g, egs = eg;
          if (pb.softcap != 1.0f) {
            const double t = T[e], f = 1 - t * t;
            const double dt = 2 * ESX[e] / pb.softcap + 8 * U * std::fabs(t);
            gs = g * f, egs = eg * f + std::fabs(g) * (2 * std::fabs(t) * dt + 4 * U);
          }
          const double ds = p.scale * gs, eds = p.scale * egs + 4 * U * std::fabs(ds);
          const size_t kvrow = ((size_t)b * Hkv + h / G) * kL + k;
          for (int dd = 0; dd < D; dd++) {
            const double kv = tt::bf2f(K[koff(b, h / G, k) + dd]), qv = tt::bf2f(Q[qoff(b, h, i) + dd]);
            const size_t qe = r * D + dd, ke = kvrow * D + dd;
            rq[qe] += ds * kv, bq[qe] += eds * std::fabs(kv), mq[qe] += std::fabs(ds * kv);
            rk[ke] += ds * qv, bk[ke] += eds * std::fabs(qv), mk[ke] += std::fabs(ds * qv);
          }
          for (int dd = 0; dd < Dv; dd++) {
            const double ov = tt::bf2f(dO[ooff(b, h, i) + dd]);
            const size_t ve = kvrow * Dv + dd;
            rv[ve] += P * ov, bv[ve] += eP * std::fabs(ov), mv[ve] += std::fabs(P * ov);
          }
        }
      }
  auto to_f32 = [](const std::vector<double> &v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> rq32 = to_f32(rq), rk32 = to_f32(rk), rv32 = to_f32(rv), rs32 = to_f32(rs);
  const double nkv = (double)G * qL + 2;
  check2("backward dQ", dQ_m.p, dQ_c.p, rq32.data(), [&](size_t e) { return 1.01 * (bq[e] + 2 * gam(kL + 2) * mq[e]) + 1e-30; }, dQ_c.n);
  check2("backward dK", dK_m.p, dK_c.p, rk32.data(), [&](size_t e) {
    return 1.01 * (bk[e] + 2 * gam(nkv) * (mk[e] + std::fabs(dK0[e]))) + 1e-30; }, dK_c.n);
  check2("backward dV", dV_m.p, dV_c.p, rv32.data(), [&](size_t e) {
    return 1.01 * (bv[e] + 2 * gam(nkv) * (mv[e] + std::fabs(dV0[e]))) + 1e-30; }, dV_c.n);
  if (pb.sinks == SINKS) {
    const double nsr = (double)B * qL + 2;
    check2("backward d_sinks", dsinks_m.p, dsinks_c.p, rs32.data(), [&](size_t h) {
      return 1.01 * (2 * bs[h] + 2 * gam(nsr) * (ms[h] + std::fabs(ds0[h]))) + 1e-30; }, (size_t)H);
    tt::expect(dsinks_m[1] == ds0[1], "d_sinks of a -inf sink must be unchanged");
  }
  if (pb.mask) { /* the fully masked row 3 has exact zeros in dQ */
    bool zero = true;
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int dd = 0; dd < D; dd++) zero &= dQ_m[((((size_t)b * H + h) * qL) + 3) * D + dd] == 0.0f;
    tt::expect(zero, "fully masked row: dQ must be exactly 0");
  }
}

/* A host that picks the D = 192, Dv = 128 kernels but does not say Dv (no
 * variant params: Dv = D = 192) gets NaN O, L and dQ, not reads past V's rows. */
static void wrong_kernel_is_nan() {
  std::printf("d192_dv128 without AttnVariantParams: NaN\n");
  tg_attn_params p;
  tg_attn_params_init(&p, 1, 1, 1, 20, 20, 192, 0.1f);
  Buf<uint16_t> Q(20 * 192), K(20 * 192), V(20 * 192), O(20 * 192);
  Buf<float> L(20);
  Q.fill(0), K.fill(0), V.fill(0);
  mtl_sim::Dispatch d;
  d.grid((uint)p.NQ, 1, 1).tg(128).buffer(10, &p).buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p)
      .buffer(3, O.p).buffer(4, L.p);
  d.constant(200, false).constant(201, false).constant(300, false).constant(301, false);
  if (!tt::run(d, fwd_kernel(192, 128), "flash_attn_train_fwd d192_dv128")) return;
  bool nan = true;
  for (int i = 0; i < 20; i++) nan &= std::isnan(L[i]);
  for (int e = 0; e < 20 * 192; e++) nan &= O[e] == 0x7FC0;
  tt::expect(nan, "forward: O and L must be NaN");
  Buf<float> dQ(20 * 192), dK(20 * 192), dV(20 * 192);
  dQ.fill(0), dK.fill(0), dV.fill(0);
  d.buffer(4, L.p).buffer(5, O.p).buffer(6, L.p).buffer(7, dQ.p).buffer(8, dK.p).buffer(9, dV.p);
  if (!tt::run(d, bwd_kernel(192, 128), "flash_attn_train_bwd d192_dv128")) return;
  bool bwd_nan = true;
  for (int e = 0; e < 20 * 192; e++) bwd_nan &= std::isnan(dQ[e]) && dK[e] == 0 && dV[e] == 0;
  tt::expect(bwd_nan, "backward: dQ must be NaN, dK and dV untouched");
  if (nan && bwd_nan) std::printf("  ok forward O, L and backward dQ NaN\n");
}

/* Tiles wholly outside the window are never visited: NaN in the K and V rows
 * of such tiles leaves every result bitwise unchanged. A visited tile would
 * make the backward's dQ and dK NaN (dS = P (dP - D) with P = 0 and dP NaN);
 * the forward passes over a tile with no visible key unchanged either way, so
 * there it is checked for being unchanged only. One q-tile of 32 rows,
 * kL = 96, W = 20, qL_off = 64: row 0 sees keys from 45 on, so key tiles 0
 * and 1 (keys 0..31) are outside for every row. */
static void window_skips_tiles() {
  std::printf("window: key tiles wholly outside are skipped\n");
  const int qL = 32, kL = 96, D = 64;
  tg_attn_params p;
  tg_attn_params_init(&p, 1, 1, 1, qL, kL, D, 0.125f);
  const uint32_t vparams[2] = {20, 0};
  tt::Rng rng(tt::seed() + 96);
  Buf<uint16_t> Q(qL * D), K(kL * D), V(kL * D), dO(qL * D), O[2] = {Buf<uint16_t>(qL * D), Buf<uint16_t>(qL * D)};
  Buf<float> L[2] = {Buf<float>(qL), Buf<float>(qL)}, Dvec(qL), dQ[2] = {Buf<float>(qL * D), Buf<float>(qL * D)},
             dK[2] = {Buf<float>(kL * D), Buf<float>(kL * D)}, dV[2] = {Buf<float>(kL * D), Buf<float>(kL * D)};
  tt::fill_bf16(rng, Q, -1.5, 1.5);
  tt::fill_bf16(rng, K, -1.5, 1.5);
  tt::fill_bf16(rng, V, -1, 1);
  tt::fill_bf16(rng, dO, -1, 1);
  tt::fill_uniform(rng, Dvec, -0.5, 0.5);
  for (int run = 0; run < 2; run++) {
    if (run == 1)
      for (int e = 0; e < 32 * D; e++) K[e] = V[e] = 0x7FC0; /* NaN in keys 0..31 */
    dK[run].fill(0), dV[run].fill(0);
    mtl_sim::Dispatch d;
    d.grid((uint)p.NQ, 1, 1).tg(128).buffer(10, &p).buffer(13, vparams).constant(302, true);
    d.constant(200, true).constant(201, true).constant(300, false).constant(301, false);
    d.buffer(0, Q.p).buffer(1, K.p).buffer(2, V.p).buffer(3, O[run].p).buffer(4, L[run].p);
    if (!tt::run(d, fwd_kernel(D, D), "window fwd")) return;
    d.buffer(5, dO.p).buffer(6, Dvec.p).buffer(7, dQ[run].p).buffer(8, dK[run].p).buffer(9, dV[run].p);
    if (!tt::run(d, bwd_kernel(D, D), "window bwd")) return;
  }
  tt::check_bitwise("O", O[1].p, O[0].p, O[0].n * 2);
  tt::check_bitwise("L", L[1].p, L[0].p, L[0].n * 4);
  tt::check_bitwise("dQ", dQ[1].p, dQ[0].p, dQ[0].n * 4);
  tt::check_bitwise("dK", dK[1].p, dK[0].p, dK[0].n * 4);
  tt::check_bitwise("dV", dV[1].p, dV[0].p, dV[0].n * 4);
}

int main() {
  tt::Ctx ctx;
  const Problem problems[] = {
      /* name                                  B  H Hkv qL  kL   D   Dv causal mask  strided softcap qL_off_d W  sinks */
      {"tails",                                1, 2, 2, 37, 37,  64, 0, false, false, false, 1.0f, 0, 0, NO_SINKS},
      {"gqa causal mask",                      2, 4, 2, 40, 50,  64, 0, true,  true,  false, 1.0f, 0, 0, NO_SINKS},
      {"d256 causal qL>kL softcap",            1, 2, 1, 33, 20, 256, 0, true,  false, false, 20.0f, 0, 0, NO_SINKS},
      {"aligned strided mask",                 2, 2, 1, 64, 32,  64, 0, false, true,  true,  1.0f, 0, 0, NO_SINKS},
      {"d256 strided causal mask qL_off-3",    1, 3, 3, 35, 35, 256, 0, true,  true,  true,  1.0f, -3, 0, NO_SINKS},
      /* sliding window: tiles before the window are skipped */
      {"window qL<kL qL_off+5",                1, 2, 2, 37, 90,  64, 0, false, false, false, 1.0f, 5, 20, NO_SINKS},
      {"window causal qL_off-6 sinks",         1, 2, 1, 40, 64,  64, 0, true,  false, false, 1.0f, -6, 12, SINKS},
      {"window causal gqa mask",               2, 4, 2, 40, 75,  64, 0, true,  true,  false, 1.0f, 0, 17, NO_SINKS},
      {"d256 window causal qL>kL softcap",     1, 2, 1, 50, 30, 256, 0, true,  false, false, 20.0f, 0, 9, NO_SINKS},
      {"window 1 causal",                      1, 2, 1, 33, 40,  64, 0, true,  false, false, 1.0f, 0, 1, NO_SINKS},
      {"window past every key, strided",       1, 2, 2, 35, 70,  64, 0, false, true,  true,  1.0f, 0, 1000, NO_SINKS},
      /* sinks */
      {"sinks gqa",                            2, 4, 2, 37, 45,  64, 0, false, false, false, 1.0f, 0, 0, SINKS},
      {"sinks causal qL>kL (rows see no key)", 1, 3, 3, 45, 20,  64, 0, true,  true,  false, 1.0f, 0, 0, SINKS},
      {"sinks NaN +inf -inf",                  1, 4, 2, 33, 40,  64, 0, true,  false, false, 1.0f, 0, 0, SINKS_NONFINITE},
      /* Dv != D (MLA) */
      {"d192 dv128",                           1, 2, 2, 37, 37, 192, 128, false, false, false, 1.0f, 0, 0, NO_SINKS},
      {"d192 dv128 causal gqa strided mask",   2, 4, 2, 40, 50, 192, 128, true, true, true,  1.0f, -3, 0, NO_SINKS},
      /* combinations */
      {"window sinks causal mask strided",     1, 4, 2, 45, 80,  64, 0, true,  true,  true,  1.0f, 0, 24, SINKS},
      {"d256 window sinks softcap",            1, 2, 2, 33, 50, 256, 0, false, false, false, 30.0f, 0, 16, SINKS},
      {"d192 dv128 window sinks causal gqa",   2, 4, 2, 40, 70, 192, 128, true, true, false, 1.0f, 0, 19, SINKS},
      {"d192 dv128 window sinks NaN +inf",     1, 4, 1, 36, 36, 192, 128, false, false, true, 1.0f, 0, 10, SINKS_NONFINITE},
  };
  for (const auto &pb : problems) run_problem(ctx, pb);
  window_skips_tiles();
  wrong_kernel_is_nan();
  return tt::finish("metal_attention");
}
