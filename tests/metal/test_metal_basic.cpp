/* Twins of the exact kernels: f32_to_bf16_cast (metal/cast.metal) and
 * transpose_2d (metal/transpose.metal). Both must be bitwise equal to the C
 * engine: the cast is integer arithmetic on the bits, the transpose a copy.
 * Inputs include the special values (+-0, +-inf, NaN with payloads,
 * subnormals, values that round to inf), tails (sizes not a multiple of the
 * threadgroup/tile), and guard-paged buffers catch any access past the end. */
#include "twin_test.h"

namespace m_cast {
#include "cast.metal.cc"
}
namespace m_transpose {
#include "transpose.metal.cc"
}
#include "metal_shim_end.h"

using tt::Buf;

static void fill_special(tt::Rng &r, Buf<float> &x) {
  static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u,
                                      0x7FC01234u, 0xFF812345u, 0x7F800001u, 0x00000001u,
                                      0x807FFFFFu, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u,
                                      0x3F80FFFFu};
  for (size_t i = 0; i < x.n; i++) {
    if (r.next() % 8 == 0) {
      const uint32_t b = specials[r.next() % (sizeof specials / sizeof specials[0])];
      std::memcpy(&x[i], &b, 4);
    } else {
      x[i] = (float)r.uni(-1e4, 1e4) * (float)std::ldexp(1.0, r.range(-30, 30));
    }
  }
}

static void test_cast(tg_ctx *ctx) {
  std::printf("f32_to_bf16_cast\n");
  for (uint32_t n : {1u, 255u, 256u, 1000u, 4097u}) {
    tt::Rng r(tt::seed() + n);
    Buf<float> src(n);
    Buf<uint16_t> dst(n), want(n);
    fill_special(r, src);
    TT_C(ctx, tg_f32_to_bf16_cast(ctx, src.p, want.p, n));
    Buf<uint32_t> nbuf(1);
    nbuf[0] = n;
    mtl_sim::Dispatch d;
    d.grid((n + 255) / 256, 1, 1).tg(256).buffer(0, src.p).buffer(1, dst.p).buffer(2, nbuf.p);
    if (!tt::run(d, [] { m_cast::f32_to_bf16_cast(); }, "f32_to_bf16_cast")) continue;
    char what[64];
    snprintf(what, sizeof what, "cast n=%u", n);
    tt::check_bitwise(what, dst.p, want.p, n * 2);
  }
}

static void test_transpose(tg_ctx *ctx) {
  std::printf("transpose_2d\n");
  const uint32_t shapes[][2] = {{1, 1}, {1, 37}, {37, 1}, {32, 32}, {33, 47}, {64, 96}, {5, 130}};
  for (auto &s : shapes) {
    const uint32_t rows = s[0], cols = s[1];
    tt::Rng r(tt::seed() + rows * 1000 + cols);
    Buf<float> in((size_t)rows * cols), out((size_t)rows * cols), want((size_t)rows * cols);
    fill_special(r, in);
    TT_C(ctx, tg_transpose_2d(ctx, in.p, want.p, rows, cols));
    Buf<uint32_t> params(2);
    params[0] = rows;
    params[1] = cols;
    mtl_sim::Dispatch d;
    d.grid((cols + 31) / 32, (rows + 31) / 32, 1).tg(32, 8).buffer(0, in.p).buffer(1, out.p).buffer(2, params.p);
    if (!tt::run(d, [] { m_transpose::transpose_2d(); }, "transpose_2d")) continue;
    char what[64];
    snprintf(what, sizeof what, "transpose %ux%u", rows, cols);
    tt::check_bitwise(what, out.p, want.p, (size_t)rows * cols * 4);
  }
}

int main() {
  tt::Ctx ctx;
  test_cast(ctx);
  test_transpose(ctx);
  return tt::finish("metal_basic");
}
