/*
 * `tilegrad bench`: throughput of the FlashAttention-2 backward step (and of
 * the memory-bound kernels) as a fraction of this machine's measured ceilings.
 *
 *   attention  one timed step = tg_attn_train_bwd_step with bf16
 *              gradients (D = rowsum(O * dO), the backward, dQ, dK, dV
 *              written in bf16) -- what a training step pays.
 *              FLOPs = 10*B*H*qL*kL*D, halved for causal (qL == kL).
 *              The training forward (tg_flash_attn_train_fwd_bf16, O and L)
 *              is timed on its own on the same shapes and inputs: FLOPs =
 *              4*B*H*qL*kL*D, halved for causal.
 *              A shape with a sliding window W runs the same step through
 *              tg_attn_train_fwd/_bwd with tg_attn_options.window = W; its
 *              FLOPs count the visible (i, k) pairs only (10*B*H*D*pairs,
 *              4*B*H*D*pairs), and where the run has the full causal step
 *              of the same B,H,Hkv,L,D its "L*W share" is printed:
 *              t_window / (t_causal * pairs_window / pairs_causal).
 *   memory     kernels 3-11, each with the minimum bytes it must move (every
 *              input read once, every output written once; an accumulated
 *              output counts read + write), as GB/s and % of the triad.
 *
 * See bench/README.md for the definitions. The ceilings come from peak.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h> /* _mm_clflush, _mm_mfence: SSE2, baseline on x86-64 */
#endif

#include "bench.h"
#include "npy.h"     /* NPY_ERR_LEN: write_json's message buffer */
#include "outfile.h" /* write_json's atomic output */
#include "peak.h"
#include "tilegrad.h"
#include "tilegrad_testing.h" /* tg_testing_attn_bf16_parts: where exact mode runs three parts */

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */
/* ------------------------------------------------------------------------ */

static void *xalloc(size_t bytes) {
  size_t b = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, b ? b : 64);
}

/* Counter-based random numbers (splitmix64 of seed + index), so buffers can
 * be filled in parallel and are the same for every thread count. */
static uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* uniform in [lo, hi) */
static float urand(uint64_t seed, int64_t i, float lo, float hi) {
  uint64_t r = mix64(seed * 0x100000001B3ull + (uint64_t)i);
  return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}
static void fill_f32(float *x, int64_t n, uint64_t seed, float lo, float hi) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] = urand(seed, i, lo, hi);
}
static float bf16_to_f32(tg_bf16 h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(const double *v, int n) {
  if (n <= 0) return 0.0;
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) return v[0];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = (n & 1) ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  free(s);
  return m;
}
static double minimum(const double *v, int n) {
  double m = n > 0 ? v[0] : 0.0;
  for (int i = 1; i < n; i++)
    if (v[i] < m) m = v[i];
  return m;
}

/* CPU model from /proc/cpuinfo ("model name", else "Processor"/"Hardware"). */
static void cpu_model(char *out, size_t cap) {
  snprintf(out, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  const char *keys[] = {"model name", "Processor", "Hardware", "cpu model"};
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      size_t kl = strlen(keys[k]);
      if (strncmp(line, keys[k], kl) != 0) continue;
      char *colon = strchr(line, ':');
      if (!colon) continue;
      char *v = colon + 1;
      while (*v == ' ' || *v == '\t') v++;
      size_t n = strlen(v);
      while (n > 0 && (v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\r')) v[--n] = 0;
      if (n > 0) {
        snprintf(out, cap, "%s", v);
        found = 1;
        break;
      }
    }
  }
  fclose(f);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* JSON has no inf/nan */
static void json_num(FILE *f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

/* ------------------------------------------------------------------------ */
/* built-in shapes                                                            */
/* ------------------------------------------------------------------------ */

/* Default FA-2 backward shapes: L 512..4096, D 64/128/256, causal and full,
 * one GQA, then two sliding windows at L 8192 (Mistral-like: GQA 4:1 with
 * W 512, and W 4096). B*H shrinks as L grows so every shape is 10-170 GFLOP
 * and the whole list (6 runs per shape at 5 reps) takes ~2-4 min at 20-60
 * GFLOP/s on 2 threads. Total per repetition: ~558 GFLOP (the windows
 * counted on their visible pairs). */
static const tg_bench_shape k_default_shapes[] = {
    {4, 16, 16, 512, 64, 0, 0},    /*  10.7 GFLOP */
    {2, 16, 16, 1024, 128, 1, 0},  /*  21.5 */
    {2, 16, 16, 1024, 128, 0, 0},  /*  42.9 */
    {1, 16, 16, 2048, 64, 0, 0},   /*  42.9 */
    {1, 32, 8, 2048, 128, 1, 0},   /*  85.9  GQA 4:1 (Llama-style) */
    {1, 8, 8, 2048, 256, 1, 0},    /*  42.9 */
    {1, 8, 8, 4096, 128, 1, 0},    /*  85.9 */
    {1, 4, 4, 4096, 256, 0, 0},    /* 171.8 */
    {1, 8, 2, 8192, 64, 1, 512},   /*  20.8  window 512, GQA 4:1 */
    {1, 1, 1, 8192, 128, 1, 4096}, /*  32.2  window 4096 */
};
/* --quick: ~3.1 GFLOP per repetition at 1-2 threads. Each shape's batch B
 * is multiplied by ceil(threads / 2) where the list is taken, so the work per
 * thread stays the same: at 16 threads the fixed list was 0.2-1.3 GFLOP a
 * shape, too little to fill 16 cores (10-17% of the FMA peak on the
 * 16-core Xeon, where the default shapes reach 35-64%). */
static const tg_bench_shape k_quick_shapes[] = {
    {1, 4, 4, 256, 64, 0, 0},    /* 0.17 GFLOP */
    {1, 4, 2, 512, 128, 1, 0},   /* 0.67  GQA 2:1 */
    {1, 2, 2, 512, 256, 0, 0},   /* 1.34 */
    {1, 2, 2, 1024, 64, 1, 0},   /* 0.67 */
    {1, 2, 2, 1024, 64, 1, 256}, /* 0.29  window 256 */
};

/* --section window: sliding windows at L 8192-32768, each L with the full
 * causal step of the same heads, for the L*W share (the cost of a window
 * should follow its visible pairs: tiles outside it skipped, not masked).
 * L 16384 with W 1024 is the case the share is judged on (<= 1.3). One head
 * pair fewer each time L doubles; ~1750 GFLOP per repetition, the causal
 * L 32768 step 690 of it: about 8 min in all at 30 GFLOP/s (2 threads;
 * estimated from the FLOP, not run in full). */
static const tg_bench_shape k_window_shapes[] = {
    {1, 4, 4, 8192, 128, 1, 0},     /* 171.8 GFLOP  the causal partner */
    {1, 4, 4, 8192, 128, 1, 512},   /*  20.8 */
    {1, 4, 4, 8192, 128, 1, 4096},  /* 128.9 */
    {1, 2, 2, 16384, 128, 1, 0},    /* 343.6        the causal partner */
    {1, 2, 2, 16384, 128, 1, 512},  /*  21.1 */
    {1, 2, 2, 16384, 128, 1, 1024}, /*  41.6        the judged share */
    {1, 2, 2, 16384, 128, 1, 4096}, /* 150.3 */
    {1, 1, 1, 32768, 128, 1, 0},    /* 687.2        the causal partner */
    {1, 1, 1, 32768, 128, 1, 512},  /*  21.3 */
    {1, 1, 1, 32768, 128, 1, 4096}, /* 161.1 */
};
/* --quick --section window: the same layout at L 4096, ~8.4 GFLOP. */
static const tg_bench_shape k_quick_window_shapes[] = {
    {1, 1, 1, 4096, 64, 1, 0},    /* 5.37 GFLOP */
    {1, 1, 1, 4096, 64, 1, 256},  /* 0.65 */
    {1, 1, 1, 4096, 64, 1, 1024}, /* 2.35 */
};

/* ------------------------------------------------------------------------ */
/* attention backward                                                         */
/* ------------------------------------------------------------------------ */

typedef struct {
  tg_bench_shape s;
  double gflop; /* per step */
  int ok;
  char err[400];
  int nreps;
  double *ms;                               /* [nreps] whole step */
  double ms_med, ms_min;                    /* whole step */
  double gflops, pct_fma, pct_ceil;
  int finite; /* dQ, dK, dV all finite after the last rep */
  double gflop_fwd, ms_fwd_med, ms_fwd_min, gflops_fwd, pct_fma_fwd, pct_ceil_fwd; /* fwd */
} attn_result;

/* The (i, k) pairs of one head whose score is visible: with a window W,
 * causal: sum_i min(i + 1, W); not causal: key k > i - W, so
 * L^2 - (L - W)(L - W + 1)/2. Without a window, L(L + 1)/2 and L^2. */
static double visible_pairs(const tg_bench_shape *s) {
  const double L = s->L, W = s->window;
  if (s->window && s->window < s->L)
    return s->causal ? W * (W + 1) / 2 + (L - W) * W : L * L - (L - W) * (L - W + 1) / 2;
  return s->causal ? L * (L + 1) / 2 : L * L;
}

/* The step's FLOP: a windowed shape counts its visible pairs, the others
 * L^2, halved for causal (the bench's convention from before windows, kept
 * so that its figures stay comparable). */
static double attn_gflop(const tg_bench_shape *s) {
  const double per_pair = 10.0 * s->B * (double)s->H * s->D;
  const double L = s->L;
  if (s->window) return per_pair * visible_pairs(s) * 1e-9;
  return per_pair * (s->causal ? 0.5 * L * L : L * L) * 1e-9;
}

/* The forward's two products Q.K^T and P.V. */
static double attn_fwd_gflop(const tg_bench_shape *s) { return 0.4 * attn_gflop(s); }

/* Scores of one query row against nk keys: s[k] = scale * q . K[k].
 * Cloned per ISA where the toolchain supports ifunc dispatch; only used to
 * build the logsumexp input, never timed. */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__) && defined(__GNUC__) && \
    !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void row_scores(const float *q, const float *K, int64_t nk, int D, float scale,
                       float *s) {
  for (int64_t k = 0; k < nk; k++) {
    const float *kr = K + k * D;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int d = 0; d < D; d++) acc += q[d] * kr[d];
    s[k] = acc * scale;
  }
}

/* Exact natural-log logsumexp of every score row (what the forward would
 * leave in L), from the bf16 inputs widened to f32. Returns 0, or -1 when a
 * row buffer cannot be allocated. */
static int exact_logsumexp(const tg_bench_shape *s, const float *Qf, const float *Kf,
                           float scale, float *Lse) {
  const int64_t L = s->L, H = s->H, D = s->D, gqa = s->H / s->Hkv;
  const int64_t rows = (int64_t)s->B * H * L;
  int failed = 0;
#pragma omp parallel
  {
    float *buf = malloc((size_t)L * sizeof(float));
    if (!buf) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 16)
    for (int64_t row = 0; row < rows; row++) {
      if (!buf) continue;
      const int64_t bh = row / L, i = row % L;
      const int64_t b = bh / H, h = bh % H;
      const float *Kb = Kf + ((b * s->Hkv + h / gqa) * L) * D;
      const int64_t hi = s->causal ? i + 1 : L;       /* keys [lo, hi) visible */
      const int64_t lo = s->window && i >= s->window ? i - s->window + 1 : 0;
      const int64_t nvis = hi - lo;
      row_scores(Qf + row * D, Kb + lo * D, nvis, (int)D, scale, buf);
      float m = -INFINITY;
      for (int64_t k = 0; k < nvis; k++) m = buf[k] > m ? buf[k] : m;
      double sum = 0.0;
      for (int64_t k = 0; k < nvis; k++) sum += exp((double)(buf[k] - m));
      Lse[row] = m + (float)log(sum);
    }
    free(buf);
  }
  return failed ? -1 : 0;
}

