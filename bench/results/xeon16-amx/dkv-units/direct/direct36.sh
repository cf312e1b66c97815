#!/usr/bin/env bash
# Device: dK, dV summed into the output in place (bf16 dot products, query
# group 0; the tree) against HEAD before (build-b36): the attention suites on
# amx and avx512bf16, then step time, rotating rounds.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  cmake -S build-b36 -B build-b36bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-b36bin -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 150 ctest --test-dir build-dev -R 'test_(attention|attn_[a-z0-9_]*|causal_attention|hardening|aliasing)\.(amx|avx512bf16)$' -j16 --timeout 145 > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
unset LD_LIBRARY_PATH
S='1,6,2,1024,512,1;1,8,4,1024,256,0;2,8,4,1024,256,0;1,8,8,2048,128,1;1,8,8,1024,64,0'
t1=$(date +%s)
for r in $(seq 1 20); do for job in "2 bf16" "2 exact" "16 bf16" "16 exact"; do
  set -- $job; th=$1 pr=$2
  for cfg in base new; do
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-400} ] || break 3
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-b36bin/tilegrad
  rm -f /tmp/r.json; $B bench --section attn --shapes "$S" --reps 3 --precision $pr --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $pr $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f'%x['ms_min'])
"
done; done; done > "$o/direct.txt"
echo "bench end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/direct.txt") lines"
python3 - "$o/direct.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
  r,th,p,c,s,v=l.split(); d[(s,p,int(th))].setdefault(r,{})[c]=float(v)
print('shape mode threads (rounds): new/base step, median of per-round ratios [min-over-rounds ratio]')
for k in sorted(d):
  rr=[r for r in d[k] if len(d[k][r])==2]
  if not rr: continue
  rs=[d[k][r]['new']/d[k][r]['base'] for r in rr]
  print(*k,'(%d)'%len(rr),'%.3f [%.3f]'%(st.median(rs),min(d[k][r]['new'] for r in rr)/min(d[k][r]['base'] for r in rr)))
PY
