// cross_entropy.metal -- cross-entropy forward + backward (tilegrad kernel 8).
//
// For position t with target y = targets[t] and logits row l = logits[t, :]:
//   pad (y == pad_id):  grad[t, :] = 0
//   otherwise:          m = max_j l[j],  S = sum_j exp(l[j] - m)
//                       loss_out[0] += (log S - (l[y] - m)) / count   (atomic)
//                       grad[t, j]   = (exp(l[j] - m) / S - [j == y]) / count
// count == 0: nothing is read or written (as the seed).
//
// Host name cross_entropy_fwd_bwd.
//   buffer(0)  logits    float[n_pos, vocab]
//   buffer(1)  targets   uint[n_pos]
//   buffer(2)  grad      float[n_pos, vocab]  (writes)
//   buffer(3)  loss_out  atomic float[1]      (accumulates)
//   buffer(4)  params    uint[4] = {n_pos, vocab, pad_id, count}
// Grid: one threadgroup per position (n_pos, 1, 1); threadgroup <= 1024.
//
// tilegrad's fixes over the seed:
//   - a row whose logits are all -inf takes the equal-logits limit:
//     grad = (1/vocab - onehot) / count and loss += +inf (the seed: NaN);
//     a NaN among the logits gives NaN, never hidden;
//   - a non-pad target >= vocab (the C engine's TG_ERR_BAD_INDEX) writes a
//     NaN grad row and adds NaN to the loss, so bad input cannot pass silently
//     and nothing is read out of bounds.
#include <metal_stdlib>
using namespace metal;

// Threadgroup-wide sum / max; scratch holds one value per simdgroup.
static inline float tg_sum(float v, threadgroup float *scratch, uint tid, uint tg_size) {
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid % 32 == 0) scratch[tid / 32] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_sum(tid % 32 < (tg_size + 31) / 32 ? scratch[tid % 32] : 0.0f);
}
static inline float tg_max(float v, threadgroup float *scratch, uint tid, uint tg_size) {
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid % 32 == 0) scratch[tid / 32] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_max(tid % 32 < (tg_size + 31) / 32 ? scratch[tid % 32] : -INFINITY);
}

kernel void cross_entropy_fwd_bwd(
    const device float  *logits   [[buffer(0)]],
    const device uint   *targets  [[buffer(1)]],
    device float        *grad     [[buffer(2)]],
    device atomic_float *loss_out [[buffer(3)]],
    const device uint   *params   [[buffer(4)]],
    uint pos     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  const uint n_pos = params[0], vocab = params[1], pad_id = params[2], count = params[3];
  threadgroup float scratch[32];
  if (pos >= n_pos || count == 0) return;  // uniform for the threadgroup
  const uint y = targets[pos];
  const ulong base = (ulong)pos * vocab;
  const device float *l = logits + base;
  device float *g = grad + base;
  const float inv_count = 1.0f / float(count);

  if (y == pad_id) {
    for (uint j = tid; j < vocab; j += tg_size) g[j] = 0.0f;
    return;
  }
  if (y >= vocab) {  // bad target: poison this row's outputs
    for (uint j = tid; j < vocab; j += tg_size) g[j] = NAN;
    if (tid == 0) atomic_fetch_add_explicit(loss_out, NAN, memory_order_relaxed);
    return;
  }

  // m = max_j l[j] (NaN entries are skipped here and caught below)
  float mx = -INFINITY;
  for (uint j = tid; j < vocab; j += tg_size) mx = fmax(mx, l[j]);
  const float m = tg_max(mx, scratch, tid, tg_size);

  if (m == -INFINITY) {  // all -inf (or NaN): equal-logits limit, NaN if any NaN
    float nan_seen = 0.0f;
    for (uint j = tid; j < vocab; j += tg_size) nan_seen = fmax(nan_seen, isnan(l[j]) ? 1.0f : 0.0f);
    const bool has_nan = tg_max(nan_seen, scratch, tid, tg_size) > 0.0f;
    const float p = has_nan ? NAN : 1.0f / float(vocab);
    for (uint j = tid; j < vocab; j += tg_size) g[j] = (p - (j == y ? 1.0f : 0.0f)) * inv_count;
    if (tid == 0)
      atomic_fetch_add_explicit(loss_out, has_nan ? NAN : INFINITY, memory_order_relaxed);
    return;
  }

  float acc = 0.0f;
  for (uint j = tid; j < vocab; j += tg_size) acc += exp(l[j] - m);
  const float S = tg_sum(acc, scratch, tid, tg_size);
  if (tid == 0) {
    const float loss_t = log(S) - (l[y] - m);
    atomic_fetch_add_explicit(loss_out, loss_t / float(count), memory_order_relaxed);
  }
  const float inv_S = 1.0f / S;
  for (uint j = tid; j < vocab; j += tg_size)
    g[j] = (exp(l[j] - m) * inv_S - (j == y ? 1.0f : 0.0f)) * inv_count;
}

