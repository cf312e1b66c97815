/*
 * The ISA registry: every vector instruction set tilegrad has a table for,
 * in one list. Each entry is
 *
 *   X(name, id, cpu_predicate)
 *
 * name:  the table's suffix (tg_micro_<name>, kernels/micro/ compiled with
 *        -DTG_MICRO_SUFFIX=<name>), the string tg_isa_name gives and TG_ISA /
 *        --isa accept;
 * id:    the public tg_isa value (include/tilegrad.h);
 * cpu_predicate: a function in engine/context.c, nonzero when this CPU and
 *        its OS can run the instructions.
 *
 * Listed from least to most preferred: TG_ISA_AUTO picks the last entry
 * the CPU runs and this build has. The compile flags of each entry are in
 * CMakeLists.txt (tg_micro_variant), the only other place that names ISAs.
 * Adding an ISA: one line here, one tg_micro_variant line there, a section
 * in kernels/micro/blocking.h (and a simd_<name>.h where plain C does not
 * reach the target).
 */
#ifndef TG_ISA_H
#define TG_ISA_H

#define TG_ISA_LIST(X)                       \
  X(portable, TG_ISA_PORTABLE, tg_cpu_any)   \
  X(avx2, TG_ISA_AVX2, tg_cpu_avx2_fma)      \
  X(avx512, TG_ISA_AVX512, tg_cpu_avx512)

#endif /* TG_ISA_H */
