/*
 * libFuzzer target: every entry point of include/tilegrad.h, driven with
 * arbitrary parameter structs, sizes, strides, ids, targets, pad ids, eps,
 * thread counts (1-3), ISA and deterministic flag decoded from the input.
 *
 * Memory rule: the library never gets a buffer smaller than what a call may
 * legitimately address. For every call the harness computes, independently
 * of the library, (a) the set of statuses the contract allows (TG_OK if and
 * only if nothing is wrong; otherwise the code of any rule that is broken)
 * and (b) the extent of every buffer. A call that must succeed runs only when
 * all its buffers fit in TG_FUZZ_CAP bytes (exactly sized heap blocks: ASan's
 * redzones catch any access past them) and its work is small; a call that
 * must be refused gets buffers of min(extent, cap) bytes, so a library that
 * accepted it would run off them and ASan would say so.
 *
 * Invariants checked after every call (abort() = finding):
 *   - the status is in the allowed set (so: TG_OK exactly when the contract
 *     says the input is valid, and the right kind of refusal otherwise);
 *   - on a refusal: every output buffer (accumulating ones included) is
 *     byte-identical to its snapshot, and tg_ctx_last_error() is non-empty;
 *   - a NULL ctx gives TG_ERR_NULL_ARG and writes nothing;
 *   - on TG_OK with "tame" inputs (finite, bounded) and parameters for which
 *     the math is finite: outputs are finite; transpose and cast are exact;
 *     cross-entropy with count == 0 writes nothing; in deterministic mode the
 *     FA-2 backward gives the same bits with another thread count.
 *
 * Input layout: byte 0 picks the entry point, byte 1 flags, byte 2 threads
 * and the attention precision mode;
 * the rest is read on demand (zeros past the end). See fuzz/README.md.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tilegrad.h"

#ifndef TG_FUZZ_CAP
#define TG_FUZZ_CAP (64 * 1024) /* bytes per buffer */
#endif
#define WORK_CAP (INT64_C(1) << 20) /* multiply-adds per call, roughly */

/* --- input reader ----------------------------------------------------------- */
typedef struct {
  const uint8_t *p;
  size_t n;
} rd;

static uint8_t u8(rd *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}
static uint32_t u32(rd *r) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)u8(r) << (8 * i);
  return v;
}
static uint64_t u64(rd *r) { return (uint64_t)u32(r) | (uint64_t)u32(r) << 32; }
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* sizes: mostly small, sometimes an edge value or anything */
static uint32_t pick_u32(rd *r, uint32_t small) {
  static const uint32_t edge[] = {0,           1,          2,          3,          7,
                                  8,           15,         16,         17,         31,
                                  32,          33,         63,         64,         65,
                                  255,         256,        257,        511,        512,
                                  513,         1024,       0x7FFF,     0x10000,    0x7FFFFFFF,
                                  0x80000000u, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x40000000u, 0x20000001u};
  const uint8_t m = u8(r);
  switch (m & 7) {
    case 0: return 0;
    case 1: case 2: case 3: case 4: return 1 + u8(r) % small;
    case 5: return edge[u8(r) % (sizeof edge / sizeof edge[0])];
    case 6: return u32(r);
    default: return 1 + (uint32_t)(u8(r) | u8(r) << 8) % (4 * small);
  }
}
static int32_t pick_i32(rd *r, int32_t small) {
  static const int32_t edge[] = {0, 1, -1, 2, 3, 7, 8, 9, 16, 17, 24, 31, 32, 33, 63, 64,
                                 65, 511, 512, 513, 520, INT32_MAX, INT32_MIN,
                                 INT32_MAX - 30, INT32_MAX - 15, INT32_MAX - 7, -8};
  const uint8_t m = u8(r);
  switch (m & 3) {
    case 0: case 1: return 1 + u8(r) % small;
    case 2: return edge[u8(r) % (sizeof edge / sizeof edge[0])];
    default: return (int32_t)u32(r);
  }
}
static int64_t pick_i64(rd *r, int64_t natural) {
  static const int64_t edge[] = {0,
                                 1,
                                 -1,
                                 INT64_MAX,
                                 INT64_MIN,
                                 INT64_MAX / 2,
                                 INT64_MAX / 3,
                                 INT64_C(1) << 31,
                                 INT64_C(1) << 32,
                                 INT64_C(1) << 62,
                                 (INT64_C(1) << 62) + 1,
                                 INT64_MAX - 511,
                                 -(INT64_C(1) << 40)};
  const uint8_t m = u8(r);
  switch (m & 7) {
    case 0: case 1: return natural;
    case 2: return (int64_t)((uint64_t)natural + u8(r) % 64); /* wraps, no UB */
    case 3: return (int64_t)(u8(r) | u8(r) << 8);
    case 4: case 5: return edge[u8(r) % (sizeof edge / sizeof edge[0])];
    default: return (int64_t)u64(r);
  }
}
static float pick_f32(rd *r) {
  static const float special[] = {0.0f,   -0.0f,   1.0f,    -1.0f,     0.125f,  1e-5f,
                                  1e-6f,  30.0f,   0.5f,    -2.0f,     1e-30f,  1e30f,
                                  3.4e38f, INFINITY, -INFINITY, NAN,    1e-40f /* denormal */,
                                  64.0f,  -1e-5f,  50.0f};
  const uint8_t m = u8(r);
  if (m & 1) return special[u8(r) % (sizeof special / sizeof special[0])];
  if (m & 2) return (float)(int8_t)u8(r) / 16.0f;
  return bits_f32(u32(r));
}

/* --- data generation --------------------------------------------------------- */
static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float uni(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 40) * 0x1p-24f; }
static uint16_t to_bf16(float f) { /* round to nearest even; NaN -> 0x7FC0 */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static int raw_data;        /* inputs are arbitrary bits (NaN, inf, ...) */
static int atomic_schedule; /* FA-2 backward: TG_ATTN_SCHEDULE_ATOMIC */
static int attn_precision;  /* tg_attn_precision of every context (byte 2 / 3 % 3) */

static void fill_f32(float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = raw_data ? bits_f32((uint32_t)rnd()) : uni(lo, hi);
}
static void fill_bf16(uint16_t *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++)
    x[i] = raw_data ? (uint16_t)rnd() : to_bf16(uni(lo, hi));
}
static int finite_f32(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}
static int finite_bf16(const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if ((x[i] & 0x7F80) == 0x7F80) return 0;
  return 1;
}

/* --- buffers: exact heap blocks, outputs snapshotted ------------------------------- */
enum { MAX_BUFS = 16 };
static struct {
  void *p, *snap;
  size_t bytes;
  int out;
} bufs[MAX_BUFS];
static int nbufs;

static void *buf(int64_t elems, size_t elem, int out) {
  if (nbufs == MAX_BUFS) abort();
  int64_t bytes;
  if (elems < 1 || __builtin_mul_overflow(elems, (int64_t)elem, &bytes) || bytes > TG_FUZZ_CAP)
    bytes = elems < 1 ? (int64_t)elem : TG_FUZZ_CAP - TG_FUZZ_CAP % (int64_t)elem;
  void *p = malloc((size_t)bytes);
  if (!p) abort();
  memset(p, 0x5C, (size_t)bytes);
  bufs[nbufs].p = p;
  bufs[nbufs].bytes = (size_t)bytes;
  bufs[nbufs].out = out;
  bufs[nbufs].snap = NULL;
  nbufs++;
  return p;
}
static void snapshot(void) {
  for (int i = 0; i < nbufs; i++)
    if (bufs[i].out) {
      free(bufs[i].snap);
      bufs[i].snap = malloc(bufs[i].bytes);
      memcpy(bufs[i].snap, bufs[i].p, bufs[i].bytes);
    }
}
static int outputs_unchanged(void) {
  for (int i = 0; i < nbufs; i++)
    if (bufs[i].out && memcmp(bufs[i].snap, bufs[i].p, bufs[i].bytes)) return 0;
  return 1;
}
static void free_bufs(void) {
  for (int i = 0; i < nbufs; i++) free(bufs[i].p), free(bufs[i].snap);
  nbufs = 0;
}

/* --- checks ------------------------------------------------------------------------ */
static const char *cur_entry;

#define FINDING(...)                                         \
  do {                                                       \
    fprintf(stderr, "FINDING in %s: ", cur_entry);           \
    fprintf(stderr, __VA_ARGS__);                            \
    fprintf(stderr, "\n");                                   \
    abort();                                                 \
  } while (0)

#define BIT(s) (1u << (s))

