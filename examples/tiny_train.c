/*
 * Training driver for the tiny model (see tiny_train.h).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, execv, clock_gettime */

#include "tiny_train.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --- corpus ------------------------------------------------------------------ */
static const char alphabet[TT_VOCAB + 1] = "\n ,.abcdefghijklmnopqrstuvwxyz";

uint32_t tt_encode(char ch) {
  if (ch >= 'a' && ch <= 'z') return 4 + (uint32_t)(ch - 'a');
  switch (ch) {
    case '\n':
      return 0;
    case ',':
      return 2;
    case '.':
      return 3;
    default:
      return 1;
  }
}

char tt_decode(uint32_t id) { return id < TT_VOCAB ? alphabet[id] : '?'; }

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static int rng_below(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }
#define PICK(s, list) list[rng_below(s, (int)(sizeof list / sizeof list[0]))]

static const char *const nouns[] = {
    "cat",    "dog",     "bird",   "fox",     "king",   "queen",  "farmer", "sailor",
    "child",  "teacher", "miller", "baker",   "horse",  "goat",   "wolf",   "rabbit",
    "fisher", "weaver",  "tailor", "soldier", "doctor", "hunter", "singer", "poet"};
static const char *const adjectives[] = {"old",   "young", "little", "brave", "quiet",
                                         "proud", "tired", "clever", "kind",  "grey"};
static const char *const determiners[] = {"the", "the", "the", "a", "my", "our", "that"};
static const char *const verbs[] = {"sees",    "likes",   "follows", "finds",  "feeds",
                                    "helps",   "watches", "calls",   "greets", "carries",
                                    "teaches", "meets",   "thanks",  "warns",  "chases"};
static const char *const places[] = {
    "in the garden",  "by the river",       "at night",      "after dinner",
    "on the hill",    "near the mill",      "every morning", "in the rain",
    "at the market",  "under the old tree", "before dawn",   "across the field",
    "in the kitchen", "on the bridge"};
static const char *const links[] = {"and then", "so", "but later", "and soon"};

typedef struct {
  char *buf;
  int64_t n, at;
} sink;

static void put(sink *k, const char *s) {
  while (*s && k->at < k->n) k->buf[k->at++] = *s++;
}

/* "the old fox" into out (determiner, optional adjective, noun) */
static void noun_phrase(uint64_t *s, char *out, size_t len) {
  const char *det = PICK(s, determiners), *noun = PICK(s, nouns);
  if (rng_below(s, 3) == 0)
    snprintf(out, len, "%s %s %s", det, PICK(s, adjectives), noun);
  else
    snprintf(out, len, "%s %s", det, noun);
}

void tt_corpus(char *buf, int64_t n, uint64_t seed) {
  uint64_t s = seed ^ 0x5DEECE66Dull;
  sink k = {buf, n, 0};
  int in_line = 0;
  while (k.at < n) {
    char subj[64], obj[64];
    noun_phrase(&s, subj, sizeof subj);
    do noun_phrase(&s, obj, sizeof obj);
    while (!strcmp(subj, obj));
    put(&k, subj);
    put(&k, " ");
    put(&k, PICK(&s, verbs));
    put(&k, " ");
    put(&k, obj);
    if (rng_below(&s, 2) == 0) {
      put(&k, " ");
      put(&k, PICK(&s, places));
    }
    if (rng_below(&s, 3) == 0) { /* the same two, roles swapped: needs attention */
      put(&k, ", ");
      put(&k, PICK(&s, links));
      put(&k, " ");
      put(&k, obj);
      put(&k, " ");
      put(&k, PICK(&s, verbs));
      put(&k, " ");
      put(&k, subj);
    }
    put(&k, ".");
    put(&k, ++in_line == 4 ? "\n" : " ");
    if (in_line == 4) in_line = 0;
  }
}

/* --- options ----------------------------------------------------------------- */
void tt_default_options(tt_options *o) {
  memset(o, 0, sizeof *o);
  o->cfg = tm_default_config();
  o->cfg.vocab = TT_VOCAB;
  o->adam = tm_default_adam();
  o->steps = 500;
  o->warmup = 0.05f;
  o->seed = 1;
  o->threads = 0;
  o->log_every = 25;
  o->eval_every = 100;
  o->sample = 160;
}

