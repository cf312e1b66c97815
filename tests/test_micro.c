/*
 * The ISA layer's inner loops, each table (portable always, then the ISA
 * under test: TG_TEST_ISA, or every one the CPU has) against f64 references.
 *
 * Tolerances: GEMMs |err| <= (K + 2) u sum_k |a b| (any summation order);
 * exp within 2 ulp of the correctly rounded result (the bound the attention
 * tests assume); conversions exact; the attention row ops within the
 * roundings of their 2-3 operations (3 u relative to the magnitudes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ops.h"
#include "philox.h"
#include "reduce.h"
#include "testutil.h"

static const double U = 0x1.0p-24;

/* The tables under test: the portable one first (the reference of the
 * bitwise checks below), then the other ISAs tu_isas gives. */
static int n_tables(const tg_isa_ops *out[TU_MAX_ISAS]) {
  tg_isa isas[TU_MAX_ISAS];
  const int n = tu_isas(isas);
  int nt = 0;
  out[nt++] = tg_isa_table(TG_ISA_PORTABLE);
  for (int i = 0; i < n; i++)
    if (isas[i] != TG_ISA_PORTABLE) out[nt++] = tg_isa_table(isas[i]);
  return nt;
}

/* Each table's blocking is one the drivers can use: key tiles whole GEMM
 * panels, tiles within the attention scratch limit. */
static void test_blocking(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  for (int t = 0; t < nt; t++) {
    const tg_isa_ops *o = tabs[t];
    printf("  %s: GEMM block %d x %d, attention tiles %d x %d (bf16 mode on the bf16 unit: "
           "%d x %d)\n", o->name, o->gemm_mr, o->gemm_nr, o->attn_bq, o->attn_bk,
           o->attn_bq_bf16, o->attn_bk_bf16);
    assert_true(o->gemm_mr >= 1 && o->gemm_mr <= 8 && o->gemm_nr >= 1);
    assert_true(o->attn_bk % o->gemm_nr == 0);
    assert_true(o->attn_bq >= 1 && o->attn_bq <= 128 && o->attn_bk >= 1 && o->attn_bk <= 128);
    assert_true(o->attn_bq_bf16 >= 1 && o->attn_bq_bf16 <= 128);
    assert_true(o->attn_bk_bf16 % o->gemm_nr == 0 && o->attn_bk_bf16 >= 1 && o->attn_bk_bf16 <= 128);
  }
}

/* C = A.B and C += A^T.B on ragged sizes (row and column edges of every
 * table's MR x NR block: 8 x 32, 6 x 16, 4 x 8; a last panel of 8, 16 or
 * 24 columns, as head dims 72, 80 and 88 leave, with and without fewer
 * than 8 columns after it). */
static void test_gemms(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 11);
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  const int sizes[][3] = {{1, 1, 1}, {4, 32, 8}, {5, 33, 7}, {64, 64, 128}, {3, 70, 64},
                          {64, 136, 64}, {13, 8, 300}, {17, 65, 9}, {48, 48, 64},
                          {47, 40, 16}, {7, 16, 3},  {9, 72, 17},  {8, 80, 6},
                          {8, 88, 5},   {6, 95, 33}, {3, 29, 4},   {10, 20, 12}};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    const int M = sizes[si][0], N = sizes[si][1], K = sizes[si][2];
    const int64_t lda = K + 3, ldat = M + 5, ldb = N + 2, ldc = N + 1;
    float *A = tu_alloc(sizeof(float) * M * lda), *At = tu_alloc(sizeof(float) * K * ldat);
    float *B = tu_alloc(sizeof(float) * K * ldb), *C = tu_alloc(sizeof(float) * M * ldc);
    float *C0 = tu_alloc(sizeof(float) * M * ldc);
    tu_fill_f32(&r, A, M * lda, -1, 1);
    tu_fill_f32(&r, At, K * ldat, -1, 1);
    tu_fill_f32(&r, B, K * ldb, -1, 1);
    tu_fill_f32(&r, C0, M * ldc, -1, 1);
    double *want = tu_alloc(sizeof(double) * M * N), *bound = tu_alloc(sizeof(double) * M * N);
    float *got = tu_alloc(sizeof(float) * M * N);
    for (int t = 0; t < nt; t++)
      for (int mode = 0; mode < 3; mode++) { /* nn write, nn accumulate, tn accumulate */
        memcpy(C, C0, sizeof(float) * M * ldc);
        if (mode < 2)
          tabs[t]->mm_nn(M, N, K, A, lda, B, ldb, C, ldc, mode);
        else
          tabs[t]->mm_tn_acc(M, N, K, At, ldat, B, ldb, C, ldc);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double s = mode ? C0[i * ldc + j] : 0, a = fabs(s);
            for (int k = 0; k < K; k++) {
              const double x = (mode < 2 ? A[i * lda + k] : At[k * ldat + i]) *
                               (double)B[k * ldb + j];
              s += x;
              a += fabs(x);
            }
            want[i * N + j] = s;
            bound[i * N + j] = (K + 3) * U * a;
            got[i * N + j] = C[i * ldc + j];
          }
        if (!tu_check_bound("gemm", got, want, bound, (int64_t)M * N))
          TU_FAIL("%s mode %d M=%d N=%d K=%d", tabs[t]->name, mode, M, N, K);
        /* padding between rows is never written */
        for (int i = 0; i < M; i++)
          assert_true(C[i * ldc + N] == C0[i * ldc + N]);
      }
    free(A), free(At), free(B), free(C), free(C0), free(want), free(bound), free(got);
  }
}

/* The bf16 dot GEMM of the tables that have it (mm_bf16_pairs, B packed by
 * pack_bf16_pairs from X = B^T): C = A.X^T and C += A.X^T on ragged sizes
 * (the 8 x 32 blocks of vdpbf16ps; the 32 x 32 blocks of 16 x 16 AMX tiles
 * with k in chunks of 32: M, N not multiples of 16 or 32, K not a multiple
 * of 32, M or N zero), A read at an odd element offset (2-byte aligned
 * only), every leading dimension larger than its row. Bound as the f32
 * GEMMs: the products are exact, the sums rounded (K + 3) u sum |a b| in
 * any order; the flush of subnormals (vdpbf16ps, TDPBF16PS) does not arise
 * for these inputs. Nothing outside the operands may be read into C or
 * written: A's row padding holds NaN, Bp's column padding NaN pairs, and
 * everything of C's buffer outside [M, N] (row padding, two rows past M) is
 * NaN, then a finite value (a NaN read, added to and written back would
 * look unchanged), that must come back bit for bit. The packing is checked
 * bit for bit, its padding unchanged. */
static void test_bf16_dot_gemm(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 12);
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  int tested = 0;
  const int sizes[][3] = {{1, 1, 2},     {8, 32, 64},   {9, 33, 66},    {64, 64, 128},
                          {3, 70, 8},    {64, 48, 512}, {17, 15, 40},   {48, 64, 256},
                          {5, 100, 34},  {32, 32, 30},  {16, 16, 32},   {33, 47, 80},
                          {31, 17, 2},   {64, 96, 66},  {40, 80, 128},  {100, 37, 256},
                          {47, 64, 34},  {32, 64, 96},  {15, 31, 30},   {0, 8, 32},
                          {8, 0, 32},    {6, 5, 0}};
  const uint16_t nan_bf16 = 0x7FC0;
  const uint32_t nan_pair = 0x7FC07FC0u;
  for (int t = 0; t < nt; t++) {
    const tg_isa_ops *o = tabs[t];
    if (!o->mm_bf16_pairs) continue;
    tested++;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      const int M = sizes[si][0], N = sizes[si][1], K = sizes[si][2];
      const int64_t lda = K + 6, ldx = K + 2, ldb = N + 3, ldc = N + 5, nc = (M + 2) * ldc;
      tg_bf16 *Abuf = tu_alloc(2 * (M * lda + 1)), *X = tu_alloc(2 * N * ldx);
      tg_bf16 *A = Abuf + 1; /* odd element offset */
      uint32_t *Bp = tu_alloc(4 * (K / 2) * ldb);
      float *C = tu_alloc(sizeof(float) * nc), *C0 = tu_alloc(sizeof(float) * nc);
      tu_fill_bf16(&r, A, M * lda, -2, 2);
      for (int i = 0; i < M; i++)
        for (int64_t k = K; k < lda; k++) A[i * lda + k] = nan_bf16;
      tu_fill_bf16(&r, X, N * ldx, -2, 2);
      tu_poison_f32(C0, nc);
      for (int i = 0; i < M; i++) tu_fill_f32(&r, C0 + i * ldc, N, -1, 1);
      for (int64_t e = 0; e < (K / 2) * ldb; e++) Bp[e] = nan_pair;
      o->pack_bf16_pairs(N, K, X, ldx, Bp, ldb);
      for (int p = 0; p < K / 2; p++)
        for (int64_t j = 0; j < ldb; j++) {
          uint32_t want = nan_pair;
          if (j < N) memcpy(&want, X + j * ldx + 2 * p, 4);
          if (Bp[p * ldb + j] != want) TU_FAIL("%s pack p=%d j=%lld", o->name, p, (long long)j);
        }
      double *want = tu_alloc(sizeof(double) * M * N), *bound = tu_alloc(sizeof(double) * M * N);
      float *got = tu_alloc(sizeof(float) * M * N);
      for (int run = 0; run < 4; run++) {
        const int acc = run & 1;
        /* runs 2, 3: a finite value outside [M, N] in place of the NaN, which
         * a read-add-write of the padding would carry back unchanged */
        if (run == 2)
          for (int64_t e = 0; e < nc; e++)
            if (e / ldc >= M || e % ldc >= N) C0[e] = 12345.0f;
        memcpy(C, C0, sizeof(float) * nc);
        o->mm_bf16_pairs(M, N, K, A, lda, Bp, ldb, C, ldc, acc);
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double s = acc ? C0[i * ldc + j] : 0, a = fabs(s);
            for (int k = 0; k < K; k++) {
              const double x = (double)tg_bf16_to_f32(A[i * lda + k]) *
                               tg_bf16_to_f32(X[j * ldx + k]);
              s += x;
              a += fabs(x);
            }
            want[i * N + j] = s;
            bound[i * N + j] = (K + 3) * U * a;
            got[i * N + j] = C[i * ldc + j];
          }
        if (!tu_check_bound("bf16 gemm", got, want, bound, (int64_t)M * N))
          TU_FAIL("%s accumulate %d M=%d N=%d K=%d", o->name, acc, M, N, K);
        for (int64_t e = 0; e < nc; e++) /* outside [M, N]: never written */
          if ((e / ldc >= M || e % ldc >= N) && memcmp(C + e, C0 + e, sizeof(float)))
            TU_FAIL("%s accumulate %d M=%d N=%d K=%d: C[%lld][%lld] outside [M, N] written",
                    o->name, acc, M, N, K, (long long)(e / ldc), (long long)(e % ldc));
      }
      free(Abuf), free(X), free(Bp), free(C), free(C0), free(want), free(bound), free(got);
    }
  }
  printf("  bf16 dot GEMM checked on %d table(s)\n", tested);
}