/* allowed: bit set of acceptable statuses (BIT(TG_OK) alone = must succeed). */
static void check(tg_ctx *ctx, tg_status st, unsigned allowed) {
  /* A call that must be refused gets buffers smaller than the extents its
   * sizes declare; reckoned by those extents (as the library does), its
   * buffers may overlap each other, so TG_ERR_ALIAS is a right refusal too.
   * A call that must succeed has exact, separate buffers: TG_ERR_ALIAS there
   * is a finding. */
  if (!(allowed & BIT(TG_OK))) allowed |= BIT(TG_ERR_ALIAS);
  if ((unsigned)st > 31 || !(allowed & BIT(st)))
    FINDING("status %d (%s), allowed set 0x%x; last error: %s", (int)st,
            tg_status_str(st), allowed, ctx ? tg_ctx_last_error(ctx) : "(no ctx)");
  if (st != TG_OK) {
    if (!outputs_unchanged()) FINDING("status %d but an output was written", (int)st);
    if (ctx && !tg_ctx_last_error(ctx)[0]) FINDING("status %d with an empty message", (int)st);
  }
}

/* product of n >= 1 factors times elem bytes fits int64 (factors >= 1) */
static int bytes_fit(size_t elem, int n, const int64_t *f) {
  int64_t acc = (int64_t)elem;
  for (int i = 0; i < n; i++)
    if (__builtin_mul_overflow(acc, f[i], &acc)) return 0;
  return 1;
}

/* 0 if every size is >= 1 and the byte size fits; BAD_SHAPE if a size is 0
 * (whatever the others multiply to), else OVERFLOW if the byte size passes
 * int64. */
static unsigned shape_rule(int n, const int64_t *f, size_t elem) {
  int64_t acc = (int64_t)elem;
  int ovf = 0;
  for (int i = 0; i < n; i++) {
    if (f[i] < 1) return BIT(TG_ERR_BAD_SHAPE);
    if (!ovf && __builtin_mul_overflow(acc, f[i], &acc)) ovf = 1;
  }
  return ovf ? BIT(TG_ERR_OVERFLOW) : 0;
}

/* does an accepted call fit the caps? */
static int fits(int64_t elems, size_t elem) {
  int64_t b;
  return elems >= 1 && !__builtin_mul_overflow(elems, (int64_t)elem, &b) && b <= TG_FUZZ_CAP;
}

static int64_t prod(int n, const int64_t *f) {
  int64_t acc = 1;
  for (int i = 0; i < n; i++)
    if (__builtin_mul_overflow(acc, f[i], &acc)) return INT64_MAX;
  return acc;
}

/* --- attention ----------------------------------------------------------------------- */
/* Largest offset + 1 addressed through strides s over [n0, n1, n2, len]; -1 when
 * it overflows int64 (strides >= 0, sizes >= 1). */
static int64_t extent(const int64_t s[3], int64_t n0, int64_t n1, int64_t n2, int64_t len) {
  int64_t a, b, c, e;
  if (__builtin_mul_overflow(n0 - 1, s[0], &a) || __builtin_mul_overflow(n1 - 1, s[1], &b) ||
      __builtin_mul_overflow(n2 - 1, s[2], &c) || __builtin_add_overflow(a, b, &e) ||
      __builtin_add_overflow(e, c, &e) || __builtin_add_overflow(e, len, &e))
    return -1;
  return e;
}

static void tiling(int64_t qL, int64_t kL, int64_t t[6]) {
  t[0] = (qL + 31) / 32, t[1] = (kL + 15) / 16, t[2] = qL / 32, t[3] = kL / 16;
  t[4] = qL % 32, t[5] = kL % 16;
}
static void retile(tg_attn_params *p) {
  int64_t t[6];
  tiling(p->qL, p->kL, t);
  p->NQ = (int32_t)t[0], p->NK = (int32_t)t[1], p->NQ_aligned = (int32_t)t[2];
  p->NK_aligned = (int32_t)t[3], p->qL_rem = (int32_t)t[4], p->kL_rem = (int32_t)t[5];
}

typedef struct {
  unsigned allowed;             /* statuses the contract allows */
  int64_t eQ, eK, eV, eO, eM;   /* extents (elements); valid only when allowed == OK */
  int64_t nq, nk, nkv, nrow, work; /* dQ, dK, dV (Dv columns), rows, multiply-adds */
} attn_plan;

/* Dv: the value head dim (V, O, dO, dV columns; 0 = D), a valid one. */
static attn_plan attn_oracle(const tg_attn_params *p, const tg_attn_mask_params *mp,
                             int has_mask, int64_t Dv) {
  attn_plan pl = {0};
  unsigned bad = 0;
  if (!p) return (attn_plan){.allowed = BIT(TG_ERR_NULL_ARG)};
  const int64_t B = p->B, H = p->H, D = p->D, qL = p->qL, kL = p->kL, g = p->gqa_factor;
  if (!Dv) Dv = D;
  const int sizes_ok = B >= 1 && H >= 1 && D >= 1 && qL >= 1 && kL >= 1 && g >= 1;
  if (!sizes_ok) bad |= BIT(TG_ERR_BAD_SHAPE);
  if (g >= 1 && H % g != 0) bad |= BIT(TG_ERR_BAD_SHAPE);
  if (D % 8 != 0 || D > 512) bad |= BIT(TG_ERR_UNSUPPORTED);
  int64_t t[6];
  tiling(qL, kL, t);
  const int32_t have[6] = {p->NQ, p->NK, p->NQ_aligned, p->NK_aligned, p->qL_rem, p->kL_rem};
  for (int i = 0; i < 6; i++)
    if (have[i] != t[i]) bad |= BIT(TG_ERR_BAD_PARAMS);
  if (!isfinite(p->scale)) bad |= BIT(TG_ERR_BAD_PARAMS);
  if (!isfinite(p->softcapping) || !(p->softcapping > 0.0f)) bad |= BIT(TG_ERR_BAD_PARAMS);
  if (!!mp != !!has_mask) bad |= BIT(TG_ERR_NULL_ARG);
  const int64_t *S[5] = {p->Q_strides, p->K_strides, p->V_strides, p->O_strides,
                         mp ? mp->M_strides : NULL};
  /* per tensor, as the contract reads: a negative stride is BAD_PARAMS, else
   * an addressed offset beyond int64 is OVERFLOW */
  int64_t *ext[5] = {&pl.eQ, &pl.eK, &pl.eV, &pl.eO, &pl.eM};
  const int64_t Hk = (g >= 1 && H % g == 0) ? H / g : 1;
  const int64_t heads[5] = {H, Hk, Hk, H, H}, len[5] = {qL, kL, kL, qL, qL};
  pl.eM = 1;
  for (int k = 0; k < 5; k++) {
    if (!S[k]) continue;
    int neg = 0;
    for (int i = 0; i < 3; i++) neg |= S[k][i] < 0;
    if (neg) {
      bad |= BIT(TG_ERR_BAD_PARAMS);
    } else if (sizes_ok) {
      *ext[k] = extent(S[k], B, heads[k], len[k], k == 4 ? kL : k == 2 || k == 3 ? Dv : D);
      if (*ext[k] < 0) bad |= BIT(TG_ERR_OVERFLOW);
    }
  }
  if (sizes_ok) {
    const int64_t fq[4] = {B, H, qL, D}, fk[4] = {B, Hk, kL, D}, fv[4] = {B, Hk, kL, Dv};
    if (!bytes_fit(4, 4, fq) || !bytes_fit(4, 4, fk) || !bytes_fit(4, 4, fv))
      bad |= BIT(TG_ERR_OVERFLOW);
    pl.nq = prod(4, fq), pl.nk = prod(4, fk), pl.nkv = prod(4, fv);
    const int64_t fr[3] = {B, H, qL}, fw[5] = {B, H, qL, kL, D > Dv ? D : Dv};
    pl.nrow = prod(3, fr);
    pl.work = prod(5, fw);
  }
  pl.allowed = bad ? bad : BIT(TG_OK);
  return pl;
}

static void set_contig(int64_t s[3], int64_t heads, int64_t L, int64_t D) {
  s[2] = D, s[1] = L * D, s[0] = heads * L * D;
}

static int attn_value_dim(int D);

