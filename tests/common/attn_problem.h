/*
 * The f64 attention reference of every FA-2 suite: tests/test_attention.c
 * (backward fed a reference L and D_vec, and the forward),
 * tests/train/test_attn_roundtrip.c (forward -> backward round trip),
 * tests/test_attn_ext.c (the f32 and bf16 entry points with dropout and the
 * precision modes), tests/test_attn_variants.c (window, sinks, Dv) and
 * tests/test_nan_inputs.c.
 *
 * A problem: random Q, K, V, dO and an optional additive mask in one of
 * three layouts, with GQA, causal (qL_off), softcapping, dropout (keep
 * flags from tg_attn_dropout_keep) and the variants; the reference reads them as f32 arrays
 * (bf16 inputs widened, exactly), products of two f32 are exact in f64. With
 * it, per element, a first-order forward error bound of the f32 algorithm,
 * doubled for the neglected second-order terms (u = 2^-24, gamma(n) =
 * (n + 2) u bounds a sum of n terms in any order relative to the sum of the
 * terms' magnitudes; the derivations are below, at the functions that
 * compute them, and in the suites' header comments).
 *
 * What the suites share is computed here: scores, the forward reference (L,
 * O, D_vec with bounds) and the sums that turn P and dS into dQ, dK, dV with
 * bounds. What differs (where the backward's L and D_vec come from, and so
 * the bounds of P and dS) is the row function: attn_bwd_row and
 * attn_bwd_row_given (a given L and D_vec), attn_step_row (the forward's).
 *
 * The attention variants (tg_attn_options: sliding window W, sinks s_h per
 * query head, a value head dim Dv) are computed from their definition, not
 * from the kernel's tiling: the window hides a key like the causal limit
 * does (k <= i + qL_off - W), the sink is one more term e^{s_h} of every
 * row's softmax denominator (no value), V, O, dO, dV have Dv columns, and
 * d_sinks[h] = d_sinks0[h] - sum_{b,i} e^{s_h - L} D_vec. A row that sees no
 * key has O = 0 and L = s_h (-inf without a sink); a NaN or +inf sink makes
 * its head's L, O and D_vec NaN.
 *
 * Inputs may hold NaN or +-inf (tests/test_nan_inputs.c): the reference then
 * follows IEEE arithmetic. A pair (query row, key) enters the backward's sums
 * where it has a term: the key is visible (causal limit, mask not -inf) and
 * P != 0. The dense reference (attn_reference(.., dense = 1)) takes every
 * pair instead, an invisible one with score -inf, P = exp(-inf - L), and dS
 * and the products formed from them, as the kernel's tile products do for
 * the pairs of a tile (0 * inf, 0 * NaN are NaN); its bounds are not
 * computed. Where it is NaN or infinite the kernel may be too.
 */
#ifndef TG_ATTN_PROBLEM_H
#define TG_ATTN_PROBLEM_H

#include <stdint.h>

#include "bf16.h"
#include "testutil.h"

static const double U = 0x1.0p-24;     /* f32 unit roundoff */
static const double BF16_U = 0x1.0p-8; /* bf16 unit roundoff */
static inline double gam(double n) { return (n + 2) * U; } /* sum of n terms */

static inline int64_t attn_off3(const int64_t s[3], int64_t b, int64_t h, int64_t r) {
  return b * s[0] + h * s[1] + r * s[2];
}

/* Layouts of the inputs and O (through the strides; O, dO and V have Dv
 * columns where D is written, Dv = D without a value head dim). The
 * reference and the gradients dQ [B,H,qL,D], dK [B,H_kv,kL,D], dV
 * [B,H_kv,kL,Dv] are always contiguous. */
enum {
  ATTN_HEAD_MAJOR,  /* Q, O, dO [B,H,qL,D]; K, V [B,H_kv,kL,D] */
  ATTN_STRIDED,     /* Q, O, dO [B,qL,H,D]; K, V [B,H_kv,kL,D + 8] (rows padded) */
  ATTN_TOKEN_MAJOR, /* Q, O, dO [B,qL,H,D]; K, V [B,kL,H_kv,D] (as examples/ use them) */
};

