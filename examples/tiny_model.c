/*
 * The tiny decoder block of tiny_model.h: forward, backward and AdamW.
 * Matrix products: cblas_sgemm (row-major). Attention, RMSNorm, casts,
 * cross-entropy, embedding backward: tilegrad's kernels. Plain C: the
 * embedding gather, exact copies (bf16 widening, head-major reorder), the
 * residual add and AdamW.
 */
#include "tiny_model.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS extras, looked up weakly so that any CBLAS links. */
extern void openblas_set_num_threads(int) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

void tm_blas_set_threads(int n) {
  if (openblas_set_num_threads && n > 0) openblas_set_num_threads(n);
}

const char *tm_blas_coretype_hint(void) {
  if (!openblas_get_corename || getenv("OPENBLAS_CORETYPE")) return NULL;
  const char *core = openblas_get_corename();
  if (!core || strcmp(core, "Prescott") != 0) return NULL; /* not the fallback */
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

const char *tm_blas_name(void) {
  static char name[256];
  if (!openblas_get_config) return "a CBLAS (not OpenBLAS)";
  snprintf(name, sizeof name, "%s, core %s", openblas_get_config(),
           openblas_get_corename ? openblas_get_corename() : "?");
  return name;
}

struct tm_model {
  tm_config c;
  tg_ctx *ctx;
  tm_tensor t[TM_NTENSORS];
  int64_t np;
  float *p, *g, *m1, *m2; /* params, grads, Adam moments */
  tg_attn_params ap;      /* token-major strides */
  int threads;            /* for the BLAS slices (tm_set_threads) */
  double secs[TM_NPHASES];
  int64_t count;     /* non-pad targets of the last forward */
  uint32_t *pos_ids; /* [N]: t % T, the position table's "ids" */
  /* activations and their gradients (N = B T rows) */
  float *h0, *n1, *r1, *q, *k, *v, *of, *h1, *n2, *r2, *logits, *dlogits;
  float *L, *dtok, *dvec, *dq_hm, *dk_hm, *dv_hm, *dq, *dk, *dv;
  float *dn2, *dh1, *dof, *dn1, *dh0;
  tg_bf16 *qb, *kb, *vb, *ob, *dob;
};

static const char *const tensor_names[TM_NTENSORS] = {"emb", "pos", "norm1", "wq",  "wk",
                                                      "wv",  "wo",  "norm2", "wout"};

tm_config tm_default_config(void) {
  tm_config c = {.vocab = 30,
                 .dim = 128,
                 .n_heads = 4,
                 .n_kv_heads = 2,
                 .head_dim = 32,
                 .seq_len = 128,
                 .batch = 16,
                 .tied = 0,
                 .eps = 1e-5f};
  return c;
}

tm_adam tm_default_adam(void) {
  tm_adam a = {.lr = 1e-2f,
               .beta1 = 0.9f,
               .beta2 = 0.98f,
               .eps = 1e-8f,
               .weight_decay = 0.0f,
               .clip = 1.0f};
  return a;
}

/* --- small helpers ------------------------------------------------------------ */
static void *alloc_floats(int64_t n, size_t elem) { /* 64-byte aligned, zeroed */
  size_t bytes = (size_t)(n > 0 ? n : 1) * elem;
  bytes = (bytes + 63) / 64 * 64;
  void *x = aligned_alloc(64, bytes);
  if (x) memset(x, 0, bytes);
  return x;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double gauss(uint64_t *s) { /* Box-Muller */
  const double u1 = ((splitmix(s) >> 11) + 1) * 0x1.0p-53;
  const double u2 = (splitmix(s) >> 11) * 0x1.0p-53;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static void fill_normal(float *x, int64_t n, double std, uint64_t *s) {
  for (int64_t i = 0; i < n; i++) x[i] = (float)(std * gauss(s));
}

static void widen_bf16(const tg_bf16 *x, float *y, int64_t n) { /* exact */
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = (uint32_t)x[i] << 16;
    memcpy(&y[i], &u, sizeof u);
  }
}

/* [B, heads, T, Dh] -> [B, T, heads, Dh] (a copy) */
static void head_to_token_major(const float *src, float *dst, int B, int heads, int T,
                                int Dh) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < heads; h++)
      for (int t = 0; t < T; t++)
        memcpy(dst + (((int64_t)b * T + t) * heads + h) * Dh,
               src + (((int64_t)b * heads + h) * T + t) * Dh, sizeof(float) * Dh);
}

