/*
 * The element and row ops of the attention: bf16 <-> f32 conversion,
 * dot_bf16, exp_f32, the score, probability and dS rows, the forward's
 * exp-sum and score-max rows, and the dropout keep flags. (One file, in
 * this order, as they were before the ISA layer had its folder: gcc 12
 * then allocates the registers of attn_prob_row's loops exactly as it did;
 * with the conversions in another file it spills two constants on the avx2
 * and portable builds, objdump -d compared.)
 */
#include "build.h"
#include "philox.h"

void TG_NAME(bf16_to_f32)(const uint16_t *restrict src, float *restrict dst,
                          int64_t n) {
  int64_t i = 0;
  if (CVT_W)
    for (; i + CVT_W <= n; i += CVT_W) bf16_widen_block(src + i, dst + i);
#pragma omp simd
  for (int64_t j = i; j < n; j++) dst[j] = bf16_widen(src[j]);
}

void TG_NAME(f32_to_bf16)(const float *restrict src, uint16_t *restrict dst,
                          int64_t n) {
  int64_t i = 0;
  if (CVT_W)
    for (; i + CVT_W <= n; i += CVT_W) bf16_narrow_block(src + i, dst + i);
#pragma omp simd
  for (int64_t j = i; j < n; j++) dst[j] = bf16_rne(src[j]);
}

float TG_NAME(dot_bf16)(const uint16_t *restrict a, const uint16_t *restrict b,
                        int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  /* Widened by the simd_<isa>.h blocks where there are any: gcc 13 leaves
   * the shift-and-memcpy loop below scalar (the backward's D pass, one dot
   * per row of O and dO, was 5-6% of a packed row's backward on the 16-core
   * Xeon, bench/results/xeon16-amx/packed/README.md). Lane l sums the
   * elements i with i % LANES = l either way. */
  if (CVT_W)
    for (; i + LANES <= n; i += LANES) {
      float fa[LANES], fb[LANES];
      for (int c = 0; c < LANES; c += CVT_W) {
        bf16_widen_block(a + i + c, fa + c);
        bf16_widen_block(b + i + c, fb + c);
      }
#pragma omp simd
      for (int l = 0; l < LANES; l++) acc[l] += fa[l] * fb[l];
    }
  for (; i + LANES <= n; i += LANES) {
#pragma omp simd
    for (int l = 0; l < LANES; l++) acc[l] += bf16_widen(a[i + l]) * bf16_widen(b[i + l]);
  }
  for (int l = 0; i < n; i++, l++) acc[l] += bf16_widen(a[i]) * bf16_widen(b[i]);
  return tg_lane_tree16(acc);
}

/*
 * exp(x), one lane: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an
 * exact n ln2), e^r by a degree-7 polynomial (the Cephes expf minimax
 * coefficients; exp_reduced), 2^n applied as two exponent-field scalings so
 * results down to the subnormal range stay right; measured within 1 ulp.
 * The range handling is selects, which gcc turns into vector blends on
 * every ISA (the tables are built with -fno-trapping-math, isa/isa.cmake):
 * every loop that calls it vectorizes. The one exp of the attention rows
 * and exp_f32 (the forward's exp-sum rows: exp_nonpos_lane).
 */
/* exp_reduced's constants (literals: as constant arrays they cost the avx2
 * build's probability row spills), shared with the AVX-512 lanes below */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_MAGIC 12582912.0f /* 1.5 * 2^23 */
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
/* exp_bf16's degree-4 polynomial, 1 + r + C2 r^2 + C3 r^3 + C4 r^4 with the
 * constant fixed at 1 (e^0 = 1 exactly), fitted to e^r's relative error on
 * [-ln2/2, ln2/2] (Lawson's iteration): at most 2.9e-6 = 2^-18.4 in f32
 * (Horner by FMAs) */
#define EXPB_C1 0.999966860f
#define EXPB_C2 0.500030160f
#define EXPB_C3 0.167874426f
#define EXPB_C4 0.0415136516f
#define EXP_LN2 0.693147182f /* ln2 rounded to f32, for r by one FMA */