/* The sinks of a problem (attn_variants.sinks). */
enum {
  ATTN_SINKS_NONE,    /* opt.sinks NULL */
  ATTN_SINKS_RANDOM,  /* s_h uniform in [-3, 3): the scores' own range */
  ATTN_SINKS_EXTREME, /* head h: -inf, 100, -100, 30, -30, then uniform (as RANDOM) */
};

/* One test problem: sizes, layout and features. */
typedef struct {
  const char *name;
  int B, H, H_kv, qL, kL, D;
  int causal;
  int qL_off_delta; /* qL_off = kL - qL + delta (0 = bottom-right aligned) */
  int mask;         /* 0 none, 1 full [B,H,qL,kL], 2 broadcast over batch and head */
  int layout;       /* ATTN_* */
  float softcap;    /* 1 = off */
  float dropout_p;  /* 0 = off */
} attn_cfg;

/* The attention variants of a problem (tg_attn_options; attn_build_v with
 * attn_suite.options on). All zero: none. */
typedef struct {
  int window; /* W, 0 = none */
  int Dv;     /* value head dim, 0 = D */
  int sinks;  /* ATTN_SINKS_* */
} attn_variants;

/* Ranges attn_random_cfg draws from beyond the shared ones. */
typedef struct {
  int long_lo, long_hi; /* a quarter of the qL and kL drawn from here, the rest 1..130 */
  int dropout;          /* half the configs with dropout p in [0, 0.95) */
} attn_cfg_limits;

/* A fresh shape and features: B 1-2, H_kv 1-3, gqa 1-3, D = 8 * (1..20),
 * causal half the time (a quarter of those with qL_off moved by -20..20),
 * mask none, full or broadcast, head-major or strided, softcap in [0.5, 10)
 * a quarter of the time. */
attn_cfg attn_random_cfg(tu_rng *r, const attn_cfg_limits *lim);
/* "B=.. H=.. ..": the config for a failure message. */
void attn_cfg_str(const attn_cfg *c, char *buf, size_t size);
/* Fresh variants for config c: each on in about 2 draws of 3: window 1,
 * 2-15, 16-200 or kL + 0..20 (no effect where qL_off <= kL - qL), Dv = 8 *
 * (1..40) or 512 one time in 16, sinks random or extreme. */
attn_variants attn_random_variants(tu_rng *r, const attn_cfg *c);
/* "W=.. Dv=.. sinks=..": the variants for a failure message. */
void attn_variants_str(const attn_variants *v, char *buf, size_t size);

/* The ways the backward can run: both schedules, and deterministic mode. */
typedef struct {
  const char *name;
  tg_attn_schedule schedule;
  int det; /* overrides the schedule */
} attn_run_mode;
enum { ATTN_N_MODES = 3 };
extern const attn_run_mode attn_modes[ATTN_N_MODES];
/* A context at `threads` on `isa` (tu_ctx) in run mode m. */
tg_ctx *attn_mode_ctx(int threads, tg_isa isa, const attn_run_mode *m);

/* The runs of one problem: every ISA under test (tu_isas) x thread count
 * (tu_thread_counts) x run mode (attn_modes), K combinations in all, each
 * with its context:
 *
 *   attn_runs runs = attn_runs_of(ci, N_CONFIGS);
 *   for (const attn_run *run; (run = attn_runs_next(&runs)) != NULL;)
 *     ... run->ctx ... "%s %s", name, run->what ...
 *
 * attn_runs_next destroys the context of the run before (the body must not
 * break out of the loop or destroy it). With T thread counts and M run
 * modes, combination j (0 <= j < K) is ISA j / (T M), thread count
 * j / M % T, run mode j % M.
 *
 * Without TG_TEST_SHORT a problem takes all K. With it (qemu and
 * AddressSanitizer, where the full product took most of CI's time) problem p of the
 * n_problems (numbered 0 .. n_problems - 1) takes the combinations p % K,
 * p % K + n_problems, p % K + 2 n_problems, ... below K: one each when
 * n_problems >= K, else at most ceil(K / n_problems). Every combination j
 * is taken at least once across the problems, by problem j % n_problems
 * (for n_problems > K that is problem j itself, whose start is j % K = j).
 * Which problem takes which is fixed: the same every run. */
typedef struct {
  tg_ctx *ctx;
  tg_isa isa;
  int threads;
  const attn_run_mode *mode;
  char what[64]; /* "[isa, N threads, mode]" */
} attn_run;