/* Params: raw bytes, or a small valid problem with a few field mutations. */
static void decode_params(rd *r, tg_attn_params *p, tg_attn_mask_params *mp, int *has_mask) {
  const uint8_t mode = u8(r);
  *has_mask = (mode >> 2) & 1;
  if ((mode & 3) == 0) { /* raw struct bytes */
    uint8_t b[sizeof *p];
    for (size_t i = 0; i < sizeof b; i++) b[i] = u8(r);
    memcpy(p, b, sizeof *p);
    uint8_t m[sizeof *mp];
    for (size_t i = 0; i < sizeof m; i++) m[i] = u8(r);
    memcpy(mp, m, sizeof *mp);
    return;
  }
  static const int Ds[] = {8, 16, 24, 32, 40, 64, 72, 128, 8, 16};
  const int B = 1 + u8(r) % 3, Hk = 1 + u8(r) % 3, g = 1 + u8(r) % 3;
  const int qL = 1 + u8(r) % 140, D = Ds[u8(r) % 10];
  /* kL above 448 (8 key tiles) makes the KV schedule split keys into ranges */
  const uint8_t kb = u8(r);
  const int kL = kb < 224 ? 1 + kb % 140 : 440 + (kb - 224) * 8;
  memset(p, 0, sizeof *p);
  p->B = B, p->H = Hk * g, p->D = D, p->qL = qL, p->kL = kL, p->gqa_factor = g;
  p->scale = (u8(r) & 1) ? pick_f32(r) : 1.0f / sqrtf((float)D);
  p->softcapping = (u8(r) & 3) == 0 ? pick_f32(r) : 1.0f;
  p->qL_off = (u8(r) & 3) == 0 ? (int32_t)((int64_t)pick_i32(r, 64) - 32) : kL - qL;
  retile(p);
  const uint8_t layout = u8(r);
  const int Dv = attn_value_dim(D); /* V, O, dO columns */
  set_contig(p->Q_strides, p->H, qL, D);
  set_contig(p->O_strides, p->H, qL, Dv);
  set_contig(p->K_strides, Hk, kL, D);
  set_contig(p->V_strides, Hk, kL, Dv);
  if (layout & 1) { /* Q, O as [B, L, H, D] */
    const int64_t s[3] = {(int64_t)qL * p->H * D, D, (int64_t)p->H * D};
    const int64_t o[3] = {(int64_t)qL * p->H * Dv, Dv, (int64_t)p->H * Dv};
    memcpy(p->Q_strides, s, sizeof s);
    memcpy(p->O_strides, o, sizeof o);
  }
  if (layout & 2) { /* K, V rows padded */
    const int64_t pad = 8 * (1 + (layout >> 4) % 3);
    const int64_t s[3] = {(int64_t)Hk * kL * (D + pad), kL * (D + pad), D + pad};
    const int64_t v[3] = {(int64_t)Hk * kL * (Dv + pad), kL * (Dv + pad), Dv + pad};
    memcpy(p->K_strides, s, sizeof s);
    memcpy(p->V_strides, v, sizeof v);
  }
  if (layout & 4) p->K_strides[0] = p->V_strides[0] = 0; /* batch broadcast */
  mp->M_strides[2] = kL;
  mp->M_strides[1] = (layout & 8) ? 0 : (int64_t)qL * kL;
  mp->M_strides[0] = (layout & 8) ? 0 : (int64_t)p->H * qL * kL;
  /* mutations: field, value */
  const int nmut = (mode >> 3) & 3;
  for (int m = 0; m < nmut; m++) {
    const uint8_t f = u8(r) % 32;
    if (f < 6) { /* B H D qL kL gqa */
      int32_t *fields[6] = {&p->B, &p->H, &p->D, &p->qL, &p->kL, &p->gqa_factor};
      *fields[f] = pick_i32(r, 8);
    } else if (f < 8) {
      (f == 6 ? &p->scale : &p->softcapping)[0] = pick_f32(r);
    } else if (f < 16) {
      int32_t *fields[8] = {&p->NQ, &p->NK, &p->NQ_aligned, &p->NK_aligned,
                            &p->qL_rem, &p->kL_rem, &p->qL_off, &p->_pad};
      *fields[f - 8] = pick_i32(r, 40);
    } else if (f < 28) {
      int64_t *s = (f < 19 ? p->Q_strides : f < 22 ? p->K_strides : f < 25 ? p->V_strides
                                                                     : p->O_strides) +
                   (f - 16) % 3;
      *s = pick_i64(r, *s);
    } else if (f < 31) {
      mp->M_strides[f - 28] = pick_i64(r, mp->M_strides[f - 28]);
    } else {
      retile(p); /* sizes mutated above, tiling made consistent again */
    }
  }
  if (mode & 0x20) retile(p);
}

static int tame_attn(const tg_attn_params *p) {
  return !raw_data && fabsf(p->scale) <= 64.0f;
}

static void fill_mask(uint16_t *m, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (raw_data) {
      m[i] = (uint16_t)rnd();
    } else {
      const float u = uni(0, 1);
      m[i] = to_bf16(u < 0.2f ? -INFINITY : uni(-4, 4));
    }
  }
}

/* The dtype entry points (tg_attn_train_*, entries 20 and 21): the element
 * type of Q, K, V, dO, O and the mask, and the options; `bad` when the
 * dtype or the options must be refused (TG_ERR_BAD_PARAMS, checked before
 * the params). Off (on = 0) for the bf16 contract entry points.
 * The variants (read when the ext byte's high nibble is 1-14): a window,
 * sinks [H] (an input), d_sinks [H] (an accumulated output of the
 * backward; without sinks the backward must refuse it, TG_ERR_BAD_PARAMS),
 * a value head dim: D given explicitly, another valid one (V, O, dO, dV
 * with those columns), or one the contract refuses (TG_ERR_UNSUPPORTED).
 * Their checks' order against the params' is not specified: a refusal they
 * call for may come as any status the params call for too. */
static struct {
  int on, bad;
  tg_dtype dtype;
  size_t es; /* element bytes of the typed tensors */
  tg_attn_options opt;
  const tg_attn_options *optp;
  int sinks, d_sinks;  /* buffers given */
  int vdim_sel;        /* 0 none, 1 = D, 2 vdim (valid), 3 vdim (refused) */
  uint32_t vdim;
} ext;

/* The value head dim the harness lays V, O, dO out with. */
static int attn_value_dim(int D) {
  return ext.on && ext.vdim_sel == 2 ? (int)ext.vdim : D;
}

static void decode_variants(rd *r) {
  const uint8_t v = u8(r);
  if (v & 1) ext.opt.window = (v & 32) ? 1 + u8(r) % 64 : u32(r);
  ext.sinks = (v >> 1) & 1;
  ext.d_sinks = (v >> 2) & 1;
  ext.vdim_sel = (v >> 3) & 3;
  static const uint32_t valid[5] = {8, 16, 64, 128, 512};
  static const uint32_t refused[6] = {4, 12, 520, 1, 1024, UINT32_MAX};
  if (ext.vdim_sel == 2) ext.vdim = valid[u8(r) % 5];
  if (ext.vdim_sel == 3) ext.vdim = (u8(r) & 1) ? refused[u8(r) % 6] : u32(r) | 1;
}

static void decode_ext(rd *r) {
  const uint8_t e = u8(r);
  ext.on = 1;
  ext.bad = 0;
  ext.sinks = ext.d_sinks = ext.vdim_sel = 0;
  ext.vdim = 0;
  ext.dtype = (e & 1) ? TG_DTYPE_F32 : TG_DTYPE_BF16;
  memset(&ext.opt, 0, sizeof ext.opt);
  ext.optp = &ext.opt;
  switch ((e >> 1) & 7) {
    case 0: ext.optp = NULL; break;                       /* the defaults */
    case 1: /* p = 0; dK, dV written or accumulated */
      ext.opt.flags = (u8(r) & 1) ? TG_ATTN_OPT_DKV_WRITE : 0;
      break;
    case 2: case 3:                                        /* dropout */
      ext.opt.dropout_p = (float)(u8(r) % 255) / 256.0f;
      ext.opt.dropout_seed = u64(r);
      ext.opt.dropout_offset = u64(r);
      break;
    case 4: ext.opt.dropout_p = NAN, ext.bad = 1; break;
    case 5: ext.opt.dropout_p = 1.0f, ext.bad = 1; break;
    case 6: ext.opt.dropout_p = -0.25f, ext.bad = 1; break;
    default: ext.opt.flags = (1u + u8(r)) << 2, ext.bad = 1; break; /* undefined bits */
  }
  if ((e >> 4) == 15) ext.dtype = (tg_dtype)(2 + u8(r) % 3), ext.bad = 1;
  ext.es = ext.dtype == TG_DTYPE_BF16 ? 2 : 4; /* a bad dtype: 4, the larger */
  if ((e >> 4) >= 1 && (e >> 4) <= 14) {
    decode_variants(r);
    ext.optp = &ext.opt; /* the options carry them, whatever the mode said */
  }
}

/* Typed tensors: fill and finiteness by ext's element type (bf16 when off). */
static void fill_typed(void *x, int64_t n, float lo, float hi) {
  if (ext.on && ext.es == 4)
    fill_f32(x, n, lo, hi);
  else
    fill_bf16(x, n, lo, hi);
}
static int finite_typed(const void *x, int64_t n) {
  return ext.on && ext.es == 4 ? finite_f32(x, n) : finite_bf16(x, n);
}
static void fill_mask_typed(void *m, int64_t n) {
  if (!(ext.on && ext.es == 4)) {
    fill_mask(m, n);
    return;
  }
  float *f = m;
  for (int64_t i = 0; i < n; i++)
    f[i] = raw_data ? bits_f32((uint32_t)rnd()) : uni(0, 1) < 0.2f ? -INFINITY : uni(-4, 4);
}

