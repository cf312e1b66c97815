/*
 * NaN and infinity in the attention forward (the contract
 * in ../shared/spec/KERNELS.md): an input NaN reaches every output element
 * that depends on it, as IEEE arithmetic and PyTorch give; a +inf score makes
 * its row NaN (softmax of +inf); a row that -inf masks entirely still gives
 * O = 0 and L = -inf. For each case the expected pattern follows from which
 * scores of each row the poisoned element enters, and every other element
 * must stay finite. GQA (2 query heads per kv head), causal with qL != kL, a
 * mask with a fully masked row; every ISA, 1 and 3 threads.
 *
 * Cases: NaN in one element of Q, of K, of V, of the mask; +inf and -inf in
 * one element of Q (a row of +-inf scores, so its max is +inf: NaN row).
 *
 * The variants (tg_attn_train_fwd, bf16, with tg_attn_options): a finite
 * sink gives the fully masked row O = 0 and L = s_h; a NaN or +inf sink
 * makes every row of its head NaN, the fully masked one included, and no
 * other head's; -inf is no sink. With a window, a NaN in K reaches only the
 * rows whose window (and causal limit and mask) lets them see the key, and
 * a row the window leaves no key is fully masked; a NaN in V as above
 * (column vd of a row that does not see the key is not checked: the tile
 * products may multiply it by P = 0 inside a partially visible tile).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "testutil.h"

enum { B = 1, H = 2, HKV = 1, QL = 9, KL = 13, D = 16, FULLY_MASKED_ROW = 6 };

typedef struct {
  tg_bf16 Q[B * H * QL * D], K[B * HKV * KL * D], V[B * HKV * KL * D], M[QL * KL];
  tg_bf16 O[B * H * QL * D];
  float L[B * H * QL];
} bufs;

/* The window of the variant runs (0: none). */
static uint32_t window;

/* causal with qL_off = kL - qL (and the window); the mask [qL, kL] broadcast
 * over heads */
static int visible(int i, int k, const bufs *b) {
  return k <= i + (KL - QL) && !(window && k <= i + (KL - QL) - (int)window) &&
         tg_bf16_to_f32(b->M[i * KL + k]) != -INFINITY;
}

static void fill(bufs *b, tu_rng *r) {
  tu_fill_bf16(r, b->Q, B * H * QL * D, -1, 1);
  tu_fill_bf16(r, b->K, B * HKV * KL * D, -1, 1);
  tu_fill_bf16(r, b->V, B * HKV * KL * D, -1, 1);
  tu_fill_bf16(r, b->M, QL * KL, -0.5, 0.5);
  for (int k = 0; k < KL; k++) b->M[FULLY_MASKED_ROW * KL + k] = tg_f32_to_bf16(-INFINITY);
  b->M[2 * KL + 1] = tg_f32_to_bf16(-INFINITY); /* one masked key in row 2 */
}

/* Runs the forward; checks row (h, i) of O and L against the expectation:
 * 'n' NaN (L and every O element), 'z' fully masked (O = 0, L = -inf), 's'
 * fully masked with a finite sink (O = 0, L = the sink), 'f' finite, 'v' O
 * NaN in column vd and finite elsewhere, 'w' O finite except column vd (not
 * checked); L finite for 'f', 'v', 'w'. opt NULL: the bf16 entry point;
 * else tg_attn_train_fwd with opt. */
