/*
 * tilegrad — Metal-style training kernels on multicore CPUs (OpenMP).
 *
 * This header is the C side of the contract in docs/KERNELS.md (which follows
 * the project spec). Conventions that hold for every entry point:
 *
 *   - The first argument is a tg_ctx. Then the buffers in Metal buffer-index
 *     order, then the parameters.
 *   - Every entry point validates all of its arguments before it writes
 *     anything. On failure it returns a non-zero tg_status, leaves every output
 *     byte unchanged, and tg_ctx_last_error() says which argument was wrong.
 *   - "writes" outputs are overwritten; "accumulates" outputs get out += value
 *     (zero-fill first for a fresh result).
 *   - Aliasing: an output must not share a byte with an input or with another
 *     output (TG_ERR_ALIAS, nothing written), except where an entry point
 *     says "may be in place": that output may start at exactly the address of
 *     the named input (same buffer, same layout); a partial overlap is always
 *     refused. Inputs may overlap each other (they are only read: K == V is
 *     fine). Strided attention tensors are judged by their extent, from the
 *     lowest to the highest byte their strides address, so an output
 *     interleaved with another buffer is refused too.
 *   - tg_bf16 holds raw bfloat16 bits. float -> bf16 rounds to nearest even,
 *     any NaN becomes 0x7FC0, +-Inf stay +-Inf.
 *   - A tg_ctx is not thread-safe: use one per calling thread. The kernels
 *     themselves run on OpenMP threads (OMP_NUM_THREADS, or
 *     tg_ctx_set_threads).
 */
#ifndef TILEGRAD_H
#define TILEGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The one place the version is written: CMakeLists.txt reads these three
 * lines for project(VERSION), the shared library's VERSION, the CMake
 * package's tilegradConfigVersion.cmake and tilegrad.pc. */
#define TG_VERSION_MAJOR 0
#define TG_VERSION_MINOR 2
#define TG_VERSION_PATCH 1

#define TG_VERSION_STR_(x) #x
#define TG_VERSION_STR(x) TG_VERSION_STR_(x)
/* "MAJOR.MINOR.PATCH" of this header, e.g. "0.2.0" */
#define TG_VERSION                                                          \
  TG_VERSION_STR(TG_VERSION_MAJOR) "." TG_VERSION_STR(TG_VERSION_MINOR) "." \
  TG_VERSION_STR(TG_VERSION_PATCH)

typedef uint16_t tg_bf16;

typedef enum {
  TG_OK = 0,
  TG_ERR_NULL_ARG = 1,    /* a required pointer is NULL */
  TG_ERR_BAD_SHAPE = 2,   /* a size is 0 or sizes disagree */
  TG_ERR_UNSUPPORTED = 3, /* valid, but not implemented (e.g. head dim) */
  TG_ERR_BAD_INDEX = 4,   /* an id / target is out of range */
  TG_ERR_BAD_PARAMS = 5,  /* params struct fields are inconsistent */
  TG_ERR_OVERFLOW = 6,    /* an element count / byte size overflows int64 */
  TG_ERR_NO_MEMORY = 7,   /* scratch allocation failed */
  TG_ERR_BUSY = 8,        /* the context is inside a call on another thread */
  TG_ERR_ALIAS = 9        /* an output shares memory with an input or another
                           * output that it may not (see each entry point) */
} tg_status;

typedef struct tg_ctx tg_ctx;

/* One-line English description of a status code (never NULL). */
const char *tg_status_str(tg_status s);

/* "MAJOR.MINOR.PATCH" of the library that is loaded (TG_VERSION of the
 * header it was built from): compare with TG_VERSION to catch a header /
 * library mismatch. */
const char *tg_version(void);

/* --- context ------------------------------------------------------------ */
/* A context keeps the buffers its kernels needed for later calls, so only
 * the first call of a size allocates: per-thread scratch, and the attention
 * backward's dQ partials on few-head shapes (up to 15 copies of dQ, at most
 * 1 GiB). tg_ctx_destroy frees them. */
tg_status tg_ctx_create(tg_ctx **out);
void tg_ctx_destroy(tg_ctx *ctx); /* NULL is a no-op */
/* n > 0: use n OpenMP threads; 0: OpenMP's default (OMP_NUM_THREADS if set,
 * else the CPUs of the affinity mask capped by the cgroup CPU quota);
 * n < 0: TG_ERR_BAD_PARAMS. */
tg_status tg_ctx_set_threads(tg_ctx *ctx, int n);
/* on != 0: every kernel's output is bitwise identical across runs and across
 * thread counts (atomically accumulated outputs use a fixed-order schedule). */
tg_status tg_ctx_set_deterministic(tg_ctx *ctx, int on);
/* Detailed message of the last failure on this context ("" if none). */
const char *tg_ctx_last_error(const tg_ctx *ctx);

/* Which vector microkernels (and blocking) a context uses. TG_ISA_AUTO picks
 * the best the CPU and this build support: amx where the CPU has AMX-BF16
 * tiles and the OS lets this process use them, else avx512bf16 where
 * vdpbf16ps outruns the f32 FMA (AMD Zen 4 and later; not on Intel, where
 * it runs at half the FMA rate), else avx512, else avx2 (AVX2 + FMA,
 * x86-64-v3), else portable. avx512bf16 is avx512 with the bf16 x bf16
 * attention products (Q.K^T, dO.V^T) on vdpbf16ps: exact products, f32
 * sums. amx is avx512bf16 with those two products on AMX-BF16 tiles
 * (TDPBF16PS; exact products, f32 sums in the tile unit's order); on Linux
 * the first check asks the kernel for the tile-data permission
 * (arch_prctl ARCH_REQ_XCOMP_PERM, once per process), and amx is
 * unavailable where it is refused (kernels before 5.16, seccomp). The
 * environment variable TG_ISA=<name> (one of the names tg_isa_name gives)
 * overrides it at tg_ctx_create.
 * On aarch64 auto picks neonbf16 where the CPU has FEAT_BF16 (Linux:
 * HWCAP2_BF16; macOS: hw.optional.arm.FEAT_BF16), else neon. neon is
 * Advanced SIMD with its own blocking (32 128-bit registers); neonbf16 is
 * neon with the two bf16 x bf16 attention products on BFMMLA (exact
 * products, f32 sums). Each architecture has only its own tables: the
 * others are unavailable there and tg_isa_name calls them "unknown".
 * TG_ISA_PORTABLE is plain C for the target's baseline and always available.
 * (The values are ABI: new ISAs get new numbers.) */
