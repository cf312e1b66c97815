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
 *
 * tg_cross_entropy_fwd_bwd_ex (PyTorch's loss: F.cross_entropy with
 * ignore_index and label_smoothing, HF's num_items_in_batch) runs the same
 * two steps on the same row state with int64 targets (ignore_index instead
 * of pad_id), rows row_stride elements apart, a double count, the grad
 * scaled by grad_scale, and label smoothing eps, as torch defines it:
 *
 *   loss_t  = (1 - eps) (log S - (l_y - m)) + eps (log S - (mean_j l_j - m))
 *   grad[j] = (p_j - (1 - eps) [j == y] - eps / vocab) * grad_scale / count
 *
 * The mean of a row's logits is a 16-lane f32 sum taken as each chunk is
 * read (from L1). With eps = 0 and f32 logits the grad takes the seed's
 * path (b = grad_scale / count rounded once for inv_count); otherwise each
 * chunk of a row's grad is staged in an f32 chunk (L1), shifted by
 * eps / vocab * b, its target fixed up, and stored as f32 or rounded once
 * to bf16 (RNE): a bf16 grad is exactly the bf16 of the f32 grad of the
 * same (widened) logits. bf16 logits are widened a chunk at a time into L1
 * before the softmax step reads them; everything after is f32.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "reduce.h"

typedef struct {
  const void *logits; /* float or tg_bf16 (bf16 != 0), rows ld elements apart */
  const uint32_t *t32; /* the seed's targets (pad_id), or */
  const int64_t *t64;  /* int64 targets (ignore_index) */
  void *grad;          /* like logits */
  double *row_loss;    /* [n_pos], loss_t (0 for ignored rows) */
  int64_t n_pos, vocab, ld, rpg, nchunks, ignore;
  float inv_count;     /* b = grad_scale / count */
  float eps, eps_shift; /* label smoothing, eps / vocab * b */
  int bf16, staged, stream;
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
 * [nchunks], the online softmax state [17], the lane sums of the logits [16],
 * and two chunks [TG_SOFTMAX_CHUNK]: the widened bf16 logits being read and
 * the staged grad being written. */
typedef struct {
  float *e[2], *ac[2], *shift, *state, *zsum, *wide, *stage;
} ce_scratch;

static size_t ce_scratch_bytes(int64_t vocab, int64_t nchunks) {
  return 2 * tg_align64((size_t)vocab * sizeof(float)) +
         2 * TG_SOFTMAX_CHUNK * sizeof(float) + (3 * (size_t)nchunks + 33) * sizeof(float);
}

static ce_scratch ce_carve(void *scratch, int64_t vocab, int64_t nchunks) {
  const size_t row = tg_align64((size_t)vocab * sizeof(float));
  ce_scratch s;
  s.e[0] = scratch;
  s.e[1] = (float *)((char *)scratch + row);
  s.wide = (float *)((char *)scratch + 2 * row); /* 64-byte aligned chunks */
  s.stage = s.wide + TG_SOFTMAX_CHUNK;
  s.ac[0] = s.stage + TG_SOFTMAX_CHUNK;
  s.ac[1] = s.ac[0] + nchunks;
  s.shift = s.ac[1] + nchunks;
  s.state = s.shift + nchunks;
  s.zsum = s.state + 17;
  return s;
}

/* Row t's target, or -1 for an ignored (pad) row. Checked before dispatch:
 * any other target is in [0, vocab). */
static int64_t ce_target(const ce_args *a, int64_t t) {
  if (a->t32) return a->t32[t] == (uint32_t)a->ignore ? -1 : (int64_t)a->t32[t];
  return a->t64[t] == a->ignore ? -1 : a->t64[t];
}

static const float *ce_row_f32(const ce_args *a, int64_t t) {
  return (const float *)a->logits + t * a->ld;
}
static const tg_bf16 *ce_row_bf16(const ce_args *a, int64_t t) {
  return (const tg_bf16 *)a->logits + t * a->ld;
}

/* logits[t, j] as f32 */
static float ce_logit(const ce_args *a, int64_t t, int64_t j) {
  if (!a->bf16) return ce_row_f32(a, t)[j];
  uint32_t bits = (uint32_t)ce_row_bf16(a, t)[j] << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

/* grad[t, c0 .. c0 + len) = v[0 .. len) (f32, or rounded to bf16) */
static void ce_store(const ce_args *a, int64_t t, int64_t c0, const float *v, int64_t len) {
  if (a->bf16)
    a->ops->f32_to_bf16(v, (tg_bf16 *)a->grad + t * a->ld + c0, len);
  else
    memcpy((float *)a->grad + t * a->ld + c0, v, (size_t)len * sizeof(float));
}

/* An ignored row: grad row 0, its logits never read. */
static void ce_row_zero(const ce_args *a, int64_t t) {
  if (a->bf16)
    memset((tg_bf16 *)a->grad + t * a->ld, 0, (size_t)a->vocab * sizeof(tg_bf16));
  else
    for (int64_t j = 0; j < a->vocab; j++) ((float *)a->grad)[t * a->ld + j] = 0.0f;
}

/* All logits -inf, or NaN among -inf (the max skips NaN): no softmax. */
static void ce_row_no_max(const ce_args *a, float *stage, int64_t y, int64_t t) {
  const int64_t V = a->vocab;
  int has_nan = 0;
  for (int64_t j = 0; j < V; j++) has_nan |= isnan(ce_logit(a, t, j));
  const float p = has_nan ? NAN : 1.0f / (float)V; /* all -inf: p_j = 1/vocab */
  if (!a->staged) { /* the seed's row, bit for bit */
    float *g = (float *)a->grad + t * a->ld;
    for (int64_t j = 0; j < V; j++) g[j] = (p - (float)(j == y)) * a->inv_count;
  } else {
    const float hit = 1.0f - a->eps;
    for (int64_t c0 = 0; c0 < V; c0 += TG_SOFTMAX_CHUNK) {
      const int64_t len = V - c0 < TG_SOFTMAX_CHUNK ? V - c0 : TG_SOFTMAX_CHUNK;
      for (int64_t j = 0; j < len; j++) {
        const float gj = (p - (c0 + j == y ? hit : 0.0f)) * a->inv_count;
        stage[j] = a->eps != 0.0f ? gj - a->eps_shift : gj;
      }
      ce_store(a, t, c0, stage, len);
    }
  }
  a->row_loss[t] = has_nan ? NAN : INFINITY;
}

/* grad[t, chunk c] = (e[j] * a_c) * inv_count, around the caches when the
 * output is large, but for the target's chunk: its element is fixed up by an
 * ordinary store right after (ce_fix_target), which then needs no fence.
 * Staged (bf16 or eps > 0): the chunk in f32 in L1, shifted by eps/vocab * b,
 * its target element (e_y a_c - (1 - eps)) b - eps/vocab b, then stored. */
static void ce_write_chunk(const ce_args *a, float *stage, const float *e, const float *ac,
                           int64_t t, int64_t y, int64_t c) {
  const int64_t c0 = c * TG_SOFTMAX_CHUNK;
  const int64_t len = a->vocab - c0 < TG_SOFTMAX_CHUNK ? a->vocab - c0 : TG_SOFTMAX_CHUNK;
  if (!a->staged) {
    const int stream = a->stream && c != y / TG_SOFTMAX_CHUNK;
    a->ops->scale_chunks_f32(e + c0, ac + c, a->inv_count, (float *)a->grad + t * a->ld + c0,
                             len, stream);
    return;
  }
  a->ops->scale_chunks_f32(e + c0, ac + c, a->inv_count, stage, len, 0);
  if (a->eps != 0.0f) {
    const float s = a->eps_shift;
#pragma omp simd
    for (int64_t j = 0; j < len; j++) stage[j] -= s;
  }
  if (c == y / TG_SOFTMAX_CHUNK) {
    const float gy = (e[y] * ac[c] - (1.0f - a->eps)) * a->inv_count;
    stage[y - c0] = a->eps != 0.0f ? gy - a->eps_shift : gy; /* eps 0: -0 stays -0 */
  }
  ce_store(a, t, c0, stage, len);
}

/* The target element of a written row (unstaged), from its own e_y:
 * (e_y a_c - 1) / count. */
static void ce_fix_target(const ce_args *a, const float *e, const float *ac, int64_t t,
                          int64_t y) {
  if (a->staged) return; /* written with its chunk */
  ((float *)a->grad)[t * a->ld + y] = (e[y] * ac[y / TG_SOFTMAX_CHUNK] - 1.0f) * a->inv_count;
}

/* zsum[l] += x[j] for j = l mod 16 of a chunk (label smoothing's mean). */
static void ce_sum_chunk(float *restrict zsum, const float *restrict x, int64_t len) {
  int64_t j = 0;
  for (; j + 16 <= len; j += 16)
#pragma omp simd
    for (int l = 0; l < 16; l++) zsum[l] += x[j + l];
  for (int l = 0; j < len; j++, l++) zsum[l] += x[j];
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
 * In place (grad == logits): row t is written only while row t + 1 is read,
 * and l_y of row t is read before that.
 */
static void ce_group(const void *vargs, int64_t grp, int64_t y_, int64_t z, void *scratch) {
  const ce_args *a = vargs;
  const int64_t V = a->vocab, nc = a->nchunks;
  ce_scratch sc = ce_carve(scratch, V, nc);
  const int64_t t0 = grp * a->rpg, t1 = t0 + a->rpg < a->n_pos ? t0 + a->rpg : a->n_pos;
  int64_t pend = -1, pend_y = 0; /* the row whose grad is still to be written, from e[cur ^ 1] */
  int cur = 0;
  for (int64_t t = t0; t < t1; t++) {
    const int64_t y = ce_target(a, t);
    if (y < 0) {
      ce_row_zero(a, t);
      a->row_loss[t] = 0.0;
      continue;
    }
    for (int l16 = 0; l16 < 16; l16++) sc.state[l16] = sc.zsum[l16] = 0.0f;
    sc.state[16] = -INFINITY;
    for (int64_t c = 0; c < nc; c++) {
      const int64_t c0 = c * TG_SOFTMAX_CHUNK;
      const int64_t len = V - c0 < TG_SOFTMAX_CHUNK ? V - c0 : TG_SOFTMAX_CHUNK;
      const float *x = a->bf16 ? sc.wide : ce_row_f32(a, t) + c0;
      if (a->bf16) a->ops->bf16_to_f32(ce_row_bf16(a, t) + c0, sc.wide, len);
      sc.shift[c] = a->ops->softmax_exp_chunk(x, len, sc.e[cur] + c0, sc.state);
      if (a->eps != 0.0f) ce_sum_chunk(sc.zsum, x, len);
      if (pend >= 0) ce_write_chunk(a, sc.stage, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, pend_y, c);
    }
    if (pend >= 0) ce_fix_target(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, pend_y);
    pend = -1;
    const float S = tg_lane_tree16(sc.state), m = sc.shift[nc - 1];
    if (m == -INFINITY) {
      ce_row_no_max(a, sc.stage, y, t);
      continue;
    }
    const float inv_S = 1.0f / S;
    for (int64_t c = 0; c < nc; c++)
      sc.ac[cur][c] = sc.shift[c] == m ? inv_S : expf(sc.shift[c] - m) * inv_S;
    const float log_S = logf(S), nll = log_S - (ce_logit(a, t, y) - m);
    if (a->eps == 0.0f) {
      a->row_loss[t] = (double)nll; /* the seed's loss_t */
    } else { /* (1 - eps) nll + eps (log S - (mean_j l_j - m)), in double */
      const double mean = (double)tg_lane_tree16(sc.zsum) / (double)V;
      const double eps = a->eps;
      a->row_loss[t] = (1.0 - eps) * (double)nll + eps * ((double)log_S - (mean - (double)m));
    }
    pend = t;
    pend_y = y;
    cur ^= 1;
  }
  if (pend >= 0) {
    for (int64_t c = 0; c < nc; c++)
      ce_write_chunk(a, sc.stage, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, pend_y, c);
    ce_fix_target(a, sc.e[cur ^ 1], sc.ac[cur ^ 1], pend, pend_y);
  }
  if (a->stream) a->ops->stream_fence();
}

/* Runs the checked problem in *a on ctx; loss_out[0] += (sum_t loss_t) /
 * count, the sum in double in position order, rounded once to f32. */
static tg_status ce_run(tg_ctx *ctx, const char *fn, ce_args *a, double count,
                        float *loss_out) {
  a->nchunks = (a->vocab + TG_SOFTMAX_CHUNK - 1) / TG_SOFTMAX_CHUNK;
  a->rpg = ce_rows_per_group(a->n_pos, a->vocab, tg_threads(ctx));
  a->ops = ctx->ops;
  a->row_loss = tg_mem_alloc((size_t)a->n_pos * sizeof(double), 64);
  if (!a->row_loss)
    return tg_fail(ctx, TG_ERR_NO_MEMORY, "%s: cannot allocate %lld per-position losses", fn,
                   (long long)a->n_pos);
  tg_status st = tg_dispatch(ctx, (a->n_pos + a->rpg - 1) / a->rpg, 1, 1,
                             ce_scratch_bytes(a->vocab, a->nchunks), ce_group, a);
  if (st == TG_OK) {
    double total = 0.0; /* position order, whatever the thread count */
    for (int64_t t = 0; t < a->n_pos; t++) total += a->row_loss[t];
    loss_out[0] = (float)((double)loss_out[0] + total / count);
  }
  tg_mem_free(a->row_loss);
  return st;
}

/* The four buffers both entry points take: TG_ERR_NULL_ARG naming the first
 * that is NULL. */
static tg_status ce_check_null(tg_ctx *ctx, const char *fn, const void *logits,
                               const void *targets, const void *grad, const float *loss_out) {
  const char *null = !logits    ? "logits"
                     : !targets ? "targets"
                     : !grad    ? "grad"
                     : !loss_out ? "loss_out"
                                 : NULL;
  return null ? tg_fail(ctx, TG_ERR_NULL_ARG, "%s: %s is NULL", fn, null) : TG_OK;
}

tg_status tg_cross_entropy_fwd_bwd(tg_ctx *ctx, const float *logits,
                                   const uint32_t *targets, float *grad, float *loss_out,
                                   uint32_t n_pos, uint32_t vocab, uint32_t pad_id,
                                   uint32_t count) {
  static const char fn[] = "tg_cross_entropy_fwd_bwd";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = ce_check_null(ctx, fn, logits, targets, grad, loss_out);
  if (st != TG_OK) return st;
  char name[160];
  snprintf(name, sizeof name, "%s: logits[n_pos = %u, vocab = %u]", fn, n_pos, vocab);
  int64_t n;
  st = tg_shape_count(ctx, name, sizeof(float), &n, 2, (int64_t)n_pos, (int64_t)vocab);
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

  ce_args a = {.logits = logits, .t32 = targets, .grad = grad, .n_pos = n_pos,
               .vocab = vocab, .ld = vocab, .ignore = pad_id,
               .inv_count = 1.0f / (float)count,
               .stream = n * (int64_t)sizeof(float) >= TG_STREAM_BYTES};
  return ce_run(ctx, fn, &a, (double)count, loss_out);
}

tg_status tg_cross_entropy_fwd_bwd_ex(tg_ctx *ctx, tg_dtype dtype, const void *logits,
                                      const int64_t *targets, void *grad, float *loss_out,
                                      uint32_t n_pos, uint32_t vocab, uint64_t row_stride,
                                      double count, const tg_ce_options *opt) {
  static const char fn[] = "tg_cross_entropy_fwd_bwd_ex";
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  tg_status st = ce_check_null(ctx, fn, logits, targets, grad, loss_out);
  if (st != TG_OK) return st;
  if (dtype != TG_DTYPE_F32 && dtype != TG_DTYPE_BF16)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: dtype = %d is not TG_DTYPE_F32 (%d) or "
                   "TG_DTYPE_BF16 (%d)", fn, (int)dtype, (int)TG_DTYPE_F32, (int)TG_DTYPE_BF16);
  const tg_ce_options o = opt ? *opt : (tg_ce_options)TG_CE_OPTIONS_INIT;
  if (o.flags)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: opt->flags = 0x%x: no flags are defined", fn,
                   o.flags);
  if (!(count > 0.0) || !isfinite(count))
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: count = %g must be finite and > 0", fn, count);
  if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f))
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: opt->label_smoothing = %g is not in [0, 1]",
                   fn, (double)o.label_smoothing);
  if (!isfinite(o.grad_scale))
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: opt->grad_scale = %g is not finite", fn,
                   (double)o.grad_scale);
  const uint64_t ld = row_stride ? row_stride : vocab;
  const size_t esize = dtype == TG_DTYPE_BF16 ? sizeof(tg_bf16) : sizeof(float);
  char name[200];
  snprintf(name, sizeof name, "%s: logits[n_pos = %u, vocab = %u]", fn, n_pos, vocab);
  int64_t n;
  st = tg_shape_count(ctx, name, esize, &n, 2, (int64_t)n_pos, (int64_t)vocab);
  if (st != TG_OK) return st;
  if (ld < vocab)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: row_stride = %llu < vocab = %u", fn,
                   (unsigned long long)ld, vocab);
  /* the extent: (n_pos - 1) rows of ld, then one of vocab */
  int64_t ext;
  if (ld > (uint64_t)INT64_MAX || !tg_mul_ok(&ext, 2, (int64_t)(n_pos - 1), (int64_t)ld) ||
      ext > INT64_MAX / (int64_t)esize - (int64_t)vocab)
    return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: logits' extent (n_pos - 1) * row_stride + "
                   "vocab = (%u - 1) * %llu + %u elements overflows int64 bytes", fn, n_pos,
                   (unsigned long long)ld, vocab);
  const uint64_t bytes = (uint64_t)(ext + vocab) * esize;
  /* grad may be logits itself (same rows, same stride): a work item reads
   * each of its rows whole (into scratch) before it writes that row's grad,
   * and no other item touches the row. */
  const tg_buf bufs[] = {tg_in("logits", logits, bytes),
                         tg_in("targets", targets, (uint64_t)n_pos * sizeof(int64_t)),
                         tg_out_in_place("grad", grad, bytes, "logits"),
                         tg_out("loss_out", loss_out, sizeof(float))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  for (int64_t t = 0; t < n_pos; t++)
    if (targets[t] != o.ignore_index && (targets[t] < 0 || targets[t] >= vocab))
      return tg_fail(ctx, TG_ERR_BAD_INDEX,
                     "%s: targets[%lld] = %lld is outside [0, vocab = %u) and is not "
                     "ignore_index = %lld", fn, (long long)t, (long long)targets[t], vocab,
                     (long long)o.ignore_index);

  const float b = (float)((double)o.grad_scale / count);
  ce_args a = {.logits = logits, .t64 = targets, .grad = grad, .n_pos = n_pos,
               .vocab = vocab, .ld = (int64_t)ld, .ignore = o.ignore_index,
               .inv_count = b, .eps = o.label_smoothing,
               .eps_shift = o.label_smoothing / (float)vocab * b,
               .bf16 = dtype == TG_DTYPE_BF16,
               .stream = (int64_t)bytes >= TG_STREAM_BYTES};
  a.staged = a.bf16 || a.eps != 0.0f;
  return ce_run(ctx, fn, &a, count, loss_out);
}
