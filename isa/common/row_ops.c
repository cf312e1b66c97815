/*
 * Row ops of the memory-bound kernels (cast, RMSNorm, softmax, embedding,
 * cross-entropy, transpose, decode reduce, FWHT), compiled once per ISA
 * like the rest of isa/common/ (TG_NAME, LANES and the simd_<isa>.h blocks
 * come from build.h).
 *
 * Compiled without FMA contraction: each op then rounds exactly as its
 * formula reads on every ISA (the portable build has no FMA anyway), so the
 * kernels built on them give the same bits whatever table is chosen, as
 * their tests check. They are memory-bound; the FMA would buy nothing (one
 * exception, the exp of the softmax row ops, says why at exp_rowop).
 * And with no-trapping-math: gcc may then evaluate both arms of a select
 * (`v < c ? 0 : expensive(v)`) and blend them, which is what lets loops with
 * selects vectorize for AVX2 (no masked stores); no result changes, since
 * nothing here reads the floating-point exception flags. */
#include "build.h"

#if defined(__clang__) /* clang ignores gcc's optimize pragma (isa/isa.cmake) */
#pragma clang fp contract(off)
#else
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif


/* PF_AHEAD floats ahead (isa/tuning.h) */
#define TG_PF(p) __builtin_prefetch((p) + PF_AHEAD, 0, 3)

float TG_NAME(dot_f32)(const float *restrict a, const float *restrict b, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(a + i), TG_PF(b + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
  return tg_lane_tree16(acc);
}

float TG_NAME(dot3_f32)(const float *restrict a, const float *restrict b,
                        const float *restrict c, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(a + i), TG_PF(b + i), TG_PF(c + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l] * c[i + l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i] * c[i];
  return tg_lane_tree16(acc);
}

float TG_NAME(max_f32)(const float *restrict x, int64_t n) {
  float acc[LANES];
  for (int l = 0; l < LANES; l++) acc[l] = -__builtin_inff();
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(x + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
  }
  for (int l = 0; i < n; i++, l++) acc[l] = x[i] > acc[l] ? x[i] : acc[l];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

void TG_NAME(scale2_f32)(float *restrict x, int64_t n, float a, float b) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) x[i] = (x[i] * a) * b;
}

void TG_NAME(add_f32)(float *restrict dst, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i += LANES) {
    const int64_t m = n - i < LANES ? n - i : LANES;
    /* within the row only: callers (embedding rows, partial sums) jump
     * elsewhere next, and a prefetch of dst for writing past the end is a
     * wasted read-for-ownership */
    if (i + PF_AHEAD < n) TG_PF(src + i), TG_PF(dst + i);
#pragma omp simd
    for (int64_t j = 0; j < m; j++) dst[i + j] += src[i + j];
  }
}

/* Kahan: y = x - c; t = s + y; c = (t - s) - y; s = t. The contraction-free
 * build keeps every rounding, which the correction relies on. */
void TG_NAME(add_compensated_f32)(float *restrict sum, float *restrict comp,
                                  float *restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float y = x[i] - comp[i], t = sum[i] + y;
    comp[i] = (t - sum[i]) - y;
    sum[i] = t;
    x[i] = 0.0f;
  }
}

void TG_NAME(acc_mul2_f32)(float *restrict acc, const float *restrict a,
                           const float *restrict b, float s, int64_t n) {
  for (int64_t i = 0; i < n; i += LANES) {
    const int64_t m = n - i < LANES ? n - i : LANES;
    TG_PF(a + i), TG_PF(b + i);
#pragma omp simd
    for (int64_t j = 0; j < m; j++) acc[i + j] += a[i + j] * s * b[i + j];
  }
}

void TG_NAME(rms_dx_row)(const float *restrict x, const float *restrict w,
                         const float *restrict dy, float r, float c,
                         float *restrict dx, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; k++) dx[k] = r * (dy[k] * w[k] - x[k] * c);
}

/*
 * FWHT. Stages len = 1, 2, 4, 8 act inside each aligned block of 16 floats
 * (fwht16_block of simd_<isa>.h): y[l] = x[l ^ len] + sgn_len(l) * x[l]
 * with sgn = -1 where (l & len), i.e. x[l] + x[l^len] or x[l^len] - x[l],
 * exactly the butterfly (sgn * x is exact, so with or without FMA
 * contraction each output is one rounding of the same sum). Stages
 * len >= 16 are plain butterflies vectorized over j; the factor mul is
 * applied in the last one.
 */