typedef struct {
  tg_isa isas[TU_MAX_ISAS];
  int n_combos; /* K */
  int next;     /* the next combination to take */
  int step;     /* 1, or n_problems under TG_TEST_SHORT */
  attn_run run; /* the current one (run.ctx NULL before the first) */
} attn_runs;

attn_runs attn_runs_of(int problem, int n_problems);
/* The next run (its context made), or NULL after the last. */
const attn_run *attn_runs_next(attn_runs *runs);

/* How dK, dV start (attn_suite.acc). */
enum {
  ATTN_ACC_NONE,   /* from 0: dK0, dV0 NULL, no term of their own */
  ATTN_ACC_ZERO,   /* from dK0 = dV0 = 0, one more term of the sums */
  ATTN_ACC_RANDOM, /* from dK0, dV0 uniform in [-1, 1) */
};

typedef struct attn_problem attn_problem;

/* Key k of a query row. */
typedef struct {
  double s;       /* score with the mask added (mask term 0 where not visible) */
  double err;     /* error bound of the f32 score */
  double t, terr; /* with softcap: tanh(scale q.k / softcap) and its error; else 0 */
  int vis;        /* causal and mask let the row see the key */
} attn_key;

/* One query row (b, h, i), head hk = h / gqa, index row = (b H + h) qL + i in
 * the reference arrays. The row function sets P, Pe, dS, dSe for every key;
 * a key with P = 0 adds nothing and its Pe, dS, dSe are not read (dense: P
 * and dS of every key are read). z is dropout's keep / (1 - p) (1 without). */
typedef struct {
  int64_t b, h, i, hk, row;
  const float *dO;           /* [Dv] */
  const attn_key *key;       /* [kL] */
  const double *z;           /* [kL] */
  double *P, *Pe, *dS, *dSe; /* [kL] */
  /* [4]: the L and D_vec the backward takes for this row and their bounds
   * (L, e_L, D_vec, e_D; set by the row function): d_sinks' terms */
  double *given;
  int dense; /* every key enters (see the top) */
} attn_row;

typedef void attn_row_fn(attn_problem *pb, const attn_row *r);

/* What differs between the suites beyond the config. */
typedef struct {
  /* Q, K, V, dO standard normal (unit variance); else Q, K uniform in
   * [-2, 2), V, dO in [-1, 1) */
  int normal;
  /* inputs (and the mask) rounded to bf16 and held as bf16 too (Qb ..), O
   * stored in bf16 */
  int bf16;
  /* mask entries -inf with probability mask_ninf, else uniform in [mask_lo, 1);
   * then rows mask_row0, mask_row0 + mask_step, ... entirely -inf */
  double mask_ninf, mask_lo;
  int mask_row0, mask_step;
  int acc; /* ATTN_ACC_* */
  /* draw tg_attn_options: dropout_p from the config, a seed and an offset
   * (near 2^64 half the time: the counter's carry); keep flags when p > 0 */
  int options;
  /* the precision mode of the bf16 runs (tg_ctx_set_attn_precision; 0:
   * exact): the reference's bounds take its relative error per term of the
   * products that take P or dS (u_P below) and how the tables under test
   * run those products (bf16 parts, attn_problem.parts) */
  tg_attn_precision precision;
  attn_row_fn *row;
} attn_suite;