typedef enum {
  TG_ISA_AUTO = 0,
  TG_ISA_PORTABLE = 1,
  TG_ISA_AVX512 = 2,
  TG_ISA_AVX2 = 3,
  TG_ISA_AVX512_BF16 = 4,
  TG_ISA_AMX = 5,
  TG_ISA_NEON = 6,     /* aarch64 */
  TG_ISA_NEON_BF16 = 7 /* aarch64 with FEAT_BF16 */
} tg_isa;
/* TG_ERR_UNSUPPORTED if the CPU (or this build) lacks the ISA, or isa is no
 * tg_isa value (tg_ctx_last_error says which, and for amx why); the context
 * is unchanged on failure. */
tg_status tg_ctx_set_isa(tg_ctx *ctx, tg_isa isa);
tg_isa tg_ctx_get_isa(const tg_ctx *ctx);
/* "auto", "portable", "avx2", "avx512", "avx512bf16", "amx" (x86-64),
 * "neon", "neonbf16" (aarch64); "unknown" for other values and for another
 * architecture's tables. */
const char *tg_isa_name(tg_isa isa);
/* The tg_isa named `name` (as tg_isa_name spells it) in *out: TG_OK, or
 * TG_ERR_BAD_PARAMS (and *out untouched) for NULL or an unknown name. */
tg_status tg_isa_from_name(const char *name, tg_isa *out);
/* 1 if this CPU and this build can run `isa` (TG_ISA_AUTO: always), else 0. */
int tg_isa_available(tg_isa isa);
/* The ISA tables of this architecture, from least to most preferred (the
 * order TG_ISA_AUTO chooses in), for listing them by name: tg_isa_at(i) for
 * 0 <= i < tg_isa_count(), TG_ISA_AUTO for any other i. The list includes
 * the tables this CPU or build cannot run (tg_isa_available says which) and
 * not TG_ISA_AUTO itself. */
int tg_isa_count(void);
tg_isa tg_isa_at(int i);

/* How tg_flash_attn_train_bwd_bf16 shares out dK/dV work.
 * TG_ATTN_SCHEDULE_KV (default): one work item per (key range, kv head,
 * batch) owns its dK/dV rows (no atomics); dQ partials of the key ranges are
 * summed in a fixed order. The number of key ranges depends on the shape
 * and tg_plan_cpus() only, so results are bitwise identical for any thread
 * count.
 * TG_ATTN_SCHEDULE_ATOMIC: the Metal kernel's own grid, one work item per
 * (q-tile, query head, batch) adding dK/dV with `omp atomic` (kept for parity
 * studies with the GPU; slower on x86, where an f32 atomic add is a
 * compare-exchange loop). Deterministic mode always uses TG_ATTN_SCHEDULE_KV. */
typedef enum { TG_ATTN_SCHEDULE_KV = 0, TG_ATTN_SCHEDULE_ATOMIC = 1 } tg_attn_schedule;
/* The CPUs the work plans are sized for: OpenMP's omp_get_num_procs (the
 * affinity mask the process started with, whether or not OMP_PROC_BIND has
 * bound the calling thread to one place), capped by the cgroup CPU quota;
 * read once per process, >= 1. The KV schedule aims for 4 work items per
 * CPU of tg_ctx_plan_cpus, so in deterministic mode its bits depend on this
 * count (as on the ISA table), never on the thread count of a call. */
int tg_plan_cpus(void);
/* The CPUs the KV schedule of a call on ctx plans for: tg_plan_cpus() in
 * deterministic mode (the same plan, so the same bits, for every thread
 * count), otherwise that capped by the context's thread count (fewer work
 * items split the sums less: the bits then depend on min(CPUs, threads)).
 * ctx NULL: tg_plan_cpus(). */
int tg_ctx_plan_cpus(const tg_ctx *ctx);
/* TG_ERR_BAD_PARAMS for a value outside the enum. */
tg_status tg_ctx_set_attn_schedule(tg_ctx *ctx, tg_attn_schedule s);
tg_attn_schedule tg_ctx_get_attn_schedule(const tg_ctx *ctx);

/* How the attention's products that take the probabilities P or the score
 * gradient dS as an operand run on bf16 inputs: O += P.V in the forward,
 * dQ += dS.K, dK += dS^T.Q and dV += P^T.dO in the backward (Q.K^T and
 * dO.V^T have bf16 operands on both sides and are exact in every mode). It
 * applies to the bf16 attention entry points (tg_flash_attn_train_*_bf16
 * and TG_DTYPE_BF16); float32 inputs always compute in f32.
 *
 * TG_ATTN_PRECISION_EXACT (default): P and dS in f32, products in f32.
 * TG_ATTN_PRECISION_SPLIT: P and dS each as a pair of bf16, hi = bf16(x)
 *   and lo = bf16(x - hi), so the products run on the bf16 dot units
 *   (AVX512_BF16, AMX) with exact products and f32 sums; each term then
 *   carries a relative error of at most 2^-16 (f32 itself: 2^-24).
 * TG_ATTN_PRECISION_BF16: P and dS rounded to bf16 (relative error 2^-8
 *   per term), as FlashAttention-2 and PyTorch's CPU kernels do.
 *
 * The speed of split and bf16 comes from tables with bf16 dot products
 * (avx512bf16, amx); on the others bf16 rounds P and dS the same way and
 * multiplies in f32, and split computes exactly as EXACT (whose error is
 * within split's). docs/KERNELS.md, "Precision modes", has the measured
 * errors. Every mode is deterministic as the others (same bits for any
 * thread count in deterministic mode). */
