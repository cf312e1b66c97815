#!/usr/bin/env bash
# Device: the forward's exp row writing P's bf16 parts. Suites (amx,
# avx512bf16), then step and forward, base (build-fbase: the commit before)
# against the tree, rotating, 5 rounds, exact and bf16 mode.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  cmake -S build-fbase -B build-fbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fbase/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 200 ctest --test-dir build-dev -R '(micro|attn|attention|causal).*\.(amx|avx512bf16)$' -j12 --timeout 190 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;1,6,2,1024,512,1;1,4,4,2560,160,0'
for th in 2 16; do for r in 1 2 3 4 5; do for pr in exact bf16; do for cfg in base new; do
  [ $(( $(date +%s) - t0 )) -lt 560 ] || break 4
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-fbase/b/tilegrad
  $B bench --section attn --shapes "$S" --reps 3 --precision $pr --threads $th 2>/dev/null |
    awk -v c=$cfg -v t=$th -v r=$r -v p=$pr '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, p, c, (f?"fwd":"bwd"), $2, $4}'
done; done; done; done > "$o/fexp.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/fexp.txt") lines"
