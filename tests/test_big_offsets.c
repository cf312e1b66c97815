/*
 * 64-bit indexing: kernels addressed with element offsets past 2^31 (and past
 * 2^32) without allocating that much memory.
 *
 * Every large tensor here is an anonymous MAP_NORESERVE mapping of the full
 * virtual size the call may address. Pages nobody touches cost nothing (a
 * read of an untouched page maps the shared zero page; THP's huge zero page
 * where the kernel allows it), so only the rows the test fills, and the rows
 * the kernel writes, become resident. An index truncated to 32 bits lands on
 * a zero (or a wrong) row and the comparison with a small dense copy fails.
 *
 *   - FA-2 forward and backward, with Q/K/V/dO/O/mask batch and head strides
 *     of 2^30 .. 2^32 elements (largest offsets ~3.5 * 2^31), against the
 *     same problem in small contiguous buffers: bitwise equal in deterministic
 *     mode (same f32 operations, only the addressing differs), and within a
 *     tolerance on the ATOMIC schedule.
 *   - embedding backward into grad_weight [2^32 - 1, 8] and [2^20 + 7, 4104]
 *     (vocab * dim ~ 2^35 and ~2^32 elements), only the id rows backed.
 *   - flash_attn_vec_reduce (+ the fused Hadamard undo) with nwg = 2^23 + 3:
 *     the partials span 2^31 + 768 floats and the (S, M) pairs sit beyond 2^31.
 *   - compute_d over [1, 1, 2^22 + 3, 512] bf16 (2^31 + 1536 elements per
 *     input, read mostly from the zero page).
 *
 * Transpose, softmax, cast, the RMSNorm kernels, cross-entropy and causal
 * attention write (or read and write) every element of a tensor that size:
 * reaching 2^31 elements there needs >= 8 GiB of resident memory, which a
 * 24 GiB CI machine running two suites at once should not be asked for. They
 * share the int64 row arithmetic exercised here (row * len in int64).
 *
 * Each test skips (with a message) when the mapping is refused. Under
 * AddressSanitizer the mappings work too (ASan's shadow of an untouched range
 * is never touched either); only the compute_d case, which streams 8 GiB
 * through instrumented loads, is skipped there for time, and with
 * TG_TEST_SHORT (qemu, ASan).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bf16.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define TB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TB_ASAN 1
#endif
#endif

static const int64_t G = INT64_C(1) << 31; /* 2^31 elements */

/* --- sparse mappings ---------------------------------------------------------- */
typedef struct {
  void *p;
  size_t bytes;
} sparse;

static void *sparse_map(sparse *s, size_t bytes) {
  s->bytes = (bytes + 4095) & ~(size_t)4095;
  s->p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s->p == MAP_FAILED) {
    s->p = NULL;
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  madvise(s->p, s->bytes, MADV_HUGEPAGE); /* huge zero page for untouched reads */
#endif
  return s->p;
}

static void sparse_unmap(sparse *s) {
  if (s->p) munmap(s->p, s->bytes);
  s->p = NULL;
}

/* Largest offset + 1 (elements) addressed through strides s over [n0, n1, n2, len]. */
static int64_t extent(const int64_t s[3], int64_t n0, int64_t n1, int64_t n2, int64_t len) {
  return (n0 - 1) * s[0] + (n1 - 1) * s[1] + (n2 - 1) * s[2] + len;
}

static int64_t off3(const int64_t s[3], int64_t b, int64_t h, int64_t r) {
  return b * s[0] + h * s[1] + r * s[2];
}

#define SKIP_MSG(...)            \
  do {                           \
    printf("[ SKIP     ] ");     \
    printf(__VA_ARGS__);         \
    printf("\n");                \
    skip();                      \
  } while (0)

/* --- FA-2 with strides past 2^31 ---------------------------------------------- */
enum { AB = 2, AH = 4, AHKV = 2, AQL = 70, AKL = 90, AD = 16 };

typedef struct {
  tg_attn_params p;
  tg_attn_mask_params mp;
  tg_bf16 *Q, *K, *V, *dO, *O, *mask;
} attn_view;

