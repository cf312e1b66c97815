/*
 * Aliasing rules. Every entry point refuses an output that
 * shares memory with an input or with another output -- TG_ERR_ALIAS, a
 * message naming both parameters, nothing written -- except its documented
 * exact in-place pairs, which must give the bits of the out-of-place call:
 *
 *   tg_f32_to_bf16_cast      dst == src
 *   tg_rms_norm_forward_f32  y == x
 *   tg_softmax_backward      grad_in == grad_out
 *   tg_cross_entropy_fwd_bwd grad == logits
 *
 *  1. the engine's check (tg_check_alias) on its own: touching ranges,
 *     empty buffers, in-place pairs, output pairs, saturated extents;
 *  2. every forbidden pair of every entry point (each output against every
 *     input and every other output), as an exact alias and as two partial
 *     overlaps (each buffer starting inside the other), at 1 and 3 threads:
 *     TG_ERR_ALIAS, the message names the pair, and every byte of every
 *     buffer is unchanged; a partial overlap of an in-place pair too;
 *  3. every allowed in-place pair, bitwise against out of place, at 1 and 3
 *     threads, on shapes with many work items (cross-entropy with pad rows,
 *     an all -inf row, several chunks per row and the streaming path); the
 *     cast in place at 1, 2 and 3 threads, at sizes from 1 to many doubling
 *     rounds, odd ones included;
 *     The attention variants' buffers are among them (tg_attn_train_fwd and
 *     _bwd in f32 with a window, Dv != D, sinks an input and d_sinks an
 *     output of the backward);
 *  4. the attention extents: inputs may overlap inputs (K == V; Q, K, V
 *     interleaved in one buffer give the bits of separate copies), an output
 *     interleaved with the inputs is refused (judged by extent);
 *  5. the user's report: in-place transpose, in-place cast at 2 threads,
 *     decode reduce in place, embedding backward with overlapping buffers,
 *     at 2, 3 and 1 threads. Before this change each returned TG_OK with
 *     wrong results (the cast now gives the right ones; the others are
 *     refused); where a call returns TG_OK the test says how many elements
 *     were wrong. The races of the cast and the decode reduce need the
 *     second thread running when the first work item starts: ctest runs
 *     this suite with OMP_WAIT_POLICY=active (tests/CMakeLists.txt), as
 *     OpenMP's default (spin, then sleep) has it; under `passive` the old
 *     code won them by luck (0 of 200 runs wrong, against 196 of 200 with
 *     the default policy, for the cast of 2^17 elements at 2 threads).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "engine.h"
#include "testutil.h"

/* ------------------------------------------------------------------------------
 * Entry points as lists of buffers
 * ---------------------------------------------------------------------------- */
enum { MAXB = 12 };

typedef struct {
  const char *name;        /* the parameter's name (as the message gives it) */
  size_t bytes;
  int out;                 /* written or accumulated */
  const char *in_place_of; /* the input this output may be exactly */
  uint32_t id_mod;         /* > 0: u32 ids in [0, id_mod); else random f32 words */
} bspec;

typedef struct kcase kcase;
struct kcase {
  const char *fn;
  int nb;
  bspec b[MAXB];
  uint32_t s[6];           /* the shape, as the call wants it */
  tg_attn_params ap;
  tg_attn_mask_params mp;
  tg_status (*call)(tg_ctx *ctx, const kcase *k, void **p);
  /* after the generic fill: inputs that need particular values */
  void (*fixup)(const kcase *k, void **p, tu_rng *r);
};

static void add(kcase *k, const char *name, size_t bytes, int out, const char *in_place_of,
                uint32_t id_mod) {
  k->b[k->nb++] = (bspec){name, bytes, out, in_place_of, id_mod};
}
#define IN(k, name, bytes) add(k, name, bytes, 0, NULL, 0)
#define OUT(k, name, bytes) add(k, name, bytes, 1, NULL, 0)

/* --- the entry points ------------------------------------------------------------- */
static tg_status call_compute_d(tg_ctx *c, const kcase *k, void **p) {
  return tg_flash_attn_train_bwd_compute_d_bf16(c, p[0], p[1], p[2], k->s[0], k->s[1],
                                                k->s[2], k->s[3]);
}
static kcase make_compute_d(void) {
  kcase k = {.fn = "tg_flash_attn_train_bwd_compute_d_bf16", .s = {1, 2, 5, 8},
             .call = call_compute_d};
  IN(&k, "O", 2 * 80), IN(&k, "dO", 2 * 80), OUT(&k, "D_out", 4 * 10);
  return k;
}

/* attention: B 1, H 2, H_kv 1, qL 5, kL 7, D 8, contiguous, with a mask */
static void attn_shape(kcase *k) {
  assert_int_equal(tg_attn_params_init(&k->ap, 1, 2, 1, 5, 7, 8, 0.35f), TG_OK);
  k->mp = (tg_attn_mask_params){{2 * 5 * 7, 5 * 7, 7}};
}
static tg_status call_attn_fwd(tg_ctx *c, const kcase *k, void **p) {
  return tg_flash_attn_train_fwd_bf16(c, p[0], p[1], p[2], p[4], p[5], &k->ap, &k->mp, p[3], 1);
}
static kcase make_attn_fwd(void) {
  kcase k = {.fn = "tg_flash_attn_train_fwd_bf16", .call = call_attn_fwd};
  attn_shape(&k);
  IN(&k, "Q", 2 * 80), IN(&k, "K", 2 * 56), IN(&k, "V", 2 * 56), IN(&k, "mask", 2 * 70);
  OUT(&k, "O", 2 * 80), OUT(&k, "L", 4 * 10);
  return k;
}
static tg_status call_attn_bwd(tg_ctx *c, const kcase *k, void **p) {
  return tg_flash_attn_train_bwd_bf16(c, p[0], p[1], p[2], p[3], p[4], p[5], p[7], p[8], p[9],
                                      &k->ap, &k->mp, p[6], 1);
}
static kcase make_attn_bwd(void) {
  kcase k = {.fn = "tg_flash_attn_train_bwd_bf16", .call = call_attn_bwd};
  attn_shape(&k);
  IN(&k, "Q", 2 * 80), IN(&k, "K", 2 * 56), IN(&k, "V", 2 * 56), IN(&k, "L", 4 * 10);
  IN(&k, "dO", 2 * 80), IN(&k, "D_vec", 4 * 10), IN(&k, "mask", 2 * 70);
  OUT(&k, "dQ", 4 * 80), OUT(&k, "dK", 4 * 56), OUT(&k, "dV", 4 * 56);
  return k;
}

