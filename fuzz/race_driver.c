/*
 * Race-check driver: every kernel, built with -fsanitize=thread against
 * LLVM's OpenMP runtime with the Archer OMPT tool loaded (scripts/race_check.sh),
 * at 2, 3 and 7 threads. ThreadSanitizer reports any unsynchronised pair of
 * accesses; Archer tells it about OpenMP's own synchronisation (fork/join,
 * barriers, the dynamic loop's dispatch), which the uninstrumented libomp
 * would otherwise hide.
 *
 * What runs, and why:
 *   - FA-2 backward on both dK/dV schedules (tg_ctx_set_attn_schedule): KV
 *     (owned dK/dV rows; one key range, and several with dQ partials) and
 *     ATOMIC (the Metal grid, omp atomic adds), and ATOMIC asked for in
 *     deterministic mode (which must run KV), with GQA, causal, mask, softcap;
 *   - FA-2 forward and the compute_d pre-pass;
 *   - fused RMSNorm backward in both modes (per-thread partials + atomic adds;
 *     heap partials + column reduce), the split kernels;
 *   - embedding backward (vocab blocks and column blocks);
 *   - cross-entropy (per-row losses, serial sum);
 *   - causal attention backward (two passes, no atomics);
 *   - softmax, transpose, cast, decode reduce (+ Hadamard undo);
 *   - the in-place cast (dst == src: doubling rounds, the rounds past 2^17
 *     elements in parallel) and the in-place softmax (grad_in == grad_out).
 * Each kernel is also checked for its documented determinism: outputs at 2, 3
 * and 7 threads bitwise equal to 1 thread where the kernel promises it (all
 * of them in deterministic mode), within 1e-3 relative for the atomic paths.
 * Exit status 0 = all checks passed (TSan itself exits non-zero on a report
 * with halt_on_error / exitcode, see race_check.sh).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tilegrad.h"

static int failures;
static uint64_t rs = 12345;
static float uni(float lo, float hi) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)(rs >> 40) * 0x1p-24f;
}
static uint16_t bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}
static float *f32(int64_t n, float lo, float hi) {
  float *p = xmalloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) p[i] = uni(lo, hi);
  return p;
}
static uint16_t *b16(int64_t n, float lo, float hi) {
  uint16_t *p = xmalloc(2 * (size_t)n);
  for (int64_t i = 0; i < n; i++) p[i] = bf(uni(lo, hi));
  return p;
}
/* TSan sees a race only between accesses that really run on two threads. A
 * kernel with a few short groups can finish on the calling thread before the
 * workers arrive; so every context first runs a warm-up region with enough
 * work for all its threads (the pool then spins, KMP_BLOCKTIME, and joins the
 * next region at once). */
static void warm_up(tg_ctx *c) {
  enum { R = 512, C = 512 };
  static float in[R * C], out[R * C];
  for (int rep = 0; rep < 2; rep++)
    if (tg_transpose_2d(c, in, out, R, C) != TG_OK) abort();
}
static tg_ctx *ctx_of(int threads, int det) {
  tg_ctx *c;
  if (tg_ctx_create(&c) || tg_ctx_set_threads(c, threads) || tg_ctx_set_deterministic(c, det))
    abort();
  warm_up(c);
  return c;
}
static void expect_ok(tg_ctx *c, tg_status s, const char *what) {
  if (s != TG_OK) {
    fprintf(stderr, "race_driver: %s failed: %s\n", what, tg_ctx_last_error(c));
    exit(2);
  }
}
/* exact (1): bitwise; else |a - b| <= TOL (1 + |b|): the atomic paths only
 * reorder f32 additions (a lost update would be off by a whole term). */
#define TOL 1e-3f
static void compare(const char *what, int threads, const float *a, const float *b, int64_t n,
                    int exact) {
  for (int64_t i = 0; i < n; i++) {
    const int bad = exact ? memcmp(&a[i], &b[i], 4) != 0
                          : !(fabsf(a[i] - b[i]) <= TOL * (1 + fabsf(b[i])));
    if (bad) {
      fprintf(stderr, "race_driver: %s, %d threads: [%lld] %.9g vs 1 thread %.9g\n", what,
              threads, (long long)i, (double)a[i], (double)b[i]);
      failures++;
      return;
    }
  }
}

