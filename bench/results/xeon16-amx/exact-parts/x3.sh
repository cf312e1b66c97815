#!/usr/bin/env bash
# Device: exact mode, three bf16 parts in forward / backward on or off
# (temporary NOX3F / NOX3B overrides), one build, rotating, 4 rounds.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
cmake --build build-dev -j16 --target tilegrad_cli > /dev/null 2>&1 || exit 1
S16='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,16,2,3072,64,1'
for t in 16 2; do
  S=$S16; [ $t = 2 ] && S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;1,6,2,1024,512,1'
  for r in 1 2 3 4; do
    for cfg in both fwdonly none; do
      case $cfg in both) e="";; fwdonly) e="NOX3B=1";; none) e="NOX3B=1 NOX3F=1";; esac
      env $e build-dev/tilegrad bench --section attn --shapes "$S" --reps 3 --precision exact --threads $t 2>/dev/null |
        awk -v c=$cfg -v t=$t -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, c, (f?"fwd":"bwd"), $2, $4}'
    done
  done
done | tee "$o/x3.txt"