/* mm_bf16_terms' order as calls of mm_bf16_pairs: groups of consecutive
 * terms with one K and one A (all of them) or one Bp (all of them), each
 * group 32 k at a time, its terms in turn at every step (the first call
 * with accumulate, the rest accumulating). */
static void terms_by_calls(const tg_isa_ops *o, int n, const tg_bf16_term *terms, int M, int N,
                           int64_t lda, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  int first = 1;
  for (int g = 0, e; g < n; g = e) {
    int same_a = 1, same_b = 1;
    for (e = g + 1; e < n && terms[e].K == terms[g].K; e++) {
      const int a = same_a && terms[e].A == terms[g].A, b = same_b && terms[e].Bp == terms[g].Bp;
      if (!a && !b) break;
      same_a = a, same_b = b;
    }
    for (int k = 0; k < terms[g].K; k += 32)
      for (int t = g; t < e; t++, first = 0) {
        const int kc = terms[t].K - k < 32 ? terms[t].K - k : 32;
        o->mm_bf16_pairs(M, N, kc, terms[t].A + k, lda, terms[t].Bp + k / 2 * ldb, ldb, C, ldc,
                         accumulate || !first);
      }
  }
}

/* mm_bf16_terms, where a table has it (amx): the bits of terms_by_calls,
 * for 1-3 parts of one K against one B (the attention's P, dS parts), one
 * A against 1-3 B (the transposed dK, dV sums: Q^T, dO^T against the
 * parts in pairs), and two key tiles' parts in turn (tile 1's A and B
 * further along k, its own K, as the backward's dQ passes them), on
 * ragged sizes (edge tiles, K % 32, a partial 32 x 32 block; k of 384 and
 * 402 as the forward's P.V over long key tiles), and nothing
 * of C outside [M, N] written (NaN there must come back bit for bit). The
 * parts are a f32 block's hi, lo, lo2, as the attention passes them. */
static void test_bf16_terms_gemm(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 13);
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  int tested = 0;
  const int sizes[][3] = {{64, 64, 128}, {9, 33, 66}, {48, 256, 64}, {128, 128, 128},
                          {17, 15, 40},  {33, 47, 80}, {1, 1, 2},     {0, 8, 32},
                          {70, 80, 402}, {32, 64, 384}};
  for (int t = 0; t < nt; t++) {
    const tg_isa_ops *o = tabs[t];
    if (!o->mm_bf16_terms) continue;
    tested++;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      const int M = sizes[si][0], N = sizes[si][1], K = sizes[si][2];
      const int64_t lda = K + 4, ldx = K + 2, ldb = N + 3, ldc = N + 5, nc = (M + 1) * ldc;
      float *X32 = tu_alloc(sizeof(float) * (M * lda + 1));
      uint16_t *parts[3];
      for (int p = 0; p < 3; p++) parts[p] = tu_alloc(2 * (M * lda + 1));
      tg_bf16 *X = tu_alloc(2 * N * ldx);
      uint32_t *Bps[3];
      for (int p = 0; p < 3; p++) Bps[p] = tu_alloc(4 * (K / 2 + 1) * ldb);
      float *C0 = tu_alloc(sizeof(float) * nc), *want = tu_alloc(sizeof(float) * nc),
            *got = tu_alloc(sizeof(float) * nc);
      tu_fill_f32(&r, X32, M * lda, -2, 2);
      o->f32_to_bf16_split(M, lda, X32, lda, TG_SPLIT_ROWS, parts[0], parts[1], parts[2], lda);
      for (int p = 0; p < 3; p++) {
        tu_fill_bf16(&r, X, N * ldx, -2, 2);
        o->pack_bf16_pairs(N, K, X, ldx, Bps[p], ldb);
      }
      const uint32_t *Bp = Bps[0];
      tu_poison_f32(C0, nc);
      for (int i = 0; i < M; i++) tu_fill_f32(&r, C0 + i * ldc, N, -1, 1);
      const int K1 = K / 4 * 2; /* tile 0's k (even), tile 1 the rest */
      for (int kind = 0; kind < 3; kind++) /* parts against one B, two tiles, one A */
        for (int n = 1; n <= 3; n++)
          for (int acc = 0; acc < 2; acc++) {
            tg_bf16_term terms[6];
            int nt = 0;
            for (int p = 0; p < n; p++)
              terms[nt++] = kind == 2 ? (tg_bf16_term){parts[0], Bps[p], K}
                                      : (tg_bf16_term){parts[p], Bp, kind == 0 ? K : K1};
            for (int p = 0; p < n && kind == 1; p++)
              terms[nt++] = (tg_bf16_term){parts[p] + K1, Bp + K1 / 2 * ldb, K - K1};
            memcpy(want, C0, sizeof(float) * nc);
            terms_by_calls(o, nt, terms, M, N, lda, ldb, want, ldc, acc);
            memcpy(got, C0, sizeof(float) * nc);
            o->mm_bf16_terms(nt, terms, M, N, lda, ldb, got, ldc, acc);
            if (memcmp(got, want, sizeof(float) * nc))
              TU_FAIL("%s terms of kind %d x %d parts, accumulate %d M=%d N=%d K=%d: not the "
                      "bits of their calls",
                      o->name, kind, n, acc, M, N, K);
          }
      for (int p = 0; p < 3; p++) free(parts[p]), free(Bps[p]);
      free(X32), free(X), free(C0), free(want), free(got);
    }
  }
  printf("  bf16 terms GEMM checked on %d table(s)\n", tested);
}

static void test_exp(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  const int64_t n = 1 << 18;
  float *x = tu_alloc(sizeof(float) * n), *y = tu_alloc(sizeof(float) * n);
  tu_rng r = tu_rng_make(tu_seed() + 12);
  tu_fill_f32(&r, x, n, -110, 95);
  const float special[] = {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, 88.72283f, 88.7229f,
                           -87.33654f, -103.97f, -104.5f, 1e-30f, -1e-30f};
  memcpy(x, special, sizeof special);
  for (int t = 0; t < nt; t++) {
    tabs[t]->exp_f32(x, y, n);
    for (int64_t i = 0; i < n; i++) {
      const double e = exp((double)x[i]);
      const float want = (float)e; /* correctly rounded (double rounding is harmless here) */
      if (isnan(x[i])) {
        assert_true(isnan(y[i]));
        continue;
      }
      if (isinf(want) || want == 0.0f) {
        /* overflow must give inf; deep underflow 0 or the smallest subnormals */
        if (isinf(want)) assert_true(isinf(y[i]) || y[i] == 3.40282347e38f);
        else assert_true(y[i] <= 0x1p-148f);
        continue;
      }
      const double ulp = e < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(e) - 23);
      if (fabs(y[i] - e) > 2 * ulp)
        TU_FAIL("%s exp(%a) = %a, want %a (%.2f ulp)", tabs[t]->name, (double)x[i],
                (double)y[i], e, fabs(y[i] - e) / ulp);
    }
  }
  free(x), free(y);
}

