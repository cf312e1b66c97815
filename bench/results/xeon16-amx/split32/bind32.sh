#!/usr/bin/env bash
# Device: the few-item shapes with the plan's CPU count fixed (build-sc),
# threads bound (OMP_PLACES=cores OMP_PROC_BIND=spread) or not; the split
# overrides TGX_MGU / TGX_MRT; rounds rotate the configurations.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
{ cmake -S build-sc/src -B build-sc/bd -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-sc/bd -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-sc/bd/tilegrad
for r in 1 2 3; do for th in 1 2 16; do for bind in none cores; do for cfg in base mgu2 mrt1mgu1; do for prec in exact bf16; do
  [ $(( $(date +%s) - t0 )) -lt 560 ] || break 5
  case $cfg in base) e="";; mgu2) e="TGX_MGU=2";; mrt1mgu1) e="TGX_MRT=1 TGX_MGU=1";; esac
  [ $bind = cores ] && e="$e OMP_PLACES=cores OMP_PROC_BIND=spread"
  S='1,6,2,384,128,0'; [ $th = 1 ] || S="$S;1,6,2,1024,512,1"
  env $e $B bench --section attn --shapes "$S" --reps 15 --precision $prec --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $bind $cfg $prec', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f'%(x['ms_median'],x['fwd']['ms_median']), d['plan_cpus'])
"
done; done; done; done; done > "$o/bind.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/bind.txt") lines"
python3 - "$o/bind.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  r,th,bd,c,p,s,ms,fw,pc=l.split(); d[(s,p,th,bd,c)].append(float(ms))
for k in sorted(d): print(*k, ' '.join('%.3f'%x for x in d[k]), 'med %.3f'%st.median(d[k]))
PY
