#!/usr/bin/env bash
# The aarch64 stage of scripts/test.sh: cross-builds tilegrad for aarch64
# (Release; Debian's gcc-aarch64-linux-gnu, cmake/toolchain-aarch64-linux-gnu.cmake)
# and runs every C suite under qemu-aarch64 on the neonbf16 table, and the
# lighter ones on neon and portable (below), each on its CPU model
# (tests/CMakeLists.txt):
#   portable, neon   qemu's cortex-a72 (Armv8.0-A, no FEAT_BF16)
#   neonbf16         qemu's max, pauth=off (FEAT_BF16: BFMMLA)
# First it checks the run-time choice: on cortex-a72 the library sees no
# BF16 (auto picks neon, the neonbf16 suites skip with that reason), on max
# auto picks neonbf16. Emulation says nothing about speed (docs/AARCH64.md).
# TG_TEST_SHORT=1: the suites leave out the cases that add only size (the
# attention accuracy target at L = 4096), whose f64 references take many
# minutes when qemu emulates every floating-point operation, and the
# attention suites run a covering subset of ISA x threads x run mode per
# problem (tests/common/attn_problem.h, attn_runs_of).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
b=build-aarch64

echo "== aarch64: cross build (Release)"
cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release \
      --toolchain cmake/toolchain-aarch64-linux-gnu.cmake >/dev/null
cmake --build "$b" -j"$jobs" >/dev/null

echo "== aarch64: the table auto picks, with and without FEAT_BF16"
expect_isa() { # <qemu cpu> <isa>
  local got
  got=$(QEMU_CPU=$1 qemu-aarch64 "$b/tilegrad" --version | sed -n 's/^isa: //p')
  echo "qemu -cpu $1: auto picks $got"
  [ "$got" = "$2" ] || { echo "want $2" >&2; exit 1; }
}
expect_isa cortex-a72 neon
expect_isa max,pauth=off neonbf16
rc=0
out=$(QEMU_CPU=cortex-a72 TG_TEST_ISA=neonbf16 qemu-aarch64 "$b/tests/test_micro") || rc=$?
echo "$out"
if [ "$rc" -ne 77 ] || ! grep -q "does not report FEAT_BF16" <<<"$out"; then
  echo "neonbf16 on cortex-a72: want a skip (exit 77) for the missing FEAT_BF16, got $rc" >&2
  exit 1
fi

# Where the time goes under qemu is the f64 references of the attention
# suites (qemu emulates every floating-point operation), once per table.
# So every suite runs on neonbf16 (its NEON f32 ops, and BFMMLA for the bf16
# products); neon runs every suite but the eight heaviest attention ones (its
# ops are neonbf16's f32 ones, built without +bf16: test_micro holds them to
# their scalar definitions bit for bit, and the lighter suites run them end
# to end); the portable table, the same C on every target, which x86-64 runs
# every suite on natively (scripts/test.sh: Release and ASan), runs the
# suites of the table itself (its ops as the aarch64 compiler builds them,
# the registry). Before this split the stage took 23 minutes on a 2-core AMD
# EPYC of family 23. test_attn_ext runs on no aarch64 table: it holds the
# options (dropout, sinks' and precision modes' plumbing, the schedules'
# bits), the engine's C that x86-64 runs on every table natively, and took
# 390 s under qemu on neonbf16 alone; the NEON and BFMMLA kernels it calls
# run in test_attention, test_attn_variants and test_attn_step (the
# precision modes among them).
heavy='test_(attention|attn_ext|attn_variants|attn_step|attn_varlen|causal_attention|big_offsets|hardening)'
echo "== aarch64: ctest under qemu (neonbf16: max; neon: cortex-a72, all but $heavy; portable: its own suites)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
(cd "$b" && TG_TEST_SHORT=1 ctest -j"$jobs" --output-on-failure -E "\\.portable\$|^$heavy\\.neon\$|^test_attn_ext\\." &&
   TG_TEST_SHORT=1 ctest -j"$jobs" --output-on-failure \
     -R '^(test_micro|test_isa_registry|test_version)\.portable$') | tee "$log"
if grep -q "(Skipped)" "$log"; then # every table runs on its CPU model
  echo "aarch64: suites were skipped" >&2
  exit 1
fi

echo "== aarch64: the bench's ceilings run (NEON FMA, BFMMLA; under qemu their numbers mean nothing)"
out=$(QEMU_CPU=max,pauth=off qemu-aarch64 "$b/tilegrad" bench --section peaks --threads 1 --triad-mib 8)
echo "$out"
grep -q "(neon; neon" <<<"$out" && grep -q "bf16 dot peak .*bfmmla" <<<"$out" ||
  { echo "aarch64: the bench's NEON / BFMMLA ceilings are missing" >&2; exit 1; }
