/* 7. Embedding backward.
 *
 *   grad_out    [seq_len, dim]      f32
 *   ids         [seq_len]           u32, each < vocab_size
 *   grad_weight [vocab_size, dim]   f32, accumulates
 *
 *   grad_weight[ids[t], d] += grad_out[t, d]     for every t, d
 *
 * Repeated ids add up. Every id is checked before anything is written.
 *
 * Metal: one thread per token t, adding its whole row into grad_weight with
 * atomic_fetch_add, so tokens that share an id race on the same row.
 *
 * CPU: atomic-free. The grid is (column block, vocab block). Group (cb, vb)
 * owns grad_weight[vb's rows, cb's columns] outright; it sorts the tokens
 * whose id falls in its rows by id, stably (a counting sort), and applies
 * them in that order. Every element of grad_weight therefore receives its
 * additions in token order, one after the other:
 *
 *   grad_weight[v, d] = ((gw + grad_out[t1, d]) + grad_out[t2, d]) + ...
 *                       (t1 < t2 < ... the tokens with id v)
 *
 * whatever the blocking or thread count, so the result is bitwise identical
 * across runs and thread counts in both modes (ctx->deterministic needs
 * nothing extra). The sort makes each row of grad_weight read and written
 * once, however often its id repeats. Column blocks are wide -- dim / threads
 * columns, clamped to 4..16 KiB of a row -- so a group reads and adds long
 * contiguous runs (one ISA-layer add per token), while a heavily repeated id
 * of a wide table is still split over about one column block per thread.
 * The rest of the parallelism comes from vocab blocks, each of which rescans
 * ids (4 bytes per token), cheap next to the row adds.
 */
#include "engine.h"

typedef struct {
  const float *grad_out;
  const uint32_t *ids;
  float *grad_weight;
  int64_t seq_len, dim, vocab;
  int64_t cols_per_block, rows_per_block;
  const tg_isa_ops *ops;
} emb_args;

static void prefetch_piece(const float *p, int64_t n, int write) {
  for (int64_t i = 0; i < n; i += 16) {
    if (write) __builtin_prefetch(p + i, 1, 3);
    else __builtin_prefetch(p + i, 0, 3);
  }
}

/* Group (cb, vb): grad_weight[v, c0:c1] += grad_out[t, c0:c1] for every t in
 * order whose id v lies in [v0, v1). The group's tokens are first sorted by
 * id with a stable counting sort (scratch: the counts, then the sorted
 * tokens), so each row of grad_weight is read and written once however often
 * its id repeats (in token order its repeats were far apart, and the row
 * went back to memory in between), while each element still receives its
 * adds in token order: the bits are those of the token-order walk. */
static void embedding_backward_group(const void *vargs, int64_t cb, int64_t vb, int64_t z,
                                     void *scratch) {
  const emb_args *a = vargs;
  const int64_t c0 = cb * a->cols_per_block;
  const int64_t c1 = c0 + a->cols_per_block < a->dim ? c0 + a->cols_per_block : a->dim;
  const int64_t v0 = vb * a->rows_per_block;
  const int64_t v1 = v0 + a->rows_per_block < a->vocab ? v0 + a->rows_per_block : a->vocab;
  uint32_t *start = scratch;                      /* [v1 - v0 + 1] */
  uint32_t *order = start + a->rows_per_block + 1; /* [tokens in the group] */
  for (int64_t v = 0; v <= v1 - v0; v++) start[v] = 0;
  for (int64_t t = 0; t < a->seq_len; t++) {
    const int64_t v = a->ids[t];
    if (v >= v0 && v < v1) start[v - v0 + 1]++;
  }
  for (int64_t v = 0; v < v1 - v0; v++) start[v + 1] += start[v];
  const int64_t n = start[v1 - v0];
  for (int64_t t = 0; t < a->seq_len; t++) {
    const int64_t v = a->ids[t];
    if (v >= v0 && v < v1) order[start[v - v0]++] = (uint32_t)t;
  }
  for (int64_t i = 0; i < n; i++) {
    if (i + TG_EMB_PF_AHEAD < n) {
      const int64_t tp = order[i + TG_EMB_PF_AHEAD], vp = a->ids[tp];
      prefetch_piece(a->grad_out + tp * a->dim + c0, c1 - c0, 0);
      if (vp != a->ids[order[i + TG_EMB_PF_AHEAD - 1]])
        prefetch_piece(a->grad_weight + vp * a->dim + c0, c1 - c0, 1);
    }
    const int64_t t = order[i];
    a->ops->add_f32(a->grad_weight + a->ids[t] * a->dim + c0, a->grad_out + t * a->dim + c0,
                    c1 - c0);
  }
}