void TG_NAME(fwht_mul_f32)(float *restrict x, int64_t n, const float *restrict mul) {
  for (int64_t b = 0; b < n; b += 16) {
    __builtin_prefetch(x + b + PF_AHEAD, 1, 3); /* rows are walked in order */
    fwht16_block(x + b);
  }
  for (int64_t len = 16; len < n; len *= 2) {
    const int last = 2 * len == n;
    for (int64_t i = 0; i < n; i += 2 * len) {
      float *restrict lo = x + i, *restrict hi = x + i + len;
      if (last) {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          const float u = lo[j], v = hi[j];
          lo[j] = (u + v) * mul[j];
          hi[j] = (u - v) * mul[len + j];
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
          const float u = lo[j], v = hi[j];
          lo[j] = u + v;
          hi[j] = u - v;
        }
      }
    }
  }
  if (n <= 16)
    for (int64_t j = 0; j < n; j++) x[j] *= mul[j];
}

/*
 * Transpose: TB x TB register blocks from simd_<isa>.h (16 x 16 on AVX-512,
 * 8 x 8 on AVX2; none in the portable build), edges copied element by
 * element in 8 x 8 sub-blocks.
 */
static void transpose_small(int64_t rows, int64_t cols, const float *restrict src, int64_t lds,
                            float *restrict dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < rows; r0 += 8)
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const int64_t r1 = r0 + 8 < rows ? r0 + 8 : rows, c1 = c0 + 8 < cols ? c0 + 8 : cols;
      for (int64_t c = c0; c < c1; c++)
        for (int64_t r = r0; r < r1; r++) dst[c * ldd + r] = src[r * lds + c];
    }
}

void TG_NAME(transpose_f32)(int64_t rows, int64_t cols, const float *restrict src,
                            int64_t lds, float *restrict dst, int64_t ldd, int stream) {
  if (TB == 0) {
    transpose_small(rows, cols, src, lds, dst, ldd);
    return;
  }
  stream = stream && transpose_can_stream(dst, ldd);
  const int64_t rb = TB ? rows - rows % TB : 0, cb = TB ? cols - cols % TB : 0;
  for (int64_t c = 0; c < cb; c += TB)
    for (int64_t r = 0; r < rb; r += TB)
      transpose_block(src + r * lds + c, lds, dst + c * ldd + r, ldd, stream);
  if (rb < rows) transpose_small(rows - rb, cols, src + rb * lds, lds, dst + rb, ldd);
  if (cb < cols) transpose_small(rb, cols - cb, src + cb, lds, dst + cb * ldd, ldd);
  if (stream) stream_fence(); /* streamed stores visible before any later store */
}

/* Each whole TB x TB block transposed by transpose_block into a buffer that
 * stays in L1, then added to dst row by row; the edges element by element. */
void TG_NAME(add_transposed_f32)(int64_t rows, int64_t cols, const float *restrict src,
                                 int64_t lds, float *restrict dst, int64_t ldd) {
  float block[TB ? TB * TB : 1];
  const int64_t rb = TB ? rows - rows % TB : 0, cb = TB ? cols - cols % TB : 0;
  for (int64_t c = 0; c < cb; c += TB)
    for (int64_t r = 0; r < rb; r += TB) {
      transpose_block(src + r * lds + c, lds, block, TB, 0);
      for (int64_t i = 0; i < TB; i++) {
        float *restrict d = dst + (c + i) * ldd + r;
#pragma omp simd
        for (int64_t j = 0; j < TB; j++) d[j] += block[i * TB + j];
      }
    }
  for (int64_t c = 0; c < cols; c++) { /* the rest: rows from rb in the blocks' columns, all after */
    const int64_t r0 = c < cb ? rb : 0;
#pragma omp simd
    for (int64_t r = r0; r < rows; r++) dst[c * ldd + r] += src[r * lds + c];
  }
}

/* Four c at a time (16 independent accumulators: four xmm-wide chains), each
 * summing its workgroups in list order. */