typedef enum {
  TG_ATTN_PRECISION_EXACT = 0,
  TG_ATTN_PRECISION_SPLIT = 1,
  TG_ATTN_PRECISION_BF16 = 2
} tg_attn_precision;
/* TG_ERR_BAD_PARAMS for a value outside the enum. */
tg_status tg_ctx_set_attn_precision(tg_ctx *ctx, tg_attn_precision p);
tg_attn_precision tg_ctx_get_attn_precision(const tg_ctx *ctx);
/* "exact", "split", "bf16"; "unknown" outside the enum. */
const char *tg_attn_precision_name(tg_attn_precision p);

/* --- attention parameter ABI (byte-identical to Metal's AttnParams) ------ */
typedef struct {
  int32_t B, H, D, qL, kL, gqa_factor; /* H = query heads; H_kv = H / gqa_factor */
  float scale, softcapping;            /* softcapping 1.0 = off */
  int32_t NQ, NK, NQ_aligned, NK_aligned, qL_rem, kL_rem, qL_off, _pad;
  /* batch, head, row strides in elements; the innermost stride is 1 */
  int64_t Q_strides[3], K_strides[3], V_strides[3], O_strides[3];
} tg_attn_params;

typedef struct {
  int64_t M_strides[3]; /* batch, head, row; 0 = broadcast */
} tg_attn_mask_params;

/* Fills *p for contiguous [B, heads, L, D] tensors: Metal tiling fields
 * (BQ=32, BK=16), qL_off = kL - qL, softcapping = 1.0. */
tg_status tg_attn_params_init(tg_attn_params *p, int B, int H, int H_kv, int qL,
                              int kL, int D, float scale);

/* --- 1. FA-2 backward pre-pass ------------------------------------------
 * D_out[b,h,i] = sum_d O[b,h,i,d] * dO[b,h,i,d]; O, dO contiguous
 * [B,H,qL,D] bf16; D_out [B,H,qL] f32 (writes).
 * Aliasing: O and dO may overlap; D_out may overlap neither. */
tg_status tg_flash_attn_train_bwd_compute_d_bf16(tg_ctx *ctx, const tg_bf16 *O,
                                                 const tg_bf16 *dO, float *D_out,
                                                 uint32_t batch, uint32_t n_q_heads,
                                                 uint32_t q_seq_len, uint32_t head_dim);

/* --- 2. FA-2 backward main kernel ----------------------------------------
 * Q [B,H,qL,D] bf16 (Q_strides), K/V [B,H_kv,kL,D] bf16 (K_/V_strides),
 * L [B,H,qL] f32 natural-log logsumexp, dO bf16 (O_strides), D_vec [B,H,qL],
 * dQ [B,H,qL,D] f32 contiguous (writes), dK/dV [B,H_kv,kL,D] f32 contiguous
 * (accumulate). mask: additive bf16, element [b,h,q,k] at
 * b*M0 + h*M1 + q*M2 + k; mp and mask both NULL when there is none.
 * causal: key k is visible to query i iff k <= i + qL_off.
 * softcapping c != 1: scores are c*tanh(s/c) (s = scale*Q.K) before the mask.
 * Aliasing: the inputs Q, K, V, L, dO, D_vec, mask may overlap each other
 * (K == V is fine); dQ, dK, dV may overlap no input and no other output,
 * not even exactly. Strided tensors count by their extent. */
tg_status tg_flash_attn_train_bwd_bf16(tg_ctx *ctx, const tg_bf16 *Q, const tg_bf16 *K,
                                       const tg_bf16 *V, const float *L,
                                       const tg_bf16 *dO, const float *D_vec, float *dQ,
                                       float *dK, float *dV, const tg_attn_params *p,
                                       const tg_attn_mask_params *mp,
                                       const tg_bf16 *mask, int causal);

/* --- 3. f32 -> bf16 cast (round to nearest even) --------------------------
 * src [n] f32, dst [n] bf16 (writes). May be in place: dst == (tg_bf16 *)src
 * converts the buffer's first 2n bytes to the bf16 values, the same bits at
 * any thread count; any other overlap is refused. */
tg_status tg_f32_to_bf16_cast(tg_ctx *ctx, const float *src, tg_bf16 *dst, uint64_t n);

/* --- training forward (produces what kernels 1-2 consume) -----------------
 * O = softmax(S) . V with S exactly as in tg_flash_attn_train_bwd_bf16
 * (same params, mask and causal rule); O bf16 through O_strides (writes;
 * rows must not overlap), L [B,H,qL] f32 natural-log logsumexp (writes;
 * -inf for a row that sees no key, whose O row is 0). A NaN in Q, K or the
 * mask makes O and L of every row whose scores it enters NaN (so does a +inf
 * score: softmax of +inf); a NaN in V, the O elements it enters.
 * Aliasing: Q, K, V, mask may overlap each other; O and L may overlap no
 * input and not each other (O by its extent through O_strides: interleaved
 * with Q, K or V is refused). */
tg_status tg_flash_attn_train_fwd_bf16(tg_ctx *ctx, const tg_bf16 *Q, const tg_bf16 *K,
                                       const tg_bf16 *V, tg_bf16 *O, float *L,
                                       const tg_attn_params *p,
                                       const tg_attn_mask_params *mp,
                                       const tg_bf16 *mask, int causal);

