/* The 160-byte attention params ABI: initialisation and validation. */
#include <math.h>
#include <stddef.h>

#include "attention.h"
#include "tilegrad_testing.h"

/* The struct is shared byte for byte with the Metal kernels. */
_Static_assert(sizeof(tg_attn_params) == 160, "tg_attn_params must be 160 bytes");
_Static_assert(offsetof(tg_attn_params, scale) == 24, "ABI: scale at 24");
_Static_assert(offsetof(tg_attn_params, NQ) == 32, "ABI: NQ at 32");
_Static_assert(offsetof(tg_attn_params, Q_strides) == 64, "ABI: Q_strides at 64");
_Static_assert(offsetof(tg_attn_params, O_strides) == 136, "ABI: O_strides at 136");
_Static_assert(sizeof(tg_attn_mask_params) == 24, "mask params must be 24 bytes");

static void set_tiling(tg_attn_params *p) {
  /* in int64: qL + 31 overflows int32 for qL near INT32_MAX */
  p->NQ = (int32_t)(((int64_t)p->qL + TG_METAL_BQ - 1) / TG_METAL_BQ);
  p->NK = (int32_t)(((int64_t)p->kL + TG_METAL_BK - 1) / TG_METAL_BK);
  p->NQ_aligned = p->qL / TG_METAL_BQ;
  p->NK_aligned = p->kL / TG_METAL_BK;
  p->qL_rem = p->qL % TG_METAL_BQ;
  p->kL_rem = p->kL % TG_METAL_BK;
}

static void set_contiguous(int64_t s[3], int64_t heads, int64_t L, int64_t D) {
  s[2] = D;
  s[1] = L * D;
  s[0] = heads * L * D;
}

tg_status tg_attn_params_init(tg_attn_params *p, int B, int H, int H_kv, int qL, int kL,
                              int D, float scale) {
  if (!p) return TG_ERR_NULL_ARG;
  if (B < 1 || H < 1 || H_kv < 1 || qL < 1 || kL < 1 || D < 1) return TG_ERR_BAD_SHAPE;
  if (H % H_kv != 0) return TG_ERR_BAD_SHAPE;
  int64_t q_elems, k_elems; /* the batch strides: heads * L * D */
  if (!tg_mul_ok(&q_elems, 3, (int64_t)H, (int64_t)qL, (int64_t)D) ||
      !tg_mul_ok(&k_elems, 3, (int64_t)H_kv, (int64_t)kL, (int64_t)D))
    return TG_ERR_OVERFLOW;
  *p = (tg_attn_params){0};
  p->B = B;
  p->H = H;
  p->D = D;
  p->qL = qL;
  p->kL = kL;
  p->gqa_factor = H / H_kv;
  p->scale = scale;
  p->softcapping = 1.0f;
  p->qL_off = kL - qL;
  set_tiling(p);
  set_contiguous(p->Q_strides, H, qL, D);
  set_contiguous(p->K_strides, H_kv, kL, D);
  set_contiguous(p->V_strides, H_kv, kL, D);
  set_contiguous(p->O_strides, H, qL, D);
  return TG_OK;
}

/* Largest element offset addressed through strides s over [n0, n1, n2, D]. */
static tg_status check_strides(tg_ctx *ctx, const char *fn, const char *name,
                               const int64_t s[3], int64_t n0, int64_t n1, int64_t n2,
                               int64_t D) {
  for (int i = 0; i < 3; i++)
    if (s[i] < 0)
      return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: %s[%d] = %lld; strides must be >= 0",
                     fn, name, i, (long long)s[i]);
  int64_t a, b, c, last;
  if (!tg_mul_ok(&a, 2, n0 - 1, s[0]) || !tg_mul_ok(&b, 2, n1 - 1, s[1]) ||
      !tg_mul_ok(&c, 2, n2 - 1, s[2]) || __builtin_add_overflow(a, b, &last) ||
      __builtin_add_overflow(last, c, &last) || __builtin_add_overflow(last, D, &last))
    return tg_fail(ctx, TG_ERR_OVERFLOW, "%s: %s address an offset beyond int64", fn, name);
  return TG_OK;
}

