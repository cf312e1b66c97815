#!/usr/bin/env bash
# Device, final tree: the backward step against PyTorch bf16 on the users grid
# (bf16
# and exact mode, 2 and 16 threads), then pytest (torch 2.11) while time
# is left.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=${TESTS:-0} && cmake --build build-dev -j16; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
if [ "${TESTS:-0}" = 1 ]; then
  timeout 100 ctest --test-dir build-dev -R 'test_threads\.amx$' -j2 --timeout 95 > "$o/ctest.log" 2>&1
  echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"
fi
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for job in "bf16 2" "exact 2" "bf16 16" "exact 16"; do
  set -- $job; prec=$1 th=$2 fw=${3:-}
  [ $(( $(date +%s) - t0 )) -lt 470 ] || break
  n=vs-torch-$th-$prec-$([ -n "$fw" ] && echo fwd || echo bwd)
  timeout 110 python3 bench/vs_torch.py --shapes "$S" --threads $th --reps 3 --precision $prec --torch-dtypes bf16 $fw > "$o/$n.txt" 2>&1
  echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
done
py=python3
$py -c "import pytest, hypothesis" 2>/dev/null || export PYTHONPATH=$PWD/build-pylibs
left=$(( 580 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so timeout $left $py -m pytest tests/python -q -p no:cacheprovider -x > "$o/pytest.log" 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$o/pytest.log" 2>/dev/null)"
