#!/usr/bin/env bash
# Device: exact mode's three parts in the backward from D 64 (build-x52)
# against from D 128 (build-b53 = HEAD), paired calls.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
for n in b53 x52; do
  cmake -S build-$n -B build-l-$n -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF > /tmp/bl.log 2>&1 && cmake --build build-l-$n -j16 --target tilegrad >> /tmp/bl.log 2>&1 || { tail -20 /tmp/bl.log; exit 1; }
done
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
S='1,8,8,1024,64,0;4,16,16,512,64,1;1,16,2,3072,64,1;1,8,8,2048,96,1'
for job in 2:exact 16:exact; do /tmp/ab_calls $PWD/build-l-b53/libtilegrad.so $PWD/build-l-x52/libtilegrad.so ${job%:*} ${job#*:} 13 "$S"; done | tee "$o/ab53.txt"
