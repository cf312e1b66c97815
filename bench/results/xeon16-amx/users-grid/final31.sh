#!/usr/bin/env bash
# Device: every amx suite and the attention suites on avx512bf16 (the tree),
# pytest on the auto table, then the tree against PyTorch bf16 on the users'
# grid (exact mode: backward step and forward; 16 and 2 threads).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
if [ "${MODE:-check}" = check ]; then
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 260 ctest --test-dir build-dev -R '(\.amx$|(micro|attn|attention).*\.avx512bf16$)' -j12 --timeout 250 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
if ! python3 -c "import pytest, hypothesis" 2>/dev/null; then export PYTHONPATH=$PWD/build-pylibs; fi
TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TG_REQUIRE_CUSTOM_OPS=1 timeout 200 python3 -m pytest tests/python -q -p no:cacheprovider -x > "$o/pytest.log" 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$o/pytest.log")"
exit 0
fi
[ -x build-dev/tilegrad ] || { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j; } > /tmp/build.log 2>&1 || exit 1
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for th in 16 2; do for pass in bwd fwd; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break 2
  f=""; [ $pass = fwd ] && f=--forward
  n=vs-torch-$th-${PREC:-exact}-$pass
  timeout 120 python3 bench/vs_torch.py --shapes "$S" --threads $th --reps 3 --precision ${PREC:-exact} --torch-dtypes bf16 $f > "$o/$n.txt" 2>&1
  echo "== $n rc=$? $(grep -E 'speedup vs' "$o/$n.txt")"
done; done
echo "end $(( $(date +%s) - t0 )) s"
