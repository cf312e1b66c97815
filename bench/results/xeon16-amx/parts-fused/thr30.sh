#!/usr/bin/env bash
# Device: with fused parts, where three parts pay (TGX_MIN_D_*), and the
# forward's q-tiles (TGX_FQ=1 against the default 2): one binary
# (build-prof2), configurations rotating in each round, exact mode.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
{ cmake -S build-prof2/src -B build-prof2/src/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-prof2/src/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-prof2/src/b/tilegrad
S='1,8,8,1024,64,0;4,16,16,512,64,1;1,16,2,3072,64,1;1,8,8,2048,96,1;1,8,8,2048,128,1;1,6,2,384,128,0;1,4,4,2560,160,0;2,8,4,1024,256,0;1,6,2,1024,512,1'
for th in 2 16; do for r in 1 2 3 4 5; do for cfg in base bwd128 all64 fq1; do
  [ $(( $(date +%s) - t0 )) -lt 560 ] || break 3
  case $cfg in base) e="";; bwd128) e="TGX_MIN_D_BWD=128";; all64) e="TGX_MIN_D_FWD=64 TGX_MIN_D_BWD=64";; fq1) e="TGX_FQ=1";; esac
  env $e $B bench --section attn --shapes "$S" --reps 3 --precision exact --threads $th 2>/dev/null |
    awk -v c=$cfg -v t=$th -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, c, (f?"fwd":"bwd"), $2, $4}'
done; done; done > "$o/thr.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/thr.txt") lines"