/* the f32 entry points with every variant on: window 3, Dv 16 (V, O, dO
 * [.., 16]), sinks [H] an input, d_sinks [H] an output of the backward */
static void attn_variants_shape(kcase *k) {
  attn_shape(k);
  k->ap.V_strides[0] = k->ap.V_strides[1] = 7 * 16, k->ap.V_strides[2] = 16;
  k->ap.O_strides[0] = 2 * 5 * 16, k->ap.O_strides[1] = 5 * 16, k->ap.O_strides[2] = 16;
}
static tg_status call_attn_fwd_variants(tg_ctx *c, const kcase *k, void **p) {
  const tg_attn_options opt = {.window = 3, .v_head_dim = 16, .sinks = p[4]};
  return tg_attn_train_fwd(c, TG_DTYPE_F32, p[0], p[1], p[2], p[5], p[6], &k->ap, &k->mp, p[3],
                           1, &opt);
}
static kcase make_attn_fwd_variants(void) {
  kcase k = {.fn = "tg_attn_train_fwd", .call = call_attn_fwd_variants};
  attn_variants_shape(&k);
  IN(&k, "Q", 4 * 80), IN(&k, "K", 4 * 56), IN(&k, "V", 4 * 112), IN(&k, "mask", 4 * 70);
  IN(&k, "sinks", 4 * 2);
  OUT(&k, "O", 4 * 160), OUT(&k, "L", 4 * 10);
  return k;
}
static tg_status call_attn_bwd_variants(tg_ctx *c, const kcase *k, void **p) {
  const tg_attn_options opt = {.window = 3, .v_head_dim = 16, .sinks = p[7], .d_sinks = p[11]};
  return tg_attn_train_bwd(c, TG_DTYPE_F32, p[0], p[1], p[2], p[3], p[4], p[5], p[8], p[9],
                           p[10], &k->ap, &k->mp, p[6], 1, &opt);
}
static kcase make_attn_bwd_variants(void) {
  kcase k = {.fn = "tg_attn_train_bwd", .call = call_attn_bwd_variants};
  attn_variants_shape(&k);
  IN(&k, "Q", 4 * 80), IN(&k, "K", 4 * 56), IN(&k, "V", 4 * 112), IN(&k, "L", 4 * 10);
  IN(&k, "dO", 4 * 160), IN(&k, "D_vec", 4 * 10), IN(&k, "mask", 4 * 70), IN(&k, "sinks", 4 * 2);
  OUT(&k, "dQ", 4 * 80), OUT(&k, "dK", 4 * 56), OUT(&k, "dV", 4 * 112), OUT(&k, "d_sinks", 4 * 2);
  return k;
}

static tg_status call_cast(tg_ctx *c, const kcase *k, void **p) {
  return tg_f32_to_bf16_cast(c, p[0], p[1], k->s[0]);
}
static kcase make_cast(uint32_t n) {
  kcase k = {.fn = "tg_f32_to_bf16_cast", .s = {n}, .call = call_cast};
  IN(&k, "src", 4 * (size_t)n);
  add(&k, "dst", 2 * (size_t)n, 1, "src", 0);
  return k;
}

static tg_status call_rms_fwd(tg_ctx *c, const kcase *k, void **p) {
  return tg_rms_norm_forward_f32(c, p[0], p[1], p[2], k->s[2] ? p[3] : NULL, k->s[0], k->s[1],
                                 1e-5f);
}
static kcase make_rms_fwd(uint32_t rows, uint32_t dim, int with_r) {
  kcase k = {.fn = "tg_rms_norm_forward_f32", .s = {rows, dim, (uint32_t)with_r},
             .call = call_rms_fwd};
  const size_t n = 4 * (size_t)rows * dim;
  IN(&k, "x", n), IN(&k, "w", 4 * (size_t)dim);
  add(&k, "y", n, 1, "x", 0);
  if (with_r) OUT(&k, "r_out", 4 * (size_t)rows);
  return k;
}