/* attn_exp_sum_row: rows of s <= shift (the forward's running max) with
 * -inf entries and scores from 0 to 110 below the shift, ragged lengths.
 * Bounds (u = 2^-24): e[k] within 2 ulp of exp(f32(s[k] - shift)) where
 * that is >= 2^-126 (x > -87.3), and 0 <= e[k] <= 2^-126 below (the op
 * flushes there); the sum within (n/16 + 4) u S + 2 ulp per term (16 lane
 * sums, a 4-level tree, the tail in order: 2 ulp <= 4u e), plus 2^-126
 * per flushed term. A NaN or +inf shift (a NaN or
 * overflowed score reached the row's max) makes the row and its sum NaN. */
static void test_exp_sum_row(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 14);
  const int64_t lens[] = {1, 7, 16, 48, 77, 128, 1000};
  enum { NMAX = 1000 };
  float s0[NMAX], s[NMAX];
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int fill = 0; fill < 3; fill++) { /* near the max, the whole range, -inf entries */
      const int64_t n = lens[li];
      const float shift = fill == 0 ? 1.5f : -3.25f;
      tu_fill_f32(&r, s0, n, fill == 0 ? -8.0f : -110.0f, 0.0f);
      for (int64_t k = 0; k < n; k++) s0[k] += shift;
      s0[n / 2] = shift; /* the max itself */
      if (fill == 2)
        for (int64_t k = 0; k < n; k += 3) s0[k] = -INFINITY;
      for (int t = 0; t < nt; t++) {
        memcpy(s, s0, sizeof(float) * (size_t)n);
        const float sum = tabs[t]->attn_exp_sum_row(s, n, shift);
        double want_sum = 0;
        for (int64_t k = 0; k < n; k++) {
          const float x = s0[k] - shift;
          const double e = exp((double)x);
          want_sum += e;
          if (x <= -87.3f) {
            if (!(s[k] >= 0.0f && s[k] <= 0x1p-126f))
              TU_FAIL("%s attn_exp_sum_row exp(%a) = %a", tabs[t]->name, (double)x, (double)s[k]);
            continue;
          }
          const double ulp = e < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(e) - 23);
          if (fabs(s[k] - e) > 2 * ulp)
            TU_FAIL("%s attn_exp_sum_row exp(%a) = %a, want %a", tabs[t]->name, (double)x,
                    (double)s[k], e);
        }
        const double bound = ((double)n / 16 + 8) * U * want_sum + (double)n * 0x1p-126;
        if (fabs(sum - want_sum) > bound)
          TU_FAIL("%s attn_exp_sum_row n %lld: sum %g want %g", tabs[t]->name, (long long)n,
                  (double)sum, want_sum);
      }
    }
  for (int t = 0; t < nt; t++) /* a NaN or +inf max */
    for (int which = 0; which < 2; which++) {
      const int64_t n = 77;
      tu_fill_f32(&r, s, n, -8.0f, 0.0f);
      s[3] = which ? INFINITY : NAN;
      const float sum = tabs[t]->attn_exp_sum_row(s, n, which ? INFINITY : NAN);
      assert_true(isnan(sum));
      assert_true(isnan(s[3]));
      if (!which) assert_true(isnan(s[0]));
    }
}

/* The exp of P's bf16 part (isa/common/rows.c, exp_bf16_lane): within
 * EXPB_REL of e^x, 0 where x <= -87.3. */
static const double EXPB_REL = 3.2e-6;

/* Is p the bf16 (nearest even) of a value within EXPB_REL of e^x? Rounding
 * is monotonic: p lies between the roundings of the interval's ends (a
 * part below 2^-126 may be written as 0, as vcvtneps2bf16 writes it). */
static int is_bf16_of_exp(uint16_t p, float x) {
  if (x <= -87.3f) return p == 0;
  const double e = exp((double)x);
  const float lo = nextafterf((float)(e * (1 - EXPB_REL)), 0.0f);
  const float hi = nextafterf((float)(e * (1 + EXPB_REL)), INFINITY);
  const float got = tg_bf16_to_f32(p);
  return (got >= tg_bf16_to_f32(tg_f32_to_bf16(lo)) && got <= tg_bf16_to_f32(tg_f32_to_bf16(hi))) ||
         (p == 0 && lo < 0x1p-126f);
}

/* The sum of n exps within EXPB_REL each (0 where x <= -87.3) against
 * their f64 sum: the exp-sum row's f32 bound (test_exp_sum_row) plus
 * EXPB_REL. */
static int exp_sum_within(float sum, const float *x, int64_t n) {
  double want = 0;
  for (int64_t k = 0; k < n; k++) want += x[k] > -87.3f ? exp((double)x[k]) : 0.0;
  return fabs(sum - want) <= (((double)n / 16 + 8) * U + EXPB_REL) * want + (double)n * 0x1p-126;
}

/* attn_exp_sum_bf16_row: on every table P's bf16 part of an exp within
 * EXPB_REL of e^(s - shift) and their sum within the f32 sums' bound
 * (s - shift <= 0: the shorter exp); with a NaN or +inf shift, the bits of
 * attn_exp_sum_row's sum and of the one bf16 part f32_to_bf16_split makes
 * of its P (the row NaN: exp_lane's NaN and overflow). s is left as it was;
 * rows near the max, over the whole range, with -inf entries (P = 0),
 * ragged lengths. */
static void test_exp_sum_bf16_row(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 15);
  const int64_t lens[] = {1, 7, 16, 48, 77, 128, 1000};
  enum { NMAX = 1000 };
  float s0[NMAX], s[NMAX], ref[NMAX], x[NMAX];
  uint16_t p[NMAX + 2], want[NMAX + 2];
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int fill = 0; fill < 5; fill++) { /* near the max, whole range, -inf, NaN, +inf shift */
      const int64_t n = lens[li];
      const float shift = fill == 3 ? NAN : fill == 4 ? INFINITY : fill == 0 ? 1.5f : -3.25f;
      tu_fill_f32(&r, s0, n, fill == 0 ? -8.0f : -110.0f, 0.0f);
      for (int64_t k = 0; k < n; k++) s0[k] += fill < 3 ? shift : 0.0f;
      if (fill == 2)
        for (int64_t k = 0; k < n; k += 3) s0[k] = -INFINITY;
      if (fill == 4) s0[n / 2] = INFINITY;
      for (int64_t k = 0; k < n; k++) x[k] = s0[k] - shift;
      for (int t = 0; t < nt; t++) {
        memcpy(s, s0, sizeof(float) * (size_t)n);
        const float sum = tabs[t]->attn_exp_sum_bf16_row(s, n, shift, p);
        assert_memory_equal(s, s0, sizeof(float) * (size_t)n);
        if (fill >= 3) { /* the NaN row: attn_exp_sum_row's bits */
          memcpy(ref, s0, sizeof(float) * (size_t)n);
          const float want_sum = tabs[t]->attn_exp_sum_row(ref, n, shift);
          tabs[t]->f32_to_bf16_split(1, n, ref, n, TG_SPLIT_ROWS, want, NULL, NULL, NMAX + 2);
          if (!(sum != sum && want_sum != want_sum))
            TU_FAIL("%s attn_exp_sum_bf16_row n %lld fill %d: sum %a want NaN", tabs[t]->name,
                    (long long)n, fill, (double)sum);
          if (memcmp(p, want, sizeof(uint16_t) * (size_t)n))
            TU_FAIL("%s attn_exp_sum_bf16_row n %lld fill %d: P's bf16 part differs",
                    tabs[t]->name, (long long)n, fill);
          continue;
        }
        for (int64_t k = 0; k < n; k++)
          if (!is_bf16_of_exp(p[k], x[k]))
            TU_FAIL("%s attn_exp_sum_bf16_row n %lld fill %d: P[%lld] %a for e^%a = %a",
                    tabs[t]->name, (long long)n, fill, (long long)k,
                    (double)tg_bf16_to_f32(p[k]), (double)x[k], exp((double)x[k]));
        if (!exp_sum_within(sum, x, n))
          TU_FAIL("%s attn_exp_sum_bf16_row n %lld fill %d: sum %a", tabs[t]->name,
                  (long long)n, fill, (double)sum);
      }
    }
}

/* attn_exp_sum_lag_bf16_row (the forward's pass with a stale max m): on
 * every table P's bf16 parts are those of an exp within EXPB_REL of
 * e^(f32(f32(scale s) - m)) (0 where the argument is <= -87.3), and where
 * every scale s <= m they are attn_score_max_row + attn_exp_sum_bf16_row's
 * bits; the sum is within exp_sum_within's bound; *max_out the max of
 * f32(scale s), NaN where a score is NaN; s untouched. Rows below m, up to
 * 8 above it, ragged. */