void tt_usage(FILE *out, const char *prog) {
  tt_options d;
  tt_default_options(&d);
  fprintf(out,
          "usage: %s [options]\n"
          "\n"
          "Trains a tiny decoder block (token + learned position embedding, RMSNorm,\n"
          "causal GQA attention, residual, RMSNorm, output projection, cross-entropy)\n"
          "with AdamW on a built-in character corpus, on the CPU: tilegrad's kernels\n"
          "for attention and RMSNorm (forward and backward), the bf16 casts,\n"
          "cross-entropy and the embedding backward; OpenBLAS sgemm for the\n"
          "projections. Prints the loss as it falls; exits 1 if it did not.\n"
          "\n"
          "options (default in brackets):\n"
          "  --steps N          optimizer steps [%d]\n"
          "  --lr X             peak learning rate [%g]; %g of the steps warm up,\n"
          "                     then cosine decay to lr/10\n"
          "  --seed N           init and batch sampling [%llu] (the corpus is fixed)\n"
          "  --threads N        threads for tilegrad's kernels and the sgemm slices\n"
          "                     [OpenMP default: OMP_NUM_THREADS or all cores]\n"
          "  --batch N          sequences per step [%d]\n"
          "  --seq N            tokens per sequence [%d]\n"
          "  --dim N            model width [%d]\n"
          "  --heads N          query heads [%d]\n"
          "  --kv-heads N       key/value heads, divides --heads (GQA) [%d]\n"
          "  --head-dim N       per head, a multiple of 8 [%d]\n"
          "  --tied             output projection = embedding^T [separate]\n"
          "  --weight-decay X   AdamW, not on the norm weights [%g]\n"
          "  --clip X           global gradient-norm clip, 0 = off [%g]\n"
          "  --deterministic    bitwise-reproducible tilegrad kernels\n"
          "  --log-every N      print every N steps [%d]\n"
          "  --eval-every N     held-out loss every N steps, 0 = start/end [%d]\n"
          "  --sample N         characters to generate at the end, 0 = none [%d]\n"
          "  --help             this text\n",
          prog, d.steps, (double)d.adam.lr, (double)d.warmup, (unsigned long long)d.seed,
          d.cfg.batch, d.cfg.seq_len, d.cfg.dim, d.cfg.n_heads, d.cfg.n_kv_heads,
          d.cfg.head_dim, (double)d.adam.weight_decay, (double)d.adam.clip, d.log_every,
          d.eval_every, d.sample);
}

static int parse_int(const char *prog, const char *opt, const char *v, long lo, long hi,
                     int *out) {
  char *end;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "%s: %s '%s': want an integer in [%ld, %ld]\n", prog, opt,
            v ? v : "(missing)", lo, hi);
    return 0;
  }
  *out = (int)x;
  return 1;
}

static int parse_float(const char *prog, const char *opt, const char *v, double lo,
                       double hi, float *out) {
  char *end;
  double x = v ? strtod(v, &end) : 0;
  if (!v || *end || end == v || !(x >= lo && x <= hi)) {
    fprintf(stderr, "%s: %s '%s': want a number in [%g, %g]\n", prog, opt,
            v ? v : "(missing)", lo, hi);
    return 0;
  }
  *out = (float)x;
  return 1;
}

