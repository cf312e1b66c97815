#!/usr/bin/env bash
# Device: the tree against the tree in build-$BASE (a `git archive` of the
# commit before), call by call (bench/ab_calls): JOBS "threads:mode ...",
# PAIRS pairs per shape, shapes S; then, unless CHECK=0, bits (bitcmp.c from
# build-device/) and the suites matching CTEST_RE. Runs of this section:
#   ab38 (the row bands):  BASE=b37 (c79c26b), with abpair.c, the prototype
#                          of ab_calls, taking the modes as numbers
#   ab42 (the thread-capped plan): BASE=b37 CTEST_RE='\.(amx)$'
#   ab44 (starved groups): BASE=b39 (143d770)
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
base=build-${BASE:?BASE names build-BASE, the tree before}
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=${TESTS:-ON} && cmake --build build-dev -j16 &&
  { [ -f ${base}bin/libtilegrad.so ] || { cmake -S $base -B ${base}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build ${base}bin -j16 --target tilegrad; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
S=${S:-'1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'}
for job in ${JOBS:-"2:bf16" "2:exact" "16:bf16" "16:exact"}; do
  th=${job%:*} pr=${job#*:}
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-400} ] || break
  /tmp/ab_calls $PWD/${base}bin/libtilegrad.so $PWD/build-dev/libtilegrad.so $th $pr ${PAIRS:-11} "$S"
done | tee "$o/abpair.txt"
echo "ab end $(( $(date +%s) - t0 )) s"
[ "${CHECK:-1}" = 1 ] || exit 0
for cfg in ${base}bin build-dev; do
  gcc -O2 -Iinclude build-device/bitcmp.c -L$cfg -ltilegrad -lm -o /tmp/bitcmp-${cfg#build-} || exit 1
  for isa in amx avx512bf16; do LD_LIBRARY_PATH=$cfg:$LD_LIBRARY_PATH /tmp/bitcmp-${cfg#build-} $isa > "$o/bits-${cfg#build-}-$isa.txt"; done
done
for isa in amx avx512bf16; do echo "bits $isa: $(diff "$o/bits-${base#build-}bin-$isa.txt" "$o/bits-dev-$isa.txt" | grep -c '^>') of $(wc -l < "$o/bits-dev-$isa.txt") lines differ from the base"; done
ctest --test-dir build-dev -R "${CTEST_RE:-(test_micro|test_attention|test_attn_ext)\.(amx|avx512bf16)\$}" -j8 --timeout 250 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"