static tg_status call_rms_inv(tg_ctx *c, const kcase *k, void **p) {
  return tg_rms_norm_compute_rms_inv_f32(c, p[0], p[1], k->s[0], k->s[1], 1e-5f);
}
static tg_status call_rms_dx(tg_ctx *c, const kcase *k, void **p) {
  return tg_rms_norm_backward_dx_f32(c, p[0], p[1], p[2], p[3], p[4], k->s[0], k->s[1]);
}
static tg_status call_rms_dw(tg_ctx *c, const kcase *k, void **p) {
  return tg_rms_norm_backward_dw_f32(c, p[0], p[1], p[2], p[3], k->s[0], k->s[1]);
}
static tg_status call_rms_fused(tg_ctx *c, const kcase *k, void **p) {
  return tg_rms_norm_backward(c, p[0], p[1], p[2], p[3], p[4], k->s[0], k->s[1], 1e-5f);
}
/* rows 3, dim 16 */
static kcase make_rms(int which) {
  const size_t n = 4 * 3 * 16, row = 4 * 16, col = 4 * 3;
  kcase k = {.s = {3, 16}};
  switch (which) {
    case 0:
      k.fn = "tg_rms_norm_compute_rms_inv_f32", k.call = call_rms_inv;
      IN(&k, "x", n), OUT(&k, "r_out", col);
      break;
    case 1:
      k.fn = "tg_rms_norm_backward_dx_f32", k.call = call_rms_dx;
      IN(&k, "x", n), IN(&k, "w", row), IN(&k, "dy", n), IN(&k, "r", col), OUT(&k, "dx", n);
      break;
    case 2:
      k.fn = "tg_rms_norm_backward_dw_f32", k.call = call_rms_dw;
      IN(&k, "x", n), IN(&k, "dy", n), IN(&k, "r", col), OUT(&k, "dw", row);
      break;
    default:
      k.fn = "tg_rms_norm_backward", k.call = call_rms_fused;
      IN(&k, "input", n), IN(&k, "weight", row), IN(&k, "grad_out", n);
      OUT(&k, "grad_input", n), OUT(&k, "grad_weight", row);
  }
  return k;
}

static tg_status call_softmax(tg_ctx *c, const kcase *k, void **p) {
  return tg_softmax_backward(c, p[0], p[1], p[2], k->s[0], k->s[1]);
}
static kcase make_softmax(uint32_t rows, uint32_t len) {
  kcase k = {.fn = "tg_softmax_backward", .s = {rows, len}, .call = call_softmax};
  const size_t n = 4 * (size_t)rows * len;
  IN(&k, "sm", n), IN(&k, "grad_out", n);
  add(&k, "grad_in", n, 1, "grad_out", 0);
  return k;
}

static tg_status call_embedding(tg_ctx *c, const kcase *k, void **p) {
  return tg_embedding_backward(c, p[0], p[1], p[2], k->s[0], k->s[1], k->s[2]);
}
/* vocab 5, seq 4, dim 8 */
static kcase make_embedding(void) {
  kcase k = {.fn = "tg_embedding_backward", .s = {5, 4, 8}, .call = call_embedding};
  IN(&k, "grad_out", 4 * 4 * 8);
  add(&k, "ids", 4 * 4, 0, NULL, 5);
  OUT(&k, "grad_weight", 4 * 5 * 8);
  return k;
}

/* s = {n_pos, vocab, pad_id, count} */
static tg_status call_ce(tg_ctx *c, const kcase *k, void **p) {
  return tg_cross_entropy_fwd_bwd(c, p[0], p[1], p[2], p[3], k->s[0], k->s[1], k->s[2],
                                  k->s[3]);
}
/* Logits in [-8, 8), every 7th position a pad, row 1 all -inf (the
 * equal-logits limit), row 2's target logit -inf (loss +inf). */
static void ce_fixup(const kcase *k, void **p, tu_rng *r) {
  const uint32_t n_pos = k->s[0], vocab = k->s[1];
  float *l = p[0];
  uint32_t *t = p[1];
  tu_fill_f32(r, l, (int64_t)n_pos * vocab, -8, 8);
  for (uint32_t i = 0; i < n_pos; i++)
    if (i % 7 == 3) t[i] = k->s[2];
  if (n_pos > 2) {
    for (uint32_t j = 0; j < vocab; j++) l[vocab + j] = -INFINITY;
    l[2 * (size_t)vocab + t[2]] = -INFINITY;
  }
}
static kcase make_ce(uint32_t n_pos, uint32_t vocab) {
  kcase k = {.fn = "tg_cross_entropy_fwd_bwd", .s = {n_pos, vocab, 1, n_pos},
             .call = call_ce, .fixup = ce_fixup};
  const size_t n = 4 * (size_t)n_pos * vocab;
  IN(&k, "logits", n);
  add(&k, "targets", 4 * (size_t)n_pos, 0, NULL, vocab);
  add(&k, "grad", n, 1, "logits", 0);
  OUT(&k, "loss_out", 4);
  return k;
}

static tg_status call_transpose(tg_ctx *c, const kcase *k, void **p) {
  return tg_transpose_2d(c, p[0], p[1], k->s[0], k->s[1]);
}
static kcase make_transpose(uint32_t rows, uint32_t cols) {
  kcase k = {.fn = "tg_transpose_2d", .s = {rows, cols}, .call = call_transpose};
  IN(&k, "input", 4 * (size_t)rows * cols), OUT(&k, "output", 4 * (size_t)rows * cols);
  return k;
}

static tg_status call_causal(tg_ctx *c, const kcase *k, void **p) {
  return tg_causal_attention_backward(c, p[0], p[1], p[2], p[3], p[4], p[5], p[6], k->s[0],
                                      k->s[1], k->s[2], k->s[3]);
}
/* seq 6, heads 2, kv heads 1, head dim 8 */
static kcase make_causal(void) {
  kcase k = {.fn = "tg_causal_attention_backward", .s = {6, 2, 1, 8}, .call = call_causal};
  const size_t q = 4 * 6 * 2 * 8, kv = 4 * 6 * 1 * 8;
  IN(&k, "grad_out", q), IN(&k, "Q", q), IN(&k, "K", kv), IN(&k, "V", kv);
  OUT(&k, "grad_Q", q), OUT(&k, "grad_K", kv), OUT(&k, "grad_V", kv);
  return k;
}