static void check_opt(const char *what, bufs *b, const char expect[H][QL], int vd, int threads,
                      tg_isa isa, const tg_attn_options *opt) {
  tg_ctx *ctx = tu_ctx(threads, isa);
  tg_attn_params p;
  assert_int_equal(tg_attn_params_init(&p, B, H, HKV, QL, KL, D, 0.25f), TG_OK);
  tg_attn_mask_params mp = {{0, 0, KL}};
  for (int i = 0; i < B * H * QL * D; i++) b->O[i] = 0x7FC1; /* poison */
  tu_poison_f32(b->L, B * H * QL);
  if (opt)
    TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_BF16, b->Q, b->K, b->V, b->O, b->L, &p,
                                            &mp, b->M, 1, opt),
                     TG_OK);
  else
    TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, b->Q, b->K, b->V, b->O, b->L, &p,
                                                       &mp, b->M, 1),
                     TG_OK);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++) {
      const float L = b->L[h * QL + i];
      const char e = expect[h][i];
      /* a row that sees nothing but its sink: L = s_h (log of e^{s_h}) */
      const float sink = e == 's' ? opt->sinks[h] : 0.0f;
      const int L_ok = e == 'n'   ? isnan(L)
                       : e == 'z' ? L == -INFINITY
                       : e == 's' ? fabsf(L - sink) <= 1e-6f * (1 + fabsf(sink))
                                  : isfinite(L);
      if (!L_ok)
        TU_FAIL("%s (%s, %d threads): L[%d,%d] = %g, want %s", what, tg_isa_name(isa), threads,
                h, i, (double)L,
                e == 'n' ? "NaN" : e == 'z' ? "-inf" : e == 's' ? "the sink" : "finite");
      for (int d = 0; d < D; d++) {
        const float o = tg_bf16_to_f32(b->O[(h * QL + i) * D + d]);
        if (e == 'w' && d == vd) continue;
        const int nan_want = e == 'n' || (e == 'v' && d == vd);
        const int zero_want = e == 'z' || e == 's';
        const int ok = nan_want ? isnan(o) : zero_want ? o == 0.0f : isfinite(o);
        if (!ok)
          TU_FAIL("%s (%s, %d threads): O[%d,%d,%d] = %g, want %s", what, tg_isa_name(isa),
                  threads, h, i, d, (double)o, nan_want ? "NaN" : zero_want ? "0" : "finite");
      }
    }
  tg_ctx_destroy(ctx);
}

static void check(const char *what, bufs *b, const char expect[H][QL], int vd, int threads,
                  tg_isa isa) {
  check_opt(what, b, expect, vd, threads, isa, NULL);
}

/* The cases of a test on fresh problems from r, at one thread count and ISA. */
typedef void nan_cases(bufs *b, tu_rng *r, int threads, tg_isa isa);

/* cases at 1 and 3 threads on every ISA under test. */
static void run_everywhere(uint64_t seed_offset, nan_cases *cases) {
  tu_rng r = tu_rng_make(tu_seed() + seed_offset);
  bufs *b = tu_alloc(sizeof *b);
  tg_isa isas[TU_MAX_ISAS];
  const int nisa = tu_isas(isas);
  const int threads[] = {1, 3};
  for (int ii = 0; ii < nisa; ii++)
    for (int t = 0; t < 2; t++) cases(b, &r, threads[t], isas[ii]);
  free(b);
}

static void nan_and_inf_cases(bufs *b, tu_rng *r, int threads, tg_isa isa) {
  char ex[H][QL];
  const int qi = 3, kj = 5, vd = 7;
  /* the clean baseline: only the fully masked row is special */
  fill(b, r);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++) ex[h][i] = i == FULLY_MASKED_ROW ? 'z' : 'f';
  check("no NaN", b, ex, -1, threads, isa);

  /* NaN in Q[h=1, i=qi, d=2]: that row alone */
  b->Q[(1 * QL + qi) * D + 2] = tg_f32_to_bf16(NAN);
  ex[1][qi] = 'n';
  check("NaN in Q", b, ex, -1, threads, isa);
  ex[1][qi] = 'f';

  /* +inf / -inf in Q[.., d = 2]: the row's score with key j is
   * sign * inf * K[j, 2]: +inf where that product is positive, NaN where
   * K[j, 2] = 0, -inf where negative. One +inf or NaN among the visible
   * keys makes the row NaN (softmax of +inf); all -inf is a row that sees
   * no key (O = 0, L = -inf, the contract). */
  for (int sign = 1; sign >= -1; sign -= 2) {
    b->Q[(1 * QL + qi) * D + 2] = tg_f32_to_bf16(sign * INFINITY);
    int nan_row = 0;
    for (int k = 0; k < KL; k++)
      if (visible(qi, k, b)) nan_row |= sign * tg_bf16_to_f32(b->K[k * D + 2]) >= 0.0f;
    ex[1][qi] = nan_row ? 'n' : 'z';
    check(sign > 0 ? "+inf in Q" : "-inf in Q", b, ex, -1, threads, isa);
  }
  ex[1][qi] = 'f';

  /* NaN in K[kj]: every row of both heads (GQA) that sees key kj */
  fill(b, r);
  b->K[kj * D + 4] = tg_f32_to_bf16(NAN);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++)
      ex[h][i] = i == FULLY_MASKED_ROW ? 'z' : visible(i, kj, b) ? 'n' : 'f';
  check("NaN in K", b, ex, -1, threads, isa);

  /* NaN in V[kj, vd]: column vd of the O rows that see kj; L unaffected.
   * Rows that do not see kj ('w'): column vd is not checked (the P.V
   * product may multiply the NaN by an exact 0 there, as PyTorch's
   * matmul does), every other element must stay finite. */
  fill(b, r);
  b->V[kj * D + vd] = tg_f32_to_bf16(NAN);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++)
      ex[h][i] = i == FULLY_MASKED_ROW ? 'z' : visible(i, kj, b) ? 'v' : 'w';
  check("NaN in V", b, ex, vd, threads, isa);

  /* NaN in the mask at (row 2, key 4, visible): that row of both heads */
  fill(b, r);
  b->M[2 * KL + 4] = tg_f32_to_bf16(NAN);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++) ex[h][i] = i == FULLY_MASKED_ROW ? 'z' : i == 2 ? 'n' : 'f';
  check("NaN in mask", b, ex, -1, threads, isa);
}