static void test_exp_sum_lag_bf16_row(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 16);
  const int64_t lens[] = {1, 7, 16, 48, 77, 128, 1000};
  enum { NMAX = 1000 };
  float s0[NMAX], s[NMAX], x[NMAX], two[NMAX];
  uint16_t p[NMAX + 2], want2[NMAX + 2];
  const float scale = 0.125f, m = 3.0f;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
    for (int fill = 0; fill < 3; fill++) { /* below m, up to 8 above it, a NaN score */
      const int64_t n = lens[li];
      tu_fill_f32(&r, s0, n, -900.0f, fill == 0 ? 24.0f : 88.0f); /* scale s: -112.5 .. 3 / 11 */
      if (fill == 2) s0[n / 3] = NAN;
      float mx = -INFINITY;
      for (int64_t k = 0; k < n; k++) {
        const float sc = scale * s0[k];
        x[k] = sc - m;
        mx = sc > mx ? sc : mx;
      }
      for (int t = 0; t < nt; t++) {
        memcpy(s, s0, sizeof(float) * (size_t)n);
        float got_max;
        const float sum = tabs[t]->attn_exp_sum_lag_bf16_row(s, n, scale, m, p, &got_max);
        assert_memory_equal(s, s0, sizeof(float) * (size_t)n);
        if (fill == 2) {
          assert_true(isnan(got_max));
          continue;
        }
        if (got_max != mx) TU_FAIL("%s lag row: max %a want %a", tabs[t]->name, (double)got_max, (double)mx);
        for (int64_t k = 0; k < n; k++)
          if (!is_bf16_of_exp(p[k], x[k]))
            TU_FAIL("%s lag row n %lld fill %d: P[%lld] %a for e^%a", tabs[t]->name,
                    (long long)n, fill, (long long)k, (double)tg_bf16_to_f32(p[k]), (double)x[k]);
        if (!exp_sum_within(sum, x, n))
          TU_FAIL("%s lag row n %lld: sum %a", tabs[t]->name, (long long)n, (double)sum);
        if (fill == 0) { /* every scale s <= m: the two passes' bits */
          memcpy(two, s0, sizeof(float) * (size_t)n);
          const float tmax = tabs[t]->attn_score_max_row(two, n, n, scale, NULL, TG_DTYPE_F32);
          const float m_new = tmax > m ? tmax : m;
          const float sum2 = tabs[t]->attn_exp_sum_bf16_row(two, n, m_new, want2);
          assert_true(m_new == m);
          assert_memory_equal(&sum, &sum2, sizeof sum);
          assert_memory_equal(p, want2, sizeof(uint16_t) * (size_t)n);
        }
      }
    }
}

static void test_conversions_and_dot(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 13);
  const int64_t n = 1000;
  tg_bf16 *a = tu_alloc(2 * n), *b = tu_alloc(2 * n), *back = tu_alloc(2 * n);
  float *f = tu_alloc(sizeof(float) * n);
  tu_fill_bf16(&r, a, n, -4, 4);
  tu_fill_bf16(&r, b, n, -4, 4);
  for (int t = 0; t < nt; t++) {
    tabs[t]->bf16_to_f32(a, f, n);
    for (int64_t i = 0; i < n; i++) assert_true(f[i] == tg_bf16_to_f32(a[i]));
    tabs[t]->f32_to_bf16(f, back, n);
    assert_memory_equal(back, a, 2 * n);
    for (int64_t len = 1; len <= n; len = len * 3 + 1) {
      double s = 0, abs_sum = 0;
      for (int64_t i = 0; i < len; i++) {
        const double x = (double)tg_bf16_to_f32(a[i]) * tg_bf16_to_f32(b[i]);
        s += x;
        abs_sum += fabs(x);
      }
      const float got = tabs[t]->dot_bf16(a, b, len);
      if (fabs(got - s) > (len + 2) * U * abs_sum)
        TU_FAIL("%s dot_bf16 len %lld: got %g want %g", tabs[t]->name, (long long)len,
                (double)got, s);
    }
  }
  free(a), free(b), free(back), free(f);
}

/* attn_score_row / attn_ds_row on ragged rows: visible prefix, bf16 and f32
 * masks with -inf entries, the causal tail set to -inf. */
/* Element k of a mask row as the row ops read it (0 without a mask). */
static double mask_at(const void *m_row, tg_dtype m_type, int64_t k) {
  if (!m_row) return 0.0;
  return m_type == TG_DTYPE_F32 ? ((const float *)m_row)[k]
                                : tg_bf16_to_f32(((const tg_bf16 *)m_row)[k]);
}

static void test_attention_rows(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 17);
  enum { N = 77 };
  float s0[N], s[N], p[N], dp0[N], dp[N];
  tg_bf16 mask[N];
  float mask_f32[N];
  tu_fill_f32(&r, s0, N, -8, 8);
  tu_fill_f32(&r, p, N, 0, 1);
  tu_fill_f32(&r, dp0, N, -2, 2);
  tu_fill_bf16(&r, mask, N, -3, 3);
  tu_fill_f32(&r, mask_f32, N, -3, 3);
  mask[5] = mask[40] = 0xFF80; /* -inf */
  mask_f32[7] = mask_f32[41] = -INFINITY;
  const float scale = 0.37f, shift = 1.25f, d = 0.3f;
  for (int t = 0; t < nt; t++) {
    /* with_mask: 0 none, 1 bf16, 2 f32 */
    for (int with_mask = 0; with_mask < 3; with_mask++)
      for (int64_t n_vis = -1; n_vis <= N + 1; n_vis += 13) {
        memcpy(s, s0, sizeof s);
        const void *m_row = with_mask == 0 ? NULL : with_mask == 1 ? (const void *)mask : mask_f32;
        const tg_dtype m_type = with_mask == 2 ? TG_DTYPE_F32 : TG_DTYPE_BF16;
        tabs[t]->attn_score_row(s, N, n_vis, scale, m_row, m_type, shift);
        for (int64_t k = 0; k < N; k++) {
          const double m = mask_at(m_row, m_type, k);
          if (k >= n_vis || m == -INFINITY) {
            assert_true(s[k] == -INFINITY);
            continue;
          }
          const double want = (double)scale * s0[k] + m - shift;
          const double mag = fabs((double)scale * s0[k]) + fabs(m) + fabs(shift);
          if (fabs(s[k] - want) > 3 * U * mag)
            TU_FAIL("%s attn_score_row k %lld: got %g want %g", tabs[t]->name, (long long)k,
                    (double)s[k], want);
        }
        /* attn_prob_row against exp of the f64 score, for every length's
         * vector tail, with NaN, infinities, overflow and underflow among
         * the scores: masked and hidden keys exactly 0; else within the
         * roundings of x = scale s + m - shift (two, or one where fused: at
         * most 2^-23 (|scale s| + |m| + |shift|)) carried through exp, and
         * exp's 2 ulp, plus 2^-148 where the result is subnormal */
        for (int64_t n = 1; n <= N; n += n < 20 ? 1 : 19) {
          float sp[N], sv[N]; /* the row, and its scores before the call */
          memcpy(sv, s0, sizeof sv);
          sv[3] = NAN, sv[9] = INFINITY, sv[20] = -INFINITY, sv[33] = 400.0f, sv[50] = -400.0f;
          memcpy(sp, sv, sizeof sp);
          const int64_t nv = n_vis < n ? n_vis : n;
          tabs[t]->attn_prob_row(sp, n, nv, scale, m_row, m_type, shift);
          for (int64_t k = 0; k < n; k++) {
            const double m = mask_at(m_row, m_type, k);
            const int hidden = k >= nv || m == -INFINITY;
            const double want = hidden ? 0.0 : exp((double)scale * sv[k] + m - shift);
            const double mag = fabs((double)scale * sv[k]) + fabs(m) + fabs(shift);
            const double bound = want * (0x1p-23 * mag + 0x1p-22) * 1.01 + 0x1p-148;
            const int ok = hidden || want == 0.0 ? sp[k] == 0.0f /* (-inf scores too) */
                           : isnan(want)    ? isnan(sp[k])
                           : want > 0x1p128 ? sp[k] == INFINITY
                                            : fabs(sp[k] - want) <= bound;
            if (!ok)
              TU_FAIL("%s attn_prob_row n %lld n_vis %lld mask %d k %lld: %a, want %a",
                      tabs[t]->name, (long long)n, (long long)nv, with_mask, (long long)k,
                      (double)sp[k], want);
          }
        }
      }
    memcpy(dp, dp0, sizeof dp);
    tabs[t]->attn_ds_row(dp, p, N, d, scale);
    for (int64_t k = 0; k < N; k++) {
      const double want = (double)scale * p[k] * ((double)dp0[k] - d);
      const double mag = (double)scale * p[k] * (fabs(dp0[k]) + fabs(d));
      if (fabs(dp[k] - want) > 3 * U * mag)
        TU_FAIL("%s attn_ds_row k %lld: got %g want %g", tabs[t]->name, (long long)k,
                (double)dp[k], want);
    }
  }
}

