#!/usr/bin/env bash
# Device, final tree: the users' grid against PyTorch bf16 (its faster dtype
# on this AMX Xeon), the backward step in bf16 and exact mode (the forward
# did not change since grid49/), at the thread counts in TH (default "2
# 16"), vs_torch.py --reps REPS (default 5; it alternates the two per rep).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=${TESTS:-OFF} && cmake --build build-dev -j16; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for th in ${TH:-2 16}; do
  for prec in ${PRECS:-bf16 exact}; do
    n=vs-torch-$th-$prec-bwd
    timeout ${LIM:-200} python3 bench/vs_torch.py --shapes "$S" --threads $th --reps ${REPS:-5} --precision $prec --torch-dtypes bf16 > "$o/$n.txt" 2>&1
    echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
  done
done