static const int T[] = {1, 2, 3, 7};
enum { NT = 4 };

/* --- FA-2 ------------------------------------------------------------------- */
static void attention(int B, int H, int Hkv, int qL, int kL, int D, int det,
                      tg_attn_schedule sched) {
  tg_attn_params p;
  tg_attn_params_init(&p, B, H, Hkv, qL, kL, D, 1.0f / sqrtf((float)D));
  p.softcapping = 20.0f;
  const int64_t nq = (int64_t)B * H * qL * D, nk = (int64_t)B * Hkv * kL * D,
                nr = (int64_t)B * H * qL, nm = (int64_t)B * H * qL * kL;
  tg_attn_mask_params mp = {{(int64_t)H * qL * kL, (int64_t)qL * kL, kL}};
  uint16_t *Q = b16(nq, -2, 2), *K = b16(nk, -2, 2), *V = b16(nk, -1, 1), *dO = b16(nq, -1, 1);
  uint16_t *mask = b16(nm, -2, 1), *O = xmalloc(2 * (size_t)nq);
  for (int64_t i = 0; i < nm; i += 7) mask[i] = 0xFF80; /* -inf */
  float *L = xmalloc(4 * (size_t)nr), *Dv = xmalloc(4 * (size_t)nr);
  float *dK0 = f32(nk, -1, 1), *dV0 = f32(nk, -1, 1);
  float *ref[3] = {xmalloc(4 * (size_t)nq), xmalloc(4 * (size_t)nk), xmalloc(4 * (size_t)nk)};
  float *out[3] = {xmalloc(4 * (size_t)nq), xmalloc(4 * (size_t)nk), xmalloc(4 * (size_t)nk)};
  uint16_t *O1 = xmalloc(2 * (size_t)nq);
  float *L1 = xmalloc(4 * (size_t)nr);
  for (int t = 0; t < NT; t++) {
    tg_ctx *c = ctx_of(T[t], det);
    if (tg_ctx_set_attn_schedule(c, sched) != TG_OK) abort();
    /* forward + pre-pass, then backward */
    expect_ok(c, tg_flash_attn_train_fwd_bf16(c, Q, K, V, O, L, &p, &mp, mask, 1), "fwd");
    expect_ok(c, tg_flash_attn_train_bwd_compute_d_bf16(c, O, dO, Dv, B, H, qL, D), "compute_d");
    float **o = t ? out : ref;
    memcpy(o[1], dK0, 4 * (size_t)nk);
    memcpy(o[2], dV0, 4 * (size_t)nk);
    expect_ok(c, tg_flash_attn_train_bwd_bf16(c, Q, K, V, L, dO, Dv, o[0], o[1], o[2], &p, &mp,
                                              mask, 1),
              "bwd");
    if (t == 0) {
      memcpy(O1, O, 2 * (size_t)nq);
      memcpy(L1, L, 4 * (size_t)nr);
    } else {
      const int atomic = !det && sched == TG_ATTN_SCHEDULE_ATOMIC;
      char what[96];
      snprintf(what, sizeof what, "FA-2 %s schedule", atomic ? "ATOMIC" : "KV");
      if (memcmp(O, O1, 2 * (size_t)nq) || memcmp(L, L1, 4 * (size_t)nr)) {
        fprintf(stderr, "race_driver: FA-2 forward differs at %d threads\n", T[t]);
        failures++;
      }
      compare(what, T[t], o[0], ref[0], nq, 1); /* dQ: one writer per row */
      compare(what, T[t], o[1], ref[1], nk, !atomic);
      compare(what, T[t], o[2], ref[2], nk, !atomic);
    }
    tg_ctx_destroy(c);
  }
  printf("  FA-2 fwd/bwd B %d H %d H_kv %d qL %d kL %d D %d det %d schedule %s: ok\n", B, H,
         Hkv, qL, kL, D, det, sched == TG_ATTN_SCHEDULE_ATOMIC ? "ATOMIC" : "KV");
  free(Q), free(K), free(V), free(dO), free(mask), free(O), free(L), free(Dv), free(dK0);
  free(dV0), free(O1), free(L1);
  for (int i = 0; i < 3; i++) free(ref[i]), free(out[i]);
}