struct attn_problem {
  attn_cfg c;
  attn_variants v;
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_attn_options opt;
  int64_t nQ, nK, nKout, nL, nM; /* Q/dQ, K (padded), dK, rows, mask */
  int64_t vdim, nO, nV, nVout;   /* value head dim Dv (D without one); O/dO, V (padded), dV */
  float *Q, *K, *V, *dO, *mask;  /* the reference's inputs (mask NULL without) */
  float *sinks;                  /* [H] with attn_cfg.sinks (opt.sinks points here); else NULL */
  float *d_sinks0;               /* [H] what d_sinks accumulates onto (uniform in [-1, 1)) */
  tg_bf16 *Qb, *Kb, *Vb, *dOb, *maskb; /* with attn_suite.bf16: the same values; else NULL */
  float *dK0, *dV0;              /* what dK, dV accumulate onto (ATTN_ACC_NONE: NULL) */
  uint8_t *keep;                 /* [B,H,qL,kL] with dropout; else NULL */
  int bf16;                      /* attn_suite.bf16 */
  /* the precision mode's relative error per term of the products that take
   * P or dS, in the forward and the backward: 0 exact, 2^-16 split (hi + lo
   * misses x by at most bf16's unit roundoff of x - hi, itself at most 2^-8
   * |x|), 2^-8 bf16 (one rounding); exact mode's forward split's where a
   * table under test runs it on two parts (parts_fwd) */
  double u_P_fwd, u_P_bwd;
  /* With bf16 inputs, the most bf16 parts per P or dS operand any table
   * under test splits those products into, in the forward and the backward
   * (tg_testing_attn_bf16_parts; 0: all run them on the f32 GEMM). parts
   * passes over K add parts K terms to each f32 sum, and the bf16 units
   * flush subnormal parts to zero. */
  int parts_fwd, parts_bwd;
  /* the backward's L and D_vec [B,H,qL] when attn_bwd_row sets them */
  float *L, *Dv;
  /* f64 reference and its error bound: forward L [B,H,qL] (-inf where the row
   * sees no key, s_h with a sink), O [B,H,qL,Dv], D_vec = O.dO, gradients;
   * with sinks d_sinks [H] (from d_sinks0). empty [B,H,qL]: the row sees no
   * key. */
  double *Lr, *Le, *Or, *Oe, *Dr, *De;
  double *dQr, *dKr, *dVr, *dQe, *dKe, *dVe;
  double *dsr, *dse;
  uint8_t *empty;
};

/* sum_d a[d] b[d] in f64 (exact products of f32), and sum_d |a[d] b[d]|. */
double attn_dot(const float *a, const float *b, int64_t D, double *abs_sum);

/* Draws Q, dO, K, V (then the mask, dK0, dV0, the options, the sinks and
 * d_sinks0) from r and computes the reference. Fails the test if the params
 * are refused. attn_build: without variants. */
void attn_build_v(attn_problem *pb, const attn_cfg *c, const attn_variants *v,
                  const attn_suite *s, tu_rng *r);
void attn_build(attn_problem *pb, const attn_cfg *c, const attn_suite *s, tu_rng *r);
void attn_destroy(attn_problem *pb);
/* (Re)computes the reference (Lr .. dVe) from the current inputs with `row`
 * (a bf16 problem widens Qb .. again first: a test may have planted values
 * there); dense as at the top. */
void attn_reference(attn_problem *pb, attn_row_fn *row, int dense);

/* Row functions of the backward fed a given L and D_vec. attn_bwd_row hands
 * the kernel the reference's L, rounded to f32, and D_vec = O.dO with O =
 * P V rounded to bf16 as the forward stores it (pb->L, pb->Dv), so neither
 * carries an error of its own; then attn_bwd_row_given. attn_bwd_row_given
 * takes pb->L and pb->Dv as they are: P = exp(s - L) (0 for an invisible key
 * and for a row with L = -inf, the contract's fully masked row), dS =
 * scale P (dP - D_vec) (times 1 - t^2 with softcap), with the bounds of
 * tests/test_attention.c. No dropout. */
attn_row_fn attn_bwd_row, attn_bwd_row_given;
/* Row function of a training step: the backward fed the forward's L (bound
 * e_L) and D_vec from the forward's O (bound e_D), with dropout; the bounds
 * of tests/test_attn_ext.c and tests/train/test_attn_roundtrip.c. */
attn_row_fn attn_step_row;

/* Kernel outputs of the bf16 suites: O through O_strides [nO]; L, D_vec [nL]
 * and D_vec over token-major rows [B,qL,H] (Dtok); dQ [nQ], dK [nKout], dV
 * [nVout]. */
typedef struct {
  tg_bf16 *O;
  float *L, *Dtok, *Dv, *dQ, *dK, *dV;
} attn_outputs;

attn_outputs attn_alloc_outputs(const attn_problem *pb);
void attn_free_outputs(attn_outputs *o);

/* L: -inf exactly where the reference's is, the others within the bound. */
int attn_check_L(const attn_problem *pb, const float *L);
/* dQ, dK, dV against the reference bounds (all three, reporting each). */
int attn_check_grads(const attn_problem *pb, const float *dQ, const float *dK, const float *dV);
/* d_sinks [H] against the reference bound (without sinks: nothing to check). */
int attn_check_d_sinks(const attn_problem *pb, const float *d_sinks);

#endif
