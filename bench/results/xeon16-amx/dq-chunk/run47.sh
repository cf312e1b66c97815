#!/usr/bin/env bash
# Device: dQ over the chunk (the tree) against build-b40 (2a18ff5), and
# against build-x47 (the same, bf16-dot products fused from D 128 only).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
for t in b40:build-b40 dev:. x47:build-x47; do
  n=${t%%:*} src=${t#*:}
  cmake -S $src -B build-l-$n -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF > /tmp/bl.log 2>&1 && cmake --build build-l-$n -j16 --target tilegrad >> /tmp/bl.log 2>&1 || { tail -20 /tmp/bl.log; exit 1; }
done
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude bench/ab_calls/ab_calls.c -ldl -lm -o /tmp/ab_calls || exit 1
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
C='1,16,2,3072,64,1;1,8,8,2048,96,1;4,16,16,512,64,1;1,8,8,1024,64,0'
{ for job in 2:bf16 16:bf16 2:exact; do /tmp/ab_calls $PWD/build-l-b40/libtilegrad.so $PWD/build-l-dev/libtilegrad.so ${job%:*} ${job#*:} 13 "$S"; done
  echo "== A = dev, B = x47 (bf16-dot fused from D 128)"
  for job in 2:bf16 16:bf16; do /tmp/ab_calls $PWD/build-l-dev/libtilegrad.so $PWD/build-l-x47/libtilegrad.so ${job%:*} ${job#*:} 15 "$C"; done; } | tee "$o/ab47.txt"