// ---------------------------------------------------------------------------
// cross_entropy_fwd_bwd_ex_{f32,bf16} -- tg_cross_entropy_fwd_bwd_ex: PyTorch's
// cross-entropy (int64 targets with ignore_index, a divisor count, label
// smoothing eps, a grad scale, rows row_stride elements apart). For position
// t, y = targets[t], b = grad_scale / count, z = logits[t, :]:
//   y == ignore_index:  grad[t, :] = 0, no loss
//   otherwise:          m = max_j z_j, S = sum_j exp(z_j - m)
//     loss_out[0] += ((1 - eps)(log S - (z_y - m)) + eps (log S - (mean_j z_j - m))) / count
//     grad[t, j]   = (exp(z_j - m) / S - (1 - eps)[j == y]) b - eps / vocab b
// The bf16 kernel reads bf16 logits and writes the f32 grad rounded to bf16;
// grad may be logits (in place: a threadgroup reads its row whole, through
// the max and the sum, before it writes it).
//
//   buffer(0)  logits    float or bfloat, row t at t * row_stride
//   buffer(1)  targets   long[n_pos]
//   buffer(2)  grad      like logits (writes; the gaps between rows untouched)
//   buffer(3)  loss_out  atomic float[1] (accumulates)
//   buffer(4)  params    ce_ex_params: the C call's scalars in its order and
//                        its tg_ce_options fields, with count as a float
//                        (Metal has no double: the host rounds it)
// Grid: one threadgroup per position (n_pos, 1, 1); threadgroup <= 1024.
// As the seed's twin, a target outside [0, vocab) that is not ignore_index
// (the C engine's TG_ERR_BAD_INDEX) writes a NaN row and adds NaN to the
// loss; a row of only -inf takes the equal-logits limit (loss +inf); the C
// engine's other checks (count > 0, eps in [0, 1], ...) are the host's.
struct ce_ex_params {
  uint n_pos, vocab;
  ulong row_stride;     // elements; >= vocab
  float count;          // the divisor, > 0
  float label_smoothing, grad_scale;
  uint flags;           // 0
  long ignore_index;
};