/* --- row kernels ------------------------------------------------------------- */
static void rmsnorm(uint32_t rows, uint32_t dim, int det) {
  const int64_t n = (int64_t)rows * dim;
  float *x = f32(n, -2, 2), *w = f32(dim, -1, 1), *dy = f32(n, -1, 1), *gw0 = f32(dim, -1, 1);
  float *gi[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)};
  float *gw[2] = {xmalloc(4 * (size_t)dim), xmalloc(4 * (size_t)dim)};
  float *r[2] = {xmalloc(4 * (size_t)rows), xmalloc(4 * (size_t)rows)};
  float *dx[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)};
  float *dw[2] = {xmalloc(4 * (size_t)dim), xmalloc(4 * (size_t)dim)};
  float *y[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)};
  for (int t = 0; t < NT; t++) {
    const int k = t ? 1 : 0;
    tg_ctx *c = ctx_of(T[t], det);
    memcpy(gw[k], gw0, 4 * (size_t)dim);
    expect_ok(c, tg_rms_norm_backward(c, x, w, dy, gi[k], gw[k], rows, dim, 1e-5f), "fused");
    expect_ok(c, tg_rms_norm_forward_f32(c, x, w, y[k], r[k], rows, dim, 1e-5f), "rms fwd");
    expect_ok(c, tg_rms_norm_compute_rms_inv_f32(c, x, r[k], rows, dim, 1e-5f), "rms_inv");
    expect_ok(c, tg_rms_norm_backward_dx_f32(c, x, w, dy, r[k], dx[k], rows, dim), "dx");
    expect_ok(c, tg_rms_norm_backward_dw_f32(c, x, dy, r[k], dw[k], rows, dim), "dw");
    if (t) {
      compare("fused grad_input", T[t], gi[1], gi[0], n, 1);
      compare(det ? "fused grad_weight (det)" : "fused grad_weight (atomic)", T[t], gw[1], gw[0],
              dim, det);
      compare("rms forward", T[t], y[1], y[0], n, 1);
      compare("rms_inv", T[t], r[1], r[0], rows, 1);
      compare("dx", T[t], dx[1], dx[0], n, 1);
      compare("dw", T[t], dw[1], dw[0], dim, 1);
    }
    tg_ctx_destroy(c);
  }
  printf("  RMSNorm %ux%u det %d (fused, forward, rms_inv, dx, dw): ok\n", rows, dim, det);
  free(x), free(w), free(dy), free(gw0);
  for (int i = 0; i < 2; i++) free(gi[i]), free(gw[i]), free(r[i]), free(dx[i]), free(dw[i]), free(y[i]);
}

static void embedding(uint32_t vocab, uint32_t seq, uint32_t dim, int det) {
  float *g = f32((int64_t)seq * dim, -1, 1), *gw0 = f32((int64_t)vocab * dim, -1, 1);
  uint32_t *ids = xmalloc(4 * (size_t)seq);
  for (uint32_t t = 0; t < seq; t++) ids[t] = (t % 3) ? (uint32_t)(uni(0, 1) * vocab) % vocab : 1;
  float *gw[2] = {xmalloc(4 * (size_t)vocab * dim), xmalloc(4 * (size_t)vocab * dim)};
  for (int t = 0; t < NT; t++) {
    const int k = t ? 1 : 0;
    tg_ctx *c = ctx_of(T[t], det);
    memcpy(gw[k], gw0, 4 * (size_t)vocab * dim);
    expect_ok(c, tg_embedding_backward(c, g, ids, gw[k], vocab, seq, dim), "embedding");
    if (t) compare("embedding", T[t], gw[1], gw[0], (int64_t)vocab * dim, 1);
    tg_ctx_destroy(c);
  }
  printf("  embedding vocab %u seq %u dim %u det %d: ok\n", vocab, seq, dim, det);
  free(g), free(gw0), free(ids), free(gw[0]), free(gw[1]);
}

