#!/usr/bin/env bash
# Race check: ThreadSanitizer over every kernel, with LLVM's OpenMP runtime
# (libomp) and its Archer OMPT tool, which hands TSan OpenMP's
# synchronisation (fork/join, barriers, the dynamic loop) so that it reports
# real races only. gcc's libgomp is not TSan-aware (false positives), hence
# clang here. Details and results: fuzz/README.md, "Race check".
#
#   scripts/race_check.sh          canary + driver, 3 rounds (about 10 s)
#   RACE_ROUNDS=10 scripts/race_check.sh
#
# 1. canary: a deliberate race through the engine's tg_dispatch must be
#    reported, and the same adds made atomic must not (the tooling works);
# 2. fuzz/race_driver.c: every kernel at 1, 2, 3, 7 threads, both FA-2 dK/dV
#    schedules, both fused-RMSNorm modes, determinism compared across counts.
# Exit 0 only when the canary is caught and the driver is clean.
# Needs: clang, libclang-rt-14-dev, libomp-14-dev (scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TG_RACE_BUILD:-build-race}
rounds=${RACE_ROUNDS:-3}

source fuzz/harness.sh
tg_build_harness race "$build"

archer=$(dpkg -L libomp-14-dev 2>/dev/null | grep '/libarcher\.so$' | head -1 || true)
[ -n "$archer" ] || archer=/usr/lib/llvm-14/lib/libarcher.so
[ -f "$archer" ] || { echo "race_check: libarcher.so not found (libomp-14-dev)" >&2; exit 2; }

# ignore_noninstrumented_modules: libomp itself is not built with TSan; its
# internal accesses (thread pool, locks) are invisible to TSan except through
# Archer, and reports whose accesses lie inside it are not ours to fix.
export OMP_TOOL_LIBRARIES="$archer"
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 exitcode=66 history_size=4"
export ARCHER_OPTIONS="verbose=1"
# OpenMP's default (spinning) wait policy: idle threads pick up work at once,
# so every thread count really runs groups on several threads
unset OMP_WAIT_POLICY

echo "== race check: canary (a deliberate race must be reported)"
set +e
"$build/race_canary" racy >"$build/canary.log" 2>&1
rc=$?
set -e
if [ $rc -ne 66 ] || ! grep -q "data race .*race_canary.c" "$build/canary.log"; then
  cat "$build/canary.log" >&2
  echo "race_check: the deliberate race was NOT reported (rc $rc): the tooling is broken" >&2
  exit 1
fi
grep -q "Archer detected OpenMP application with TSan" "$build/canary.log" ||
  { echo "race_check: Archer did not load ($archer)" >&2; exit 1; }
echo "   reported: $(grep -m1 SUMMARY "$build/canary.log")"
for m in atomic owned; do
  "$build/race_canary" $m >"$build/canary-$m.log" 2>&1 ||
    { cat "$build/canary-$m.log" >&2; echo "race_check: canary '$m' reported a race" >&2; exit 1; }
done
echo "   atomic adds and owned outputs: clean"

echo "== race check: every kernel at 1/2/3/7 threads, $rounds round(s)"
for r in $(seq 1 "$rounds"); do
  if ! "$build/race_driver" >"$build/race-$r.log" 2>&1; then
    cat "$build/race-$r.log" >&2
    echo "race_check: FAILED in round $r (log $build/race-$r.log)" >&2
    exit 1
  fi
done
grep -v "^Archer" "$build/race-$rounds.log"
echo "race_check: clean (ThreadSanitizer + Archer, no suppressions)"