/* The FA-2 calls, through the contract's bf16 entry points or the dtype ones. */
static tg_status call_fwd(tg_ctx *c, void *const a[5], const tg_attn_params *pp,
                          const tg_attn_mask_params *mpp, const void *mask, int causal) {
  if (ext.on)
    return tg_attn_train_fwd(c, ext.dtype, a[0], a[1], a[2], a[3], a[4], pp, mpp, mask, causal,
                             ext.optp);
  return tg_flash_attn_train_fwd_bf16(c, a[0], a[1], a[2], a[3], a[4], pp, mpp, mask, causal);
}
static tg_status call_bwd(tg_ctx *c, void *const a[9], const tg_attn_params *pp,
                          const tg_attn_mask_params *mpp, const void *mask, int causal) {
  if (ext.on)
    return tg_attn_train_bwd(c, ext.dtype, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                             pp, mpp, mask, causal, ext.optp);
  return tg_flash_attn_train_bwd_bf16(c, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8],
                                      pp, mpp, mask, causal);
}
static tg_status call_compute_d(tg_ctx *c, void *const a[3], uint32_t B, uint32_t H,
                                uint32_t qL, uint32_t D) {
  if (ext.on) return tg_attn_train_bwd_compute_d(c, ext.dtype, a[0], a[1], a[2], B, H, qL, D);
  return tg_flash_attn_train_bwd_compute_d_bf16(c, a[0], a[1], a[2], B, H, qL, D);
}

static tg_ctx *new_ctx(int threads, int det, int portable);

/* TG_FUZZ_DEBUG=1: print the decoded attention problem (for reproducers) */
static void dump_params(const tg_attn_params *p, const tg_attn_mask_params *mp, int has_mask,
                        int causal) {
  if (!getenv("TG_FUZZ_DEBUG")) return;
  fprintf(stderr,
          "params: B %d H %d D %d qL %d kL %d gqa %d scale %a softcap %a NQ %d NK %d "
          "NQa %d NKa %d qLr %d kLr %d qL_off %d\n",
          p->B, p->H, p->D, p->qL, p->kL, p->gqa_factor, (double)p->scale,
          (double)p->softcapping, p->NQ, p->NK, p->NQ_aligned, p->NK_aligned, p->qL_rem,
          p->kL_rem, p->qL_off);
  const int64_t *S[4] = {p->Q_strides, p->K_strides, p->V_strides, p->O_strides};
  for (int i = 0; i < 4; i++)
    fprintf(stderr, "  %c_strides %lld %lld %lld\n", "QKVO"[i], (long long)S[i][0],
            (long long)S[i][1], (long long)S[i][2]);
  fprintf(stderr, "  mask %d M_strides %lld %lld %lld causal %d\n", has_mask,
          (long long)mp->M_strides[0], (long long)mp->M_strides[1], (long long)mp->M_strides[2],
          causal);
}

static void fuzz_attention(rd *r, tg_ctx *ctx, int which, uint8_t flags, int threads) {
  tg_attn_params p;
  tg_attn_mask_params mp;
  int has_mask;
  decode_params(r, &p, &mp, &has_mask);
  const uint8_t ptrsel = u8(r);
  const int causal = (int)(u8(r) % 3) - (flags >> 7); /* any int: non-zero = causal */
  dump_params(&p, &mp, has_mask, causal);
  if (which == 2) { /* compute_d through the params' sizes (contiguous) */
    const uint32_t B = (uint32_t)p.B, H = (uint32_t)p.H, qL = (uint32_t)p.qL,
                   D = (uint32_t)p.D;
    const int64_t f[4] = {B, H, qL, D};
    unsigned allowed = shape_rule(4, f, 4);
    allowed = allowed ? allowed : BIT(TG_OK);
    const int nullsel = (ptrsel & 0x03) == 0x03 ? 1 + u8(r) % 3 : 0;
    if (ext.on && (ext.dtype != TG_DTYPE_BF16 && ext.dtype != TG_DTYPE_F32))
      allowed = BIT(TG_ERR_BAD_PARAMS); /* checked before the sizes */
    if (nullsel) allowed = (allowed & ~BIT(TG_OK)) | BIT(TG_ERR_NULL_ARG);
    const size_t es = ext.on ? ext.es : 2;
    const int64_t n = prod(4, f), rows = prod(3, f);
    if (allowed == BIT(TG_OK) && (!fits(n, es) || !fits(rows, 4))) return;
    void *O = buf(n, es, 0), *dO = buf(n, es, 0);
    float *Dv = buf(rows, 4, 1);
    fill_typed(O, allowed == BIT(TG_OK) ? n : 1, -2, 2);
    fill_typed(dO, allowed == BIT(TG_OK) ? n : 1, -2, 2);
    snapshot();
    void *a[3] = {O, dO, Dv};
    if (nullsel) a[nullsel - 1] = NULL;
    if (flags & 0x10) check(NULL, call_compute_d(NULL, a, B, H, qL, D), BIT(TG_ERR_NULL_ARG));
    const tg_status st = call_compute_d(ctx, a, B, H, qL, D);
    check(ctx, st, allowed);
    if (st == TG_OK && !raw_data && !finite_f32(Dv, rows)) FINDING("D_out not finite");
    return;
  }

  const int give_p = (ptrsel & 0xF0) != 0xF0;
  const int give_mp = has_mask ? ((ptrsel & 0x0C) != 0x0C) : ((ptrsel & 0x0C) == 0x04);
  const int give_mask = has_mask;
  const int64_t Dv = ext.on && ext.vdim_sel == 2 ? ext.vdim : 0;
  attn_plan pl = attn_oracle(give_p ? &p : NULL, give_mp ? &mp : NULL, give_mask, Dv);
  /* NULL buffers: ptrsel low bits pick one (0 = none) */
  const int nptr = which == 0 ? 5 : 9;
  const int nullsel = (ptrsel & 0x03) == 0x03 ? 1 + u8(r) % nptr : 0;
  /* the dtype entry points check the dtype and options before the params */
  if (ext.on && ext.bad) pl.allowed = BIT(TG_ERR_BAD_PARAMS);
  if (ext.on && ext.vdim_sel == 1) ext.opt.v_head_dim = (uint32_t)p.D; /* as 0 */
  if (ext.on && ext.vdim_sel >= 2) ext.opt.v_head_dim = ext.vdim;
  /* refused: the value head dim drawn so, or D passed as one where D itself
   * is no valid head dim (then the params are refused anyway) */
  if (ext.on && (ext.vdim_sel == 3 ||
                 (ext.vdim_sel == 1 && !(p.D >= 8 && p.D % 8 == 0 && p.D <= 512))))
    pl.allowed = (pl.allowed & ~BIT(TG_OK)) | BIT(TG_ERR_UNSUPPORTED);
  if (ext.on && which == 1 && ext.d_sinks && !ext.sinks)
    pl.allowed = (pl.allowed & ~BIT(TG_OK)) | BIT(TG_ERR_BAD_PARAMS);
  if (nullsel) pl.allowed = (pl.allowed & ~BIT(TG_OK)) | BIT(TG_ERR_NULL_ARG);
  const size_t es = ext.on ? ext.es : 2;
  if (pl.allowed == BIT(TG_OK)) { /* must succeed: exact buffers, if small enough */
    if (!fits(pl.eQ, es) || !fits(pl.eK, es) || !fits(pl.eV, es) || !fits(pl.eO, es) ||
        !fits(pl.eM, es) || !fits(pl.nq, 4) || !fits(pl.nk, 4) || !fits(pl.nkv, 4) ||
        pl.work > WORK_CAP)
      return;
  } else {
    pl.eQ = pl.eK = pl.eV = pl.eO = pl.eM = 64;
    pl.nq = pl.nk = pl.nkv = pl.nrow = 64;
  }
  if (pl.nrow < 1) pl.nrow = 64;
  void *Q = buf(pl.eQ, es, 0), *K = buf(pl.eK, es, 0), *V = buf(pl.eV, es, 0);
  void *mask = give_mask ? buf(pl.eM, es, 0) : NULL;
  fill_typed(Q, pl.eQ, -2, 2), fill_typed(K, pl.eK, -2, 2), fill_typed(V, pl.eV, -1, 1);
  if (mask) fill_mask_typed(mask, pl.eM);
  const tg_attn_params *pp = give_p ? &p : NULL;
  const tg_attn_mask_params *mpp = give_mp ? &mp : NULL;
  tg_status st;
  /* sinks [H] (finite, a quarter -inf: no sink) and d_sinks [H]: exact
   * where the call must succeed, else capped as every buffer (buf) */
  const int64_t nh = p.H < 1 ? 1 : p.H < TG_FUZZ_CAP / 4 ? p.H : TG_FUZZ_CAP / 4;
  ext.opt.sinks = NULL, ext.opt.d_sinks = NULL;
  if (ext.on && ext.sinks) {
    float *sk = buf(nh, 4, 0);
    fill_f32(sk, nh, -4, 4);
    for (int64_t h = 0; h < nh && !raw_data; h++)
      if (uni(0, 1) < 0.25f) sk[h] = -INFINITY;
    ext.opt.sinks = sk;
  }

  if (which == 0) { /* forward: O via O_strides, L */
    char *O = buf(pl.eO, es, 1);
    float *L = buf(pl.nrow, 4, 1);
    fill_typed(O, pl.eO, -1, 1);
    fill_f32(L, pl.nrow, -1, 1);
    snapshot();
    void *a[5] = {Q, K, V, O, L};
    if (nullsel) a[nullsel - 1] = NULL;
    if (flags & 0x10) check(NULL, call_fwd(NULL, a, pp, mpp, mask, causal), BIT(TG_ERR_NULL_ARG));
    st = call_fwd(ctx, a, pp, mpp, mask, causal);
    check(ctx, st, pl.allowed);
    if (st == TG_OK && tame_attn(&p)) {
      for (int64_t i = 0; i < pl.nrow; i++)
        if (isnan(L[i]) || L[i] == INFINITY) FINDING("L[%lld] = %g", (long long)i, L[i]);
      /* O rows through O_strides */
      for (int64_t b = 0; b < p.B; b++)
        for (int64_t h = 0; h < p.H; h++)
          for (int64_t i = 0; i < p.qL; i++)
            if (!finite_typed(O + (b * p.O_strides[0] + h * p.O_strides[1] +
                                   i * p.O_strides[2]) * (int64_t)es,
                              Dv ? Dv : p.D))
              FINDING("O row (%lld, %lld, %lld) not finite", (long long)b, (long long)h,
                      (long long)i);
    }
    return;
  }
  /* backward */
  void *dO = buf(pl.eO, es, 0);
  float *L = buf(pl.nrow, 4, 0), *Dvec = buf(pl.nrow, 4, 0);
  float *d_sinks = ext.on && ext.d_sinks ? buf(nh, 4, 1) : NULL;
  if (d_sinks) fill_f32(d_sinks, nh, -1, 1);
  float *dQ = buf(pl.nq, 4, 1), *dK = buf(pl.nk, 4, 1), *dV = buf(pl.nkv, 4, 1);
  fill_typed(dO, pl.eO, -1, 1);
  fill_f32(Dvec, pl.nrow, -1, 1);
  fill_f32(dQ, pl.nq, -1, 1), fill_f32(dK, pl.nk, -1, 1), fill_f32(dV, pl.nkv, -1, 1);
  int chained = 0; /* L from the forward: P <= 1, the gradients are finite */
  if (pl.allowed == BIT(TG_OK) && !nullsel && (flags & 0x08) && fits(pl.eO, es)) {
    void *O = malloc((size_t)pl.eO * es);
    memset(O, 0, (size_t)pl.eO * es);
    void *const fa[5] = {Q, K, V, O, L};
    if (call_fwd(ctx, fa, pp, mpp, mask, causal) != TG_OK)
      FINDING("forward refused what the backward must accept: %s", tg_ctx_last_error(ctx));
    free(O);
    chained = 1;
  } else {
    fill_f32(L, pl.nrow, -4, 4);
  }
  snapshot();
  ext.opt.d_sinks = d_sinks;
  void *a[9] = {Q, K, V, L, dO, Dvec, dQ, dK, dV};
  if (nullsel) a[nullsel - 1] = NULL;
  if (flags & 0x10) check(NULL, call_bwd(NULL, a, pp, mpp, mask, causal), BIT(TG_ERR_NULL_ARG));
  st = call_bwd(ctx, a, pp, mpp, mask, causal);
  check(ctx, st, pl.allowed);
  if (st != TG_OK) return;
  if (chained && tame_attn(&p) &&
      (!finite_f32(dQ, pl.nq) || !finite_f32(dK, pl.nk) || !finite_f32(dV, pl.nkv) ||
       (d_sinks && !finite_f32(d_sinks, nh))))
    FINDING("backward gradients not finite (tame inputs, L from the forward)");
  if (flags & 0x01) { /* deterministic: another thread count, same bits */
    float *q2 = malloc((size_t)pl.nq * 4), *k2 = malloc((size_t)pl.nk * 4),
          *v2 = malloc((size_t)pl.nkv * 4), *s2 = d_sinks ? malloc((size_t)nh * 4) : NULL;
    memcpy(q2, bufs[nbufs - 3].snap, (size_t)pl.nq * 4);
    memcpy(k2, bufs[nbufs - 2].snap, (size_t)pl.nk * 4);
    memcpy(v2, bufs[nbufs - 1].snap, (size_t)pl.nkv * 4);
    if (s2) memcpy(s2, bufs[nbufs - 4].snap, (size_t)nh * 4); /* d_sinks' */
    ext.opt.d_sinks = s2;
    tg_ctx *c2 = new_ctx(threads % 3 + 1, 1, flags & 0x04);
    void *const a2[9] = {Q, K, V, L, dO, Dvec, q2, k2, v2};
    if (call_bwd(c2, a2, pp, mpp, mask, causal) != TG_OK)
      FINDING("second deterministic run refused");
    if (memcmp(q2, dQ, (size_t)pl.nq * 4) || memcmp(k2, dK, (size_t)pl.nk * 4) ||
        memcmp(v2, dV, (size_t)pl.nkv * 4) || (s2 && memcmp(s2, d_sinks, (size_t)nh * 4)))
      FINDING("deterministic backward differs between %d and %d threads", threads,
              threads % 3 + 1);
    tg_ctx_destroy(c2);
    free(q2), free(k2), free(v2), free(s2);
  }
}