template <typename T>
static inline void ce_ex_row(const device T *logits, const device long *targets,
                             device T *grad, device atomic_float *loss_out,
                             const device ce_ex_params &p, threadgroup float *scratch,
                             uint pos, uint tid, uint tg_size) {
  if (pos >= p.n_pos) return;
  const uint vocab = p.vocab;
  const long y = targets[pos];
  const ulong base = (ulong)pos * p.row_stride;
  const device T *l = logits + base;
  device T *g = grad + base;
  const float eps = p.label_smoothing;
  const float b = p.grad_scale / p.count, shift = eps / float(vocab) * b;
  const float hit = 1.0f - eps;

  if (y == p.ignore_index) {
    for (uint j = tid; j < vocab; j += tg_size) g[j] = T(0.0f);
    return;
  }
  if (y < 0 || y >= (long)vocab) {  // bad target: poison this row's outputs
    threadgroup_barrier(mem_flags::mem_device);
    for (uint j = tid; j < vocab; j += tg_size) g[j] = T(NAN);
    if (tid == 0) atomic_fetch_add_explicit(loss_out, NAN, memory_order_relaxed);
    return;
  }
  const uint yu = (uint)y;

  float mx = -INFINITY;
  for (uint j = tid; j < vocab; j += tg_size) mx = fmax(mx, float(l[j]));
  const float m = tg_max(mx, scratch, tid, tg_size);

  if (m == -INFINITY) {  // all -inf (or NaN): equal-logits limit, NaN if any NaN
    float nan_seen = 0.0f;
    for (uint j = tid; j < vocab; j += tg_size) nan_seen = fmax(nan_seen, isnan(float(l[j])) ? 1.0f : 0.0f);
    const bool has_nan = tg_max(nan_seen, scratch, tid, tg_size) > 0.0f;
    const float pj = has_nan ? NAN : 1.0f / float(vocab);
    threadgroup_barrier(mem_flags::mem_device);  // every read done before an in-place write
    for (uint j = tid; j < vocab; j += tg_size) {
      const float v = (pj - (j == yu ? hit : 0.0f)) * b;
      g[j] = T(eps != 0.0f ? v - shift : v);
    }
    if (tid == 0)
      atomic_fetch_add_explicit(loss_out, has_nan ? NAN : INFINITY, memory_order_relaxed);
    return;
  }

  float acc = 0.0f, zacc = 0.0f;
  for (uint j = tid; j < vocab; j += tg_size) {
    acc += exp(float(l[j]) - m);
    zacc += float(l[j]);
  }
  const float S = tg_sum(acc, scratch, tid, tg_size);
  const float zsum = eps != 0.0f ? tg_sum(zacc, scratch, tid, tg_size) : 0.0f;
  const float zy = float(l[yu]);
  threadgroup_barrier(mem_flags::mem_device);  // every read of l[y] done before a write
  if (tid == 0) {
    const float nll = log(S) - (zy - m);
    const float loss_t =
        eps != 0.0f ? hit * nll + eps * (log(S) - (zsum / float(vocab) - m)) : nll;
    atomic_fetch_add_explicit(loss_out, loss_t / p.count, memory_order_relaxed);
  }
  const float inv_S = 1.0f / S;
  for (uint j = tid; j < vocab; j += tg_size) {
    const float v = (exp(float(l[j]) - m) * inv_S - (j == yu ? hit : 0.0f)) * b;
    g[j] = T(eps != 0.0f ? v - shift : v);
  }
}

kernel void cross_entropy_fwd_bwd_ex_f32(
    const device float  *logits   [[buffer(0)]],
    const device long   *targets  [[buffer(1)]],
    device float        *grad     [[buffer(2)]],
    device atomic_float *loss_out [[buffer(3)]],
    const device ce_ex_params *params [[buffer(4)]],
    uint pos     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  threadgroup float scratch[32];
  ce_ex_row<float>(logits, targets, grad, loss_out, *params, scratch, pos, tid, tg_size);
}

kernel void cross_entropy_fwd_bwd_ex_bf16(
    const device bfloat *logits   [[buffer(0)]],
    const device long   *targets  [[buffer(1)]],
    device bfloat       *grad     [[buffer(2)]],
    device atomic_float *loss_out [[buffer(3)]],
    const device ce_ex_params *params [[buffer(4)]],
    uint pos     [[threadgroup_position_in_grid]],
    uint tid     [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]) {
  threadgroup float scratch[32];
  ce_ex_row<bfloat>(logits, targets, grad, loss_out, *params, scratch, pos, tid, tg_size);
}
