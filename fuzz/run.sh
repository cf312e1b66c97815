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

# The CLI's argument parsers (fuzz_cli_args.c, seeds fuzz/corpus_cli/ from
# fuzz/make_cli_corpus.py): replay, then a brief run (TG_FUZZ_CLI_SECS,
# default 20 s, none when replaying only).
cli_bin="$build/fuzz_cli_args"
echo "== fuzz the CLI argument parser: replay fuzz/corpus_cli ($(ls fuzz/corpus_cli | wc -l) inputs)"
if ! "$cli_bin" -runs=0 -artifact_prefix="$art/" fuzz/corpus_cli >"$build/replay_cli.log" 2>&1; then
  tail -40 "$build/replay_cli.log" >&2
  echo "fuzz: a CLI seed input fails" >&2
  exit 1
fi
cli_secs=${TG_FUZZ_CLI_SECS:-20}
# The CLI run goes beside the main run (each fuzzer is one process: on a
# 2-core machine the two took 50 s one after the other); its result is
# read once the main run is done.
cli_pid=""
if [ "$secs" -gt 0 ] && [ "$cli_secs" -gt 0 ]; then
  cli_work=$(mktemp -d)
  echo "== fuzz the CLI argument parser: ${cli_secs} s, beside the main run"
  ( "$cli_bin" -max_total_time="$cli_secs" -max_len=1024 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$art/" "$cli_work" fuzz/corpus_cli \
      >"$build/fuzz_cli.log" 2>&1
    echo $? >"$build/fuzz_cli.rc" ) &
  cli_pid=$!
fi
cli_result() {
  [ -n "$cli_pid" ] || return 0
  wait "$cli_pid" || true
  rm -rf "$cli_work"
  local cli_rc
  cli_rc=$(cat "$build/fuzz_cli.rc" 2>/dev/null || echo 1)
  echo "== fuzz the CLI argument parser: done"
  grep -E "^#[0-9]+[[:space:]]+DONE|^stat::number_of_executed_units|FINDING|runtime error|ERROR: " \
    "$build/fuzz_cli.log" | tail -6
  if [ "$cli_rc" -ne 0 ]; then
    echo "fuzz: CLI parser FAILED (exit $cli_rc); input in $art/, replay with: $cli_bin $art/<file>" >&2
    tail -40 "$build/fuzz_cli.log" >&2
    exit 1
  fi
}
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
cli_result
echo "fuzz: clean"
