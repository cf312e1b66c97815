#!/usr/bin/env bash
# Device: the tree (forward key tiles by packed bytes + dK/dV over q units)
# against build-b35, rotating rounds: step and forward times; amx (bf16,
# exact) at 2 and 16 threads, avx512bf16 (bf16, split) at 2. Then the suites.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  { [ -x build-b35bin/tilegrad ] || { cmake -S build-b35 -B build-b35bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-b35bin -j16 --target tilegrad_cli; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
S='1,6,2,1024,512,1;1,8,4,1024,256,0;1,8,8,2048,128,1;2,8,4,1024,256,0;1,8,8,1024,64,0'
for r in 1 2 3 4 5 6 7 8 9 10; do for job in "2 bf16 amx" "2 exact amx" "16 bf16 amx" "16 exact amx" "2 bf16 avx512bf16" "2 split avx512bf16"; do
  set -- $job; th=$1 pr=$2 isa=$3
  for cfg in base new; do
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-420} ] || break 3
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-b35bin/tilegrad
  rm -f /tmp/r.json; $B bench --section attn --isa $isa --shapes "$S" --reps 5 --precision $pr --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $pr-$isa $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f'%(x['ms_min'],min(x['fwd'].get('ms_min',1e9),x['fwd']['ms_median'])))
"
done; done; done > "$o/fwd.txt"
echo "bench end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/fwd.txt") lines"
python3 - "$o/fwd.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
  r,th,p,c,s,a,f=l.split(); d[(s,p,int(th))].setdefault(r,{})[c]=(float(a),float(f))
print('shape mode threads: new/base, medians of per-round ratios [min-over-rounds ratio] (rounds): step | forward')
for k in sorted(d):
  rr=[r for r in d[k] if len(d[k][r])==2]
  if not rr: continue
  out=[]
  for i in (0,1):
    rs=[d[k][r]['new'][i]/d[k][r]['base'][i] for r in rr]
    out.append('%.3f [%.3f]'%(st.median(rs),min(d[k][r]['new'][i] for r in rr)/min(d[k][r]['base'][i] for r in rr)))
  print(*k,'(%d)'%len(rr),' | '.join(out))
PY
timeout 150 ctest --test-dir build-dev -R 'test_(attention|attn_[a-z0-9_]*|causal_attention|micro)\.(amx|avx512bf16)$' -j16 --timeout 140 > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
