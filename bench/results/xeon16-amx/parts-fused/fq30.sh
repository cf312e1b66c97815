#!/usr/bin/env bash
# Device: the forward's shared q-tiles. Suites (attention, 3 x86 tables),
# the forward A/B against build-fwdbase (main before), the GEMM's k-blocking
# experiment (build-prof, TGX_KC), then the forward against PyTorch.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
export PKG_CONFIG_PATH=$PWD/build-cmocka/lib/pkgconfig LD_LIBRARY_PATH=$PWD/build-cmocka/lib
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON && cmake --build build-dev -j16 &&
  cmake -S build-fwdbase -B build-fwdbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fwdbase/b -j16 --target tilegrad &&
  cmake -S build-prof/src -B build-prof/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-prof/b -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
timeout 240 ctest --test-dir build-dev -R '(attn|attention).*\.(avx512|avx512bf16|amx)$' -j8 --timeout 230 --output-on-failure > "$o/ctest.log" 2>&1
echo "ctest $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$o/ctest.log")"; grep -E '\((Failed|Timeout)\)' "$o/ctest.log" | head
gcc -O2 -fopenmp -Iinclude build-device/fwdbench.c -Lbuild-dev -ltilegrad -lm -o /tmp/fwdb || exit 1
run() { LD_LIBRARY_PATH=$1 /tmp/fwdb $2 | sed 's/.*median \([0-9.]*\) ms.*/\1/'; }
for th in 16 2; do
  for sh in "1 8 8 1024 64 0" "1 8 8 2048 128 1" "2 8 4 1024 256 0" "4 16 16 512 64 1" "1 6 2 1024 512 1" "1 8 4 1024 256 0" "1 4 4 2560 160 0" "1 16 2 3072 64 1" "1 8 8 2048 96 1"; do
    for prec in exact bf16; do
      a="$sh 3 $th bf16 $prec"; b=""; n=""
      for r in 1 2 3; do b="$b $(run build-fwdbase/b "$a")"; n="$n $(run build-dev "$a")"; done
      echo "$th thr, $sh, bf16 in, $prec: base$b | new$n"
    done
  done
done > "$o/fwd-ab.txt" 2>&1
echo "fwd ab $(( $(date +%s) - t0 )) s"
for th in 1 16; do for r in 1 2; do for kc in 0 64 128; do
  TGX_KC=$kc build-prof/b/tilegrad bench --isa avx512 --section attn --threads $th --reps 3 --precision exact \
    --shapes '1,2,2,1024,128,0;1,2,2,1024,256,0;1,1,1,1024,512,0;1,8,4,1024,256,0' 2>/dev/null |
    awk -v c=$kc -v t=$th -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, "kc" c, (f?"fwd":"bwd"), $2, $4, $7}'
done; done; done > "$o/kc.txt"
echo "kc $(( $(date +%s) - t0 )) s"
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for th in 2 16; do for prec in exact bf16; do
  [ $(( $(date +%s) - t0 )) -lt 470 ] || break
  timeout 110 python3 bench/vs_torch.py --shapes "$S" --threads $th --reps 3 --forward --precision $prec --torch-dtypes bf16 > "$o/vs-torch-$th-$prec-fwd.txt" 2>&1
  echo "== fwd $th $prec rc=$? $(grep -E 'speedup vs' "$o/vs-torch-$th-$prec-fwd.txt")"
done; done
echo "end $(( $(date +%s) - t0 )) s"