/* --- attention in float32, and dropout (a CPU extension: the Metal kernels
 * have neither; docs/KERNELS.md, "CPU extension") ---------------------------
 * The three entry points below are the FA-2 training forward, the backward
 * pre-pass and the backward above with an element type and options. The
 * bf16 entry points are these with TG_DTYPE_BF16 and opt = NULL (same bits).
 *
 * dtype is the element type of Q, K, V, dO, O and the mask (tg_bf16 for
 * TG_DTYPE_BF16, float for TG_DTYPE_F32); L, D_vec, D_out, dQ, dK, dV are
 * float in both. TG_DTYPE_F32 uses the inputs as given: no bf16 rounding
 * anywhere, the mask added in f32, O stored in f32. Shapes, strides, masks,
 * causality, softcapping and validation are those of the bf16 entry points;
 * in addition a dtype outside the enum, a bit of opt->flags that is not a
 * TG_ATTN_OPT_* flag, a dropout_p that is NaN, < 0 or >= 1 and d_sinks
 * without sinks are TG_ERR_BAD_PARAMS, a v_head_dim that is not a multiple
 * of 8 up to 512 TG_ERR_UNSUPPORTED (nothing written). sinks is an input
 * and d_sinks an output of the aliasing rules below. A NaN sink makes its
 * head's O and L NaN, and a +inf one too (softmax of +inf); -inf is no sink. */
typedef enum { TG_DTYPE_BF16 = 0, TG_DTYPE_F32 = 1 } tg_dtype; /* ABI values */

/* Dropout of the attention weights, FlashAttention-2 style: the backward
 * recomputes the forward's mask from a counter-based generator, so nothing
 * is stored between them. Weight (b, h, i, k) is number
 * n = ((b*H + h)*qL + i)*kL + k; its draw u is word n % 4 of
 * Philox4x32-10(key = dropout_seed, counter = dropout_offset + n/4) (128-bit
 * counter; the words of both little-endian); it is kept iff
 * u >= round(dropout_p * 2^32), and kept weights are scaled by
 * 1/(1 - dropout_p). Give every call that needs a fresh mask a new seed, or
 * advance dropout_offset by at least ceil(B*H*qL*kL / 4). */
typedef struct {
  float dropout_p;         /* probability a weight is dropped, [0, 1); 0 = no dropout */
  uint32_t flags;          /* TG_ATTN_OPT_* bits, 0 = none; other bits are refused
                            * (the field was `reserved`, required 0: same ABI) */
  uint64_t dropout_seed;   /* Philox-4x32-10 key */
  uint64_t dropout_offset; /* counter base */
  /* --- attention variants (since 0.2; the struct grew from 24 to 48 bytes,
   * hence the soname libtilegrad.so.0.2). All zero / NULL = none. */
  uint32_t window;         /* sliding window W >= 1: key k is visible to query i
                            * iff k > i + qL_off - W (with causal also k <= i +
                            * qL_off: the W keys up to and including the
                            * diagonal, transformers' `sliding_window`); tiles
                            * wholly outside are skipped. 0 = no window */
  uint32_t v_head_dim;     /* Dv, the columns of V, O, dO and dV (a multiple of 8
                            * up to 512; their strides count Dv-element rows);
                            * Q and K keep params->D. 0 = params->D */
  const float *sinks;      /* [H] f32 sink logit s_h per query head (gpt-oss):
                            * e^{s_h} joins every row's softmax denominator,
                            * O_i = sum_k e^{S_ik} V_k / (sum_k e^{S_ik} + e^{s_h}),
                            * and L includes it. NULL = none */
  float *d_sinks;          /* backward only, with sinks: [H] f32, accumulates
                            * d_sinks[h] += -sum_{b,i} e^{s_h - L[b,h,i]} D_vec[b,h,i];
                            * NULL = not wanted. The forward ignores it */
} tg_attn_options;         /* NULL = all defaults; 48 bytes */

/* tg_attn_options.flags. TG_ATTN_OPT_O_F32: tg_attn_train_fwd stores O as
 * float (f32, through O_strides in elements) whatever dtype is: with bf16
 * inputs, the f32 result that the bf16 O would be rounded from (RNE), for
 * callers that combine partial results (context-parallel attention merges
 * (O, L) pairs in f32). TG_ATTN_OPT_DKV_WRITE: tg_attn_train_bwd writes dK
 * and dV (every element, their earlier contents never read) instead of
 * accumulating into them: the gradients of one call, with no zero-filled
 * buffers to pass (the values of accumulating into zeros, where a zero sum
 * may come out -0; d_sinks still accumulates). Each call ignores the other's flag, so one options struct
 * serves the forward, the backward and tg_attn_dropout_keep. */
enum { TG_ATTN_OPT_O_F32 = 1u, TG_ATTN_OPT_DKV_WRITE = 2u };

/* Training forward: O = (P o keep / (1 - p)) . V with P = softmax(S) and S
 * exactly as in tg_flash_attn_train_bwd_bf16 (plus opt->window); O
 * [B,H,qL,Dv] of type dtype through O_strides (writes; rows must not
 * overlap); L [B,H,qL] f32 natural-log logsumexp of the undropped scores and
 * the sink, log(sum_k e^{S_ik} + e^{s_h}) (writes; a row that sees no key
 * has O row 0 and L = -inf, or L = s_h with a sink). NaN as
 * tg_flash_attn_train_fwd_bf16. */
tg_status tg_attn_train_fwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                            const void *V, void *O, float *L, const tg_attn_params *p,
                            const tg_attn_mask_params *mp, const void *mask, int causal,
                            const tg_attn_options *opt);

/* Backward: as tg_flash_attn_train_bwd_bf16 (dQ [B,H,qL,D] f32 contiguous
 * writes; dK [B,H_kv,kL,D], dV [B,H_kv,kL,Dv] f32 contiguous accumulate,
 * or with TG_ATTN_OPT_DKV_WRITE write)
 * with Q, K, V, dO, mask of type dtype; opt->window as the forward's, and
 * with opt->sinks and opt->d_sinks the sinks' gradient accumulated (L then
 * holds the sink: the key gradients need nothing else from it). L from the forward; D_vec = rowsum(dO o O) of the
 * forward's (dropped) O, as tg_attn_train_bwd_compute_d gives it. With
 * dropout (same options as the forward): dV += (P o keep/(1-p))^T dO,
 * dS = P o (dP o keep/(1-p) - D_vec) with dP = dO V^T. */
