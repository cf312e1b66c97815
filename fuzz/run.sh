#!/usr/bin/env bash
# Builds the libFuzzer target (clang, libFuzzer + ASan + UBSan) and runs it.
#
#   fuzz/run.sh            CI run: replay fuzz/corpus, then fuzz 60 s in total
#   fuzz/run.sh 600        the long run (10 minutes, one process; the README's
#                          record ran it as taskset -c 0 fuzz/run.sh 600)
#   fuzz/run.sh 0          replay the corpus only
#   fuzz/run.sh 60 FILE..  replay given inputs (reproducers) instead of fuzzing
#
# New inputs go to a scratch directory, never into fuzz/corpus (which stays
# small and committed); a crashing input is left in build-fuzz/artifacts/ and
# the script exits non-zero. Needs clang, libclang-rt-14-dev, libomp-14-dev
# (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
build=${TG_FUZZ_BUILD:-build-fuzz}

source fuzz/harness.sh
tg_build_harness fuzz "$build"

export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/fuzz/ubsan.supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export OMP_WAIT_POLICY=passive KMP_BLOCKTIME=0
art="$build/artifacts"
mkdir -p "$art"
bin="$build/fuzz_entry"

if [ $# -gt 0 ]; then
  exec "$bin" "$@"
fi

echo "== fuzz: replay the seed corpus ($(ls fuzz/corpus | wc -l) inputs)"
if ! "$bin" -runs=0 -artifact_prefix="$art/" fuzz/corpus >"$build/replay.log" 2>&1; then
  tail -40 "$build/replay.log" >&2
  echo "fuzz: a seed input fails" >&2
  exit 1
fi
grep -E "INITED|DONE" "$build/replay.log" || true
[ "$secs" -eq 0 ] && exit 0

# TG_FUZZ_WORK=dir keeps the inputs the run adds (e.g. for fuzz/coverage.sh)
if [ -n "${TG_FUZZ_WORK:-}" ]; then
  work=$TG_FUZZ_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
log="$build/fuzz-$(date -u +%Y%m%dT%H%M%SZ).log"
echo "== fuzz: ${secs} s (log $log)"
set +e
"$bin" -max_total_time="$secs" -max_len=512 -timeout=20 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$art/" "$work" fuzz/corpus >"$log" 2>&1
rc=$?
set -e
grep -E "^#[0-9]+[[:space:]]+DONE|^stat::|FINDING|runtime error|ERROR: " "$log" | tail -12
if [ $rc -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); input in $art/, replay with: fuzz/run.sh 0 $art/<file>" >&2
  tail -40 "$log" >&2
  exit 1
fi
echo "fuzz: clean"
