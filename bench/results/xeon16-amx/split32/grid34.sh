#!/usr/bin/env bash
# Device: the backward step against PyTorch bf16 on the users' grid, bf16
# and exact mode, 16 and 2 threads (final31.sh's bench part, backward only).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for prec in bf16 exact; do for th in 2 16; do
  n=vs-torch-$th-$prec-bwd
  timeout 125 python3 bench/vs_torch.py --shapes "$S" --threads $th --reps 3 --precision $prec --torch-dtypes bf16 > "$o/$n.txt" 2>&1
  echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
done; done
