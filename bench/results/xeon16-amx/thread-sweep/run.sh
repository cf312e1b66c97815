#!/usr/bin/env bash
# Device script of this folder: per shape of SS, tilegrad's backward at 1-16
# threads with the plan fixed for 16 CPUs (and for 2 at 1 and 2 threads: the
# plan's extra work), PyTorch's at the same counts, and the FMA peak at 1
# and 16 threads. Everything lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
d=$(dirname "$0")
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF > /tmp/build.log 2>&1 &&
  cmake --build build-dev -j16 >> /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude "$d/sweep.c" -Lbuild-dev -ltilegrad -lm \
  -Wl,-rpath,$PWD/build-dev -o /tmp/sweep || exit 1
SS=${SS:-"2,8,4,1024,256,0 1,8,4,1024,256,0 1,6,2,384,128,0 1,8,8,2048,128,1"}
for th in 1 16; do build-dev/tilegrad bench --threads $th --section peaks 2>&1 | grep -E "FMA peak|AMX|triad"; done | tee "$o/peaks.txt"
for s in $SS; do
  for pr in ${PRECS:-bf16 exact}; do
    /tmp/sweep $pr 16 ${ROUNDS:-5} $s 1 2 4 8 16
    /tmp/sweep $pr 2 ${ROUNDS:-5} $s 1 2
  done
  python3 "$d/torch_sweep.py" ${ROUNDS:-5} $s 1 2 4 8 16
done 2>&1 | tee "$o/sweep.txt"
