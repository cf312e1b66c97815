/*
 * What the attention kernels (training forward and backward) share: the
 * validated view of a tg_attn_params / mask pair, and the score definition
 * S[i,k] of the contract, so forward and backward cannot drift apart.
 */
#ifndef TG_ATTENTION_H
#define TG_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "engine.h"

/* Metal tiling that the params struct describes (BQ x BK threadgroup tiles). */
enum { TG_METAL_BQ = 32, TG_METAL_BK = 16 };

/* Head dims the CPU kernels take: multiples of 8 up to 512. */
enum { TG_ATTN_MAX_D = 512 };

/* The CPU tiles of the forward and backward (q-tile rows BQ, key-tile rows
 * BK) belong to the ISA: ops->attn_bq, ops->attn_bk (isa/tuning.h), at most
 * TG_ATTN_MAX_TILE each. */

/* Dropout of the attention weights (tg_attn_options; docs/KERNELS.md,
 * "Dropout"). Weight n = ((b H + h) qL + i) kL + k is kept iff its draw,
 * word n % 4 of Philox4x32-10(key = seed, counter = offset + floor(n / 4)),
 * is >= threshold; kept weights are scaled by `scale`. threshold 0: no
 * dropout (a zero-initialised struct is "off"; scale is then not read). */
typedef struct {
  uint32_t threshold; /* round(p * 2^32), ties to even */
  float scale;        /* 1 / (1 - p) in f32 */
  uint64_t seed, offset;
} tg_attn_dropout;

/* A validated attention problem: sizes as int64, strides copied out. All
 * strides are [batch, head, row] in elements of their tensor. Q, K have D
 * columns; V, O, dO, dV have Dv (tg_attn_options.v_head_dim; D without). */
typedef struct {
  int64_t B, H, H_kv, gqa, qL, kL, D, Dv, qL_off;
  int64_t window;    /* W: key k visible to row i iff k > i + qL_off - W; 0 = none */
  const float *sinks; /* [H] sink logits (forward: join the denominator and L); NULL = none */
  float scale;
  float softcap; /* 0 = off (params softcapping == 1.0), else the cap c */
  const int64_t *Qs, *Ks, *Vs, *Os; /* inputs; Os is also dO's */
  const int64_t *Ms;                /* NULL when there is no mask */
  int causal;
  tg_dtype in;                      /* element type of Q, K, V, dO, O and the mask */
  tg_attn_dropout drop;             /* threshold 0: none */
  int compensated;                  /* KV schedule: dK, dV summed over q-tiles with
                                     * compensation (attention_bwd.c) */
  tg_attn_precision precision;      /* of the products taking P or dS (bf16 inputs
                                     * only; tg_attn_products) */
  int o_f32;                        /* forward: O stored as f32 for bf16 inputs too
                                     * (TG_ATTN_OPT_O_F32) */
  int dkv_write;                    /* backward: dK, dV written, not accumulated
                                     * (TG_ATTN_OPT_DKV_WRITE) */
  int64_t dQs[3], dKs[3], dVs[3];   /* f32 gradients dQ [.., D], dK [.., D], dV [.., Dv] */
  int64_t Ls[2];                    /* batch, head strides of L and D_vec (rows: 1);
                                     * {H * qL, qL}: [B, H, qL] */
} tg_attn_problem;

/* Validates p (+ mask params) for entry point `fn` and fills *out (bf16
 * inputs, no dropout, no window or sinks, plain sums, contiguous
 * [B, H, qL, D] / [B, H_kv, kL, D] / [B, H_kv, kL, Dv] gradients; the dtype
 * entry points then set in, drop, window, sinks and compensated). Dv: the
 * value head dim, already checked (tg_attn_check_options); 0 = D.
 * Checks:
 * NULL struct, sizes >= 1, H % gqa_factor, head dim, Metal tiling fields,
 * scale / softcapping finite, strides >= 0 and every addressed element's
 * offset within int64, mask pointer/params pairing, output sizes. */