/* dropout_keep against the scalar Philox4x32-10 of isa/philox.h, draw by
 * draw: ragged starts and lengths (every start word of a block, runs across
 * several vector batches), a counter whose low 64 bits wrap (the carry into
 * word 2), thresholds 0, 1, 2^31 and 2^32 - 1. Exact on every table. */
static void test_dropout_keep(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 23);
  const uint32_t thresholds[] = {0, 1, 0x80000000u, 0xFFFFFFFFu, (uint32_t)tu_next(&r)};
  enum { NMAX = 300 };
  uint8_t got[NMAX];
  for (int c = 0; c < 40; c++) {
    const uint64_t seed = tu_next(&r);
    const uint64_t offset = c % 2 ? tu_next(&r) : UINT64_MAX - (uint64_t)tu_int(&r, 0, 80);
    const uint64_t n0 = c < 8 ? (uint64_t)c : tu_next(&r) >> tu_int(&r, 2, 40);
    const int64_t n = tu_int(&r, 0, NMAX);
    const uint32_t t = thresholds[c % 5];
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (int ti = 0; ti < nt; ti++) {
      memset(got, 7, sizeof got);
      tabs[ti]->dropout_keep(got, n, n0, seed, offset, t);
      for (int64_t j = 0; j < n; j++) {
        const uint64_t draw = n0 + (uint64_t)j, ctr = offset + draw / 4;
        const uint32_t c4[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), ctr < offset, 0};
        uint32_t w[4];
        tg_philox4x32_10(c4, key, w);
        if (got[j] != (w[draw % 4] >= t))
          TU_FAIL("%s dropout_keep draw %llu (n0 %llu + %lld): got %d", tabs[ti]->name,
                  (unsigned long long)draw, (unsigned long long)n0, (long long)j, got[j]);
      }
      for (int64_t j = n; j < NMAX; j++) assert_int_equal(got[j], 7); /* nothing past n */
    }
  }
}

/* --- row ops of the memory-bound kernels ---------------------------------------
 * Bounds (u = 2^-24), each the roundings of the op's own f32 formula:
 *   dot / dot3 of n terms      (n + 2) u sum|terms|    (any order)
 *   max                        exact
 *   scale2 (x*a)*b             2 u (1 + u) |x a b|
 *   add                        u |d + s|
 *   acc_mul2 acc + a*s*b       3 u (1 + 2u) (|acc| + |a s b|)
 *   rms_dx_row r*(dy w - x c)  4 u (1 + 3u) |r| (|dy w| + |x c|)
 *   fwht_mul                   2 (log2 n + 2) u sum|x| max|mul|, and bit-equal
 *                              between tables (each output is one add/sub)
 *   transpose                  exact
 *   wsum4                      ((nw + 2) u sum|a p| + u |sum|) / |div| + u |result|
 * Lengths are ragged (not multiples of 16) wherever the op allows. */
static const int64_t k_lens[] = {0, 1, 5, 15, 16, 17, 31, 33, 100, 1000, 1031, 2500};
#define N_LENS ((int)(sizeof k_lens / sizeof k_lens[0]))

static void test_row_reductions(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 19);
  enum { NMAX = 2600 };
  float *a = tu_alloc(sizeof(float) * NMAX), *b = tu_alloc(sizeof(float) * NMAX);
  float *c = tu_alloc(sizeof(float) * NMAX);
  tu_fill_f32(&r, a, NMAX, -3, 3);
  tu_fill_f32(&r, b, NMAX, -2, 2);
  tu_fill_f32(&r, c, NMAX, -1, 1);
  for (int t = 0; t < nt; t++)
    for (int li = 0; li < N_LENS; li++) {
      const int64_t n = k_lens[li];
      double d2 = 0, a2 = 0, d3 = 0, a3 = 0, mx = -INFINITY;
      for (int64_t i = 0; i < n; i++) {
        d2 += (double)a[i] * b[i], a2 += fabs((double)a[i] * b[i]);
        d3 += (double)a[i] * b[i] * c[i], a3 += fabs((double)a[i] * b[i] * c[i]);
        if (a[i] > mx) mx = a[i];
      }
      const float g2 = tabs[t]->dot_f32(a, b, n), g3 = tabs[t]->dot3_f32(a, b, c, n);
      if (fabs(g2 - d2) > (n + 2) * U * a2)
        TU_FAIL("%s dot_f32 n %lld: got %g want %g", tabs[t]->name, (long long)n, (double)g2, d2);
      if (fabs(g3 - d3) > (n + 2) * U * a3)
        TU_FAIL("%s dot3_f32 n %lld: got %g want %g", tabs[t]->name, (long long)n, (double)g3, d3);
      if (tabs[t]->max_f32(a, n) != (float)mx)
        TU_FAIL("%s max_f32 n %lld", tabs[t]->name, (long long)n);
    }
  /* max: -inf for n == 0, NaN entries skipped, -inf rows */
  for (int t = 0; t < nt; t++) {
    float v[20];
    for (int i = 0; i < 20; i++) v[i] = -INFINITY;
    assert_true(tabs[t]->max_f32(v, 0) == -INFINITY);
    assert_true(tabs[t]->max_f32(v, 20) == -INFINITY);
    v[3] = NAN, v[17] = -7.0f;
    assert_true(tabs[t]->max_f32(v, 20) == -7.0f);
  }
  free(a), free(b), free(c);
}

static void test_row_elementwise(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 23);
  enum { NMAX = 2600 };
  float *x = tu_alloc(sizeof(float) * NMAX), *w = tu_alloc(sizeof(float) * NMAX);
  float *dy = tu_alloc(sizeof(float) * NMAX), *y = tu_alloc(sizeof(float) * NMAX + 64);
  tu_fill_f32(&r, x, NMAX, -3, 3);
  tu_fill_f32(&r, w, NMAX, -2, 2);
  tu_fill_f32(&r, dy, NMAX, -1, 1);
  const float a = 0.37f, s = -1.7f, rr = 1.3f, cc = 0.21f;
  for (int t = 0; t < nt; t++)
    for (int li = 0; li < N_LENS; li++) {
      const int64_t n = k_lens[li];
      const char *nm = tabs[t]->name;
      y[n] = 12345.0f; /* sentinel: nothing written past n */
      memcpy(y, x, sizeof(float) * n);
      tabs[t]->scale2_f32(y, n, a, s);
      for (int64_t i = 0; i < n; i++) {
        const double want = (double)x[i] * a * s;
        if (fabs(y[i] - want) > 2 * U * (1 + U) * fabs(want)) TU_FAIL("%s scale2_f32 i %lld", nm, (long long)i);
      }
      memcpy(y, w, sizeof(float) * n);
      tabs[t]->add_f32(y, x, n);
      for (int64_t i = 0; i < n; i++) {
        const double want = (double)w[i] + x[i];
        if (fabs(y[i] - want) > U * fabs(want)) TU_FAIL("%s add_f32 i %lld", nm, (long long)i);
      }
      memcpy(y, w, sizeof(float) * n);
      tabs[t]->acc_mul2_f32(y, x, dy, s, n);
      for (int64_t i = 0; i < n; i++) {
        const double p = (double)x[i] * s * dy[i], want = w[i] + p;
        if (fabs(y[i] - want) > 3 * U * (1 + 2 * U) * (fabs(w[i]) + fabs(p)))
          TU_FAIL("%s acc_mul2_f32 i %lld: got %g want %g", nm, (long long)i, (double)y[i], want);
      }
      tabs[t]->rms_dx_row(x, w, dy, rr, cc, y, n);
      for (int64_t i = 0; i < n; i++) {
        const double want = (double)rr * ((double)dy[i] * w[i] - (double)x[i] * cc);
        const double mag = fabs(rr) * (fabs((double)dy[i] * w[i]) + fabs((double)x[i] * cc));
        if (fabs(y[i] - want) > 4 * U * (1 + 3 * U) * mag)
          TU_FAIL("%s rms_dx_row i %lld: got %g want %g", nm, (long long)i, (double)y[i], want);
      }
      assert_true(y[n] == 12345.0f);
    }
  free(x), free(w), free(dy), free(y);
}

/* add_compensated_f32: a part in [1, 2) then 299 in [0, 1e-8), each below
 * half an ulp of the sum (a plain f32 sum loses them all: checked, so the
 * bound is not vacuous), against the f64 sum: Kahan's bound
 * (2u + 4 m u^2) sum|x| for m parts (Higham, Accuracy and Stability, 4.3);
 * the parts zeroed; the same bits on every table (no contraction). */
