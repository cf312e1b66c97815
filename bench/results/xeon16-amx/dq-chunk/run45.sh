#!/usr/bin/env bash
# Device: conversion micro (conv.c) on the new tree's library, then the
# paired A/B (paired-calls/ab.sh) against build-b40 (2a18ff5) with bits and suites.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ grep -m1 "model name" /proc/cpuinfo; nproc; } > "$o/cpu.txt"
cmake -S . -B build-lib -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF > /tmp/bl.log 2>&1 && cmake --build build-lib -j16 --target tilegrad >> /tmp/bl.log 2>&1 || { tail -20 /tmp/bl.log; exit 1; }
gcc -O2 -mavx512f -mavx512bw -Iinclude -I. -Iisa -Iengine build-device/conv.c -Lbuild-lib -ltilegrad -o /tmp/conv && OMP_NUM_THREADS=1 LD_LIBRARY_PATH=build-lib taskset -c 2 /tmp/conv | tee "$o/conv.txt"
BASE=b40 CTEST_RE='(test_micro|test_attention|test_attn_ext|test_threads|test_causal_attention)\.(amx|avx512bf16)$' bash bench/results/xeon16-amx/paired-calls/ab.sh