tg_status tg_attn_validate(tg_ctx *ctx, const char *fn, const tg_attn_params *p,
                           const tg_attn_mask_params *mp, const void *mask,
                           int causal, int64_t Dv, tg_attn_problem *out);

/* --- aliasing (tg_check_alias) of the attention entry points ----------------
 * A tensor [n0, n1, n2, n3] of elem_bytes elements addressed through
 * [batch, head, row] strides s (innermost stride 1) as a tg_buf: its extent,
 * from the lowest byte addressed (the base: strides are >= 0) to the end of
 * the highest element. Conservative: a tensor interleaved with another one
 * (e.g. Q and K as alternate heads of one buffer) overlaps it. Call after
 * tg_attn_validate (offsets fit int64). */
tg_buf tg_attn_buf(const char *name, const void *base, const int64_t s[3], int64_t n0,
                   int64_t n1, int64_t n2, int64_t n3, size_t elem_bytes, int written);

/* The forward's check: outputs O (type pr->in, f32 if pr->o_f32; through
 * pr->Os) and L [B, H, qL] f32 against each other and the inputs Q, K, V
 * (type pr->in), mask (type pr->in, through pr->Ms; NULL without) and
 * pr->sinks ([H] f32; NULL without). No exact in place. */
tg_status tg_attn_check_alias_fwd(tg_ctx *ctx, const char *fn, const tg_attn_problem *pr,
                                  const void *Q, const void *K, const void *V,
                                  const void *mask, const void *O, const float *L);

/* The backward's check: outputs dQ (pr->dQs), dK (pr->dKs), dV (pr->dVs),
 * of grad_bytes elements (f32 or bf16), and d_sinks ([H] f32; NULL without)
 * against each other and the inputs Q, K, V, dO, O (type pr->in; dO and O
 * through pr->Os; O NULL without), L, D_vec ([B, H, qL] f32; NULL without),
 * mask and pr->sinks. No exact in place. */
tg_status tg_attn_check_alias_bwd(tg_ctx *ctx, const char *fn, const tg_attn_problem *pr,
                                  const void *Q, const void *K, const void *V,
                                  const float *L, const void *dO, const void *O,
                                  const float *D_vec, const void *mask, const void *dQ,
                                  const void *dK, const void *dV, size_t grad_bytes,
                                  const float *d_sinks);

/* What the dtype / options entry points (tg_attn_train_fwd, ...) check
 * beyond tg_attn_validate (attention_options.c); TG_ERR_BAD_PARAMS with a
 * message naming the field otherwise. dtype: a tg_dtype value. */
tg_status tg_attn_check_dtype(tg_ctx *ctx, const char *fn, tg_dtype dtype);
/* opt (NULL: the defaults): flags only TG_ATTN_OPT_* bits, dropout_p in
 * [0, 1), v_head_dim 0 or a multiple of 8 up to TG_ATTN_MAX_D, d_sinks only
 * with sinks; *drop gets its dropout (threshold 0 for none). */
tg_status tg_attn_check_options(tg_ctx *ctx, const char *fn, const tg_attn_options *opt,
                                tg_attn_dropout *drop);
/* The checks of the dtype entry points in their order (dtype, options, then
 * tg_attn_validate) and *out with the dtype, dropout and o_f32 set: the problem
 * the engine runs, before the buffers' aliasing check. */
tg_status tg_attn_prepare(tg_ctx *ctx, const char *fn, tg_dtype dtype,
                          const tg_attn_options *opt, const tg_attn_params *p,
                          const tg_attn_mask_params *mp, const void *mask, int causal,
                          tg_attn_problem *out);

/* --- varlen: packed documents (attention_varlen.c) ---------------------------
 * One document of a varlen call: its query and key rows in the packed
 * tensors, its dropout counter base, its visible (query, key) pairs times
 * H (the order of the work and its share of the CPUs), and the CPUs its
 * KV schedule plans for: that share of tg_ctx_plan_cpus, >= 1 (shapes and
 * plan CPUs only: deterministic mode keeps its bits). */