/* No bf16 of x[0..n) is an inf or NaN (exponent bits all ones). */
static int all_finite_bf16(const tg_bf16 *x, int64_t n) {
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (int64_t i = 0; i < n; i++) bad |= (x[i] & 0x7f80u) == 0x7f80u;
  return !bad;
}

#define CHECK_TG(call, what)                                                       \
  do {                                                                             \
    tg_status st_ = (call);                                                        \
    if (st_ != TG_OK) {                                                            \
      snprintf(r->err, sizeof r->err, "%s: %s (%s)", what, tg_status_str(st_),    \
               tg_ctx_last_error(ctx));                                            \
      goto done;                                                                   \
    }                                                                              \
  } while (0)

static void run_attn_shape(tg_ctx *ctx, const tg_bench_opts *o, attn_result *r) {
  const tg_bench_shape *s = &r->s;
  const int64_t nq = (int64_t)s->B * s->H * s->L * s->D;   /* Q, O, dO, dQ */
  const int64_t nk = (int64_t)s->B * s->Hkv * s->L * s->D; /* K, V, dK, dV */
  const int64_t nrow = (int64_t)s->B * s->H * s->L;        /* L */
  const float scale = 1.0f / sqrtf((float)s->D);
  r->gflop = attn_gflop(s);
  r->nreps = o->reps;
  r->ms = calloc((size_t)o->reps, sizeof(double));
  double *ms_f = calloc((size_t)o->reps, sizeof(double));

  tg_bf16 *Q = xalloc((size_t)nq * 2), *K = xalloc((size_t)nk * 2),
          *V = xalloc((size_t)nk * 2), *O = xalloc((size_t)nq * 2),
          *dO = xalloc((size_t)nq * 2);
  tg_bf16 *dQb = xalloc((size_t)nq * 2), *dKb = xalloc((size_t)nk * 2),
          *dVb = xalloc((size_t)nk * 2);
  float *Lse = xalloc((size_t)nrow * 4);
  float *Qf = xalloc((size_t)nq * 4), *Kf = xalloc((size_t)nk * 4);
  tg_bf16 *Ofwd = xalloc((size_t)nq * 2); /* the forward's outputs: the */
  float *Lfwd = xalloc((size_t)nrow * 4);  /* backward's inputs stay as they are */
  r->gflop_fwd = attn_fwd_gflop(s);
  if (!r->ms || !ms_f || !Q || !K || !V || !O || !dO || !dQb || !dKb || !dVb || !Lse || !Qf ||
      !Kf || !Ofwd || !Lfwd) {
    snprintf(r->err, sizeof r->err, "out of memory allocating the buffers");
    goto done;
  }

  /* Inputs: uniform in [-1, 1), rounded to bf16 by the library's cast. Q and
   * K are then widened back so the logsumexp sees exactly the bf16 values. */
  fill_f32(Qf, nq, 1, -1.0f, 1.0f);
  CHECK_TG(tg_f32_to_bf16_cast(ctx, Qf, Q, (uint64_t)nq), "cast Q");
  fill_f32(Kf, nk, 2, -1.0f, 1.0f);
  CHECK_TG(tg_f32_to_bf16_cast(ctx, Kf, K, (uint64_t)nk), "cast K");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nq; i++) Qf[i] = bf16_to_f32(Q[i]);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nk; i++) Kf[i] = bf16_to_f32(K[i]);
  if (exact_logsumexp(s, Qf, Kf, scale, Lse)) {
    snprintf(r->err, sizeof r->err, "out of memory computing the logsumexp");
    goto done;
  }
  /* Qf (nq >= nk floats) becomes the scratch for the other inputs. */
  fill_f32(Qf, nk, 3, -1.0f, 1.0f);
  CHECK_TG(tg_f32_to_bf16_cast(ctx, Qf, V, (uint64_t)nk), "cast V");
  fill_f32(Qf, nq, 4, -1.0f, 1.0f);
  CHECK_TG(tg_f32_to_bf16_cast(ctx, Qf, O, (uint64_t)nq), "cast O");
  fill_f32(Qf, nq, 5, -1.0f, 1.0f);
  CHECK_TG(tg_f32_to_bf16_cast(ctx, Qf, dO, (uint64_t)nq), "cast dO");
  free(Qf);
  free(Kf);
  Qf = Kf = NULL;

  tg_attn_params p;
  CHECK_TG(tg_attn_params_init(&p, s->B, s->H, s->Hkv, s->L, s->L, s->D, scale),
           "tg_attn_params_init");
  /* (the step writes dK, dV: no zero-filled buffers between steps) */
  const tg_attn_options step_opt = {.window = (uint32_t)s->window};
  const tg_attn_options *opt = &step_opt;

  /* The forward alone, reps of its own (rep -1: untimed warm-up). */
  for (int rep = -1; rep < o->reps; rep++) {
    double t0 = omp_get_wtime();
    CHECK_TG(tg_attn_train_fwd(ctx, TG_DTYPE_BF16, Q, K, V, Ofwd, Lfwd, &p, NULL, NULL,
                               s->causal, opt),
             "tg_attn_train_fwd");
    if (rep >= 0) ms_f[rep] = (omp_get_wtime() - t0) * 1e3;
  }
  r->ms_fwd_med = median(ms_f, o->reps);
  r->ms_fwd_min = minimum(ms_f, o->reps);
  r->gflops_fwd = r->ms_fwd_med > 0 ? r->gflop_fwd / (r->ms_fwd_med * 1e-3) : 0.0;

  /* rep -1 is the untimed warm-up (first touch, scratch arenas, caches) */
  for (int rep = -1; rep < o->reps; rep++) {
    double t0 = omp_get_wtime();
    CHECK_TG(tg_attn_train_bwd_step(ctx, TG_DTYPE_BF16, TG_DTYPE_BF16, Q, K, V, O, Lse, dO, dQb,
                                    dKb, dVb, &p, NULL, NULL, s->causal, opt),
             "tg_attn_train_bwd_step");
    if (rep >= 0) r->ms[rep] = (omp_get_wtime() - t0) * 1e3;
  }
  r->ok = 1;
  r->finite = all_finite_bf16(dQb, nq) && all_finite_bf16(dKb, nk) && all_finite_bf16(dVb, nk);
  r->ms_med = median(r->ms, o->reps);
  r->ms_min = minimum(r->ms, o->reps);
  r->gflops = r->ms_med > 0 ? r->gflop / (r->ms_med * 1e-3) : 0.0;

done:
  free(ms_f);
  free(Ofwd);
  free(Lfwd);
  free(Q);
  free(K);
  free(V);
  free(O);
  free(dO);
  free(dQb);
  free(dKb);
  free(dVb);
  free(Lse);
  free(Qf);
  free(Kf);
}
#undef CHECK_TG

/* ------------------------------------------------------------------------ */
/* memory-bound kernels: the hook table                                       */
/* ------------------------------------------------------------------------ */
/*
 * To add a kernel: write a setup function that allocates its buffers with
 * mc_f32()/mc_u32()/mc_bf16() (freed for you), fills in shape, bytes (the
 * minimum bytes one call must move: inputs read once, outputs written once,
 * accumulated outputs read + written) and, for a kernel that is compute-bound
 * rather than memory-bound, flops; a run function that makes the one call;
 * and a row in k_mem_kernels. Only reference entry points the library really
 * exports (nm -D libtilegrad.so | grep ' T tg_').
 */
