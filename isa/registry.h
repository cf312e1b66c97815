/*
 * The ISA registry: every vector instruction set tilegrad has a table for,
 * in one list. Each entry is
 *
 *   X(name, id, cpu_predicate, auto_predicate)
 *
 * name:  the table's suffix (tg_isa_ops_<name>, isa/common/ and the ISA's
 *        own sources compiled with -DTG_ISA_SUFFIX=<name>), the string
 *        tg_isa_name gives and TG_ISA / --isa accept;
 * id:    the public tg_isa value (include/tilegrad.h);
 * cpu_predicate: a function in isa/select.c, nonzero when this CPU and
 *        its OS can run the instructions.
 * auto_predicate: nonzero when TG_ISA_AUTO may pick this table on this CPU
 *        (a table can run but lose: vdpbf16ps runs at about 2x the f32 FMA
 *        rate on AMD Zen 4 / Zen 5 and about 0.5x on Intel Xeons, measured
 *        by `tilegrad bench --section peaks`; there auto keeps avx512).
 *        amx (AMX-BF16 tiles for the two bf16 x bf16 attention products,
 *        the rest avx512bf16's) is picked wherever it runs: its predicate
 *        includes the OS's permission (Linux: arch_prctl, once per process).
 *
 * Listed from least to most preferred: TG_ISA_AUTO picks the last entry
 * the CPU runs, its auto predicate allows and this build has.
 *
 * Adding an ISA:
 *   1. one row here (and its tg_isa value in include/tilegrad.h; its CPU
 *      predicate in isa/select.c if no existing one fits);
 *   2. one flags line in isa/isa.cmake (TG_ISA_FLAGS_<name>, in TG_ISA_NAMES
 *      at the same position), plus TG_ISA_SOURCES_<name> if it brings code;
 *   3. its files in one folder, isa/<arch>/: a simd_<name>.h where plain C
 *      does not reach the target (chosen in isa/common/build.h), its own
 *      products as .c files (pointed at by isa/common/table.c), and its
 *      blocking section in isa/tuning.h.
 * tests/test_isa_registry.c holds the public enum and the CMake list to
 * this one.
 */
#ifndef TG_ISA_REGISTRY_H
#define TG_ISA_REGISTRY_H

/* Each architecture lists its own tables; the others' compile out (their
 * names are "unknown" there). */
#if defined(__x86_64__)
#define TG_ISA_LIST(X)                                                        \
  X(portable, TG_ISA_PORTABLE, tg_cpu_any, tg_cpu_any)                        \
  X(avx2, TG_ISA_AVX2, tg_cpu_avx2_fma, tg_cpu_any)                           \
  X(avx512, TG_ISA_AVX512, tg_cpu_avx512, tg_cpu_any)                         \
  X(avx512bf16, TG_ISA_AVX512_BF16, tg_cpu_avx512_bf16, tg_cpu_bf16_dot_fast) \
  X(amx, TG_ISA_AMX, tg_cpu_amx, tg_cpu_any)
#elif defined(__aarch64__)
/* neon: Advanced SIMD, in every AArch64 CPU. neonbf16: neon with the two
 * bf16 x bf16 attention products on BFMMLA (FEAT_BF16: Linux HWCAP2_BF16,
 * macOS hw.optional.arm.FEAT_BF16); picked wherever it runs (unmeasured:
 * docs/AARCH64.md). */
#define TG_ISA_LIST(X)                                   \
  X(portable, TG_ISA_PORTABLE, tg_cpu_any, tg_cpu_any)   \
  X(neon, TG_ISA_NEON, tg_cpu_any, tg_cpu_any)           \
  X(neonbf16, TG_ISA_NEON_BF16, tg_cpu_neon_bf16, tg_cpu_any)
#else
#define TG_ISA_LIST(X) X(portable, TG_ISA_PORTABLE, tg_cpu_any, tg_cpu_any)
#endif

#endif /* TG_ISA_REGISTRY_H */
