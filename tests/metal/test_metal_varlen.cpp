/* The varlen twins (metal/flash_attn_train_fwd.metal, attn_varlen_fwd_bf16_d64
 * / _d256; metal/flash_attn_train_bwd.metal, attn_varlen_bwd_bf16_d64 / _d256):
 * packed documents, one threadgroup column per document (grid z). The
 * forward against
 *   - the dense twin (flash_attn_train_fwd_bf16_*) on each document's rows
 *     as a B = 1 problem: bitwise, since each document is exactly that
 *     problem (test_metal_attention holds the dense twin to the C engine
 *     and the f64 reference);
 *   - tilegrad's tg_attn_varlen_fwd: O within one bf16 rounding step plus
 *     the dense twins' bound's order (2^-7 |O| + 2^-12: the C engine sums in
 *     another order, and f32 values a hair apart can round to neighbouring
 *     bf16s), L within 2^-16 (1 + |L|);
 * and the contract of empty documents (no keys: O 0, L the sink or -inf; no
 * queries: nothing written). The backward (dQ written, dK, dV accumulated
 * atomically, d_sinks) against the dense backward twin on each document's
 * rows, bitwise: the simulator runs one threadgroup at a time here, so each
 * dK, dV element takes its document's atomic adds in the same order in
 * both (a document's threadgroups keep their dense grid's order). Ragged
 * lengths, causal with len_q != len_k, GQA, a window, sinks, softcap, D 64
 * and 256. */
#include "twin_test.h"

namespace m_fwd {
#include "flash_attn_train_fwd.metal.cc"
}
namespace m_bwd {
#include "flash_attn_train_bwd.metal.cc"
}
#include "metal_shim_end.h"

#include <algorithm>
#include <vector>

using tt::Buf;

struct Case {
  const char *name;
  int H, Hkv, D;
  bool causal;
  uint32_t window;
  float softcap;
  bool sinks;
  std::vector<int> lq, lk;
};

static void (*dense_kernel(int D))() {
  return D == 64 ? +[] { m_fwd::flash_attn_train_fwd_bf16_d64(); }
                 : +[] { m_fwd::flash_attn_train_fwd_bf16_d256(); };
}
static void (*varlen_kernel(int D))() {
  return D == 64 ? +[] { m_fwd::attn_varlen_fwd_bf16_d64(); }
                 : +[] { m_fwd::attn_varlen_fwd_bf16_d256(); };
}
static void (*dense_bwd_kernel(int D))() {
  return D == 64 ? +[] { m_bwd::flash_attn_train_bwd_bf16_d64(); }
                 : +[] { m_bwd::flash_attn_train_bwd_bf16_d256(); };
}
static void (*varlen_bwd_kernel(int D))() {
  return D == 64 ? +[] { m_bwd::attn_varlen_bwd_bf16_d64(); }
                 : +[] { m_bwd::attn_varlen_bwd_bf16_d256(); };
}

static void set_packed_strides(tg_attn_params *p, int H, int Hkv, int D) {
  const int64_t q[3] = {0, D, (int64_t)H * D}, k[3] = {0, D, (int64_t)Hkv * D};
  for (int a = 0; a < 3; a++)
    p->Q_strides[a] = q[a], p->O_strides[a] = q[a], p->K_strides[a] = k[a], p->V_strides[a] = k[a];
}