static void cross_entropy(uint32_t n_pos, uint32_t vocab, int det) {
  const int64_t n = (int64_t)n_pos * vocab;
  float *l = f32(n, -8, 8);
  uint32_t *tg = xmalloc(4 * (size_t)n_pos);
  for (uint32_t t = 0; t < n_pos; t++) tg[t] = (t % 5 == 0) ? vocab : (uint32_t)(uni(0, 1) * vocab) % vocab;
  float *g[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)}, loss[2];
  for (int t = 0; t < NT; t++) {
    const int k = t ? 1 : 0;
    tg_ctx *c = ctx_of(T[t], det);
    loss[k] = 0.25f;
    expect_ok(c, tg_cross_entropy_fwd_bwd(c, l, tg, g[k], &loss[k], n_pos, vocab, vocab, n_pos),
              "cross-entropy");
    if (t) {
      compare("cross-entropy grad", T[t], g[1], g[0], n, 1);
      compare("cross-entropy loss", T[t], &loss[1], &loss[0], 1, 1);
    }
    tg_ctx_destroy(c);
  }
  printf("  cross-entropy %ux%u det %d: ok\n", n_pos, vocab, det);
  free(l), free(tg), free(g[0]), free(g[1]);
}

static void causal(uint32_t seq, uint32_t nh, uint32_t nkv, uint32_t hd, int det) {
  const int64_t nq = (int64_t)seq * nh * hd, nk = (int64_t)seq * nkv * hd;
  float *dO = f32(nq, -1, 1), *Q = f32(nq, -1, 1), *K = f32(nk, -1, 1), *V = f32(nk, -1, 1);
  float *k0 = f32(nk, -1, 1), *v0 = f32(nk, -1, 1);
  float *o[2][3];
  for (int i = 0; i < 2; i++)
    o[i][0] = xmalloc(4 * (size_t)nq), o[i][1] = xmalloc(4 * (size_t)nk), o[i][2] = xmalloc(4 * (size_t)nk);
  for (int t = 0; t < NT; t++) {
    const int k = t ? 1 : 0;
    tg_ctx *c = ctx_of(T[t], det);
    memcpy(o[k][1], k0, 4 * (size_t)nk);
    memcpy(o[k][2], v0, 4 * (size_t)nk);
    expect_ok(c, tg_causal_attention_backward(c, dO, Q, K, V, o[k][0], o[k][1], o[k][2], seq, nh,
                                              nkv, hd),
              "causal");
    if (t) {
      compare("causal grad_Q", T[t], o[1][0], o[0][0], nq, 1);
      compare("causal grad_K", T[t], o[1][1], o[0][1], nk, 1);
      compare("causal grad_V", T[t], o[1][2], o[0][2], nk, 1);
    }
    tg_ctx_destroy(c);
  }
  printf("  causal attention seq %u heads %u/%u hd %u det %d: ok\n", seq, nh, nkv, hd, det);
  free(dO), free(Q), free(K), free(V), free(k0), free(v0);
  for (int i = 0; i < 2; i++) free(o[i][0]), free(o[i][1]), free(o[i][2]);
}