/* s = {nrows, head_dim, nwg} */
static tg_status call_vec_reduce(tg_ctx *c, const kcase *k, void **p) {
  return tg_flash_attn_vec_reduce(c, p[0], p[1], k->s[0], k->s[1], k->s[2]);
}
static tg_status call_hb_undo(tg_ctx *c, const kcase *k, void **p) {
  return tg_flash_attn_vec_reduce_tq_hb_undo(c, p[0], p[1], k->s[0], k->s[1], k->s[2]);
}
static kcase make_decode(int fused, uint32_t nrows, uint32_t head_dim, uint32_t nwg) {
  kcase k = {.fn = fused ? "tg_flash_attn_vec_reduce_tq_hb_undo" : "tg_flash_attn_vec_reduce",
             .s = {nrows, head_dim, nwg}, .call = fused ? call_hb_undo : call_vec_reduce};
  IN(&k, "htmp", 4 * (size_t)nrows * nwg * (head_dim + 2));
  OUT(&k, fused ? "output" : "dst", 4 * (size_t)nrows * head_dim);
  return k;
}

/* ------------------------------------------------------------------------------
 * Placing buffers: one arena, each buffer in its own 64-byte aligned slot,
 * and a pair region at the end where two of them are made to overlap.
 * ---------------------------------------------------------------------------- */
typedef struct {
  char *base;
  size_t bytes, slot[MAXB], pair; /* offsets */
} arena;

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static arena arena_make(const kcase *k) {
  arena a = {0};
  size_t off = 0, largest = 0;
  for (int i = 0; i < k->nb; i++) {
    a.slot[i] = off;
    off += up64(k->b[i].bytes) + 64;
    if (k->b[i].bytes > largest) largest = k->b[i].bytes;
  }
  a.pair = off;
  a.bytes = off + 2 * up64(largest) + 128;
  a.base = aligned_alloc(64, a.bytes);
  if (!a.base) fail_msg("out of memory");
  return a;
}

/* Every buffer in its slot, with valid contents (seeded: the same every
 * call with the same seed). */
static void arena_fill(const kcase *k, const arena *a, void **p, uint64_t seed) {
  tu_rng r = tu_rng_make(seed);
  memset(a->base, 0xA5, a->bytes);
  for (int i = 0; i < k->nb; i++) {
    p[i] = a->base + a->slot[i];
    const size_t words = k->b[i].bytes / 4;
    if (k->b[i].id_mod) {
      uint32_t *ids = p[i];
      for (size_t w = 0; w < words; w++) ids[w] = (uint32_t)tu_int(&r, 0, k->b[i].id_mod - 1);
    } else {
      tu_fill_f32(&r, p[i], (int64_t)words, -1, 1);
    }
  }
  if (k->fixup) k->fixup(k, p, &r);
}

/* Overlap placements of output i and buffer j in the pair region. */
enum { EXACT, OUT_INSIDE, OTHER_INSIDE };
static const char *const placement_name[] = {"exact alias", "output starts inside",
                                             "other starts inside the output"};

/* Offset that starts one buffer inside another of `bytes` (0: too small). */
static size_t inside(size_t bytes) { return (bytes / 2) & ~(size_t)3; }

/* Points p[i] and p[j] into the pair region as `placement` says (their
 * contents copied there: j's, then i's over it); 0 if the placement does
 * not exist for these sizes. */
static int place(const kcase *k, const arena *a, void **p, int i, int j, int placement) {
  char *pair = a->base + a->pair;
  size_t off_i = 0, off_j = 0;
  if (placement == OUT_INSIDE && !(off_i = inside(k->b[j].bytes))) return 0;
  if (placement == OTHER_INSIDE && !(off_j = inside(k->b[i].bytes))) return 0;
  memmove(pair + off_j, p[j], k->b[j].bytes);
  memmove(pair + off_i, p[i], k->b[i].bytes);
  p[i] = pair + off_i, p[j] = pair + off_j;
  return 1;
}

/* ------------------------------------------------------------------------------
 * 2. forbidden pairs
 * ---------------------------------------------------------------------------- */

/* The message names the pair (either order) after the entry point. */
static void expect_pair_message(tg_ctx *ctx, const kcase *k, int i, int j, const char *what) {
  const char *msg = tg_ctx_last_error(ctx);
  char a[160], b[160];
  snprintf(a, sizeof a, "%s: %s overlaps %s", k->fn, k->b[i].name, k->b[j].name);
  snprintf(b, sizeof b, "%s: %s overlaps %s", k->fn, k->b[j].name, k->b[i].name);
  if (!strstr(msg, a) && !strstr(msg, b))
    TU_FAIL("%s (%s): message '%s' does not name the pair %s / %s", k->fn, what, msg,
            k->b[i].name, k->b[j].name);
}

/* Every output against every input and every other output; returns the
 * number of refused calls checked. */
static int check_forbidden(const kcase *k, int threads, uint64_t seed) {
  arena a = arena_make(k);
  char *snap = tu_alloc(a.bytes);
  int checked = 0;
  for (int i = 0; i < k->nb; i++) {
    if (!k->b[i].out) continue;
    for (int j = 0; j < k->nb; j++) {
      if (j == i || (k->b[j].out && j > i)) continue;
      const int in_place_pair =
          k->b[i].in_place_of && strcmp(k->b[i].in_place_of, k->b[j].name) == 0;
      for (int pl = EXACT; pl <= OTHER_INSIDE; pl++) {
        if (pl == EXACT && in_place_pair) continue; /* allowed: section 3 */
        void *p[MAXB];
        arena_fill(k, &a, p, seed);
        if (!place(k, &a, p, i, j, pl)) continue;
        memcpy(snap, a.base, a.bytes);
        tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
        char what[200];
        snprintf(what, sizeof what, "%s / %s, %s, %d threads", k->b[i].name, k->b[j].name,
                 placement_name[pl], threads);
        const tg_status st = k->call(ctx, k, p);
        if (st != TG_ERR_ALIAS)
          TU_FAIL("%s (%s): status %d (%s), want TG_ERR_ALIAS; message '%s'", k->fn, what,
                  (int)st, tg_status_str(st), tg_ctx_last_error(ctx));
        expect_pair_message(ctx, k, i, j, what);
        if (memcmp(snap, a.base, a.bytes))
          TU_FAIL("%s (%s): refused, but a byte changed", k->fn, what);
        tg_ctx_destroy(ctx);
        checked++;
      }
    }
  }
  free(snap);
  free(a.base);
  return checked;
}