/* C[M,N] = op(A) op(B) + beta C, row-major, leading dims from the shapes.
 * OpenBLAS runs single-threaded (tm_create sets that) inside each of the
 * model's OpenMP threads, on a slice of C's rows (or columns when C is wide
 * and short): one thread pool for tilegrad's kernels and the BLAS, so no two
 * pools spin against each other on few cores. */
static void gemm_part(int ta, int tb, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static void gemm_mt(int nt, int ta, int tb, int M, int N, int K, const float *A,
                    const float *B, float beta, float *C) {
  const int lda = ta ? M : K, ldb = tb ? K : N;
  if (nt > 1 && (double)M * N * K < 2e5) nt = 1; /* not worth a fork */
  const int by_rows = M >= N;
  const int len = by_rows ? M : N;
  int parts = nt < (len + 15) / 16 ? nt : (len + 15) / 16;
  if (parts < 1) parts = 1;
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int i = 0; i < parts; i++) {
    /* 16-aligned slices */
    const int lo = (int)((int64_t)len * i / parts) / 16 * 16;
    const int hi = i == parts - 1 ? len : (int)((int64_t)len * (i + 1) / parts) / 16 * 16;
    if (hi <= lo) continue;
    if (by_rows) /* rows lo..hi of C: rows of op(A) */
      gemm_part(ta, tb, hi - lo, N, K, ta ? A + lo : A + (int64_t)lo * lda, lda, B, ldb,
                beta, C + (int64_t)lo * N, N);
    else /* columns lo..hi of C: columns of op(B) */
      gemm_part(ta, tb, M, hi - lo, K, A, lda, tb ? B + (int64_t)lo * ldb : B + lo, ldb,
                beta, C + lo, N);
  }
}
static void gemm_timed(tm_model *m, int ta, int tb, int M, int N, int K, const float *A,
                       const float *B, float beta, float *C) {
  const double t0 = omp_get_wtime();
  gemm_mt(m->threads, ta, tb, M, N, K, A, B, beta, C);
  m->secs[TM_PH_GEMM] += omp_get_wtime() - t0;
}
#define gemm(...) gemm_timed(m, __VA_ARGS__)

static void set_err(char *err, int len, const char *fmt, ...) {
  if (!err || len <= 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, (size_t)len, fmt, ap);
  va_end(ap);
}

