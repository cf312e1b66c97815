#!/usr/bin/env bash
# Device: query groups of 1+ units aiming at 2 (v5) or 1 (v6) items per CPU q units against the
# tree's 4 (build-b38 = c79c26b), call by call (bench/ab_calls), at 1, 2 and
# 16 threads, bf16 and exact mode, on the few-item shapes and a control.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
t0=$(date +%s)
for x in b38 v5 v6; do [ -f build-${x}bin/libtilegrad.so ] || { cmake -S build-$x -B build-${x}bin -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-${x}bin -j16 --target tilegrad; } > /tmp/build-$x.log 2>&1 || { tail -20 /tmp/build-$x.log; exit 1; }; done
echo "built $(( $(date +%s) - t0 )) s"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
S=${S:-'1,6,2,384,128,0;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;4,16,16,512,64,1'}
for job in ${JOBS:-"16:bf16" "16:exact" "2:bf16" "2:exact" }; do
  th=${job%:*} pr=${job#*:}
  for v in v5 v6; do
    [ $(( $(date +%s) - t0 )) -lt ${LIM:-540} ] || break 2
    echo "== $v threads $th $pr"
    /tmp/ab_calls $PWD/build-b38bin/libtilegrad.so $PWD/build-${v}bin/libtilegrad.so $th $pr ${PAIRS:-9} "$S" | grep -v "^[AB] = \|^threads"
  done
done | tee "$o/groups.txt"
echo "end $(( $(date +%s) - t0 )) s"