tg_status tg_embedding_backward(tg_ctx *ctx, const float *grad_out, const uint32_t *ids,
                                float *grad_weight, uint32_t vocab_size, uint32_t seq_len,
                                uint32_t dim) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  static const char fn[] = "tg_embedding_backward";
  if (!grad_out) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: grad_out is NULL", fn);
  if (!ids) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: ids is NULL", fn);
  if (!grad_weight) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: grad_weight is NULL", fn);
  if (vocab_size == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: vocab_size is 0; it must be >= 1", fn);
  if (seq_len == 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: seq_len is 0; it must be >= 1", fn);
  if (dim == 0) return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: dim is 0; it must be >= 1", fn);
  tg_status st;
  if ((st = tg_shape_count(ctx, "tg_embedding_backward: grad_out [seq_len, dim]",
                           sizeof(float), NULL, 2, (int64_t)seq_len, (int64_t)dim)))
    return st;
  if ((st = tg_shape_count(ctx, "tg_embedding_backward: grad_weight [vocab_size, dim]",
                           sizeof(float), NULL, 2, (int64_t)vocab_size, (int64_t)dim)))
    return st;
  /* grad_weight rows are read and written while other work items read
   * grad_out and ids: no overlap with either (not even exact). */
  const tg_buf bufs[] = {
      tg_in("grad_out", grad_out, (uint64_t)seq_len * dim * sizeof(float)),
      tg_in("ids", ids, (uint64_t)seq_len * sizeof(uint32_t)),
      tg_out("grad_weight", grad_weight, (uint64_t)vocab_size * dim * sizeof(float))};
  if ((st = tg_check_alias(ctx, fn, bufs, TG_LEN(bufs)))) return st;
  /* Every id before any write: the first bad one is reported. */
  for (int64_t t = 0; t < (int64_t)seq_len; t++)
    if (ids[t] >= vocab_size)
      return tg_fail(ctx, TG_ERR_BAD_INDEX,
                     "%s: ids[%lld] = %u is out of range; vocab_size is %u", fn,
                     (long long)t, ids[t], vocab_size);

  /* Blocking changes speed only, never bits (see the header comment). */
  const int64_t threads = tg_threads(ctx), target = threads * TG_EMB_GROUPS_PER_THREAD;
  int64_t cols = (((int64_t)dim + threads - 1) / threads + 15) & ~(int64_t)15;
  cols = cols < TG_EMB_COLS_MIN ? TG_EMB_COLS_MIN : cols > TG_EMB_COLS_MAX ? TG_EMB_COLS_MAX : cols;
  const int64_t ncb = ((int64_t)dim + cols - 1) / cols;
  int64_t nvb = 1;
  if (ncb < target) {
    nvb = (target + ncb - 1) / ncb;
    if (nvb > (int64_t)vocab_size) nvb = vocab_size;
  }
  const int64_t rows_per_block = ((int64_t)vocab_size + nvb - 1) / nvb;
  nvb = ((int64_t)vocab_size + rows_per_block - 1) / rows_per_block;
  const emb_args a = {.grad_out = grad_out, .ids = ids, .grad_weight = grad_weight,
                      .seq_len = seq_len, .dim = dim, .vocab = vocab_size,
                      .cols_per_block = cols, .rows_per_block = rows_per_block,
                      .ops = ctx->ops};
  /* scratch: the counting sort's starts and the sorted tokens */
  const size_t scratch = ((size_t)rows_per_block + 1 + seq_len) * sizeof(uint32_t);
  return tg_dispatch(ctx, ncb, nvb, 1, scratch, embedding_backward_group, &a);
}