tg_status tg_attn_validate(tg_ctx *ctx, const char *fn, const tg_attn_params *p,
                           const tg_attn_mask_params *mp, const void *mask,
                           int causal, int64_t Dv, tg_attn_problem *out) {
  if (!p) return tg_fail(ctx, TG_ERR_NULL_ARG, "%s: params is NULL", fn);
  const struct { const char *name; int32_t v; } sizes[] = {
      {"B", p->B}, {"H", p->H}, {"D", p->D}, {"qL", p->qL}, {"kL", p->kL},
      {"gqa_factor", p->gqa_factor}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v < 1)
      return tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: params->%s = %d; it must be >= 1", fn,
                     sizes[i].name, (int)sizes[i].v);
  if (p->H % p->gqa_factor != 0)
    return tg_fail(ctx, TG_ERR_BAD_SHAPE,
                   "%s: params->H = %d is not a multiple of gqa_factor = %d", fn, (int)p->H,
                   (int)p->gqa_factor);
  if (p->D % 8 != 0 || p->D > TG_ATTN_MAX_D)
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "%s: head dim D = %d; tilegrad takes multiples of 8 up to %d", fn,
                   (int)p->D, TG_ATTN_MAX_D);

  tg_attn_params want = *p;
  set_tiling(&want);
  const struct { const char *name; int32_t have, want; } tiling[] = {
      {"NQ", p->NQ, want.NQ},
      {"NK", p->NK, want.NK},
      {"NQ_aligned", p->NQ_aligned, want.NQ_aligned},
      {"NK_aligned", p->NK_aligned, want.NK_aligned},
      {"qL_rem", p->qL_rem, want.qL_rem},
      {"kL_rem", p->kL_rem, want.kL_rem}};
  for (size_t i = 0; i < sizeof tiling / sizeof tiling[0]; i++)
    if (tiling[i].have != tiling[i].want)
      return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                     "%s: params->%s = %d disagrees with qL = %d, kL = %d (want %d for "
                     "Metal tiles of %d x %d)",
                     fn, tiling[i].name, (int)tiling[i].have, (int)p->qL, (int)p->kL,
                     (int)tiling[i].want, TG_METAL_BQ, TG_METAL_BK);
  if (!isfinite(p->scale))
    return tg_fail(ctx, TG_ERR_BAD_PARAMS, "%s: params->scale = %g is not finite", fn,
                   (double)p->scale);
  if (!isfinite(p->softcapping) || p->softcapping <= 0.0f)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "%s: params->softcapping = %g; it must be finite and > 0 (1.0 = off)",
                   fn, (double)p->softcapping);

  const int64_t B = p->B, H = p->H, H_kv = p->H / p->gqa_factor;
  const int64_t qL = p->qL, kL = p->kL, D = p->D;
  if (Dv == 0) Dv = D;
  tg_status st;
  if ((st = check_strides(ctx, fn, "Q_strides", p->Q_strides, B, H, qL, D)) ||
      (st = check_strides(ctx, fn, "K_strides", p->K_strides, B, H_kv, kL, D)) ||
      (st = check_strides(ctx, fn, "V_strides", p->V_strides, B, H_kv, kL, Dv)) ||
      (st = check_strides(ctx, fn, "O_strides", p->O_strides, B, H, qL, Dv)))
    return st;
  if (!mp != !mask)
    return tg_fail(ctx, TG_ERR_NULL_ARG,
                   "%s: mask params and mask must be both NULL or both given (%s is NULL)",
                   fn, mp ? "mask" : "mask params");
  if (mp && (st = check_strides(ctx, fn, "M_strides", mp->M_strides, B, H, qL, kL)))
    return st;
  if ((st = tg_shape_count(ctx, "query-side tensors [B,H,qL,D]", sizeof(float), NULL, 4,
                           B, H, qL, D)) ||
      (st = tg_shape_count(ctx, "key-side tensors [B,H_kv,kL,D]", sizeof(float), NULL, 4,
                           B, H_kv, kL, D)) ||
      (st = tg_shape_count(ctx, "query-side tensors [B,H,qL,Dv]", sizeof(float), NULL, 4,
                           B, H, qL, Dv)) ||
      (st = tg_shape_count(ctx, "key-side tensors [B,H_kv,kL,Dv]", sizeof(float), NULL, 4,
                           B, H_kv, kL, Dv)))
    return st;

  *out = (tg_attn_problem){
      .B = B, .H = H, .H_kv = H_kv, .gqa = p->gqa_factor, .qL = qL, .kL = kL, .D = D,
      .Dv = Dv, .qL_off = p->qL_off, .scale = p->scale,
      .softcap = p->softcapping == 1.0f ? 0.0f : p->softcapping,
      .Qs = p->Q_strides, .Ks = p->K_strides, .Vs = p->V_strides, .Os = p->O_strides,
      .Ms = mp ? mp->M_strides : NULL, .causal = causal != 0, .in = TG_DTYPE_BF16};
  set_contiguous(out->dQs, H, qL, D);
  set_contiguous(out->dKs, H_kv, kL, D);
  set_contiguous(out->dVs, H_kv, kL, Dv);
  out->Ls[0] = H * qL, out->Ls[1] = qL;
  return TG_OK;
}

/* --- aliasing ------------------------------------------------------------------ */
tg_buf tg_attn_buf(const char *name, const void *base, const int64_t s[3], int64_t n0,
                   int64_t n1, int64_t n2, int64_t n3, size_t elem_bytes, int written) {
  /* the element offset fits int64 (check_strides); its byte size may not,
   * but then it runs past the address space: saturate (tg_check_alias
   * treats the extent as reaching the end) */
  const uint64_t elems = (uint64_t)((n0 - 1) * s[0] + (n1 - 1) * s[1] + (n2 - 1) * s[2] + n3);
  const uint64_t bytes = elems > UINT64_MAX / elem_bytes ? UINT64_MAX : elems * elem_bytes;
  return written ? tg_out(name, base, bytes) : tg_in(name, base, bytes);
}