/* --- create / destroy ---------------------------------------------------------- */
tg_status tm_create(tm_model **out, const tm_config *cfg, tg_ctx *ctx, uint64_t seed,
                    char *err, int err_len) {
  if (!out || !cfg || !ctx) {
    set_err(err, err_len, "tm_create: NULL argument");
    return TG_ERR_NULL_ARG;
  }
  *out = NULL;
  const tm_config c = *cfg;
  if (c.vocab < 2 || c.dim < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 8 ||
      c.seq_len < 1 || c.batch < 1 || c.n_heads % c.n_kv_heads != 0 ||
      c.head_dim % 8 != 0 || c.head_dim > 512 || !(c.eps >= 0) || !isfinite(c.eps)) {
    set_err(err, err_len,
            "bad config: vocab %d (>= 2), dim %d, heads %d / kv heads %d (must divide), "
            "head_dim %d (multiple of 8, <= 512), seq_len %d, batch %d, eps %g",
            c.vocab, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.seq_len, c.batch,
            (double)c.eps);
    return TG_ERR_BAD_SHAPE;
  }
  const int64_t N = (int64_t)c.batch * c.seq_len, C = c.dim, V = c.vocab;
  const int64_t HD = (int64_t)c.n_heads * c.head_dim,
                KD = (int64_t)c.n_kv_heads * c.head_dim;
  const int64_t widest = C > V ? (C > HD ? C : HD) : (V > HD ? V : HD);
  if (N * widest > INT32_MAX || V * C > INT32_MAX || HD * C > INT32_MAX) {
    set_err(err, err_len, "config too large for 32-bit BLAS indices");
    return TG_ERR_OVERFLOW;
  }
  tm_model *m = calloc(1, sizeof *m);
  if (!m) return TG_ERR_NO_MEMORY;
  m->c = c;
  m->ctx = ctx;
  m->threads = omp_get_max_threads();
  tm_blas_set_threads(1);
  const int shapes[TM_NTENSORS][2] = {
      {(int)V, (int)C},  {c.seq_len, (int)C}, {1, (int)C},
      {(int)C, (int)HD}, {(int)C, (int)KD},   {(int)C, (int)KD},
      {(int)HD, (int)C}, {1, (int)C},         {(int)C, c.tied ? 0 : (int)V}};
  int64_t off = 0;
  for (int i = 0; i < TM_NTENSORS; i++) {
    m->t[i] = (tm_tensor){tensor_names[i], off, (int64_t)shapes[i][0] * shapes[i][1],
                          shapes[i][0], shapes[i][1]};
    off += m->t[i].count;
  }
  m->np = off;
  m->p = alloc_floats(off, 4), m->g = alloc_floats(off, 4);
  m->m1 = alloc_floats(off, 4), m->m2 = alloc_floats(off, 4);
  float **f32[] = {&m->h0,    &m->n1,  &m->q,      &m->k,       &m->v,     &m->of,
                   &m->h1,    &m->n2,  &m->logits, &m->dlogits, &m->dq_hm, &m->dk_hm,
                   &m->dv_hm, &m->dq,  &m->dk,     &m->dv,      &m->dn2,   &m->dh1,
                   &m->dof,   &m->dn1, &m->dh0,    &m->r1,      &m->r2,    &m->L,
                   &m->dtok,  &m->dvec};
  const int64_t f32n[] = {
      N * C,  N * C,  N * HD,        N * KD,        N * KD,       N * HD, N * C,
      N * C,  N * V,  N * V,         N * HD,        N * KD,       N * KD, N * HD,
      N * KD, N * KD, N * C,         N * C,         N * HD,       N * C,  N * C,
      N,      N,      N * c.n_heads, N * c.n_heads, N * c.n_heads};
  int ok = m->p && m->g && m->m1 && m->m2;
  for (size_t i = 0; i < sizeof f32n / sizeof f32n[0]; i++)
    ok &= !!(*f32[i] = alloc_floats(f32n[i], 4));
  tg_bf16 **b16[] = {&m->qb, &m->kb, &m->vb, &m->ob, &m->dob};
  const int64_t b16n[] = {N * HD, N * KD, N * KD, N * HD, N * HD};
  for (int i = 0; i < 5; i++) ok &= !!(*b16[i] = alloc_floats(b16n[i], 2));
  ok &= !!(m->pos_ids = alloc_floats(N, 4));
  if (!ok) {
    tm_destroy(m);
    set_err(err, err_len, "out of memory");
    return TG_ERR_NO_MEMORY;
  }
  /* token-major attention tensors: [B, T, heads, Dh] */
  tg_status st =
      tg_attn_params_init(&m->ap, c.batch, c.n_heads, c.n_kv_heads, c.seq_len, c.seq_len,
                          c.head_dim, (float)(1.0 / sqrt(c.head_dim)));
  if (st != TG_OK) {
    set_err(err, err_len, "tg_attn_params_init: %s", tg_status_str(st));
    tm_destroy(m);
    return st;
  }
  const int64_t T = c.seq_len, Dh = c.head_dim;
  const int64_t qs[3] = {T * HD, Dh, HD}, ks[3] = {T * KD, Dh, KD};
  memcpy(m->ap.Q_strides, qs, sizeof qs);
  memcpy(m->ap.O_strides, qs, sizeof qs);
  memcpy(m->ap.K_strides, ks, sizeof ks);
  memcpy(m->ap.V_strides, ks, sizeof ks);

  /* init: unit-variance embeddings (RMSNorm follows), 1/sqrt(fan_in)
   * projections, a small output projection so the first loss is ~ln V */
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 12345;
  float *P = m->p;
  fill_normal(P + m->t[TM_EMB].offset, m->t[TM_EMB].count, c.tied ? 0.1 : 1.0, &s);
  fill_normal(P + m->t[TM_POS].offset, m->t[TM_POS].count, c.tied ? 0.1 : 1.0, &s);
  for (int64_t i = 0; i < N; i++) m->pos_ids[i] = (uint32_t)(i % T);
  for (int64_t i = 0; i < C; i++)
    P[m->t[TM_NORM1].offset + i] = P[m->t[TM_NORM2].offset + i] = 1.0f;
  fill_normal(P + m->t[TM_WQ].offset, m->t[TM_WQ].count, 1 / sqrt((double)C), &s);
  fill_normal(P + m->t[TM_WK].offset, m->t[TM_WK].count, 1 / sqrt((double)C), &s);
  fill_normal(P + m->t[TM_WV].offset, m->t[TM_WV].count, 1 / sqrt((double)C), &s);
  fill_normal(P + m->t[TM_WO].offset, m->t[TM_WO].count, 0.5 / sqrt((double)HD), &s);
  fill_normal(P + m->t[TM_WOUT].offset, m->t[TM_WOUT].count, 0.02, &s);
  *out = m;
  return TG_OK;
}

