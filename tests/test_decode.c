/* Decode reduce (contract section 11): tg_flash_attn_vec_reduce,
 * tg_flash_attn_vec_reduce_tq_hb_undo, tg_fwht_sign_undo_f32.
 *
 * The reduce is checked against softmax attention over the union of the
 * chunks: htmp is built the way a split-KV decode kernel leaves it (each
 * workgroup's unnormalised partial output, its S and M, for a random q, K, V
 * split into nwg chunks, some of them empty), and the f64 reference is the
 * softmax attention over all keys at once.
 *
 * Tolerance of the reduce (u = 2^-24), per element d of a row, from the f32
 * htmp values: with Mg = max_w M_w, a_w = exp(M_w - Mg), X = max_w (Mg - M_w)
 * over non-empty workgroups, N_d = sum_w |part_w,d| a_w, St = sum_w S_w a_w:
 *   - htmp itself is rounded to f32 (relative u on every part and S):
 *       u * (N_d/St + |dst_d|)
 *   - a_w: the f32 subtraction M_w - Mg (absolute u*X in the exponent, so
 *     relative X*u in a_w) and expf (<= 2u);
 *   - numerator and St: one product and nwg additions each (gamma_nwg + u),
 *     all terms of St positive; the final division u.
 * First order: |got - want| <= (nwg + 5 + X) * u * (N_d/St + |dst_d|). We allow
 * twice that (second-order terms, the f64 reference's rounding).
 *
 * Tolerance of the Hadamard/sign undo: each output is a sum of D terms +-x_i
 * formed by a log2(D)-deep tree of f32 additions whose partial sums are
 * bounded by sum|x_i|, then one multiply by the rounded 1/sqrt(D):
 *   |got - want| <= (log2 D + 2) * u * sum_i |x_i| / sqrt(D); we allow twice that.
 *
 * The fused kernel must equal reduce followed by tg_fwht_sign_undo_f32 bit
 * for bit: it performs the same f32 operations in the same order.
 *
 * The D1 sign table is read back from the library (the undo of e_0 is
 * sign(j)/sqrt(D)) and compared with the contract's bytes and their sha256. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refs.h"
#include "testutil.h"

/* The contract's D1 sign table (KERNELS.md section 11): ref_tq_d1_signs. */
static const uint8_t *const want_signs = ref_tq_d1_signs;

