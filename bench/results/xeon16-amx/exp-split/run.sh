#!/usr/bin/env bash
# Device: this stop's tree against build-$BASE (a `git archive` of the commit
# before the stop), call by call (bench/ab_calls, PAIRS pairs, JOBS
# "threads:mode ..." on the shapes S), then, with GRID=1, the users' grid
# against PyTorch bf16 (vs_torch.py --reps REPS) in the modes PRECS at the
# thread counts TH, backward step and (FWD=1) forward.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
base=build-${BASE:-b82}
t0=$(date +%s)
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 &&
  { [ -z "${JOBS:-}" ] || [ -f ${base}bin/libtilegrad.so ] || { cmake -S $base -B ${base}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build ${base}bin -j16 --target tilegrad; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
G='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for job in ${JOBS:-}; do
  th=${job%:*} pr=${job#*:}
  [ $(( $(date +%s) - t0 )) -lt ${LIM:-500} ] || break
  /tmp/ab_calls $PWD/${base}bin/libtilegrad.so $PWD/build-dev/libtilegrad.so $th $pr ${PAIRS:-7} "${S:-$G}"
done | tee "$o/ab.txt"
echo "ab end $(( $(date +%s) - t0 )) s"
[ "${GRID:-0}" = 1 ] || exit 0
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
for th in ${TH:-16}; do
  for prec in ${PRECS:-bf16 exact}; do
    for pass in bwd ${FWD:+fwd}; do
      n=vs-torch-$th-$prec-$pass
      [ $(( $(date +%s) - t0 )) -lt ${LIM:-500} ] || break
      timeout 200 python3 bench/vs_torch.py --shapes "${GS:-$G}" --threads $th --reps ${REPS:-7} --precision $prec --torch-dtypes bf16 $( [ $pass = fwd ] && echo --forward) > "$o/$n.txt" 2>&1
      echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
    done
  done
done