static void fuzz_params_init(rd *r) {
  tg_attn_params p, snap;
  memset(&p, 0xA5, sizeof p);
  snap = p;
  int v[6];
  for (int i = 0; i < 6; i++) v[i] = pick_i32(r, 40);
  const float scale = pick_f32(r);
  const int null = (u8(r) & 15) == 0;
  unsigned allowed = 0;
  for (int i = 0; i < 6; i++)
    if (v[i] < 1) allowed |= BIT(TG_ERR_BAD_SHAPE);
  if (v[2] >= 1 && v[1] % v[2] != 0) allowed |= BIT(TG_ERR_BAD_SHAPE);
  if (!allowed) { /* the batch strides heads * L * D must fit int64 */
    const int64_t fq[3] = {v[1], v[3], v[5]}, fk[3] = {v[2], v[4], v[5]};
    if (prod(3, fq) == INT64_MAX || prod(3, fk) == INT64_MAX) allowed = BIT(TG_ERR_OVERFLOW);
  }
  if (null) allowed = BIT(TG_ERR_NULL_ARG);
  if (!allowed) allowed = BIT(TG_OK);
  const tg_status st =
      tg_attn_params_init(null ? NULL : &p, v[0], v[1], v[2], v[3], v[4], v[5], scale);
  if (!(allowed & BIT(st))) FINDING("params_init status %d, allowed 0x%x", (int)st, allowed);
  if (st != TG_OK && memcmp(&p, &snap, sizeof p)) FINDING("params_init wrote *p on failure");
  if (st == TG_OK) {
    int64_t t[6];
    tiling(v[3], v[4], t);
    if (p.NQ != t[0] || p.NK != t[1] || p.NQ_aligned != t[2] || p.NK_aligned != t[3] ||
        p.qL_rem != t[4] || p.kL_rem != t[5] || p.gqa_factor != v[1] / v[2] ||
        p.softcapping != 1.0f || p.qL_off != (int32_t)((int64_t)v[4] - v[3]))
      FINDING("params_init filled inconsistent fields");
  }
}

/* --- the other kernels ------------------------------------------------------------------ */
#define NULLSEL(n) ((u8(r) & 3) == 3 ? 1 + u8(r) % (n) : 0)
#define REFUSE_NULL(sel, allowed) \
  ((sel) ? (((allowed) & ~BIT(TG_OK)) | BIT(TG_ERR_NULL_ARG)) : (allowed))

static unsigned ok_or(unsigned bad) { return bad ? bad : BIT(TG_OK); }