int tt_parse(tt_options *o, int argc, char **argv, const char *prog) {
  tt_default_options(o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = 1, takes = 1;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      tt_usage(stdout, prog);
      return 1;
    } else if (!strcmp(a, "--tied")) {
      o->cfg.tied = 1, takes = 0;
    } else if (!strcmp(a, "--deterministic")) {
      o->deterministic = 1, takes = 0;
    } else if (!strcmp(a, "--steps")) {
      ok = parse_int(prog, a, v, 1, 1000000, &o->steps);
    } else if (!strcmp(a, "--lr")) {
      ok = parse_float(prog, a, v, 0, 10, &o->adam.lr);
    } else if (!strcmp(a, "--seed")) {
      char *end;
      unsigned long long x = v ? strtoull(v, &end, 10) : 0;
      ok = v && !*end && end != v;
      if (!ok) fprintf(stderr, "%s: --seed '%s': want an integer\n", prog, v ? v : "");
      o->seed = x;
    } else if (!strcmp(a, "--threads")) {
      ok = parse_int(prog, a, v, 1, 1024, &o->threads);
    } else if (!strcmp(a, "--batch")) {
      ok = parse_int(prog, a, v, 1, 4096, &o->cfg.batch);
    } else if (!strcmp(a, "--seq")) {
      ok = parse_int(prog, a, v, 2, 65536, &o->cfg.seq_len);
    } else if (!strcmp(a, "--dim")) {
      ok = parse_int(prog, a, v, 1, 65536, &o->cfg.dim);
    } else if (!strcmp(a, "--heads")) {
      ok = parse_int(prog, a, v, 1, 1024, &o->cfg.n_heads);
    } else if (!strcmp(a, "--kv-heads")) {
      ok = parse_int(prog, a, v, 1, 1024, &o->cfg.n_kv_heads);
    } else if (!strcmp(a, "--head-dim")) {
      ok = parse_int(prog, a, v, 8, 512, &o->cfg.head_dim);
    } else if (!strcmp(a, "--weight-decay")) {
      ok = parse_float(prog, a, v, 0, 10, &o->adam.weight_decay);
    } else if (!strcmp(a, "--clip")) {
      ok = parse_float(prog, a, v, 0, 1e30, &o->adam.clip);
    } else if (!strcmp(a, "--log-every")) {
      ok = parse_int(prog, a, v, 1, 1000000, &o->log_every);
    } else if (!strcmp(a, "--eval-every")) {
      ok = parse_int(prog, a, v, 0, 1000000, &o->eval_every);
    } else if (!strcmp(a, "--sample")) {
      ok = parse_int(prog, a, v, 0, 100000, &o->sample);
    } else {
      fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, a);
      return 2;
    }
    if (!ok) return 2;
    i += takes;
  }
  return 0;
}

/* --- the loop ------------------------------------------------------------------- */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float lr_at(const tt_options *o, int step) { /* step from 1 */
  const int warm = (int)(o->warmup * o->steps);
  if (step <= warm) return o->adam.lr * (float)step / (float)warm;
  const double x =
      (double)(step - warm) / (double)(o->steps - warm > 0 ? o->steps - warm : 1);
  return (float)(o->adam.lr * (0.1 + 0.9 * 0.5 * (1 + cos(3.141592653589793 * x))));
}

/* B random windows of T + 1 characters: ids and next-character targets */
static void sample_batch(const char *text, int64_t n, int B, int T, uint64_t *s,
                         uint32_t *ids, uint32_t *tgt) {
  for (int b = 0; b < B; b++) {
    const int64_t at = (int64_t)(rng_next(s) % (uint64_t)(n - T - 1));
    for (int t = 0; t < T; t++) {
      ids[b * T + t] = tt_encode(text[at + t]);
      tgt[b * T + t] = tt_encode(text[at + t + 1]);
    }
  }
}

/* mean loss over the held-out batches */
static tg_status eval_loss(tm_model *m, const uint32_t *ids, const uint32_t *tgt, int nb,
                           double *out) {
  const tm_config *c = tm_get_config(m);
  const int64_t per = (int64_t)c->batch * c->seq_len;
  double sum = 0;
  for (int i = 0; i < nb; i++) {
    float l;
    tg_status st = tm_forward(m, ids + i * per, tgt + i * per, &l);
    if (st != TG_OK) return st;
    sum += l;
  }
  *out = sum / nb;
  return TG_OK;
}

/* Samples n characters (temperature 0.8) after prompt from a batch-1 copy of
 * the model, the context being the last T characters. */