static void test_nan_and_inf(void **state) { run_everywhere(101, nan_and_inf_cases); }

/* Expectations of the clean problem under the window and sinks: a row
 * that sees no key 'z', or 's' where its head has a finite sink. */
static void clean_expect(const bufs *b, const float sinks[H], char ex[H][QL]) {
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++) {
      int any = 0;
      for (int k = 0; k < KL; k++) any |= visible(i, k, b);
      ex[h][i] = any ? 'f' : isfinite(sinks[h]) ? 's' : 'z';
    }
}

static void variants_cases(bufs *b, tu_rng *r, int threads, tg_isa isa) {
  char ex[H][QL];
  const int kj = 5, vd = 7;
  float sinks[H] = {0.5f, -INFINITY};
  tg_attn_options opt = {.sinks = sinks};
  window = 0;
  /* sinks: head 0 finite, head 1 none */
  fill(b, r);
  clean_expect(b, sinks, ex);
  check_opt("sinks 0.5, -inf", b, ex, -1, threads, isa, &opt);
  /* NaN and +inf sink of head 1: all of head 1, the fully masked row too */
  const float bad[2] = {NAN, INFINITY};
  for (int s = 0; s < 2; s++) {
    sinks[1] = bad[s];
    for (int i = 0; i < QL; i++) ex[1][i] = 'n';
    check_opt(s ? "+inf sink" : "NaN sink", b, ex, -1, threads, isa, &opt);
  }
  sinks[1] = -INFINITY;

  /* a window of 3 (rows see keys i + 2 .. i + 4 of the causal limit i + 4),
   * with the sinks: NaN in K[kj] reaches the rows that see kj */
  window = opt.window = 3;
  fill(b, r);
  b->K[kj * D + 4] = tg_f32_to_bf16(NAN);
  clean_expect(b, sinks, ex);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++)
      if (visible(i, kj, b)) ex[h][i] = 'n';
  check_opt("window, NaN in K", b, ex, -1, threads, isa, &opt);
  /* NaN in V[kj, vd]: column vd of the rows that see kj */
  fill(b, r);
  b->V[kj * D + vd] = tg_f32_to_bf16(NAN);
  clean_expect(b, sinks, ex);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < QL; i++)
      if (ex[h][i] == 'f') ex[h][i] = visible(i, kj, b) ? 'v' : 'w';
  check_opt("window, NaN in V", b, ex, vd, threads, isa, &opt);
  /* window 1 without sinks: each row sees its diagonal key i + 4 alone,
   * the fully masked row none ('z') */
  window = opt.window = 1;
  opt.sinks = NULL;
  const float none[H] = {-INFINITY, -INFINITY};
  fill(b, r);
  clean_expect(b, none, ex);
  check_opt("window 1", b, ex, -1, threads, isa, &opt);
  window = 0;
}

static void test_variants(void **state) { run_everywhere(102, variants_cases); }

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_nan_and_inf),
                                     cmocka_unit_test(test_variants)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
