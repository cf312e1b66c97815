#!/usr/bin/env bash
# Device, final tree: the attention suites (amx, avx512bf16), bits against
# build-b35 (bitcmp.c), then step time against build-b35, rotating rounds
# (amx: bf16 and exact mode; avx512bf16: bf16 and split mode).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  { [ -x build-b35bin/tilegrad ] || { cmake -S build-b35 -B build-b35bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-b35bin -j16 --target tilegrad_cli; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 200 ctest --test-dir build-dev -R 'test_(attention|attn_[a-z0-9_]*|causal_attention|micro|hardening|big_offsets)\.(amx|avx512bf16)$' -j16 --timeout 190 > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
gcc -O2 -Iinclude bench/results/xeon16-amx/dkv-units/bitcmp.c -o /tmp/bitcmp -lm -Lbuild-dev -ltilegrad
for isa in amx avx512bf16; do
  LD_LIBRARY_PATH=build-dev /tmp/bitcmp $isa > "$o/bits-new-$isa.txt"
  LD_LIBRARY_PATH=build-b35bin /tmp/bitcmp $isa > "$o/bits-old-$isa.txt"
  echo "$isa: $(wc -l < "$o/bits-new-$isa.txt") lines, differ: $(diff "$o/bits-new-$isa.txt" "$o/bits-old-$isa.txt" | grep '^<' | awk '{print $2}' | sort | uniq -c | tr '\n' ' ')"
done
echo "bits $(( $(date +%s) - t0 )) s"
unset LD_LIBRARY_PATH
S='1,6,2,1024,512,1;1,8,4,1024,256,0;1,8,8,2048,128,1;4,16,16,512,64,1;1,8,8,1024,64,0' LIM=$(( 560 - ($(date +%s) - t0) )) \
  CFGS='base new' THREADS='2 16' PRECS='bf16 exact' ISAS=amx bash bench/results/xeon16-amx/dkv-units/dkv35c.sh