static void test_forbidden_pairs(void **state) {
  kcase cases[] = {make_compute_d(),        make_attn_bwd(),     make_cast(100),
                   make_attn_fwd(),         make_rms_fwd(3, 16, 1), make_rms(0),
                   make_rms(1),             make_rms(2),         make_rms(3),
                   make_softmax(3, 16),     make_embedding(),    make_ce(4, 16),
                   make_transpose(3, 5),    make_causal(),       make_decode(0, 2, 8, 2),
                   make_decode(1, 1, 256, 2), make_attn_fwd_variants(), make_attn_bwd_variants()};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int n = 0;
    for (int t = 1; t <= 3; t += 2) n += check_forbidden(&cases[c], t, tu_seed() + c);
    printf("  %-40s %3d refused calls (1 and 3 threads), nothing written\n", cases[c].fn, n);
    assert_true(n > 0);
  }
  /* cross-entropy with count == 0 reads and writes nothing (the seed's early
   * return): not refused, whatever overlaps */
  float mem[64] = {0}, snap[64];
  uint32_t targets[4] = {0, 1, 2, 3};
  memcpy(snap, mem, sizeof mem);
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_cross_entropy_fwd_bwd(ctx, mem, targets, mem + 4, mem, 4, 8, 0, 0),
                   TG_OK);
  assert_memory_equal(mem, snap, sizeof mem);
  tg_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------
 * 3. allowed in-place pairs: the bits of the out-of-place call
 * ---------------------------------------------------------------------------- */

/* For every output of k that may be in place over an input: the call with
 * the two at one address gives every output bitwise as the call with
 * separate buffers (same contents in, accumulating outputs included). */
static void check_in_place(const kcase *k, int threads, uint64_t seed) {
  for (int i = 0; i < k->nb; i++) {
    if (!k->b[i].in_place_of) continue;
    int j = 0;
    while (strcmp(k->b[j].name, k->b[i].in_place_of)) j++;
    arena a = arena_make(k);
    void *p[MAXB];
    /* out of place: the reference outputs */
    arena_fill(k, &a, p, seed);
    tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
    TU_EXPECT_STATUS(ctx, k->call(ctx, k, p), TG_OK);
    void *want[MAXB] = {0};
    for (int o = 0; o < k->nb; o++)
      if (k->b[o].out) {
        want[o] = tu_alloc(k->b[o].bytes);
        memcpy(want[o], p[o], k->b[o].bytes);
      }
    /* in place: output i over input j, which holds j's contents */
    arena_fill(k, &a, p, seed);
    place(k, &a, p, i, j, EXACT);
    memmove(p[j], a.base + a.slot[j], k->b[j].bytes);
    TU_EXPECT_STATUS(ctx, k->call(ctx, k, p), TG_OK);
    for (int o = 0; o < k->nb; o++)
      if (want[o]) {
        if (memcmp(want[o], p[o], k->b[o].bytes))
          TU_FAIL("%s, %s in place over %s, %d threads: %s differs from out of place", k->fn,
                  k->b[i].name, k->b[j].name, threads, k->b[o].name);
        free(want[o]);
      }
    tg_ctx_destroy(ctx);
    free(a.base);
  }
}

static void test_in_place_pairs(void **state) {
  /* several work items each: softmax and RMSNorm take ~256 KiB row blocks;
   * cross-entropy 3 chunks per row (vocab 3000), 6 rows per item at 3
   * threads; the last case writes its 17.6 MB grad with streaming stores */
  const kcase cases[] = {
      make_softmax(300, 1000), make_softmax(37, 3001),   make_softmax(1, 7),
      make_rms_fwd(500, 700, 1), make_rms_fwd(401, 33, 0), make_rms_fwd(1, 5, 1),
      make_ce(64, 3000),       make_ce(9, 16),            make_ce(1100, 4000),
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (int t = 1; t <= 3; t += 2) check_in_place(&cases[c], t, tu_seed() + c);
    printf("  %-28s [%u x %u]: in place gives the out-of-place bits\n", cases[c].fn,
           cases[c].s[0], cases[c].s[1]);
  }
}

/* The cast in place: from one element to many doubling rounds (the
 * parallel ones start at 2^17 elements), odd sizes, 1, 2 and 3 threads. */
static void test_cast_in_place(void **state) {
  const uint32_t sizes[] = {1,      2,      3,      5,      64,          1000,
                            65535,  65536,  65537,  131071, 131073,      262144,
                            300001, 1048576 + 12345, (1u << 22) + 1};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const kcase k = make_cast(sizes[s]);
    for (int t = 1; t <= 3; t++) check_in_place(&k, t, tu_seed() + 300 + s);
  }
  printf("  tg_f32_to_bf16_cast in place: %zu sizes from 1 to 2^22 + 1, 1/2/3 threads\n",
         sizeof sizes / sizeof sizes[0]);
}

/* ------------------------------------------------------------------------------
 * 1. the engine's check on its own
 * ---------------------------------------------------------------------------- */
