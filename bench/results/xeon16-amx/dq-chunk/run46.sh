#!/usr/bin/env bash
# Device: the transposed split's micro (conv.c) on build-b40 (2a18ff5) and
# the tree, then the paired A/B against build-b45 (ddfc3e4: the dQ change),
# bits and the suites (paired-calls/ab.sh).
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ grep -m1 "model name" /proc/cpuinfo; nproc; } > "$o/cpu.txt"
for t in b40:build-b40 lib:.; do
  n=${t%%:*} src=${t#*:}
  cmake -S $src -B build-conv-$n -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF > /tmp/bl.log 2>&1 && cmake --build build-conv-$n -j16 --target tilegrad >> /tmp/bl.log 2>&1 || { tail -20 /tmp/bl.log; exit 1; }
done
gcc -O2 -mavx512f -mavx512bw -Iinclude -I. -Iisa -Iengine build-device/conv.c -Lbuild-conv-lib -ltilegrad -o /tmp/conv || exit 1
for n in b40 lib b40 lib; do echo "== $n"; LD_LIBRARY_PATH=build-conv-$n taskset -c 3 /tmp/conv; done | tee "$o/conv.txt"
BASE=b45 CTEST_RE='(test_micro|test_attention|test_attn_ext)\.(amx|avx512bf16|avx512)$' bash bench/results/xeon16-amx/paired-calls/ab.sh