tg_status tg_attn_train_bwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                            const void *V, const float *L, const void *dO,
                            const float *D_vec, float *dQ, float *dK, float *dV,
                            const tg_attn_params *p, const tg_attn_mask_params *mp,
                            const void *mask, int causal, const tg_attn_options *opt);

/* The whole backward step in one call (since 0.2.1), as PyTorch's
 * attention backward takes it (O and L from the forward, gradients in the inputs' dtype):
 * D_vec = rowsum(dO o O) in a workspace of the context's, then the
 * backward above with dK, dV written (TG_ATTN_OPT_DKV_WRITE is implied),
 * and dQ [B,H,qL,D], dK [B,H_kv,kL,D], dV [B,H_kv,kL,Dv] contiguous of
 * grad_dtype (writes): TG_DTYPE_F32 the f32 gradients, TG_DTYPE_BF16
 * their round to nearest even. The same bits as tg_attn_train_bwd_compute_d,
 * tg_attn_train_bwd (with TG_ATTN_OPT_DKV_WRITE) and, for bf16 gradients,
 * tg_f32_to_bf16_cast of each, with no f32 gradient buffers in between:
 * bf16 gradients are rounded as the backward's last sums are written.
 * O has dO's layout (the params' O_strides, [B,H,qL,Dv], type dtype) and
 * is an input; opt->d_sinks accumulates as in tg_attn_train_bwd. Checks as
 * tg_attn_train_bwd, and a grad_dtype outside tg_dtype and, with bf16
 * inputs, TG_ATTN_OPT_O_F32 in opt->flags (an f32 O from the forward) are
 * TG_ERR_BAD_PARAMS (nothing written). bf16 gradients run the KV schedule
 * whatever tg_ctx_set_attn_schedule asked (the ATOMIC one adds to f32). */
tg_status tg_attn_train_bwd_step(tg_ctx *ctx, tg_dtype dtype, tg_dtype grad_dtype,
                                 const void *Q, const void *K, const void *V, const void *O,
                                 const float *L, const void *dO, void *dQ, void *dK,
                                 void *dV, const tg_attn_params *p,
                                 const tg_attn_mask_params *mp, const void *mask, int causal,
                                 const tg_attn_options *opt);

/* Backward pre-pass: D_out[b,h,i] = sum_d O[b,h,i,d] * dO[b,h,i,d] with O, dO
 * contiguous [B,H,qL,D] of type dtype; D_out [B,H,qL] f32 (writes). With a
 * value head dim Dv, pass head_dim = Dv (O and dO have Dv columns). */
tg_status tg_attn_train_bwd_compute_d(tg_ctx *ctx, tg_dtype dtype, const void *O,
                                      const void *dO, float *D_out, uint32_t batch,
                                      uint32_t n_q_heads, uint32_t q_seq_len,
                                      uint32_t head_dim);

/* The dropout mask exactly as the kernels draw it, for tests and oracles:
 * keep[b,h,i,k] = 1 (kept) or 0 (dropped), uint8, contiguous [B,H,qL,kL]
 * (writes). opt NULL or dropout_p 0: all 1. Sizes 0: TG_ERR_BAD_SHAPE. */
tg_status tg_attn_dropout_keep(tg_ctx *ctx, const tg_attn_options *opt, uint32_t B,
                               uint32_t H, uint32_t qL, uint32_t kL, uint8_t *keep);

/* --- packed sequences: varlen attention (since 0.2.1; a CPU extension) ----
 * Documents packed one after another in one row, each attending only to
 * itself, as flash_attn_varlen_func takes them: Q [total_q, H, D], K
 * [total_k, H_kv, D], V [total_k, H_kv, Dv] through the params' strides
 * (p->B = 1, p->qL = total_q, p->kL = total_k: tg_attn_params_init(p, 1, H,
 * H_kv, total_q, total_k, D, scale), then the strides of the packed layout,
 * {0, D, H * D} for contiguous Q). Document d holds query rows
 * [cu_seqlens_q[d], cu_seqlens_q[d + 1]) and key rows [cu_seqlens_k[d],
 * cu_seqlens_k[d + 1]); its queries see its keys only, and with causal key
 * k of the document is visible to its query i iff k <= i + len_k - len_q
 * (bottom-right aligned per document; p->qL_off is not read). opt->window
 * applies within each document the same way. A tile outside every document
 * is never visited: the work is the documents' own, each document's tiles
 * as one problem's, all of them in one parallel loop, the costliest first.
 *
 * The rows' statistics L and D_vec are [H, total_q] f32 (flash-attn's
 * softmax_lse layout); the gradients dQ [total_q, H, D], dK [total_k, H_kv,
 * D], dV [total_k, H_kv, Dv] are contiguous. A document with no keys has O
 * rows 0, L = -inf (the sink with one), dQ rows 0; one with no queries
 * gives its dK, dV rows nothing (0 where written). Dropout: document d
 * numbers its weights as a problem of B = 1, qL = len_q, kL = len_k would,
 * from the counter dropout_offset + sum over the documents before it of
 * ceil(H * len_q * len_k / 4): no two documents share a draw. The
 * backward runs the KV schedule whatever tg_ctx_set_attn_schedule asked;
 * deterministic mode gives the same bits for any thread count.
 *
 * Checks, besides the dense entry points': docs or its
 * arrays NULL (TG_ERR_NULL_ARG); n_docs < 1, p->B != 1, offsets that do not
 * start at 0, that decrease, or whose last is not total_q (total_k)
 * (TG_ERR_BAD_SHAPE); outputs overlapping the offsets (TG_ERR_ALIAS).
 * Nothing is written on failure. */
