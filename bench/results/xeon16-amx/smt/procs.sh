#!/usr/bin/env bash
# Device script: N one-thread processes at once, each pinned (taskset) to
# its own vCPU, each measuring its own peaks (`tilegrad bench --section
# peaks --threads 1`): does one process's AMX slow down when another
# process runs AMX on another vCPU (the hardware or the host), or only
# inside one OpenMP team? For N in $NS, REPEAT rounds each. Lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
[ -x build-dev/tilegrad ] || { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF &&
  cmake --build build-dev -j16; } > /tmp/build.log 2>&1
tg=$PWD/build-dev/tilegrad
{
echo "N round cpu FMA_GFLOPs AMX_GFLOPs"
for n in ${NS:-1 2 4 8 16}; do
  for r in $(seq ${REPEAT:-3}); do
    for c in $(seq 0 $((n - 1))); do
      cpu=$(( c * 16 / n ))
      ( taskset -c $cpu $tg bench --section peaks --threads 1 --triad-mib 8 2>&1 |
          awk -v n=$n -v r=$r -v c=$cpu '/f32 FMA peak/{f=$4} /AMX bf16 peak/{a=$4} END{print n, r, c, f, a}' ) > /tmp/p.$c &
    done
    wait
    cat /tmp/p.* ; rm -f /tmp/p.*
  done
done
} > "$o/peaks-procs.txt"
cat "$o/peaks-procs.txt"
