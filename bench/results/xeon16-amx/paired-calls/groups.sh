#!/usr/bin/env bash
# Device: query-group variants against the tree in build-$BASE, call by
# call (bench/ab_calls), bf16 and exact mode at the threads of JOBS, on the
# few-item shapes and a control (S). Each variant v of VARIANTS is a tree
# in build-$v: the base with one edit of isa/tuning.h or plan_qgroups.
# Runs of this section:
#   group-units-2-1.txt:  BASE=b37 (c79c26b) VARIANTS="v1 v2": TG_ATTN_MIN_GROUP_UNITS 2, 1
#   group-units-8-16.txt: BASE=b37 VARIANTS="v3 v4": 8, 16; JOBS without 1 thread
#   group-items-per-cpu.txt: BASE=b38 (37b43ab) VARIANTS="v5 v6": minimum 1 unit,
#                         plan_qgroups' want = 2 resp. 1 items per CPU; all ten shapes
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
for x in ${BASE:?} ${VARIANTS:?}; do [ -f build-${x}bin/libtilegrad.so ] || { cmake -S build-$x -B build-${x}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-${x}bin -j16 --target tilegrad; } > /tmp/build-$x.log 2>&1 || { tail -20 /tmp/build-$x.log; exit 1; }; done
echo "built $(( $(date +%s) - t0 )) s"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
S=${S:-'1,6,2,384,128,0;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;4,16,16,512,64,1'}
for job in ${JOBS:-"16:bf16" "16:exact" "2:bf16" "2:exact" "1:bf16" "1:exact"}; do
  th=${job%:*} pr=${job#*:}
  for v in $VARIANTS; do
    [ $(( $(date +%s) - t0 )) -lt ${LIM:-540} ] || break 2
    echo "== $v threads $th $pr"
    /tmp/ab_calls $PWD/build-${BASE}bin/libtilegrad.so $PWD/build-${v}bin/libtilegrad.so $th $pr ${PAIRS:-9} "$S" | grep -v "^[AB] = \|^threads"
  done
done | tee "$o/groups.txt"
echo "end $(( $(date +%s) - t0 )) s"
