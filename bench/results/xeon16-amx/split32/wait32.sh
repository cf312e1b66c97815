#!/usr/bin/env bash
# Device: the step's fixed costs at 16 threads on small shapes under
# OpenMP's wait policies (build-fbase = this stop's code), rotating, 4 rounds.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
{ cmake -S build-fbase -B build-fbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fbase/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-fbase/b/tilegrad
for r in 1 2 3 4; do for th in 16 2; do for prec in exact bf16; do for wp in default active passive; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break 4
  e=""; [ $wp = default ] || e="OMP_WAIT_POLICY=$wp"
  env $e $B bench --section attn --shapes '1,6,2,384,128,0;4,16,16,512,64,1;1,8,8,1024,64,0' --reps 20 --precision $prec --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $prec $wp', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f %.4f %.4f %.4f'%(x['ms_median'],x['ms_bwd'],x['ms_compute_d'],x['ms_casts'],x['fwd']['ms_median']))
"
done; done; done; done > "$o/wait.txt"
echo "end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/wait.txt") lines"
python3 - "$o/wait.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  r,th,p,wp,s,*v=l.split(); d[(s,p,th,wp)].append([float(x) for x in v])
print('shape prec threads policy: medians of step bwd compute_d casts fwd (ms)')
for k in sorted(d): print(*k, ' '.join('%.3f'%st.median(x[i] for x in d[k]) for i in range(5)))
PY