#define MC_MAX_BUFS 8
typedef struct {
  void *buf[MC_MAX_BUFS];
  size_t size[MC_MAX_BUFS]; /* bytes of each buffer */
  int nbuf;
  uint32_t u[4]; /* sizes, kernel-specific */
  double bytes;  /* minimum bytes moved per call */
  double flops;  /* > 0 for compute-bound entries */
  char shape[96];
} mem_case;

typedef struct {
  const char *name;                         /* the library entry point */
  int (*setup)(mem_case *c, int quick);     /* 0 on success */
  tg_status (*run)(tg_ctx *ctx, mem_case *c);
} mem_kernel;

static void *mc_alloc(mem_case *c, size_t bytes) {
  if (c->nbuf >= MC_MAX_BUFS) return NULL;
  void *p = xalloc(bytes);
  if (p) {
    c->size[c->nbuf] = bytes;
    c->buf[c->nbuf++] = p;
  }
  return p;
}
static float *mc_f32(mem_case *c, int64_t n, uint64_t seed, float lo, float hi) {
  float *p = mc_alloc(c, (size_t)n * sizeof(float));
  if (p) fill_f32(p, n, seed, lo, hi);
  return p;
}
static uint32_t *mc_u32(mem_case *c, int64_t n, uint64_t seed, uint32_t mod) {
  uint32_t *p = mc_alloc(c, (size_t)n * sizeof(uint32_t));
  if (p) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = (uint32_t)(mix64(seed * 0x9E37ull + (uint64_t)i) % mod);
  }
  return p;
}
static void mc_free(mem_case *c) {
  for (int i = 0; i < c->nbuf; i++) free(c->buf[i]);
  c->nbuf = 0;
}
/* bf16 buffer of n values uniform in [lo, hi), rounded to nearest even
 * (finite values only: no NaN handling needed). */
static tg_bf16 *mc_bf16(mem_case *c, int64_t n, uint64_t seed, float lo, float hi) {
  tg_bf16 *p = mc_alloc(c, (size_t)n * sizeof(tg_bf16));
  if (p) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
      const float f = urand(seed, i, lo, hi);
      uint32_t u;
      memcpy(&u, &f, sizeof u);
      p[i] = (tg_bf16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
  }
  return p;
}
#define F4 4.0 /* bytes per f32 */
#define B2 2.0 /* bytes per bf16 */

/* 3. f32 -> bf16 cast: read n f32, write n bf16. */
static int mb_cast_setup(mem_case *c, int quick) {
  const int64_t n = quick ? (int64_t)1 << 24 : (int64_t)1 << 26;
  c->u[0] = (uint32_t)n;
  if (!mc_f32(c, n, 11, -2.0f, 2.0f) || !mc_alloc(c, (size_t)n * 2)) return -1;
  c->bytes = 6.0 * n;
  snprintf(c->shape, sizeof c->shape, "n=%lld", (long long)n);
  return 0;
}
static tg_status mb_cast_run(tg_ctx *ctx, mem_case *c) {
  return tg_f32_to_bf16_cast(ctx, c->buf[0], c->buf[1], c->u[0]);
}

/* RMSNorm shapes: rows x dim f32, 128 MiB per [rows, dim] array (32 MiB quick). */
static void rms_dims(mem_case *c, int quick) {
  c->u[0] = quick ? 2048 : 8192; /* rows */
  c->u[1] = 4096;                /* dim */
  snprintf(c->shape, sizeof c->shape, "rows=%u dim=%u", c->u[0], c->u[1]);
}

/* 4a. r[b] = 1/sqrt(mean x^2 + eps): read x, write r. */
static int mb_rms_inv_setup(mem_case *c, int quick) {
  rms_dims(c, quick);
  const double R = c->u[0], Dm = c->u[1];
  if (!mc_f32(c, (int64_t)c->u[0] * c->u[1], 21, -1, 1) || !mc_f32(c, c->u[0], 22, 0, 1))
    return -1;
  c->bytes = F4 * (R * Dm + R);
  return 0;
}
static tg_status mb_rms_inv_run(tg_ctx *ctx, mem_case *c) {
  return tg_rms_norm_compute_rms_inv_f32(ctx, c->buf[0], c->buf[1], c->u[0], c->u[1], 1e-6f);
}

/* 4b. dx: read x, dy, w, r; write dx. */
static int mb_rms_dx_setup(mem_case *c, int quick) {
  rms_dims(c, quick);
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  const double R = c->u[0], Dm = c->u[1];
  if (!mc_f32(c, n, 31, -1, 1) || !mc_f32(c, c->u[1], 32, 0.5f, 1.5f) ||
      !mc_f32(c, n, 33, -1, 1) || !mc_f32(c, c->u[0], 34, 0.5f, 2.0f) ||
      !mc_f32(c, n, 35, 0, 0))
    return -1;
  c->bytes = F4 * (3 * R * Dm + Dm + R);
  return 0;
}
static tg_status mb_rms_dx_run(tg_ctx *ctx, mem_case *c) {
  return tg_rms_norm_backward_dx_f32(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3],
                                     c->buf[4], c->u[0], c->u[1]);
}

/* 4c. dw: read x, dy, r; write dw. */
static int mb_rms_dw_setup(mem_case *c, int quick) {
  rms_dims(c, quick);
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  const double R = c->u[0], Dm = c->u[1];
  if (!mc_f32(c, n, 41, -1, 1) || !mc_f32(c, n, 42, -1, 1) ||
      !mc_f32(c, c->u[0], 43, 0.5f, 2.0f) || !mc_f32(c, c->u[1], 44, 0, 0))
    return -1;
  c->bytes = F4 * (2 * R * Dm + R + Dm);
  return 0;
}
static tg_status mb_rms_dw_run(tg_ctx *ctx, mem_case *c) {
  return tg_rms_norm_backward_dw_f32(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->u[0],
                                     c->u[1]);
}

/* 5. fused: read input, grad_out, weight; write grad_input; grad_weight
 * accumulates (read + write). */
static int mb_rms_fused_setup(mem_case *c, int quick) {
  rms_dims(c, quick);
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  const double R = c->u[0], Dm = c->u[1];
  if (!mc_f32(c, n, 51, -1, 1) || !mc_f32(c, c->u[1], 52, 0.5f, 1.5f) ||
      !mc_f32(c, n, 53, -1, 1) || !mc_f32(c, n, 54, 0, 0) || !mc_f32(c, c->u[1], 55, 0, 0))
    return -1;
  c->bytes = F4 * (3 * R * Dm + 3 * Dm);
  return 0;
}
static tg_status mb_rms_fused_run(tg_ctx *ctx, mem_case *c) {
  return tg_rms_norm_backward(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->buf[4],
                              c->u[0], c->u[1], 1e-6f);
}

/* 6. softmax backward: read sm, grad_out; write grad_in. */
static int mb_softmax_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 1024 : 4096; /* rows */
  c->u[1] = 8192;                /* row_len */
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  if (!mc_f32(c, n, 61, 0, 2.0f / 8192) || !mc_f32(c, n, 62, -1, 1) || !mc_f32(c, n, 63, 0, 0))
    return -1;
  c->bytes = F4 * 3.0 * (double)n;
  snprintf(c->shape, sizeof c->shape, "rows=%u len=%u", c->u[0], c->u[1]);
  return 0;
}
static tg_status mb_softmax_run(tg_ctx *ctx, mem_case *c) {
  return tg_softmax_backward(ctx, c->buf[0], c->buf[1], c->buf[2], c->u[0], c->u[1]);
}

/* 7. embedding backward: read grad_out and ids; every distinct row of
 * grad_weight that is hit is read and written once. */
static int mb_embed_setup(mem_case *c, int quick) {
  c->u[0] = 50257;                 /* vocab */
  c->u[1] = quick ? 8192 : 32768;  /* seq_len (tokens) */
  c->u[2] = 1024;                  /* dim */
  const int64_t T = c->u[1], Dm = c->u[2];
  if (!mc_f32(c, T * Dm, 71, -1, 1)) return -1;
  uint32_t *ids = mc_u32(c, T, 72, c->u[0]);
  if (!ids || !mc_f32(c, (int64_t)c->u[0] * Dm, 73, 0, 0)) return -1;
  unsigned char *seen = calloc(c->u[0], 1);
  if (!seen) return -1;
  int64_t distinct = 0;
  for (int64_t t = 0; t < T; t++)
    if (!seen[ids[t]]) {
      seen[ids[t]] = 1;
      distinct++;
    }
  free(seen);
  c->bytes = F4 * ((double)T * Dm + (double)T + 2.0 * (double)distinct * Dm);
  snprintf(c->shape, sizeof c->shape, "vocab=%u tokens=%u dim=%u", c->u[0], c->u[1], c->u[2]);
  return 0;
}
static tg_status mb_embed_run(tg_ctx *ctx, mem_case *c) {
  return tg_embedding_backward(ctx, c->buf[0], c->buf[1], c->buf[2], c->u[0], c->u[1],
                               c->u[2]);
}

/* 8. cross-entropy fwd+bwd: read logits and targets; write grad; loss
 * accumulates (8 bytes). No padded positions (pad_id = vocab). */