static void fuzz_rows(rd *r, tg_ctx *ctx, int which, uint8_t flags) {
  const uint32_t rows = pick_u32(r, 48), dim = pick_u32(r, 80);
  float eps = (u8(r) & 1) ? pick_f32(r) : 1e-5f;
  const int64_t f[2] = {rows, dim};
  unsigned bad = shape_rule(2, f, 4);
  const int with_eps = which <= 1 || which == 4;
  if (with_eps && (!isfinite(eps) || eps < 0.0f)) bad |= BIT(TG_ERR_BAD_PARAMS);
  const int nptr = which == 0 ? 4 : which == 1 ? 2 : which == 2 ? 5 : which == 3 ? 4
                   : which == 4 ? 5 : 3;
  const int sel = NULLSEL(nptr);
  const int r_null = which == 0 && sel == 4; /* forward: r_out may be NULL */
  unsigned allowed = r_null ? ok_or(bad) : REFUSE_NULL(sel, ok_or(bad));
  const int64_t n = prod(2, f);
  if (allowed == BIT(TG_OK) && (!fits(n, 4) || n > WORK_CAP)) return;
  const int64_t nn = allowed == BIT(TG_OK) ? n : 16, nr = allowed == BIT(TG_OK) ? rows : 16,
                nd = allowed == BIT(TG_OK) ? dim : 16;
  float *x = buf(nn, 4, 0), *w = buf(nd, 4, 0), *dy = buf(nn, 4, 0), *rr = buf(nr, 4, 0);
  fill_f32(x, nn, -4, 4), fill_f32(w, nd, -2, 2), fill_f32(dy, nn, -1, 1);
  fill_f32(rr, nr, 0.1f, 4);
  tg_status st = TG_OK;
  const int tame = !raw_data && (!with_eps || eps >= 1e-6f);
  switch (which) {
    case 0: { /* forward: x w y r_out */
      float *y = buf(nn, 4, 1), *ro = buf(nr, 4, 1);
      snapshot();
      void *a[4] = {x, w, y, ro};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_rms_norm_forward_f32(NULL, a[0], a[1], a[2], a[3], rows, dim, eps),
              BIT(TG_ERR_NULL_ARG));
      st = tg_rms_norm_forward_f32(ctx, a[0], a[1], a[2], a[3], rows, dim, eps);
      check(ctx, st, allowed);
      if (st == TG_OK && tame && (!finite_f32(y, n) || (a[3] && !finite_f32(ro, rows))))
        FINDING("rms forward not finite");
      break;
    }
    case 1: { /* rms_inv: x r */
      float *ro = buf(nr, 4, 1);
      snapshot();
      void *a[2] = {x, ro};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_rms_norm_compute_rms_inv_f32(NULL, a[0], a[1], rows, dim, eps),
              BIT(TG_ERR_NULL_ARG));
      st = tg_rms_norm_compute_rms_inv_f32(ctx, a[0], a[1], rows, dim, eps);
      check(ctx, st, allowed);
      if (st == TG_OK && tame && !finite_f32(ro, rows)) FINDING("rms_inv not finite");
      break;
    }
    case 2: { /* dx: x w dy r dx */
      float *dx = buf(nn, 4, 1);
      snapshot();
      void *a[5] = {x, w, dy, rr, dx};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_rms_norm_backward_dx_f32(NULL, a[0], a[1], a[2], a[3], a[4], rows, dim),
              BIT(TG_ERR_NULL_ARG));
      st = tg_rms_norm_backward_dx_f32(ctx, a[0], a[1], a[2], a[3], a[4], rows, dim);
      check(ctx, st, allowed);
      if (st == TG_OK && tame && !finite_f32(dx, n)) FINDING("dx not finite");
      break;
    }
    case 3: { /* dw: x dy r dw */
      float *dw = buf(nd, 4, 1);
      snapshot();
      void *a[4] = {x, dy, rr, dw};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_rms_norm_backward_dw_f32(NULL, a[0], a[1], a[2], a[3], rows, dim),
              BIT(TG_ERR_NULL_ARG));
      st = tg_rms_norm_backward_dw_f32(ctx, a[0], a[1], a[2], a[3], rows, dim);
      check(ctx, st, allowed);
      if (st == TG_OK && tame && !finite_f32(dw, dim)) FINDING("dw not finite");
      break;
    }
    case 4: { /* fused: input weight grad_out grad_input grad_weight */
      float *gi = buf(nn, 4, 1), *gw = buf(nd, 4, 1);
      fill_f32(gw, nd, -1, 1);
      snapshot();
      void *a[5] = {x, w, dy, gi, gw};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_rms_norm_backward(NULL, a[0], a[1], a[2], a[3], a[4], rows, dim, eps),
              BIT(TG_ERR_NULL_ARG));
      st = tg_rms_norm_backward(ctx, a[0], a[1], a[2], a[3], a[4], rows, dim, eps);
      check(ctx, st, allowed);
      if (st == TG_OK && tame && (!finite_f32(gi, n) || !finite_f32(gw, dim)))
        FINDING("fused rms backward not finite");
      break;
    }
    default: { /* softmax backward: sm grad_out grad_in */
      float *gi = buf(nn, 4, 1);
      snapshot();
      void *a[3] = {x, dy, gi};
      if (sel) a[sel - 1] = NULL;
      if (flags & 0x10)
        check(NULL, tg_softmax_backward(NULL, a[0], a[1], a[2], rows, dim),
              BIT(TG_ERR_NULL_ARG));
      st = tg_softmax_backward(ctx, a[0], a[1], a[2], rows, dim);
      check(ctx, st, allowed);
      if (st == TG_OK && !raw_data && !finite_f32(gi, n)) FINDING("softmax grad not finite");
      break;
    }
  }
}

static void fuzz_cast(rd *r, tg_ctx *ctx, uint8_t flags) {
  const uint8_t m = u8(r);
  const uint64_t n = (m & 3) == 3 ? u64(r) : (m & 3) == 2 ? (uint64_t)INT64_MAX / 4 + (m >> 2)
                                                          : pick_u32(r, 200);
  const int sel = NULLSEL(2);
  unsigned bad = n == 0 ? BIT(TG_ERR_BAD_SHAPE)
                 : n > (uint64_t)INT64_MAX / 4 ? BIT(TG_ERR_OVERFLOW) : 0;
  const unsigned allowed = REFUSE_NULL(sel, ok_or(bad));
  if (allowed == BIT(TG_OK) && !fits((int64_t)n, 4)) return;
  const int64_t nn = allowed == BIT(TG_OK) ? (int64_t)n : 16;
  float *src = buf(nn, 4, 0);
  uint16_t *dst = buf(nn, 2, 1);
  for (int64_t i = 0; i < nn; i++) src[i] = bits_f32((uint32_t)rnd()); /* any bits */
  snapshot();
  void *a[2] = {src, dst};
  if (sel) a[sel - 1] = NULL;
  if (flags & 0x10) check(NULL, tg_f32_to_bf16_cast(NULL, a[0], a[1], n), BIT(TG_ERR_NULL_ARG));
  const tg_status st = tg_f32_to_bf16_cast(ctx, a[0], a[1], n);
  check(ctx, st, allowed);
  if (st == TG_OK)
    for (int64_t i = 0; i < nn; i++)
      if (dst[i] != to_bf16(src[i])) FINDING("cast[%lld] wrong", (long long)i);
}

static void fuzz_embedding(rd *r, tg_ctx *ctx, uint8_t flags) {
  const uint32_t vocab = pick_u32(r, 60), seq = pick_u32(r, 60), dim = pick_u32(r, 70);
  const int sel = NULLSEL(3);
  const int64_t fo[2] = {seq, dim}, fw[2] = {vocab, dim};
  unsigned bad = shape_rule(2, fo, 4) | shape_rule(2, fw, 4);
  /* ids: mostly in range, sometimes one out of range */
  const uint8_t idmode = u8(r);
  const int64_t nids = !bad && seq <= 4096 ? seq : 0; /* readable ids */
  uint32_t *ids = buf(nids ? nids : 16, 4, 0);
  int any_bad = 0;
  for (int64_t t = 0; t < (nids ? nids : 16); t++) {
    uint32_t v = vocab ? (uint32_t)(rnd() % vocab) : 0;
    if ((idmode & 7) == 7 && (rnd() & 15) == 0) v = (rnd() & 1) ? vocab : (uint32_t)rnd();
    if ((idmode & 7) == 6) v = vocab ? vocab - 1 : 0;
    ids[t] = v;
    if (nids && v >= vocab) any_bad = 1;
  }
  if (!bad && !nids) return; /* valid shape, ids too long to supply */
  if (!bad && any_bad) bad |= BIT(TG_ERR_BAD_INDEX);
  const unsigned allowed = REFUSE_NULL(sel, ok_or(bad));
  const int64_t no = prod(2, fo), nw = prod(2, fw);
  if (allowed == BIT(TG_OK) && (!fits(no, 4) || !fits(nw, 4) || no > WORK_CAP)) return;
  float *g = buf(allowed == BIT(TG_OK) ? no : 16, 4, 0);
  float *gw = buf(allowed == BIT(TG_OK) ? nw : 16, 4, 1);
  fill_f32(g, allowed == BIT(TG_OK) ? no : 16, -1, 1);
  fill_f32(gw, allowed == BIT(TG_OK) ? nw : 16, -1, 1);
  snapshot();
  void *a[3] = {g, ids, gw};
  if (sel) a[sel - 1] = NULL;
  if (flags & 0x10)
    check(NULL, tg_embedding_backward(NULL, a[0], a[1], a[2], vocab, seq, dim),
          BIT(TG_ERR_NULL_ARG));
  const tg_status st = tg_embedding_backward(ctx, a[0], a[1], a[2], vocab, seq, dim);
  check(ctx, st, allowed);
  if (st == TG_OK && !raw_data && !finite_f32(gw, nw)) FINDING("grad_weight not finite");
}

