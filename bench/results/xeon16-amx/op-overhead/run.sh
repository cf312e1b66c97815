#!/usr/bin/env bash
# Device script of this folder: what tilegrad.torch.attention costs around
# its kernels on the lease. Before / after: ../../xeon2-amx/attention_call.py
# with the package of the tree before (BASE_PY, a `git archive REV python`
# carried in an ignored folder) and this tree's, alternating processes
# (ROUNDS), one library; the two paths of this tree beside SDPA
# (op_overhead.py); with GRID=1 the users' grid through the op
# (vs_torch.py --via-op, bf16 mode). TH: thread counts. LIM: seconds after
# which no new part starts. Everything lands in $OUT.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
t0=$(date +%s)
left() { [ $(( $(date +%s) - t0 )) -lt ${LIM:-500} ]; }
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16; } \
  > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "built $(( $(date +%s) - t0 )) s"
export TILEGRAD_LIB=$PWD/build-dev/libtilegrad.so TILEGRAD_CLI=$PWD/build-dev/tilegrad
r=bench/results/xeon2-amx
S=${S:-'1,1,1,16,64,1;1,8,8,128,64,1;1,8,2,256,128,0;1,6,2,384,128,0;1,8,8,1024,64,0;1,8,4,1024,256,0'}
for th in ${TH:-16 2}; do
  for i in $(seq ${ROUNDS:-3}); do
    left || break
    for tree in "${BASE_PY:-build-b43}" .; do
      echo "== $tree" >> "$o/ab-call-$th.txt"
      PYTHONPATH=$tree/python python3 $r/attention_call.py $th ${PAIRS:-21} "$S" >> "$o/ab-call-$th.txt" 2>&1
    done
  done
  echo "== ab $th $(( $(date +%s) - t0 )) s"
  left || break
  PYTHONPATH=python python3 $r/op_overhead.py $th ${PAIRS:-21} "$S" > "$o/op-overhead-$th.txt" 2>&1
  echo "== paths $th $(( $(date +%s) - t0 )) s"
done
[ "${GRID:-0}" = 1 ] || exit 0
G='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for th in ${TH:-16 2}; do
  left || break
  n=vs-torch-$th-bf16-bwd-via-op
  timeout 200 python3 bench/vs_torch.py --shapes "${GS:-$G}" --threads $th --reps ${REPS:-11} --precision bf16 --torch-dtypes bf16 --via-op > "$o/$n.txt" 2>&1
  echo "== $n rc=$? $(( $(date +%s) - t0 )) s $(grep -E 'speedup vs' "$o/$n.txt")"
done
