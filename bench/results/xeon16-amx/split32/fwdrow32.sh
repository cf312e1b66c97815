#!/usr/bin/env bash
# Device: the forward alone (fwdbench), P's bf16 parts converted row by row
# (the tree) against the whole tile after the softmax (build-fbase: HEAD
# before), alternating processes, 8 rounds; exact D 64 is the control (its
# products stay f32: no conversion).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 --target tilegrad &&
  cmake -S build-fbase -B build-fbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fbase/b -j16 --target tilegrad; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
for c in new base; do L=build-dev; [ $c = base ] && L=build-fbase/b
  gcc -O2 -fopenmp -Iinclude bench/results/xeon16-amx/exact-parts/fwdbench.c -L$L -Wl,-rpath,$PWD/$L -ltilegrad -lm -o /tmp/fwdb-$c || exit 1; done
for r in 1 2 3 4 5 6 7 8; do for th in 16 2; do for pr in exact bf16; do for s in 1,8,8,1024,64,0 1,8,8,2048,128,1 1,4,4,2560,160,0 2,8,4,1024,256,0 1,6,2,384,128,0; do for c in base new; do
  [ $(( $(date +%s) - t0 )) -lt 560 ] || break 5
  /tmp/fwdb-$c ${s//,/ } 20 $th b $pr | awk -v r=$r -v c=$c -v p=$pr '{print r, c, p, $2, $4, $6, $9}'
done; done; done; done; done > "$o/fwdrow.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/fwdrow.txt") lines"
python3 - "$o/fwdrow.txt" <<'PY'
import sys,collections,statistics as st
d={}
for l in open(sys.argv[1]):
  r,c,p,s,th,med,mn=l.split(); d[(r,c,p,s,th)]=(float(med),float(mn))
for i,name in ((0,'median'),(1,'min')):
  rat=collections.defaultdict(list)
  for (r,c,p,s,th),v in d.items():
    if c=='new' and (r,'base',p,s,th) in d: rat[(p,th,s)].append(v[i]/d[(r,'base',p,s,th)][i])
  print('== new/base of each round\'s', name)
  for k in sorted(rat): print(*k, ' '.join('%.2f'%x for x in sorted(rat[k])), 'med %.3f'%st.median(rat[k]))
PY