static int64_t n_out_q(void) { return (int64_t)AB * AH * AQL * AD; }
static int64_t n_out_k(void) { return (int64_t)AB * AHKV * AKL * AD; }
static int64_t n_rows(void) { return (int64_t)AB * AH * AQL; }

static void test_attention_offsets_past_2_31(void **state) {
  tu_rng r = tu_rng_make(tu_seed() + 31);
  attn_view sp, dn;
  const float scale = 0.3f;
  /* dense: contiguous [B, heads, L, D], mask [B, H, qL, kL] */
  assert_int_equal(tg_attn_params_init(&dn.p, AB, AH, AHKV, AQL, AKL, AD, scale), TG_OK);
  dn.p.softcapping = 20.0f;
  const int64_t Ms_dense[3] = {(int64_t)AH * AQL * AKL, (int64_t)AQL * AKL, AKL};
  memcpy(dn.mp.M_strides, Ms_dense, sizeof Ms_dense);
  /* sparse: the same problem with batch/head strides of 2^30 .. 2^32 elements.
   * Rows of one head never overlap another's (O is written through them). */
  sp.p = dn.p;
  const int64_t Qs[3] = {2 * G + 64, G / 2 + 40, AD + 8};
  const int64_t Ks[3] = {G + 1000, G / 4 + 8, AD};
  const int64_t Vs[3] = {3 * G / 2 + 8, (int64_t)AKL * (AD + 24), AD + 24};
  const int64_t Os[3] = {2 * G + 16, G / 2 + 8, AD};
  const int64_t Ms[3] = {G + 4, G / 4, AKL + 5};
  memcpy(sp.p.Q_strides, Qs, sizeof Qs);
  memcpy(sp.p.K_strides, Ks, sizeof Ks);
  memcpy(sp.p.V_strides, Vs, sizeof Vs);
  memcpy(sp.p.O_strides, Os, sizeof Os);
  memcpy(sp.mp.M_strides, Ms, sizeof Ms);
  assert_true(extent(Qs, AB, AH, AQL, AD) > 3 * G); /* past 2^32 too */

  sparse mq, mk, mv, mo, mdo, mm;
  memset(&mq, 0, sizeof mq), mk = mv = mo = mdo = mm = mq;
  sp.Q = sparse_map(&mq, 2 * (size_t)extent(Qs, AB, AH, AQL, AD));
  sp.K = sparse_map(&mk, 2 * (size_t)extent(Ks, AB, AHKV, AKL, AD));
  sp.V = sparse_map(&mv, 2 * (size_t)extent(Vs, AB, AHKV, AKL, AD));
  sp.O = sparse_map(&mo, 2 * (size_t)extent(Os, AB, AH, AQL, AD));
  sp.dO = sparse_map(&mdo, 2 * (size_t)extent(Os, AB, AH, AQL, AD));
  sp.mask = sparse_map(&mm, 2 * (size_t)extent(Ms, AB, AH, AQL, AKL));
  if (!sp.Q || !sp.K || !sp.V || !sp.O || !sp.dO || !sp.mask) {
    sparse *all[] = {&mq, &mk, &mv, &mo, &mdo, &mm};
    for (int i = 0; i < 6; i++) sparse_unmap(all[i]);
    SKIP_MSG("attention: mmap(MAP_NORESERVE) of ~40 GiB virtual refused");
  }
  dn.Q = tu_alloc(2 * n_out_q());
  dn.dO = tu_alloc(2 * n_out_q());
  dn.O = tu_alloc(2 * n_out_q());
  dn.K = tu_alloc(2 * n_out_k());
  dn.V = tu_alloc(2 * n_out_k());
  dn.mask = tu_alloc(2 * (int64_t)AB * AH * AQL * AKL);

  /* the same values in both layouts */
  for (int64_t b = 0; b < AB; b++)
    for (int64_t h = 0; h < AH; h++)
      for (int64_t i = 0; i < AQL; i++) {
        for (int64_t d = 0; d < AD; d++) {
          const tg_bf16 q = tg_f32_to_bf16((float)tu_uniform(&r, -2, 2));
          const tg_bf16 g = tg_f32_to_bf16((float)tu_uniform(&r, -1, 1));
          sp.Q[off3(Qs, b, h, i) + d] = dn.Q[off3(dn.p.Q_strides, b, h, i) + d] = q;
          sp.dO[off3(Os, b, h, i) + d] = dn.dO[off3(dn.p.O_strides, b, h, i) + d] = g;
        }
        for (int64_t k = 0; k < AKL; k++) {
          const double u = tu_uniform(&r, 0, 1);
          const tg_bf16 m =
              tg_f32_to_bf16(u < 0.15 ? -INFINITY : (float)tu_uniform(&r, -2, 1));
          sp.mask[off3(Ms, b, h, i) + k] = dn.mask[off3(Ms_dense, b, h, i) + k] = m;
        }
      }
  for (int64_t b = 0; b < AB; b++)
    for (int64_t h = 0; h < AHKV; h++)
      for (int64_t k = 0; k < AKL; k++)
        for (int64_t d = 0; d < AD; d++) {
          const tg_bf16 kv = tg_f32_to_bf16((float)tu_uniform(&r, -2, 2));
          const tg_bf16 vv = tg_f32_to_bf16((float)tu_uniform(&r, -1, 1));
          sp.K[off3(Ks, b, h, k) + d] = dn.K[off3(dn.p.K_strides, b, h, k) + d] = kv;
          sp.V[off3(Vs, b, h, k) + d] = dn.V[off3(dn.p.V_strides, b, h, k) + d] = vv;
        }

  /* forward: O (through O_strides) and L bitwise equal, deterministic mode */
  float *Ld = tu_alloc(sizeof(float) * n_rows()), *Ls = tu_alloc(sizeof(float) * n_rows());
  tg_ctx *ctx = tu_ctx(3, TG_ISA_AUTO);
  assert_int_equal(tg_ctx_set_deterministic(ctx, 1), TG_OK);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, dn.Q, dn.K, dn.V, dn.O, Ld, &dn.p,
                                                     &dn.mp, dn.mask, 1),
                   TG_OK);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_fwd_bf16(ctx, sp.Q, sp.K, sp.V, sp.O, Ls, &sp.p,
                                                     &sp.mp, sp.mask, 1),
                   TG_OK);
  assert_memory_equal(Ld, Ls, sizeof(float) * n_rows());
  int64_t fully_masked = 0;
  for (int64_t b = 0; b < AB; b++)
    for (int64_t h = 0; h < AH; h++)
      for (int64_t i = 0; i < AQL; i++) {
        if (memcmp(sp.O + off3(Os, b, h, i), dn.O + off3(dn.p.O_strides, b, h, i), 2 * AD))
          TU_FAIL("forward O row (b %lld, h %lld, i %lld) differs: sparse vs dense",
                  (long long)b, (long long)h, (long long)i);
        fully_masked += Ld[(b * AH + h) * AQL + i] == -INFINITY;
      }
  assert_true(fully_masked < n_rows()); /* the problem is not trivial */

  /* backward inputs: L from the forward, D_vec = rowsum(O * dO) */
  float *Dv = tu_alloc(sizeof(float) * n_rows());
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, dn.O, dn.dO, Dv, AB, AH,
                                                               AQL, AD),
                   TG_OK);
  float *dK0 = tu_alloc(sizeof(float) * n_out_k()), *dV0 = tu_alloc(sizeof(float) * n_out_k());
  tu_fill_f32(&r, dK0, n_out_k(), -1, 1);
  tu_fill_f32(&r, dV0, n_out_k(), -1, 1);
  float *dQ[2], *dK[2], *dV[2];
  for (int v = 0; v < 2; v++) {
    dQ[v] = tu_alloc(sizeof(float) * n_out_q());
    dK[v] = tu_alloc(sizeof(float) * n_out_k());
    dV[v] = tu_alloc(sizeof(float) * n_out_k());
    tu_poison_f32(dQ[v], n_out_q());
    memcpy(dK[v], dK0, sizeof(float) * n_out_k());
    memcpy(dV[v], dV0, sizeof(float) * n_out_k());
  }
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_bf16(ctx, dn.Q, dn.K, dn.V, Ld, dn.dO, Dv,
                                                     dQ[0], dK[0], dV[0], &dn.p, &dn.mp,
                                                     dn.mask, 1),
                   TG_OK);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_bf16(ctx, sp.Q, sp.K, sp.V, Ld, sp.dO, Dv,
                                                     dQ[1], dK[1], dV[1], &sp.p, &sp.mp,
                                                     sp.mask, 1),
                   TG_OK);
  assert_true(tu_all_finite(dQ[0], n_out_q()) && tu_all_finite(dK[0], n_out_k()));
  assert_memory_equal(dQ[0], dQ[1], sizeof(float) * n_out_q());
  assert_memory_equal(dK[0], dK[1], sizeof(float) * n_out_k());
  assert_memory_equal(dV[0], dV[1], sizeof(float) * n_out_k());
  tg_ctx_destroy(ctx);

  /* The ATOMIC schedule (the Metal grid, omp atomic adds; not deterministic):
   * same values up to the order of the atomic adds. */
  ctx = tu_ctx(5, TG_ISA_AUTO);
  assert_int_equal(tg_ctx_set_attn_schedule(ctx, TG_ATTN_SCHEDULE_ATOMIC), TG_OK);
  tu_poison_f32(dQ[1], n_out_q());
  memcpy(dK[1], dK0, sizeof(float) * n_out_k());
  memcpy(dV[1], dV0, sizeof(float) * n_out_k());
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_bf16(ctx, sp.Q, sp.K, sp.V, Ld, sp.dO, Dv,
                                                     dQ[1], dK[1], dV[1], &sp.p, &sp.mp,
                                                     sp.mask, 1),
                   TG_OK);
  assert_memory_equal(dQ[0], dQ[1], sizeof(float) * n_out_q()); /* dQ: one writer per row */
  for (int64_t e = 0; e < n_out_k(); e++) {
    const double tk = 1e-5 * (1 + fabs(dK[0][e])), tv = 1e-5 * (1 + fabs(dV[0][e]));
    if (!(fabs(dK[0][e] - dK[1][e]) <= tk) || !(fabs(dV[0][e] - dV[1][e]) <= tv))
      TU_FAIL("atomic schedule, element %lld: dK %.9g vs %.9g, dV %.9g vs %.9g",
              (long long)e, dK[1][e], dK[0][e], dV[1][e], dV[0][e]);
  }
  tg_ctx_destroy(ctx);

  for (int v = 0; v < 2; v++) free(dQ[v]), free(dK[v]), free(dV[v]);
  free(dK0), free(dV0), free(Dv), free(Ld), free(Ls);
  free(dn.Q), free(dn.dO), free(dn.O), free(dn.K), free(dn.V), free(dn.mask);
  sparse *all[] = {&mq, &mk, &mv, &mo, &mdo, &mm};
  for (int i = 0; i < 6; i++) sparse_unmap(all[i]);
}

