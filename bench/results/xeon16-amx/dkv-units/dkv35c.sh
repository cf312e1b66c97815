#!/usr/bin/env bash
# Device: q rows per dK, dV product (TGX_DKV_ROWS over the tree's build) against
# build-b35 (base: one q unit per product), rotating rounds, step time.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s); LIM=${LIM:-500}
[ -x build-b35bin/tilegrad ] || { cmake -S build-b35 -B build-b35bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-b35bin -j16 --target tilegrad_cli; } > /tmp/bb.log 2>&1 || { tail /tmp/bb.log; exit 1; }
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 --target tilegrad_cli; } > /tmp/bd.log 2>&1 || { tail /tmp/bd.log; exit 1; }
t0=$(date +%s)
S=${S:-'1,6,2,1024,512,1;1,8,4,1024,256,0;1,8,8,2048,128,1;4,16,16,512,64,1;1,8,8,1024,64,0'}
CFGS=${CFGS:-base r128 r256 r512}
for r in 1 2 3 4 5 6 7 8 9 10; do for th in ${THREADS:-2 16}; do for pr in ${PRECS:-bf16 exact}; do for isa in ${ISAS:-amx}; do for cfg in $CFGS; do
  [ $(( $(date +%s) - t0 )) -lt $LIM ] || break 5
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-b35bin/tilegrad
  rm -f /tmp/r.json; TGX_DKV_ROWS=${cfg#r} $B bench --section attn --isa $isa --shapes "$S" --reps ${REPS:-5} --precision $pr --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $pr-$isa $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f %.4f'%(x['ms_median'],x['ms_min'],x['ms_bwd']))
"
done; done; done; done; done > "$o/dkvc.txt"
echo "bench end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/dkvc.txt") lines"
python3 - "$o/dkvc.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
  r,th,p,c,s,*v=l.split(); d[(s,p,int(th))].setdefault(r,{})[c]=float(v[1])
print('shape prec threads: cfg/base step (min of run): median of per-round ratios [min-over-rounds ratio] (rounds)')
for k in sorted(d):
  out=[]
  for c in sorted({c for r in d[k] for c in d[k][r]}-{'base'}):
    rs=[d[k][r][c]/d[k][r]['base'] for r in d[k] if c in d[k][r] and 'base' in d[k][r]]
    if rs: out.append('%s %.3f [%.3f] (%d)'%(c,st.median(rs),min(d[k][r][c] for r in d[k] if c in d[k][r])/min(d[k][r]['base'] for r in d[k] if 'base' in d[k][r]),len(rs)))
  print(*k,' | '.join(out))
PY