static void test_add_compensated(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 29);
  enum { N = 37, M = 300 };
  float parts[M][N], sum[TU_MAX_ISAS][N], comp[N], x[N], plain[N];
  for (int m = 0; m < M; m++) tu_fill_f32(&r, parts[m], N, m ? 0 : 1, m ? 1e-8 : 2);
  double want[N] = {0}, mag[N] = {0};
  for (int m = 0; m < M; m++)
    for (int i = 0; i < N; i++) want[i] += parts[m][i], mag[i] += fabs(parts[m][i]);
  for (int t = 0; t < nt; t++) {
    memset(sum[t], 0, sizeof sum[t]), memset(comp, 0, sizeof comp), memset(plain, 0, sizeof plain);
    for (int m = 0; m < M; m++) {
      memcpy(x, parts[m], sizeof x);
      tabs[t]->add_compensated_f32(sum[t], comp, x, N);
      for (int i = 0; i < N; i++) assert_true(x[i] == 0.0f), plain[i] += parts[m][i];
    }
    double worst_plain = 0;
    for (int i = 0; i < N; i++) {
      const double bound = (2 * U + 4 * M * U * U) * mag[i];
      if (fabs(sum[t][i] - want[i]) > bound)
        TU_FAIL("%s add_compensated_f32 i %d: got %.9g want %.9g bound %.3g", tabs[t]->name, i,
                (double)sum[t][i], want[i], bound);
      worst_plain = fmax(worst_plain, fabs(plain[i] - want[i]) / bound);
    }
    assert_true(worst_plain > 1); /* the plain sum leaves Kahan's bound */
    assert_memory_equal(sum[t], sum[0], sizeof sum[0]);
  }
}

static int popcount_u(unsigned v) {
  int c = 0;
  for (; v; v &= v - 1) c++;
  return c;
}

static void test_fwht(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 29);
  const int64_t sizes[] = {16, 32, 64, 256, 512};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    const int64_t n = sizes[si];
    int logn = 0;
    while (((int64_t)1 << logn) < n) logn++;
    float *x = tu_alloc(sizeof(float) * n), *mul = tu_alloc(sizeof(float) * n);
    float *y = tu_alloc(sizeof(float) * n), *y0 = tu_alloc(sizeof(float) * n);
    tu_fill_f32(&r, x, n, -1, 1);
    for (int64_t i = 0; i < n; i++) x[i] *= (float)ldexp(1.0, tu_int(&r, -10, 10));
    tu_fill_f32(&r, mul, n, -2, 2);
    double sumabs = 0, maxmul = 0;
    for (int64_t i = 0; i < n; i++) sumabs += fabs(x[i]), maxmul = fmax(maxmul, fabs(mul[i]));
    for (int t = 0; t < nt; t++) {
      memcpy(y, x, sizeof(float) * n);
      tabs[t]->fwht_mul_f32(y, n, mul);
      for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += (popcount_u((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[i];
        acc *= mul[j];
        if (fabs(y[j] - acc) > 2.0 * (logn + 2) * U * sumabs * maxmul)
          TU_FAIL("%s fwht_mul_f32 n %lld j %lld: got %g want %g", tabs[t]->name, (long long)n,
                  (long long)j, (double)y[j], acc);
      }
      if (t == 0)
        memcpy(y0, y, sizeof(float) * n);
      else if (memcmp(y, y0, sizeof(float) * n))
        TU_FAIL("%s fwht_mul_f32 n %lld differs bitwise from %s", tabs[t]->name, (long long)n,
                tabs[0]->name);
    }
    free(x), free(mul), free(y), free(y0);
  }
}

static void test_transpose(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 31);
  const int64_t sizes[][2] = {{1, 1}, {1, 37}, {37, 1}, {15, 17}, {16, 16}, {33, 70},
                              {64, 64}, {100, 37}, {48, 160}};
  /* each size with a ragged output stride and a 16-float one (on which the
   * AVX-512 table's streaming stores apply), streaming on and off */
  for (size_t si = 0; si < 2 * sizeof sizes / sizeof sizes[0]; si++) {
    const int64_t R = sizes[si / 2][0], C = sizes[si / 2][1], lds = C + 3;
    const int64_t ldd = si % 2 ? (R + 15) / 16 * 16 : R + 5;
    float *src = tu_alloc(sizeof(float) * R * lds);
    float *dst = aligned_alloc(64, (sizeof(float) * C * ldd + 63) / 64 * 64);
    assert_non_null(dst);
    tu_fill_f32(&r, src, R * lds, -1, 1);
    for (int t = 0; t < 2 * nt; t++) {
      for (int64_t i = 0; i < C * ldd; i++) dst[i] = 777.0f;
      tabs[t / 2]->transpose_f32(R, C, src, lds, dst, ldd, t % 2);
      for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < ldd; i++) {
          const float want = i < R ? src[i * lds + c] : 777.0f; /* padding untouched */
          if (memcmp(&dst[c * ldd + i], &want, sizeof want))
            TU_FAIL("%s transpose_f32 %lldx%lld ldd %lld stream %d at (%lld, %lld)",
                    tabs[t / 2]->name, (long long)R, (long long)C, (long long)ldd, t % 2,
                    (long long)c, (long long)i);
        }
    }
    /* add_transposed_f32: dst (+ one f32 add each) = base + src^T */
    float *base = tu_alloc(sizeof(float) * C * ldd);
    tu_fill_f32(&r, base, C * ldd, -1, 1);
    for (int t = 0; t < nt; t++) {
      memcpy(dst, base, sizeof(float) * C * ldd);
      tabs[t]->add_transposed_f32(R, C, src, lds, dst, ldd);
      for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < ldd; i++) {
          const float b = base[c * ldd + i], want = i < R ? b + src[i * lds + c] : b;
          if (memcmp(&dst[c * ldd + i], &want, sizeof want))
            TU_FAIL("%s add_transposed_f32 %lldx%lld ldd %lld at (%lld, %lld)", tabs[t]->name,
                    (long long)R, (long long)C, (long long)ldd, (long long)c, (long long)i);
        }
    }
    free(src), free(dst), free(base);
  }
}

static void test_wsum4(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 37);
  const int64_t lds[] = {1, 3, 16};
  const int64_t n4s[] = {1, 3, 4, 5, 64, 67};
  for (size_t li = 0; li < 3; li++)
    for (size_t ni = 0; ni < 6; ni++) {
      const int64_t ld = lds[li], n4 = n4s[ni];
      float *part = tu_alloc(sizeof(float) * n4 * ld * 4), *a = tu_alloc(sizeof(float) * ld);
      float *dst = tu_alloc(sizeof(float) * (n4 * 4 + 1));
      int32_t *w = tu_alloc(sizeof(int32_t) * ld);
      tu_fill_f32(&r, part, n4 * ld * 4, -2, 2);
      /* every third workgroup left out; its partials are NaN and must never be read */
      int64_t nw = 0;
      for (int64_t g = 0; g < ld; g++) {
        if (ld > 1 && g % 3 == 1) {
          for (int64_t c = 0; c < n4; c++)
            for (int k = 0; k < 4; k++) part[(c * ld + g) * 4 + k] = NAN;
          continue;
        }
        w[nw] = (int32_t)g;
        a[nw++] = (float)tu_int(&r, 1, 1000) / 1000.0f;
      }
      const float div = 1.7f;
      for (int t = 0; t < nt; t++) {
        dst[n4 * 4] = 4321.0f;
        tabs[t]->wsum4_f32(part, ld, w, a, nw, n4, div, dst);
        for (int64_t c = 0; c < n4; c++)
          for (int k = 0; k < 4; k++) {
            double sum = 0, mag = 0;
            for (int64_t i = 0; i < nw; i++) {
              const double v = (double)a[i] * part[(c * ld + w[i]) * 4 + k];
              sum += v, mag += fabs(v);
            }
            const double want = sum / div;
            const double bound = ((nw + 2) * U * mag + U * fabs(sum)) / div + U * fabs(want);
            if (!(fabs(dst[c * 4 + k] - want) <= bound))
              TU_FAIL("%s wsum4_f32 ld %lld n4 %lld at %lld: got %g want %g", tabs[t]->name,
                      (long long)ld, (long long)n4, (long long)(c * 4 + k),
                      (double)dst[c * 4 + k], want);
          }
        assert_true(dst[n4 * 4] == 4321.0f);
      }
      free(part), free(a), free(dst), free(w);
    }
}

/* softmax_exp_chunk over whole rows (chunks of TG_SOFTMAX_CHUNK, an online
 * max, S from tg_lane_tree16) and scale_chunks_f32. Bounds (u = 2^-24):
 *   shift[c]   exactly the running max (0-based chunks), -inf while nothing
 *              above -inf was seen
 *   e[j]       within 2 ulp of exp(f32(x[j] - s_c)) (s_c = shift[c], 0 while
 *              -inf): the op's exp has exp_f32's accuracy, subnormals included
 *   S          |S - sum_j exp(x[j] - M)| <= (12 + (n/16 + 4) + 5 nchunks) u S:
 *              per term 4u (2 ulp of exp) + 8u (the rounding of x - s_c,
 *              |x - s_c| <= 16 here); the 16 lane sums and the 4-level tree
 *              (n/16 + 4) u; each rescale by exp(m_old - m_new): 2 ulp + the
 *              rounding of the difference (<= 8u here) + the product (u),
 *              at most 5u more per chunk once the differences sum to <= 16.
 *   scale_chunks (e * a_c) * b within 2 u (1 + u) |e a_c b| + 2^-148 (two roundings
 *              that may be subnormal), bit-equal with
 *              and without streaming.
 * Bit-equal between the tables with FMA (AVX2, AVX-512): the row ops' exp uses
 * fused multiply-adds where the ISA has them (isa/common/row_ops.c says
 * why), so the portable table rounds differently, within the same bounds. */