#if !defined(__AVX512F__) /* (the AVX-512 tables' lanes are below) */
static inline __attribute__((always_inline)) float exp_reduced(float xc, float *n) {
  const float k = (xc * EXP_LOG2E + EXP_MAGIC) - EXP_MAGIC; /* nearest integer */
  float r = xc - k * EXP_LN2_HI;
  r = r - k * EXP_LN2_LO;
  float p = EXP_P0;
  p = p * r + EXP_P1;
  p = p * r + EXP_P2;
  p = p * r + EXP_P3;
  p = p * r + EXP_P4;
  p = p * r + EXP_P5;
  *n = k;
  return p * (r * r) + r + 1.0f;
}

static inline float exp_lane(float v) {
  float xc = v > 89.0f ? 89.0f : v;
  xc = xc >= -104.0f ? xc : -104.0f; /* NaN too (float->int of NaN is UB); restored below */
  float k;
  const float er = exp_reduced(xc, &k);
  const int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1; /* each in [-75, 64] */
  const uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, sizeof s1);
  memcpy(&s2, &b2, sizeof s2);
  float out = (er * s1) * s2;
  out = v > 88.7228394f ? __builtin_inff() : out;
  out = v < -103.972084f ? 0.0f : out;
  return v == v ? out : v;
}

/*
 * exp(x) for x <= 0 that is not NaN (-inf included): exp_lane without its
 * range and NaN selects. x <= -87.3 (e^x below 2^-126 + a little: n =
 * round(x log2e) >= -126 down to there) gives 0, so 2^n is one exponent
 * field. For the forward's exp-sum rows, whose every x = s - m' is <= 0:
 * with it the forward ran 6% faster (AMD EPYC family 23, avx2, 1 thread,
 * 1,2,1,4096,64 causal, alternating runs).
 */
static inline float exp_nonpos_lane(float x) {
  const float xc = x > -87.3f ? x : -87.3f;
  float k;
  const float er = exp_reduced(xc, &k);
  const uint32_t b = (uint32_t)((int32_t)k + 127) << 23; /* 2^k, k in [-126, 0] */
  float s;
  memcpy(&s, &b, sizeof s);
  return x > -87.3f ? er * s : 0.0f;
}

/*
 * exp(x) for a value that is rounded to bf16 next (the forward's P part in
 * bf16 mode) and summed in f32 (its row sum l): x below 88.7 (-inf
 * included; a NaN gives 0), x <= -87.3 giving 0 as exp_nonpos_lane. The
 * same reduction,
 * e^r by a degree-4 polynomial instead of 7: within 3.2e-6 = 2^-18.2 of
 * e^x (the polynomial's 2^-18.4 and the reduction's), 2^9 times under
 * bf16's half ulp, so P's bf16 part is bf16(e^x) but where e^x lies that
 * close to a rounding tie. See exp_bf16_lanes16 for what it saves.
 */
static inline float exp_bf16_lane(float x) {
  float xc = x > -87.3f ? x : -87.3f;
  xc = xc < 89.0f ? xc : 89.0f; /* (a lag row's score far above m: inf, then redone) */
  const float k = (xc * EXP_LOG2E + EXP_MAGIC) - EXP_MAGIC; /* nearest integer */
  float r = xc - k * EXP_LN2_HI;
  r = r - k * EXP_LN2_LO;
  const float q = (((EXPB_C4 * r + EXPB_C3) * r + EXPB_C2) * r + EXPB_C1) * r + 1.0f;
  const uint32_t b = (uint32_t)((int32_t)k + 127) << 23; /* 2^k, k in [-126, 128] */
  float sc;
  memcpy(&sc, &b, sizeof sc);
  return x > -87.3f ? q * sc : 0.0f;
}

#else
/*
 * exp_lane and exp_nonpos_lane on 16 lanes, with their bits, in about half
 * the instructions: the same reduction and polynomial (exp_reduced's
 * operations one for one, fused where gcc fuses them), 2^k applied by
 * vscalefps, er 2^k rounded once (as exp_lane's (er 2^k1) 2^k2: the first
 * product is exact), and the range by the clamps alone: at -104 <= x <
 * -103.972084 (k = -150, er < 1) er 2^k is below half the least subnormal
 * and rounds to 0, as exp_lane's select gives; above 88.7228394 (k = 128,
 * er > 1) it overflows to inf. The clamps pass NaN (the second operand of
 * vmaxps / vminps), and NaN reaches the result.
 */
