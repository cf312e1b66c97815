#!/usr/bin/env bash
# Device script of this folder: the backward step in one call
# (tg_attn_train_bwd_step, bf16 gradients) against the three calls it
# replaced (xeon2-amx/step_one_call.py, PAIRS pairs, PRECS modes, thread
# counts TH), the torch op's backward against the C step
# (xeon2-amx/op_vs_step.py), and with GRID=1 the users' grid against
# PyTorch bf16 (vs_torch.py --reps REPS, backward). LIM: seconds after which
# no new part starts. Everything lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
left() { [ $(( $(date +%s) - t0 )) -lt ${LIM:-520} ]; }
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16; } \
  > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
G='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
r=bench/results/xeon2-amx
if [ "${STEP:-1}" = 1 ]; then
  for th in ${TH:-16 2}; do
    for prec in ${PRECS:-bf16 exact}; do
      left || break
      python3 $r/step_one_call.py $th ${PAIRS:-15} $prec "${S:-$G}" > "$o/step-one-call-$th-$prec.txt" 2>&1
      echo "== step $th $prec $(( $(date +%s) - t0 )) s"
    done
    left || break
    python3 $r/op_vs_step.py $th ${PAIRS:-15} "${S:-$G}" > "$o/op-vs-step-$th.txt" 2>&1
    echo "== op $th $(( $(date +%s) - t0 )) s"
  done
fi
[ "${GRID:-0}" = 1 ] || exit 0
for th in ${TH:-16 2}; do
  for prec in ${PRECS:-bf16 exact}; do
    n=vs-torch-$th-$prec-bwd
    left || break
    timeout 200 python3 bench/vs_torch.py --shapes "${GS:-$G}" --threads $th --reps ${REPS:-15} --precision $prec --torch-dtypes bf16 > "$o/$n.txt" 2>&1
    echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
  done
done
