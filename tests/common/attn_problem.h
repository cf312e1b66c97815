/*
 * Attention test problems shared by tests/test_attention.c (backward fed a
 * reference L and D_vec, and the forward) and tests/train/test_attn_roundtrip.c
 * (forward -> backward round trip): random bf16 Q, K, V, dO and an optional
 * additive mask, in one of three layouts, with GQA, causal (qL_off) and
 * softcapping; and the f64 reference with per-element first-order error
 * bounds (u = 2^-24, gamma(n) = (n + 2) u; derivations in those two files).
 *
 * What the suites share is computed here: scores, the forward reference (L
 * and O with bounds) and the sums that turn P and dS into dQ, dK, dV with
 * bounds. What differs (where the backward's L and D_vec come from, and so
 * the bounds of P and dS) is each suite's row function; the backward's P and
 * dS from given L and D_vec are here too (attn_bwd_row, attn_bwd_row_given).
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

static const double U = 0x1.0p-24; /* f32 unit roundoff */
static inline double gam(double n) { return (n + 2) * U; } /* sum of n terms */

static inline double attn_bf(tg_bf16 x) { return tg_bf16_to_f32(x); }
static inline int64_t attn_off3(const int64_t s[3], int64_t b, int64_t h, int64_t r) {
  return b * s[0] + h * s[1] + r * s[2];
}

/* Layouts of the inputs and O (through the strides). The reference and the
 * gradients dQ [B,H,qL,D], dK, dV [B,H_kv,kL,D] are always contiguous. */
enum {
  ATTN_HEAD_MAJOR,  /* Q, O, dO [B,H,qL,D]; K, V [B,H_kv,kL,D] */
  ATTN_STRIDED,     /* Q, O, dO [B,qL,H,D]; K, V [B,H_kv,kL,D + 8] (rows padded) */
  ATTN_TOKEN_MAJOR, /* Q, O, dO [B,qL,H,D]; K, V [B,kL,H_kv,D] (as examples/ use them) */
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
} attn_cfg;

typedef struct {
  attn_cfg c;
  tg_attn_params p;
  tg_attn_mask_params mp;
  int64_t nQ, nK, nKout, nL, nM; /* Q/dO/O/dQ, K/V (padded), dK/dV, rows, mask */
  tg_bf16 *Q, *K, *V, *dO, *mask;
  /* With attn_suite.ref_inputs: the backward's L and D_vec [B,H,qL] (set by
   * the suite's row function) and the dK, dV it accumulates onto; else NULL. */
  float *L, *Dv, *dK0, *dV0;
  /* f64 reference and its error bound: forward L [B,H,qL] (-inf where the row
   * sees no key), O [B,H,qL,D] (bound of the bf16 store), gradients. */
  double *Lr, *Le, *Or, *Oe;
  double *dQr, *dKr, *dVr, *dQe, *dKe, *dVe;
} attn_problem;

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
 * and dS of every key are read). */
typedef struct {
  int64_t b, h, i, hk, row;
  const tg_bf16 *dO;        /* [D] */
  const attn_key *key;      /* [kL] */
  double *P, *Pe, *dS, *dSe; /* [kL] */
  int dense;                /* every key enters (see the top) */
} attn_row;

typedef void attn_row_fn(attn_problem *pb, const attn_row *r);

/* What differs between the suites beyond the config. */
typedef struct {
  /* mask entries -inf with probability mask_ninf, else uniform in [mask_lo, 1);
   * then rows mask_row0, mask_row0 + mask_step, ... entirely -inf */
  double mask_ninf, mask_lo;
  int mask_row0, mask_step;
  /* 1: the reference hands the backward L and D_vec (pb->L, pb->Dv) and random
   * dK0, dV0 in [-1, 1) to accumulate onto; 0: the kernels make L and D_vec
   * and dK, dV start from 0 */
  int ref_inputs;
  attn_row_fn *row;
} attn_suite;

/* sum_d a[d] b[d] in f64 (exact products of bf16), and sum_d |a[d] b[d]|. */
double attn_dot(const tg_bf16 *a, const tg_bf16 *b, int64_t D, double *abs_sum);

/* Draws Q, dO, K, V (then the mask, then dK0, dV0) from r and computes the
 * reference. Fails the test if the params are refused. */
void attn_build(attn_problem *pb, const attn_cfg *c, const attn_suite *s, tu_rng *r);
void attn_destroy(attn_problem *pb);
/* (Re)computes the reference (Lr .. dVe) from the current inputs with `row`;
 * dense as at the top. */
void attn_reference(attn_problem *pb, attn_row_fn *row, int dense);

/* Row functions of the backward (ref_inputs suites). attn_bwd_row hands the
 * kernel the reference's L, rounded to f32, and D_vec = O.dO with O = P V
 * rounded to bf16 as the forward stores it (pb->L, pb->Dv), so neither
 * carries an error of its own; then attn_bwd_row_given. attn_bwd_row_given
 * takes pb->L and pb->Dv as they are: P = exp(s - L) (0 for an invisible key
 * and for a row with L = -inf, the contract's fully masked row), dS =
 * scale P (dO.V - D_vec) (times 1 - t^2 with softcap), with the bounds of
 * tests/test_attention.c. */
attn_row_fn attn_bwd_row, attn_bwd_row_given;

/* Kernel outputs: O through O_strides [nQ]; L, D_vec [nL] and D_vec over
 * token-major rows [B,qL,H] (Dtok); dQ [nQ], dK, dV [nKout]. */
typedef struct {
  tg_bf16 *O;
  float *L, *Dtok, *Dv, *dQ, *dK, *dV;
} attn_outputs;

attn_outputs attn_alloc_outputs(const attn_problem *pb);
void attn_free_outputs(attn_outputs *o);

/* dQ, dK, dV against the reference bounds (all three, reporting each). */
int attn_check_grads(const attn_problem *pb, const attn_outputs *o);

#endif