typedef struct {
  int64_t q0, qL, k0, kL;
  uint64_t drop_offset;
  int64_t mask0;     /* its mask's first element (tg_attn_varlen.mask) */
  int64_t Ms[3];     /* its mask's strides: {0, 0, kL} */
  double work;
  int cpus;
} tg_attn_doc;
typedef struct {
  tg_attn_doc *docs; /* costliest first */
  int64_t n;
  int64_t mask_elems; /* of the call's mask: sum of len_q * len_k; 0 without one */
} tg_attn_docs;
/* The varlen entry points' checks (docs, p->B = 1, then tg_attn_prepare
 * with no mask, then the offsets) and *pr, the packed problem (B = 1, qL =
 * total_q, kL = total_k, contiguous [total, heads, D] gradients), with
 * *out the documents (tg_attn_docs_free; empty on failure). */
tg_status tg_attn_varlen_prepare(tg_ctx *ctx, const char *fn, tg_dtype dtype,
                                 const tg_attn_options *opt, const tg_attn_params *p,
                                 const tg_attn_varlen *docs, int causal,
                                 tg_attn_problem *pr, tg_attn_docs *out);
void tg_attn_docs_free(tg_attn_docs *docs);
/* Document doc of the packed problem as a problem of its own: B = 1, its
 * lengths, bottom-right aligned, L's head stride total_q, its dropout
 * counter, its mask's strides when the call has a mask. The caller offsets
 * the tensors' bases to the document's rows (the mask's to doc->mask0). */
tg_attn_problem tg_attn_doc_problem(const tg_attn_problem *packed, const tg_attn_doc *doc);
/* The offsets and the mask (inputs; pr gives the mask's element size)
 * against up to 6 outputs (tg_check_alias). */
tg_status tg_attn_varlen_check_alias(tg_ctx *ctx, const char *fn, const tg_attn_varlen *docs,
                                     const tg_attn_problem *pr, const tg_attn_docs *dl,
                                     const tg_buf *outputs, int n_outputs);

/* The keep flags of a tile: keep[i * ldk + k] = 1 if weight (b, h, q0 + i,
 * k0 + k) survives dropout d, else 0 (i < nq, k < nk). */
void tg_attn_dropout_tile(const tg_isa_ops *ops, const tg_attn_dropout *d,
                          const tg_attn_problem *pr, int64_t b, int64_t h, int64_t q0, int64_t nq,
                          int64_t k0, int64_t nk, uint8_t *keep, int64_t ldk);

/* x[i * ldx + k] = keep[i * ldk + k] ? x[i * ldx + k] * scale : 0 over a tile
 * of nq x nk (scale 1: the dropped weights zeroed, nothing rounded). */
void tg_attn_dropout_apply(const uint8_t *keep, int64_t ldk, float *x, int64_t ldx,
                           int64_t nq, int64_t nk, float scale);

/* Offset of row `row` of head `head` in batch `b` for a [batch, head, row]
 * stride triple. */
static inline int64_t tg_attn_offset(const int64_t s[3], int64_t b, int64_t head,
                                     int64_t row) {
  return b * s[0] + head * s[1] + row * s[2];
}

/* Element `off` of an input tensor of type t. */
static inline const void *tg_attn_at(tg_dtype t, const void *base, int64_t off) {
  return t == TG_DTYPE_F32 ? (const void *)((const float *)base + off)
                           : (const void *)((const tg_bf16 *)base + off);
}

/* Rows [r0, r0 + n) of a strided head of type t (bf16 widened, f32 copied)
 * -> f32 dst [n, D]; when trans is not NULL also transposed into trans
 * [D, ldt] (the packed K^T / V^T the score GEMMs take, ldt = the key-tile
 * rows). */
