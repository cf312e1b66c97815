#!/usr/bin/env bash
# Device script of this folder: which of the lease's 16 CPUs share a core?
# The VM says one thread per core; the AMX unit and the FMA ports are a
# physical core's, so two vCPUs that are one core's hyperthreads share them.
# `tilegrad bench --section peaks` with 2 threads pinned (OMP_PLACES) to
# CPU A and CPU B for A in $AS and every B; then 8 threads on CPUs 0-7 and
# on the even ones, 16 and 1; then the backward step of SHAPE at 2 threads
# on the pairs with CPU 0 of the lowest and the highest AMX peak (or
# PAIRS_STEP). Lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16; } \
  > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
tg=$PWD/build-dev/tilegrad
{ lscpu; for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename $c) core_id=$(cat $c/topology/core_id 2>/dev/null) siblings=$(cat $c/topology/thread_siblings_list 2>/dev/null)"; done
  grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -x -E 'ht|hypervisor' ; } > "$o/topology.txt" 2>&1
peaks() { # places threads -> "FMA AMX" GFLOP/s
  OMP_PLACES="$1" OMP_PROC_BIND=true $tg bench --section peaks --threads $2 --triad-mib 8 2>&1 |
    awk '/f32 FMA peak/{f=$4} /AMX bf16 peak/{a=$4} END{print f, a}'
}
{
echo "places threads FMA_GFLOPs AMX_GFLOPs"
echo "{0} 1 $(peaks '{0}' 1)"
for a in ${AS:-0 1}; do
  for b in $(seq 0 15); do [ $a = $b ] && continue; echo "{$a},{$b} 2 $(peaks "{$a},{$b}" 2)"; done
done
echo "0-7 8 $(peaks '{0}:8' 8)"
echo "even 8 $(peaks '{0}:8:2' 8)"
echo "all 16 $(peaks '{0}:16' 16)"
} > "$o/peaks-pinned.txt"
cat "$o/peaks-pinned.txt"
# the pairs with CPU 0 of the lowest and the highest AMX peak, unless given
lo_hi=$(awk '$1 ~ /^[{]0[}],/ {print $4, $1}' "$o/peaks-pinned.txt" | sort -n | sed -n '1p;$p' | awk '{print $2}')
for pl in ${PAIRS_STEP:-$lo_hi}; do
  for prec in bf16 exact; do
    OMP_PLACES="$pl" OMP_PROC_BIND=true $tg bench --section attn --threads 2 --reps 5 --precision $prec \
      --shapes "${SHAPE:-1,8,4,1024,256,0}" > "$o/step-$prec-$(echo $pl | tr -d '{}' | tr ',' '-').txt" 2>&1
  done
done
