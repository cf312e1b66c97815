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
 * tree, rescaled as the online max grows; see ce_group). loss_t is f32; the sum over positions is a double sum in position
 * order, divided by count and added to loss_out[0] with one final rounding
 * to f32. That order never depends on the thread count or on the
 * deterministic flag: loss_out is bitwise reproducible in every mode.
 *
 * Metal grid: one threadgroup per position, with loss_out added atomically.
 * Here one group runs a block of consecutive positions (about 1 Mi logits,
 * at least four groups per thread) and leaves each loss_t in a buffer; the
 * serial fixed-order sum replaces the atomic add.
 */
#include <math.h>
#include <stdio.h>

#include "engine.h"
#include "reduce.h"

typedef struct {
  const float *logits;
  const uint32_t *targets;
  float *grad;
  double *row_loss; /* [n_pos], loss_t (0 for pad rows) */
  int64_t n_pos, vocab, rpg, nchunks;
  uint32_t pad_id;
  float inv_count;
  int stream;
  const tg_isa_ops *ops;
} ce_args;

/* Rows per work item: a row's write overlaps the next row's read only within
 * an item, so items are long (about 1 Mi logits, 4 MiB), but at least four
 * per thread. */
static int64_t ce_rows_per_group(int64_t n_pos, int64_t vocab, int64_t threads) {
  int64_t rpg = ((int64_t)1 << 20) / vocab;
  const int64_t fair = (n_pos + 4 * threads - 1) / (4 * threads);
  if (rpg > fair) rpg = fair;
  return rpg < 1 ? 1 : rpg;
}

/* Per-thread scratch: two rows of e [vocab] (the exponentials of the row being
 * read and of the row being written, in L2), two of a [nchunks], the shifts
 * [nchunks] and the online softmax state [17]. */
typedef struct {
  float *e[2], *ac[2], *shift, *state;
} ce_scratch;

static size_t ce_scratch_bytes(int64_t vocab, int64_t nchunks) {
  return 2 * tg_align64((size_t)vocab * sizeof(float)) + (3 * (size_t)nchunks + 17) * sizeof(float);
}

static ce_scratch ce_carve(void *scratch, int64_t vocab, int64_t nchunks) {
  const size_t row = tg_align64((size_t)vocab * sizeof(float));
  ce_scratch s;
  s.e[0] = scratch;
  s.e[1] = (float *)((char *)scratch + row);
  s.ac[0] = (float *)((char *)scratch + 2 * row);
  s.ac[1] = s.ac[0] + nchunks;
  s.shift = s.ac[1] + nchunks;
  s.state = s.shift + nchunks;
  return s;
}

/* All logits -inf, or NaN among -inf (the max skips NaN): no softmax. */
static void ce_row_no_max(const ce_args *a, const float *l, float *g, uint32_t y, int64_t t) {
  const int64_t V = a->vocab;
  int has_nan = 0;
  for (int64_t j = 0; j < V; j++) has_nan |= isnan(l[j]);
  const float p = has_nan ? NAN : 1.0f / (float)V; /* all -inf: p_j = 1/vocab */
  for (int64_t j = 0; j < V; j++) g[j] = (p - (float)(j == y)) * a->inv_count;
  a->row_loss[t] = has_nan ? NAN : INFINITY;
}

/* grad[t, chunk c] = (e[j] * a_c) * inv_count, around the caches when the
 * output is large, but for the target's chunk: its element is fixed up by an
 * ordinary store right after (ce_fix_target), which then needs no fence. */
static void ce_write_chunk(const ce_args *a, const float *e, const float *ac, int64_t t,
                           int64_t c) {
  const int64_t c0 = c * TG_SOFTMAX_CHUNK;
  const int64_t len = a->vocab - c0 < TG_SOFTMAX_CHUNK ? a->vocab - c0 : TG_SOFTMAX_CHUNK;
  const int stream = a->stream && c != a->targets[t] / TG_SOFTMAX_CHUNK;
  a->ops->scale_chunks_f32(e + c0, ac + c, a->inv_count, a->grad + t * a->vocab + c0, len,
                           stream);
}

/* The target element of a written row, from its own e_y: (e_y a_c - 1) / count. */
static void ce_fix_target(const ce_args *a, const float *e, const float *ac, int64_t t) {
  const uint32_t y = a->targets[t];
  a->grad[t * a->vocab + y] = (e[y] * ac[y / TG_SOFTMAX_CHUNK] - 1.0f) * a->inv_count;
}