static void test_softmax_rows(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 41);
  const int64_t lens[] = {1, 5, 17, 1000, 1024, 1025, 2500, 5000};
  enum { NMAX = 5000, CMAX = (NMAX + TG_SOFTMAX_CHUNK - 1) / TG_SOFTMAX_CHUNK };
  float *x = tu_alloc(sizeof(float) * NMAX), *e = tu_alloc(sizeof(float) * NMAX);
  float *e0 = tu_alloc(sizeof(float) * NMAX);
  float *y = aligned_alloc(64, sizeof(float) * (NMAX + 64) / 64 * 64), *y1 = tu_alloc(sizeof(float) * (NMAX + 64));
  assert_non_null(y);
  float shift[CMAX], shift0[CMAX], ac[CMAX];
  for (int fill = 0; fill < 4; fill++) /* random, ascending, -inf head, exp range */
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      const int64_t n = lens[li], nc = (n + TG_SOFTMAX_CHUNK - 1) / TG_SOFTMAX_CHUNK;
      tu_fill_f32(&r, x, n, -8, 8);
      if (fill == 1)
        for (int64_t j = 0; j < n; j++) x[j] = -8.0f + 16.0f * (float)j / (float)n + x[j] * 1e-3f;
      if (fill == 2)
        for (int64_t j = 0; j < n && j < 1100; j++) x[j] = -INFINITY;
      if (fill == 3) { /* the exp over (-inf, 0]: subnormal and zero results */
        tu_fill_f32(&r, x, n, -110, 0);
        x[0] = 0.0f, x[n / 2] = -INFINITY;
      }
      for (int t = 0; t < nt; t++) {
        float state[17] = {0};
        state[16] = -INFINITY;
        for (int64_t c = 0; c < nc; c++) {
          const int64_t c0 = c * TG_SOFTMAX_CHUNK;
          shift[c] = tabs[t]->softmax_exp_chunk(x + c0, n - c0 < TG_SOFTMAX_CHUNK ? n - c0 : TG_SOFTMAX_CHUNK,
                                                e + c0, state);
        }
        const float S = tg_lane_tree16(state);
        float m = -INFINITY;
        double Sref = 0;
        for (int64_t c = 0; c < nc; c++) {
          const int64_t c0 = c * TG_SOFTMAX_CHUNK, c1 = c0 + TG_SOFTMAX_CHUNK < n ? c0 + TG_SOFTMAX_CHUNK : n;
          for (int64_t j = c0; j < c1; j++) m = x[j] > m ? x[j] : m;
          if (!(shift[c] == m)) TU_FAIL("%s softmax_exp_chunk n %lld: shift[%lld]", tabs[t]->name, (long long)n, (long long)c);
          const float sc = m == -INFINITY ? 0.0f : m;
          for (int64_t j = c0; j < c1; j++) {
            const double want = exp((double)(float)(x[j] - sc));
            const double ulp = want < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(want) - 23);
            if (!(fabs(e[j] - want) <= 2 * ulp))
              TU_FAIL("%s softmax_exp_chunk n %lld fill %d: e[%lld] = %a, want %a", tabs[t]->name,
                      (long long)n, fill, (long long)j, (double)e[j], want);
          }
        }
        for (int64_t j = 0; j < n; j++) Sref += exp((double)x[j] - m);
        const double bound = (12.0 + (double)(n / 16 + 4) + 5.0 * nc) * U * Sref;
        if (m == -INFINITY ? S != 0.0f : !(fabs(S - Sref) <= bound))
          TU_FAIL("%s softmax_exp_chunk n %lld fill %d: S %g want %g", tabs[t]->name, (long long)n,
                  fill, (double)S, Sref);
        /* bitwise: the tables with FMA (all but the portable one) agree */
        if (t == 1) {
          memcpy(e0, e, sizeof(float) * n), memcpy(shift0, shift, sizeof(float) * nc);
        } else if (t > 1 && (memcmp(e, e0, sizeof(float) * n) || memcmp(shift, shift0, sizeof(float) * nc))) {
          TU_FAIL("%s softmax_exp_chunk n %lld differs bitwise from %s", tabs[t]->name, (long long)n,
                  tabs[1]->name);
        }
        /* scale_chunks: aligned and misaligned y, streaming on and off */
        for (int64_t c = 0; c < nc; c++) ac[c] = 0.5f + (float)c * 0.37f;
        const float b = 0.3f;
        for (int off = 0; off < 2; off++) {
          float *yo = y + off * 3;
          yo[n] = 777.0f;
          tabs[t]->scale_chunks_f32(e, ac, b, yo, n, 1);
          tabs[t]->stream_fence();
          tabs[t]->scale_chunks_f32(e, ac, b, y1, n, 0);
          assert_true(yo[n] == 777.0f);
          if (memcmp(yo, y1, sizeof(float) * n))
            TU_FAIL("%s scale_chunks_f32 n %lld: streamed differs", tabs[t]->name, (long long)n);
          for (int64_t j = 0; j < n; j++) {
            const double want = (double)e[j] * ac[j / TG_SOFTMAX_CHUNK] * b;
            if (!(fabs(yo[j] - want) <= 2 * U * (1 + U) * fabs(want) + 0x1p-148))
              TU_FAIL("%s scale_chunks_f32 n %lld j %lld", tabs[t]->name, (long long)n, (long long)j);
          }
        }
      }
    }
  free(x), free(e), free(e0), free(y), free(y1);
}

/* The fused RMSNorm row ops are bit-equal to the ops they fuse (whose bounds
 * are checked above): rms_sums_f32 to dot_f32(x, x) and dot3_f32(dy, x, w),
 * rms_bwd_row to acc_mul2_f32 and rms_dx_row. */
static void test_rms_fused_rows(void **state) {
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  tu_rng r = tu_rng_make(tu_seed() + 43);
  enum { NMAX = 2600 };
  float *x = tu_alloc(sizeof(float) * NMAX), *w = tu_alloc(sizeof(float) * NMAX);
  float *dy = tu_alloc(sizeof(float) * NMAX), *p0 = tu_alloc(sizeof(float) * NMAX);
  float *p1 = tu_alloc(sizeof(float) * NMAX), *p2 = tu_alloc(sizeof(float) * NMAX);
  float *d1 = aligned_alloc(64, sizeof(float) * (NMAX + 64) / 64 * 64), *d2 = tu_alloc(sizeof(float) * NMAX);
  assert_non_null(d1);
  tu_fill_f32(&r, x, NMAX, -3, 3);
  tu_fill_f32(&r, w, NMAX, -2, 2);
  tu_fill_f32(&r, dy, NMAX, -1, 1);
  tu_fill_f32(&r, p0, NMAX, -1, 1);
  for (int t = 0; t < nt; t++)
    for (int li = 0; li < N_LENS; li++) {
      const int64_t n = k_lens[li];
      float xx, s;
      tabs[t]->rms_sums_f32(x, dy, w, n, &xx, &s);
      if (xx != tabs[t]->dot_f32(x, x, n) || s != tabs[t]->dot3_f32(dy, x, w, n))
        TU_FAIL("%s rms_sums_f32 n %lld differs from dot_f32 / dot3_f32", tabs[t]->name, (long long)n);
      memcpy(p1, p0, sizeof(float) * NMAX), memcpy(p2, p0, sizeof(float) * NMAX);
      tabs[t]->acc_mul2_f32(p2, x, dy, 1.3f, n);
      tabs[t]->rms_dx_row(x, w, dy, 1.3f, 0.21f, d2, n);
      for (int stream = 0; stream <= 1; stream++)
        for (int off = 0; off < 2; off++) { /* dx aligned to 64 bytes and not */
          float *dxo = d1 + 16 + off * 5;
          memcpy(p1, p0, sizeof(float) * NMAX);
          dxo[n] = 777.0f;
          tabs[t]->rms_bwd_row(x, w, dy, 1.3f, 0.21f, p1, dxo, n, stream);
          tabs[t]->stream_fence();
          assert_true(dxo[n] == 777.0f);
          if (n && (memcmp(p1, p2, sizeof(float) * NMAX) || memcmp(dxo, d2, sizeof(float) * n)))
            TU_FAIL("%s rms_bwd_row n %lld stream %d differs from acc_mul2_f32 / rms_dx_row",
                    tabs[t]->name, (long long)n, stream);
        }
    }
  free(x), free(w), free(dy), free(p0), free(p1), free(p2), free(d1), free(d2);
}

