/* The context, status messages, ISA selection and checked arithmetic. */
#define _DEFAULT_SOURCE /* syscall() (tg_cpu_amx's permission request) under -std=c11 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include "engine.h"

const char *tg_version(void) { return TG_VERSION; }

const char *tg_status_str(tg_status s) {
  switch (s) {
    case TG_OK: return "success";
    case TG_ERR_NULL_ARG: return "a required pointer argument is NULL";
    case TG_ERR_BAD_SHAPE: return "a size is zero or sizes disagree";
    case TG_ERR_UNSUPPORTED: return "valid input that this build does not support";
    case TG_ERR_BAD_INDEX: return "an index or id is out of range";
    case TG_ERR_BAD_PARAMS: return "parameter fields are inconsistent";
    case TG_ERR_OVERFLOW: return "a size overflows 64-bit arithmetic";
    case TG_ERR_NO_MEMORY: return "out of memory";
    case TG_ERR_BUSY: return "the context is in use by a call on another thread";
    case TG_ERR_ALIAS:
      return "an output shares memory with an input or another output that it may not";
  }
  return "unknown status code";
}

tg_status tg_fail(tg_ctx *ctx, tg_status s, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof ctx->err) /* cut: say so */
      memcpy(ctx->err + sizeof ctx->err - 4, "...", 4);
  }
  return s;
}

void tg_begin(tg_ctx *ctx) { ctx->err[0] = '\0'; }

tg_call tg_enter(tg_ctx *ctx) {
  if (atomic_exchange_explicit(&ctx->busy, 1, memory_order_acquire)) return (tg_call){NULL};
  tg_begin(ctx);
  return (tg_call){ctx};
}

void tg_leave(tg_call *call) {
  if (call->ctx) atomic_store_explicit(&call->ctx->busy, 0, memory_order_release);
}

const char *tg_ctx_last_error(const tg_ctx *ctx) {
  return ctx ? ctx->err : "tg_ctx_last_error: ctx is NULL";
}

/* --- ISA: the registry of engine/isa.h --------------------------------------
 * CPUID predicates (libgcc's __builtin_cpu_supports also checks that the OS
 * saves the wider registers); on aarch64 the OS's feature reports. Each
 * architecture compiles only the predicates of its own tables. */
static int tg_cpu_any(void) { return 1; }
#if defined(__x86_64__)
static int tg_cpu_avx2_fma(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}
static int tg_cpu_avx512(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return tg_cpu_avx2_fma() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return 0;
#endif
}

static int tg_cpu_avx512_bf16(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return tg_cpu_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return 0;
#endif
}
/* vdpbf16ps at about twice the f32 FMA rate: AMD (Zen 4: 2x, Zen 5 measured
 * 1.86x, `tilegrad bench --section peaks`); Intel Xeons run it at half the
 * FMA rate (Sapphire Rapids measured 0.49-0.52x), so auto leaves it there. */
static int tg_cpu_bf16_dot_fast(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return 0;
#endif
}

/* AMX-BF16 tiles: CPUID.(7,0):EDX bit 22 (AMX-BF16) and bit 24 (AMX-TILE),
 * avx512bf16 (the amx table is avx512bf16's with tiles for two products),
 * XCR0 bits 17 and 18 (the OS saves XTILECFG and XTILEDATA), and on Linux
 * the permission to use XTILEDATA: since 5.16 a process must ask for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM) before its first tile instruction, or
 * that instruction is a SIGILL. The permission is process-wide and the
 * request idempotent; it is made once, by the first check, and its outcome
 * kept (amx_state). Refused (kernel before 5.16, seccomp, a thread's
 * sigaltstack too small for the larger signal frame) or not Linux: no amx,
 * and amx_why() says why. */
