# The CMake side of the ISA registry (isa/registry.h is the C side, with the
# same names in the same order for each architecture). Per ISA: its compile
# flags (TG_ISA_FLAGS_<name>) and the sources it adds to the common ones
# (TG_ISA_SOURCES_<name>, files under isa/<arch>/). Every table is built
# from isa/common/*.c plus its own sources, with its flags and
# -DTG_ISA_SUFFIX=<name>. The portable table takes the target's baseline
# flags only and is always built.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(TG_ISA_NAMES portable avx2 avx512 avx512bf16 amx)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64|ARM64")
  set(TG_ISA_NAMES portable neon neonbf16)
else()
  set(TG_ISA_NAMES portable)
endif()
# What every table compiles (the simd_<isa>.h blocks its flags select are
# included by common/build.h).
set(TG_ISA_SOURCES_COMMON common/table.c common/gemm.c common/rows.c common/bf16_pack.c
                          common/row_ops.c)
set(TG_ISA_FLAGS_portable "")
set(TG_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(TG_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mavx2 -mf16c)
# avx512 plus vdpbf16ps (x86/bf16_dot.c): the same code and blocking, with
# the attention's bf16 x bf16 products on the bf16 unit. TG_ISA_WITH_BF16_DOT:
# the table has mm_bf16_pairs and pack_bf16_pairs (common/table.c).
set(TG_ISA_FLAGS_avx512bf16 ${TG_ISA_FLAGS_avx512} -mavx512bf16 -DTG_ISA_WITH_BF16_DOT)
set(TG_ISA_SOURCES_avx512bf16 x86/bf16_dot.c x86/bf16_pairs.c)
# avx512bf16 plus AMX-BF16 tiles (x86/amx.c): the bf16 x bf16 products on
# TDPBF16PS, everything else as avx512bf16 (gcc >= 11, clang >= 12).
# TG_ISA_WITH_AMX: the table takes amx.c's product and its tile blocking;
# amx.c refuses to build without the tile intrinsics.
set(TG_ISA_FLAGS_amx ${TG_ISA_FLAGS_avx512bf16} -mamx-tile -mamx-bf16 -DTG_ISA_WITH_AMX)
set(TG_ISA_SOURCES_amx x86/bf16_pairs.c x86/amx.c)
# aarch64 (Advanced SIMD is in the baseline, so the portable table is
# auto-vectorized NEON too): TG_ISA_WITH_NEON selects arm/simd_neon.h and the
# NEON blocking (32 q registers). neonbf16 adds FEAT_BF16 for BFMMLA
# (arm/bf16_mmla.c, which refuses to build without the BF16 intrinsics):
# optional from Armv8.2, so armv8.2-a+bf16 asks for nothing else a BF16 CPU
# might lack.
set(TG_ISA_FLAGS_neon -DTG_ISA_WITH_NEON)
set(TG_ISA_FLAGS_neonbf16 -march=armv8.2-a+bf16 -DTG_ISA_WITH_NEON -DTG_ISA_WITH_BF16_DOT)
set(TG_ISA_SOURCES_neonbf16 arm/bf16_mmla.c)

# tg_add_isa_tables(<prefix> <objects_var> <built_var>
#                     [OPTIONS <compile options>...] [LINK <libraries>...])
# Adds one object library <prefix>_<isa> per ISA: isa/common/*.c and the
# ISA's own sources with its flags where this compiler builds them for this
# target (checked by compiling them), else isa/portable/absent.c (a table with no
# functions, which the run-time choice skips). Sets <objects_var> to their
# objects and <built_var> to the names of the ISAs really built.
function(tg_add_isa_tables prefix objects_var built_var)
  cmake_parse_arguments(ARG "" "" "OPTIONS;LINK" ${ARGN})
  get_filename_component(root ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/.. ABSOLUTE)
  set(isa ${root}/isa)
  set(objects "")
  set(built "")
  foreach(name ${TG_ISA_NAMES})
    set(flags ${TG_ISA_FLAGS_${name}})
    set(sources "")
    foreach(src ${TG_ISA_SOURCES_COMMON} ${TG_ISA_SOURCES_${name}})
      list(APPEND sources ${isa}/${src})
    endforeach()
    set(ok ON)
    if(flags)
      set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
      try_compile(ok ${CMAKE_CURRENT_BINARY_DIR}/try_isa_${prefix}_${name}
                  SOURCES ${sources}
                  COMPILE_DEFINITIONS -DTG_ISA_SUFFIX=${name} -I${root}/include
                                      -I${isa} ${ARG_OPTIONS} -fno-trapping-math
                                      ${flags})
    endif()
    if(ok)
      add_library(${prefix}_${name} OBJECT ${sources})
      # f32 FMA contraction is allowed in the GEMM and attention row loops
      # (isa/common/row_ops.c switches it off for the row ops, and says why).
      # -fno-trapping-math: no code here reads the FP exception flags, and
      # with gcc's default (-ftrapping-math) the float selects of exp_f32 are
      # not if-converted below AVX-512, leaving the AVX2 and SSE2 builds of
      # the exp scalar (22% of the FA-2 backward's time on the avx2 table).
      # It changes no result: it allows no reassociation.
      # clang: -ffp-contract=fast would override every pragma, and clang
      # ignores gcc's optimize pragma of row_ops.c; so clang builds with
      # "on", and isa/common/build.h's `#pragma clang fp contract(fast)` makes
      # it fast everywhere but the row ops (whose pragma switches it off).
      # -Wno-pass-failed: clang reports the `omp simd` loops it leaves scalar
      # (score_max_masked's mask read by dtype), which gcc vectorizes.
      if(CMAKE_C_COMPILER_ID MATCHES "Clang")
        set(contract -ffp-contract=on -Wno-pass-failed)
      else()
        set(contract -ffp-contract=fast)
      endif()
      target_compile_options(${prefix}_${name} PRIVATE ${ARG_OPTIONS} ${contract}
                             -fno-trapping-math ${flags})
      list(APPEND built ${name})
    else()
      message(STATUS "tilegrad: no ${name} table in this build (${CMAKE_C_COMPILER_ID} "
                     "on ${CMAKE_SYSTEM_PROCESSOR} cannot build it with: ${flags})")
      add_library(${prefix}_${name} OBJECT ${isa}/portable/absent.c)
      target_compile_options(${prefix}_${name} PRIVATE ${ARG_OPTIONS})
    endif()
    target_include_directories(${prefix}_${name} PRIVATE ${root}/include ${isa})
    target_compile_definitions(${prefix}_${name} PRIVATE TG_ISA_SUFFIX=${name})
    if(ARG_LINK)
      target_link_libraries(${prefix}_${name} PRIVATE ${ARG_LINK})
    endif()
    list(APPEND objects $<TARGET_OBJECTS:${prefix}_${name}>)
  endforeach()
  set(${objects_var} ${objects} PARENT_SCOPE)
  set(${built_var} ${built} PARENT_SCOPE)
endfunction()
