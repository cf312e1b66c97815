#!/usr/bin/env bash
# Line/region coverage of isa/, engine/ and kernels/ reached by replaying fuzz
# inputs (the seed corpus, plus any directories given, e.g. the TG_FUZZ_WORK
# directory of a long run):
#
#   fuzz/coverage.sh                     # seed corpus only
#   fuzz/coverage.sh /tmp/fz/long        # seeds + a long run's inputs
#
# Builds build-fuzz-cov (clang -fprofile-instr-generate -fcoverage-mapping, no
# sanitizers) and prints llvm-cov's per-file report.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TG_FUZZ_COV_BUILD:-build-fuzz-cov}
source fuzz/harness.sh
tg_build_harness cov "$build"
rm -f "$build"/*.profraw
export OMP_WAIT_POLICY=passive KMP_BLOCKTIME=0
LLVM_PROFILE_FILE="$build/cov-%p.profraw" "$build/fuzz_entry" -runs=0 fuzz/corpus "$@" \
  >"$build/replay.log" 2>&1
profdata=$(command -v llvm-profdata-14 || command -v llvm-profdata)
llvmcov=$(command -v llvm-cov-14 || command -v llvm-cov)
"$profdata" merge -sparse "$build"/*.profraw -o "$build/cov.profdata"
"$llvmcov" report "$build/fuzz_entry" -instr-profile="$build/cov.profdata" \
  $(ls isa/*.c isa/*/*.c engine/*.c kernels/*.c)