typedef struct {
  const int32_t *cu_seqlens_q; /* [n_docs + 1]: 0, ..., total_q; non-decreasing */
  const int32_t *cu_seqlens_k; /* [n_docs + 1]: 0, ..., total_k; non-decreasing */
  int32_t n_docs;              /* >= 1 (a document may be empty) */
  int32_t _pad;                /* 0 */
  /* Optional additive mask of each document, of the inputs' dtype: document
   * d's [len_q, len_k] rows (row-major, shared by the heads) at element
   * sum_{j<d} len_q_j * len_k_j, added to the scores as the dense kernels'
   * mask is (-inf: not visible). NULL = none: what packed rows need; the
   * block-sparse front (a BlockMask's blocks gathered per query block) puts
   * its partial blocks' mask here. */
  const void *mask;
} tg_attn_varlen;

/* Forward: O [total_q, H, Dv] through O_strides (writes), L [H, total_q]
 * (writes); as tg_attn_train_fwd within each document. */
tg_status tg_attn_varlen_fwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                             const void *V, void *O, float *L, const tg_attn_params *p,
                             const tg_attn_varlen *docs, int causal,
                             const tg_attn_options *opt);

/* Backward: D_vec [H, total_q] given (rowsum(dO o O)); dQ written, dK, dV
 * accumulated (written with TG_ATTN_OPT_DKV_WRITE), f32; as
 * tg_attn_train_bwd within each document. */
tg_status tg_attn_varlen_bwd(tg_ctx *ctx, tg_dtype dtype, const void *Q, const void *K,
                             const void *V, const float *L, const void *dO,
                             const float *D_vec, float *dQ, float *dK, float *dV,
                             const tg_attn_params *p, const tg_attn_varlen *docs,
                             int causal, const tg_attn_options *opt);

/* The whole backward step, as tg_attn_train_bwd_step: O given, D_vec in a
 * workspace, dQ, dK, dV written as grad_dtype. */
tg_status tg_attn_varlen_bwd_step(tg_ctx *ctx, tg_dtype dtype, tg_dtype grad_dtype,
                                  const void *Q, const void *K, const void *V, const void *O,
                                  const float *L, const void *dO, void *dQ, void *dK,
                                  void *dV, const tg_attn_params *p,
                                  const tg_attn_varlen *docs, int causal,
                                  const tg_attn_options *opt);

/* RMSNorm forward: y[b,k] = x[b,k] * r[b] * w[k] with r as in kernel 4
 * (writes); r_out may be NULL, else it gets r [rows] for the backward.
 * May be in place: y == x. Otherwise y and r_out overlap no input (x, w)
 * and not each other. */
tg_status tg_rms_norm_forward_f32(tg_ctx *ctx, const float *x, const float *w, float *y,
                                  float *r_out, uint32_t rows, uint32_t dim, float eps);

/* --- 4. RMSNorm backward, three-kernel split (f32, rows x dim row-major) --
 * r[b] = 1/sqrt(mean_j x[b,j]^2 + eps) (writes)
 * Aliasing (all three): the inputs may overlap each other; the output may
 * overlap no input, not even exactly (dx == dy is refused). */
tg_status tg_rms_norm_compute_rms_inv_f32(tg_ctx *ctx, const float *x, float *r_out,
                                          uint32_t rows, uint32_t dim, float eps);
/* s[b] = sum_i dy*x*w; dx[b,k] = r[b]*(dy[b,k]*w[k] - x[b,k]*s[b]*r[b]^2/dim) (writes) */
tg_status tg_rms_norm_backward_dx_f32(tg_ctx *ctx, const float *x, const float *w,
                                      const float *dy, const float *r, float *dx,
                                      uint32_t rows, uint32_t dim);
/* dw[i] = sum_b dy[b,i]*x[b,i]*r[b] (writes) */
tg_status tg_rms_norm_backward_dw_f32(tg_ctx *ctx, const float *x, const float *dy,
                                      const float *r, float *dw, uint32_t rows,
                                      uint32_t dim);

/* --- 5. fused RMSNorm backward: grad_input writes, grad_weight accumulates
 * Aliasing: input, weight, grad_out may overlap each other; grad_input and
 * grad_weight may overlap no input and not each other, not even exactly. */
tg_status tg_rms_norm_backward(tg_ctx *ctx, const float *input, const float *weight,
                               const float *grad_out, float *grad_input,
                               float *grad_weight, uint32_t n_groups, uint32_t dim,
                               float eps);

/* --- 6. softmax backward: grad_in = sm*(grad_out - sum_j sm*grad_out) ----
 * May be in place: grad_in == grad_out. Otherwise grad_in overlaps neither
 * input (grad_in == sm is refused); sm and grad_out may overlap. */
tg_status tg_softmax_backward(tg_ctx *ctx, const float *sm, const float *grad_out,
                              float *grad_in, uint32_t n_rows, uint32_t row_len);

/* --- 7. embedding backward: grad_weight[ids[t],:] += grad_out[t,:] --------
 * Aliasing: grad_weight may overlap neither grad_out nor ids. */
tg_status tg_embedding_backward(tg_ctx *ctx, const float *grad_out, const uint32_t *ids,
                                float *grad_weight, uint32_t vocab_size,
                                uint32_t seq_len, uint32_t dim);

/* --- 8. cross-entropy forward + backward ----------------------------------
 * non-pad t: loss_out[0] += -log softmax(logits[t])[target]/count (accumulates),
 * grad row = (softmax - onehot)/count (writes); pad rows: grad row = 0.
 * May be in place: grad == logits. Otherwise grad and loss_out overlap no
 * input (logits, targets) and not each other (count == 0 returns TG_OK
 * before this check: nothing is read or written). */
tg_status tg_cross_entropy_fwd_bwd(tg_ctx *ctx, const float *logits,
                                   const uint32_t *targets, float *grad, float *loss_out,
                                   uint32_t n_pos, uint32_t vocab, uint32_t pad_id,
                                   uint32_t count);

/* Cross-entropy as PyTorch's loss takes it (since 0.2.1): F.cross_entropy
 * with ignore_index and label_smoothing, a divisor of the caller's (HF's
 * num_items_in_batch), rows with a stride, f32 or bf16 logits. The options;
 * opt = NULL means TG_CE_OPTIONS_INIT. */
