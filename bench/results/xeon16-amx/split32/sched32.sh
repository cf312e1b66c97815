#!/usr/bin/env bash
# Device: the backward's work split on few-item shapes (TGX_MGU min q units
# per group, TGX_MRT min key tiles per range; build-sc: HEAD + the override
# patch), 1 and 16 threads, exact and bf16 mode, configurations rotating.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
{ cmake -S build-sc/src -B build-sc/bd -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-sc/bd -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-sc/bd/tilegrad
S16='1,6,2,384,128,0;1,6,2,1024,512,1'; S1='1,6,2,384,128,0'
for r in 1 2 3 4; do for th in 16 1; do for prec in exact bf16; do for cfg in base mgu2 mgu1 mrt2 mrt1mgu1; do
  [ $(( $(date +%s) - t0 )) -lt 540 ] || break 4
  case $cfg in base) e="";; mgu2) e="TGX_MGU=2";; mgu1) e="TGX_MGU=1";; mrt2) e="TGX_MRT=2";; mrt1mgu1) e="TGX_MRT=1 TGX_MGU=1";; esac
  env $e $B bench --section attn --shapes "$([ $th = 1 ] && echo $S1 || echo $S16)" --reps 15 --precision $prec --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json,sys;d=json.load(open('/tmp/r.json'));pk=d['peaks']
fma=[pk['fma_f32_gflops']]
for x in d['attention_bwd']['results']:
  print('$r $th $prec $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f %.4f %.4f %.4f'%(x['ms_median'],x['ms_bwd'],x['ms_compute_d'],x['ms_casts'],x['fwd']['ms_median']), fma[:1])
"
done; done; done; done > "$o/sched.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/sched.txt") lines"
python3 - "$o/sched.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  f=l.split(); d[(f[1],f[2],f[3],f[4])].append(float(f[5]))
for k in sorted(d): print(*k, 'med %.3f'%st.median(d[k]), len(d[k]))
PY
