#!/usr/bin/env bash
# Device: 1 -> 16 thread scaling of the backward step on the users' grid,
# exact mode, with the FMA peak measured at each count (tilegrad bench).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ [ -d build-dev ] || cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF; cmake --build build-dev -j16 --target tilegrad_cli; } > "$o/build.log" 2>&1 || exit 1
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for t in 1 16; do
  build-dev/tilegrad bench --section attn --shapes "$S" --reps 3 --threads $t --precision exact > "$o/scale-exact-${t}t.txt" 2>&1
  echo "== $t threads rc=$?"; grep -E "FMA peak|^[0-9]+ +[0-9]" "$o/scale-exact-${t}t.txt" | head -12
done