/*
 * A block of rows, each in two steps:
 *   1. read: softmax_exp_chunk over the row's chunks: e[j] = exp(l[j] - m_c)
 *      with m_c the running max (an online max, so the logits are read from
 *      memory once, the exp of a chunk overlapping the read of the next), and
 *      S = sum_j exp(l[j] - m) for the row max m; loss_t = log S - (l[y] - m);
 *   2. write: grad[j] = (e[j] * a_c) * inv_count, a_c = exp(m_c - m) / S
 *      (= 1/S exactly where m_c = m), the target fixed up from its own e_y.
 * Step 2 of a row runs chunk by chunk between the chunks of step 1 of the
 * next row (two e buffers), so the grad stream goes out while the exp of the
 * next row computes: one after the other, the write left the arithmetic idle
 * (CE at 58% of triad on AVX-512, Zen 5, 2 threads).
 * Where m_c < m, e[j] * a_c rounds twice more than exp(l[j] - m) / S would:
 * only with more than one chunk (vocab > TG_SOFTMAX_CHUNK), where the
 * (vocab - 1) u of the sum S dominates the error anyway.
 */
static void ce_group(const void *vargs, int64_t grp, int64_t y_, int64_t z, void *scratch) {
  const ce_args *a = vargs;
  const int64_t V = a->vocab, nc = a->nchunks;
  ce_scratch sc = ce_carve(scratch, V, nc);
  const int64_t t0 = grp * a->rpg, t1 = t0 + a->rpg < a->n_pos ? t0 + a->rpg : a->n_pos;
  int64_t pend = -1; /* the row whose grad is still to be written, from e[cur ^ 1] */
  int cur = 0;
  for (int64_t t = t0; t < t1; t++) {
    const float *l = a->logits + t * V;
    float *g = a->grad + t * V;
    const uint32_t y = a->targets[t];
    if (y == a->pad_id) {
      for (int64_t j = 0; j < V; j++) g[j] = 0.0f;
      a->row_loss[t] = 0.0;
      continue;
    }
    for (int l16 = 0; l16 < 16; l16++) sc.state[l16] = 0.0f;
    sc.state[16] = -INFINITY;
    for (int64_t c = 0; c < nc; c++) {
      const int64_t c0 = c * TG_SOFTMAX_CHUNK;
      const int64_t len = V - c0 < TG_SOFTMAX_CHUNK ? V - c0 : TG_SOFTMAX_CHUNK;
      sc.shift[c] = a->ops->softmax_exp_chunk(l + c0, len, sc.e[cur] + c0, sc.state);
      if (pend >= 0) ce_write_chunk(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, c);
    }
    if (pend >= 0) ce_fix_target(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend);
    pend = -1;
    const float S = tg_lane_tree16(sc.state), m = sc.shift[nc - 1];
    if (m == -INFINITY) {
      ce_row_no_max(a, l, g, y, t);
      continue;
    }
    const float inv_S = 1.0f / S;
    for (int64_t c = 0; c < nc; c++)
      sc.ac[cur][c] = sc.shift[c] == m ? inv_S : expf(sc.shift[c] - m) * inv_S;
    a->row_loss[t] = (double)(logf(S) - (l[y] - m));
    pend = t;
    cur ^= 1;
  }
  if (pend >= 0) {
    for (int64_t c = 0; c < nc; c++) ce_write_chunk(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, c);
    ce_fix_target(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend);
  }
  if (a->stream) a->ops->stream_fence();
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
  /* grad may be logits itself: a work item reads each of its rows whole
   * (into scratch) before it writes that row's grad, and no other item
   * touches the row. loss_out and targets overlap nothing written. */
  const uint64_t bytes = (uint64_t)n * sizeof(float);
  const tg_buf bufs[] = {tg_in("logits", logits, bytes),
                         tg_in("targets", targets, (uint64_t)n_pos * sizeof(uint32_t)),
                         tg_out_in_place("grad", grad, bytes, "logits"),
                         tg_out("loss_out", loss_out, sizeof(float))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  for (int64_t t = 0; t < n_pos; t++)
    if (targets[t] != pad_id && targets[t] >= vocab)
      return tg_fail(ctx, TG_ERR_BAD_INDEX,
                     "%s: targets[%lld] = %u is >= vocab = %u and is not pad_id = %u", fn,
                     (long long)t, targets[t], vocab, pad_id);

  const int64_t nchunks = ((int64_t)vocab + TG_SOFTMAX_CHUNK - 1) / TG_SOFTMAX_CHUNK;
  ce_args a = {logits, targets, grad, NULL, n_pos, vocab,
               ce_rows_per_group(n_pos, vocab, tg_threads(ctx)), nchunks, pad_id,
               1.0f / (float)count, n * (int64_t)sizeof(float) >= TG_STREAM_BYTES, ctx->ops};
  a.row_loss = tg_mem_alloc((size_t)n_pos * sizeof(double), 64);
  if (!a.row_loss)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate %u per-position losses",
                   fn, n_pos);
  st = tg_dispatch(ctx, (a.n_pos + a.rpg - 1) / a.rpg, 1, 1, ce_scratch_bytes(vocab, nchunks),
                   ce_group, &a);
  if (st == TG_OK) {
    double total = 0.0; /* position order, whatever the thread count */
    for (int64_t t = 0; t < n_pos; t++) total += a.row_loss[t];
    loss_out[0] = (float)((double)loss_out[0] + total / (double)count);
  }
  tg_mem_free(a.row_loss);
  return st;
}