static inline void tg_attn_load_rows(const tg_isa_ops *ops, tg_dtype t,
                                     const void *head, int64_t row_stride, int64_t r0,
                                     int64_t n, int64_t D, float *dst, float *trans,
                                     int64_t ldt) {
  for (int64_t r = 0; r < n; r++) {
    const void *src = tg_attn_at(t, head, (r0 + r) * row_stride);
    if (t == TG_DTYPE_F32)
      memcpy(dst + r * D, src, sizeof(float) * (size_t)D);
    else
      ops->bf16_to_f32(src, dst + r * D, D);
  }
  if (trans) ops->transpose_f32(n, D, dst, D, trans, ldt, 0);
}

/* Whether S = Q.K^T and dP = dO.V^T run on the table's bf16 dot GEMM
 * (avx512bf16): bf16 inputs on both sides, read in place (Q, dO rows) or
 * packed in pairs per key tile (K, V), instead of widened to f32. */
static inline int tg_attn_bf16_dot(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  return pr->in == TG_DTYPE_BF16 && ops->mm_bf16_pairs != NULL;
}

/* The K that S = Q.K^T (d = D) or dP = dO.V^T (d = Dv) runs with on the
 * bf16 unit (tg_attn_bf16_dot; d without it): d rounded up to the table's
 * bf16_k_step where d > the step and no multiple of it (amx: D 72-152
 * between the multiples of 32).
 * The rows of Q, dO then go through zero-padded copies [rows, Kp] and
 * K^T, V^T's pairs gain zero rows up to Kp / 2, so every block of the
 * products runs its last k step in place: the same TDPBF16PS steps on the
 * same values as the staged step the table would run (zeros past d on
 * both sides), so the same bits. d > the step keeps Kp < 2d: the copies
 * fit the buffers of d f32 columns. */
extern atomic_int tg_attn_testing_k_step; /* tg_testing_attn_k_step; 0: the table's */
static inline int64_t tg_attn_k_padded(const tg_attn_problem *pr, const tg_isa_ops *ops,
                                       int64_t d) {
  if (!tg_attn_bf16_dot(pr, ops)) return d;
  const int forced = atomic_load_explicit(&tg_attn_testing_k_step, memory_order_relaxed);
  const int64_t s = forced > 0 ? forced : ops->bf16_k_step;
  return s > 0 && d > s && d % s ? (d + s - 1) / s * s : d;
}

/* rows [n, d] of bf16 at stride lds -> dst [n, kp] with zeros in columns
 * [d, kp) (tg_attn_k_padded's copies). */
static inline void tg_attn_copy_padded(const tg_bf16 *src, int64_t lds, int64_t n, int64_t d,
                                       int64_t kp, tg_bf16 *dst) {
  for (int64_t r = 0; r < n; r++) {
    memcpy(dst + r * kp, src + r * lds, sizeof(tg_bf16) * (size_t)d);
    memset(dst + r * kp + d, 0, sizeof(tg_bf16) * (size_t)(kp - d));
  }
}

/* How the products that take P or dS as an operand (O += P.V; dQ += dS.K,
 * dK += dS^T.Q, dV += P^T.dO) run, from the precision mode and the table:
 *   F32:         f32 P and dS, f32 GEMM (float32 inputs; EXACT, and SPLIT on
 *                tables without bf16 dot products: exact is within split);
 *   F32_ROUNDED: P and dS rounded to bf16 in place, then the f32 GEMM (BF16
 *                on tables without them: the same values as on the bf16
 *                units, products exact in f32 either way);
 *   BF16_DOT:    P and dS as bf16 rows on mm_bf16_pairs, the other operand
 *                packed in row pairs: one part (hi) in BF16 mode, two (hi,
 *                lo) in SPLIT, in EXACT where the table's exact_parts_min_d
 *                says it is faster (by D, per pass) three (hi, lo, lo2: all
 *                of x), or two for the forward's P (tg_attn_parts). */
typedef enum { TG_PRODUCTS_F32, TG_PRODUCTS_F32_ROUNDED, TG_PRODUCTS_BF16_DOT } tg_attn_products;
typedef enum { TG_ATTN_PASS_FWD, TG_ATTN_PASS_BWD } tg_attn_pass;