static void fuzz_ce(rd *r, tg_ctx *ctx, uint8_t flags) {
  const uint32_t n_pos = pick_u32(r, 40), vocab = pick_u32(r, 90);
  const uint8_t m = u8(r);
  const uint32_t pad = (m & 3) == 0 ? u32(r) : (m & 3) == 1 ? vocab : (uint32_t)(m >> 2) % 8;
  const uint32_t count = (m & 0x40) ? 0 : (m & 0x80) ? u32(r) : n_pos;
  const int sel = NULLSEL(4);
  const int64_t f[2] = {n_pos, vocab};
  unsigned bad = shape_rule(2, f, 4);
  const int64_t nt = !bad && n_pos <= 4096 ? n_pos : 0;
  uint32_t *tg = buf(nt ? nt : 16, 4, 0);
  int any_bad = 0;
  const uint8_t tmode = u8(r);
  for (int64_t t = 0; t < (nt ? nt : 16); t++) {
    uint32_t v = vocab ? (uint32_t)(rnd() % vocab) : 0;
    if ((tmode & 3) == 1 && (rnd() & 7) == 0) v = pad;
    if ((tmode & 3) == 2 && (rnd() & 15) == 0) v = (rnd() & 1) ? vocab : (uint32_t)rnd();
    tg[t] = v;
    if (nt && v != pad && v >= vocab) any_bad = 1;
  }
  if (!bad && count != 0 && !nt) return;
  if (!bad && count != 0 && any_bad) bad |= BIT(TG_ERR_BAD_INDEX);
  const unsigned allowed = REFUSE_NULL(sel, ok_or(bad));
  const int64_t n = prod(2, f);
  const int run = allowed == BIT(TG_OK) && count != 0;
  if (run && (!fits(n, 4) || n > WORK_CAP)) return;
  float *l = buf(run ? n : 16, 4, 0), *g = buf(run ? n : 16, 4, 1), *loss = buf(1, 4, 1);
  fill_f32(l, run ? n : 16, -20, 20);
  fill_f32(g, run ? n : 16, -1, 1);
  *loss = raw_data ? bits_f32((uint32_t)rnd()) : 0.5f;
  snapshot();
  void *a[4] = {l, tg, g, loss};
  if (sel) a[sel - 1] = NULL;
  if (flags & 0x10)
    check(NULL, tg_cross_entropy_fwd_bwd(NULL, a[0], a[1], a[2], a[3], n_pos, vocab, pad, count),
          BIT(TG_ERR_NULL_ARG));
  const tg_status st =
      tg_cross_entropy_fwd_bwd(ctx, a[0], a[1], a[2], a[3], n_pos, vocab, pad, count);
  check(ctx, st, allowed);
  if (st == TG_OK && count == 0 && !outputs_unchanged())
    FINDING("count == 0 wrote an output");
  if (st == TG_OK && run && !raw_data && (!finite_f32(g, n) || !isfinite(*loss)))
    FINDING("cross-entropy not finite (tame logits)");
}

static void fuzz_transpose(rd *r, tg_ctx *ctx, uint8_t flags) {
  const uint32_t rows = pick_u32(r, 70), cols = pick_u32(r, 70);
  const int sel = NULLSEL(2);
  const int64_t f[2] = {rows, cols};
  const unsigned allowed = REFUSE_NULL(sel, ok_or(shape_rule(2, f, 4)));
  const int64_t n = prod(2, f);
  if (allowed == BIT(TG_OK) && !fits(n, 4)) return;
  const int64_t nn = allowed == BIT(TG_OK) ? n : 16;
  float *in = buf(nn, 4, 0), *out = buf(nn, 4, 1);
  for (int64_t i = 0; i < nn; i++) in[i] = bits_f32((uint32_t)rnd());
  snapshot();
  void *a[2] = {in, out};
  if (sel) a[sel - 1] = NULL;
  if (flags & 0x10) check(NULL, tg_transpose_2d(NULL, a[0], a[1], rows, cols), BIT(TG_ERR_NULL_ARG));
  const tg_status st = tg_transpose_2d(ctx, a[0], a[1], rows, cols);
  check(ctx, st, allowed);
  if (st == TG_OK)
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++)
        if (memcmp(&out[j * rows + i], &in[i * cols + j], 4)) FINDING("transpose wrong");
}

static void fuzz_causal(rd *r, tg_ctx *ctx, uint8_t flags) {
  const uint32_t seq = pick_u32(r, 70), nh = pick_u32(r, 6), nkv = pick_u32(r, 6),
                 hd = pick_u32(r, 40);
  const int sel = NULLSEL(7);
  const int64_t fq[3] = {seq, nh, hd}, fs[3] = {seq, nh, 3};
  unsigned bad = 0;
  if (!seq || !nh || !nkv || !hd) bad |= BIT(TG_ERR_BAD_SHAPE);
  else {
    if (nh % nkv) bad |= BIT(TG_ERR_BAD_SHAPE);
    if (!bytes_fit(4, 3, fq) || !bytes_fit(4, 3, fs)) bad |= BIT(TG_ERR_OVERFLOW);
  }
  const unsigned allowed = REFUSE_NULL(sel, ok_or(bad));
  const int64_t fk[3] = {seq, nkv ? nkv : 1, hd};
  const int64_t nq = prod(3, fq), nk = prod(3, fk);
  if (allowed == BIT(TG_OK) &&
      (!fits(nq, 4) || (int64_t)seq * seq * nh * hd > 4 * WORK_CAP))
    return;
  const int ok = allowed == BIT(TG_OK);
  float *dO = buf(ok ? nq : 16, 4, 0), *Q = buf(ok ? nq : 16, 4, 0), *K = buf(ok ? nk : 16, 4, 0),
        *V = buf(ok ? nk : 16, 4, 0);
  float *gQ = buf(ok ? nq : 16, 4, 1), *gK = buf(ok ? nk : 16, 4, 1), *gV = buf(ok ? nk : 16, 4, 1);
  fill_f32(dO, ok ? nq : 16, -1, 1), fill_f32(Q, ok ? nq : 16, -2, 2);
  fill_f32(K, ok ? nk : 16, -2, 2), fill_f32(V, ok ? nk : 16, -1, 1);
  fill_f32(gQ, ok ? nq : 16, -1, 1), fill_f32(gK, ok ? nk : 16, -1, 1);
  fill_f32(gV, ok ? nk : 16, -1, 1);
  snapshot();
  void *a[7] = {dO, Q, K, V, gQ, gK, gV};
  if (sel) a[sel - 1] = NULL;
  if (flags & 0x10)
    check(NULL, tg_causal_attention_backward(NULL, a[0], a[1], a[2], a[3], a[4], a[5], a[6], seq,
                                             nh, nkv, hd),
          BIT(TG_ERR_NULL_ARG));
  const tg_status st = tg_causal_attention_backward(ctx, a[0], a[1], a[2], a[3], a[4], a[5],
                                                    a[6], seq, nh, nkv, hd);
  check(ctx, st, allowed);
  if (st == TG_OK && !raw_data &&
      (!finite_f32(gQ, nq) || !finite_f32(gK, nk) || !finite_f32(gV, nk)))
    FINDING("causal attention gradients not finite");
}

