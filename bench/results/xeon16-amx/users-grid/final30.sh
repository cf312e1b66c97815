#!/usr/bin/env bash
# Device: the tree against PyTorch (bf16, the faster dtype on every row of
# the earlier runs here) on the users' shapes and the classic four: backward
# step and forward, exact and bf16 mode, 16 threads; 2 threads without the
# long-context shapes.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ [ -d build-dev ] || cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF; cmake --build build-dev -j16; } > "$o/build.log" 2>&1 || { tail -20 "$o/build.log"; exit 1; }
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
S4='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1'
U='1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
L='1,8,2,16384,128,1'
for t in ${THREADS:-16 2}; do S="$S4;$U"; [ $t = 16 ] && S="$S;$L"
  for pr in ${PRECS:-exact bf16}; do for pass in ${PASSES:-bwd fwd}; do
    f=""; [ $pass = fwd ] && f=--forward
    n=vs-torch-$t-$pr-$pass
    timeout ${TMO:-200} python3 bench/vs_torch.py --shapes "$S" --threads $t --reps 3 --precision $pr --torch-dtypes bf16 $f > "$o/$n.txt" 2>&1
    echo "== $n rc=$?"; grep -E 'speedup vs' "$o/$n.txt"
  done; done
done