static tg_status generate(tm_model *trained, tg_ctx *ctx, const char *prompt, int n,
                          uint64_t *s) {
  tm_config c = *tm_get_config(trained);
  c.batch = 1;
  const int T = c.seq_len, V = c.vocab;
  tm_model *m = NULL;
  tg_status st = tm_create(&m, &c, ctx, 0, NULL, 0);
  uint32_t *ids = malloc(sizeof(uint32_t) * T), *tgt = malloc(sizeof(uint32_t) * T);
  char *hist = malloc((size_t)T);
  if (st == TG_OK && !(ids && tgt && hist)) st = TG_ERR_NO_MEMORY;
  if (st != TG_OK) goto out;
  memcpy(tm_params(m), tm_params(trained), sizeof(float) * tm_n_params(m));
  int len = 0;
  for (const char *p = prompt; *p && len < T; p++) hist[len++] = *p;
  fputs(prompt, stdout);
  for (int i = 0; i < n; i++) {
    for (int t = 0; t < T; t++) { /* positions after len - 1 cannot influence it */
      ids[t] = t < len ? tt_encode(hist[t]) : 1;
      tgt[t] = TM_PAD_ID;
    }
    float l;
    if ((st = tm_forward(m, ids, tgt, &l)) != TG_OK) goto out;
    const float *lg = tm_logits(m) + (int64_t)(len - 1) * V;
    double mx = -INFINITY, sum = 0, w[TT_VOCAB];
    for (int v = 0; v < V; v++) mx = fmax(mx, lg[v]);
    for (int v = 0; v < V; v++) sum += (w[v] = exp((lg[v] - mx) / 0.8));
    double u = (rng_next(s) >> 11) * 0x1.0p-53 * sum;
    int pick = V - 1;
    for (int v = 0; v < V; v++)
      if ((u -= w[v]) < 0) {
        pick = v;
        break;
      }
    const char ch = tt_decode((uint32_t)pick);
    putchar(ch);
    if (len == T) {
      memmove(hist, hist + 1, (size_t)T - 1);
      len--;
    }
    hist[len++] = ch;
  }
  putchar('\n');
out:
  tm_destroy(m);
  free(ids), free(tgt), free(hist);
  return st;
}

