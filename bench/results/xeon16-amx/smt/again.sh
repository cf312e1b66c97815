#!/usr/bin/env bash
# Device script: run.sh's question again on a warm lease. The peaks at 1
# and 2 threads unpinned, REPEAT times each, then the 2-thread sweep with
# CPU 0 twice more (pinned inside the VM), to see whether the fast pairs
# stay fast. Lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
[ -x build-dev/tilegrad ] || { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF &&
  cmake --build build-dev -j16; } > /tmp/build.log 2>&1
tg=$PWD/build-dev/tilegrad
peaks() { # threads [places] -> "FMA AMX" GFLOP/s
  OMP_PLACES="${2:-}" OMP_PROC_BIND=${2:+true} $tg bench --section peaks --threads $1 --triad-mib 8 2>&1 |
    awk '/f32 FMA peak/{f=$4} /AMX bf16 peak/{a=$4} END{print f, a}'
}
{
echo "run places threads FMA_GFLOPs AMX_GFLOPs"
for i in $(seq ${REPEAT:-8}); do echo "$i unpinned 1 $(peaks 1)"; echo "$i unpinned 2 $(peaks 2)"; done
for r in 1 2; do
  for b in $(seq 1 15); do echo "$r {0},{$b} 2 $(peaks 2 "{0},{$b}")"; done
done
} > "$o/peaks-again.txt"
cat "$o/peaks-again.txt"