static void test_engine_check(void **state) {
  tg_ctx *ctx = tu_ctx(1, TG_ISA_AUTO);
  static char mem[1024];
  const char *fn = "tg_test";
  /* touching ranges share no byte */
  tg_buf touching[] = {tg_in("a", mem, 100), tg_out("b", mem + 100, 100),
                       tg_out("c", mem + 200, 4)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, touching, 3), TG_OK);
  /* inputs overlap inputs freely */
  tg_buf inputs[] = {tg_in("a", mem, 100), tg_in("b", mem, 100), tg_in("c", mem + 50, 100),
                     tg_out("d", mem + 200, 8)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, inputs, 4), TG_OK);
  /* empty buffers (NULL, or 0 bytes) overlap nothing */
  tg_buf empty[] = {tg_in("a", mem, 100), tg_out("b", NULL, 100), tg_out("c", mem + 10, 0)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, empty, 3), TG_OK);
  /* one shared byte is enough */
  tg_buf one[] = {tg_in("a", mem, 100), tg_out("b", mem + 99, 100)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, one, 2), TG_ERR_ALIAS);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_test: b overlaps a"));
  assert_non_null(strstr(tg_ctx_last_error(ctx), "1 bytes shared"));
  /* two outputs */
  tg_buf outs[] = {tg_in("a", mem, 10), tg_out("b", mem + 100, 50), tg_out("c", mem + 120, 50)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, outs, 3), TG_ERR_ALIAS);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_test: c overlaps b"));
  assert_non_null(strstr(tg_ctx_last_error(ctx), "two outputs"));
  /* in place: exactly at its input (even at another size), never partly,
   * never over another input */
  tg_buf exact[] = {tg_in("x", mem, 400), tg_out_in_place("y", mem, 200, "x")};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, exact, 2), TG_OK);
  tg_buf partial[] = {tg_in("x", mem, 400), tg_out_in_place("y", mem + 4, 200, "x")};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, partial, 2), TG_ERR_ALIAS);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "same start address"));
  tg_buf other[] = {tg_in("x", mem, 400), tg_in("z", mem + 400, 400),
                    tg_out_in_place("y", mem + 400, 400, "x")};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, other, 3), TG_ERR_ALIAS);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_test: y overlaps z"));
  /* exactly at its input, which another input overlaps partly: refused */
  tg_buf third[] = {tg_in("x", mem, 400), tg_in("z", mem + 200, 400),
                    tg_out_in_place("y", mem, 400, "x")};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, third, 3), TG_ERR_ALIAS);
  assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_test: y overlaps z"));
  /* an extent running past the address space saturates, never wraps */
  tg_buf huge[] = {tg_out("o", mem + 512, UINT64_MAX), tg_in("i", mem + 1000, 4)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, huge, 2), TG_ERR_ALIAS);
  tg_buf below[] = {tg_out("o", mem + 512, UINT64_MAX), tg_in("i", mem, 512)};
  TU_EXPECT_STATUS(ctx, tg_check_alias(ctx, fn, below, 2), TG_OK);
  tg_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------
 * 4. attention extents
 * ---------------------------------------------------------------------------- */

/* Q, K, V as alternate head blocks of one [L, slots * H, D] bf16 buffer
 * (slot 0 Q, 1 K, 2 V; slot 3 free): inputs overlapping inputs by extent
 * run, and give the bits of separate contiguous copies; O in slot 3,
 * touching none of their elements but inside their extent, is refused. */
static void test_attention_extents(void **state) {
  enum { L = 40, H = 2, D = 16, SLOTS = 4 };
  tu_rng r = tu_rng_make(tu_seed() + 500);
  tg_bf16 *buf = tu_alloc(sizeof(tg_bf16) * L * SLOTS * H * D);
  tu_fill_bf16(&r, buf, (int64_t)L * SLOTS * H * D, -2, 2);
  tg_bf16 *q = tu_alloc(2 * L * H * D), *k = tu_alloc(2 * L * H * D), *v = tu_alloc(2 * L * H * D);
  for (int i = 0; i < L; i++)
    for (int h = 0; h < H; h++)
      for (int d = 0; d < D; d++) {
        const int64_t c = ((int64_t)h * L + i) * D + d, row = (int64_t)i * SLOTS * H * D;
        q[c] = buf[row + (0 * H + h) * D + d];
        k[c] = buf[row + (1 * H + h) * D + d];
        v[c] = buf[row + (2 * H + h) * D + d];
      }
  tg_attn_params cont, inter;
  assert_int_equal(tg_attn_params_init(&cont, 1, H, H, L, L, D, 0.25f), TG_OK);
  inter = cont;
  const int64_t s[3] = {(int64_t)L * SLOTS * H * D, D, (int64_t)SLOTS * H * D};
  memcpy(inter.Q_strides, s, sizeof s), memcpy(inter.K_strides, s, sizeof s);
  memcpy(inter.V_strides, s, sizeof s);
  tg_bf16 *o_want = tu_alloc(2 * L * H * D), *o = tu_alloc(2 * L * H * D);
  float *l_want = tu_alloc(4 * L * H), *l = tu_alloc(4 * L * H);
  for (int t = 1; t <= 3; t += 2) {
    tg_ctx *ctx = tu_ctx(t, TG_ISA_AUTO);
    TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, q, k, v, o_want, l_want, &cont,
                                                       NULL, NULL, 1), TG_OK);
    TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, buf, buf + H * D, buf + 2 * H * D,
                                                       o, l, &inter, NULL, NULL, 1), TG_OK);
    assert_memory_equal(o, o_want, 2 * L * H * D);
    assert_memory_equal(l, l_want, 4 * L * H);
    /* K == V: inputs may be one buffer */
    TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, q, k, k, o, l, &cont, NULL, NULL, 0),
                     TG_OK);
    /* O interleaved with Q, K, V (slot 3): refused by extent, nothing written */
    tg_attn_params with_o = inter;
    memcpy(with_o.O_strides, s, sizeof s);
    const size_t all = sizeof(tg_bf16) * L * SLOTS * H * D;
    tg_bf16 *snap = tu_alloc(all);
    memcpy(snap, buf, all);
    TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, buf, buf + H * D, buf + 2 * H * D,
                                                       buf + 3 * H * D, l, &with_o, NULL,
                                                       NULL, 1),
                     TG_ERR_ALIAS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_flash_attn_train_fwd_bf16: O overlaps Q"));
    assert_memory_equal(snap, buf, all);
    free(snap);
    tg_ctx_destroy(ctx);
  }
  free(buf), free(q), free(k), free(v), free(o_want), free(o), free(l_want), free(l);
}