static void misc(void) {
  const uint32_t rows = 150, cols = 333, DV = 256, nwg = 5, nrows = 9;
  const int64_t n = (int64_t)rows * cols;
  float *x = f32(n, -1, 1), *sm = f32(n, 0, 1), *out[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)};
  uint16_t *cast[2] = {xmalloc(2 * (size_t)n), xmalloc(2 * (size_t)n)};
  const int64_t nh = (int64_t)nrows * nwg * (DV + 2);
  float *h = f32(nh, -1, 1);
  for (int64_t i = (int64_t)nrows * DV * nwg; i < nh; i += 2) h[i] = uni(0.5f, 2), h[i + 1] = uni(-3, 3);
  float *dec[2][2];
  for (int i = 0; i < 2; i++)
    dec[i][0] = xmalloc(4 * (size_t)nrows * DV), dec[i][1] = xmalloc(4 * (size_t)nrows * DV);
  float *sb[2] = {xmalloc(4 * (size_t)n), xmalloc(4 * (size_t)n)};
  const int64_t n_ip = 300001; /* the cast in place: two parallel rounds */
  float *ip_src = f32(n_ip, -1, 1), *ip = xmalloc(4 * (size_t)n_ip);
  uint16_t *ip_want = xmalloc(2 * (size_t)n_ip);
  float *gi = xmalloc(4 * (size_t)n);
  for (int t = 0; t < NT; t++) {
    const int k = t ? 1 : 0;
    tg_ctx *c = ctx_of(T[t], 0);
    expect_ok(c, tg_transpose_2d(c, x, out[k], rows, cols), "transpose");
    expect_ok(c, tg_f32_to_bf16_cast(c, x, cast[k], (uint64_t)n), "cast");
    expect_ok(c, tg_softmax_backward(c, sm, x, sb[k], rows, cols), "softmax");
    expect_ok(c, tg_flash_attn_vec_reduce(c, h, dec[k][0], nrows, DV, nwg), "vec_reduce");
    expect_ok(c, tg_flash_attn_vec_reduce_tq_hb_undo(c, h, dec[k][1], nrows, DV, nwg), "tq_hb");
    expect_ok(c, tg_fwht_sign_undo_f32(c, dec[k][0], nrows, DV), "fwht");
    memcpy(ip, ip_src, 4 * (size_t)n_ip);
    expect_ok(c, tg_f32_to_bf16_cast(c, ip, (uint16_t *)ip, (uint64_t)n_ip), "cast in place");
    if (!t) memcpy(ip_want, ip, 2 * (size_t)n_ip);
    else if (memcmp(ip, ip_want, 2 * (size_t)n_ip)) failures++;
    memcpy(gi, x, 4 * (size_t)n);
    expect_ok(c, tg_softmax_backward(c, sm, gi, gi, rows, cols), "softmax in place");
    compare("softmax in place", T[t], gi, sb[k], n, 1);
    if (t) {
      compare("transpose", T[t], out[1], out[0], n, 1);
      if (memcmp(cast[1], cast[0], 2 * (size_t)n)) failures++;
      compare("softmax", T[t], sb[1], sb[0], n, 1);
      compare("vec_reduce + fwht", T[t], dec[1][0], dec[0][0], (int64_t)nrows * DV, 1);
      compare("tq_hb_undo", T[t], dec[1][1], dec[0][1], (int64_t)nrows * DV, 1);
    }
    tg_ctx_destroy(c);
  }
  printf("  transpose, cast, softmax, vec_reduce, tq_hb_undo, fwht, cast and softmax in place: "
         "ok\n");
  free(x), free(sm), free(h), free(ip_src), free(ip), free(ip_want), free(gi);
  for (int i = 0; i < 2; i++)
    free(out[i]), free(cast[i]), free(dec[i][0]), free(dec[i][1]), free(sb[i]);
}

int main(int argc, char **argv) {
  const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  printf("race_driver: threads 1 (reference), 2, 3, 7\n");
  /* FA-2: the ATOMIC schedule (Metal grid, omp atomic dK/dV adds), the KV
   * schedule with one key range and with several (kL > 448: dQ partials
   * summed afterwards), and ATOMIC asked for in deterministic mode (-> KV) */
  attention(1, 4, 1, 130, 100, 32, 0, TG_ATTN_SCHEDULE_ATOMIC);
  attention(2, 4, 2, 70, 90, 16, 0, TG_ATTN_SCHEDULE_ATOMIC);
  attention(1, 4, 1, 130, 100, 32, 0, TG_ATTN_SCHEDULE_KV);
  attention(1, 2, 1, 70, 600, 16, 0, TG_ATTN_SCHEDULE_KV);
  attention(1, 4, 2, 100, 520, 16, 1, TG_ATTN_SCHEDULE_ATOMIC);
  if (!quick) attention(2, 8, 4, 40, 50, 16, 0, TG_ATTN_SCHEDULE_KV);
  /* fused, not deterministic: per-thread partials added with omp atomic; the
   * row blocks must be long enough that several threads really add (a
   * mutation test with the atomic removed is caught at 3000 rows, not 300) */
  rmsnorm(3000, 64, 0);
  rmsnorm(3000, 64, 1); /* heap partials, column reduce */
  if (!quick) rmsnorm(20, 1000, 0);
  embedding(50, 300, 40, 0);   /* dim < 64: vocab blocks */
  embedding(7, 100, 200, 1);   /* column blocks */
  cross_entropy(200, 100, 0);
  cross_entropy(5, 3000, 1);
  causal(100, 4, 2, 16, 0);
  if (!quick) causal(70, 3, 3, 8, 1);
  misc();
  if (failures) {
    fprintf(stderr, "race_driver: %d determinism/consistency failure(s)\n", failures);
    return 1;
  }
  printf("race_driver: all kernels ok\n");
  return 0;
}
