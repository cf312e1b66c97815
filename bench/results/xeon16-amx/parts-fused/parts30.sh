#!/usr/bin/env bash
# Device: fused parts (mm_bf16_parts) and the forward's q-tiles. Suites on
# the x86 tables with bf16 units; then a rotation of the step and forward
# in exact mode: T0 = build-fwdbase (session start), T05 = build-ab05 (q-tiles),
# T1 = build-prof2 (q-tiles + fused parts; TGX_MIN_D_* overrides the parts' D).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  for d in build-fwdbase build-ab05/src build-prof2/src; do cmake -S $d -B $d/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build $d/b -j16 --target tilegrad_cli || exit 1; done; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 200 ctest --test-dir build-dev -R '(micro|attn_ext|attention|attn_variants).*\.(avx512bf16|amx)$' -j8 --timeout 190 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)|parts GEMM' "$o/ctest.log" | head
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;1,6,2,1024,512,1'
for th in ${THREADS:-16 2}; do for r in 1 2 3; do for cfg in ${CFGS:-T0 T05 T1 T1low}; do
  [ $(( $(date +%s) - t0 )) -lt ${TLIM:-540} ] || break 3
  e=""; B=build-prof2/src/b/tilegrad
  case $cfg in T0) B=build-fwdbase/b/tilegrad;; T05) B=build-ab05/src/b/tilegrad;; T1low) e="TGX_MIN_D_FWD=64 TGX_MIN_D_BWD=128";; esac
  env $e $B bench --section attn --shapes "$S" --reps 3 --precision ${PREC:-exact} --threads $th 2>/dev/null |
    awk -v c=$cfg -v t=$th -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, c, (f?"fwd":"bwd"), $2, $4}'
done; done; done > "$o/rot-${PREC:-exact}.txt"
echo "end $(( $(date +%s) - t0 )) s"
