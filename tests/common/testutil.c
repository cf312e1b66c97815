#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"
#include "tilegrad_testing.h"

uint64_t tu_seed(void) {
  static uint64_t seed;
  static int have;
  if (!have) {
    const char *env = getenv("TG_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0)
               : (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
    have = 1;
    printf("[ seed     ] TG_TEST_SEED=%llu\n", (unsigned long long)seed);
    fflush(stdout);
  }
  return seed;
}

void tu_plan_fixed(void) { tg_testing_plan_cpus(TU_PLAN_CPUS); }

tu_rng tu_rng_make(uint64_t seed) { return (tu_rng){seed ^ 0x9E3779B97F4A7C15ull}; }

uint64_t tu_next(tu_rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_uniform(tu_rng *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(tu_next(r) >> 11) * 0x1.0p-53;
}

int tu_int(tu_rng *r, int lo, int hi) {
  return lo + (int)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

void tu_fill_f32(tu_rng *r, float *x, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)tu_uniform(r, lo, hi);
}

void tu_fill_bf16(tu_rng *r, tg_bf16 *x, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) x[i] = tg_f32_to_bf16((float)tu_uniform(r, lo, hi));
}

void *tu_alloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) fail_msg("tu_alloc: out of memory (%zu bytes)", bytes);
  return p;
}

void tu_poison_f32(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

int tu_all_finite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

const int tu_thread_counts[] = {1, 2, 3};
const int tu_n_thread_counts = 3;

/* TG_TEST_ISA=<name> (ctest sets it: every suite runs once per ISA table the
 * build has) restricts a suite to that ISA; runs before main, so a CPU
 * without it skips the whole suite (exit 77, ctest's SKIP_RETURN_CODE) and
 * every run names its ISA first thing. Without it a suite tests every ISA
 * the CPU runs. */
static tg_isa test_isa = TG_ISA_AUTO; /* AUTO: all */

__attribute__((constructor)) static void tu_pick_isa(void) {
  const char *env = getenv("TG_TEST_ISA");
  if (!env || !*env) {
    printf("[ isa      ] every ISA this CPU runs (set TG_TEST_ISA=<name> for one)\n");
    fflush(stdout);
    return;
  }
  if (tg_isa_from_name(env, &test_isa) != TG_OK || test_isa == TG_ISA_AUTO) {
    fprintf(stderr, "TG_TEST_ISA=%s: not an ISA name\n", env);
    exit(2);
  }
  if (!tg_isa_available(test_isa)) { /* the library's reason: tg_ctx_set_isa's message */
    tg_ctx *ctx = NULL;
    const int why = tg_ctx_create(&ctx) == TG_OK && tg_ctx_set_isa(ctx, test_isa) != TG_OK;
    printf("[ isa      ] %s: SKIPPED, this CPU or build cannot run it%s%s\n", env,
           why ? ": " : "", why ? tg_ctx_last_error(ctx) : "");
    tg_ctx_destroy(ctx);
    fflush(stdout);
    exit(77);
  }
  printf("[ isa      ] %s (TG_TEST_ISA)\n", env);
  fflush(stdout);
}

int tu_isas(tg_isa out[TU_MAX_ISAS]) {
  if (test_isa != TG_ISA_AUTO) {
    out[0] = test_isa;
    return 1;
  }
#define TU_ISA_ID_(name, id, cpu, pick) id,
  static const tg_isa all[] = {TG_ISA_LIST(TU_ISA_ID_)};
#undef TU_ISA_ID_
  _Static_assert(sizeof all / sizeof all[0] == TU_MAX_ISAS, "one per registry entry");
  int n = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (tg_isa_available(all[i])) out[n++] = all[i];
  return n;
}

int tu_short(void) {
  const char *env = getenv("TG_TEST_SHORT");
  return env && strcmp(env, "1") == 0;
}

tg_ctx *tu_ctx(int threads, tg_isa isa) {
  tg_ctx *ctx;
  if (tg_ctx_create(&ctx) != TG_OK) fail_msg("tg_ctx_create failed");
  if (tg_ctx_set_threads(ctx, threads) != TG_OK) fail_msg("set_threads(%d)", threads);
  if (isa == TG_ISA_AUTO) isa = test_isa; /* "the best" means the ISA under test */
  if (tg_ctx_set_isa(ctx, isa) != TG_OK) fail_msg("set_isa(%s)", tg_isa_name(isa));
  return ctx;
}

int tu_check_bound(const char *what, const float *got, const double *want,
                   const double *bound, int64_t n) {
  int64_t worst = -1, bad = 0;
  double worst_ratio = 0;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    double ratio = err / (bound[i] > 0 ? bound[i] : 1e-300);
    if (isnan(got[i]) || isnan(want[i])) ratio = INFINITY;
    if (!(ratio <= 1.0)) bad++;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad) {
    printf("  %s: %lld of %lld elements out of bound; worst [%lld] got %.9g want %.9g "
           "bound %.3g (err/bound %.3g)\n",
           what, (long long)bad, (long long)n, (long long)worst, (double)got[worst],
           want[worst], bound[worst], worst_ratio);
    return 0;
  }
  return 1;
}

/* Why got[i] does not match an IEEE reference (tu_check_ieee), or NULL. */
static const char *ieee_mismatch(float got, double want, double bound, const double *may) {
  if (may && !isfinite(*may) && (isnan(got) || (double)got == *may)) return NULL;
  if (isnan(want)) return isnan(got) ? NULL : "want NaN";
  if (isinf(want)) return (double)got == want ? NULL : "want this infinity";
  if (!isfinite(bound)) return "reference bound not finite";
  if (isnan(got)) return "NaN where the reference is finite";
  return fabs((double)got - want) <= bound ? NULL : "out of bound";
}

int tu_check_ieee(const char *what, const float *got, const double *want, const double *bound,
                  const double *may, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const char *why = ieee_mismatch(got[i], want[i], bound[i], may ? may + i : NULL);
    if (!why) continue;
    if (bad++ >= 3) continue;
    printf("  %s: [%lld] got %.9g want %.9g bound %.3g", what, (long long)i, (double)got[i],
           want[i], bound[i]);
    if (may) printf(" (dense %.9g)", may[i]);
    printf(": %s\n", why);
  }
  if (bad) printf("  %s: %lld of %lld elements wrong\n", what, (long long)bad, (long long)n);
  return bad == 0;
}