static inline tg_attn_products tg_attn_products_of(const tg_attn_problem *pr,
                                                   const tg_isa_ops *ops, tg_attn_pass pass) {
  if (pr->in != TG_DTYPE_BF16) return TG_PRODUCTS_F32;
  if (pr->precision == TG_ATTN_PRECISION_EXACT) {
    const int min_d = ops->exact_parts_min_d[pass];
    return tg_attn_bf16_dot(pr, ops) && min_d > 0 && pr->D >= min_d ? TG_PRODUCTS_BF16_DOT
                                                                    : TG_PRODUCTS_F32;
  }
  if (tg_attn_bf16_dot(pr, ops)) return TG_PRODUCTS_BF16_DOT;
  return pr->precision == TG_ATTN_PRECISION_BF16 ? TG_PRODUCTS_F32_ROUNDED : TG_PRODUCTS_F32;
}

/* TG_PRODUCTS_BF16_DOT: how many bf16 parts each P or dS operand of the
 * pass takes: one in bf16 mode, two in split mode; in exact mode three
 * (hi + lo + lo2 hold x exactly) in the backward, and split mode's two for
 * the forward's P: O is stored in bf16, whose rounding (2^-9) lies 2^7
 * above their 2^-16 per term, and a third part's pass would be a quarter
 * of the forward's tile products (docs/KERNELS.md, "Precision modes"). */
static inline int tg_attn_parts(const tg_attn_problem *pr, tg_attn_pass pass) {
  if (pr->precision == TG_ATTN_PRECISION_BF16) return 1;
  if (pr->precision == TG_ATTN_PRECISION_SPLIT || pass == TG_ATTN_PASS_FWD) return 2;
  return 3;
}
/* The bf16 part buffers per P or dS operand a work item's scratch holds. */
static inline int tg_attn_part_buffers(const tg_attn_problem *pr, tg_attn_products products,
                                       tg_attn_pass pass) {
  return products == TG_PRODUCTS_BF16_DOT ? tg_attn_parts(pr, pass) : 0;
}

/* The tiles of the forward and backward: the table's attn_bq x attn_bk, or
 * its bf16-mode tiles when every product runs on the bf16 unit, the q tile
 * only where no causal diagonal or window edge crosses it (isa/tuning.h says
 * why the amx table doubles them and what was measured). */
static inline int tg_attn_bf16_tiles(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  return pr->precision == TG_ATTN_PRECISION_BF16 &&
         tg_attn_products_of(pr, ops, TG_ATTN_PASS_BWD) == TG_PRODUCTS_BF16_DOT;
}
static inline int64_t tg_attn_bq(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  return tg_attn_bf16_tiles(pr, ops) && !pr->causal && !pr->window ? ops->attn_bq_bf16
                                                                     : ops->attn_bq;
}
static inline int64_t tg_attn_bk(const tg_attn_problem *pr, const tg_isa_ops *ops) {
  /* A window's two edges cross up to (BQ + BK) / W more rows than its band:
   * with windows the plain key tile measured 8-13% faster in the bf16-mode
   * backward on the 16-core Xeon (L 16384, W 512 and 1024, 2 threads; equal
   * at 16 threads; bench/results/xeon16-amx/window/README.md). */
  return tg_attn_bf16_tiles(pr, ops) && !pr->window ? ops->attn_bk_bf16 : ops->attn_bk;
}

/* TG_PRODUCTS_F32_ROUNDED: x [rows, cols] (stride ld) rounded to bf16 in place. */
static inline void tg_attn_round_bf16(float *x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) x[r * ld + c] = tg_bf16_to_f32(tg_f32_to_bf16(x[r * ld + c]));
}

/* C [M, N] (ldc) (+)= the sum of n terms' products: one mm_bf16_terms
 * call where the table has it (its order: an operand's parts k step by k
 * step), else n calls of mm_bf16_pairs in term order (the first with
 * `accumulate`). */
