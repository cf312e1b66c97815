#!/usr/bin/env bash
# A/B: main (.) against the query-group tree (build-perf29), alternating.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
S16='1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,2,16384,128,1'
S2='1,6,2,1024,512,1;1,8,4,1024,256,0;1,16,2,3072,64,1'
for t in ${THREADS:-16 2}; do S=$S16; [ $t = 2 ] && S=$S2
  for pr in ${PRECS:-exact bf16}; do
  timeout ${TMO:-280} bench/ab_compare.sh -n 3 -o /tmp/ab$t$pr . build-perf29 -- --threads $t --section attn --shapes "$S" --reps 3 --precision $pr > "$o/ab29-$pr-$t.txt" 2>&1
  echo "== $pr $t threads rc=$?"; grep -E '^ *[0-9]|B/A|case' "$o/ab29-$pr-$t.txt" | tail -14
done; done