static int mb_ce_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 512 : 2048; /* positions */
  c->u[1] = 32000;              /* vocab */
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  if (!mc_f32(c, n, 81, -4, 4) || !mc_u32(c, c->u[0], 82, c->u[1]) || !mc_f32(c, n, 83, 0, 0) ||
      !mc_f32(c, 1, 84, 0, 0))
    return -1;
  c->bytes = F4 * (2.0 * (double)n + c->u[0] + 2);
  snprintf(c->shape, sizeof c->shape, "pos=%u vocab=%u", c->u[0], c->u[1]);
  return 0;
}
static tg_status mb_ce_run(tg_ctx *ctx, mem_case *c) {
  return tg_cross_entropy_fwd_bwd(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->u[0],
                                  c->u[1], /*pad_id=*/c->u[1], /*count=*/c->u[0]);
}

/* 9. transpose: read and write rows x cols. */
static int mb_transpose_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 2048 : 8192; /* rows */
  c->u[1] = 4096 + 64;           /* cols: not a power of two (cache-set aliasing) */
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  if (!mc_f32(c, n, 91, -1, 1) || !mc_f32(c, n, 92, 0, 0)) return -1;
  c->bytes = F4 * 2.0 * (double)n;
  snprintf(c->shape, sizeof c->shape, "%ux%u", c->u[0], c->u[1]);
  return 0;
}
static tg_status mb_transpose_run(tg_ctx *ctx, mem_case *c) {
  return tg_transpose_2d(ctx, c->buf[0], c->buf[1], c->u[0], c->u[1]);
}

/* 10. naive causal attention backward: compute-bound (FLOPs counted as the
 * FA-2 backward, 10*H*T^2*D/2); bytes: read Q, dO, K, V; write dQ; dK, dV
 * accumulate. */
static int mb_causal_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 256 : 1024; /* seq */
  c->u[1] = 8;                  /* heads */
  c->u[2] = 2;                  /* kv heads */
  c->u[3] = 64;                 /* head dim */
  const int64_t T = c->u[0], nq = T * c->u[1] * c->u[3], nk = T * c->u[2] * c->u[3];
  if (!mc_f32(c, nq, 101, -1, 1) || !mc_f32(c, nq, 102, -1, 1) || !mc_f32(c, nk, 103, -1, 1) ||
      !mc_f32(c, nk, 104, -1, 1) || !mc_f32(c, nq, 105, 0, 0) || !mc_f32(c, nk, 106, 0, 0) ||
      !mc_f32(c, nk, 107, 0, 0))
    return -1;
  c->bytes = F4 * (3.0 * nq + 2.0 * nk + 4.0 * nk);
  c->flops = 10.0 * c->u[1] * (double)T * (double)T * c->u[3] * 0.5;
  snprintf(c->shape, sizeof c->shape, "seq=%u H=%u Hkv=%u D=%u", c->u[0], c->u[1], c->u[2],
           c->u[3]);
  return 0;
}
static tg_status mb_causal_run(tg_ctx *ctx, mem_case *c) {
  /* buffers: 0 grad_out, 1 Q, 2 K, 3 V, 4 grad_Q, 5 grad_K, 6 grad_V */
  return tg_causal_attention_backward(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3],
                                      c->buf[4], c->buf[5], c->buf[6], c->u[0], c->u[1],
                                      c->u[2], c->u[3]);
}

/* 11. decode reduce: read the partials and (S, M) pairs; write nrows x DV. */
static int decode_setup(mem_case *c, int quick, uint32_t dv) {
  c->u[0] = quick ? 2048 : 8192; /* nrows */
  c->u[1] = dv;                  /* head_dim */
  c->u[2] = 16;                  /* nwg */
  const int64_t R = c->u[0], W = c->u[2];
  const int64_t parts = R * dv * W;
  float *h = mc_alloc(c, (size_t)(parts + 2 * R * W) * sizeof(float));
  if (!h || !mc_f32(c, R * dv, 0, 0, 0)) return -1;
  fill_f32(h, parts, 111, -1, 1);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R * W; i++) {
    h[parts + 2 * i] = urand(112, i, 0.5f, 1.5f);    /* S */
    h[parts + 2 * i + 1] = urand(113, i, -2.0f, 2.0f); /* M */
  }
  c->bytes = F4 * ((double)parts + 2.0 * R * W + (double)R * dv);
  snprintf(c->shape, sizeof c->shape, "rows=%u DV=%u nwg=%u", c->u[0], c->u[1], c->u[2]);
  return 0;
}
static int mb_reduce_setup(mem_case *c, int quick) { return decode_setup(c, quick, 256); }
static tg_status mb_reduce_run(tg_ctx *ctx, mem_case *c) {
  return tg_flash_attn_vec_reduce(ctx, c->buf[0], c->buf[1], c->u[0], c->u[1], c->u[2]);
}
static tg_status mb_reduce_hb_run(tg_ctx *ctx, mem_case *c) {
  return tg_flash_attn_vec_reduce_tq_hb_undo(ctx, c->buf[0], c->buf[1], c->u[0], c->u[1],
                                             c->u[2]);
}

/* in-place FWHT + sign undo: read and write heads x D. */
static int mb_fwht_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 32768 : 131072; /* heads */
  c->u[1] = 256;
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  if (!mc_f32(c, n, 121, -1, 1)) return -1;
  c->bytes = F4 * 2.0 * (double)n;
  snprintf(c->shape, sizeof c->shape, "heads=%u D=%u", c->u[0], c->u[1]);
  return 0;
}
static tg_status mb_fwht_run(tg_ctx *ctx, mem_case *c) {
  return tg_fwht_sign_undo_f32(ctx, c->buf[0], c->u[0], c->u[1]);
}

/* 12. RoPE of q and k, as apply_rotary_pos_emb calls it: two calls, q then k
 * (the entry point takes one tensor). Llama-3-8B's attention: 32 q heads,
 * 8 kv heads, D = R = 128, rotate-half, bf16 throughout. x and y keep the
 * projection's [B=1, L, H, D] storage, read as the [B, H, L, D] view (head
 * stride D, row stride H*D), as the torch op passes q.transpose(1, 2); cos,
 * sin [1, L, D] bf16 (the model's dtype). Bytes: q, k read and written,
 * the tables read once (the k call finds them where the q call left them).
 * Buffers: 0 xq, 1 xk, 2 cos, 3 sin, 4 yq, 5 yk (backward: dy in, dx out). */
static int mb_rope_setup(mem_case *c, int quick) {
  c->u[0] = quick ? 1024 : 4096; /* tokens L */
  c->u[1] = 32;                  /* q heads */
  c->u[2] = 8;                   /* kv heads */
  c->u[3] = 128;                 /* head dim = rotary dim */
  const int64_t L = c->u[0], D = c->u[3], nq = L * c->u[1] * D, nk = L * c->u[2] * D;
  if (!mc_bf16(c, nq, 131, -1, 1) || !mc_bf16(c, nk, 132, -1, 1) ||
      !mc_bf16(c, L * D, 133, -1, 1) || !mc_bf16(c, L * D, 134, -1, 1) ||
      !mc_bf16(c, nq, 135, 0, 0) || !mc_bf16(c, nk, 136, 0, 0))
    return -1;
  c->bytes = B2 * (2.0 * (double)nq + 2.0 * (double)nk + 2.0 * (double)L * D);
  snprintf(c->shape, sizeof c->shape, "q%u+k%u L=%u D=%u bf16", c->u[1], c->u[2], c->u[0],
           c->u[3]);
  return 0;
}
/* One call on H heads of the [1, L, H, D] storage at x and y. */
static tg_status rope_call(tg_ctx *ctx, mem_case *c, int backward, const void *x, void *y,
                           int H) {
  tg_rope_params p;
  tg_status st = tg_rope_params_init(&p, 1, H, (int)c->u[0], (int)c->u[3], (int)c->u[3],
                                     TG_ROPE_ROTATE_HALF);
  if (st != TG_OK) return st;
  p.x_dtype = p.y_dtype = p.table_dtype = TG_DTYPE_BF16;
  const int64_t D = c->u[3], row = (int64_t)H * D;
  p.x_strides[0] = p.y_strides[0] = row * c->u[0];
  p.x_strides[1] = p.y_strides[1] = D;
  p.x_strides[2] = p.y_strides[2] = row;
  return backward ? tg_rope_backward(ctx, x, c->buf[2], c->buf[3], y, &p)
                  : tg_rope_forward(ctx, x, c->buf[2], c->buf[3], y, &p);
}
static tg_status rope_qk(tg_ctx *ctx, mem_case *c, int backward) {
  tg_status st = rope_call(ctx, c, backward, c->buf[0], c->buf[4], (int)c->u[1]);
  return st != TG_OK ? st : rope_call(ctx, c, backward, c->buf[1], c->buf[5], (int)c->u[2]);
}
static tg_status mb_rope_fwd_run(tg_ctx *ctx, mem_case *c) { return rope_qk(ctx, c, 0); }
static tg_status mb_rope_bwd_run(tg_ctx *ctx, mem_case *c) { return rope_qk(ctx, c, 1); }

/* 13. GLU of the MLP, Llama-3.2-1B's intermediate width: gate, up [T, 8192]
 * bf16, contiguous (separate gate_proj and up_proj outputs). forward: read
 * gate, up; write y. backward: read gate, up, dy; write dgate, dup.
 * Buffers: 0 gate, 1 up, 2 y or dy, 3 dgate, 4 dup. */
