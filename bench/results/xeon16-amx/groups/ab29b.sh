#!/usr/bin/env bash
# A/B/C: main, query groups to 4 items per CPU (build-perf29), to 2 (build-perf29b).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
S='1,6,2,1024,512,1;1,16,2,3072,64,1;1,8,4,1024,256,0'
for t in 2 16; do for pr in bf16 exact; do
  timeout 120 bench/ab_compare.sh -n 3 -o /tmp/abc$t$pr build-perf29 build-perf29b -- --threads $t --section attn --shapes "$S" --reps 3 --precision $pr > "$o/ab29b-$pr-$t.txt" 2>&1
  echo "== $pr $t (A = 4/cpu, B = 2/cpu) rc=$?"; grep -E '^bwd' "$o/ab29b-$pr-$t.txt"
done; done
