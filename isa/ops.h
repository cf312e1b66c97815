/*
 * The ISA layer: the few vector inner loops the kernels spend their time in,
 * and the blocking the drivers use around them, behind one table per ISA
 * (isa/registry.h lists them). isa/common/ is written in plain C and
 * compiled once per ISA together with that ISA's own files (isa/x86/,
 * isa/arm/: the bf16 and AMX products), each build taking its register and
 * tile blocking from isa/tuning.h and its few intrinsic blocks
 * from isa/<arch>/simd_<isa>.h; the portable table is always built and
 * tested. tg_ctx_create picks a table from CPUID (isa/select.c;
 * overridable with TG_ISA / tg_ctx_set_isa).
 *
 * Matrices are f32, row-major, with explicit leading dimensions (elements).
 */
#ifndef TG_ISA_OPS_H
#define TG_ISA_OPS_H

#include <stdint.h>

#include "registry.h"
#include "tilegrad.h"

/* A term of mm_bf16_terms: A [M, K] (bf16 rows), Bp [K/2, N] (pairs). */
typedef struct {
  const uint16_t *A;
  const uint32_t *Bp;
  int K;
} tg_bf16_term;

/* f32_to_bf16_split's layouts */
typedef enum { TG_SPLIT_ROWS, TG_SPLIT_TRANSPOSED, TG_SPLIT_ROW_PAIRS } tg_split_layout;