static int glu_setup(mem_case *c, int quick, int backward) {
  c->u[0] = quick ? 1024 : 4096; /* tokens (rows) */
  c->u[1] = 8192;                /* intermediate (cols) */
  const int64_t n = (int64_t)c->u[0] * c->u[1];
  const float d = backward ? 1.0f : 0.0f; /* dy in [-1, 1); y zeroed */
  if (!mc_bf16(c, n, 141, -4, 4) || !mc_bf16(c, n, 142, -1, 1) || !mc_bf16(c, n, 143, -d, d))
    return -1;
  if (backward && (!mc_bf16(c, n, 144, 0, 0) || !mc_bf16(c, n, 145, 0, 0))) return -1;
  c->bytes = B2 * (backward ? 5.0 : 3.0) * (double)n;
  return 0;
}
static int glu_shape(mem_case *c, const char *act) {
  snprintf(c->shape, sizeof c->shape, "%s T=%u x %u bf16", act, c->u[0], c->u[1]);
  return 0;
}
static int mb_swiglu_fwd_setup(mem_case *c, int quick) {
  return glu_setup(c, quick, 0) ? -1 : glu_shape(c, "silu");
}
static int mb_swiglu_bwd_setup(mem_case *c, int quick) {
  return glu_setup(c, quick, 1) ? -1 : glu_shape(c, "silu");
}
static int mb_geglu_fwd_setup(mem_case *c, int quick) {
  return glu_setup(c, quick, 0) ? -1 : glu_shape(c, "gelu_tanh");
}
static int mb_geglu_bwd_setup(mem_case *c, int quick) {
  return glu_setup(c, quick, 1) ? -1 : glu_shape(c, "gelu_tanh");
}
static tg_status glu_fwd(tg_ctx *ctx, mem_case *c, tg_glu_act act) {
  const int64_t s = c->u[1];
  return tg_glu_forward(ctx, c->buf[0], c->buf[1], c->buf[2], act, TG_DTYPE_BF16, c->u[0],
                        c->u[1], s, s, s);
}
static tg_status glu_bwd(tg_ctx *ctx, mem_case *c, tg_glu_act act) {
  const int64_t s = c->u[1];
  return tg_glu_backward(ctx, c->buf[0], c->buf[1], c->buf[2], c->buf[3], c->buf[4], act,
                         TG_DTYPE_BF16, c->u[0], c->u[1], s, s, s, s, s);
}
static tg_status mb_swiglu_fwd_run(tg_ctx *ctx, mem_case *c) {
  return glu_fwd(ctx, c, TG_GLU_SILU);
}
static tg_status mb_swiglu_bwd_run(tg_ctx *ctx, mem_case *c) {
  return glu_bwd(ctx, c, TG_GLU_SILU);
}
static tg_status mb_geglu_fwd_run(tg_ctx *ctx, mem_case *c) {
  return glu_fwd(ctx, c, TG_GLU_GELU_TANH);
}
static tg_status mb_geglu_bwd_run(tg_ctx *ctx, mem_case *c) {
  return glu_bwd(ctx, c, TG_GLU_GELU_TANH);
}

static const mem_kernel k_mem_kernels[] = {
    {"tg_f32_to_bf16_cast", mb_cast_setup, mb_cast_run},
    {"tg_rms_norm_compute_rms_inv_f32", mb_rms_inv_setup, mb_rms_inv_run},
    {"tg_rms_norm_backward_dx_f32", mb_rms_dx_setup, mb_rms_dx_run},
    {"tg_rms_norm_backward_dw_f32", mb_rms_dw_setup, mb_rms_dw_run},
    {"tg_rms_norm_backward", mb_rms_fused_setup, mb_rms_fused_run},
    {"tg_softmax_backward", mb_softmax_setup, mb_softmax_run},
    {"tg_embedding_backward", mb_embed_setup, mb_embed_run},
    {"tg_cross_entropy_fwd_bwd", mb_ce_setup, mb_ce_run},
    {"tg_transpose_2d", mb_transpose_setup, mb_transpose_run},
    {"tg_causal_attention_backward", mb_causal_setup, mb_causal_run},
    {"tg_flash_attn_vec_reduce", mb_reduce_setup, mb_reduce_run},
    {"tg_flash_attn_vec_reduce_tq_hb_undo", mb_reduce_setup, mb_reduce_hb_run},
    {"tg_fwht_sign_undo_f32", mb_fwht_setup, mb_fwht_run},
    {"tg_rope_forward", mb_rope_setup, mb_rope_fwd_run},
    {"tg_rope_backward", mb_rope_setup, mb_rope_bwd_run},
    {"tg_glu_forward", mb_swiglu_fwd_setup, mb_swiglu_fwd_run},
    {"tg_glu_backward", mb_swiglu_bwd_setup, mb_swiglu_bwd_run},
    {"tg_glu_forward", mb_geglu_fwd_setup, mb_geglu_fwd_run},
    {"tg_glu_backward", mb_geglu_bwd_setup, mb_geglu_bwd_run},
};
#define N_MEM_KERNELS ((int)(sizeof k_mem_kernels / sizeof k_mem_kernels[0]))

typedef struct {
  const char *name;
  char shape[96];
  int ok;
  char err[400];
  double bytes, flops;
  double ms_med, ms_min;
  double gbs, pct_triad, gflops, pct_fma;
} mem_result;

/* Untimed eviction of a case's buffers before every repetition, so each
 * repetition starts with its data in DRAM and no dirty lines pending (a plain
 * read sweep of a big buffer does not do it: the adaptive L3 insertion of
 * recent x86 parts can keep re-used lines through a one-pass scan). x86:
 * clflush (SSE2, always present) of every line; elsewhere: nothing. */
static void evict_buffers(const mem_case *c) {
#if defined(__x86_64__) || defined(__i386__)
  for (int b = 0; b < c->nbuf; b++) {
    const char *p = c->buf[b];
    const int64_t lines = (int64_t)((c->size[b] + 63) / 64);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < lines; i++) _mm_clflush(p + i * 64);
  }
  _mm_mfence();
#else
  (void)c;
#endif
}

static void run_mem_kernel(tg_ctx *ctx, const tg_bench_opts *o, const mem_kernel *k,
                           mem_result *r) {
  mem_case c;
  memset(&c, 0, sizeof c);
  r->name = k->name;
  double *ms = calloc((size_t)o->reps, sizeof(double));
  if (!ms || k->setup(&c, o->quick) != 0) {
    snprintf(r->err, sizeof r->err, "out of memory setting up the case");
    goto done;
  }
  snprintf(r->shape, sizeof r->shape, "%s", c.shape);
  r->bytes = c.bytes;
  r->flops = c.flops;
  for (int rep = -1; rep < o->reps; rep++) {
    evict_buffers(&c);
    double t0 = omp_get_wtime();
    tg_status st = k->run(ctx, &c);
    double t = omp_get_wtime() - t0;
    if (st != TG_OK) {
      snprintf(r->err, sizeof r->err, "%s: %s (%s)", k->name, tg_status_str(st),
               tg_ctx_last_error(ctx));
      goto done;
    }
    if (rep >= 0) ms[rep] = t * 1e3;
  }
  r->ok = 1;
  r->ms_med = median(ms, o->reps);
  r->ms_min = minimum(ms, o->reps);
  r->gbs = r->ms_med > 0 ? r->bytes / (r->ms_med * 1e-3) * 1e-9 : 0.0;
  r->gflops = r->ms_med > 0 ? r->flops / (r->ms_med * 1e-3) * 1e-9 : 0.0;
done:
  free(ms);
  mc_free(&c);
}

/* ------------------------------------------------------------------------ */
/* report                                                                     */
/* ------------------------------------------------------------------------ */

static void fmt_shape(char *out, size_t cap, const tg_bench_shape *s) {
  if (s->window)
    snprintf(out, cap, "%d,%d,%d,%d,%d,%s,W%d", s->B, s->H, s->Hkv, s->L, s->D,
             s->causal ? "causal" : "full", s->window);
  else
    snprintf(out, cap, "%d,%d,%d,%d,%d,%s", s->B, s->H, s->Hkv, s->L, s->D,
             s->causal ? "causal" : "full");
}

/* The full causal step of the same B,H,Hkv,L,D as windowed result w, or
 * NULL: the denominator of w's L*W share. */
static const attn_result *causal_partner(const attn_result *ar, int na, const attn_result *w) {
  for (int i = 0; i < na; i++) {
    const tg_bench_shape *c = &ar[i].s;
    if (ar[i].ok && c->causal && !c->window && c->B == w->s.B && c->H == w->s.H &&
        c->Hkv == w->s.Hkv && c->L == w->s.L && c->D == w->s.D)
      return &ar[i];
  }
  return NULL;
}

/* t_window / (t_causal * pairs_window / pairs_causal): 1.0 when the
 * window's step costs exactly its share of the visible pairs. */
static double lw_share(double ms_window, const tg_bench_shape *w, double ms_causal,
                       const tg_bench_shape *c) {
  return ms_window / (ms_causal * visible_pairs(w) / visible_pairs(c));
}

/* The step's (or the forward's) ceilings: `base`, and from head dim
 * parts_min_d on (0: none) `parts`, where exact mode runs its P and dS
 * products as bf16 parts on the table's bf16 unit (three in the step, two
 * for the forward's P). */
typedef struct {
  double base, parts;
  int parts_min_d;
} step_ceilings;

static double ceiling_at(const step_ceilings *c, int64_t D) {
  return c->parts_min_d > 0 && D >= c->parts_min_d ? c->parts : c->base;
}

/* Written to a temporary next to path and renamed over it when complete
 * (cli/outfile.h): a failed or interrupted write leaves path as it was. */