static size_t in_bytes(const tg_attn_problem *pr) {
  return pr->in == TG_DTYPE_F32 ? sizeof(float) : sizeof(tg_bf16);
}

/* The mask [B, H, qL, kL] of type pr->in through pr->Ms; empty without one. */
static tg_buf mask_buf(const tg_attn_problem *pr, const void *mask) {
  if (!pr->Ms) return tg_in("mask", NULL, 0);
  return tg_attn_buf("mask", mask, pr->Ms, pr->B, pr->H, pr->qL, pr->kL, in_bytes(pr), 0);
}

/* A [H] f32 sinks vector (sinks, d_sinks); empty when NULL. */
static tg_buf sinks_buf(const char *name, const float *v, const tg_attn_problem *pr,
                        int written) {
  const uint64_t bytes = v ? (uint64_t)pr->H * sizeof(float) : 0;
  return written ? tg_out(name, v, bytes) : tg_in(name, v, bytes);
}

tg_status tg_attn_check_alias_fwd(tg_ctx *ctx, const char *fn, const tg_attn_problem *pr,
                                  const void *Q, const void *K, const void *V,
                                  const void *mask, const void *O, const float *L) {
  const int64_t B = pr->B, H = pr->H, H_kv = pr->H_kv, qL = pr->qL, kL = pr->kL, D = pr->D;
  const int64_t Dv = pr->Dv;
  const size_t e = in_bytes(pr);
  const tg_buf bufs[] = {
      tg_attn_buf("Q", Q, pr->Qs, B, H, qL, D, e, 0),
      tg_attn_buf("K", K, pr->Ks, B, H_kv, kL, D, e, 0),
      tg_attn_buf("V", V, pr->Vs, B, H_kv, kL, Dv, e, 0),
      mask_buf(pr, mask),
      sinks_buf("sinks", pr->sinks, pr, 0),
      tg_attn_buf("O", O, pr->Os, B, H, qL, Dv, pr->o_f32 ? sizeof(float) : e, 1),
      tg_out("L", L, (uint64_t)(B * H * qL) * sizeof(float))};
  return tg_check_alias(ctx, fn, bufs, TG_LEN(bufs));
}

tg_status tg_attn_check_alias_bwd(tg_ctx *ctx, const char *fn, const tg_attn_problem *pr,
                                  const void *Q, const void *K, const void *V,
                                  const float *L, const void *dO, const void *O,
                                  const float *D_vec, const void *mask, const void *dQ,
                                  const void *dK, const void *dV, size_t grad_bytes,
                                  const float *d_sinks) {
  const int64_t B = pr->B, H = pr->H, H_kv = pr->H_kv, qL = pr->qL, kL = pr->kL, D = pr->D;
  const int64_t Dv = pr->Dv;
  const size_t e = in_bytes(pr);
  const uint64_t row_stats = (uint64_t)(B * H * qL) * sizeof(float);
  const tg_buf bufs[] = {
      tg_attn_buf("Q", Q, pr->Qs, B, H, qL, D, e, 0),
      tg_attn_buf("K", K, pr->Ks, B, H_kv, kL, D, e, 0),
      tg_attn_buf("V", V, pr->Vs, B, H_kv, kL, Dv, e, 0),
      tg_in("L", L, row_stats),
      tg_attn_buf("dO", dO, pr->Os, B, H, qL, Dv, e, 0),
      O ? tg_attn_buf("O", O, pr->Os, B, H, qL, Dv, e, 0) : tg_in("O", NULL, 0),
      tg_in("D_vec", D_vec, D_vec ? row_stats : 0),
      mask_buf(pr, mask),
      sinks_buf("sinks", pr->sinks, pr, 0),
      tg_attn_buf("dQ", dQ, pr->dQs, B, H, qL, D, grad_bytes, 1),
      tg_attn_buf("dK", dK, pr->dKs, B, H_kv, kL, D, grad_bytes, 1),
      tg_attn_buf("dV", dV, pr->dVs, B, H_kv, kL, Dv, grad_bytes, 1),
      sinks_buf("d_sinks", d_sinks, pr, 1)};
  return tg_check_alias(ctx, fn, bufs, TG_LEN(bufs));
}

atomic_int tg_attn_testing_k_step;

void tg_testing_attn_k_step(int step) {
  atomic_store(&tg_attn_testing_k_step, step > 0 ? step : 0);
}

int tg_testing_attn_bf16_parts(tg_isa isa, tg_attn_precision precision, int D, int backward) {
  const tg_isa_ops *ops = tg_isa_table(isa);
  if (!ops) return -1;
  const tg_attn_problem pr = {.in = TG_DTYPE_BF16, .precision = precision, .D = D};
  const tg_attn_pass pass = backward ? TG_ATTN_PASS_BWD : TG_ATTN_PASS_FWD;
  return tg_attn_part_buffers(&pr, tg_attn_products_of(&pr, ops, pass), pass);
}