static void fuzz_decode(rd *r, tg_ctx *ctx, int which, uint8_t flags) {
  const uint32_t nrows = pick_u32(r, 6), nwg = pick_u32(r, 9);
  static const uint32_t dims[] = {256, 512, 4, 8, 12, 64, 128, 252, 260, 1024};
  const uint8_t dm = u8(r);
  const uint32_t hd = (dm & 1) ? pick_u32(r, 40) : dims[(dm >> 1) % 10];
  const int sel = NULLSEL(which == 2 ? 1 : 2);
  unsigned bad = 0;
  int64_t n_h = 0, n_o;
  if (which < 2) {
    if (!nrows || !hd || !nwg) bad |= BIT(TG_ERR_BAD_SHAPE);
    else {
      const int64_t f[3] = {nrows, nwg, (int64_t)hd + 2};
      if (!bytes_fit(4, 3, f)) bad |= BIT(TG_ERR_OVERFLOW);
      n_h = prod(3, f);
    }
    if (which == 0 && hd % 4) bad |= BIT(TG_ERR_UNSUPPORTED);
    if (which == 1 && hd != 256 && hd != 512) bad |= BIT(TG_ERR_UNSUPPORTED);
  } else {
    const int64_t f[2] = {nrows, hd};
    bad = shape_rule(2, f, 4);
    if (hd != 256 && hd != 512) bad |= BIT(TG_ERR_UNSUPPORTED);
  }
  const unsigned allowed = REFUSE_NULL(sel, ok_or(bad));
  const int64_t fo[2] = {nrows, hd};
  n_o = prod(2, fo);
  if (allowed == BIT(TG_OK) && ((which < 2 && !fits(n_h, 4)) || !fits(n_o, 4))) return;
  const int ok = allowed == BIT(TG_OK);
  float *out = buf(ok ? n_o : 16, 4, 1);
  fill_f32(out, ok ? n_o : 16, -1, 1);
  tg_status st;
  if (which == 2) {
    snapshot();
    if (flags & 0x10)
      check(NULL, tg_fwht_sign_undo_f32(NULL, sel ? NULL : out, nrows, hd), BIT(TG_ERR_NULL_ARG));
    st = tg_fwht_sign_undo_f32(ctx, sel ? NULL : out, nrows, hd);
    check(ctx, st, allowed);
    if (st == TG_OK && !raw_data && !finite_f32(out, n_o)) FINDING("fwht not finite");
    return;
  }
  float *h = buf(ok ? n_h : 16, 4, 0);
  fill_f32(h, ok ? n_h : 16, -2, 2);
  if (ok && !raw_data) /* (S, M) pairs: S in [0.5, 2], M bounded or -inf (empty) */
    for (int64_t i = (int64_t)nrows * hd * nwg; i + 1 < n_h; i += 2) {
      h[i] = uni(0.5f, 2.0f);
      h[i + 1] = (rnd() & 3) == 0 ? -INFINITY : uni(-8, 8);
    }
  snapshot();
  void *a[2] = {h, out};
  if (sel) a[sel - 1] = NULL;
  if (which == 0) {
    if (flags & 0x10)
      check(NULL, tg_flash_attn_vec_reduce(NULL, a[0], a[1], nrows, hd, nwg), BIT(TG_ERR_NULL_ARG));
    st = tg_flash_attn_vec_reduce(ctx, a[0], a[1], nrows, hd, nwg);
  } else {
    if (flags & 0x10)
      check(NULL, tg_flash_attn_vec_reduce_tq_hb_undo(NULL, a[0], a[1], nrows, hd, nwg),
            BIT(TG_ERR_NULL_ARG));
    st = tg_flash_attn_vec_reduce_tq_hb_undo(ctx, a[0], a[1], nrows, hd, nwg);
  }
  check(ctx, st, allowed);
  if (st == TG_OK && !raw_data && !finite_f32(out, n_o)) FINDING("decode reduce not finite");
}

static void fuzz_ctx(rd *r) {
  tg_ctx *c = NULL;
  if (tg_ctx_create(&c) != TG_OK || !c) FINDING("ctx_create failed");
  const int n = (int32_t)u32(r);
  tg_status st = tg_ctx_set_threads(c, n);
  if (st != (n < 0 ? TG_ERR_BAD_PARAMS : TG_OK)) FINDING("set_threads(%d) = %d", n, (int)st);
  if (st != TG_OK && !tg_ctx_last_error(c)[0]) FINDING("set_threads: empty message");
  const tg_isa before = tg_ctx_get_isa(c);
  const int isa = (int32_t)u32(r);
  st = tg_ctx_set_isa(c, (tg_isa)isa);
  if ((isa < 0 || isa > TG_ISA_NEON_BF16) && st != TG_ERR_UNSUPPORTED)
    FINDING("set_isa(%d) = %d", isa, (int)st);
  if ((isa == 0 || isa == 1 || tg_isa_available((tg_isa)isa)) && st != TG_OK) FINDING("set_isa(%d) = %d", isa, (int)st);
  if (st != TG_OK && tg_ctx_get_isa(c) != before) FINDING("set_isa changed the ISA on failure");
  if (tg_ctx_set_deterministic(c, (int)u32(r)) != TG_OK) FINDING("set_deterministic failed");
  const int sched = (int32_t)u32(r);
  const tg_attn_schedule sb = tg_ctx_get_attn_schedule(c);
  st = tg_ctx_set_attn_schedule(c, (tg_attn_schedule)sched);
  if (st != (sched == 0 || sched == 1 ? TG_OK : TG_ERR_BAD_PARAMS))
    FINDING("set_attn_schedule(%d) = %d", sched, (int)st);
  if (st != TG_OK && (tg_ctx_get_attn_schedule(c) != sb || !tg_ctx_last_error(c)[0]))
    FINDING("set_attn_schedule: state changed or no message on failure");
  const int prec = (int32_t)u32(r);
  const tg_attn_precision pb = tg_ctx_get_attn_precision(c);
  st = tg_ctx_set_attn_precision(c, (tg_attn_precision)prec);
  if (st != (prec >= 0 && prec <= 2 ? TG_OK : TG_ERR_BAD_PARAMS))
    FINDING("set_attn_precision(%d) = %d", prec, (int)st);
  if (st != TG_OK && (tg_ctx_get_attn_precision(c) != pb || !tg_ctx_last_error(c)[0]))
    FINDING("set_attn_precision: state changed or no message on failure");
  if (!tg_status_str((tg_status)(int)u32(r)) || !tg_isa_name((tg_isa)(int)u32(r)) ||
      !tg_attn_precision_name((tg_attn_precision)(int)u32(r)))
    FINDING("NULL string");
  tg_ctx_destroy(c);
}

/* --- driver ------------------------------------------------------------------------------ */
static tg_ctx *new_ctx(int threads, int det, int portable) {
  tg_ctx *ctx = NULL;
  if (tg_ctx_create(&ctx) != TG_OK || tg_ctx_set_threads(ctx, threads) != TG_OK ||
      tg_ctx_set_deterministic(ctx, det) != TG_OK ||
      tg_ctx_set_attn_schedule(ctx, atomic_schedule ? TG_ATTN_SCHEDULE_ATOMIC
                                                    : TG_ATTN_SCHEDULE_KV) != TG_OK ||
      tg_ctx_set_attn_precision(ctx, (tg_attn_precision)attn_precision) != TG_OK ||
      (portable && tg_ctx_set_isa(ctx, TG_ISA_PORTABLE) != TG_OK))
    abort();
  return ctx;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  /* one core, up to 3 threads: idle threads must sleep, not spin */
  setenv("OMP_WAIT_POLICY", "passive", 0);
  setenv("KMP_BLOCKTIME", "0", 0);
  return 0;
}

enum { N_ENTRIES = 23 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  rd r = {data, size};
  const uint8_t entry = u8(&r) % N_ENTRIES, flags = u8(&r);
  const uint8_t tb = u8(&r);
  const int threads = 1 + tb % 3;
  rng_state = u64(&r);
  raw_data = (flags & 0x02) != 0;
  atomic_schedule = (flags & 0x20) != 0;
  attn_precision = tb / 3 % 3;
  static const char *names[N_ENTRIES] = {
      "flash_attn_train_fwd", "flash_attn_train_bwd", "bwd_compute_d", "rms_norm_forward",
      "rms_norm_rms_inv",     "rms_norm_dx",          "rms_norm_dw",   "rms_norm_fused",
      "softmax_backward",     "f32_to_bf16_cast",     "embedding_backward",
      "cross_entropy",        "transpose_2d",         "causal_attention_backward",
      "vec_reduce",           "vec_reduce_tq_hb_undo", "fwht_sign_undo", "attn_params_init",
      "ctx",                  "flash_attn_train_bwd (2)", "attn_train_fwd (dtype, options)",
      "attn_train_bwd (dtype, options)", "attn_train_bwd_compute_d (dtype)"};
  cur_entry = names[entry];
  ext.on = 0;
  tg_ctx *ctx = new_ctx(threads, flags & 0x01, flags & 0x04);
  switch (entry) {
    case 0: fuzz_attention(&r, ctx, 0, flags, threads); break;
    case 1: case 19: fuzz_attention(&r, ctx, 1, flags, threads); break;
    case 2: fuzz_attention(&r, ctx, 2, flags, threads); break;
    case 3: fuzz_rows(&r, ctx, 0, flags); break;
    case 4: fuzz_rows(&r, ctx, 1, flags); break;
    case 5: fuzz_rows(&r, ctx, 2, flags); break;
    case 6: fuzz_rows(&r, ctx, 3, flags); break;
    case 7: fuzz_rows(&r, ctx, 4, flags); break;
    case 8: fuzz_rows(&r, ctx, 5, flags); break;
    case 9: fuzz_cast(&r, ctx, flags); break;
    case 10: fuzz_embedding(&r, ctx, flags); break;
    case 11: fuzz_ce(&r, ctx, flags); break;
    case 12: fuzz_transpose(&r, ctx, flags); break;
    case 13: fuzz_causal(&r, ctx, flags); break;
    case 14: fuzz_decode(&r, ctx, 0, flags); break;
    case 15: fuzz_decode(&r, ctx, 1, flags); break;
    case 16: fuzz_decode(&r, ctx, 2, flags); break;
    case 17: fuzz_params_init(&r); break;
    case 20: case 21: case 22:
      decode_ext(&r);
      fuzz_attention(&r, ctx, entry - 20, flags, threads);
      break;
    default: fuzz_ctx(&r); break;
  }
  tg_ctx_destroy(ctx);
  free_bufs();
  return 0;
}