/* --- embedding: grad_weight rows past 2^31 elements --------------------------------- */
static void embedding_case(uint32_t vocab, uint32_t dim, int threads, uint64_t salt) {
  enum { T = 9 };
  const uint32_t ids[T] = {vocab - 1, 0,           vocab / 2 + 3, vocab - 1, vocab / 3,
                           vocab - 2, vocab - 1,   3,             vocab / 2 + 3};
  const int64_t nw = (int64_t)vocab * dim;
  assert_true(nw > 2 * G);
  sparse m = {0};
  float *gw = sparse_map(&m, sizeof(float) * (size_t)nw);
  if (!gw) SKIP_MSG("embedding: mmap(MAP_NORESERVE) of %lld bytes refused", (long long)nw * 4);
  tu_rng r = tu_rng_make(tu_seed() + salt);
  float *g = tu_alloc(sizeof(float) * T * dim);
  tu_fill_f32(&r, g, (int64_t)T * dim, -1, 1);
  /* pre-fill the id rows (the kernel accumulates onto them) */
  for (int t = 0; t < T; t++)
    for (uint32_t d = 0; d < dim; d++) gw[(int64_t)ids[t] * dim + d] = (float)(ids[t] % 7) + 0.5f;
  /* expected row of token t's id: the pre-fill, then every token with that id
   * added in token order, in f32 (the contract's order) */
  float *want = tu_alloc(sizeof(float) * dim);
  tg_ctx *ctx = tu_ctx(threads, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_embedding_backward(ctx, g, ids, gw, vocab, T, dim), TG_OK);
  for (int t = 0; t < T; t++) {
    for (uint32_t d = 0; d < dim; d++) want[d] = (float)(ids[t] % 7) + 0.5f;
    for (int u = 0; u < T; u++)
      if (ids[u] == ids[t])
        for (uint32_t d = 0; d < dim; d++) want[d] += g[(int64_t)u * dim + d];
    if (memcmp(gw + (int64_t)ids[t] * dim, want, sizeof(float) * dim))
      TU_FAIL("embedding vocab %u dim %u: row %u (offset %lld elements) wrong", vocab, dim,
              ids[t], (long long)ids[t] * dim);
  }
  /* neighbours of the written rows are still zero */
  const uint32_t untouched[] = {vocab - 3, vocab / 2 + 2, vocab / 2 + 4, 1, 2};
  for (size_t i = 0; i < sizeof untouched / sizeof untouched[0]; i++)
    for (uint32_t d = 0; d < dim; d++)
      if (gw[(int64_t)untouched[i] * dim + d] != 0.0f)
        TU_FAIL("embedding vocab %u dim %u: row %u written", vocab, dim, untouched[i]);
  tg_ctx_destroy(ctx);
  free(g), free(want);
  sparse_unmap(&m);
}