enum {
  AMX_UNKNOWN = 0,
  AMX_OK,
  AMX_NO_COMPILER, /* not x86-64 with GNU C */
  AMX_NO_CPUID,
  AMX_NO_BF16,
  AMX_NO_XCR0,
  AMX_NOT_LINUX,
  AMX_REFUSED,
};
static atomic_int amx_state; /* AMX_*; a race only repeats the same idempotent checks */

static int amx_check(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
    return AMX_NO_CPUID;
  if (!tg_cpu_avx512_bf16()) return AMX_NO_BF16;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE: xgetbv runs */
    return AMX_NO_XCR0;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return AMX_NO_XCR0;
#if defined(__linux__)
  enum { GET_XCOMP_PERM = 0x1022, REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18 };
  unsigned long long perm = 0;
  if (syscall(SYS_arch_prctl, REQ_XCOMP_PERM, XTILEDATA) != 0 ||
      syscall(SYS_arch_prctl, GET_XCOMP_PERM, &perm) != 0 || !(perm & (1ull << XTILEDATA)))
    return AMX_REFUSED;
  return AMX_OK;
#else
  return AMX_NOT_LINUX;
#endif
#else
  return AMX_NO_COMPILER;
#endif
}

static int amx_status(void) {
  int s = atomic_load_explicit(&amx_state, memory_order_acquire);
  if (s == AMX_UNKNOWN) {
    s = amx_check();
    atomic_store_explicit(&amx_state, s, memory_order_release);
  }
  return s;
}

static int tg_cpu_amx(void) { return amx_status() == AMX_OK; }

/* Why this CPU/OS cannot run amx ("" when it can). */
static const char *amx_why(void) {
  switch (amx_status()) {
    case AMX_NO_COMPILER: return "not an x86-64 build with GNU C";
    case AMX_NO_CPUID: return "CPUID reports no AMX-TILE / AMX-BF16";
    case AMX_NO_BF16: return "the CPU has AMX but no AVX512_BF16";
    case AMX_NO_XCR0: return "the OS has not enabled the tile state (XCR0 bits 17, 18)";
    case AMX_NOT_LINUX: return "the tile-data permission is only requested on Linux";
    case AMX_REFUSED:
      return "Linux refused the tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM: "
             "a kernel before 5.16, seccomp, or a sigaltstack too small)";
  }
  return "";
}
#endif /* __x86_64__ */

#if defined(__aarch64__)
/* FEAT_BF16 (BFDOT, BFMMLA) as the OS reports it: Linux's HWCAP2_BF16 in
 * the auxiliary vector (a kernel older than that bit reports no BF16),
 * macOS's hw.optional.arm.FEAT_BF16 (Apple M2 and later). Advanced SIMD
 * itself needs no check: every AArch64 CPU and OS has it. */
static int tg_cpu_neon_bf16(void) {
#if defined(__linux__)
  enum { HWCAP2_BF16_BIT = 1 << 14 }; /* <asm/hwcap.h>'s HWCAP2_BF16 */
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16_BIT) != 0;
#elif defined(__APPLE__)
  int v = 0;
  size_t len = sizeof v;
  return sysctlbyname("hw.optional.arm.FEAT_BF16", &v, &len, NULL, 0) == 0 && v != 0;
#else
  return 0;
#endif
}
#endif /* __aarch64__ */

static const struct {
  tg_isa id;
  const char *name;
  int (*cpu_runs)(void);
  int (*auto_picks)(void);
  const tg_micro_ops *ops; /* ops->mm_nn == NULL: not in this build */
} isa_registry[] = {
#define TG_ISA_ENTRY(name, id, cpu, pick) {id, #name, cpu, pick, &tg_micro_##name},
    TG_ISA_LIST(TG_ISA_ENTRY)
#undef TG_ISA_ENTRY
};
enum { N_ISAS = sizeof isa_registry / sizeof isa_registry[0] };

const char *tg_isa_name(tg_isa isa) {
  if (isa == TG_ISA_AUTO) return "auto";
  for (int i = 0; i < N_ISAS; i++)
    if (isa_registry[i].id == isa) return isa_registry[i].name;
  return "unknown";
}

