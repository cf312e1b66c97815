#!/usr/bin/env bash
# Device: the backward step's tiles at D >= 256 (temporary XBQ / XBK
# overrides), one build, rotating, exact mode.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ [ -d build-dev ] || cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF; cmake --build build-dev -j16 --target tilegrad_cli; } > /dev/null 2>&1 || exit 1
S='2,8,4,1024,256,0;1,6,2,1024,512,1;1,4,4,2048,512,0'
for t in 1 16; do
  for r in 1 2 3; do
    for cfg in 64x64 64x32 32x32 32x64; do
      q=${cfg%x*}; k=${cfg#*x}
      XBQ=$q XBK=$k build-dev/tilegrad bench --section attn --shapes "$S" --reps 3 --precision exact --threads $t 2>/dev/null |
        awk -v c=$cfg -v t=$t -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{if(!f) print t, r, c, $2, $4, $6}'
    done
  done
done | tee "$o/xbk.txt"
