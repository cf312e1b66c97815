#!/usr/bin/env bash
# Device (not landed: the pass before, qdo-pass.patch of 4ea59ee's tree
# applied to 91aa118):
# the tree (dK^T up to D 128, with Q^T and dO^T made by a pass before the
# backward's items) and the same with dK^T at every D, each against
# build-$BASE: b54 (2f33746) in ab-qdo-pass-vs-2f33746.txt, b55 (91aa118,
# the landed tree) in ab-qdo-pass-padded-vs-91aa118.txt (with the columns
# padded by 32), then bits and suites of the second unless CHECK=0.
set -u
O=${OUT:-/tmp/out}
OUT=$O/t128 BASE=${BASE:-b55} JOBS="${J1:-2:bf16 16:bf16 2:exact}" PAIRS=9 CHECK=0 bash bench/results/xeon16-amx/paired-calls/ab.sh 2>&1 | grep -v "^A =\|^B ="
sed -i 's/TG_ATTN_DKV_T_MAX_D = 128 /TG_ATTN_DKV_T_MAX_D = 1 << 20 /' isa/tuning.h
grep -c "TG_ATTN_DKV_T_MAX_D = 1 << 20" isa/tuning.h
OUT=$O/tall BASE=${BASE:-b55} JOBS="${J2:-2:bf16 16:bf16 2:exact}" PAIRS=9 CTEST_RE='(test_micro|test_attention|test_attn_ext|test_threads|test_causal|test_hardening)\.(amx|avx512bf16)$' bash bench/results/xeon16-amx/paired-calls/ab.sh 2>&1 | grep -v "^A =\|^B ="
