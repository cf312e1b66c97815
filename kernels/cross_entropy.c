/*
 * 8. Cross-entropy forward + backward (seed 004). logits and grad are
 * [n_pos, vocab] f32 row-major, targets [n_pos]. For a position t with
 * target y = targets[t]:
 *
 *   pad (y == pad_id):  grad[t,:] = 0                                  (writes)
 *   otherwise:          m        = max_j logits[t,j]
 *                       S        = sum_j exp(logits[t,j] - m)
 *                       p_j      = exp(logits[t,j] - m) / S            (softmax)
 *                       loss_t   = log S - (logits[t,y] - m)           (= -log p_y)
 *                       grad[t,j] = (p_j - [j == y]) / count           (writes)
 *   loss_out[0] += sum_t loss_t / count                                (accumulates)
 *
 * count is the caller's number of non-pad positions (it may differ from the
 * number in this call, e.g. for a mean over several micro-batches); count == 0
 * returns TG_OK having read no target and written nothing, as the seed does.
 * A non-pad target >= vocab is TG_ERR_BAD_INDEX; all targets are checked
 * before anything is written.
 *
 * Numerics: the max subtraction keeps exp in range for logits of any finite
 * magnitude (+-1e30 included); -inf logits contribute exp(-inf) = 0. A -inf
 * target logit gives loss_t = +inf (its probability is 0) and a finite grad.
 * A row whose logits are all -inf has no defined softmax: tilegrad takes the
 * limit of equal logits (p_j = 1/vocab) for the grad, and loss_t = +inf. +inf
 * or NaN logits give NaN in that row's grad and in the loss.
 * m, S, log S, p and grad are f32 (S is a 16-lane f32 sum with a fixed lane
 * tree). loss_t is f32; the sum over positions is a double sum in position
 * order, divided by count and added to loss_out[0] with one final rounding
 * to f32. That order never depends on the thread count or on the
 * deterministic flag: loss_out is bitwise reproducible in every mode.
 *
 * Metal grid: one threadgroup per position, with loss_out added atomically.
 * Here one group runs a block of consecutive positions (enough for ~8 Ki
 * elements, at least one row) and leaves each loss_t in a buffer; the
 * serial fixed-order sum replaces the atomic add.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"
#include "reduce.h"


typedef struct {
  const float *logits;
  const uint32_t *targets;
  float *grad;
  double *row_loss; /* [n_pos], loss_t (0 for pad rows) */
  int64_t n_pos, vocab, rpg;
  uint32_t pad_id;
  float inv_count;
  const tg_micro_ops *ops;
} ce_args;

static void ce_row(const ce_args *a, int64_t t) {
  const float *l = a->logits + t * a->vocab;
  float *g = a->grad + t * a->vocab;
  const int64_t V = a->vocab;
  const uint32_t y = a->targets[t];
  if (y == a->pad_id) {
    for (int64_t j = 0; j < V; j++) g[j] = 0.0f;
    a->row_loss[t] = 0.0;
    return;
  }
  const float m = a->ops->max_f32(l, V);
  if (m == -INFINITY) { /* no logit above -inf: all -inf, or NaN among them */
    int has_nan = 0;
    for (int64_t j = 0; j < V; j++) has_nan |= isnan(l[j]);
    const float p = has_nan ? NAN : 1.0f / (float)V; /* all -inf: p_j = 1/vocab */
    for (int64_t j = 0; j < V; j++) g[j] = (p - (float)(j == y)) * a->inv_count;
    a->row_loss[t] = has_nan ? NAN : INFINITY;
    return;
  }
  const float ly = l[y] - m;                /* read before g is written */
  /* Two passes over the row (V = 32 Ki floats is 128 KiB: the second reads it
   * from L2): g[j] = exp(l[j] - m) with S = sum_j g[j] (16 lanes, fixed tree),
   * then g[j] = (g[j] * inv_S - [j == y]) * inv_count, as (g*inv_S)*inv_count
   * for j != y and the target fixed up from its own e_y. */
  const float S = a->ops->exp_shift_sum_f32(l, m, g, V);
  a->row_loss[t] = (double)(logf(S) - ly);
  const float inv_S = 1.0f / S;
  const float ey = g[y];
  a->ops->scale2_f32(g, V, inv_S, a->inv_count);
  g[y] = (ey * inv_S - 1.0f) * a->inv_count;
}

static void ce_group(const void *vargs, int64_t grp, int64_t y, int64_t z,
                     void *scratch) {
  const ce_args *a = vargs;
  const int64_t t1 = (grp + 1) * a->rpg < a->n_pos ? (grp + 1) * a->rpg : a->n_pos;
  for (int64_t t = grp * a->rpg; t < t1; t++) ce_row(a, t);
}

tg_status tg_cross_entropy_fwd_bwd(tg_ctx *ctx, const float *logits,
                                   const uint32_t *targets, float *grad, float *loss_out,
                                   uint32_t n_pos, uint32_t vocab, uint32_t pad_id,
                                   uint32_t count) {
  static const char fn[] = "tg_cross_entropy_fwd_bwd";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const char *null = !logits    ? "logits"
                     : !targets ? "targets"
                     : !grad    ? "grad"
                     : !loss_out ? "loss_out"
                                 : NULL;
  if (null) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null);
  char name[160];
  snprintf(name, sizeof name, "%s: logits[n_pos = %u, vocab = %u]", fn, n_pos, vocab);
  int64_t n;
  tg_status st =
      tg_shape_count(ctx, name, sizeof(float), &n, 2, (int64_t)n_pos, (int64_t)vocab);
  if (st != TG_OK) return st;
  if (count == 0) return TG_OK; /* the seed's early return: nothing read or written */
  for (int64_t t = 0; t < n_pos; t++)
    if (targets[t] != pad_id && targets[t] >= vocab)
      return tg_fail(ctx, TG_ERR_BAD_INDEX,
                     "%s: targets[%lld] = %u is >= vocab = %u and is not pad_id = %u", fn,
                     (long long)t, targets[t], vocab, pad_id);

  ce_args a = {logits, targets, grad, NULL, n_pos, vocab,
               tg_rows_per_block(vocab), pad_id,
               1.0f / (float)count, ctx->ops};
  a.row_loss = malloc((size_t)n_pos * sizeof(double));
  if (!a.row_loss)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate %u per-position losses",
                   fn, n_pos);
  st = tg_dispatch(ctx, (a.n_pos + a.rpg - 1) / a.rpg, 1, 1, 0, ce_group, &a);
  if (st == TG_OK) {
    double total = 0.0; /* position order, whatever the thread count */
    for (int64_t t = 0; t < n_pos; t++) total += a.row_loss[t];
    loss_out[0] = (float)((double)loss_out[0] + total / (double)count);
  }
  free(a.row_loss);
  return st;
}