static int write_json(const char *path, const tg_bench_opts *o, const char *cpu,
                      const char *isa, int threads, int plan_cpus, const tg_peaks *pk,
                      const step_ceilings *ceil, const step_ceilings *fwd_ceil,
                      const attn_result *ar, int na,
                      const mem_result *mr, int nm) {
  tg_outset out;
  char err[NPY_ERR_LEN];
  tg_outset_init(&out);
  FILE *f = tg_outset_add(&out, "--json", path, err, sizeof err) < 0
                ? NULL
                : tg_outset_open(&out, 0, err, sizeof err);
  if (!f) {
    fprintf(stderr, "tilegrad bench: %s\n", err);
    return -1;
  }
  char ts[64] = "";
  time_t now = time(NULL);
  struct tm *g = gmtime(&now);
  if (g) strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", g);
  fprintf(f, "{\n  \"tool\": \"tilegrad bench\",\n  \"version\": \"%d.%d.%d\",\n",
          TG_VERSION_MAJOR, TG_VERSION_MINOR, TG_VERSION_PATCH);
  fprintf(f, "  \"timestamp_utc\": ");
  json_str(f, ts);
  fprintf(f, ",\n  \"cpu\": ");
  json_str(f, cpu);
  fprintf(f, ",\n  \"threads\": %d,\n  \"plan_cpus\": %d,\n  \"isa\": ", threads,
          plan_cpus);
  json_str(f, isa);
  fprintf(f, ",\n  \"deterministic\": %s,\n  \"precision\": \"%s\",\n  \"quick\": %s,\n"
             "  \"reps\": %d,\n",
          o->deterministic ? "true" : "false", tg_attn_precision_name(o->precision),
          o->quick ? "true" : "false", o->reps);
  fprintf(f, "  \"statistic\": \"median of reps after one untimed warm-up\",\n");
  fprintf(f, "  \"peaks\": {\n    \"fma_f32_gflops\": ");
  json_num(f, pk->fma_gflops);
  fprintf(f, ",\n    \"fma_variant\": ");
  json_str(f, pk->fma_variant ? pk->fma_variant : "");
  fprintf(f, ",\n    \"fma_avx512_gflops\": ");
  json_num(f, pk->fma_avx512_gflops);
  fprintf(f, ",\n    \"fma_avx2_gflops\": ");
  json_num(f, pk->fma_avx2_gflops);
  fprintf(f, ",\n    \"fma_neon_gflops\": ");
  json_num(f, pk->fma_neon_gflops);
  fprintf(f, ",\n    \"fma_portable_gflops\": ");
  json_num(f, pk->fma_portable_gflops);
  fprintf(f, ",\n    \"bf16_dot_gflops\": ");
  json_num(f, pk->bf16_gflops);
  fprintf(f, ",\n    \"amx_bf16_gflops\": ");
  json_num(f, pk->amx_gflops);
  fprintf(f, ",\n    \"triad_gbs\": ");
  json_num(f, pk->triad_gbs);
  fprintf(f, ",\n    \"triad_streams\": 3,\n    \"triad_array_mib\": %zu,\n",
          pk->triad_array_bytes >> 20);
  fprintf(f, "    \"attn_ceiling_gflops\": ");
  json_num(f, ceil->base);
  fprintf(f, ",\n    \"attn_parts_min_d\": %d,\n    \"attn_ceiling_parts_gflops\": ",
          ceil->parts_min_d);
  json_num(f, ceil->parts_min_d > 0 ? ceil->parts : 0.0);
  fprintf(f, ",\n    \"attn_fwd_ceiling_gflops\": ");
  json_num(f, fwd_ceil->base);
  fprintf(f, ",\n    \"attn_fwd_parts_min_d\": %d,\n    \"attn_fwd_ceiling_parts_gflops\": ",
          fwd_ceil->parts_min_d);
  json_num(f, fwd_ceil->parts_min_d > 0 ? fwd_ceil->parts : 0.0);
  fprintf(f, ",\n    \"attn_ceiling_def\": \"%s\"\n  },\n",
          o->precision == TG_ATTN_PRECISION_BF16    ? "unit (all products at the table's bf16 unit)"
          : o->precision == TG_ATTN_PRECISION_SPLIT ? "unit / 1.6 (split: 0.4 + 2 x 0.6 of F)"
                                                    : "1/(0.4/unit + 0.6/fma_f32)");

  fprintf(f, "  \"attention_bwd\": {\n");
  fprintf(f, "    \"timed\": \"tg_attn_train_bwd_step, bf16 gradients (D, bwd, dK/dV written)\",\n");
  fprintf(f, "    \"flops\": \"10*B*H*qL*kL*D, x0.5 when causal; with a window: "
             "10*B*H*D*visible_pairs\",\n    \"results\": [");
  for (int i = 0; i < na; i++) {
    const attn_result *r = &ar[i];
    fprintf(f, "%s\n      {\"B\": %d, \"H\": %d, \"Hkv\": %d, \"qL\": %d, \"kL\": %d, "
               "\"D\": %d, \"causal\": %s, \"window\": %d, \"visible_pairs\": %.0f, "
               "\"gflop\": ",
            i ? "," : "", r->s.B, r->s.H, r->s.Hkv, r->s.L, r->s.L, r->s.D,
            r->s.causal ? "true" : "false", r->s.window, visible_pairs(&r->s));
    json_num(f, r->gflop);
    if (!r->ok) {
      fprintf(f, ", \"ok\": false, \"error\": ");
      json_str(f, r->err);
      fprintf(f, "}");
      continue;
    }
    fprintf(f, ", \"ok\": true, \"ms_median\": ");
    json_num(f, r->ms_med);
    fprintf(f, ", \"ms_min\": ");
    json_num(f, r->ms_min);
    fprintf(f, ", \"ms_reps\": [");
    for (int k = 0; k < r->nreps; k++) {
      if (k) fprintf(f, ", ");
      json_num(f, r->ms[k]);
    }
    fprintf(f, "], \"gflops\": ");
    json_num(f, r->gflops);
    fprintf(f, ", \"pct_fma_peak\": ");
    json_num(f, r->pct_fma);
    fprintf(f, ", \"pct_ceiling\": ");
    json_num(f, r->pct_ceil);
    fprintf(f, ", \"outputs_finite\": %s", r->finite ? "true" : "false");
    fprintf(f, ", \"fwd\": {\"flops\": \"4*B*H*qL*kL*D, x0.5 when causal; with a window: "
               "4*B*H*D*visible_pairs\", \"gflop\": ");
    json_num(f, r->gflop_fwd);
    fprintf(f, ", \"ms_median\": ");
    json_num(f, r->ms_fwd_med);
    fprintf(f, ", \"ms_min\": ");
    json_num(f, r->ms_fwd_min);
    fprintf(f, ", \"gflops\": ");
    json_num(f, r->gflops_fwd);
    fprintf(f, ", \"pct_fma_peak\": ");
    json_num(f, r->pct_fma_fwd);
    fprintf(f, ", \"pct_ceiling\": ");
    json_num(f, r->pct_ceil_fwd);
    fprintf(f, "}}");
  }
  fprintf(f, "%s],\n", na ? "\n    " : "");
  fprintf(f, "    \"window_share_def\": \"L*W share = ms_window / (ms_causal * "
             "visible_pairs_window / visible_pairs_causal), the causal step of the same "
             "B,H,Hkv,L,D\",\n    \"window_share\": [");
  int nshare = 0;
  for (int i = 0; i < na; i++) {
    const attn_result *w = &ar[i], *c = causal_partner(ar, na, w);
    if (!w->ok || !w->s.window || !c) continue;
    fprintf(f, "%s\n      {\"B\": %d, \"H\": %d, \"Hkv\": %d, \"L\": %d, \"D\": %d, "
               "\"causal\": %s, \"window\": %d, \"pairs_ratio\": ",
            nshare++ ? "," : "", w->s.B, w->s.H, w->s.Hkv, w->s.L, w->s.D,
            w->s.causal ? "true" : "false", w->s.window);
    json_num(f, visible_pairs(&w->s) / visible_pairs(&c->s));
    fprintf(f, ", \"share_bwd_step\": ");
    json_num(f, lw_share(w->ms_med, &w->s, c->ms_med, &c->s));
    fprintf(f, ", \"share_fwd\": ");
    json_num(f, lw_share(w->ms_fwd_med, &w->s, c->ms_fwd_med, &c->s));
    fprintf(f, "}");
  }
  fprintf(f, "%s]\n  },\n", nshare ? "\n    " : "");

  fprintf(f, "  \"memory_bound\": {\n");
  fprintf(f, "    \"bytes\": \"minimum moved per call: inputs read once, outputs written "
             "once, accumulated outputs read+written\",\n    \"results\": [");
  for (int i = 0; i < nm; i++) {
    const mem_result *r = &mr[i];
    fprintf(f, "%s\n      {\"kernel\": ", i ? "," : "");
    json_str(f, r->name);
    fprintf(f, ", \"shape\": ");
    json_str(f, r->shape);
    if (!r->ok) {
      fprintf(f, ", \"ok\": false, \"error\": ");
      json_str(f, r->err);
      fprintf(f, "}");
      continue;
    }
    fprintf(f, ", \"ok\": true, \"bytes\": ");
    json_num(f, r->bytes);
    fprintf(f, ", \"ms_median\": ");
    json_num(f, r->ms_med);
    fprintf(f, ", \"ms_min\": ");
    json_num(f, r->ms_min);
    fprintf(f, ", \"gbs\": ");
    json_num(f, r->gbs);
    fprintf(f, ", \"pct_triad\": ");
    json_num(f, r->pct_triad);
    if (r->flops > 0) {
      fprintf(f, ", \"gflop\": ");
      json_num(f, r->flops * 1e-9);
      fprintf(f, ", \"gflops\": ");
      json_num(f, r->gflops);
      fprintf(f, ", \"pct_fma_peak\": ");
      json_num(f, r->pct_fma);
    }
    fprintf(f, "}");
  }
  fprintf(f, "%s]\n  }\n}\n", nm ? "\n    " : "");
  if (tg_outset_commit(&out, err, sizeof err) != 0) {
    fprintf(stderr, "tilegrad bench: %s\n", err);
    return -1;
  }
  return 0;
}