/* ------------------------------------------------------------------------------
 * 5. the user's report
 * ---------------------------------------------------------------------------- */

/* The report's thread counts: 2 first (the user's), then 3 and 1. */
static const int report_threads[] = {2, 3, 1};

/* A report case must be refused with every byte unchanged. If it returns
 * TG_OK instead (the code before this change), the test fails saying how
 * many of the n floats differ from `want`, the out-of-place result. */
static void expect_refused(tg_ctx *ctx, tg_status st, const char *what, const void *mem,
                           const void *snap, size_t bytes, const float *got, const float *want,
                           int64_t n) {
  if (st == TG_OK) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    TU_FAIL("%s: TG_OK with %lld of %lld output floats wrong (want TG_ERR_ALIAS)", what,
            (long long)wrong, (long long)n);
  }
  if (st != TG_ERR_ALIAS)
    TU_FAIL("%s: status %d (%s), want TG_ERR_ALIAS", what, (int)st, tg_status_str(st));
  if (!tg_ctx_last_error(ctx)[0]) TU_FAIL("%s: refused without a message", what);
  if (memcmp(mem, snap, bytes)) TU_FAIL("%s: refused, but a byte changed", what);
}

/* The dtype entry points judge extents by their element size: with float32
 * tensors, an O that starts where Q's extent would end if Q were bf16 (half
 * way into the f32 Q) is refused, and so are dQ over dO and D_out over O;
 * the same buffers laid out apart run. 1 and 3 threads. */
static void test_attention_f32_extents(void **state) {
  enum { B = 1, H = 2, L = 24, D = 16, N = B * H * L * D, NL = B * H * L };
  tu_rng r = tu_rng_make(tu_seed() + 510);
  float *buf = tu_alloc(sizeof(float) * 8 * N), *l = tu_alloc(4 * NL), *dv = tu_alloc(4 * NL);
  tu_fill_f32(&r, buf, 8 * N, -1, 1);
  tu_fill_f32(&r, l, NL, 1, 2);
  tu_fill_f32(&r, dv, NL, -1, 1);
  float *q = buf, *k = buf + N, *v = buf + 2 * N, *o = buf + 3 * N, *dO = buf + 4 * N;
  float *dq = buf + 5 * N, *dk = buf + 6 * N, *dvv = buf + 7 * N;
  tg_attn_params p;
  assert_int_equal(tg_attn_params_init(&p, B, H, H, L, L, D, 0.25f), TG_OK);
  float *snap = tu_alloc(sizeof(float) * 8 * N);
  for (int t = 1; t <= 3; t += 2) {
    tg_ctx *ctx = tu_ctx(t, TG_ISA_AUTO);
    memcpy(snap, buf, sizeof(float) * 8 * N);
    /* O at the middle of the f32 Q: inside its 4-byte extent only */
    TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_F32, q, k, v, q + N / 2, l, &p, NULL,
                                            NULL, 1, NULL),
                     TG_ERR_ALIAS);
    assert_non_null(strstr(tg_ctx_last_error(ctx), "O"));
    TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_F32, q, k, v, l, dO, dv, dO + N / 2,
                                            dk, dvv, &p, NULL, NULL, 1, NULL),
                     TG_ERR_ALIAS);
    TU_EXPECT_STATUS(ctx, tg_attn_train_bwd_compute_d(ctx, TG_DTYPE_F32, o, dO,
                                                      (float *)(o + N / 2), B, H, L, D),
                     TG_ERR_ALIAS);
    assert_memory_equal(snap, buf, sizeof(float) * 8 * N);
    /* apart: they run */
    TU_EXPECT_STATUS(ctx, tg_attn_train_fwd(ctx, TG_DTYPE_F32, q, k, v, o, l, &p, NULL, NULL, 1,
                                            NULL),
                     TG_OK);
    TU_EXPECT_STATUS(ctx, tg_attn_train_bwd(ctx, TG_DTYPE_F32, q, k, v, l, dO, dv, dq, dk, dvv,
                                            &p, NULL, NULL, 1, NULL),
                     TG_OK);
    tg_ctx_destroy(ctx);
  }
  free(buf), free(l), free(dv), free(snap);
}

static void test_report_transpose_in_place(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 600);
  const uint32_t shapes[][2] = {{256, 256}, {200, 333}};
  for (int s = 0; s < 2; s++) {
    const uint32_t rows = shapes[s][0], cols = shapes[s][1];
    const int64_t n = (int64_t)rows * cols;
    float *x = tu_alloc(4 * n), *snap = tu_alloc(4 * n), *want = tu_alloc(4 * n);
    tu_fill_f32(&r, x, n, -1, 1);
    memcpy(snap, x, 4 * n);
    for (int ti = 0; ti < 3; ti++) {
      const int t = report_threads[ti];
      tg_ctx *ctx = tu_ctx(t, TG_ISA_AUTO);
      TU_EXPECT_STATUS(ctx, tg_transpose_2d(ctx, snap, want, rows, cols), TG_OK);
      char what[96];
      snprintf(what, sizeof what, "tg_transpose_2d(x, x) %ux%u, %d threads", rows, cols, t);
      expect_refused(ctx, tg_transpose_2d(ctx, x, x, rows, cols), what, x, snap, 4 * n, x,
                     want, n);
      assert_non_null(strstr(tg_ctx_last_error(ctx), "tg_transpose_2d: output overlaps input"));
      tg_ctx_destroy(ctx);
    }
    free(x), free(snap), free(want);
  }
}

