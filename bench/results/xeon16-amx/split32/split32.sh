#!/usr/bin/env bash
# Device: the backward's work split on the users' grid (TGX_MRT min key
# tiles per range, TGX_MGU min q units per group; build-sc = HEAD + the
# override patch), 2 and 16 threads, exact and bf16 mode, rotating configs.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
{ cmake -S build-sc/src -B build-sc/bd -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-sc/bd -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-sc/bd/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for r in 1 2 3; do for th in 16 2; do for prec in exact bf16; do for cfg in base mrt2 mgu2 mrt2mgu2; do
  [ $(( $(date +%s) - t0 )) -lt 570 ] || break 4
  case $cfg in base) e="";; mgu2) e="TGX_MGU=2";; mrt2) e="TGX_MRT=2";; mrt2mgu2) e="TGX_MRT=2 TGX_MGU=2";; esac
  env $e $B bench --section attn --shapes "$S" --reps 3 --precision $prec --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $prec $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f'%(x['ms_median'],x['fwd']['ms_median']))
"
done; done; done; done > "$o/split.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/split.txt") lines"
python3 - "$o/split.txt" <<'PY'
import sys,collections,statistics as st
d={}
for l in open(sys.argv[1]):
  r,th,p,c,s,ms,_=l.split(); d[(r,th,p,c,s)]=float(ms)
rat=collections.defaultdict(list)
for (r,th,p,c,s),v in d.items():
  b=d.get((r,th,p,'base',s))
  if c!='base' and b: rat[(th,p,c,s)].append(v/b)
for k in sorted(rat): print(*k, ' '.join('%.2f'%x for x in sorted(rat[k])), 'med %.2f'%st.median(rat[k]))
PY
