/*
 * f64 references shared by the kernel suites (tests/test_*.c) and the NaN /
 * infinity suite (tests/test_nan_inputs.c): kernels 1, 3-11 and the RMSNorm
 * forward. (The FA-2 attention reference is tests/common/attn_problem.h.)
 *
 * Each reference evaluates the kernel's formula on the kernel's inputs in f64
 * IEEE arithmetic, so an input NaN or +-inf gives the NaN or +-inf the kernel
 * must give, and returns with every value a bound on the error of an f32
 * evaluation of it (the derivations are in each suite's header comment; a
 * value that is NaN or infinite has bound 0, see errbound.h). Where a
 * kernel's contract departs from plain IEEE arithmetic (docs/KERNELS.md),
 * the reference follows the contract and says so.
 *
 * Output arrays are want[i] (the value) and bound[i]; sizes as the kernel's
 * outputs.
 */
#ifndef TG_REFS_H
#define TG_REFS_H

#include <stdint.h>

#include "tilegrad.h"

/* --- 1. compute_d: D[i] = sum_d O[i,d] dO[i,d] over rows of D (bf16) ----- */
void ref_compute_d(const tg_bf16 *O, const tg_bf16 *dO, int64_t rows, int64_t D, double *want,
                   double *bound);

/* --- 3. f32 -> bf16: the nearest bf16, ties to even; NaN -> 0x7FC0 --------- */
uint16_t ref_bf16(float x);

/* --- 4-5. RMSNorm, x and dy [rows, dim], w [dim], r [rows] ---------------- */
/* Forward y = x r w (y, y_e may be NULL: r alone, kernel 4a) and
 * r = 1/sqrt(sum x^2 / dim + eps). */
void ref_rms_forward(const float *x, const float *w, uint32_t rows, uint32_t dim, float eps,
                     double *y, double *y_e, double *r, double *r_e);
/* Split dx from the given r. */
void ref_rms_dx(const float *x, const float *w, const float *dy, const float *r, uint32_t rows,
                uint32_t dim, double *dx, double *dx_e);
/* Split dw from the given r. */
void ref_rms_dw(const float *x, const float *dy, const float *r, uint32_t rows, uint32_t dim,
                double *dw, double *dw_e);
/* Fused: r from x and eps; grad_input, and grad_weight = gw_pre + sum_b x r dy. */
void ref_rms_fused(const float *x, const float *w, const float *dy, const float *gw_pre,
                   uint32_t rows, uint32_t dim, float eps, double *dx, double *dx_e, double *gw,
                   double *gw_e);

/* --- 6. softmax backward, [rows, len] ----------------------------------------- */
void ref_softmax_backward(const float *sm, const float *go, uint32_t rows, uint32_t len,
                          double *want, double *bound);

/* --- 7. embedding backward: grad_weight = pre + scattered rows ---------------- */
void ref_embedding_backward(const float *grad_out, const uint32_t *ids, const float *pre,
                            uint32_t vocab, uint32_t seq, uint32_t dim, double *want,
                            double *bound);

/* --- 8. cross-entropy: grad [n_pos, V] and loss_out = prefill + sum_t loss_t / count.
 * Contract departures: a pad row's grad is 0 and adds no loss (its logits are
 * never read); a row of only -inf logits takes the equal-logits limit (grad
 * (1/V - onehot)/count, loss +inf), NaN if a NaN hides among them. */
void ref_cross_entropy(const float *logits, const uint32_t *targets, uint32_t n_pos, uint32_t V,
                       uint32_t pad_id, uint32_t count, float prefill, double *grad,
                       double *grad_e, double *loss, double *loss_e);

/* --- 9. transpose is an exact copy: its suites compare bits. ------------------ */

/* --- 10. causal attention backward, token-major f32 (tests/test_causal_attention.c
 * derives the bounds). grad_K/grad_V accumulate onto preK/preV. Contract
 * departure: a row whose visible scores are all -inf sees no key (L = -inf,
 * O = 0) and contributes nothing (its grad_Q row is 0).
 * dense = 0: the mathematical dependencies: a pair (i, j) enters only when j
 * is visible to i and P_ij != 0. dense = 1: every pair, with P_ij = 0 where
 * j is not visible (and for a row that sees no key), multiplied through as
 * the kernel's tile products do (0 * inf and 0 * NaN are NaN); the bounds are
 * not computed. An element is NaN or infinite in the dense reference where
 * the kernel may also make it so (tu_check_ieee's `may`). */
void ref_causal_attention_backward(const float *dO, const float *Q, const float *K,
                                   const float *V, const float *preK, const float *preV,
                                   uint32_t S, uint32_t H, uint32_t Hkv, uint32_t D, int dense,
                                   double *wQ, double *bQ, double *wK, double *bK, double *wV,
                                   double *bV);

/* --- 11. decode ----------------------------------------------------------------- */
/* The contract's D1 sign table: bit j of the table (byte j >> 3, bit j & 7)
 * set means sign(j) = -1. */
extern const uint8_t ref_tq_d1_signs[64];
/* y = sign .* (H x) / sqrt(D) per row of D (256 or 512), nh rows. */
void ref_fwht_sign_undo(const float *x, uint32_t nh, uint32_t D, double *want, double *bound);
/* The reduce of htmp (kernels/decode.c has the layout), per row:
 * Mg = max_w M_w, a_w = exp(M_w - Mg), St = sum_w S_w a_w,
 * dst = sum_w part_w a_w / St. Contract departures: a workgroup with
 * M = -inf is empty (weight 0, its S and partials never read), and a row
 * with St == 0 is 0. */
void ref_vec_reduce(const float *htmp, uint32_t nrows, uint32_t DV, uint32_t nwg, double *want,
                    double *bound);

#endif /* TG_REFS_H */