static inline __m512 exp_reduced16(__m512 xc, __m512 *k) {
  const __m512 magic = _mm512_set1_ps(EXP_MAGIC);
  *k = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(EXP_LOG2E), magic), magic);
  __m512 r = _mm512_fnmadd_ps(*k, _mm512_set1_ps(EXP_LN2_HI), xc);
  r = _mm512_fnmadd_ps(*k, _mm512_set1_ps(EXP_LN2_LO), r);
  const float c[6] = {EXP_P0, EXP_P1, EXP_P2, EXP_P3, EXP_P4, EXP_P5};
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[i]));
  return _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
}

static inline __m512 exp_lanes16(__m512 v) {
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), v));
  __m512 k;
  const __m512 er = exp_reduced16(xc, &k);
  return _mm512_scalef_ps(er, k);
}

/* exp_nonpos_lane: x <= 0, not NaN; x <= -87.3 gives 0 (its select) */
static inline __m512 exp_nonpos_lanes16(__m512 x) {
  const __m512 lim = _mm512_set1_ps(-87.3f);
  __m512 k;
  const __m512 er = exp_reduced16(_mm512_max_ps(lim, x), &k);
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lim, _CMP_GT_OQ), _mm512_scalef_ps(er, k));
}

/* exp_bf16_lane on 16 lanes: r by one FMA with ln2 rounded to f32 (its
 * error, under 126 x 1.9e-9 in r, is inside the bound), 2^k and the zero
 * below -87.3 by one masked vscalefps: 10 vector instructions where
 * exp_nonpos_lanes16 takes 16. The forward in bf16 mode took 0.90-0.99x
 * the time with it on the users' grid (2-core Xeon, amx, 2 threads), and
 * 0.88-0.98x on the lent one at 16 threads (paired calls,
 * bench/results/xeon2-amx/ab-exp-bf16-part.txt, ../xeon16-amx/exp-bf16-part/). */
static inline __m512 exp_bf16_lanes16(__m512 x) {
  const __m512 lim = _mm512_set1_ps(-87.3f), magic = _mm512_set1_ps(EXP_MAGIC);
  const __m512 xc = _mm512_max_ps(lim, x);
  const __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(EXP_LOG2E), magic), magic);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(EXP_LN2), xc);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(EXPB_C4), r, _mm512_set1_ps(EXPB_C3));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(EXPB_C2));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(EXPB_C1));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lim, _CMP_GT_OQ), q, k);
}
#endif

/* y[i] = exp(x[i]); y may alias x */
void TG_NAME(exp_f32)(const float *x, float *y, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(y + i, m, exp_lanes16(_mm512_maskz_loadu_ps(m, x + i)));
  }
#else
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = exp_lane(x[i]);
#endif
}

/* Element k of a mask row of type t as f32 (bf16 widened exactly). t is a
 * constant wherever this is inlined: each masked loop below is compiled once
 * per mask type, each as plain a vector loop as one written for that type. */
static inline __attribute__((always_inline)) float mask_elem(const void *restrict mask,
                                                             int64_t k, const tg_dtype t) {
  if (t == TG_DTYPE_F32) return ((const float *)mask)[k];
  const uint32_t u = (uint32_t)((const uint16_t *)mask)[k] << 16;
  float m;
  memcpy(&m, &u, sizeof m);
  return m;
}

static inline __attribute__((always_inline)) void score_row_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    float shift) {
#pragma omp simd
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? m : (scale * s[k] + m) - shift;
  }
}

void TG_NAME(attn_score_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                             const void *restrict mask, tg_dtype mask_type,
                             float shift) {
  if (n_vis > n) n_vis = n;
  if (mask && mask_type == TG_DTYPE_F32) {
    score_row_masked(s, n_vis, scale, mask, TG_DTYPE_F32, shift);
  } else if (mask) {
    score_row_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, shift);
  } else {
#pragma omp simd
    for (int64_t k = 0; k < n_vis; k++) s[k] = scale * s[k] - shift;
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = -__builtin_inff();
}

void TG_NAME(attn_ds_row)(float *restrict dp, const float *restrict p, int64_t n,
                          float d, float scale) {
#pragma omp simd
  for (int64_t k = 0; k < n; k++) dp[k] = scale * (p[k] * (dp[k] - d));
}


