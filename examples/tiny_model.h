/*
 * A tiny decoder block trained on the CPU with tilegrad's kernels.
 *
 *   ids [B, T] -> h0 = E[ids] + Pos[t]   (E [V, C], Pos [T, C])  h0 [N, C]  (N = B T)
 *   n1 = RMSNorm(h0) * w1                                   [N, C]
 *   q = n1 Wq, k = n1 Wk, v = n1 Wv                         [N, H Dh], [N, Hkv Dh]
 *   o = causal softmax(q k^T / sqrt(Dh)) v  (GQA: Hkv <= H) [N, H Dh]
 *   h1 = h0 + o Wo                                          [N, C]      (residual)
 *   n2 = RMSNorm(h1) * w2                                   [N, C]
 *   logits = n2 Wout  (or n2 E^T when tied)                 [N, V]
 *   loss = mean cross-entropy(logits, targets)              (pad targets ignored)
 *
 * Activations are token-major ([B, T, heads, Dh] for q/k/v/o); the attention
 * kernels read and write them in place through the params' strides. Every
 * matrix product is cblas_sgemm (single-threaded OpenBLAS on one slice of
 * the output per OpenMP thread); everything else is a tilegrad kernel,
 * except what the API leaves to the caller: the embedding gather, the
 * residual add, AdamW, and two exact copies: bf16 -> f32 widening of O, and
 * the head-major -> token-major reorder of dQ/dK/dV (the backward writes
 * those contiguous [B, heads, T, Dh]).
 *
 * Parameters live in one flat f32 buffer (and gradients in one of the same
 * layout), as the tensors listed in tm_tensor, so an optimizer or a gradient
 * check can walk them generically.
 */
#ifndef TINY_MODEL_H
#define TINY_MODEL_H

#include <stdint.h>

#include "tilegrad.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int vocab;      /* V */
  int dim;        /* C, the residual width */
  int n_heads;    /* H */
  int n_kv_heads; /* Hkv; H % Hkv == 0 */
  int head_dim;   /* Dh, a multiple of 8 */
  int seq_len;    /* T */
  int batch;      /* B */
  int tied;       /* 1: logits = n2 E^T (no Wout) */
  float eps;      /* RMSNorm epsilon */
} tm_config;

/* The parameter tensors, in the order they sit in the flat buffer. */
typedef enum {
  TM_EMB,   /* E     [V, C] */
  TM_POS,   /* Pos   [T, C] learned positions */
  TM_NORM1, /* w1    [C] */
  TM_WQ,    /* Wq    [C, H Dh] */
  TM_WK,    /* Wk    [C, Hkv Dh] */
  TM_WV,    /* Wv    [C, Hkv Dh] */
  TM_WO,    /* Wo    [H Dh, C] */
  TM_NORM2, /* w2    [C] */
  TM_WOUT,  /* Wout  [C, V] (0 elements when tied) */
  TM_NTENSORS
} tm_tensor_id;

typedef struct {
  const char *name;
  int64_t offset, count; /* in floats, into the flat buffers */
  int rows, cols;        /* row-major shape (a vector is 1 x C) */
} tm_tensor;

/* Targets equal to this are padding: no loss, no gradient. */
#define TM_PAD_ID 0xFFFFFFFFu

typedef struct tm_model tm_model;

/* The default configuration of `tilegrad train`. */
tm_config tm_default_config(void);

/* Checks the config; allocates parameters, gradients, Adam state and
 * activations; initialises the parameters from seed. ctx is borrowed (the
 * caller keeps it alive and sets its threads). Sets OpenBLAS to one thread:
 * the model runs its sgemm calls on row slices in its own OpenMP threads.
 * On error returns non-OK and writes a message to err (if not NULL). */
tg_status tm_create(tm_model **out, const tm_config *cfg, tg_ctx *ctx, uint64_t seed,
                    char *err, int err_len);
void tm_destroy(tm_model *m);
/* OpenMP threads for the BLAS slices (n <= 0: OpenMP's default, which is
 * also the initial value); give the same count as the tg_ctx. */
void tm_set_threads(tm_model *m, int n);

const tm_config *tm_get_config(const tm_model *m);
int64_t tm_n_params(const tm_model *m);
tm_tensor tm_get_tensor(const tm_model *m, tm_tensor_id t);
float *tm_params(tm_model *m); /* flat parameter buffer (may be modified) */
float *tm_grads(tm_model *m);  /* flat gradient buffer, written by tm_forward_backward */
/* logits [B T, V] of the last forward */
const float *tm_logits(const tm_model *m);

/* One forward pass: ids, targets [B, T] (targets may contain TM_PAD_ID);
 * *loss = mean over non-pad targets. Fills the activations the backward
 * uses. */
tg_status tm_forward(tm_model *m, const uint32_t *ids, const uint32_t *targets,
                     float *loss);
/* Forward and backward: writes every gradient (d loss / d param) into
 * tm_grads(m). */
tg_status tm_forward_backward(tm_model *m, const uint32_t *ids, const uint32_t *targets,
                              float *loss);

/* Where a step's time goes: seconds accumulated by tm_forward and
 * tm_forward_backward since tm_create, per phase. */
typedef enum {
  TM_PH_GEMM,     /* cblas_sgemm, all projections, forward and backward */
  TM_PH_ATTN_FWD, /* tg_flash_attn_train_fwd_bf16 */
  TM_PH_ATTN_BWD, /* compute_d, the D_vec transposes, tg_flash_attn_train_bwd_bf16 */
  TM_PH_NORM,     /* RMSNorm forward and backward (dx, dw), both norms */
  TM_PH_XENT,     /* tg_cross_entropy_fwd_bwd */
  TM_PH_EMB,      /* tg_embedding_backward (tokens and positions) */
  TM_PH_CAST,     /* tg_f32_to_bf16_cast of q, k, v, dO */
  TM_PH_COPY,     /* gather, bf16 widening, dQ/dK/dV reorder, residual adds */
  TM_NPHASES
} tm_phase;
const char *tm_phase_name(tm_phase ph);
const double *tm_phase_seconds(const tm_model *m); /* [TM_NPHASES] */

typedef struct {
  float lr, beta1, beta2, eps, weight_decay; /* decoupled (AdamW), not on norms */
  float clip;                                /* global gradient-norm clip; 0 = off */
} tm_adam;
tm_adam tm_default_adam(void);
/* One AdamW update with the gradients in tm_grads(m); step counts from 1.
 * Returns the gradient norm before clipping. */
double tm_adam_step(tm_model *m, const tm_adam *opt, float lr, int64_t step);

/* OpenBLAS's own thread count (openblas_set_num_threads when the linked BLAS
 * has it; otherwise a no-op). tm_create sets it to 1. */
void tm_blas_set_threads(int n);
/* The BLAS in use and, for OpenBLAS, the core its kernels were chosen for. */
const char *tm_blas_name(void);
/* OpenBLAS's DYNAMIC_ARCH falls back to its generic "Prescott" (SSE3)
 * kernels on CPUs newer than its tables (Debian 12's 0.3.21 on Sapphire or
 * Emerald Rapids: model 143 / 207), 3-4x slower for this model's sgemm.
 * When that has happened, OPENBLAS_CORETYPE is unset and the CPU has
 * AVX-512 (or AVX2+FMA), returns the core to ask for: "SkylakeX" (or
 * "Haswell"); otherwise NULL. The variable is read when OpenBLAS loads. */
const char *tm_blas_coretype_hint(void);

#ifdef __cplusplus
}
#endif
#endif /* TINY_MODEL_H */
