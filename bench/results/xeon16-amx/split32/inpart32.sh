#!/usr/bin/env bash
# Device: dK, dV written by their first product and the query groups' parts
# summed in place (the tree) against HEAD before (build-fbase): the amx and
# avx512bf16 attention suites (SUITES=0: left out), then step times
# rotating, ROUNDS rounds (6) at each of THREADS ("16 2"). The second run
# of inpart-run2.txt: SUITES=0 ROUNDS=10 THREADS=2.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  cmake -S build-fbase -B build-fbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fbase/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
[ "${SUITES:-1}" = 0 ] || timeout 200 ctest --test-dir build-dev -R '(micro|attn|attention|causal).*\.(amx|avx512bf16)$' -j12 --timeout 190 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
S='1,6,2,1024,512,1;2,8,4,1024,256,0;1,8,4,1024,256,0;1,4,4,2560,160,0;1,8,8,2048,128,1;1,6,2,384,128,0'
for r in $(seq "${ROUNDS:-6}"); do for th in ${THREADS:-16 2}; do for pr in bf16 exact; do for cfg in base new; do
  [ $(( $(date +%s) - t0 )) -lt 560 ] || break 4
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-fbase/b/tilegrad
  $B bench --section attn --shapes "$S" --reps 3 --precision $pr --threads $th 2>/dev/null |
    awk -v c=$cfg -v t=$th -v r=$r -v p=$pr '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{if(!f) print t, r, p, c, $2, $4, $5}'
done; done; done; done > "$o/inpart.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/inpart.txt") lines"
python3 - "$o/inpart.txt" <<'PY'
import sys,collections,statistics as st
d={}
for l in open(sys.argv[1]):
  t,r,p,c,s,med,mn=l.split(); d[(t,r,p,c,s)]=(float(med),float(mn))
for i,name in ((0,'median'),(1,'min')):
  rat=collections.defaultdict(list)
  for (t,r,p,c,s),v in d.items():
    if c=='new' and (t,r,p,'base',s) in d: rat[(p,t,s)].append(v[i]/d[(t,r,p,'base',s)][i])
  print("== new/base, each round's", name)
  for k in sorted(rat): print(*k, ' '.join('%.2f'%x for x in sorted(rat[k])), 'med %.3f'%st.median(rat[k]))
PY