void TG_NAME(wsum4_f32)(const float *restrict part, int64_t ld, const int32_t *restrict w,
                        const float *restrict a, int64_t nw, int64_t n4, float div,
                        float *restrict dst) {
  int64_t c = 0;
  for (; c + 4 <= n4; c += 4) {
    float acc[4][4] = {{0}};
    /* every line of the block of four c 4 blocks ahead (ld = 16: 4 KiB) */
    const float *restrict ahead = part + (c + 16) * ld * 4;
    for (int64_t l = 0; l < 16 * ld; l += 16) __builtin_prefetch(ahead + l, 0, 3);
    for (int64_t i = 0; i < nw; i++) {
      const float ai = a[i];
      const float *restrict p = part + (c * ld + w[i]) * 4;
      for (int cc = 0; cc < 4; cc++)
#pragma omp simd
        for (int k = 0; k < 4; k++) acc[cc][k] += p[cc * ld * 4 + k] * ai;
    }
    for (int cc = 0; cc < 4; cc++)
      for (int k = 0; k < 4; k++) dst[(c + cc) * 4 + k] = acc[cc][k] / div;
  }
  for (; c < n4; c++) {
    float acc[4] = {0};
    for (int64_t i = 0; i < nw; i++) {
      const float *restrict p = part + (c * ld + w[i]) * 4;
      for (int k = 0; k < 4; k++) acc[k] += p[k] * a[i];
    }
    for (int k = 0; k < 4; k++) dst[c * 4 + k] = acc[k] / div;
  }
}

/* a * b + c: one rounding (FMA) where the ISA has it, else two. Only
 * exp_rowop uses it: see there. */
#if defined(__FMA__)
#define MADD(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/*
 * exp(v) for v <= 0 or NaN (the softmax row ops take exp(x - max)), written
 * branch-free so that every ISA build vectorizes it: exp_f32's clamps and
 * fix-ups leave control flow that gcc 12 does not if-convert for AVX2, where
 * it runs scalar (35 ns per 16 floats against 4 ns on AVX-512, Zen 5).
 * The steps of exp_f32: v = k ln2 + r with |r| <= ln2/2 (ln2 in two parts,
 * so k ln2 is exact), e^r from the same degree-7 polynomial, here evaluated
 * by Estrin's scheme (half the dependent steps of Horner's; 4.1 -> 3.7 ns
 * per 16 floats on AVX-512 before the FMAs below), and 2^k applied as
 * 2^(k+64) (exact: er 2^(k+64) is a normal number) times 2^-64, so results
 * down to the subnormals round once. k comes from the bits of the rounding sum t = v log2e + 1.5 * 2^23 (its
 * low mantissa bits are k + 2^22), with no float-to-int conversion. v is
 * clamped below at -105 (k >= -152, so k + 64 + 127 >= 39): at k <= -151 the
 * result is below half the least subnormal and rounds to 0, so -inf gives
 * 0; NaN passes through every step.
 * This is the one row op with FMA (MADD) where the ISA has it, and so the
 * one whose bits differ between the portable table and the AVX2 / AVX-512
 * ones (which agree with each other): it bounds cross-entropy, the kernel
 * furthest from memory speed, and fused multiply-adds take a third of its
 * floating-point operations away (Zen 5, per 16 floats in L1: AVX2 6.4 -> 5.3 ns, AVX-512
 * 3.6 -> 3.2 ns). Within 2 ulp like exp_f32 over (-inf, 0]
 * (tests/test_micro.c); measured on a third of all floats in [-112, 0]:
 * at most 1.007 ulp (portable), 1.031 ulp (FMA).
 */
static inline float exp_rowop(float v) {
  const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f,
              round_magic = 12582912.0f; /* 1.5 * 2^23 */
  const float xc = v < -105.0f ? -105.0f : v; /* NaN stays NaN */
  const float t = MADD(xc, log2e, round_magic); /* k + 1.5 * 2^23, k = nearest integer */
  const float k = t - round_magic;
  float r = MADD(-k, ln2_hi, xc);
  r = MADD(-k, ln2_lo, r);
  /* e^r = 1 + r + r^2 (c0 + c1 r + ... + c5 r^5) */
  const float r2 = r * r, r4 = r2 * r2;
  const float q0 = MADD(1.6666665459e-1f, r, 5.0000001201e-1f);
  const float q1 = MADD(8.3334519073e-3f, r, 4.1665795894e-2f);
  const float q2 = MADD(1.9875691500e-4f, r, 1.3981999507e-3f);
  const float p = MADD(r4, q2, MADD(r2, q1, q0));
  const float er = MADD(p, r2, r) + 1.0f;
  /* 2^(k + 64): exponent field k + 191 in [39, 191] */
  uint32_t tb;
  memcpy(&tb, &t, sizeof tb);
  const uint32_t b1 = (tb - (0x4B400000u - 191u)) << 23;
  float s1;
  memcpy(&s1, &b1, sizeof s1);
  return (er * s1) * 0x1p-64f;
}
#undef MADD