int tt_run(const tt_options *o) {
  enum { EVAL_BATCHES = 4 };
  const int64_t train_chars = 1 << 20, eval_chars = 1 << 16;
  tg_ctx *ctx = NULL;
  tm_model *m = NULL;
  char *train = malloc(train_chars), *heldout = malloc(eval_chars);
  const tm_config *c = &o->cfg;
  const int64_t N = (int64_t)c->batch * c->seq_len;
  uint32_t *ids = malloc(sizeof(uint32_t) * N), *tgt = malloc(sizeof(uint32_t) * N);
  uint32_t *eids = malloc(sizeof(uint32_t) * N * EVAL_BATCHES);
  uint32_t *etgt = malloc(sizeof(uint32_t) * N * EVAL_BATCHES);
  int rc = 1;
  tg_status st = TG_OK;
  if (!train || !heldout || !ids || !tgt || !eids || !etgt) {
    fprintf(stderr, "tilegrad train: out of memory\n");
    goto done;
  }
  if (c->vocab != TT_VOCAB) {
    fprintf(stderr, "tilegrad train: vocab must be %d (the corpus alphabet)\n", TT_VOCAB);
    goto done;
  }
  if ((st = tg_ctx_create(&ctx)) != TG_OK) goto fail;
  if (o->threads > 0 && (st = tg_ctx_set_threads(ctx, o->threads)) != TG_OK) goto fail;
  if ((st = tg_ctx_set_deterministic(ctx, o->deterministic)) != TG_OK) goto fail;
  const int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
  char err[256] = "";
  if ((st = tm_create(&m, c, ctx, o->seed, err, sizeof err)) != TG_OK) {
    fprintf(stderr, "tilegrad train: %s\n", err);
    goto done;
  }
  tm_set_threads(m, threads);
  if (c->seq_len + 1 >= eval_chars) {
    fprintf(stderr, "tilegrad train: --seq must be < %lld\n", (long long)eval_chars - 1);
    goto done;
  }
  tt_corpus(train, train_chars, 2024);
  tt_corpus(heldout, eval_chars, 7); /* another stream of the same grammar */
  uint64_t rs = o->seed * 0x9E3779B97F4A7C15ull + 99, es = 4242;
  for (int i = 0; i < EVAL_BATCHES; i++)
    sample_batch(heldout, eval_chars, c->batch, c->seq_len, &es, eids + i * N,
                 etgt + i * N);

  printf(
      "tiny model: vocab %d, dim %d, heads %d (kv %d) x %d, seq %d, batch %d, %s output, "
      "%lld parameters\n",
      c->vocab, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->seq_len, c->batch,
      c->tied ? "tied" : "separate", (long long)tm_n_params(m));
  printf("steps %d, AdamW lr %g (warm-up %d steps, cosine to lr/10), clip %g, seed %llu\n",
         o->steps, (double)o->adam.lr, (int)(o->warmup * o->steps), (double)o->adam.clip,
         (unsigned long long)o->seed);
  const char *wait = getenv("OMP_WAIT_POLICY"), *core = getenv("OPENBLAS_CORETYPE");
  printf("threads: %d (isa %s%s, OMP_WAIT_POLICY=%s)\n", threads,
         tg_isa_name(tg_ctx_get_isa(ctx)), o->deterministic ? ", deterministic" : "",
         wait ? wait : "(default)");
  printf("BLAS: %s%s%s; single-threaded sgemm on row slices, one per thread\n",
         tm_blas_name(), core ? ", OPENBLAS_CORETYPE=" : "", core ? core : "");
  printf("corpus: %lld generated characters, held-out %d x %lld tokens; ln(vocab) = %.3f\n",
         (long long)train_chars, EVAL_BATCHES, (long long)N, log((double)c->vocab));
  fflush(stdout);

  double ev0;
  if ((st = eval_loss(m, eids, etgt, EVAL_BATCHES, &ev0)) != TG_OK) goto fail;
  printf("%6s %8s %8s %10s %9s %10s\n", "step", "loss", "avg", "lr", "|grad|", "tok/s");
  double t_start = now(), t_log = t_start, first = NAN, last = NAN, avg_sum = 0;
  double ev_last = ev0, phase[TM_NPHASES] = {0}, before[TM_NPHASES], adam_s = 0, eval_s = 0;
  int avg_n = 0;
  for (int step = 1; step <= o->steps; step++) {
    sample_batch(train, train_chars, c->batch, c->seq_len, &rs, ids, tgt);
    float loss;
    memcpy(before, tm_phase_seconds(m), sizeof before);
    if ((st = tm_forward_backward(m, ids, tgt, &loss)) != TG_OK) goto fail;
    for (int k = 0; k < TM_NPHASES; k++) phase[k] += tm_phase_seconds(m)[k] - before[k];
    const float lr = lr_at(o, step);
    const double ta = now();
    const double gnorm = tm_adam_step(m, &o->adam, lr, step);
    adam_s += now() - ta;
    if (step == 1) first = loss;
    last = loss;
    avg_sum += loss, avg_n++;
    if (step % o->log_every == 0 || step == 1 || step == o->steps) {
      const double t = now();
      const int span = step == 1 ? 1 : avg_n;
      printf("%6d %8.4f %8.4f %10.3g %9.3g %10.0f\n", step, (double)loss, avg_sum / avg_n,
             (double)lr, gnorm, (double)span * N / (t - t_log));
      fflush(stdout);
      t_log = t, avg_sum = 0, avg_n = 0;
    }
    if (o->eval_every > 0 && step % o->eval_every == 0 && step != o->steps) {
      const double te = now();
      if ((st = eval_loss(m, eids, etgt, EVAL_BATCHES, &ev_last)) != TG_OK) goto fail;
      printf("       held-out loss %.4f\n", ev_last);
      eval_s += now() - te;
      t_log += now() - te; /* keep evaluation out of tok/s */
    }
  }
  const double train_s = now() - t_start - eval_s; /* evaluation excluded */
  if ((st = eval_loss(m, eids, etgt, EVAL_BATCHES, &ev_last)) != TG_OK) goto fail;
  printf("first loss %.4f, last loss %.4f (ln(vocab) = %.3f)\n", first, last,
         log((double)c->vocab));
  printf("held-out loss %.4f -> %.4f\n", ev0, ev_last);
  printf("%d steps, %lld tokens in %.2f s: %.0f tokens/s\n", o->steps,
         (long long)N * o->steps, train_s, (double)N * o->steps / train_s);
  printf("time per step: %.2f ms =", 1e3 * train_s / o->steps);
  double accounted = adam_s;
  for (int k = 0; k < TM_NPHASES; k++) {
    accounted += phase[k];
    printf(" %s %.2f +", tm_phase_name((tm_phase)k), 1e3 * phase[k] / o->steps);
  }
  printf(" AdamW %.2f + other %.2f\n", 1e3 * adam_s / o->steps,
         1e3 * (train_s - accounted) / o->steps);
  if (o->sample > 0) {
    printf("sample:\n");
    uint64_t gs = o->seed + 17;
    if ((st = generate(m, ctx, "the ", o->sample, &gs)) != TG_OK) goto fail;
  }
  rc = (o->steps < 2 || (isfinite(last) && last < first)) ? 0 : 1;
  if (rc) fprintf(stderr, "tilegrad train: the loss did not fall\n");
  goto done;
fail:
  fprintf(stderr, "tilegrad train: %s: %s\n", tg_status_str(st),
          ctx ? tg_ctx_last_error(ctx) : "");
  rc = 1;
done:
  tm_destroy(m);
  tg_ctx_destroy(ctx);
  free(train), free(heldout), free(ids), free(tgt), free(eids), free(etgt);
  return rc;
}