/* The L*W share of every windowed shape whose causal partner ran. */
static void print_window_shares(const attn_result *ar, int na) {
  int header = 0;
  for (int i = 0; i < na; i++) {
    const attn_result *w = &ar[i], *c = causal_partner(ar, na, w);
    if (!w->ok || !w->s.window || !c) continue;
    if (!header++) {
      printf("\nsliding window: L*W share = t_window / (t_causal * pairs_window / "
             "pairs_causal),\nagainst the full causal step of the same B,H,Hkv,L,D "
             "(1.0: the cost follows the visible pairs)\n");
      printf("%-3s %-30s %8s %10s %10s %8s %10s %10s %8s\n", "#", "B,H,Hkv,L,D,mask",
             "pairs", "step ms", "causal ms", "share", "fwd ms", "causal ms", "share");
    }
    char sh[64];
    fmt_shape(sh, sizeof sh, &w->s);
    printf("%-3d %-30s %7.2f%% %10.2f %10.2f %8.2f %10.2f %10.2f %8.2f\n", i + 1, sh,
           100.0 * visible_pairs(&w->s) / visible_pairs(&c->s), w->ms_med, c->ms_med,
           lw_share(w->ms_med, &w->s, c->ms_med, &c->s), w->ms_fwd_med, c->ms_fwd_med,
           lw_share(w->ms_fwd_med, &w->s, c->ms_fwd_med, &c->s));
  }
}

/* ------------------------------------------------------------------------ */
/* entry point                                                                */
/* ------------------------------------------------------------------------ */