static void test_embedding_rows_past_2_31(void **state) {
  /* vocab blocks (dim 8 < 64: the grid splits the vocab), 2^35 elements */
  embedding_case(0xFFFFFFFFu, 8, 3, 41);
  /* column blocks with a ragged last one, ~2^32 elements */
  embedding_case((1u << 20) + 7, 4104, 2, 42);
}

/* --- decode reduce: partials past 2^31 floats --------------------------------------- */
static void test_decode_reduce_past_2_31(void **state) {
  enum { DV = 256 };
  const int64_t nwg = (INT64_C(1) << 23) + 3;
  const int64_t n_part = DV * nwg; /* offset of the (S, M) pairs: 2^31 + 768 */
  assert_true(n_part > G);
  sparse m = {0};
  float *htmp = sparse_map(&m, sizeof(float) * (size_t)(n_part + 2 * nwg));
  if (!htmp) SKIP_MSG("decode: mmap(MAP_NORESERVE) of %lld bytes refused", (long long)n_part * 4);
  /* every workgroup empty (M = -inf) but three, one at each end and one inside */
  float *SM = htmp + n_part;
  for (int64_t w = 0; w < nwg; w++) SM[2 * w] = 0.0f, SM[2 * w + 1] = -INFINITY;
  const int64_t live[3] = {0, nwg / 2 + 1, nwg - 1};
  const float S[3] = {1.5f, 0.75f, 2.0f}, M[3] = {0.25f, -1.0f, 0.5f};
  for (int j = 0; j < 3; j++) {
    SM[2 * live[j]] = S[j];
    SM[2 * live[j] + 1] = M[j];
    for (int64_t c = 0; c < DV / 4; c++)
      for (int k = 0; k < 4; k++)
        htmp[(c * nwg + live[j]) * 4 + k] = (float)(j + 1) * 0.125f + (float)(4 * c + k) / 64.0f;
  }
  /* reference in double */
  double a[3], St = 0, want[DV];
  for (int j = 0; j < 3; j++) a[j] = exp((double)M[j] - 0.5), St += S[j] * a[j];
  for (int d = 0; d < DV; d++) {
    double o = 0;
    for (int j = 0; j < 3; j++) o += a[j] * ((double)(j + 1) * 0.125 + d / 64.0);
    want[d] = o / St;
  }
  float out[DV], fused[DV];
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce(ctx, htmp, out, 1, DV, (uint32_t)nwg), TG_OK);
  for (int d = 0; d < DV; d++)
    if (!(fabs(out[d] - want[d]) <= 1e-5 * fabs(want[d]) + 1e-6))
      TU_FAIL("reduce[%d] = %.9g, want %.9g", d, (double)out[d], want[d]);
  /* the fused kernel == reduce followed by the undo, bitwise */
  TU_EXPECT_STATUS(ctx, tg_flash_attn_vec_reduce_tq_hb_undo(ctx, htmp, fused, 1, DV,
                                                            (uint32_t)nwg),
                   TG_OK);
  TU_EXPECT_STATUS(ctx, tg_fwht_sign_undo_f32(ctx, out, 1, DV), TG_OK);
  assert_memory_equal(out, fused, sizeof out);
  tg_ctx_destroy(ctx);
  sparse_unmap(&m);
}