static inline __attribute__((always_inline)) void prob_row_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    float shift) {
#if defined(__AVX512F__)
  const __m512 vscale = _mm512_set1_ps(scale), vshift = _mm512_set1_ps(shift);
  for (int64_t k = 0; k < n_vis; k += 16) {
    const __mmask16 lanes = first_lanes(n_vis - k);
    const __m512 m = t == TG_DTYPE_F32
                         ? _mm512_maskz_loadu_ps(lanes, (const float *)mask + k)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(
                               _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                   lanes, (const uint16_t *)mask + k)),
                               16));
    const __m512 x = _mm512_fmadd_ps(vscale, _mm512_maskz_loadu_ps(lanes, s + k), m);
    const __mmask16 seen = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
    _mm512_mask_storeu_ps(s + k, lanes,
                          _mm512_maskz_mov_ps(seen, exp_lanes16(_mm512_sub_ps(x, vshift))));
  }
#else
#pragma omp simd
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? 0.0f : exp_lane((scale * s[k] + m) - shift);
  }
#endif
}

void TG_NAME(attn_prob_row)(float *restrict s, int64_t n, int64_t n_vis, float scale,
                            const void *restrict mask, tg_dtype mask_type,
                            float shift) {
  if (n_vis > n) n_vis = n;
  if (mask && mask_type == TG_DTYPE_F32) {
    prob_row_masked(s, n_vis, scale, mask, TG_DTYPE_F32, shift);
  } else if (mask) {
    prob_row_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, shift);
  } else {
#if defined(__AVX512F__)
    const __m512 vscale = _mm512_set1_ps(scale), vshift = _mm512_set1_ps(shift);
    for (int64_t k = 0; k < n_vis; k += 16) {
      const __mmask16 lanes = first_lanes(n_vis - k);
      const __m512 x = _mm512_fmsub_ps(vscale, _mm512_maskz_loadu_ps(lanes, s + k), vshift);
      _mm512_mask_storeu_ps(s + k, lanes, exp_lanes16(x));
    }
#else
#pragma omp simd
    for (int64_t k = 0; k < n_vis; k++) s[k] = exp_lane(scale * s[k] - shift);
#endif
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = 0.0f;
}

/* LANES partial sums in a generic vector (one zmm, two ymm or four xmm), so
 * the tree at the end stays in registers (tg_lane_tree16's order): its array
 * form goes through memory one scalar add at a time, which costs more than
 * the exp of a 64-key row. */
typedef float lanes_v __attribute__((vector_size(LANES * sizeof(float))));
_Static_assert(LANES == 16, "lanes_sum is a tree over 16 lanes");
static inline float lanes_sum(const lanes_v *px) { /* by pointer: no vector ABI */
  const lanes_v x = *px;
  const lanes_v h = x + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2,
                                                3, 4, 5, 6, 7); /* l + 8 */
  const lanes_v q = h + __builtin_shufflevector(h, h, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0,
                                                1, 2, 3); /* l + 4 */
  return (q[0] + q[2]) + (q[1] + q[3]);
}

/* The exp-sum rows' sum: LANES partials by lanes_sum's tree, then the
 * tail's n_tail (< LANES) terms in order. */
static inline float partials_and_tail_sum(const float acc[LANES], const float *tail,
                                          int64_t n_tail) {
  lanes_v v;
  memcpy(&v, acc, sizeof v);
  float sum = lanes_sum(&v);
  for (int64_t k = 0; k < n_tail; k++) sum += tail[k];
  return sum;
}

/* attn_exp_sum_row's loops, exp_nonpos_lane (nonpos) or exp_lane: the sum
 * is taken as the exps are, LANES at a time into LANES partials held in
 * registers (the earlier second pass over s read its partials through the
 * stack on avx2: a quarter of the row's time), then the tail in order.
 * x = scale s - shift, the product rounded first (scale 1: s - shift).
 * Each e goes to s in place, or, with p, is exp_bf16_lane's (nonpos) and
 * goes to p as its bf16 part (bf16_lanes, bf16_rne: the one part
 * f32_to_bf16_split makes of it), s untouched; with max_out, *max_out
 * gets the max of scale s (NaN where one is NaN). p and max_out, NULL or
 * not, and scale are constants where this is inlined. */