tg_status tg_isa_from_name(const char *name, tg_isa *out) {
  if (!name || !out) return TG_ERR_BAD_PARAMS;
  if (strcmp(name, "auto") == 0) return *out = TG_ISA_AUTO, TG_OK;
  for (int i = 0; i < N_ISAS; i++)
    if (strcmp(name, isa_registry[i].name) == 0) return *out = isa_registry[i].id, TG_OK;
  return TG_ERR_BAD_PARAMS;
}

const tg_micro_ops *tg_micro_table(tg_isa isa) {
  for (int i = N_ISAS - 1; i >= 0; i--) /* most preferred first, for AUTO */
    if ((isa == isa_registry[i].id || (isa == TG_ISA_AUTO && isa_registry[i].auto_picks())) &&
        isa_registry[i].ops->mm_nn && isa_registry[i].cpu_runs())
      return isa_registry[i].ops;
  return NULL;
}

int tg_isa_available(tg_isa isa) { return tg_micro_table(isa) != NULL; }

int tg_isa_count(void) { return N_ISAS; }

tg_isa tg_isa_at(int i) { return i >= 0 && i < N_ISAS ? isa_registry[i].id : TG_ISA_AUTO; }

static tg_isa isa_of(const tg_micro_ops *ops) {
  for (int i = 0; i < N_ISAS; i++)
    if (isa_registry[i].ops == ops) return isa_registry[i].id;
  return TG_ISA_AUTO; /* not reached: every table is in the registry */
}

/* Why tg_micro_table(isa) is NULL, where that is cheap to say ("" if not). */
static const char *isa_why_not(tg_isa isa) {
  for (int i = 0; i < N_ISAS; i++)
    if (isa_registry[i].id == isa) {
      if (!isa_registry[i].ops->mm_nn)
        return "this build has no such table (the compiler refused its flags)";
#if defined(__x86_64__)
      if (isa == TG_ISA_AMX) return amx_why();
#elif defined(__aarch64__)
      if (isa == TG_ISA_NEON_BF16 && !tg_cpu_neon_bf16())
        return "the CPU (or the OS) does not report FEAT_BF16 (Linux: HWCAP2_BF16; "
               "macOS: hw.optional.arm.FEAT_BF16)";
#endif
    }
  return "";
}

tg_status tg_ctx_set_isa(tg_ctx *ctx, tg_isa isa) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  const tg_micro_ops *ops = tg_micro_table(isa);
  if (!ops) {
    const char *why = isa_why_not(isa);
    return tg_fail(ctx, TG_ERR_UNSUPPORTED,
                   "tg_ctx_set_isa: ISA '%s' (%d) is not available on this CPU/build%s%s",
                   tg_isa_name(isa), (int)isa, why[0] ? ": " : "", why);
  }
  ctx->isa = isa_of(ops);
  ctx->ops = ops;
  return TG_OK;
}

tg_isa tg_ctx_get_isa(const tg_ctx *ctx) { return ctx ? ctx->isa : TG_ISA_AUTO; }

/* --- context ----------------------------------------------------------------- */
tg_status tg_ctx_create(tg_ctx **out) {
  if (!out) return TG_ERR_NULL_ARG;
  *out = NULL;
  tg_ctx *ctx = tg_mem_alloc(sizeof *ctx, 64);
  if (!ctx) return TG_ERR_NO_MEMORY;
  memset(ctx, 0, sizeof *ctx);
  /* TG_ISA=<name> where this CPU runs it; otherwise (unset, unknown or
   * unavailable) the best available, as without it. */
  tg_isa isa = TG_ISA_AUTO;
  const char *env = getenv("TG_ISA");
  if (env && tg_isa_from_name(env, &isa) != TG_OK) isa = TG_ISA_AUTO;
  if (tg_ctx_set_isa(ctx, isa) != TG_OK) tg_ctx_set_isa(ctx, TG_ISA_AUTO);
  tg_begin(ctx); /* not shared yet: no claim needed */
  *out = ctx;
  return TG_OK;
}