/* One chunk (len <= TG_SOFTMAX_CHUNK floats, a multiple of 16 but in a row's
 * last chunk) of an online softmax over a row, so the row is read from memory
 * once: state[0..15] are 16 lane sums, state[16] the running max (start: 0s
 * and -inf). The max m_c grows to cover the chunk; the lane sums are
 * rescaled by exp(m_old - m_c) if it grew, then take e[j] = exp(x[j] - m_c)
 * (x[j] - 0 while m_c = -inf, so -inf entries give 0, not NaN). Returns m_c.
 * Lane l sums the elements j = l mod 16 of the chunk, so a row's sums follow
 * the order of one 16-lane pass whatever the chunking. The exp of this chunk
 * runs while the next 4 KiB are prefetched, so the read overlaps the
 * arithmetic. */
float TG_NAME(softmax_exp_chunk)(const float *restrict x, int64_t len, float *restrict e,
                                 float *restrict state) {
  float *acc = state;
  const float m_old = state[LANES], mc = TG_NAME(max_f32)(x, len);
  const float m = mc > m_old ? mc : m_old;
  if (m > m_old && m_old != -__builtin_inff()) {
    const float f = exp_rowop(m_old - m);
    for (int l = 0; l < LANES; l++) acc[l] *= f;
  }
  state[LANES] = m;
  const float s = m == -__builtin_inff() ? 0.0f : m;
  int64_t j = 0;
  for (; j + LANES <= len; j += LANES) {
    __builtin_prefetch(x + j + TG_SOFTMAX_CHUNK, 0, 3);
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      const float v = exp_rowop(x[j + l] - s);
      e[j + l] = v;
      acc[l] += v;
    }
  }
  for (int l = 0; j < len; j++, l++) {
    e[j] = exp_rowop(x[j] - s);
    acc[l] += e[j];
  }
  return m;
}

/* y[j] = (e[j] * a[j / TG_SOFTMAX_CHUNK]) * b; stream: whole aligned 64-byte
 * lines of y with non-temporal stores (stream16 of simd_<isa>.h), left
 * unfenced for the caller's stream_fence: cross-entropy writes a row in 32
 * pieces, and a fence after each cost 15% of the kernel on AVX-512 (Zen 5). */
void TG_NAME(scale_chunks_f32)(const float *restrict e, const float *restrict a, float b,
                               float *restrict y, int64_t n, int stream) {
  stream = stream && STREAM_STORES;
  for (int64_t c0 = 0; c0 < n; c0 += TG_SOFTMAX_CHUNK) {
    const int64_t c1 = n - c0 < TG_SOFTMAX_CHUNK ? n : c0 + TG_SOFTMAX_CHUNK;
    const float ac = a[c0 / TG_SOFTMAX_CHUNK];
    int64_t j = c0;
    if (stream) {
      for (; j < c1 && (uintptr_t)(y + j) % 64; j++) y[j] = (e[j] * ac) * b;
      for (; j + 16 <= c1; j += 16) {
        float t[16];
#pragma omp simd
        for (int l = 0; l < 16; l++) t[l] = (e[j + l] * ac) * b;
        stream16(y + j, t);
      }
    }
#pragma omp simd
    for (int64_t i = j; i < c1; i++) y[i] = (e[i] * ac) * b;
  }
}

/* RMSNorm backward row, pass 1: both sums in one read of x and dy, each in
 * the order of its own op: *xx = dot_f32(x, x), *dyxw = dot3_f32(dy, x, w). */