/* --- a small SHA-256 (FIPS 180-4) -------------------------------------------- */
static uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256(const uint8_t *msg, size_t len, uint8_t out[32]) {
  static const uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
      0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
      0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
      0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
      0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
      0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
      0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
      0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
      0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  /* padded message: msg, 0x80, zeros, 64-bit big-endian bit length */
  const size_t padded = (len + 9 + 63) / 64 * 64;
  uint8_t *buf = calloc(padded, 1);
  assert_non_null(buf);
  memcpy(buf, msg, len);
  buf[len] = 0x80;
  for (int i = 0; i < 8; i++) buf[padded - 1 - i] = (uint8_t)(((uint64_t)len * 8) >> (8 * i));
  for (size_t blk = 0; blk < padded; blk += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
      w[i] = (uint32_t)buf[blk + 4 * i] << 24 | (uint32_t)buf[blk + 4 * i + 1] << 16 |
             (uint32_t)buf[blk + 4 * i + 2] << 8 | buf[blk + 4 * i + 3];
    for (int i = 16; i < 64; i++) {
      uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
      uint32_t t1 = hh + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) +
                    k[i] + w[i];
      uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  free(buf);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(h[i] >> (24 - 8 * j));
}

static void hex(const uint8_t *b, int n, char *out) {
  for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static void test_sign_table(void **state) {
  char digest[65];
  uint8_t md[32];
  sha256((const uint8_t *)"abc", 3, md); /* FIPS 180-4 example: the sha256 itself */
  hex(md, 32, digest);
  assert_string_equal(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  sha256(want_signs, 32, md);
  hex(md, 32, digest);
  assert_string_equal(digest, "3ef1038e6c232e9519101daa2d6efd637d4c6bfdb29f4ee7101625c39d0ddc89");
  sha256(want_signs, 64, md);
  hex(md, 32, digest);
  assert_string_equal(digest, "44f13ce9f6db1edac62f558ee054f9de29cd474fd051362cadcaa98a55745f17");

  /* The library's table: undo(e_0)[j] = sign(j) / sqrt(D). */
  tg_ctx *ctx = tu_ctx(1, TG_ISA_PORTABLE);
  for (uint32_t D = 256; D <= 512; D *= 2) {
    float *x = tu_alloc(D * sizeof(float));
    memset(x, 0, D * sizeof(float));
    x[0] = 1.0f;
    TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, x, 1, D), TG_OK);
    uint8_t got[64] = {0};
    const float mag = (float)(1.0 / sqrt((double)D));
    for (uint32_t j = 0; j < D; j++) {
      if (fabsf(x[j]) != mag) TU_FAIL("undo(e_0)[%u] = %g, want +-%g (D=%u)", j, x[j], mag, D);
      if (x[j] < 0) got[j >> 3] |= (uint8_t)(1u << (j & 7));
    }
    if (memcmp(got, want_signs, D / 8) != 0) TU_FAIL("library sign table differs (D=%u)", D);
    sha256(got, D / 8, md);
    hex(md, 32, digest);
    assert_string_equal(digest, D == 256 ? "3ef1038e6c232e9519101daa2d6efd637d4c6bfdb29f4ee7101625c39d0ddc89"
                                         : "44f13ce9f6db1edac62f558ee054f9de29cd474fd051362cadcaa98a55745f17");
    free(x);
  }
  tg_ctx_destroy(ctx);
}

/* --- FWHT + sign against the O(D^2) Hadamard matrix (ref_fwht_sign_undo) ------- */

static void test_fwht_sign_undo(void **state) {
  const uint32_t shapes[][2] = {{1, 256}, {3, 256}, {1, 512}, {4, 512}};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  char what[128];
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const uint32_t nh = shapes[s][0], D = shapes[s][1];
    const int64_t n = (int64_t)nh * D;
    tu_rng rng = tu_rng_make(tu_seed() + 200 + s);
    float *x = tu_alloc(n * sizeof(float)), *y = tu_alloc(n * sizeof(float));
    double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
    tu_fill_f32(&rng, x, n, -1.0, 1.0);
    if (nh > 1) /* a row of wide dynamic range */
      for (uint32_t i = 0; i < D; i++) x[D + i] *= (float)ldexp(1.0, tu_int(&rng, -20, 20));
    ref_fwht_sign_undo(x, nh, D, want, bound);
    for (int ti = 0; ti < tu_n_thread_counts; ti++)
      for (int ii = 0; ii < n_isas; ii++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        memcpy(y, x, n * sizeof(float));
        TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, y, nh, D), TG_OK);
        snprintf(what, sizeof what, "fwht heads=%u D=%u threads=%d isa=%s", nh, D,
                 tu_thread_counts[ti], tg_isa_name(isas[ii]));
        if (!tu_check_bound(what, y, want, bound, n)) TU_FAIL("%s", what);
        tg_ctx_destroy(ctx);
      }
    free(x);
    free(y);
    free(want);
    free(bound);
  }
}

/* --- htmp from a split-KV decode ----------------------------------------------- */
typedef struct {
  uint32_t nrows, DV, nwg;
  double score_range; /* scores lie in (-score_range, score_range) */
  int empty_row;      /* index of a row whose workgroups are all empty, or -1 */
} red_case;

/* Builds htmp for c and the f64 softmax-attention reference over all keys
 * of each row (want, [nrows, DV]) with the bound described at the top
 * (ref_vec_reduce computes it from htmp). */
