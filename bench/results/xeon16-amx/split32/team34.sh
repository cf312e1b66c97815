#!/usr/bin/env bash
# Device: libgomp's cost of changing the team size (teams.c), then the
# dispatch with one team size (the tree) against HEAD before (build-fbase2)
# on small shapes, step parts, rotating; then the amx suites.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
gcc -O2 -fopenmp bench/results/xeon16-amx/split32/teams.c -o /tmp/teams && /tmp/teams && /tmp/teams
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  cmake -S build-fbase2 -B build-fbase2/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fbase2/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
S='1,6,2,384,128,0;4,16,16,512,64,1;1,8,8,1024,64,0;1,6,2,1024,512,1'
for r in 1 2 3 4; do for th in 16 2; do for pr in bf16 exact; do for cfg in base new; do
  [ $(( $(date +%s) - t0 )) -lt 380 ] || break 4
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-fbase2/b/tilegrad
  $B bench --section attn --shapes "$S" --reps 10 --precision $pr --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $pr $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f %.4f %.4f %.4f %.4f'%(x['ms_median'],x['ms_min'],x['ms_bwd'],x['ms_compute_d'],x['ms_casts'],x['fwd']['ms_median']))
"
done; done; done; done > "$o/team.txt"
echo "bench end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/team.txt") lines"
python3 - "$o/team.txt" <<'PY'
import sys,collections,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
  r,th,p,c,s,*v=l.split(); d[(s,p,th,c)].append([float(x) for x in v])
print('shape prec threads cfg: medians over rounds of step(med) step(min) bwd compute_d casts fwd; min over rounds of step(min)')
for k in sorted(d): print(*k, ' '.join('%.3f'%st.median(x[i] for x in d[k]) for i in range(6)), ' min %.3f'%min(x[1] for x in d[k]))
PY
timeout 150 ctest --test-dir build-dev -R '\.amx$' -j12 --timeout 140 > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