typedef struct {
  int64_t ignore_index;  /* targets equal to it are ignored: grad row 0, no
                          * loss (torch's -100 by default) */
  float label_smoothing; /* eps in [0, 1], as torch: the target distribution
                          * (1 - eps) onehot + eps / vocab; 0 = none */
  float grad_scale;      /* the grad is multiplied by it (finite); 1 = none */
  uint32_t flags;        /* none defined yet: must be 0 */
  uint32_t reserved;     /* ignored; keep 0 */
} tg_ce_options;         /* 24 bytes */
#define TG_CE_OPTIONS_INIT {-100, 0.0f, 1.0f, 0u, 0u}

/* logits [n_pos, vocab] of dtype (TG_DTYPE_F32: float, TG_DTYPE_BF16:
 * tg_bf16), row t at logits + t * row_stride elements (row_stride >= vocab;
 * 0 = vocab), targets [n_pos] int64, grad with logits' dtype and layout
 * (writes; in bf16 the f32 value rounded once, RNE). For row t, y =
 * targets[t], eps = label_smoothing, b = grad_scale / count:
 *   y == ignore_index: grad row = 0, no loss (its logits are not read);
 *   otherwise (0 <= y < vocab), p = softmax(logits[t]), z = logits[t]:
 *     loss_t = (1 - eps) (lse - z_y) + eps (lse - mean_j z_j)
 *     grad[t,j] = (p_j - (1 - eps) [j == y] - eps / vocab) * b      (writes)
 *   loss_out[0] += sum_t loss_t / count                        (accumulates)
 * With eps = 0, f32 and grad_scale 1 the values (bits) of
 * tg_cross_entropy_fwd_bwd with pad_id = ignore_index. loss_out: the sum in
 * double in position order, one rounding to f32: bitwise the same for every
 * thread count. Numerics of -inf / +inf / NaN logits as kernel 8 (a -inf
 * logit with eps > 0 makes loss_t +inf).
 * Checks (nothing written on failure): dtype outside the two, opt->flags
 * != 0, count not finite or <= 0, label_smoothing NaN or outside [0, 1],
 * grad_scale not finite: TG_ERR_BAD_PARAMS; a target outside [0, vocab)
 * that is not ignore_index: TG_ERR_BAD_INDEX; n_pos or vocab 0 or
 * row_stride < vocab: TG_ERR_BAD_SHAPE.
 * Aliasing: grad may be in place (grad == logits, same layout); otherwise
 * grad and loss_out overlap no input (logits by its extent, (n_pos - 1) *
 * row_stride + vocab elements, and targets) and not each other. */
tg_status tg_cross_entropy_fwd_bwd_ex(tg_ctx *ctx, tg_dtype dtype, const void *logits,
                                      const int64_t *targets, void *grad, float *loss_out,
                                      uint32_t n_pos, uint32_t vocab, uint64_t row_stride,
                                      double count, const tg_ce_options *opt);

/* --- 9. transpose: output[c,r] = input[r,c] --------------------------------
 * Not in place: output may not overlap input, not even for a square matrix. */
tg_status tg_transpose_2d(tg_ctx *ctx, const float *input, float *output, uint32_t rows,
                          uint32_t cols);

/* --- 10. naive causal attention backward (token-major, f32) ---------------
 * Q, grad_out, grad_Q [seq, n_heads*head_dim]; K, V, grad_K, grad_V
 * [seq, n_kv_heads*head_dim]; grad_Q writes, grad_K/grad_V accumulate.
 * Aliasing: grad_out, Q, K, V may overlap each other; grad_Q, grad_K,
 * grad_V may overlap no input and not each other, not even exactly. */
tg_status tg_causal_attention_backward(tg_ctx *ctx, const float *grad_out, const float *Q,
                                       const float *K, const float *V, float *grad_Q,
                                       float *grad_K, float *grad_V, uint32_t seq_len,
                                       uint32_t n_heads, uint32_t n_kv_heads,
                                       uint32_t head_dim);

/* --- 11. decode reduce of split-KV partials -------------------------------
 * htmp: nrows*nwg*(head_dim + 2) floats in; dst / output [nrows, head_dim]
 * (writes), which may not overlap htmp, not even in place. */
tg_status tg_flash_attn_vec_reduce(tg_ctx *ctx, const float *htmp, float *dst,
                                   uint32_t nrows, uint32_t head_dim, uint32_t nwg);
/* reduce, then normalised Walsh-Hadamard transform and D1 sign undo;
 * head_dim 256 or 512 */
tg_status tg_flash_attn_vec_reduce_tq_hb_undo(tg_ctx *ctx, const float *htmp,
                                              float *output, uint32_t nrows,
                                              uint32_t head_dim, uint32_t nwg);
/* in place: FWHT, * 1/sqrt(head_dim), sign undo; head_dim 256 or 512 (data is
 * the one buffer, read and written) */
tg_status tg_fwht_sign_undo_f32(tg_ctx *ctx, float *data, uint32_t num_heads,
                                uint32_t head_dim);