static float *build_htmp(const red_case *c, tu_rng *rng, double *want, double *bound) {
  const int64_t DV = c->DV, nwg = c->nwg, nrows = c->nrows;
  const int64_t n_part = nrows * DV * nwg;
  float *htmp = tu_alloc((n_part + 2 * nrows * nwg) * sizeof(float));
  enum { DK = 16, MAXK = 9 };
  for (int64_t r = 0; r < nrows; r++) {
    /* chunk sizes: 0..MAXK keys each; chunk 1 empty whenever nwg > 1 */
    int64_t *len = tu_alloc(nwg * sizeof(int64_t)), L = 0;
    for (int64_t w = 0; w < nwg; w++) {
      len[w] = tu_int(rng, 1, MAXK);
      if (w == 1 || (nwg > 3 && tu_next(rng) % 5 == 0)) len[w] = 0;
      if (r == c->empty_row) len[w] = 0;
      L += len[w];
    }
    if (L == 0 && r != c->empty_row) len[0] = 1, L = 1;
    double q[DK], *s = tu_alloc((L ? L : 1) * sizeof(double));
    float *V = tu_alloc((L ? L : 1) * DV * sizeof(float));
    for (int i = 0; i < DK; i++) q[i] = tu_uniform(rng, -1, 1);
    for (int64_t k = 0; k < L; k++) {
      double dot = 0;
      for (int i = 0; i < DK; i++) dot += q[i] * (float)tu_uniform(rng, -1, 1);
      s[k] = c->score_range * tanh(dot / 2.0); /* |s| < score_range */
    }
    tu_fill_f32(rng, V, L * DV, -1.0, 1.0);

    /* what each workgroup leaves: M = its max (f32), S and part relative to it */
    float *SM = htmp + n_part + r * nwg * 2;
    int64_t k0 = 0;
    for (int64_t w = 0; w < nwg; w++) {
      if (len[w] == 0) {
        SM[2 * w] = 0.0f;
        SM[2 * w + 1] = -INFINITY;
        for (int64_t d = 0; d < DV; d++) htmp[((r * (DV / 4) + d / 4) * nwg + w) * 4 + d % 4] = 0.0f;
        continue;
      }
      double m = -INFINITY;
      for (int64_t k = k0; k < k0 + len[w]; k++) m = s[k] > m ? s[k] : m;
      const float Mf = (float)m;
      double S = 0;
      for (int64_t k = k0; k < k0 + len[w]; k++) S += exp(s[k] - Mf);
      SM[2 * w] = (float)S;
      SM[2 * w + 1] = Mf;
      for (int64_t d = 0; d < DV; d++) {
        double p = 0;
        for (int64_t k = k0; k < k0 + len[w]; k++) p += exp(s[k] - Mf) * V[k * DV + d];
        htmp[((r * (DV / 4) + d / 4) * nwg + w) * 4 + d % 4] = (float)p;
      }
      k0 += len[w];
    }

    /* reference: softmax attention over all L keys at once (0 for none) */
    double smax = -INFINITY, Z = 0;
    for (int64_t k = 0; k < L; k++) smax = s[k] > smax ? s[k] : smax;
    for (int64_t k = 0; k < L; k++) Z += exp(s[k] - smax);
    for (int64_t d = 0; d < DV; d++) {
      double o = 0;
      for (int64_t k = 0; k < L; k++) o += exp(s[k] - smax) * V[k * DV + d];
      want[r * DV + d] = L ? o / Z : 0.0;
    }
    free(s);
    free(V);
    free(len);
  }
  /* the bound, from the f32 htmp (its value, the reduce formula's, agrees
   * with the softmax within the bound) */
  double *reduced = tu_alloc(nrows * DV * sizeof(double));
  ref_vec_reduce(htmp, c->nrows, c->DV, c->nwg, reduced, bound);
  free(reduced);
  return htmp;
}