static void run_case(tg_ctx *ctx, const Case &c) {
  const int H = c.H, Hkv = c.Hkv, D = c.D, n = (int)c.lq.size();
  std::vector<int32_t> cu_q(n + 1, 0), cu_k(n + 1, 0);
  for (int d = 0; d < n; d++) cu_q[d + 1] = cu_q[d] + c.lq[d], cu_k[d + 1] = cu_k[d] + c.lk[d];
  const int tq = cu_q[n], tk = cu_k[n];
  const int max_q = *std::max_element(c.lq.begin(), c.lq.end());
  std::printf("%s: H=%d H_kv=%d D=%d, %d documents, %d x %d rows\n", c.name, H, Hkv, D, n, tq, tk);
  tt::Rng rng(tt::seed() + (uint64_t)(tq * 31 + tk * 7 + D + H));
  Buf<uint16_t> Q((size_t)tq * H * D), K((size_t)tk * Hkv * D), V((size_t)tk * Hkv * D);
  tt::fill_bf16(rng, Q, -1.5, 1.5), tt::fill_bf16(rng, K, -1.5, 1.5), tt::fill_bf16(rng, V, -1, 1);
  Buf<float> sinks(H);
  for (int h = 0; h < H; h++) sinks[h] = (float)rng.uni(-1, 3);
  Buf<int32_t> cq(n + 1), ck(n + 1);
  for (int d = 0; d <= n; d++) cq[d] = cu_q[d], ck[d] = cu_k[d];

  tg_attn_params p;
  tg_attn_params_init(&p, 1, H, Hkv, tq, tk, D, 1.0f / std::sqrt((float)D));
  p.softcapping = c.softcap;
  set_packed_strides(&p, H, Hkv, D);
  /* a document's rows as a dense B = 1 problem of its lengths */
  auto doc_params = [&](int lq, int lk) {
    tg_attn_params pd;
    tg_attn_params_init(&pd, 1, H, Hkv, lq, lk, D, p.scale);
    pd.softcapping = c.softcap;
    set_packed_strides(&pd, H, Hkv, D);
    return pd;
  };
  const uint32_t vparams[2] = {c.window, 0};
  auto variants = [&](mtl_sim::Dispatch &d) {
    if (c.window) d.constant(302, true).buffer(13, vparams);
    if (c.sinks) d.constant(303, true).buffer(14, sinks.p);
  };

  Buf<uint16_t> O_m((size_t)tq * H * D), O_c((size_t)tq * H * D);
  Buf<float> L_m((size_t)H * tq), L_c((size_t)H * tq);
  {
    mtl_sim::Dispatch d;
    d.grid((uint)((max_q + 31) / 32), (uint)H, (uint)n).tg(128).buffer(0, Q.p).buffer(1, K.p)
        .buffer(2, V.p).buffer(3, O_m.p).buffer(4, L_m.p).buffer(10, &p).buffer(15, cq.p)
        .buffer(16, ck.p);
    d.constant(200, false).constant(201, false).constant(300, false).constant(301, c.causal);
    variants(d);
    tt::run(d, varlen_kernel(D), c.name);
  }
  tg_attn_options opt = {};
  opt.window = c.window;
  opt.sinks = c.sinks ? sinks.p : nullptr;
  const tg_attn_varlen docs = {cu_q.data(), cu_k.data(), n, 0, nullptr};
  TT_C(ctx, tg_attn_varlen_fwd(ctx, TG_DTYPE_BF16, Q.p, K.p, V.p, O_c.p, L_c.p, &p, &docs,
                               c.causal, &opt));

  for (int d = 0; d < n; d++) {
    const int lq = c.lq[d], lk = c.lk[d];
    char what[160];
    if (!lq) continue;
    const size_t orow = (size_t)cu_q[d] * H * D, on = (size_t)lq * H * D;
    if (!lk) { /* no keys: O 0, L the sink or -inf */
      bool ok = true;
      for (size_t e = 0; e < on; e++) ok &= O_m[orow + e] == 0;
      for (int h = 0; h < H; h++)
        for (int i = 0; i < lq; i++) {
          const float want = c.sinks ? sinks[h] : -INFINITY;
          ok &= std::memcmp(&L_m[(size_t)h * tq + cu_q[d] + i], &want, 4) == 0;
        }
      std::snprintf(what, sizeof what, "%s: document %d without keys", c.name, d);
      tt::expect(ok, what);
      continue;
    }
    /* the document as a dense B = 1 problem on its rows */
    const tg_attn_params pd = doc_params(lq, lk);
    Buf<uint16_t> Od(on);
    Buf<float> Ld((size_t)H * lq);
    mtl_sim::Dispatch dd;
    dd.grid((uint)pd.NQ, (uint)H, 1).tg(128).buffer(0, Q.p + orow)
        .buffer(1, K.p + (size_t)cu_k[d] * Hkv * D).buffer(2, V.p + (size_t)cu_k[d] * Hkv * D)
        .buffer(3, Od.p).buffer(4, Ld.p).buffer(10, &pd);
    dd.constant(200, lq % 32 == 0).constant(201, lk % 16 == 0).constant(300, false)
        .constant(301, c.causal);
    variants(dd);
    if (!tt::run(dd, dense_kernel(D), c.name)) continue;
    std::snprintf(what, sizeof what, "%s: document %d O (%d x %d) = the dense twin's", c.name, d,
                  lq, lk);
    tt::check_bitwise(what, O_m.p + orow, Od.p, on * 2);
    bool same_L = true;
    for (int h = 0; h < H; h++)
      same_L &= std::memcmp(&L_m[(size_t)h * tq + cu_q[d]], &Ld[(size_t)h * lq], 4 * (size_t)lq) == 0;
    std::snprintf(what, sizeof what, "%s: document %d L = the dense twin's", c.name, d);
    tt::expect(same_L, what);
  }
  /* against the C engine's varlen forward */
  std::vector<float> om(O_m.n), oc(O_c.n);
  for (size_t e = 0; e < O_m.n; e++) om[e] = tt::bf2f(O_m[e]), oc[e] = tt::bf2f(O_c[e]);
  std::string w = std::string(c.name) + ": O vs tg_attn_varlen_fwd";
  tt::check(w.c_str(), om.data(), oc.data(),
            [&](size_t i) { return 0x1p-7 * std::fabs(oc[i]) + 0x1p-12; }, om.size());
  w = std::string(c.name) + ": L vs tg_attn_varlen_fwd";
  tt::check(w.c_str(), L_m.p, L_c.p,
            [&](size_t i) { return 0x1p-16 * (1 + std::fabs(L_c[i])); }, L_m.n);

  /* ---- the backward, from the twin's O and L ---- */
  Buf<uint16_t> dO((size_t)tq * H * D);
  tt::fill_bf16(rng, dO, -1, 1);
  Buf<float> Dv((size_t)H * tq); /* D_vec [H, total_q] = rowsum(dO o O) */
  for (int h = 0; h < H; h++)
    for (int t = 0; t < tq; t++) {
      double acc = 0;
      for (int x = 0; x < D; x++)
        acc += (double)tt::bf2f(dO[((size_t)t * H + h) * D + x]) * tt::bf2f(O_m[((size_t)t * H + h) * D + x]);
      Dv[(size_t)h * tq + t] = (float)acc;
    }
  Buf<float> dQ((size_t)tq * H * D), dK((size_t)tk * Hkv * D), dV((size_t)tk * Hkv * D), ds(H);
  dK.fill(0), dV.fill(0), ds.fill(0);
  auto bwd_variants = [&](mtl_sim::Dispatch &d, float *d_sinks) {
    variants(d);
    if (c.sinks) d.constant(304, true).buffer(15, d_sinks);
  };
  {
    mtl_sim::Dispatch d;
    d.workers = 1;
    d.grid((uint)((max_q + 31) / 32), (uint)H, (uint)n).tg(128).buffer(0, Q.p).buffer(1, K.p)
        .buffer(2, V.p).buffer(4, L_m.p).buffer(5, dO.p).buffer(6, Dv.p).buffer(7, dQ.p)
        .buffer(8, dK.p).buffer(9, dV.p).buffer(10, &p).buffer(16, cq.p).buffer(17, ck.p);
    d.constant(200, false).constant(201, false).constant(300, false).constant(301, c.causal);
    bwd_variants(d, ds.p);
    tt::run(d, varlen_bwd_kernel(D), c.name);
  }
  Buf<float> ds_dense(H);
  ds_dense.fill(0);
  for (int d = 0; d < n; d++) {
    const int lq = c.lq[d], lk = c.lk[d];
    char what[160];
    if (!lq) continue;
    if (!lk) {
      bool zero = true;
      for (size_t e = 0; e < (size_t)lq * H * D; e++) zero &= dQ[(size_t)cu_q[d] * H * D + e] == 0.0f;
      std::snprintf(what, sizeof what, "%s: document %d without keys: dQ 0", c.name, d);
      tt::expect(zero, what);
      continue;
    }
    /* the dense twin on the document's rows, its own [B, H, L, D] buffers */
    const tg_attn_params pd = doc_params(lq, lk);
    Buf<float> Ld((size_t)H * lq), Dd((size_t)H * lq), dQd((size_t)H * lq * D),
        dKd((size_t)Hkv * lk * D), dVd((size_t)Hkv * lk * D);
    for (int h = 0; h < H; h++)
      for (int i = 0; i < lq; i++) {
        Ld[(size_t)h * lq + i] = L_m[(size_t)h * tq + cu_q[d] + i];
        Dd[(size_t)h * lq + i] = Dv[(size_t)h * tq + cu_q[d] + i];
      }
    dKd.fill(0), dVd.fill(0);
    mtl_sim::Dispatch dd;
    dd.workers = 1;
    dd.grid((uint)pd.NQ, (uint)H, 1).tg(128).buffer(0, Q.p + (size_t)cu_q[d] * H * D)
        .buffer(1, K.p + (size_t)cu_k[d] * Hkv * D).buffer(2, V.p + (size_t)cu_k[d] * Hkv * D)
        .buffer(4, Ld.p).buffer(5, dO.p + (size_t)cu_q[d] * H * D).buffer(6, Dd.p)
        .buffer(7, dQd.p).buffer(8, dKd.p).buffer(9, dVd.p).buffer(10, &pd);
    dd.constant(200, lq % 32 == 0).constant(201, lk % 16 == 0).constant(300, false)
        .constant(301, c.causal);
    bwd_variants(dd, ds_dense.p);
    if (!tt::run(dd, dense_bwd_kernel(D), c.name)) continue;
    bool same = true; /* dense [H, L, D] against packed [total, H, D] */
    for (int h = 0; h < H; h++)
      for (int i = 0; i < lq; i++)
        same &= std::memcmp(&dQd[((size_t)h * lq + i) * D],
                            &dQ[(((size_t)cu_q[d] + i) * H + h) * D], 4 * (size_t)D) == 0;
    for (int h = 0; h < Hkv; h++)
      for (int j = 0; j < lk; j++) {
        same &= std::memcmp(&dKd[((size_t)h * lk + j) * D],
                            &dK[(((size_t)cu_k[d] + j) * Hkv + h) * D], 4 * (size_t)D) == 0;
        same &= std::memcmp(&dVd[((size_t)h * lk + j) * D],
                            &dV[(((size_t)cu_k[d] + j) * Hkv + h) * D], 4 * (size_t)D) == 0;
      }
    std::snprintf(what, sizeof what, "%s: document %d dQ, dK, dV (%d x %d) = the dense twin's",
                  c.name, d, lq, lk);
    tt::expect(same, what);
    if (same) std::printf("  ok %s (bitwise)\n", what);
  }
  if (c.sinks) { /* the same adds, document after document */
    bool same = std::memcmp(ds.p, ds_dense.p, 4 * (size_t)H) == 0;
    w = std::string(c.name) + ": d_sinks = the dense twins' in document order";
    tt::expect(same, w.c_str());
  }
}

int main() {
  tt::Ctx ctx;
  const Case cases[] = {
      {"ragged causal gqa, length 1, empty", 4, 2, 64, true, 0, 1.0f, false,
       {1, 0, 37, 70, 32}, {1, 0, 37, 70, 32}},
      {"causal len_q != len_k, window 12, sinks", 2, 1, 64, true, 12, 1.0f, true,
       {5, 40, 17, 9}, {9, 40, 33, 0}},
      {"d256 full, softcap 20", 2, 2, 256, false, 0, 20.0f, false, {20, 3, 33}, {24, 7, 16}},
  };
  for (const auto &c : cases) run_case(ctx, c);
  return tt::finish("metal_varlen");
}
