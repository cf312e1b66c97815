#!/usr/bin/env bash
# Device: the forward, base (build-fwdbase: main before the forward changes)
# against the tree (build-dev, from check.sh), alternating, medians of 3
# per run; then the tree's forward against PyTorch on the users' shapes.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ cmake -S build-fwdbase -B build-fwdbase/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-fwdbase/b -j16 --target tilegrad; } > "$o/build-base.log" 2>&1 || { tail -20 "$o/build-base.log"; exit 1; }
gcc -O2 -fopenmp -Iinclude build-device/fwdbench.c -Lbuild-dev -ltilegrad -lm -o /tmp/fwdb || exit 1
run() { LD_LIBRARY_PATH=$1 /tmp/fwdb $2 | sed 's/.*median \([0-9.]*\) ms.*/\1/'; }
for th in 16 2; do
  for sh in "1 8 2 4096 64 1" "1 6 2 1024 512 1" "1 8 4 1024 256 0" "1 4 4 2560 160 0" "1 16 2 3072 64 1" "1 8 8 2048 96 1" "1 6 2 384 128 0"; do
    for prec in exact bf16; do
      a="$sh 3 $th bf16 $prec"; b=""; n=""
      for r in 1 2 3; do b="$b $(run build-fwdbase/b "$a")"; n="$n $(run build-dev "$a")"; done
      echo "$th thr, $sh, bf16 in, $prec: base$b | new$n"
    done
  done
  a="1 8 2 4096 64 1 3 $th f32 exact"; b=""; n=""
  for r in 1 2 3; do b="$b $(run build-fwdbase/b "$a")"; n="$n $(run build-dev "$a")"; done
  echo "$th thr, 1 8 2 4096 64 1, f32 in, exact: base$b | new$n"
done 2>&1 | tee "$o/fwd-ab.txt"
S='1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0;1,8,2,16384,128,1'
for prec in exact bf16; do
  TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad timeout 200 python3 bench/vs_torch.py --shapes "$S" --threads 16 --reps 3 --forward --precision $prec --json "$o/vs-torch-users-fwd-$prec-16t.json" > "$o/vs-torch-users-fwd-$prec-16t.txt" 2>&1
  echo "== fwd $prec rc=$?"; grep -E '^1,|speedup vs' "$o/vs-torch-users-fwd-$prec-16t.txt"
done