void tm_destroy(tm_model *m) {
  if (!m) return;
  void *all[] = {m->p,    m->g,     m->m1,     m->m2,      m->h0,  m->n1,
                 m->r1,   m->q,     m->k,      m->v,       m->of,  m->h1,
                 m->n2,   m->r2,    m->logits, m->dlogits, m->L,   m->dtok,
                 m->dvec, m->dq_hm, m->dk_hm,  m->dv_hm,   m->dq,  m->dk,
                 m->dv,   m->dn2,   m->dh1,    m->dof,     m->dn1, m->dh0,
                 m->qb,   m->kb,    m->vb,     m->ob,      m->dob, m->pos_ids};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  free(m);
}

void tm_set_threads(tm_model *m, int n) { m->threads = n > 0 ? n : omp_get_max_threads(); }
const tm_config *tm_get_config(const tm_model *m) { return &m->c; }
int64_t tm_n_params(const tm_model *m) { return m->np; }
tm_tensor tm_get_tensor(const tm_model *m, tm_tensor_id t) { return m->t[t]; }
float *tm_params(tm_model *m) { return m->p; }
float *tm_grads(tm_model *m) { return m->g; }
const float *tm_logits(const tm_model *m) { return m->logits; }

/* h0[t] = E[ids[t]] + Pos[t % T]; returns the number of non-pad targets */
static int64_t gather(tm_model *m, const uint32_t *ids, const uint32_t *targets) {
  const int64_t N = (int64_t)m->c.batch * m->c.seq_len, C = m->c.dim;
  const float *E = m->p + m->t[TM_EMB].offset, *Pos = m->p + m->t[TM_POS].offset;
  int64_t count = 0;
  for (int64_t t = 0; t < N; t++) {
    const float *e = E + ids[t] * C, *ps = Pos + m->pos_ids[t] * C;
    float *h = m->h0 + t * C;
    for (int64_t j = 0; j < C; j++) h[j] = e[j] + ps[j];
    count += targets[t] != TM_PAD_ID;
  }
  return count;
}

