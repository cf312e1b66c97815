#!/usr/bin/env bash
# Device: the backward step, base (build-fwdbase) against the tree, exact
# mode (three bf16 parts on amx in the tree) and bf16 mode, alternating.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
S16='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,16,2,3072,64,1'
S2='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1'
for t in ${THREADS:-16 2}; do S=$S16; [ $t = 2 ] && S=$S2
  for pr in ${PRECS:-exact}; do
    timeout ${TMO:-240} bench/ab_compare.sh -n 3 -o /tmp/ab$t$pr build-fwdbase . -- --threads $t --section attn --shapes "$S" --reps 3 --precision $pr > "$o/bwd-ab-$pr-$t.txt" 2>&1
    echo "== $pr $t threads rc=$?"; grep -E '^ *[0-9]|B/A|case' "$o/bwd-ab-$pr-$t.txt" | tail -14
  done
done