void tg_ctx_destroy(tg_ctx *ctx) {
  if (!ctx) return;
  tg_mem_free(ctx->scratch);
  tg_mem_free(ctx->workspace);
  tg_mem_free(ctx);
}

tg_status tg_ctx_set_threads(tg_ctx *ctx, int n) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (n < 0)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_threads: n = %d; a thread count must be >= 0", n);
  ctx->threads = n;
  return TG_OK;
}

tg_status tg_ctx_set_deterministic(tg_ctx *ctx, int on) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  ctx->deterministic = on != 0;
  return TG_OK;
}

tg_status tg_ctx_set_attn_schedule(tg_ctx *ctx, tg_attn_schedule s) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (s != TG_ATTN_SCHEDULE_KV && s != TG_ATTN_SCHEDULE_ATOMIC)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_attn_schedule: %d is not a tg_attn_schedule", (int)s);
  ctx->attn_schedule = s;
  return TG_OK;
}

tg_attn_schedule tg_ctx_get_attn_schedule(const tg_ctx *ctx) {
  return ctx ? ctx->attn_schedule : TG_ATTN_SCHEDULE_KV;
}

tg_status tg_ctx_set_attn_precision(tg_ctx *ctx, tg_attn_precision p) {
  if (!ctx) return TG_ERR_NULL_ARG;
  TG_ENTER(ctx);
  if (p != TG_ATTN_PRECISION_EXACT && p != TG_ATTN_PRECISION_SPLIT &&
      p != TG_ATTN_PRECISION_BF16)
    return tg_fail(ctx, TG_ERR_BAD_PARAMS,
                   "tg_ctx_set_attn_precision: %d is not a tg_attn_precision", (int)p);
  ctx->attn_precision = p;
  return TG_OK;
}

tg_attn_precision tg_ctx_get_attn_precision(const tg_ctx *ctx) {
  return ctx ? ctx->attn_precision : TG_ATTN_PRECISION_EXACT;
}

const char *tg_attn_precision_name(tg_attn_precision p) {
  switch (p) {
    case TG_ATTN_PRECISION_EXACT: return "exact";
    case TG_ATTN_PRECISION_SPLIT: return "split";
    case TG_ATTN_PRECISION_BF16: return "bf16";
  }
  return "unknown";
}

/* --- threads ------------------------------------------------------------------ */

/* The CPU quota in the cgroup file `dir`/cpu.max (v2: "max 100000" or
 * "<quota> <period>") or `dir`/cpu.cfs_quota_us + cpu.cfs_period_us (v1;
 * quota -1 = none), as whole CPUs rounded up; 0 when there is none. */
static int quota_in(const char *dir) {
  char path[4096 + 32];
  long long quota = -1, period = 0;
  snprintf(path, sizeof path, "%s/cpu.max", dir);
  FILE *f = fopen(path, "r");
  if (f) {
    char q[32] = "";
    if (fscanf(f, "%31s %lld", q, &period) != 2 || strcmp(q, "max") == 0 ||
        sscanf(q, "%lld", &quota) != 1)
      quota = -1;
    fclose(f);
  } else {
    snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
    if ((f = fopen(path, "r"))) {
      if (fscanf(f, "%lld", &quota) != 1) quota = -1;
      fclose(f);
      snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
      if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%lld", &period) != 1) period = 0;
        fclose(f);
      }
    }
  }
  if (quota <= 0 || period <= 0) return 0;
  const long long cpus = (quota + period - 1) / period;
  return cpus > 1 << 20 ? 1 << 20 : (int)cpus;
}

