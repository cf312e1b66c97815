#!/usr/bin/env bash
# Device: per-item times and CPUs of the backward's main pass (TGQ build).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ cmake -S build-sc/src -B build-sc/bd -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-sc/bd -j16 --target tilegrad_cli; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
B=build-sc/bd/tilegrad
lscpu | grep -iE "^CPU\(s\)|Thread|Core|Socket|Model name|L2|L3" 
for bind in none cores; do for cfg in base mgu2 mrt1mgu1; do for th in 1 16; do for prec in exact bf16; do
  case $cfg in base) e="";; mgu2) e="TGX_MGU=2";; mrt1mgu1) e="TGX_MRT=1 TGX_MGU=1";; esac
  [ $bind = cores ] && e="$e OMP_PLACES=cores OMP_PROC_BIND=spread"
  echo "== $bind $cfg $th $prec"
  env TGQ=1 $e $B bench --section attn --shapes '1,6,2,384,128,0' --reps 20 --precision $prec --threads $th 2>&1 | grep -E "TGQ|^1 " | head -3
done; done; done; done
