/*
 * Test helpers shared by every suite: a seeded RNG (fresh seed per run,
 * printed so a failure can be replayed with TG_TEST_SEED=<seed>), NaN
 * poisoning, snapshots for "nothing written on failure", the thread counts
 * and ISAs every kernel is run at, and an error-bound comparison.
 */
#ifndef TG_TESTUTIL_H
#define TG_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "registry.h"
#include "tilegrad.h"

/* --- RNG ---------------------------------------------------------------- */
typedef struct { uint64_t s; } tu_rng;
/* Seed from TG_TEST_SEED if set, else from the clock; prints it once. */
uint64_t tu_seed(void);
tu_rng tu_rng_make(uint64_t seed);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r, double lo, double hi); /* [lo, hi) */
int tu_int(tu_rng *r, int lo, int hi);              /* [lo, hi] */
void tu_fill_f32(tu_rng *r, float *x, int64_t n, double lo, double hi);
void tu_fill_bf16(tu_rng *r, tg_bf16 *x, int64_t n, double lo, double hi);

/* --- buffers -------------------------------------------------------------- */
void *tu_alloc(size_t bytes);     /* aborts the test on failure */
void tu_poison_f32(float *x, int64_t n); /* fills with quiet NaN */
int tu_all_finite(const float *x, int64_t n);

/* --- contexts -------------------------------------------------------------
 * Every kernel is tested at these thread counts, on the ISA that
 * TG_TEST_ISA names (ctest runs each suite once per ISA table the build
 * has), or without it on every ISA this CPU has (portable always). */
extern const int tu_thread_counts[];
extern const int tu_n_thread_counts;
#define TU_COUNT_ISA_(name, id, cpu, pick) +1
enum { TU_MAX_ISAS = 0 TG_ISA_LIST(TU_COUNT_ISA_) }; /* the registry's (isa/registry.h) */
#undef TU_COUNT_ISA_
int tu_isas(tg_isa out[TU_MAX_ISAS]); /* returns how many */
/* Fails the test on error. TG_ISA_AUTO: the ISA under test (TG_TEST_ISA),
 * else the best the CPU has. */
tg_ctx *tu_ctx(int threads, tg_isa isa);
/* The attention suites plan their work for TU_PLAN_CPUS CPUs (the lent
 * Xeon's 16: 64 KV work items) whatever the test machine has, so the
 * configurations written to split keys into several ranges (and sum dQ
 * partials) do so on a 2-CPU CI machine too (tg_testing_plan_cpus). */
enum { TU_PLAN_CPUS = 16 };
void tu_plan_fixed(void);

/* TG_TEST_SHORT=1 (scripts/test_aarch64.sh, where every floating-point
 * operation is emulated by qemu, and the AddressSanitizer stage of
 * scripts/test.sh): suites leave out the cases that add only size, not
 * paths (each says what it left out), because their f64 references take
 * many minutes there; the attention suites run each problem at a few of
 * their (ISA, threads, run mode) combinations, every combination still
 * run by some problem (attn_runs_of, tests/common/attn_problem.h). */
int tu_short(void);

/* --- comparison ----------------------------------------------------------
 * Passes iff |got[i] - want[i]| <= bound[i] for every i (and got[i] is not
 * NaN). On failure prints the worst element (index, got, want, bound) with
 * `what` and returns 0. */
int tu_check_bound(const char *what, const float *got, const double *want,
                   const double *bound, int64_t n);

/* For references computed in IEEE arithmetic from inputs that hold NaN or
 * +-inf (tests/common/refs.h): where want[i] is NaN, got[i] must be NaN;
 * where it is +-inf, got[i] must be that infinity; where it is finite,
 * got[i] must be within bound[i] of it (a bound that is not finite fails:
 * the reference cannot check that element). may (NULL: none) is a second
 * reference of the same inputs with every product the kernel may form with
 * an exact zero (a dense reference): where may[i] is NaN or infinite, got[i]
 * may also be NaN or may[i]. Prints the first offending elements (at most
 * 3) with `what` and returns 0 when any element fails. */
int tu_check_ieee(const char *what, const float *got, const double *want, const double *bound,
                  const double *may, int64_t n);

/* Fails the current test with a printf-style message. */
#define TU_FAIL(...) fail_msg(__VA_ARGS__)

/* Asserts a call returns `status` and leaves a non-empty message. */
#define TU_EXPECT_STATUS(ctx, call, status)                                        \
  do {                                                                             \
    tg_status got_ = (call);                                                       \
    if (got_ != (status))                                                          \
      fail_msg("%s: got status %d (%s), want %d; last error: %s", #call, (int)got_,  \
               tg_status_str(got_), (int)(status), tg_ctx_last_error(ctx));        \
    if ((status) != TG_OK && tg_ctx_last_error(ctx)[0] == '\0')                    \
      fail_msg("%s: failed without a message", #call);                             \
  } while (0)

#endif
