#!/usr/bin/env bash
# Device: the tree (new: + the backward's row bands) and build-f37 (fwd:
# the forward's P straight to its bf16 parts) against build-b37 (c79c26b): bits (bitcmp.c, amx and avx512bf16), the micro and
# attention suites, then rotating rounds of step and forward time.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  for x in b37 f37; do [ -x build-${x}bin/tilegrad ] || { cmake -S build-$x -B build-${x}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-${x}bin -j16 --target tilegrad_cli tilegrad; } || exit 1; done; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
S=${S:-'1,8,8,1024,64,0;1,8,8,2048,128,1;1,8,4,1024,256,0;1,6,2,1024,512,1'}
for r in $(seq 1 20); do for job in "2 bf16" "2 exact" "16 bf16"; do
  set -- $job; th=$1 pr=$2
  for cfg in base fwd new; do
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-330} ] || break 3
  B=build-dev/tilegrad; [ $cfg = base ] && B=build-b37bin/tilegrad; [ $cfg = fwd ] && B=build-f37bin/tilegrad
  rm -f /tmp/r.json; $B bench --section attn --isa amx --shapes "$S" --reps 3 --precision $pr --threads $th --json /tmp/r.json >/dev/null 2>&1
  python3 -c "
import json;d=json.load(open('/tmp/r.json'))
for x in d['attention_bwd']['results']:
  print('$r $th $pr $cfg', '%d,%d,%d,%d,%d,%d'%(x['B'],x['H'],x['Hkv'],x['qL'],x['D'],x['causal']), '%.4f %.4f'%(x['ms_min'],min(x['fwd'].get('ms_min',1e9),x['fwd']['ms_median'])))
"
done; done; done > "$o/ab.txt"
echo "bench end $(( $(date +%s) - t0 )) s, $(wc -l < "$o/ab.txt") lines"
python3 build-device/abstat.py "$o/ab.txt" | tee "$o/ab-summary.txt"
for cfg in b37bin f37bin dev; do
  gcc -O2 -Iinclude build-device/bitcmp.c -Lbuild-$cfg -ltilegrad -lm -o /tmp/bitcmp-$cfg || exit 1
  for isa in amx avx512bf16; do LD_LIBRARY_PATH=build-$cfg:$LD_LIBRARY_PATH /tmp/bitcmp-$cfg $isa > "$o/bits-$cfg-$isa.txt"; done
done
for isa in amx avx512bf16; do for c in f37bin dev; do echo "bits $isa $c: $(diff "$o/bits-b37bin-$isa.txt" "$o/bits-$c-$isa.txt" | grep -c '^>') of $(wc -l < "$o/bits-$c-$isa.txt") lines differ from the base"; done; done
ctest --test-dir build-dev -R '(test_micro|test_attention|test_attn_ext)\.(amx|avx512bf16)$' -j8 --timeout 200 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"