static inline void tg_attn_mm_terms(const tg_isa_ops *ops, int n, const tg_bf16_term *terms,
                                    int64_t M, int64_t N, int64_t lda, int64_t ldb, float *C,
                                    int64_t ldc, int accumulate) {
  if (ops->mm_bf16_terms && n > 1) {
    ops->mm_bf16_terms(n, terms, (int)M, (int)N, lda, ldb, C, ldc, accumulate);
    return;
  }
  for (int i = 0; i < n; i++)
    ops->mm_bf16_pairs((int)M, (int)N, terms[i].K, terms[i].A, lda, terms[i].Bp, ldb, C, ldc,
                       accumulate || i);
}

/* The bf16 parts buffers[i] (NULL past the part count) from element col on. */
static inline void tg_attn_parts_at(uint16_t *const buffers[3], int64_t col, uint16_t *out[3]) {
  for (int i = 0; i < 3; i++) out[i] = buffers[i] ? buffers[i] + col : NULL;
}

/* TG_PRODUCTS_BF16_DOT: C [M, N] (ldc) (+)= X . Bp, X given as its
 * tg_attn_parts bf16 parts (hi, lo, lo2: tg_attn_mm_terms' order), rows
 * of Kp (even) columns, stride ldx; Bp [Kp/2, N] pairs
 * (pack_bf16_row_pairs), stride ldb. */
static inline void tg_attn_mm_parts(const tg_attn_problem *pr, tg_attn_pass pass,
                                    const tg_isa_ops *ops, int64_t M, int64_t N, int64_t Kp,
                                    uint16_t *const parts[3], int64_t ldx, const uint32_t *Bp,
                                    int64_t ldb, float *C, int64_t ldc, int accumulate) {
  const int n = tg_attn_parts(pr, pass);
  tg_bf16_term terms[3];
  for (int i = 0; i < n; i++) terms[i] = (tg_bf16_term){parts[i], Bp, (int)Kp};
  tg_attn_mm_terms(ops, n, terms, M, N, ldx, ldb, C, ldc, accumulate);
}

/* A work item's mm_bf16_pairs calls in one bracket of the table's (the amx
 * table: one tile configuration per item, not per product). */
static inline void tg_attn_dot_begin(const tg_isa_ops *ops, int bf16_dot) {
  if (bf16_dot && ops->bf16_dot_begin) ops->bf16_dot_begin();
}
static inline void tg_attn_dot_end(const tg_isa_ops *ops, int bf16_dot) {
  if (bf16_dot && ops->bf16_dot_end) ops->bf16_dot_end();
}

/* Rows [r0, r0 + n) of a strided bf16 head -> Bp [D/2, ldb] in the pair
 * layout of mm_bf16_pairs: the transposed tile K^T / V^T of the products. */
static inline void tg_attn_pack_pairs(const tg_isa_ops *ops, const void *head,
                                      int64_t row_stride, int64_t r0, int64_t n, int64_t D,
                                      uint32_t *Bp, int64_t ldb) {
  ops->pack_bf16_pairs(n, D, (const tg_bf16 *)head + r0 * row_stride, row_stride, Bp, ldb);
}

/* --- the engine, shared by the attention entry points and kernel 10 -------
 * Both run on a validated problem; neither checks its arguments again.
 * Q, K, V, dO, O and the mask (as pr->Ms; NULL without) are of type pr->in.
 * With dropout (pr->drop) the weights that multiply V are P * keep / (1 - p). */

/* Forward (attention_fwd.c): L [B, H, qL] natural-log logsumexp of the
 * undropped scores (writes); O through pr->Os when O != NULL; when dO !=
 * NULL (through pr->Os) also delta [B, H, qL] = rowsum(dO * O) with O in
 * f32, the D_vec of the backward. */
tg_status tg_attn_forward(tg_ctx *ctx, const tg_attn_problem *pr, const void *Q,
                          const void *K, const void *V, const void *mask, void *O, float *L,
                          const void *dO, float *delta);