static void test_reduce_values(void **state) {
  const red_case cases[] = {
      {1, 4, 1, 3.0, -1},    /* smallest: one row, one workgroup */
      {3, 12, 2, 3.0, -1},   /* head_dim not a power of two; chunk 1 empty */
      {2, 20, 5, 3.0, 1},    /* one row with every workgroup empty -> 0 */
      {4, 256, 33, 3.0, -1}, /* more workgroups than Metal's 32 */
      {2, 512, 40, 30.0, -1},/* wide score range: a_w down to ~e^-60 */
      {5, 8, 3, 8.0, 4},
      {1, 64, 1, 3.0, 0},    /* nwg = 1, all empty */
  };
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  char what[160];
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const red_case *c = &cases[ci];
    tu_rng rng = tu_rng_make(tu_seed() + 300 + ci);
    const int64_t n = (int64_t)c->nrows * c->DV;
    double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
    float *htmp = build_htmp(c, &rng, want, bound);
    float *dst = tu_alloc(n * sizeof(float));
    for (int ti = 0; ti < tu_n_thread_counts; ti++)
      for (int ii = 0; ii < n_isas; ii++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tu_poison_f32(dst, n);
        TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, dst, c->nrows, c->DV, c->nwg),
                         TG_OK);
        snprintf(what, sizeof what, "reduce nrows=%u DV=%u nwg=%u range=%g threads=%d isa=%s",
                 c->nrows, c->DV, c->nwg, c->score_range, tu_thread_counts[ti],
                 tg_isa_name(isas[ii]));
        if (!tu_check_bound(what, dst, want, bound, n)) TU_FAIL("%s", what);
        tg_ctx_destroy(ctx);
      }
    free(want);
    free(bound);
    free(htmp);
    free(dst);
  }
}

/* Partials of an empty workgroup (M = -inf) are never read into the result:
 * even NaN or inf there leaves the output finite and unchanged. */
static void test_reduce_empty_garbage(void **state) {
  const red_case c = {2, 16, 4, 3.0, -1};
  tu_rng rng = tu_rng_make(tu_seed() + 400);
  const int64_t n = (int64_t)c.nrows * c.DV;
  double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
  float *htmp = build_htmp(&c, &rng, want, bound);
  float *a = tu_alloc(n * sizeof(float)), *b = tu_alloc(n * sizeof(float));
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, a, c.nrows, c.DV, c.nwg), TG_OK);
  /* workgroup 1 is empty in every row: fill its partials with NaN / inf */
  for (int64_t r = 0; r < c.nrows; r++)
    for (int64_t d = 0; d < c.DV; d++)
      htmp[((r * (c.DV / 4) + d / 4) * c.nwg + 1) * 4 + d % 4] = d & 1 ? NAN : INFINITY;
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, b, c.nrows, c.DV, c.nwg), TG_OK);
  assert_true(tu_all_finite(b, n));
  assert_memory_equal(a, b, n * sizeof(float));
  tg_ctx_destroy(ctx);
  free(want);
  free(bound);
  free(htmp);
  free(a);
  free(b);
}

/* Fused reduce + undo == reduce, then tg_fwht_sign_undo_f32, bit for bit. */
static void test_reduce_tq_hb_undo(void **state) {
  const red_case cases[] = {
      {1, 256, 1, 3.0, -1}, {3, 256, 3, 3.0, 1}, {2, 512, 40, 10.0, -1}, {4, 512, 2, 3.0, -1}};
  tg_isa isas[TU_MAX_ISAS];
  const int n_isas = tu_isas(isas);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const red_case *c = &cases[ci];
    tu_rng rng = tu_rng_make(tu_seed() + 500 + ci);
    const int64_t n = (int64_t)c->nrows * c->DV;
    double *want = tu_alloc(n * sizeof(double)), *bound = tu_alloc(n * sizeof(double));
    float *htmp = build_htmp(c, &rng, want, bound);
    float *fused = tu_alloc(n * sizeof(float)), *pair = tu_alloc(n * sizeof(float));
    for (int ti = 0; ti < tu_n_thread_counts; ti++)
      for (int ii = 0; ii < n_isas; ii++) {
        tg_ctx *ctx = tu_ctx(tu_thread_counts[ti], isas[ii]);
        tu_poison_f32(fused, n);
        tu_poison_f32(pair, n);
        TU_EXPECT_STATUS(ctx,
                         tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, fused, c->nrows, c->DV,
                                                             c->nwg),
                         TG_OK);
        TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, pair, c->nrows, c->DV, c->nwg),
                         TG_OK);
        TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, pair, c->nrows, c->DV), TG_OK);
        assert_true(tu_all_finite(fused, n));
        if (memcmp(fused, pair, n * sizeof(float)) != 0)
          TU_FAIL("tq_hb_undo nrows=%u DV=%u nwg=%u threads=%d isa=%s differs from reduce + "
                  "fwht_sign_undo",
                  c->nrows, c->DV, c->nwg, tu_thread_counts[ti], tg_isa_name(isas[ii]));
        if (c->empty_row >= 0) /* an all-empty row transforms 0 into 0 */
          for (int64_t d = 0; d < c->DV; d++)
            assert_true(fused[c->empty_row * c->DV + d] == 0.0f);
        tg_ctx_destroy(ctx);
      }
    free(want);
    free(bound);
    free(htmp);
    free(fused);
    free(pair);
  }
}