static void add_inplace(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* --- forward ----------------------------------------------------------------- */
/* run a tilegrad call, time it under phase ph, return on error */
#define TRY(ph, call)                     \
  do {                                    \
    const double t0_ = omp_get_wtime();   \
    tg_status st_ = (call);               \
    m->secs[ph] += omp_get_wtime() - t0_; \
    if (st_ != TG_OK) return st_;         \
  } while (0)
#define TIMED(ph, ...)                    \
  do {                                    \
    const double t0_ = omp_get_wtime();   \
    __VA_ARGS__;                          \
    m->secs[ph] += omp_get_wtime() - t0_; \
  } while (0)

static const char *const phase_names[TM_NPHASES] = {
    "sgemm (OpenBLAS)", "attention forward",  "attention backward", "RMSNorm fwd+bwd",
    "cross-entropy",    "embedding backward", "f32->bf16 casts",    "gather/copies"};
const char *tm_phase_name(tm_phase ph) { return ph < TM_NPHASES ? phase_names[ph] : "?"; }
const double *tm_phase_seconds(const tm_model *m) { return m->secs; }

tg_status tm_forward(tm_model *m, const uint32_t *ids, const uint32_t *targets,
                     float *loss) {
  if (!m || !ids || !targets || !loss) return TG_ERR_NULL_ARG;
  const tm_config *c = &m->c;
  tg_ctx *ctx = m->ctx;
  const int N = c->batch * c->seq_len, C = c->dim, V = c->vocab;
  const int HD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
  const float *P = m->p;
  const float *E = P + m->t[TM_EMB].offset;

  /* token + position embedding lookup (a gather; the ids are checked first) */
  for (int t = 0; t < N; t++)
    if (ids[t] >= (uint32_t)V || (targets[t] != TM_PAD_ID && targets[t] >= (uint32_t)V))
      return TG_ERR_BAD_INDEX;
  TIMED(TM_PH_COPY, m->count = gather(m, ids, targets));
  /* n1 = RMSNorm(h0) w1 (r1 kept for the backward) */
  TRY(TM_PH_NORM, tg_rms_norm_forward_f32(ctx, m->h0, P + m->t[TM_NORM1].offset, m->n1,
                                          m->r1, N, C, c->eps));
  /* q, k, v projections, then bf16 for the attention kernels */
  gemm(0, 0, N, HD, C, m->n1, P + m->t[TM_WQ].offset, 0, m->q);
  gemm(0, 0, N, KD, C, m->n1, P + m->t[TM_WK].offset, 0, m->k);
  gemm(0, 0, N, KD, C, m->n1, P + m->t[TM_WV].offset, 0, m->v);
  TRY(TM_PH_CAST, tg_f32_to_bf16_cast(ctx, m->q, m->qb, (uint64_t)N * HD));
  TRY(TM_PH_CAST, tg_f32_to_bf16_cast(ctx, m->k, m->kb, (uint64_t)N * KD));
  TRY(TM_PH_CAST, tg_f32_to_bf16_cast(ctx, m->v, m->vb, (uint64_t)N * KD));
  /* causal attention: O (bf16, token-major) and the logsumexp L [B, H, T] */
  TRY(TM_PH_ATTN_FWD, tg_flash_attn_train_fwd_bf16(ctx, m->qb, m->kb, m->vb, m->ob, m->L,
                                                   &m->ap, NULL, NULL, 1));
  TIMED(TM_PH_COPY, widen_bf16(m->ob, m->of, (int64_t)N * HD));
  /* h1 = h0 + O Wo */
  TIMED(TM_PH_COPY, memcpy(m->h1, m->h0, sizeof(float) * N * C));
  gemm(0, 0, N, C, HD, m->of, P + m->t[TM_WO].offset, 1, m->h1);
  /* n2 = RMSNorm(h1) w2, logits, cross-entropy (its gradient comes for free) */
  TRY(TM_PH_NORM, tg_rms_norm_forward_f32(ctx, m->h1, P + m->t[TM_NORM2].offset, m->n2,
                                          m->r2, N, C, c->eps));
  if (c->tied)
    gemm(0, 1, N, V, C, m->n2, E, 0, m->logits);
  else
    gemm(0, 0, N, V, C, m->n2, P + m->t[TM_WOUT].offset, 0, m->logits);
  float l = 0;
  if (m->count == 0) memset(m->dlogits, 0, sizeof(float) * N * V);
  TRY(TM_PH_XENT, tg_cross_entropy_fwd_bwd(ctx, m->logits, targets, m->dlogits, &l, N, V,
                                           TM_PAD_ID, (uint32_t)m->count));
  *loss = l;
  return TG_OK;
}

/* --- forward + backward ---------------------------------------------------------- */
tg_status tm_forward_backward(tm_model *m, const uint32_t *ids, const uint32_t *targets,
                              float *loss) {
  {
    tg_status st = tm_forward(m, ids, targets, loss);
    if (st != TG_OK) return st;
  }
  const tm_config *c = &m->c;
  tg_ctx *ctx = m->ctx;
  const int B = c->batch, T = c->seq_len, N = B * T, C = c->dim, V = c->vocab;
  const int H = c->n_heads, Hk = c->n_kv_heads, Dh = c->head_dim;
  const int HD = H * Dh, KD = Hk * Dh;
  const float *P = m->p;
  float *G = m->g;
  const float *E = P + m->t[TM_EMB].offset;
  float *gE = G + m->t[TM_EMB].offset;

  /* output projection: dWout = n2^T dlogits, dn2 = dlogits Wout^T (tied: E) */
  if (c->tied) {
    gemm(1, 0, V, C, N, m->dlogits, m->n2, 0, gE); /* the embedding adds below */
    gemm(0, 0, N, C, V, m->dlogits, E, 0, m->dn2);
  } else {
    memset(gE, 0, sizeof(float) * m->t[TM_EMB].count);
    gemm(1, 0, C, V, N, m->n2, m->dlogits, 0, G + m->t[TM_WOUT].offset);
    gemm(0, 1, N, C, V, m->dlogits, P + m->t[TM_WOUT].offset, 0, m->dn2);
  }
  /* RMSNorm 2 backward with the forward's r2 */
  TRY(TM_PH_NORM, tg_rms_norm_backward_dx_f32(ctx, m->h1, P + m->t[TM_NORM2].offset, m->dn2,
                                              m->r2, m->dh1, N, C));
  TRY(TM_PH_NORM, tg_rms_norm_backward_dw_f32(ctx, m->h1, m->dn2, m->r2,
                                              G + m->t[TM_NORM2].offset, N, C));
  /* Wo: dWo = O^T dh1, dO = dh1 Wo^T, cast to bf16 for the attention backward */
  gemm(1, 0, HD, C, N, m->of, m->dh1, 0, G + m->t[TM_WO].offset);
  gemm(0, 1, N, HD, C, m->dh1, P + m->t[TM_WO].offset, 0, m->dof);
  TRY(TM_PH_CAST, tg_f32_to_bf16_cast(ctx, m->dof, m->dob, (uint64_t)N * HD));
  /* D = rowsum(O dO): over the token-major rows [B, T, H], then one
   * transpose per sequence to the [B, H, T] the backward reads */
  TRY(TM_PH_ATTN_BWD,
      tg_flash_attn_train_bwd_compute_d_bf16(ctx, m->ob, m->dob, m->dtok, B, T, H, Dh));
  for (int b = 0; b < B; b++)
    TRY(TM_PH_ATTN_BWD, tg_transpose_2d(ctx, m->dtok + (int64_t)b * T * H,
                                        m->dvec + (int64_t)b * H * T, T, H));
  /* attention backward: dQ (writes), dK, dV (accumulate: zero first) */
  TIMED(TM_PH_ATTN_BWD, memset(m->dk_hm, 0, sizeof(float) * N * KD);
        memset(m->dv_hm, 0, sizeof(float) * N * KD));
  TRY(TM_PH_ATTN_BWD,
      tg_flash_attn_train_bwd_bf16(ctx, m->qb, m->kb, m->vb, m->L, m->dob, m->dvec,
                                   m->dq_hm, m->dk_hm, m->dv_hm, &m->ap, NULL, NULL, 1));
  TIMED(TM_PH_COPY, head_to_token_major(m->dq_hm, m->dq, B, H, T, Dh);
        head_to_token_major(m->dk_hm, m->dk, B, Hk, T, Dh);
        head_to_token_major(m->dv_hm, m->dv, B, Hk, T, Dh));
  /* projections: dW = n1^T d(q|k|v), dn1 = sum d(q|k|v) W^T */
  gemm(1, 0, C, HD, N, m->n1, m->dq, 0, G + m->t[TM_WQ].offset);
  gemm(1, 0, C, KD, N, m->n1, m->dk, 0, G + m->t[TM_WK].offset);
  gemm(1, 0, C, KD, N, m->n1, m->dv, 0, G + m->t[TM_WV].offset);
  gemm(0, 1, N, C, HD, m->dq, P + m->t[TM_WQ].offset, 0, m->dn1);
  gemm(0, 1, N, C, KD, m->dk, P + m->t[TM_WK].offset, 1, m->dn1);
  gemm(0, 1, N, C, KD, m->dv, P + m->t[TM_WV].offset, 1, m->dn1);
  /* RMSNorm 1 backward, plus the residual path */
  TRY(TM_PH_NORM, tg_rms_norm_backward_dx_f32(ctx, m->h0, P + m->t[TM_NORM1].offset, m->dn1,
                                              m->r1, m->dh0, N, C));
  TRY(TM_PH_NORM, tg_rms_norm_backward_dw_f32(ctx, m->h0, m->dn1, m->r1,
                                              G + m->t[TM_NORM1].offset, N, C));
  TIMED(TM_PH_COPY, add_inplace(m->dh0, m->dh1, (int64_t)N * C));
  /* embedding backward: gE[ids[t]] += dh0[t]; the position table is an
   * embedding indexed by t % T */
  TRY(TM_PH_EMB, tg_embedding_backward(ctx, m->dh0, ids, gE, V, N, C));
  memset(G + m->t[TM_POS].offset, 0, sizeof(float) * m->t[TM_POS].count);
  TRY(TM_PH_EMB,
      tg_embedding_backward(ctx, m->dh0, m->pos_ids, G + m->t[TM_POS].offset, T, N, C));
  return TG_OK;
}

/* --- AdamW ----------------------------------------------------------------------- */
double tm_adam_step(tm_model *m, const tm_adam *o, float lr, int64_t step) {
  double sq = 0;
  for (int64_t i = 0; i < m->np; i++) sq += (double)m->g[i] * m->g[i];
  const double norm = sqrt(sq);
  const float gscale = (o->clip > 0 && norm > o->clip) ? (float)(o->clip / norm) : 1.0f;
  const float bc1 = 1.0f - powf(o->beta1, (float)step);
  const float bc2 = 1.0f - powf(o->beta2, (float)step);
  for (int ti = 0; ti < TM_NTENSORS; ti++) {
    const tm_tensor t = m->t[ti];
    const float wd = (ti == TM_NORM1 || ti == TM_NORM2) ? 0.0f : o->weight_decay;
    float *p = m->p + t.offset, *g = m->g + t.offset;
    float *m1 = m->m1 + t.offset, *m2 = m->m2 + t.offset;
    for (int64_t i = 0; i < t.count; i++) {
      const float gi = g[i] * gscale;
      m1[i] = o->beta1 * m1[i] + (1 - o->beta1) * gi;
      m2[i] = o->beta2 * m2[i] + (1 - o->beta2) * gi * gi;
      const float upd = (m1[i] / bc1) / (sqrtf(m2[i] / bc2) + o->eps);
      p[i] -= lr * (upd + wd * p[i]);
    }
  }
  return norm;
}