/* --- 12. rotary position embedding (RoPE), forward and backward ----------
 * HF transformers' apply_rotary_pos_emb on one of q or k (call once each):
 * x, y [B, H, L, D] through their strides (batch, head, row in elements;
 * the D features of a row contiguous), so q.transpose(1, 2) views of
 * [B, L, H, D] storage go in as they are; cos, sin [B or 1, L, R] through
 * theirs (batch stride 0: one table for every batch; the R entries of a
 * row contiguous), R = rotary_dim, as the model computes them (the two
 * halves of a row are not assumed equal: Llama 3 and YaRN scaling live in
 * the tables). The first R features of a row rotate, the rest pass
 * through unchanged (partial rotary, Phi); h = R/2:
 *   TG_ROPE_ROTATE_HALF (Llama, Qwen, Gemma, Mistral), i < h:
 *     y[i]   = x[i]   cos[i]   - x[i+h] sin[i]
 *     y[i+h] = x[i+h] cos[i+h] + x[i]   sin[i+h]
 *   TG_ROPE_INTERLEAVED (GPT-J pairs), i < h:
 *     y[2i]   = x[2i]   cos[2i]   - x[2i+1] sin[2i]
 *     y[2i+1] = x[2i+1] cos[2i+1] + x[2i]   sin[2i+1]
 * Computed in f32 (bf16 inputs widened exactly), each output rounded once
 * to y_dtype. The backward is the transpose, dx from dy with the same
 * tables: rotate-half dx[i] = dy[i] cos[i] + dy[i+h] sin[i+h], dx[i+h] =
 * dy[i+h] cos[i+h] - dy[i] sin[i]; pairs likewise (2i, 2i+1 for i, i+h).
 * Since 0.2.1; grows only at its end, behind a flags bit. */
typedef enum { TG_ROPE_ROTATE_HALF = 0, TG_ROPE_INTERLEAVED = 1 } tg_rope_layout;

typedef struct {
  int32_t B, H, L, D;         /* x, y: [B, H, L, D] */
  int32_t rotary_dim;         /* R: even, 2 <= R <= D */
  int32_t layout;             /* tg_rope_layout */
  int32_t x_dtype, y_dtype;   /* tg_dtype of x (backward: dy) and y (backward: dx) */
  int32_t table_dtype;        /* tg_dtype of cos and sin */
  uint32_t flags;             /* 0; other bits are refused */
  int64_t x_strides[3];       /* batch, head, row (elements); >= 0 */
  int64_t y_strides[3];       /* the same for y; y's rows may not overlap */
  int64_t cos_strides[2];     /* batch (0 = broadcast), row; >= 0 */
  int64_t sin_strides[2];
} tg_rope_params;             /* 120 bytes */

/* Fills *p for contiguous x and y [B, H, L, D] of float32, and contiguous
 * float32 tables [1, L, R] shared by every batch (batch stride 0).
 * TG_ERR_NULL_ARG, TG_ERR_BAD_SHAPE (a size < 1), TG_ERR_BAD_PARAMS
 * (rotary_dim odd or outside [2, D], layout outside the enum),
 * TG_ERR_OVERFLOW; *p untouched on failure. */
tg_status tg_rope_params_init(tg_rope_params *p, int B, int H, int L, int D, int rotary_dim,
                              tg_rope_layout layout);

/* y = RoPE(x) (writes; the D - R pass-through features too). May be in
 * place: y == x with the same strides and dtype; any other overlap of y
 * with x, cos or sin is refused (x's, y's extents from their strides).
 * x, cos and sin may overlap each other. Every field of p is checked
 * (sizes, rotary_dim, layout, dtypes, flags, strides >= 0, offsets within
 * int64, y's rows disjoint) before anything is written. A NaN or inf in x
 * or a table reaches only the outputs whose formula reads it. */
tg_status tg_rope_forward(tg_ctx *ctx, const void *x, const void *cos, const void *sin,
                          void *y, const tg_rope_params *p);
/* dx = RoPE^T(dy): p->x_* describe dy and p->y_* dx; the rest as forward
 * (may be in place: dx == dy). */
tg_status tg_rope_backward(tg_ctx *ctx, const void *dy, const void *cos, const void *sin,
                           void *dx, const tg_rope_params *p);

/* --- 13. gated linear units (SwiGLU, GeGLU), forward and backward --------
 * gate, up, y, dy, dgate, dup [rows, cols], each through its own row
 * stride in elements (>= cols when rows > 1), so the two chunks of a fused
 * gate_up projection (Phi-3) are views of one buffer. act:
 *   TG_GLU_SILU       silu(g) = g sigmoid(g)                 (SwiGLU: Llama, Qwen, Mistral)
 *   TG_GLU_GELU_TANH  gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
 *                     (GeGLU: Gemma's gelu_pytorch_tanh, torch's gelu(approximate='tanh'))
 *   forward:  y = act(gate) * up
 *   backward: dgate = dy * up * act'(gate),  dup = dy * act(gate)
 * All tensors of one dtype (TG_DTYPE_BF16 or TG_DTYPE_F32), computed in
 * f32 and rounded once. The sigmoid is evaluated so that it never
 * overflows (sigmoid(-100) = 3.7e-44, not 1/inf): within a few ulps over
 * the whole f32 range where the result is normal (docs/KERNELS.md); NaN in
 * an input makes the outputs of its element NaN; a gate of +-inf gives the
 * functions' limits (act(-inf) = -0, act(+inf) = +inf, act'(+inf) = 1,
 * act'(-inf) = 0), not the formula's 0 * inf = NaN.
 * Aliasing: inputs may overlap each other. forward: y may be in place over
 * gate or over up (the same address and stride); backward: dgate may be in
 * place over gate and dup over up. Any other overlap of an output with an
 * input or the other output is refused, with row-strided views judged
 * row by row: chunks of one fused buffer (same stride, disjoint columns)
 * do not overlap. */
typedef enum { TG_GLU_SILU = 0, TG_GLU_GELU_TANH = 1 } tg_glu_act;

tg_status tg_glu_forward(tg_ctx *ctx, const void *gate, const void *up, void *y,
                         tg_glu_act act, tg_dtype dtype, uint32_t rows, uint32_t cols,
                         int64_t gate_stride, int64_t up_stride, int64_t y_stride);
tg_status tg_glu_backward(tg_ctx *ctx, const void *gate, const void *up, const void *dy,
                          void *dgate, void *dup, tg_glu_act act, tg_dtype dtype,
                          uint32_t rows, uint32_t cols, int64_t gate_stride,
                          int64_t up_stride, int64_t dy_stride, int64_t dgate_stride,
                          int64_t dup_stride);

#ifdef __cplusplus
}
#endif
#endif /* TILEGRAD_H */