static inline __attribute__((always_inline)) float exp_sum_row(float *restrict s, int64_t n,
                                                               float scale, float shift,
                                                               uint16_t *restrict p,
                                                               float *restrict max_out,
                                                               const int nonpos) {
  float acc[LANES] = {0}, tail[LANES];
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vscale = _mm512_set1_ps(scale), vshift = _mm512_set1_ps(shift);
  __m512 vacc = _mm512_setzero_ps(), vmax = _mm512_set1_ps(-__builtin_inff());
  __mmask16 nan = 0;
  for (; i < n; i += LANES) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m512 sc = _mm512_mul_ps(vscale, _mm512_maskz_loadu_ps(lanes, s + i));
    if (max_out) {
      vmax = _mm512_mask_max_ps(vmax, lanes, vmax, sc);
      nan |= _mm512_mask_cmp_ps_mask(lanes, sc, sc, _CMP_UNORD_Q);
    }
    const __m512 x = _mm512_sub_ps(sc, vshift);
    const __m512 e = !nonpos ? exp_lanes16(x) : p ? exp_bf16_lanes16(x) : exp_nonpos_lanes16(x);
    if (p)
      _mm256_mask_storeu_epi16(p + i, lanes, bf16_lanes(e, !nonpos));
    else
      _mm512_mask_storeu_ps(s + i, lanes, e);
    if (lanes != 0xFFFF) { /* the tail: summed in order below */
      _mm512_storeu_ps(tail, e);
      break;
    }
    vacc = _mm512_add_ps(vacc, e);
  }
  _mm512_storeu_ps(acc, vacc);
  if (max_out) *max_out = nan ? __builtin_nanf("") : _mm512_reduce_max_ps(vmax);
#else
  float mx = -__builtin_inff();
  int nan = 0;
  for (; i + LANES <= n; i += LANES) {
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int l = 0; l < LANES; l++) {
      const float sc = scale * s[i + l], x = sc - shift;
      const float e = !nonpos ? exp_lane(x) : p ? exp_bf16_lane(x) : exp_nonpos_lane(x);
      if (p)
        p[i + l] = bf16_rne(e);
      else
        s[i + l] = e;
      acc[l] += e;
      mx = sc > mx ? sc : mx;
      nan |= sc != sc;
    }
  }
  for (int64_t k = i; k < n; k++) {
    const float sc = scale * s[k], x = sc - shift;
    tail[k - i] = !nonpos ? exp_lane(x) : p ? exp_bf16_lane(x) : exp_nonpos_lane(x);
    if (p)
      p[k] = bf16_rne(tail[k - i]);
    else
      s[k] = tail[k - i];
    mx = sc > mx ? sc : mx;
    nan |= sc != sc;
  }
  if (max_out) *max_out = nan ? __builtin_nanf("") : mx;
#endif
  return partials_and_tail_sum(acc, tail, n - i);
}

float TG_NAME(attn_exp_sum_row)(float *restrict s, int64_t n, float shift) {
  /* shift +inf or NaN (a score overflowed or is NaN): exp_lane's NaN and
   * overflow; else every s - shift is <= 0 or -inf */
  return shift < __builtin_inff() ? exp_sum_row(s, n, 1.0f, shift, NULL, NULL, 1)
                                  : exp_sum_row(s, n, 1.0f, shift, NULL, NULL, 0);
}

float TG_NAME(attn_exp_sum_bf16_row)(const float *restrict s, int64_t n, float shift,
                                     uint16_t *restrict p) {
  float *row = (float *)(uintptr_t)s; /* (only read: p is not NULL) */
  return shift < __builtin_inff() ? exp_sum_row(row, n, 1.0f, shift, p, NULL, 1)
                                  : exp_sum_row(row, n, 1.0f, shift, p, NULL, 0);
}

/* The forward's row with a stale max m: exp_bf16_lane also serves x in
 * (0, 88.7), within its bound (er 2^k, one exact scaling); above that, or
 * for a NaN score, the caller redoes the row (its max is more than
 * TG_ATTN_FWD_MAX_LAG above m). */
float TG_NAME(attn_exp_sum_lag_bf16_row)(const float *restrict s, int64_t n, float scale,
                                         float m, uint16_t *restrict p, float *max_out) {
  return exp_sum_row((float *)(uintptr_t)s, n, scale, m, p, max_out, 1);
}