void TG_NAME(rms_sums_f32)(const float *restrict x, const float *restrict dy,
                           const float *restrict w, int64_t n, float *xx, float *dyxw) {
  float a2[LANES] = {0}, a3[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    TG_PF(x + i), TG_PF(dy + i);
#pragma omp simd
    for (int l = 0; l < LANES; l++) {
      a2[l] += x[i + l] * x[i + l];
      a3[l] += dy[i + l] * x[i + l] * w[i + l];
    }
  }
  for (int l = 0; i < n; i++, l++) a2[l] += x[i] * x[i], a3[l] += dy[i] * x[i] * w[i];
  *xx = tg_lane_tree16(a2);
  *dyxw = tg_lane_tree16(a3);
}

/* RMSNorm backward row, pass 2 (x and dy now in L1/L2): acc_mul2_f32 and
 * rms_dx_row in one walk, each element rounded as in those ops:
 * part[k] += x[k] * r * dy[k];  dx[k] = r * (dy[k] * w[k] - x[k] * c).
 * stream: whole aligned 64-byte lines of dx with non-temporal stores, left
 * unfenced for the caller's stream_fence (one per block of rows). */
void TG_NAME(rms_bwd_row)(const float *restrict x, const float *restrict w,
                          const float *restrict dy, float r, float c,
                          float *restrict part, float *restrict dx, int64_t n,
                          int stream) {
  stream = stream && STREAM_STORES;
  int64_t k = 0;
  if (stream) {
    for (; k < n && (uintptr_t)(dx + k) % 64; k++) {
      part[k] += x[k] * r * dy[k];
      dx[k] = r * (dy[k] * w[k] - x[k] * c);
    }
    for (; k + 16 <= n; k += 16) {
      float t[16];
#pragma omp simd
      for (int l = 0; l < 16; l++) {
        part[k + l] += x[k + l] * r * dy[k + l];
        t[l] = r * (dy[k + l] * w[k + l] - x[k + l] * c);
      }
      stream16(dx + k, t);
    }
  }
#pragma omp simd
  for (int64_t i = k; i < n; i++) {
    part[i] += x[i] * r * dy[i];
    dx[i] = r * (dy[i] * w[i] - x[i] * c);
  }
}

/* Orders the non-temporal stores made so far before any later store (sfence
 * where there are such stores). */
void TG_NAME(stream_fence)(void) { stream_fence(); }

/* RoPE, one head row's rotary part (kernels/rope.c builds the signed sine
 * s, so one loop serves the forward and the backward): every output is
 * x c + x' s of its own element and its partner's, two products and a sum. */
void TG_NAME(rope_row_f32)(const float *restrict x, const float *restrict c,
                           const float *restrict s, float *restrict y, int64_t R,
                           int interleaved) {
  const int64_t h = R / 2;
  if (!interleaved) {
#pragma omp simd
    for (int64_t i = 0; i < h; i++) {
      y[i] = x[i] * c[i] + x[i + h] * s[i];
      y[i + h] = x[i + h] * c[i + h] + x[i] * s[i + h];
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < h; i++) {
      y[2 * i] = x[2 * i] * c[2 * i] + x[2 * i + 1] * s[2 * i];
      y[2 * i + 1] = x[2 * i + 1] * c[2 * i + 1] + x[2 * i] * s[2 * i + 1];
    }
  }
}

/*
 * Gated linear units. The activation's sigmoid S(z) (z = g for silu, z =
 * 2 sqrt(2/pi) (g + 0.044715 g^3) for gelu_tanh, whose 0.5 (1 + tanh(z/2))
 * is S(z)) comes with its complement Sc = 1 - S from e = exp(-|z|) in (0, 1]:
 *   z >= 0: S = 1 / (1 + e), Sc = e / (1 + e);   z < 0: the two swapped.
 * Neither cancels nor overflows for any z (sigmoid(-100) is e = 3.7e-44
 * over 1, not 1 over an infinite 1 + e^100), so both are within a few ulps
 * of the true values wherever they are normal, and act' needs no 1 - S.
 * Rows go GLU_CHUNK at a time: -|z| into e, the table's exp_f32 over it
 * (the one exp of the ISA layer), then the products from e. NaN in g makes
 * z, e, S and every output of that element NaN. +-inf gates take the
 * functions' limits, not the formula's 0 * inf: act(-inf) = -0 (S = 0),
 * act(+inf) = +inf, act'(+inf) = 1, act'(-inf) = 0 (the selects on S == 0
 * and Sc == 0 change nothing for a finite g, whose product there is the
 * same zero).
 */
