#!/usr/bin/env bash
# Device: the users' shapes against PyTorch, backward step and forward, 16 threads, exact mode.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build -j16 --target tilegrad; } > "$o/build.log" 2>&1 || { tail -30 "$o/build.log"; exit 1; }
S='1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0;1,8,2,16384,128,1'
for mode in bwd fwd; do f=""; [ $mode = fwd ] && f=--forward
  timeout 170 python3 bench/vs_torch.py --shapes "$S" --threads 16 --reps 3 $f --json "$o/vs-torch-users-$mode-16t.json" > "$o/vs-torch-users-$mode-16t.txt" 2>&1
  echo "== $mode rc=$?"; grep -E '^1,|speedup vs' "$o/vs-torch-users-$mode-16t.txt"
done