/* The masked loop of attn_score_max_row; *nan gets whether a score is NaN. */
static inline __attribute__((always_inline)) float score_max_masked(
    float *restrict s, int64_t n_vis, float scale, const void *restrict mask, const tg_dtype t,
    int *nan_out) {
  float mx = -__builtin_inff();
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t k = 0; k < n_vis; k++) {
    const float m = mask_elem(mask, k, t);
    s[k] = m == -__builtin_inff() ? m : scale * s[k] + m;
    mx = s[k] > mx ? s[k] : mx;
    nan |= s[k] != s[k];
  }
  *nan_out = nan;
  return mx;
}

float TG_NAME(attn_score_max_row)(float *restrict s, int64_t n, int64_t n_vis,
                                  float scale, const void *restrict mask,
                                  tg_dtype mask_type) {
  if (n_vis > n) n_vis = n;
  float mx = -__builtin_inff();
  int nan = 0; /* a NaN score makes the row's max NaN (the compare alone skips it) */
  if (mask && mask_type == TG_DTYPE_F32) {
    mx = score_max_masked(s, n_vis, scale, mask, TG_DTYPE_F32, &nan);
  } else if (mask) {
    mx = score_max_masked(s, n_vis, scale, mask, TG_DTYPE_BF16, &nan);
  } else {
#pragma omp simd reduction(max : mx) reduction(| : nan)
    for (int64_t k = 0; k < n_vis; k++) {
      s[k] = scale * s[k];
      mx = s[k] > mx ? s[k] : mx;
      nan |= s[k] != s[k];
    }
  }
  for (int64_t k = n_vis < 0 ? 0 : n_vis; k < n; k++) s[k] = -__builtin_inff();
  return nan ? __builtin_nanf("") : mx;
}
/*
 * Dropout keep flags: Philox4x32-10 (isa/philox.h) on PHILOX_LANES
 * consecutive counters at once, one counter per vector lane, so each round
 * is a few vector instructions (the widening 32 x 32 -> 64-bit multiply is
 * one on every x86 vector ISA) where the scalar generator spends ~20
 * instructions per draw.
 */
enum { PHILOX_LANES = 16 };

void TG_NAME(dropout_keep)(uint8_t *restrict keep, int64_t n, uint64_t n0, uint64_t seed,
                           uint64_t offset, uint32_t threshold) {
  uint64_t blk = n0 / 4;            /* counter of the draw n0, less offset */
  int64_t skip = (int64_t)(n0 % 4); /* words of the first block before n0 */
  for (int64_t done = 0; done < n; blk += PHILOX_LANES, skip = 0) {
    uint32_t c0[PHILOX_LANES], c1[PHILOX_LANES], c2[PHILOX_LANES], c3[PHILOX_LANES];
#pragma omp simd
    for (int l = 0; l < PHILOX_LANES; l++) {
      const uint64_t ctr = offset + blk + (uint64_t)l; /* its low 64 bits; a carry -> c2 */
      c0[l] = (uint32_t)ctr, c1[l] = (uint32_t)(ctr >> 32), c2[l] = ctr < offset, c3[l] = 0;
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < TG_PHILOX_ROUNDS; r++, k0 += TG_PHILOX_W0, k1 += TG_PHILOX_W1) {
#pragma omp simd
      for (int l = 0; l < PHILOX_LANES; l++) {
        const uint64_t p0 = (uint64_t)TG_PHILOX_M0 * c0[l], p1 = (uint64_t)TG_PHILOX_M1 * c2[l];
        const uint32_t n0w = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
        const uint32_t n2w = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
        c0[l] = n0w, c1[l] = (uint32_t)p1, c2[l] = n2w, c3[l] = (uint32_t)p0;
      }
    }
    uint8_t flags[4 * PHILOX_LANES]; /* draw 4 l + w: word w of counter l */
#pragma omp simd
    for (int l = 0; l < PHILOX_LANES; l++) {
      flags[4 * l + 0] = c0[l] >= threshold, flags[4 * l + 1] = c1[l] >= threshold;
      flags[4 * l + 2] = c2[l] >= threshold, flags[4 * l + 3] = c3[l] >= threshold;
    }
    const int64_t take = 4 * PHILOX_LANES - skip < n - done ? 4 * PHILOX_LANES - skip : n - done;
    memcpy(keep + done, flags + skip, (size_t)take);
    done += take;
  }
}