typedef struct {
  const char *name;
  /* NULL functions: this ISA is not in this build (its compiler flags were
   * refused, or the target is not x86-64); tg_isa_table then says so. */

  /* --- blocking: the drivers read these, never their own constants ------ */
  int gemm_mr, gemm_nr; /* register block of mm_nn / mm_tn_acc (rows x cols of C) */
  int attn_bq, attn_bk; /* attention q-tile and key-tile rows (forward, backward,
                         * token-major); attn_bk is a multiple of gemm_nr */
  int attn_bq_bf16, attn_bk_bf16; /* the tiles when all five products run on
                                   * mm_bf16_pairs (bf16 mode: tg_attn_bq, _bk) */
  /* From this head dim on, exact mode's P, dS products run on
   * mm_bf16_pairs as three bf16 parts, [0] in the forward, [1] in the
   * backward; 0: never (tg_attn_products_of) */
  int exact_parts_min_d[2];
  /* f32_to_bf16_split's one or two parts read and write subnormals as 0
   * (vcvtneps2bf16; the tables whose bf16 products read a subnormal part
   * as 0 anyway) */
  int split_ftz;
  /* The k step of mm_bf16_pairs' blocks (the amx table's tiles: 32); 0:
   * none beyond the pairs. A K that is no multiple of it runs its last step
   * through zero-padded copies of the operands at every block of C, so
   * the attention pads S's and dP's K to it in its own copies instead
   * (kernels/attention.h, tg_attn_k_padded). */
  int bf16_k_step;

  /* C[M,N] = A[M,K] . B[K,N]          (accumulate == 0)
   * C[M,N] += A[M,K] . B[K,N]         (accumulate != 0) */
  void (*mm_nn)(int M, int N, int K, const float *A, int64_t lda, const float *B,
                int64_t ldb, float *C, int64_t ldc, int accumulate);
  /* C[M,N] += A[K,M]^T . B[K,N] */
  void (*mm_tn_acc)(int M, int N, int K, const float *A, int64_t lda, const float *B,
                    int64_t ldb, float *C, int64_t ldc);
  /* --- bf16 dot products (vdpbf16ps); NULL in tables without them -------
   * C[M,N] (+)= A[M,K] . B[K,N] for bf16 A and B, K even, f32 accumulation
   * with exact products (rounded sums, pairs of k at a time; subnormal
   * inputs and results flushed to zero, as the instruction does). A: rows of
   * K bf16 at stride lda (elements, even; any 2-byte alignment); Bp: B in
   * pairs, Bp[p * ldb + j] = the 32-bit pair (B[2p, j], B[2p+1, j]), from
   * pack_bf16_pairs. */
  void (*mm_bf16_pairs)(int M, int N, int K, const uint16_t *A, int64_t lda,
                        const uint32_t *Bp, int64_t ldb, float *C, int64_t ldc,
                        int accumulate);
  /* Optional (NULL: n calls of mm_bf16_pairs, term by term): C (+)=
   * A_0 . B_0 + ... + A_{n-1} . B_{n-1}, term i = terms[i] as one call's A,
   * Bp and K (K even; A at stride lda, Bp at stride ldb for every term).
   * Consecutive terms with one K and one A (all of them) or one Bp (all of
   * them) form a group (an f32 operand's bf16 parts against the same other
   * operand); groups run in order, each 32 k at a time, its terms in turn
   * at every step: the bits of mm_bf16_pairs calls on those 32-k slices in
   * that order, the first with `accumulate` and the rest accumulating
   * (tests/test_micro.c, terms_by_calls). The amx table loads and stores
   * each block of C once for all terms, and a group's shared tiles once
   * per k step. */
  void (*mm_bf16_terms)(int n, const tg_bf16_term *terms, int M, int N, int64_t lda,
                        int64_t ldb, float *C, int64_t ldc, int accumulate);
  /* Optional (NULL where not needed): bracket a work item's run of
   * mm_bf16_pairs calls on one thread. The amx table loads its tile
   * configuration once at begin and releases the tiles at end (its calls
   * outside a bracket do both themselves); nothing else may use the tiles
   * on that thread in between. */
  void (*bf16_dot_begin)(void);
  void (*bf16_dot_end)(void);
  /* The pair layout of a transposed bf16 matrix: rows r < nr of X [nr, K]
   * (stride lds elements, even) -> Bp[p * ldb + r] = (X[r, 2p], X[r, 2p+1])
   * for p < K/2, i.e. B = X^T in the layout mm_bf16_pairs reads (K even). */
  void (*pack_bf16_pairs)(int64_t nr, int64_t K, const uint16_t *X, int64_t lds,
                          uint32_t *Bp, int64_t ldb);
  /* --- operands of the attention's precision modes (common/bf16_pack.c) ---------
   * The bf16 parts of an f32 block [rows, cols] (stride lds). One or two
   * (lo2 NULL; lo NULL: hi only): hi = bf16(x) rounded to nearest even, lo
   * = bf16(x - hi) (0 where hi is not finite). Three: by truncation, hi =
   * x's high 16 bits, lo = (x - hi)'s, lo2 = (x - hi - lo)'s (a NaN's hi
   * quiet, lo and lo2 0 where x is not finite), so hi + lo + lo2 = x
   * exactly unless lo2 is subnormal, at a third of the rounded parts' cost
   * (exact mode needs x, not the nearest parts). In `layout`
   * (tg_split_layout): TG_SPLIT_ROWS hi[r * ldd + c], each row padded to an
   * even length with a 0 (ldd > cols when cols is odd); TG_SPLIT_TRANSPOSED
   * hi[c * ldd + r], the row count padded likewise; TG_SPLIT_ROW_PAIRS
   * pack_bf16_row_pairs' layout, rows 2p and 2p + 1 as the low and high
   * halves of 32-bit pairs, ((uint32_t *)hi)[p * ldd + c] = (hi[2p, c],
   * hi[2p + 1, c]) for p < ceil(rows / 2), the missing row of an odd count
   * read as 0 (ldd counts pairs; the parts 4-byte aligned). The first two
   * are mm_bf16_pairs' A operand of the block and of its transpose, the
   * last its B operand. The same layout for lo and lo2. Where split_ftz is
   * set one or two parts are bf16(r) but 0 (of r's sign) where the
   * remainder r is subnormal. */
  void (*f32_to_bf16_split)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                            int layout, uint16_t *hi, uint16_t *lo, uint16_t *lo2,
                            int64_t ldd);
  /* The pair layout of a bf16 matrix along its rows: X [nr, ncols] (stride
   * lds) -> Bp[p * ldb + j] = (X[2p, j], X[2p+1, j]) for p < ceil(nr / 2),
   * X[nr, j] read as 0 when nr is odd: B = X in mm_bf16_pairs' layout with
   * K = nr rounded up to even. */
  void (*pack_bf16_row_pairs)(int64_t nr, int64_t ncols, const uint16_t *X, int64_t lds,
                              uint32_t *Bp, int64_t ldb);
  /* dst[i] = float(src[i]) */
  void (*bf16_to_f32)(const uint16_t *src, float *dst, int64_t n);
  /* dst[i] = bf16(src[i]), round to nearest even */
  void (*f32_to_bf16)(const float *src, uint16_t *dst, int64_t n);
  /* sum_i float(a[i]) * float(b[i]), f32 accumulation */
  float (*dot_bf16)(const uint16_t *a, const uint16_t *b, int64_t n);
  /* y[i] = exp(x[i]) within 2 ulp (subnormal results included; -inf -> 0,
   * NaN -> NaN); y may alias x */
  void (*exp_f32)(const float *x, float *y, int64_t n);
  /* Attention score row without softcapping, in place on s[0..n) = Q.K^T:
   * s[k] = scale*s[k] + m[k] - shift for k < n_vis (m = 0 without a mask;
   * a mask entry of -inf gives -inf), and -inf for k >= n_vis (causal).
   * The mask row's elements are of type mask_type (bf16 widened exactly, or
   * f32), here and in the two ops below. */
  void (*attn_score_row)(float *s, int64_t n, int64_t n_vis, float scale, const void *mask,
                         tg_dtype mask_type, float shift);
  /* Attention dS row: dp[k] = scale * (p[k] * (dp[k] - d)) */
  void (*attn_ds_row)(float *dp, const float *p, int64_t n, float d, float scale);
  /* Attention probability row without softcapping, in place on s = Q.K^T:
   * s[k] = exp(scale*s[k] + m[k] - shift) for k < n_vis (attn_score_row and
   * exp_f32's polynomial in one pass), 0 for k >= n_vis or a mask of -inf. */
  void (*attn_prob_row)(float *s, int64_t n, int64_t n_vis, float scale, const void *mask,
                        tg_dtype mask_type, float shift);
  /* Forward row: s[k] = exp(s[k] - shift) in place, where every s[k] <=
   * shift (shift: the row's running max); returns sum_k s[k] (LANES
   * partials and a fixed tree, then the tail of n % LANES in order).
   * exp_f32's polynomial, except that e^x < 2^-126 (x <= -87.3) gives 0. */
  float (*attn_exp_sum_row)(float *s, int64_t n, float shift);
  /* attn_exp_sum_row with P's bf16 rounding written to p[0, n) instead of
   * the f32 P in place (s is left as it is; the forward in bf16 mode,
   * whose P.V takes that part: one pass over the row, not two). Its exp
   * is a shorter one, within 3.2e-6 (2^-18.2) of e^x instead of 1 ulp
   * (rows.c, exp_bf16_lane): p[k] is the one bf16 part f32_to_bf16_split
   * makes of that e, the sum those e's in attn_exp_sum_row's order. */
  float (*attn_exp_sum_bf16_row)(const float *s, int64_t n, float shift, uint16_t *p);
  /* The forward's row with the running max m kept (a stale max, at most
   * TG_ATTN_FWD_MAX_LAG below the row's): p[k] = bf16 of exp(scale s[k] -
   * m), scale s[k] rounded first as attn_score_max_row stores it, so where
   * the row's max does not pass m these are attn_score_max_row then
   * attn_exp_sum_bf16_row's bits (its exp for arguments above 0 too);
   * returns the sum, *max_out the max of scale s[k]
   * (NaN where one is NaN); s is left as it is. One pass instead of two. */
  float (*attn_exp_sum_lag_bf16_row)(const float *s, int64_t n, float scale, float m,
                                     uint16_t *p, float *max_out);
  /* attn_score_row with shift 0, returning max_k s[k]: -inf when every key
   * is masked, NaN when any visible s[k] is NaN (a NaN input reaches its
   * row's max, so the softmax of that row is NaN, as in IEEE arithmetic). */
  float (*attn_score_max_row)(float *s, int64_t n, int64_t n_vis, float scale,
                              const void *mask, tg_dtype mask_type);
  /* Dropout keep flags of attention weights n0 .. n0 + n - 1 (numbered and
   * drawn as kernels/attention_options.c says): keep[j] = 1 iff word
   * (n0 + j) % 4 of Philox4x32-10(key = seed, 128-bit counter = offset +
   * (n0 + j) / 4) is >= threshold, else 0. Integer arithmetic: the same
   * flags on every table (isa/philox.h is the scalar definition). */
  void (*dropout_keep)(uint8_t *keep, int64_t n, uint64_t n0, uint64_t seed, uint64_t offset,
                       uint32_t threshold);

  /* --- row ops of the memory-bound kernels (any n >= 0 unless stated;
   * reductions use 16 lane-parallel partials and a fixed pairwise tree, so
   * their order depends on n only) --------------------------------------- */
  /* sum_i a[i] * b[i] */
  float (*dot_f32)(const float *a, const float *b, int64_t n);
  /* sum_i a[i] * b[i] * c[i] */
  float (*dot3_f32)(const float *a, const float *b, const float *c, int64_t n);
  /* max_i x[i] (-inf for n == 0; NaN entries are skipped by the compare) */
  float (*max_f32)(const float *x, int64_t n);
  /* x[i] = (x[i] * a) * b, in place */
  void (*scale2_f32)(float *x, int64_t n, float a, float b);
  /* dst[i] += src[i] */
  void (*add_f32)(float *dst, const float *src, int64_t n);
  /* Kahan's compensated sum, element-wise: sum[i] += x[i] with the rounding
   * error of each such add carried in comp[i] (both start at 0), then
   * x[i] = 0 (x is a part to be summed again). */
  void (*add_compensated_f32)(float *sum, float *comp, float *x, int64_t n);
  /* acc[i] += a[i] * s * b[i]   (s a scalar) */
  void (*acc_mul2_f32)(float *acc, const float *a, const float *b, float s, int64_t n);
  /* RMSNorm dx row: dx[k] = r * (dy[k] * w[k] - x[k] * c) */
  void (*rms_dx_row)(const float *x, const float *w, const float *dy, float r, float c,
                     float *dx, int64_t n);
  /* In-place Walsh-Hadamard transform of one row, then a per-element factor:
   * x = mul .* (H x), H Sylvester (natural order), n a power of two >= 16.
   * The butterflies run in the order len = 1, 2, 4, ..., each output one f32
   * add or subtract, so the result does not depend on the vectorization. */
  void (*fwht_mul_f32)(float *x, int64_t n, const float *mul);
  /* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (exact copy).
   * stream != 0: whole 64-byte output lines may go around the caches
   * (non-temporal stores, fenced before return), for outputs far larger than
   * the caches: no read-for-ownership, no eviction of what is cached. */
  void (*transpose_f32)(int64_t rows, int64_t cols, const float *src, int64_t lds, float *dst,
                        int64_t ldd, int stream);
  /* dst[c * ldd + r] += src[r * lds + c] for r < rows, c < cols (one f32
   * add each): a transposed block added to rows without a copy of it (the
   * backward's dK^T, dV^T sums into dK, dV). */
  void (*add_transposed_f32)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                             float *dst, int64_t ldd);
  /* Weighted sum of partials interleaved in fours (the split-KV decode
   * layout): for c < n4, k < 4,
   *   dst[4c + k] = (sum_{i < nw} a[i] * part[((c * ld) + w[i]) * 4 + k]) / div
   * summing i = 0, 1, ... in order (only the workgroups w[i] listed, with
   * weights a[i]; the others are never read); ld = workgroups per c. */
  void (*wsum4_f32)(const float *part, int64_t ld, const int32_t *w, const float *a, int64_t nw,
                    int64_t n4, float div, float *dst);
  /* One chunk of an online softmax over a row (chunks of TG_SOFTMAX_CHUNK
   * floats, isa/reduce.h; len a multiple of 16 but in the row's last):
   * state[0..15] lane sums, state[16] running max (start 0s, -inf). The max
   * m_c grows to cover the chunk, the sums are rescaled by exp(m_old - m_c),
   * e[j] = exp(x[j] - m_c) (x[j] - 0 while m_c = -inf) is written and
   * added; returns m_c. After a row's last chunk the fixed tree of the lane
   * sums is S = sum_j exp(x[j] - M), M the row max. exp within 2 ulp
   * (subnormals; -inf -> 0, NaN -> NaN); NaN entries are skipped by the max
   * and reach e and S. */
  float (*softmax_exp_chunk)(const float *x, int64_t len, float *e, float *state);
  /* y[j] = (e[j] * a[j / TG_SOFTMAX_CHUNK]) * b. stream != 0: whole aligned
   * 64-byte lines of y with non-temporal stores, not fenced: call
   * stream_fence before y is read or stored to again. */
  void (*scale_chunks_f32)(const float *e, const float *a, float b, float *y, int64_t n,
                           int stream);
  /* *xx = sum_i x[i]^2 and *dyxw = sum_i dy[i] * x[i] * w[i] in one read,
   * bit-equal to dot_f32(x, x) and dot3_f32(dy, x, w) */
  void (*rms_sums_f32)(const float *x, const float *dy, const float *w, int64_t n, float *xx,
                       float *dyxw);
  /* part[k] += x[k] * r * dy[k] and dx[k] = r * (dy[k] * w[k] - x[k] * c) in one
   * walk, bit-equal to acc_mul2_f32 and rms_dx_row. stream != 0: whole aligned
   * 64-byte lines of dx with non-temporal stores, not fenced (stream_fence). */
  void (*rms_bwd_row)(const float *x, const float *w, const float *dy, float r, float c,
                      float *part, float *dx, int64_t n, int stream);
  /* Orders the unfenced non-temporal stores of the ops above before any
   * later store (before the work item ends). */
  void (*stream_fence)(void);

  /* --- RoPE and gated-linear-unit rows (kernels/rope.c, kernels/glu.c);
   * row_ops.c, without FMA contraction -------------------------------------
   * One head row's rotary part, R even: with s the kernel's signed sine
   * (its signs and, in the backward, its halves or pairs swapped: rope.c),
   *   rotate-half (interleaved 0), h = R/2, i < h:
   *     y[i] = x[i] c[i] + x[i+h] s[i],  y[i+h] = x[i+h] c[i+h] + x[i] s[i+h]
   *   interleaved pairs, i < h:
   *     y[2i] = x[2i] c[2i] + x[2i+1] s[2i],  y[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]
   * each output two products and a sum, rounded as written. y overlaps
   * nothing. */
  void (*rope_row_f32)(const float *x, const float *c, const float *s, float *y, int64_t R,
                       int interleaved);
  /* Gated linear units, act a tg_glu_act (silu or gelu_tanh), S = sigmoid:
   * silu(g) = g S(g), gelu_tanh(g) = g S(z) with z = 2 sqrt(2/pi) (g + 0.044715
   * g^3) (0.5 (1 + tanh(z/2)) = S(z)); S and 1 - S from e = exp(-|z|) by
   * exp_f32 (so only its bits differ between tables), never overflowing.
   *   forward:  y[k] = act(g[k]) u[k]; y may be g or u exactly
   *   backward: du[k] = dy[k] act(g[k]), dg[k] = dy[k] u[k] act'(g[k]);
   *             dg may be g and du may be u exactly (each element is read
   *             before it is written) */
  void (*glu_fwd_f32)(const float *g, const float *u, float *y, int64_t n, int act);
  void (*glu_bwd_f32)(const float *g, const float *u, const float *dy, float *dg, float *du,
                      int64_t n, int act);
} tg_isa_ops;

#define TG_ISA_DECLARE(name, id, cpu, pick) extern const tg_isa_ops tg_isa_ops_##name;
TG_ISA_LIST(TG_ISA_DECLARE)
#undef TG_ISA_DECLARE

/* --- the choice (isa/select.c) ------------------------------------------------
 * The table of `isa` if this build has it and this CPU runs it, else NULL
 * (TG_ISA_AUTO: the best one). */
const tg_isa_ops *tg_isa_table(tg_isa isa);
/* The registry id of a table tg_isa_table gave (never TG_ISA_AUTO). */
tg_isa tg_isa_of(const tg_isa_ops *ops);
/* Why tg_isa_table(isa) is NULL, where that is cheap to say ("" if not). */
const char *tg_isa_why_not(tg_isa isa);

#endif /* TG_ISA_OPS_H */