int tg_bench_main(const tg_bench_opts *o) {
  tg_ctx *ctx = NULL;
  tg_status st = tg_ctx_create(&ctx);
  if (st != TG_OK) {
    fprintf(stderr, "tilegrad bench: tg_ctx_create: %s\n", tg_status_str(st));
    return 1;
  }
  int rc = 0;
  attn_result *ar = NULL;
  mem_result *mr = NULL;
  tg_bench_shape *shapes = NULL; /* the attention shapes of this run */
  int nshapes = 0;
  int na = 0, nm = 0;
  if (o->threads > 0 && (st = tg_ctx_set_threads(ctx, o->threads)) != TG_OK) {
    fprintf(stderr, "tilegrad bench: --threads %d: %s\n", o->threads, tg_ctx_last_error(ctx));
    rc = 2;
    goto out;
  }
  if (o->isa_set && (st = tg_ctx_set_isa(ctx, o->isa)) != TG_OK) {
    fprintf(stderr, "tilegrad bench: --isa %s: %s\n", tg_isa_name(o->isa),
            tg_ctx_last_error(ctx));
    rc = 2;
    goto out;
  }
  if ((st = tg_ctx_set_attn_precision(ctx, o->precision)) != TG_OK) {
    fprintf(stderr, "tilegrad bench: --precision: %s\n", tg_ctx_last_error(ctx));
    rc = 2;
    goto out;
  }
  if (o->deterministic && (st = tg_ctx_set_deterministic(ctx, 1)) != TG_OK) {
    fprintf(stderr, "tilegrad bench: --deterministic: %s\n", tg_ctx_last_error(ctx));
    rc = 2;
    goto out;
  }
  /* The helpers' own parallel loops (input fill, logsumexp) use the same
   * thread count as the kernels. */
  const int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
  omp_set_num_threads(threads);
  const char *isa = tg_isa_name(tg_ctx_get_isa(ctx));
  char cpu[256];
  cpu_model(cpu, sizeof cpu);

  /* The attention shapes: --shapes, else the attn section's list and then
   * the window section's, for the sections asked for. */
  {
    const tg_bench_shape *attn_list = o->quick ? k_quick_shapes : k_default_shapes;
    const int n_attn = o->quick ? (int)(sizeof k_quick_shapes / sizeof k_quick_shapes[0])
                                : (int)(sizeof k_default_shapes / sizeof k_default_shapes[0]);
    const tg_bench_shape *window_list = o->quick ? k_quick_window_shapes : k_window_shapes;
    const int n_window =
        o->quick ? (int)(sizeof k_quick_window_shapes / sizeof k_quick_window_shapes[0])
                 : (int)(sizeof k_window_shapes / sizeof k_window_shapes[0]);
    shapes = calloc((size_t)(o->shapes ? o->nshapes : n_attn + n_window), sizeof *shapes);
    if (!shapes) {
      fprintf(stderr, "tilegrad bench: out of memory\n");
      rc = 1;
      goto out;
    }
    if (o->shapes) {
      memcpy(shapes, o->shapes, (size_t)o->nshapes * sizeof *shapes);
      nshapes = o->nshapes;
    } else {
      if (o->sections & TG_BENCH_SECTION_ATTN)
        for (int i = 0; i < n_attn; i++) {
          shapes[nshapes] = attn_list[i];
          if (o->quick) shapes[nshapes].B *= (threads + 1) / 2; /* k_quick_shapes */
          nshapes++;
        }
      if (o->sections & TG_BENCH_SECTION_WINDOW)
        for (int i = 0; i < n_window; i++) shapes[nshapes++] = window_list[i];
    }
  }

  /* --- ceilings ---------------------------------------------------------- */
  fprintf(stderr, "measuring ceilings at %d thread%s ...\n", threads, threads == 1 ? "" : "s");
  tg_peaks pk;
  if (tg_peaks_measure(&pk, threads, o->triad_mib << 20) != 0)
    fprintf(stderr, "tilegrad bench: could not allocate 3 x %zu MiB for the triad; "
                    "bandwidth ceiling unavailable\n", o->triad_mib);
  /* The ceilings are those of the instructions the chosen table uses: the
   * avx2 table on an AVX-512 CPU is measured against the ymm FMA peak; the
   * avx512bf16 table's bf16 unit is vdpbf16ps and the amx table's the AMX
   * tiles (for Q.K^T and dO.V^T, 2 of the step's 5 products in exact mode,
   * all 5 in bf16 and split mode: tg_peaks_attn_ceiling). */
  if (tg_ctx_get_isa(ctx) == TG_ISA_AVX2 && pk.fma_avx2_gflops > 0)
    pk.fma_gflops = pk.fma_avx2_gflops, pk.fma_variant = "avx2+fma";
  if (tg_ctx_get_isa(ctx) == TG_ISA_PORTABLE && pk.fma_portable_gflops > 0)
    pk.fma_gflops = pk.fma_portable_gflops, pk.fma_variant = "portable";
  if ((tg_ctx_get_isa(ctx) == TG_ISA_NEON || tg_ctx_get_isa(ctx) == TG_ISA_NEON_BF16) &&
      pk.fma_neon_gflops > 0)
    pk.fma_gflops = pk.fma_neon_gflops, pk.fma_variant = "neon";
  const int amx_table = tg_ctx_get_isa(ctx) == TG_ISA_AMX;
  tg_peaks unit = pk; /* bf16_gflops: this table's bf16 unit (0: none) */
  const int bf16_dot_table =
      tg_ctx_get_isa(ctx) == TG_ISA_AVX512_BF16 || tg_ctx_get_isa(ctx) == TG_ISA_NEON_BF16;
  unit.bf16_gflops = amx_table ? pk.amx_gflops : bf16_dot_table ? pk.bf16_gflops : 0.0;
  step_ceilings ceil = {tg_peaks_attn_ceiling(&unit, o->precision, 0),
                        tg_peaks_attn_ceiling(&unit, o->precision, 1), 0};
  step_ceilings fwd_ceil = {tg_peaks_attn_fwd_ceiling(&unit, o->precision, 0),
                            tg_peaks_attn_fwd_ceiling(&unit, o->precision, 1), 0};
  if (o->precision == TG_ATTN_PRECISION_EXACT && unit.bf16_gflops > 0)
    for (int D = 8; D <= 512; D += 8) { /* the library's own rule */
      const tg_isa table = tg_ctx_get_isa(ctx);
      if (!ceil.parts_min_d && tg_testing_attn_bf16_parts(table, o->precision, D, 1) > 0)
        ceil.parts_min_d = D;
      if (!fwd_ceil.parts_min_d && tg_testing_attn_bf16_parts(table, o->precision, D, 0) > 0)
        fwd_ceil.parts_min_d = D;
    }

  printf("tilegrad bench %d.%d.%d\n", TG_VERSION_MAJOR, TG_VERSION_MINOR, TG_VERSION_PATCH);
  printf("cpu:      %s    (work plans sized for %d CPUs: tg_ctx_plan_cpus)\n", cpu,
         tg_ctx_plan_cpus(ctx));
  printf("threads:  %d    isa: %s    precision: %s    deterministic: %s    reps: %d (median; "
         "1 warm-up)\n",
         threads, isa, tg_attn_precision_name(o->precision), o->deterministic ? "on" : "off", o->reps);
  printf("ceilings at %d thread%s:\n", threads, threads == 1 ? "" : "s");
  if (pk.fma_avx512_gflops > 0 || pk.fma_avx2_gflops > 0)
    printf("  f32 FMA peak     %8.1f GFLOP/s  (%s; avx512f %.1f, avx2+fma %.1f, portable %.1f)\n",
           pk.fma_gflops, pk.fma_variant, pk.fma_avx512_gflops, pk.fma_avx2_gflops,
           pk.fma_portable_gflops);
  else if (pk.fma_neon_gflops > 0)
    printf("  f32 FMA peak     %8.1f GFLOP/s  (%s; neon %.1f, portable %.1f)\n", pk.fma_gflops,
           pk.fma_variant, pk.fma_neon_gflops, pk.fma_portable_gflops);
  else
    printf("  f32 FMA peak     %8.1f GFLOP/s  (%s)\n", pk.fma_gflops, pk.fma_variant);
  if (pk.bf16_gflops > 0)
    printf("  bf16 dot peak    %8.1f GFLOP/s  (%s)\n", pk.bf16_gflops, pk.bf16_instr);
  else
    printf("  bf16 dot peak         n/a         (no AVX512_BF16 or FEAT_BF16 on this CPU)\n");
  if (pk.amx_gflops > 0)
    printf("  AMX bf16 peak    %8.1f GFLOP/s  (tdpbf16ps, 16384 FLOP/instruction)\n",
           pk.amx_gflops);
  printf("  triad            %8.1f GB/s     (a = b + 2c, 3 x %zu MiB, 3 streams counted)\n",
         pk.triad_gbs, o->triad_mib);
  static const char *const ceil_how[] = {
      "0.4 F at the bf16 unit + 0.6 F at FMA", "0.4 F + 2 x 0.6 F at the bf16 unit",
      "all F at the bf16 unit"};
  printf("  %s-mode ceil %*s%8.1f GFLOP/s  (FA-2 step: %s, %s)\n",
         tg_attn_precision_name(o->precision), 5 - (int)strlen(tg_attn_precision_name(o->precision)),
         "", ceil.base, unit.bf16_gflops > 0 ? ceil_how[o->precision] : "all F at FMA",
         unit.bf16_gflops > 0 ? (amx_table ? "AMX" : pk.bf16_instr) : "no bf16 unit in this table");
  if (ceil.parts_min_d)
    printf("  from D %-3d ceil  %8.1f GFLOP/s  (exact mode's three bf16 parts: 0.4 F + 3 x 0.6 F "
           "at the bf16 unit)\n", ceil.parts_min_d, ceil.parts);
  static const char *const fwd_how[] = {"0.5 F at the bf16 unit + 0.5 F at FMA",
                                         "0.5 F + 2 x 0.5 F at the bf16 unit",
                                         "all F at the bf16 unit"};
  printf("  forward ceil     %8.1f GFLOP/s  (Q.K^T and P.V: %s)\n", fwd_ceil.base,
         unit.bf16_gflops > 0 ? fwd_how[o->precision] : "all F at FMA");
  if (fwd_ceil.parts_min_d)
    printf("  from D %-3d ceil  %8.1f GFLOP/s  (the forward, exact mode's P.V on two bf16 parts: "
           "%s)\n", fwd_ceil.parts_min_d, fwd_ceil.parts, fwd_how[TG_ATTN_PRECISION_SPLIT]);
  fflush(stdout);

  /* --- attention backward -------------------------------------------------- */
  if (o->sections & (TG_BENCH_SECTION_ATTN | TG_BENCH_SECTION_WINDOW)) {
    ar = calloc((size_t)nshapes, sizeof *ar);
    if (!ar) {
      fprintf(stderr, "tilegrad bench: out of memory\n");
      rc = 1;
      goto out;
    }
    printf("\nFlashAttention-2 backward step: tg_attn_train_bwd_step, bf16 gradients "
           "(D, bwd, dK/dV written); FLOP = 10*B*H*L^2*D (x0.5 causal),\n"
           "with a window W: 10*B*H*D*(visible pairs)\n");
    printf("%-3s %-30s %9s %10s %10s %9s %7s %7s\n", "#", "B,H,Hkv,L,D,mask", "GFLOP",
           "ms(med)", "ms(min)", "GFLOP/s", "%FMA", "%ceil");
    fflush(stdout);
    for (int i = 0; i < nshapes; i++) {
      attn_result *r = &ar[na++];
      r->s = shapes[i];
      char sh[64];
      fmt_shape(sh, sizeof sh, &r->s);
      fprintf(stderr, "running shape %d/%d: %s (%.2f GFLOP per step) ...\n", i + 1, nshapes,
              sh, attn_gflop(&r->s));
      fflush(stderr);
      run_attn_shape(ctx, o, r);
      if (!r->ok) {
        printf("%-3d %-30s %9.2f  FAILED: %s\n", i + 1, sh, r->gflop, r->err);
        rc = 1;
      } else {
        r->pct_fma = pk.fma_gflops > 0 ? 100.0 * r->gflops / pk.fma_gflops : 0.0;
        r->pct_fma_fwd = pk.fma_gflops > 0 ? 100.0 * r->gflops_fwd / pk.fma_gflops : 0.0;
        const double cf = ceiling_at(&fwd_ceil, r->s.D);
        r->pct_ceil_fwd = cf > 0 ? 100.0 * r->gflops_fwd / cf : 0.0;
        const double c = ceiling_at(&ceil, r->s.D);
        r->pct_ceil = c > 0 ? 100.0 * r->gflops / c : 0.0;
        printf("%-3d %-30s %9.2f %10.2f %10.2f %9.1f %7.1f %7.1f%s\n", i + 1, sh, r->gflop,
               r->ms_med, r->ms_min, r->gflops, r->pct_fma, r->pct_ceil,
               r->finite ? "" : "  [non-finite output]");
      }
      fflush(stdout);
    }
    printf("\nFlashAttention-2 training forward (O bf16 and L), same shapes and inputs, "
           "timed alone;\nFLOP = 4*B*H*L^2*D (x0.5 causal), with a window W: "
           "4*B*H*D*(visible pairs)\n");
    printf("%-3s %-30s %9s %10s %10s %9s %7s %7s\n", "#", "B,H,Hkv,L,D,mask", "GFLOP", "ms(med)",
           "ms(min)", "GFLOP/s", "%FMA", "%ceil");
    for (int i = 0; i < na; i++) {
      const attn_result *r = &ar[i];
      char sh[64];
      fmt_shape(sh, sizeof sh, &r->s);
      if (r->ok)
        printf("%-3d %-30s %9.2f %10.2f %10.2f %9.1f %7.1f %7.1f\n", i + 1, sh, r->gflop_fwd,
               r->ms_fwd_med, r->ms_fwd_min, r->gflops_fwd, r->pct_fma_fwd, r->pct_ceil_fwd);
      else
        printf("%-3d %-30s %9.2f  FAILED (see above)\n", i + 1, sh, r->gflop_fwd);
    }
    print_window_shares(ar, na);
    fflush(stdout);
  }

  /* --- memory-bound kernels -------------------------------------------------- */
  if (o->sections & TG_BENCH_SECTION_MEM) {
    mr = calloc((size_t)N_MEM_KERNELS, sizeof *mr);
    if (!mr) {
      fprintf(stderr, "tilegrad bench: out of memory\n");
      rc = 1;
      goto out;
    }
    printf("\nmemory-bound kernels: minimum bytes moved (inputs read once, outputs written "
           "once,\naccumulated outputs read+written); %%triad of %.1f GB/s\n", pk.triad_gbs);
    printf("%-3s %-36s %-30s %9s %9s %8s %7s %9s %6s\n", "#", "kernel", "shape", "MB",
           "ms(med)", "GB/s", "%triad", "GFLOP/s", "%FMA");
    fflush(stdout);
    for (int i = 0; i < N_MEM_KERNELS; i++) {
      mem_result *r = &mr[nm++];
      fprintf(stderr, "running kernel %d/%d: %s ...\n", i + 1, N_MEM_KERNELS,
              k_mem_kernels[i].name);
      fflush(stderr);
      run_mem_kernel(ctx, o, &k_mem_kernels[i], r);
      if (!r->ok) {
        printf("%-3d %-36s %-30s  FAILED: %s\n", i + 1, r->name, r->shape, r->err);
        rc = 1;
      } else {
        r->pct_triad = pk.triad_gbs > 0 ? 100.0 * r->gbs / pk.triad_gbs : 0.0;
        r->pct_fma = pk.fma_gflops > 0 ? 100.0 * r->gflops / pk.fma_gflops : 0.0;
        printf("%-3d %-36s %-30s %9.1f %9.3f %8.1f %7.1f", i + 1, r->name, r->shape,
               r->bytes * 1e-6, r->ms_med, r->gbs, r->pct_triad);
        if (r->flops > 0)
          printf(" %9.1f %6.1f\n", r->gflops, r->pct_fma);
        else
          printf(" %9s %6s\n", "-", "-");
      }
      fflush(stdout);
    }
  }

  if (o->json) {
    if (write_json(o->json, o, cpu, isa, threads, tg_ctx_plan_cpus(ctx), &pk, &ceil, &fwd_ceil,
                   ar, na, mr, nm) != 0) {
      fprintf(stderr, "tilegrad bench: cannot write %s\n", o->json);
      rc = 1;
    } else {
      fprintf(stderr, "wrote %s\n", o->json);
    }
  }

out:
  if (ar)
    for (int i = 0; i < na; i++) free(ar[i].ms);
  free(ar);
  free(mr);
  free(shapes);
  tg_ctx_destroy(ctx);
  return rc;
}
