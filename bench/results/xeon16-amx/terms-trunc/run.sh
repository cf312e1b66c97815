#!/usr/bin/env bash
# Device script of this folder (2026-11-27, second stop of the day): this
# stop's tree against build-$BASE (a `git archive` of the stop's first
# commit), call by call (bench/ab_calls, PAIRS pairs, JOBS "threads:mode
# ..." on the shapes S); with PLANS="16 8 4" the backward at THREADS_PLAN
# threads with the KV schedule planned for that many CPUs
# (tg_testing_plan_cpus, plan_cpus.c) on the shapes PS; with SCALE=1 the
# step's 1 -> 16 scaling (`tilegrad bench --section attn`, ceilings measured
# at each count; SCALE_ROUNDS rounds); with GRID=1 the users' grid against PyTorch bf16
# (vs_torch.py --reps REPS) in the modes PRECS at the thread counts TH,
# backward step and (FWD=1) forward. LIM: seconds after which no new part
# starts. Everything lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
base=build-${BASE:-b39}
t0=$(date +%s)
left() { [ $(( $(date +%s) - t0 )) -lt ${LIM:-520} ]; }
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 &&
  { [ -z "${JOBS:-}" ] || [ -f ${base}bin/libtilegrad.so ] || { cmake -S $base -B ${base}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build ${base}bin -j16 --target tilegrad; }; }; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
G='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
if [ -n "${JOBS:-}" ]; then
  cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
  for job in $JOBS; do
    th=${job%:*} pr=${job#*:}
    left || break
    /tmp/ab_calls $PWD/${base}bin/libtilegrad.so $PWD/build-dev/libtilegrad.so $th $pr ${PAIRS:-7} "${S:-$G}"
  done | tee -a "$o/ab.txt"
  echo "ab end $(( $(date +%s) - t0 )) s"
fi
if [ -n "${PLANS:-}" ]; then
  d=$(dirname "$0")
  cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude "$d/plan_cpus.c" -Lbuild-dev -ltilegrad -lm \
    -Wl,-rpath,$PWD/build-dev -o /tmp/plan_cpus || exit 1
  for pr in ${PRECS:-bf16 exact}; do
    left || break
    /tmp/plan_cpus ${THREADS_PLAN:-16} $pr ${ROUNDS:-7} "${PS:-$G}" $PLANS
  done | tee -a "$o/plans.txt"
fi
if [ "${SCALE:-0}" = 1 ]; then # SCALE_ROUNDS rounds (suffix -rN after the first)
  for r in $(seq 1 ${SCALE_ROUNDS:-1}); do
    sfx=$([ $r = 1 ] && echo "" || echo "-r$r")
    for pr in ${PRECS:-bf16 exact}; do
      for th in 1 16; do
        left || break
        build-dev/tilegrad bench --threads $th --section attn --precision $pr --shapes "$G" --reps 3 \
          > "$o/scale-$pr-${th}t$sfx.txt" 2>&1
        echo "== scale $pr $th t round $r $(( $(date +%s) - t0 )) s"
      done
    done
  done
fi
[ "${GRID:-0}" = 1 ] || exit 0
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
for th in ${TH:-16}; do
  for prec in ${PRECS:-bf16 exact}; do
    for pass in bwd ${FWD:+fwd}; do
      n=vs-torch-$th-$prec-$pass
      left || break
      timeout 200 python3 bench/vs_torch.py --shapes "${GS:-$G}" --threads $th --reps ${REPS:-7} --precision $prec --torch-dtypes bf16 $( [ $pass = fwd ] && echo --forward) > "$o/$n.txt" 2>&1
      echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
    done
  done
done