/* The precision modes' operand packing, bit for bit against the scalar
 * definition on every table: f32_to_bf16_split with one, two and three
 * parts (hi = RNE, lo = RNE of the exact remainder x - hi, lo2 = RNE of
 * x - hi - lo, lo and lo2 0 where hi is not finite; rows, transposed rows
 * and row pairs (16-bit halves of little-endian pairs: the element of row
 * 2p + j % 2 at 16-bit column j of pair row p), odd counts padded with 0, NaN / inf /
 * subnormal / overflowing inputs), and
 * hi + lo + lo2 == x exactly wherever |x| >= 2^-103 (so that no part is
 * subnormal: the bf16 units flush those); and
 * pack_bf16_row_pairs (odd row counts padded with 0); nothing outside the
 * destination's rows and columns is written. */
/* One part of f32_to_bf16_split: bf16(r), or a signed 0 for a subnormal r
 * on a table with split_ftz. */
static uint16_t split_part(const tg_isa_ops *o, float r) {
  if (o->split_ftz && fpclassify(r) == FP_SUBNORMAL) return signbit(r) ? 0x8000 : 0;
  return tg_f32_to_bf16(r);
}

/* The three parts of f32_to_bf16_split: x's high half, (x - hi)'s, and
 * the high half of the rest (exact); a NaN's hi quiet, lo and lo2 0 where
 * x is not finite. */
static void split_truncated(float x, uint16_t part[3]) {
  uint32_t u, r;
  memcpy(&u, &x, sizeof u);
  const int finite = isfinite(x);
  float hi, lo, r1;
  const uint32_t hb = u & 0xFFFF0000u;
  memcpy(&hi, &hb, sizeof hi);
  r1 = finite ? x - hi : 0.0f;
  memcpy(&r, &r1, sizeof r);
  const uint32_t lb = r & 0xFFFF0000u;
  memcpy(&lo, &lb, sizeof lo);
  const float r2 = r1 - lo;
  memcpy(&r, &r2, sizeof r);
  part[0] = (uint16_t)(hb >> 16 | (isnan(x) ? 0x40u : 0u));
  part[1] = (uint16_t)(lb >> 16);
  part[2] = (uint16_t)(r >> 16);
}

static void test_bf16_split_and_row_pairs(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 13);
  const tg_isa_ops *tabs[TU_MAX_ISAS];
  const int nt = n_tables(tabs);
  /* subnormals (one that rounds up to 2^-126), a normal x with subnormal
   * remainders, overflow to inf, ties */
  const float specials[] = {NAN,           INFINITY,        -INFINITY,         0x1p-130f,
                            -0x1p-140f,    0x1.fffffcp-127f, 0x1.00001p-120f, 3.4e38f,
                            -0.0f,         1.0f + 0x1p-8f,   1.0f + 0x3p-8f};
  const int n_specials = sizeof specials / sizeof specials[0];
  const int sizes[][2] = {{1, 1}, {64, 64}, {63, 65}, {17, 33}, {48, 48}, {5, 100}, {100, 7}};
  for (int t = 0; t < nt; t++) {
    const tg_isa_ops *o = tabs[t];
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
      const int rows = sizes[si][0], cols = sizes[si][1], lds = cols + 3;
      float *x = tu_alloc(sizeof(float) * rows * lds);
      tu_fill_f32(&r, x, (int64_t)rows * lds, -3, 3);
      for (int e = 0; e < rows * lds; e += 7) x[e] = specials[(e / 7) % n_specials];
      for (int layout = TG_SPLIT_ROWS; layout <= TG_SPLIT_ROW_PAIRS; layout++)
        for (int n_parts = 1; n_parts <= 3; n_parts++) {
          /* destination rows and 16-bit columns: [rows, ldd], [cols, ldd], or
           * pair rows [ceil(rows / 2), ldd pairs] */
          const int row_pairs = layout == TG_SPLIT_ROW_PAIRS, tr = layout == TG_SPLIT_TRANSPOSED;
          const int sr = tr ? cols : rows, sc = tr ? rows : cols; /* x as the rows hold it */
          const int dr = row_pairs ? (rows + 1) / 2 : sr;
          const int ldd = row_pairs ? cols + 3 : sc + 1 + (sc + 1) % 2 + 2; /* pad, gap */
          const int dc = row_pairs ? 2 * ldd : ldd;
          uint16_t *part[3];
          for (int k = 0; k < 3; k++) part[k] = tu_alloc(2 * dr * dc), memset(part[k], 0xA5, 2 * dr * dc);
          o->f32_to_bf16_split(rows, cols, x, lds, layout, part[0], n_parts > 1 ? part[1] : NULL,
                               n_parts > 2 ? part[2] : NULL, ldd);
          for (int i = 0; i < dr; i++)
            for (int j = 0; j < dc; j++) {
              /* the element of x that (i, j) holds: row xr, column xc */
              const int xr = row_pairs ? 2 * i + j % 2 : tr ? j : i;
              const int xc = row_pairs ? j / 2 : tr ? i : j;
              const int in = xr < rows && xc < cols;
              const int pad = row_pairs ? xr == rows && xc < cols
                              : tr      ? xr == rows && rows % 2
                                        : xc == cols && cols % 2;
              const float v = in ? x[xr * lds + xc] : 0.0f;
              uint16_t want[3] = {0, 0, 0};
              if (n_parts == 3) {
                split_truncated(v, want);
              } else {
                const uint16_t h = split_part(o, v);
                const int finite = (h & 0x7F80) != 0x7F80;
                const float r1 = finite ? v - tg_bf16_to_f32(h) : 0.0f;
                want[0] = h, want[1] = split_part(o, r1);
              }
              for (int k = 0; k < 3; k++) {
                const uint16_t w = k >= n_parts ? 0xA5A5 : in ? want[k] : pad ? 0 : 0xA5A5;
                if (part[k][i * dc + j] != w)
                  TU_FAIL("%s split %dx%d layout %d parts %d at (%d, %d): part %d %04x want "
                          "%04x (x = %a)",
                          o->name, rows, cols, layout, n_parts, i, j, k, part[k][i * dc + j],
                          w, (double)v);
              }
              if (n_parts == 3 && in && isfinite(v) && fabsf(v) >= 0x1p-103f &&
                  (double)tg_bf16_to_f32(want[0]) + tg_bf16_to_f32(want[1]) +
                          tg_bf16_to_f32(want[2]) != (double)v)
                TU_FAIL("%s split: hi + lo + lo2 != x = %a", o->name, (double)v);
            }
          for (int k = 0; k < 3; k++) free(part[k]);
        }
      /* row pairs of a bf16 matrix [rows, cols] */
      tg_bf16 *X = tu_alloc(2 * rows * lds);
      tu_fill_bf16(&r, X, (int64_t)rows * lds, -2, 2);
      const int np = (rows + 1) / 2, ldb = cols + 2;
      uint32_t *Bp = tu_alloc(4 * (np + 1) * ldb);
      memset(Bp, 0xA5, 4 * (np + 1) * ldb);
      o->pack_bf16_row_pairs(rows, cols, X, lds, Bp, ldb);
      for (int p = 0; p <= np; p++)
        for (int j = 0; j < ldb; j++) {
          uint32_t want = 0xA5A5A5A5u;
          if (p < np && j < cols)
            want = X[2 * p * lds + j] | (2 * p + 1 < rows ? (uint32_t)X[(2 * p + 1) * lds + j] << 16 : 0);
          if (Bp[p * ldb + j] != want)
            TU_FAIL("%s row pairs %dx%d p=%d j=%d: %08x want %08x", o->name, rows, cols, p, j,
                    Bp[p * ldb + j], want);
        }
      free(X), free(Bp), free(x);
    }
  }
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocking),
      cmocka_unit_test(test_gemms),
      cmocka_unit_test(test_bf16_dot_gemm),
      cmocka_unit_test(test_bf16_terms_gemm),
      cmocka_unit_test(test_exp),
      cmocka_unit_test(test_exp_sum_row),
      cmocka_unit_test(test_exp_sum_bf16_row),
      cmocka_unit_test(test_exp_sum_lag_bf16_row),
      cmocka_unit_test(test_conversions_and_dot),
      cmocka_unit_test(test_attention_rows),
      cmocka_unit_test(test_dropout_keep),
      cmocka_unit_test(test_row_reductions),
      cmocka_unit_test(test_row_elementwise),
      cmocka_unit_test(test_add_compensated),
      cmocka_unit_test(test_fwht),
      cmocka_unit_test(test_transpose),
      cmocka_unit_test(test_wsum4),
      cmocka_unit_test(test_softmax_rows),
      cmocka_unit_test(test_rms_fused_rows),
      cmocka_unit_test(test_bf16_split_and_row_pairs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