/* The backward's plan (attention_bwd.c): the ISA table's tiles and the KV
 * schedule's key ranges and chunk, from the problem, the table, the CPUs
 * planned for (tg_ctx_plan_cpus: the machine's in deterministic mode, never
 * the thread count then) and the L2 (tg_plan_l2_bytes). Built once per
 * call; the workspace size and the run read the same plan. */
typedef struct {
  int64_t BQ, BK;                /* tiles (tg_attn_bq, tg_attn_bk) */
  int cpus;                      /* planned for (KV schedule: ranges, query groups) */
  int bf16_dot;                  /* tg_attn_bf16_dot: K^T, V^T packed as bf16 pairs */
  int64_t Kq, Kv;                /* S's and dP's K (tg_attn_k_padded of D, Dv) */
  tg_attn_products products;     /* of dQ, dK, dV (precision mode) */
  int64_t n_qtiles, n_ktiles;
  int64_t n_ranges, range_tiles; /* KV schedule: key ranges per kv head */
  int64_t chunk_tiles;           /* KV schedule: key tiles resident at once */
  int64_t dq_elems;              /* B * H * qL * D: one dQ partial */
  int64_t n_qgroups;             /* KV schedule: query groups per (range, kv head) */
  int64_t dk_elems, dv_elems;    /* B * H_kv * kL * D, * Dv: one group's dK, dV part */
  int64_t dkv_units;             /* KV schedule: q units per dK, dV product (1 unless
                                  * TG_PRODUCTS_BF16_DOT: plan_dkv_units) */
  int dkv_transposed;            /* TG_PRODUCTS_BF16_DOT: dK^T, dV^T summed
                                  * (TG_ATTN_DKV_T_MAX_D) */
} tg_attn_bwd_plan;
tg_attn_bwd_plan tg_attn_bwd_plan_make(const tg_attn_problem *pr, const tg_isa_ops *ops,
                                       int cpus);

/* Backward, KV schedule (attention_bwd.c): dQ writes through pr->dQs, dK
 * and dV accumulate through pr->dKs; L, D_vec [B, H, qL]. `workspace` holds
 * tg_attn_bwd_workspace_bytes(plan) bytes (the dQ partials; may be NULL
 * when that is 0), plan = tg_attn_bwd_plan_make(pr, ctx->ops,
 * tg_ctx_plan_cpus(ctx)). Bitwise the same for every thread count in
 * deterministic mode (the plan then never follows it). */
size_t tg_attn_bwd_workspace_bytes(const tg_attn_bwd_plan *plan);
tg_status tg_attn_backward_kv(tg_ctx *ctx, const tg_attn_problem *pr,
                              const tg_attn_bwd_plan *plan, const void *Q, const void *K,
                              const void *V, const void *dO, const void *mask, const float *L,
                              const float *D_vec, float *dQ, float *dK, float *dV,
                              void *workspace);

/* The score S[i,k] from the raw product qk = Q[i].K[k] (f32), per contract:
 * s = scale * qk; with softcapping c: s = c * tanh(s / c) (*tanh_out gets the
 * tanh for the backward); causal keys k > i + qL_off, keys left of the
 * window (k <= i + qL_off - W) and mask entries of -inf give -inf;
 * otherwise the additive mask m (a row of type pr->in) is added. */
static inline float tg_attn_score(const tg_attn_problem *pr, float qk, int64_t i,
                                  int64_t k, const void *mask_row, float *tanh_out) {
  float s = pr->scale * qk;
  float t = 0.0f;
  if (pr->softcap != 0.0f) {
    t = tanhf(s / pr->softcap);
    s = pr->softcap * t;
  }
  *tanh_out = t;
  if (pr->causal && k > i + pr->qL_off) return -INFINITY;
  if (pr->window && k <= i + pr->qL_off - pr->window) return -INFINITY;
  if (mask_row) {
    const float m = pr->in == TG_DTYPE_F32 ? ((const float *)mask_row)[k]
                                           : tg_bf16_to_f32(((const tg_bf16 *)mask_row)[k]);
    if (m == -INFINITY) return -INFINITY;
    s += m;
  }
  return s;
}

