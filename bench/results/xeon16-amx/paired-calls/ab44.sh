#!/usr/bin/env bash
# Device: the tree against build-b39 (HEAD), call by call (bench/ab_calls),
# bits
# (bitcmp.c), then the micro and attention suites on amx and avx512bf16.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=${TESTS:-ON} && cmake --build build-dev -j16 &&
  { [ -f build-b39bin/libtilegrad.so ] || { cmake -S build-b39 -B build-b39bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-b39bin -j16 --target tilegrad; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/abpair || exit 1
S=${S:-'1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'}
for job in ${JOBS:-"2:bf16" "2:exact" "16:bf16" "16:exact"}; do
  th=${job%:*} pr=${job#*:}
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-400} ] || break
  /tmp/abpair $PWD/build-b39bin/libtilegrad.so $PWD/build-dev/libtilegrad.so $th $pr ${PAIRS:-11} "$S"
done | tee "$o/abpair.txt"
echo "ab end $(( $(date +%s) - t0 )) s"
[ "${CHECK:-1}" = 1 ] || exit 0
for cfg in b39bin dev; do
  gcc -O2 -Iinclude build-device/bitcmp.c -Lbuild-$cfg -ltilegrad -lm -o /tmp/bitcmp-$cfg || exit 1
  for isa in amx avx512bf16; do LD_LIBRARY_PATH=build-$cfg:$LD_LIBRARY_PATH /tmp/bitcmp-$cfg $isa > "$o/bits-$cfg-$isa.txt"; done
done
for isa in amx avx512bf16; do echo "bits $isa: $(diff "$o/bits-b39bin-$isa.txt" "$o/bits-dev-$isa.txt" | grep -c '^>') of $(wc -l < "$o/bits-dev-$isa.txt") lines differ from the base"; done
ctest --test-dir build-dev -R '(test_micro|test_attention|test_attn_ext)\.(amx|avx512bf16)$' -j8 --timeout 150 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"
