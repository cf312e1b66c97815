/* Twins of RoPE (rope.metal) and the gated linear units (glu.metal), run
 * through the simulator against the C engine on small shapes: both RoPE
 * layouts and directions, partial rotary, strided ([B, L, H, D] storage) x,
 * broadcast and per-batch tables, bf16 and f32, in place; GLU silu and
 * gelu_tanh, forward and backward, fused gate_up views, bf16 and f32.
 *
 * Tolerances (u = 2^-24). Each side is within its own bound of the exact
 * value, so they differ by at most twice it:
 *   RoPE: each output is p1 + p2 rounded from two rounded products on both
 *   sides: 2 * 2.0001 u (|p1| + |p2|); a bf16 output, one bf16 ulp more
 *   (the two f32 values may round to neighbours), |y| 2^-7.
 *   GLU: test_glu.c's bound (exp within 2 ulp on the C side; the shim's
 *   precise::exp is libm's, within 1) taken twice, plus a bf16 ulp. */
#include "twin_test.h"

namespace m_rope {
#include "rope.metal.cc"
}
namespace m_glu {
#include "glu.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;
using tt::U;

static double get(const void *p, int t, size_t i) {
  return t == TG_DTYPE_F32 ? (double)((const float *)p)[i] : (double)tt::bf2f(((const uint16_t *)p)[i]);
}

/* ---- RoPE ------------------------------------------------------------------ */
static void test_rope(tg_ctx *ctx, int B, int H, int L, int D, int R, int layout, int xt, int tt_,
                      int yt, bool bwd, bool transposed, bool tbatch, bool in_place) {
  std::printf("rope %s %s B%d H%d L%d D%d R%d x%d t%d y%d transposed %d tbatch %d in_place %d\n",
              bwd ? "bwd" : "fwd", layout ? "pairs" : "half", B, H, L, D, R, xt, tt_, yt,
              transposed, tbatch, in_place);
  tt::Rng rng(tt::seed() + B * 7 + H * 31 + L * 131 + D * 17 + R + layout * 5 + bwd);
  tg_rope_params p;
  if (tg_rope_params_init(&p, B, H, L, D, R, (tg_rope_layout)layout) != TG_OK) {
    tt::fail("tg_rope_params_init");
    return;
  }
  p.x_dtype = xt, p.y_dtype = yt, p.table_dtype = tt_;
  if (transposed) {
    p.x_strides[0] = (int64_t)L * H * D, p.x_strides[1] = D, p.x_strides[2] = (int64_t)H * D;
    std::memcpy(p.y_strides, p.x_strides, sizeof p.x_strides);
  }
  const int nt = tbatch ? B : 1;
  if (tbatch) p.cos_strides[0] = p.sin_strides[0] = (int64_t)L * R;
  const size_t n = (size_t)B * H * L * D, ntab = (size_t)nt * L * R;
  const size_t ex = xt == TG_DTYPE_F32 ? 4 : 2, ey = yt == TG_DTYPE_F32 ? 4 : 2, et = tt_ == TG_DTYPE_F32 ? 4 : 2;
  Buf<uint8_t> x(n * ex), c(ntab * et), s(ntab * et), y_c(n * ey), y_m(n * ey);
  for (size_t i = 0; i < n; i++)
    if (xt == TG_DTYPE_F32) ((float *)x.p)[i] = (float)rng.uni(-3, 3);
    else ((uint16_t *)x.p)[i] = tt::f2bf((float)rng.uni(-3, 3));
  for (size_t i = 0; i < ntab; i++) {
    const float cv = (float)rng.uni(-1.5, 1.5), sv = (float)rng.uni(-1.5, 1.5);
    if (tt_ == TG_DTYPE_F32) ((float *)c.p)[i] = cv, ((float *)s.p)[i] = sv;
    else ((uint16_t *)c.p)[i] = tt::f2bf(cv), ((uint16_t *)s.p)[i] = tt::f2bf(sv);
  }
  const void *xin_c = x.p, *xin_m = x.p;
  if (in_place) { /* same dtype: y starts as x */
    std::memcpy(y_c.p, x.p, n * ex), std::memcpy(y_m.p, x.p, n * ex);
    xin_c = y_c.p, xin_m = y_m.p;
  }
  TT_C(ctx, bwd ? tg_rope_backward(ctx, xin_c, c.p, s.p, y_c.p, &p)
                : tg_rope_forward(ctx, xin_c, c.p, s.p, y_c.p, &p));
  mtl_sim::Dispatch d;
  const uint nx = (uint)(R / 2 + D - R), tgx = 8;
  d.grid((nx + tgx - 1) / tgx, (uint)L, (uint)(B * H)).tg(tgx).buffer(0, xin_m).buffer(1, c.p)
      .buffer(2, s.p).buffer(3, y_m.p).buffer(4, &p);
  if (!tt::run(d, bwd ? [] { m_rope::rope_backward(); } : [] { m_rope::rope_forward(); }, "rope"))
    return;
  /* logical outputs and bounds */
  std::vector<float> gm(n), gc(n);
  std::vector<double> bound(n);
  const int h = R / 2;
  for (int b = 0; b < B; b++)
    for (int hh = 0; hh < H; hh++)
      for (int l = 0; l < L; l++) {
        const size_t yo = b * p.y_strides[0] + hh * p.y_strides[1] + l * p.y_strides[2];
        const size_t xo = b * p.x_strides[0] + hh * p.x_strides[1] + l * p.x_strides[2];
        const size_t to = (tbatch ? b : 0) * (size_t)L * R + (size_t)l * R;
        for (int j = 0; j < D; j++) {
          const size_t o = (((size_t)b * H + hh) * L + l) * D + j;
          gm[o] = (float)get(y_m.p, yt, yo + j), gc[o] = (float)get(y_c.p, yt, yo + j);
          if (j >= R) { bound[o] = yt == TG_DTYPE_BF16 ? std::fabs(gc[o]) * 0x1p-7 : 0; continue; }
          const int partner = layout == 0 ? (j < h ? j + h : j - h) : (j ^ 1);
          const double mag = std::fabs(get(x.p, xt, xo + j) * get(c.p, tt_, to + j)) +
                             std::fabs(get(x.p, xt, xo + partner)) *
                                 std::max(std::fabs(get(s.p, tt_, to + j)), std::fabs(get(s.p, tt_, to + partner)));
          bound[o] = 2 * 2.0001 * U * mag + 1e-40 + (yt == TG_DTYPE_BF16 ? std::fabs(gc[o]) * 0x1p-7 : 0);
        }
      }
  char what[96];
  std::snprintf(what, sizeof what, "rope %s", bwd ? "backward" : "forward");
  tt::check(what, gm.data(), gc.data(), [&](size_t i) { return bound[i]; }, n);
}

/* ---- GLU ------------------------------------------------------------------- */
struct GluParamsHost { /* glu.metal's GluParams */
  uint32_t rows, cols;
  int32_t act, dtype;
  int64_t gate_stride, up_stride, y_stride, dgate_stride, dup_stride;
};

static double glu_bound(int act, double g, double up, double dy, int which /* 0 y, 1 dup, 2 dg */) {
  const double K2 = 1.5957691216057308, A = 0.044715;
  const double z = act == 0 ? g : K2 * (g + A * g * g * g);
  const double S = 1 / (1 + std::exp(-z)), Sc = 1 / (1 + std::exp(z));
  const double eS = 9 * U + (act == 0 ? 0 : 7 * U * std::fabs(z));
  if (which < 2) return (eS + 2 * U) * std::fabs(g * S * (which ? dy : up)) + 1e-38;
  double eda;
  if (act == 0) {
    eda = S * (2 * eS + 2 * U) * (1 + std::fabs(g * Sc));
  } else {
    const double T = g * S * Sc * K2 * (1 + 3 * A * g * g);
    eda = (2 * eS + 9 * U) * (S + std::fabs(T));
  }
  return std::fabs(dy * up) * (eda + 2 * U * 2) + 1e-38;
}

static void test_glu(tg_ctx *ctx, int act, int dtype, uint32_t rows, uint32_t cols, bool fused) {
  std::printf("glu %s %s rows=%u cols=%u fused %d\n", act ? "gelu_tanh" : "silu",
              dtype ? "f32" : "bf16", rows, cols, fused);
  tt::Rng rng(tt::seed() + rows * 7 + cols * 13 + act * 3 + dtype);
  const size_t e = dtype == TG_DTYPE_F32 ? 4 : 2, n = (size_t)rows * cols;
  const int64_t gs = fused ? 2 * cols : cols, us = gs;
  Buf<uint8_t> gu((size_t)rows * 2 * cols * e), dy(n * e);
  Buf<uint8_t> y_c(n * e), y_m(n * e), dg_c(n * e), dg_m(n * e), du_c(n * e), du_m(n * e);
  auto put = [&](uint8_t *p, size_t i, float v) {
    if (dtype == TG_DTYPE_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = tt::f2bf(v);
  };
  for (size_t i = 0; i < (size_t)rows * 2 * cols; i++)
    put(gu.p, i, (float)(rng.range(0, 9) == 0 ? rng.uni(-100, 100) : rng.uni(-7, 7)));
  for (size_t i = 0; i < n; i++) put(dy.p, i, (float)rng.uni(-2, 2));
  const uint8_t *G = gu.p, *Up = gu.p + (fused ? cols : (size_t)rows * cols) * e;
  TT_C(ctx, tg_glu_forward(ctx, G, Up, y_c.p, (tg_glu_act)act, (tg_dtype)dtype, rows, cols, gs, us, cols));
  TT_C(ctx, tg_glu_backward(ctx, G, Up, dy.p, dg_c.p, du_c.p, (tg_glu_act)act, (tg_dtype)dtype, rows,
                            cols, gs, us, cols, cols, cols));
  GluParamsHost p = {rows, cols, act, dtype, gs, us, (int64_t)cols, (int64_t)cols, (int64_t)cols};
  const uint tgx = 16;
  {
    mtl_sim::Dispatch d;
    d.grid((cols + tgx - 1) / tgx, rows, 1).tg(tgx).buffer(0, G).buffer(1, Up).buffer(2, y_m.p).buffer(3, &p);
    if (!tt::run(d, [] { m_glu::glu_forward(); }, "glu_forward")) return;
  }
  {
    mtl_sim::Dispatch d;
    d.grid((cols + tgx - 1) / tgx, rows, 1).tg(tgx).buffer(0, G).buffer(1, Up).buffer(2, dy.p)
        .buffer(3, dg_m.p).buffer(4, du_m.p).buffer(5, &p);
    if (!tt::run(d, [] { m_glu::glu_backward(); }, "glu_backward")) return;
  }
  const char *names[3] = {"glu y", "glu dup", "glu dgate"};
  const uint8_t *outs_m[3] = {y_m.p, du_m.p, dg_m.p}, *outs_c[3] = {y_c.p, du_c.p, dg_c.p};
  for (int w = 0; w < 3; w++) {
    std::vector<float> gm(n), gc(n);
    std::vector<double> bound(n);
    for (uint32_t r = 0; r < rows; r++)
      for (uint32_t j = 0; j < cols; j++) {
        const size_t o = (size_t)r * cols + j;
        gm[o] = (float)get(outs_m[w], dtype, o), gc[o] = (float)get(outs_c[w], dtype, o);
        const double g = get(G, dtype, r * gs + j), u = get(Up, dtype, r * us + j), d = get(dy.p, dtype, o);
        bound[o] = 2 * glu_bound(act, g, u, d, w) + (dtype == TG_DTYPE_BF16 ? std::fabs(gc[o]) * 0x1p-7 : 0);
      }
    tt::check(names[w], gm.data(), gc.data(), [&](size_t i) { return bound[i]; }, n);
  }
}

int main() {
  tt::Ctx ctx;
  const int F = TG_DTYPE_F32, Bf = TG_DTYPE_BF16;
  test_rope(ctx, 1, 2, 3, 8, 8, 0, F, F, F, false, false, false, false);
  test_rope(ctx, 2, 3, 5, 64, 64, 0, Bf, Bf, Bf, false, true, true, false);
  test_rope(ctx, 2, 3, 5, 64, 64, 0, Bf, Bf, Bf, true, true, true, false);
  test_rope(ctx, 1, 2, 7, 80, 32, 0, F, Bf, F, false, false, false, false);
  test_rope(ctx, 1, 2, 7, 80, 32, 0, F, Bf, F, true, false, false, false);
  test_rope(ctx, 2, 2, 4, 48, 48, 1, Bf, F, F, false, false, true, false);
  test_rope(ctx, 2, 2, 4, 48, 48, 1, Bf, F, F, true, false, true, false);
  test_rope(ctx, 1, 4, 9, 128, 128, 0, Bf, Bf, Bf, false, true, false, true);
  test_rope(ctx, 1, 4, 9, 40, 24, 1, F, F, F, true, false, false, true);
  for (int act = 0; act <= 1; act++) {
    test_glu(ctx, act, F, 3, 37, true);
    test_glu(ctx, act, Bf, 5, 100, false);
    test_glu(ctx, act, F, 1, 1, false);
  }
  return tt::finish("test_metal_rope_glu");
}