enum { GLU_CHUNK = 256 };
#define GLU_K2 1.59576912160573071f /* 2 sqrt(2/pi) */
#define GLU_A 0.044715f
#define GLU_A3 0.134145f /* 3 * 0.044715 */

static inline __attribute__((always_inline)) float glu_z(float g, const int act) {
  return act == TG_GLU_SILU ? g : GLU_K2 * (g + GLU_A * (g * g * g));
}

/* e[k] = exp(-|z(g[k])|) for k < m */
static inline __attribute__((always_inline)) void glu_exp(const float *g, float *restrict e,
                                                         int64_t m, const int act) {
#pragma omp simd
  for (int64_t k = 0; k < m; k++) e[k] = -__builtin_fabsf(glu_z(g[k], act));
  TG_NAME(exp_f32)(e, e, m);
}

/* g, u, y: y may be g or u exactly (element k is read before it is written,
 * and the simd loop reads each vector before it stores it), hence no restrict */
static inline __attribute__((always_inline)) void glu_fwd(const float *g, const float *u,
                                                         float *y, int64_t n, const int act) {
  float e[GLU_CHUNK];
  for (int64_t k0 = 0; k0 < n; k0 += GLU_CHUNK) {
    const int64_t m = n - k0 < GLU_CHUNK ? n - k0 : GLU_CHUNK;
    glu_exp(g + k0, e, m, act);
#pragma omp simd
    for (int64_t k = 0; k < m; k++) {
      const float x = g[k0 + k], z = glu_z(x, act), r = 1.0f / (1.0f + e[k]);
      const float S = z >= 0.0f ? r : e[k] * r; /* NaN: e[k] * r, NaN */
      const float a = S == 0.0f ? -0.0f : x * S;
      y[k0 + k] = a * u[k0 + k];
    }
  }
}

void TG_NAME(glu_fwd_f32)(const float *g, const float *u, float *y, int64_t n, int act) {
  if (act == TG_GLU_SILU)
    glu_fwd(g, u, y, n, TG_GLU_SILU);
  else
    glu_fwd(g, u, y, n, TG_GLU_GELU_TANH);
}

/* act'(g): silu' = S (1 + g Sc); gelu_tanh' = S + g S Sc z'(g), z' = 2
 * sqrt(2/pi) (1 + 3 0.044715 g^2). Past |g| = 64 (z > 18000) e is 0, so S
 * Sc is exactly 0, and g is clamped there in that term so that g^2 cannot
 * overflow into 0 * inf; a NaN passes the clamp. */
static inline __attribute__((always_inline)) void glu_bwd(const float *g, const float *u,
                                                         const float *restrict dy, float *dg,
                                                         float *du, int64_t n, const int act) {
  float e[GLU_CHUNK];
  for (int64_t k0 = 0; k0 < n; k0 += GLU_CHUNK) {
    const int64_t m = n - k0 < GLU_CHUNK ? n - k0 : GLU_CHUNK;
    glu_exp(g + k0, e, m, act);
#pragma omp simd
    for (int64_t k = 0; k < m; k++) {
      const float x = g[k0 + k], up = u[k0 + k], d = dy[k0 + k];
      const float z = glu_z(x, act), r = 1.0f / (1.0f + e[k]), er = e[k] * r;
      const float S = z >= 0.0f ? r : er, Sc = z >= 0.0f ? er : r;
      const float a = S == 0.0f ? -0.0f : x * S;
      float da;
      if (act == TG_GLU_SILU) {
        const float xsc = Sc == 0.0f ? 0.0f : x * Sc;
        da = S == 0.0f ? -0.0f : S * (1.0f + xsc);
      } else {
        const float xc = x > 64.0f ? 64.0f : x < -64.0f ? -64.0f : x;
        da = S + (xc * (S * Sc)) * (GLU_K2 * (1.0f + GLU_A3 * (xc * xc)));
      }
      du[k0 + k] = d * a;
      dg[k0 + k] = (d * up) * da;
    }
  }
}

void TG_NAME(glu_bwd_f32)(const float *g, const float *u, const float *dy, float *dg, float *du,
                          int64_t n, int act) {
  if (act == TG_GLU_SILU)
    glu_bwd(g, u, dy, dg, du, n, TG_GLU_SILU);
  else
    glu_bwd(g, u, dy, dg, du, n, TG_GLU_GELU_TANH);
}

#if !defined(__clang__)
#pragma GCC pop_options
#endif