/* How many of the keys [k0, k0 + nk) query row i may see under causality
 * (k <= i + qL_off): nk without it; 0 to nk. */
static inline int64_t tg_attn_visible(const tg_attn_problem *pr, int64_t i, int64_t k0,
                                      int64_t nk) {
  if (!pr->causal) return nk;
  const int64_t n = i + pr->qL_off + 1 - k0;
  return n < 0 ? 0 : (n > nk ? nk : n);
}

/* Keys [0, end) can be visible to query rows [q0, q0 + nq): kL, or fewer
 * under the causal limit k <= i + qL_off. May be 0. */
static inline int64_t tg_attn_key_end(const tg_attn_problem *pr, int64_t q0, int64_t nq) {
  if (!pr->causal) return pr->kL;
  const int64_t end = q0 + nq + pr->qL_off; /* last row's limit + 1 */
  return end < 0 ? 0 : (end > pr->kL ? pr->kL : end);
}

/* Keys [begin, kL) can be visible to query rows from q0 on under the
 * window's limit k > i + qL_off - W: 0 without a window; up to kL. */
static inline int64_t tg_attn_key_begin(const tg_attn_problem *pr, int64_t q0) {
  if (!pr->window) return 0;
  const int64_t begin = q0 + pr->qL_off - pr->window + 1; /* first row's first key */
  return begin < 0 ? 0 : (begin > pr->kL ? pr->kL : begin);
}

/* How many of the keys [k0, k0 + nk) lie left of query row i's window
 * (k <= i + qL_off - W): 0 without a window; 0 to nk. */
static inline int64_t tg_attn_hidden_left(const tg_attn_problem *pr, int64_t i, int64_t k0,
                                          int64_t nk) {
  if (!pr->window) return 0;
  const int64_t n = i + pr->qL_off - pr->window + 1 - k0;
  return n < 0 ? 0 : (n > nk ? nk : n);
}

/* The row blocks of a tile's products: the rows [r0, r0 + rows) of the
 * q-tile and the first `keys` keys of the key tile they take. */
typedef struct {
  int64_t r0, rows, keys;
} tg_attn_rows;

/* A tile that the causal diagonal crosses: the first rows of the q-tile at
 * q0 (nq rows) see fewer of the key tile's nk keys from k0 than its last
 * rows do. Where its first half sees none of the last
 * TG_ATTN_SPLIT_MIN_KEYS keys or more, the tile's products run as two row
 * blocks, the top one over the keys it sees alone (its P and dS past them
 * are 0: a key hidden by the causal rule is no dependency of its row,
 * docs/KERNELS.md "NaN and +-inf"); else as one block. The top block is
 * half the rows rounded down to a multiple of 8 (any count is correct; 8
 * keeps the GEMMs' row blocks whole on most tables: ops.h gemm_mr, the AMX
 * tiles' 16). One block without causality or with softcap (its score rows
 * read every key of the tile). Shape alone decides, never the threads.
 * Packed rows of short documents meet such a tile once per q-tile:
 * documents of 512 in 4096 spend a fifth of their tiles on the diagonal,
 * one document of 4096 a thirtieth. Returns the number of blocks in out. */
enum { TG_ATTN_SPLIT_MIN_KEYS = 16 };
static inline int tg_attn_row_blocks(const tg_attn_problem *pr, int64_t q0, int64_t nq,
                                     int64_t k0, int64_t nk, tg_attn_rows out[2]) {
  out[0] = (tg_attn_rows){0, nq, nk};
  const int64_t top = nq / 16 * 8;
  if (!pr->causal || pr->softcap != 0.0f || top == 0) return 1;
  int64_t end = tg_attn_key_end(pr, q0, top) - k0; /* keys the top rows see */
  if (end < 0) end = 0;
  if (nk - end < TG_ATTN_SPLIT_MIN_KEYS) return 1;
  out[0] = (tg_attn_rows){0, top, end};
  out[1] = (tg_attn_rows){top, nq - top, nk};
  return 2;
}

#endif /* TG_ATTENTION_H */