/* Two settings that are read once, when the OpenMP runtime and OpenBLAS
 * load, decide much of this program's speed on small or shared machines:
 *  - OpenMP threads that spin between kernels (libgomp's default) lose badly
 *    when cores are scarce: a step is ~40 short parallel regions and sgemm
 *    slices, and a spinning thread holds a core its partner needs. Measured
 *    on 2 loaded cores: 12-18 ms per step instead of 64-146 ms.
 *  - OpenBLAS may have fallen back to its SSE3 kernels on a CPU it does not
 *    know (tm_blas_coretype_hint): sgemm 3-4x slower.
 * When the user has set neither OMP_WAIT_POLICY (nor GOMP_SPINCOUNT) nor
 * OPENBLAS_CORETYPE and either would help, the program runs itself again
 * with OMP_WAIT_POLICY=passive and/or OPENBLAS_CORETYPE set; the run prints
 * both. If exec fails it goes on as it is. */
static void tune_runtime_and_reexec(int argc, char **argv, const char *exec_prefix) {
  int again = 0, wait_set = 0;
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
    again |= wait_set = setenv("OMP_WAIT_POLICY", "passive", 1) == 0;
  const char *core = tm_blas_coretype_hint();
  if (core) again |= setenv("OPENBLAS_CORETYPE", core, 1) == 0;
  if (!again) return;
  char **args = calloc((size_t)argc + 2, sizeof(char *));
  if (!args) return;
  int n = 0;
  if (exec_prefix) args[n++] = (char *)exec_prefix;
  for (int i = 0; i < argc; i++) args[n++] = argv[i];
  args[n] = NULL;
  fflush(NULL);
  execv("/proc/self/exe", args); /* returns only on failure: undo, go on */
  free(args);
  if (wait_set) unsetenv("OMP_WAIT_POLICY");
  if (core) unsetenv("OPENBLAS_CORETYPE");
}

int tt_main(int argc, char **argv, const char *prog, const char *exec_prefix) {
  tt_options o;
  const int r = tt_parse(&o, argc, argv, prog);
  if (r == 1) return 0;
  if (r == 2) return 2;
  tune_runtime_and_reexec(argc, argv, exec_prefix);
  return tt_run(&o);
}
