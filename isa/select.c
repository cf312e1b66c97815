/* The ISA layer's choice: the CPU probes of every registry row (CPUID and
 * XCR0, the AMX tile-data permission, aarch64's HWCAP2 / sysctl), the
 * registry array, and the calls that name, list and pick tables. */
#define _DEFAULT_SOURCE /* syscall() (tg_cpu_amx's permission request) under -std=c11 */
#include <stdatomic.h>
#include <string.h>

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

#include "ops.h"

/* --- the probes ---------------------------------------------------------------
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

/* --- the registry and the choice ---------------------------------------------- */
static const struct {
  tg_isa id;
  const char *name;
  int (*cpu_runs)(void);
  int (*auto_picks)(void);
  const tg_isa_ops *ops; /* ops->mm_nn == NULL: not in this build */
} isa_registry[] = {
#define TG_ISA_ENTRY(name, id, cpu, pick) {id, #name, cpu, pick, &tg_isa_ops_##name},
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

const tg_isa_ops *tg_isa_table(tg_isa isa) {
  for (int i = N_ISAS - 1; i >= 0; i--) /* most preferred first, for AUTO */
    if ((isa == isa_registry[i].id || (isa == TG_ISA_AUTO && isa_registry[i].auto_picks())) &&
        isa_registry[i].ops->mm_nn && isa_registry[i].cpu_runs())
      return isa_registry[i].ops;
  return NULL;
}

int tg_isa_available(tg_isa isa) { return tg_isa_table(isa) != NULL; }

int tg_isa_count(void) { return N_ISAS; }

tg_isa tg_isa_at(int i) { return i >= 0 && i < N_ISAS ? isa_registry[i].id : TG_ISA_AUTO; }

tg_isa tg_isa_of(const tg_isa_ops *ops) {
  for (int i = 0; i < N_ISAS; i++)
    if (isa_registry[i].ops == ops) return isa_registry[i].id;
  return TG_ISA_AUTO; /* not reached: every table is in the registry */
}

const char *tg_isa_why_not(tg_isa isa) {
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