/* Before: dst == src at 2 threads gave wrong elements (chunk c's bf16s land
 * on chunk c/2's floats, which another thread may not have read yet). Now
 * in place is supported: the out-of-place bits, every time. */
static void test_report_cast_in_place_2_threads(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 700);
  const int64_t n = 1 << 22;
  float *x = tu_alloc(4 * n), *src = tu_alloc(4 * n);
  tg_bf16 *want = tu_alloc(2 * n);
  tu_fill_f32(&r, src, n, -1e3, 1e3);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, src, want, n), TG_OK);
  for (int rep = 0; rep < 5; rep++) {
    memcpy(x, src, 4 * n);
    TU_EXPECT_STATUS(ctx, tg_f32_to_bf16_cast(ctx, x, (tg_bf16 *)x, n), TG_OK);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += ((tg_bf16 *)x)[i] != want[i];
    if (wrong)
      TU_FAIL("tg_f32_to_bf16_cast(x, x) at 2 threads, run %d: %lld of %lld elements wrong",
              rep, (long long)wrong, (long long)n);
  }
  tg_ctx_destroy(ctx);
  free(x), free(src), free(want);
}

/* dst == htmp (the output over the partials it reduces), both reduces. */
static void test_report_decode_in_place(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 800);
  for (int fused = 0; fused < 2; fused++) {
    const uint32_t nrows = 2000, DV = fused ? 256 : 64, nwg = 4;
    const int64_t nh = (int64_t)nrows * nwg * (DV + 2), nout = (int64_t)nrows * DV;
    float *h = tu_alloc(4 * nh), *snap = tu_alloc(4 * nh), *want = tu_alloc(4 * nout);
    tu_fill_f32(&r, h, nh, -1, 1);
    for (int64_t i = nrows * DV * nwg; i < nh; i += 2) h[i] = 1.0f + (float)tu_uniform(&r, 0, 1);
    memcpy(snap, h, 4 * nh);
    for (int ti = 0; ti < 3; ti++) {
      const int t = report_threads[ti];
      tg_ctx *ctx = tu_ctx(t, TG_ISA_AUTO);
      const char *fn = fused ? "tg_flash_attn_vec_reduce_tq_hb_undo" : "tg_flash_attn_vec_reduce";
      tg_status (*reduce)(tg_ctx *, const float *, float *, uint32_t, uint32_t, uint32_t) =
          fused ? tg_flash_attn_vec_reduce_tq_hb_undo : tg_flash_attn_vec_reduce;
      TU_EXPECT_STATUS(ctx, reduce(ctx, snap, want, nrows, DV, nwg), TG_OK);
      char what[96];
      snprintf(what, sizeof what, "%s(htmp, htmp), %d threads", fn, t);
      expect_refused(ctx, reduce(ctx, h, h, nrows, DV, nwg), what, h, snap, 4 * nh, h, want,
                     nout);
      char pair[96];
      snprintf(pair, sizeof pair, "%s: %s overlaps htmp", fn, fused ? "output" : "dst");
      assert_non_null(strstr(tg_ctx_last_error(ctx), pair));
      memcpy(h, snap, 4 * nh);
      tg_ctx_destroy(ctx);
    }
    free(h), free(snap), free(want);
  }
}

/* grad_weight overlapping grad_out: grad_weight starts 3 rows into grad_out. */
static void test_report_embedding_overlap(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 900);
  const uint32_t vocab = 50, seq = 400, dim = 64;
  const int64_t n_go = (int64_t)seq * dim, n_gw = (int64_t)vocab * dim;
  const int64_t total = n_go + n_gw; /* grad_weight at row 3 of grad_out fits */
  float *mem = tu_alloc(4 * total), *snap = tu_alloc(4 * total), *want = tu_alloc(4 * n_gw);
  uint32_t *ids = tu_alloc(4 * seq);
  tu_fill_f32(&r, mem, total, -1, 1);
  for (uint32_t t = 0; t < seq; t++) ids[t] = (uint32_t)tu_int(&r, 0, vocab - 1);
  memcpy(snap, mem, 4 * total);
  float *go = mem, *gw = mem + 3 * dim;
  for (int ti = 0; ti < 3; ti++) {
    const int t = report_threads[ti];
    tg_ctx *ctx = tu_ctx(t, TG_ISA_AUTO);
    /* the intended result: the same buffers' contents, separately */
    float *go_copy = tu_alloc(4 * n_go);
    memcpy(go_copy, snap, 4 * n_go);
    memcpy(want, snap + 3 * dim, 4 * n_gw);
    TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, go_copy, ids, want, vocab, seq, dim), TG_OK);
    char what[96];
    snprintf(what, sizeof what,
             "tg_embedding_backward, grad_weight 3 rows into grad_out, %d threads", t);
    expect_refused(ctx, tg_embedding_backward(ctx, go, ids, gw, vocab, seq, dim), what, mem,
                   snap, 4 * total, gw, want, n_gw);
    assert_non_null(
        strstr(tg_ctx_last_error(ctx), "tg_embedding_backward: grad_weight overlaps grad_out"));
    memcpy(mem, snap, 4 * total);
    free(go_copy);
    tg_ctx_destroy(ctx);
  }
  free(mem), free(snap), free(want), free(ids);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_check),
      cmocka_unit_test(test_forbidden_pairs),
      cmocka_unit_test(test_in_place_pairs),
      cmocka_unit_test(test_cast_in_place),
      cmocka_unit_test(test_attention_extents),
      cmocka_unit_test(test_attention_f32_extents),
      cmocka_unit_test(test_report_transpose_in_place),
      cmocka_unit_test(test_report_cast_in_place_2_threads),
      cmocka_unit_test(test_report_decode_in_place),
      cmocka_unit_test(test_report_embedding_overlap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