static void test_decode_bad_input(void **state) {
  tg_ctx *ctx = tu_ctx(2, TG_ISA_PORTABLE);
  enum { R = 2, DV = 256, W = 3 };
  static float htmp[R * DV * W + 2 * R * W], out[R * DV], snap[R * DV];
  for (int i = 0; i < R * DV * W + 2 * R * W; i++) htmp[i] = 1.0f;
  for (int i = 0; i < R * DV; i++) out[i] = (float)i;
  memcpy(snap, out, sizeof out);

  /* tg_flash_attn_vec_reduce */
  assert_int_equal(tg_flash_attn_vec_reduce(NULL, htmp, out, R, DV, W), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, NULL, out, R, DV, W), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, NULL, R, DV, W), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, 0, DV, W), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, R, 0, W), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, R, DV, 0), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, R, 6, W), TG_ERR_UNSUPPORTED);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "head_dim = 6"));
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_vec_reduce(ctx, htmp, out, 0xFFFFFFFFu, 0xFFFFFFFCu, 0xFFFFFFFFu),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(out, snap, sizeof out);

  /* tg_flash_attn_vec_reduce_tq_hb_undo */
  assert_int_equal(tg_flash_attn_vec_reduce_tq_hb_undo(NULL, htmp, out, R, DV, W),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, NULL, out, R, DV, W),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, NULL, R, DV, W),
                   TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, out, 0, DV, W),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, out, R, 0, W),
                   TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, out, R, DV, 0),
                   TG_ERR_BAD_SHAPE);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "nwg"));
  const uint32_t bad_dims[] = {4, 128, 252, 260, 1024};
  for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++)
    TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, out, 1, bad_dims[i], 1),
                     TG_ERR_UNSUPPORTED);
  TU_EXPECT_STATUS(ctx,
                   tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, out, 0xFFFFFFFFu, 512,
                                                       0xFFFFFFFFu),
                   TG_ERR_OVERFLOW);
  assert_memory_equal(out, snap, sizeof out);

  /* tg_fwht_sign_undo_f32 (in place: data is the output) */
  assert_int_equal(tg_fwht_sign_undo_f32(NULL, out, R, DV), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, NULL, R, DV), TG_ERR_NULL_ARG);
  TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, out, 0, DV), TG_ERR_BAD_SHAPE);
  TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, out, R, 0), TG_ERR_BAD_SHAPE);
  for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++)
    TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, out, 1, bad_dims[i]), TG_ERR_UNSUPPORTED);
  assert_memory_equal(out, snap, sizeof out);

  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, R, DV, W), TG_OK);
  assert_string_equal(tg_ctx_last_error(ctx), "");
  tg_ctx_destroy(ctx);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sign_table),
      cmocka_unit_test(test_fwht_sign_undo),
      cmocka_unit_test(test_reduce_values),
      cmocka_unit_test(test_reduce_empty_garbage),
      cmocka_unit_test(test_reduce_tq_hb_undo),
      cmocka_unit_test(test_decode_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