/* Does the comma-separated controller list name "cpu"? */
static int lists_cpu(const char *list) {
  for (const char *p = list; *p;) {
    const size_t n = strcspn(p, ",");
    if (n == 3 && strncmp(p, "cpu", 3) == 0) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

int tg_cgroup_cpu_limit(const char *cgroup_root, const char *proc_self_cgroup) {
  FILE *f = fopen(proc_self_cgroup, "r");
  if (!f) return 0;
  int limit = 0;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    /* "<id>:<controllers>:<path>": v2 is "0::<path>"; v1 lists "cpu" */
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *controllers = c1 + 1;
    char *path = c2 + 1;
    path[strcspn(path, "\n")] = '\0';
    char dir[4096];
    if (controllers[0] == '\0')
      snprintf(dir, sizeof dir, "%s%s", cgroup_root, path);
    else if (lists_cpu(controllers))
      snprintf(dir, sizeof dir, "%s/cpu%s", cgroup_root, path);
    else
      continue;
    /* the tightest quota from this cgroup up to the root applies */
    for (;;) {
      const int q = quota_in(dir);
      if (q > 0 && (limit == 0 || q < limit)) limit = q;
      char *slash = strrchr(dir, '/');
      if (!slash || (size_t)(slash - dir) < strlen(cgroup_root)) break;
      *slash = '\0';
    }
  }
  fclose(f);
  return limit;
}

/* OpenMP's default (libgomp: the CPUs of the affinity mask, or
 * OMP_NUM_THREADS), capped by the cgroup CPU quota unless OMP_NUM_THREADS
 * asks for a number: a 2-CPU container on a 64-core host gets 2 threads,
 * not 64 time-sliced ones. The quota is read once per process. */
static int default_threads(void) {
  static int quota = -1; /* -1: not read yet; benign race: every reader computes the same */
  const int omp = omp_get_max_threads();
  if (getenv("OMP_NUM_THREADS")) return omp;
  if (quota < 0) quota = tg_cgroup_cpu_limit("/sys/fs/cgroup", "/proc/self/cgroup");
  return quota > 0 && quota < omp ? quota : omp;
}

int tg_threads(const tg_ctx *ctx) {
  return ctx->threads > 0 ? ctx->threads : default_threads();
}

/* --- checked arithmetic -------------------------------------------------------- */
int tg_mul_ok(int64_t *out, int n, ...) {
  va_list ap;
  va_start(ap, n);
  int64_t acc = 1;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    int64_t f = va_arg(ap, int64_t);
    if (f < 0 || __builtin_mul_overflow(acc, f, &acc)) ok = 0;
  }
  va_end(ap);
  *out = ok ? acc : 0;
  return ok;
}

tg_status tg_shape_count(tg_ctx *ctx, const char *name, size_t elem_bytes,
                         int64_t *count, int ndims, ...) {
  /* Zero dims first: a shape with a zero dim is BAD_SHAPE even where the
   * product of the others would overflow. */
  int64_t dims[8];
  va_list ap;
  va_start(ap, ndims);
  for (int i = 0; i < ndims && i < 8; i++) dims[i] = va_arg(ap, int64_t);
  va_end(ap);
  tg_status st = TG_OK;
  for (int i = 0; i < ndims && st == TG_OK; i++)
    if (dims[i] <= 0)
      st = tg_fail(ctx, TG_ERR_BAD_SHAPE, "%s: dimension %d is %lld; it must be >= 1",
                   name, i, (long long)dims[i]);
  int64_t acc = 1;
  for (int i = 0; i < ndims && st == TG_OK; i++)
    if (__builtin_mul_overflow(acc, dims[i], &acc))
      st = tg_fail(ctx, TG_ERR_OVERFLOW, "%s: element count overflows int64", name);
  int64_t bytes;
  if (st == TG_OK && __builtin_mul_overflow(acc, (int64_t)elem_bytes, &bytes))
    st = tg_fail(ctx, TG_ERR_OVERFLOW, "%s: %lld elements of %zu bytes overflow int64",
                 name, (long long)acc, elem_bytes);
  if (count) *count = st == TG_OK ? acc : 0;
  return st;
}