/* --- compute_d: 2^31 + 1536 elements per input ------------------------------------- */
static void test_compute_d_past_2_31(void **state) {
#ifdef TB_ASAN
  if (!getenv("TG_TEST_BIG_UNDER_ASAN"))
    SKIP_MSG("compute_d: streams 2 x 4 GiB through instrumented loads (slow under ASan; "
             "TG_TEST_BIG_UNDER_ASAN=1 runs it)");
#endif
  if (tu_short())
    SKIP_MSG("compute_d: streams 2 x 4 GiB (most of the suite's minute under qemu; "
             "TG_TEST_SHORT; the Release run runs it)");
  enum { D = 512 };
  const int64_t qL = G / D + 3, n = qL * D;
  sparse mo = {0}, mg = {0};
  tg_bf16 *O = sparse_map(&mo, 2 * (size_t)n), *dO = sparse_map(&mg, 2 * (size_t)n);
  if (!O || !dO) {
    sparse_unmap(&mo), sparse_unmap(&mg);
    SKIP_MSG("compute_d: mmap(MAP_NORESERVE) of 2 x %lld bytes refused", (long long)n * 2);
  }
  const int64_t rows[] = {0, 1, qL / 2, qL - 2, qL - 1};
  double want[5];
  for (int j = 0; j < 5; j++) {
    want[j] = 0;
    for (int64_t d = 0; d < D; d++) {
      const float o = (float)((d % 13) - 6) * 0.25f * (float)(j + 1);
      const float g = (float)((d % 7) - 3) * 0.5f;
      O[rows[j] * D + d] = tg_f32_to_bf16(o);
      dO[rows[j] * D + d] = tg_f32_to_bf16(g);
      want[j] += (double)o * g; /* exact in bf16 and in f32 sums of this size */
    }
  }
  float *out = tu_alloc(sizeof(float) * (size_t)qL);
  tu_poison_f32(out, qL);
  tg_ctx *ctx = tu_ctx(2, TG_ISA_AUTO);
  TU_EXPECT_STATUS(ctx, tg_flash_attn_train_bwd_compute_d_bf16(ctx, O, dO, out, 1, 1,
                                                               (uint32_t)qL, D),
                   TG_OK);
  int j = 0;
  for (int64_t i = 0; i < qL; i++) {
    const double w = (j < 5 && rows[j] == i) ? want[j++] : 0.0;
    if (out[i] != (float)w)
      TU_FAIL("D_out[%lld] (offset %lld elements) = %.9g, want %.9g", (long long)i,
              (long long)(i * D), (double)out[i], w);
  }
  tg_ctx_destroy(ctx);
  free(out);
  sparse_unmap(&mo), sparse_unmap(&mg);
}

int main(void) {
  tu_seed();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_offsets_past_2_31),
      cmocka_unit_test(test_embedding_rows_past_2_31),
      cmocka_unit_test(test_decode_reduce_past_2_31),
      cmocka_unit_test(test_compute_d_past_2_31),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
