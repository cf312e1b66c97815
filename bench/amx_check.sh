#!/usr/bin/env bash
# The amx table on a machine with AMX-BF16: a Release
# build, every suite's amx run (ctest's <suite>.amx), the tile GEMM against
# f64 through ctypes (bench/amx_kernel_check.py, numpy), the PyTorch
# attention oracle on amx (tests/python, where torch, pytest and hypothesis
# import), the ceilings with the amx table, and avx512 against amx on the
# attention section, alternating (bench/ab_compare.sh).
#
#   [CMOCKA_PREFIX=DIR] [OUT=DIR] [THREADS=N] [ROUNDS=N] [PYTHON=python3] \
#     bench/amx_check.sh
#
# CMOCKA_PREFIX: a cmocka install (DIR/lib/pkgconfig/cmocka.pc) for the
# C suites; unset: no C suites (-DTG_BUILD_TESTS=OFF).
# OUT: where the logs go (default $OUT of the device runner, else
# ./amx-check). THREADS (default all CPUs), ROUNDS (default 3).
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-amx-check}
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
mkdir -p "$out"
rc=0
step() { echo "== $*" | tee -a "$out/summary.txt"; }

{ grep -m1 "model name" /proc/cpuinfo; grep -m1 -o -w -E "amx_bf16|amx_tile" /proc/cpuinfo | sort -u
  uname -r; nproc; } >"$out/cpu.txt" 2>&1
step "cpu: $(head -1 "$out/cpu.txt" | cut -d: -f2-), $(grep -c amx_ "$out/cpu.txt") of 2 AMX flags"

tests=OFF
if [ -n "${CMOCKA_PREFIX:-}" ]; then
  export PKG_CONFIG_PATH=$CMOCKA_PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  tests=ON
fi
if ! { cmake -S . -B build-amx -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=$tests &&
       cmake --build build-amx -j"$(nproc)"; } >"$out/build.log" 2>&1; then
  step "build FAILED (tail of $out/build.log)"; tail -30 "$out/build.log"; exit 1
fi
step "build: $(grep -o 'ISA tables built: .*' "$out/build.log")"
obj=$(find build-amx -path '*isa_amx.dir*' -name 'amx.c.o' | head -1)
step "amx object: $(objdump -d "$obj" | grep -c -E 'tdpbf16ps') tdpbf16ps, $(objdump -d "$obj" | grep -c tileloadd) tileloadd"
TG_ISA=amx build-amx/tilegrad --version >"$out/version.txt" 2>&1
step "TG_ISA=amx tilegrad --version: $(grep -i isa "$out/version.txt" | head -1)"

if [ "$tests" = ON ]; then
  ctest --test-dir build-amx -R '\.amx$' -j"$(nproc)" --output-on-failure >"$out/ctest-amx.log" 2>&1 || rc=1
  step "ctest -R '\\.amx\$': $(grep -E 'tests passed|tests failed' "$out/ctest-amx.log")"
  grep -E '^\s+[0-9]+ - ' "$out/ctest-amx.log" | tee -a "$out/summary.txt" # not passed
fi
if ! grep -q 'isa: amx' "$out/version.txt"; then # the reason, from tg_ctx_set_isa
  step "no amx here: $(build-amx/tilegrad bench --section peaks --isa amx 2>&1 | tail -1)"
  exit 1
fi

py=${PYTHON:-python3}
if "$py" -c "import numpy" 2>/dev/null; then
  "$py" bench/amx_kernel_check.py build-amx/libtilegrad.so amx >"$out/kernel-check.txt" 2>&1 || rc=1
  step "tile GEMM vs f64: $(tail -1 "$out/kernel-check.txt")"
fi
if "$py" -c "import torch, pytest, hypothesis" 2>/dev/null; then
  # TG_ISA=amx falls back to auto where amx is refused: first check that a
  # Python process (faulthandler's sigaltstack, torch loaded) gets it
  got=$(TILEGRAD_LIB=build-amx/libtilegrad.so "$py" -X faulthandler -c 'import sys, torch
sys.path.insert(0, "python"); import tilegrad.capi as c; print(c.Context(isa="amx").isa)' 2>&1)
  step "amx from Python (faulthandler on, torch imported): $(echo "$got" | tail -1)"
  if [ "$(echo "$got" | tail -1)" = amx ]; then
    TILEGRAD_LIB=build-amx/libtilegrad.so TG_ISA=amx "$py" -m pytest -q -p no:cacheprovider \
      tests/python/test_attention_oracle.py >"$out/oracle-amx.txt" 2>&1 || rc=1
    step "attention oracle (PyTorch f64), TG_ISA=amx: $(tail -1 "$out/oracle-amx.txt")"
  else
    rc=1
  fi
fi

build-amx/tilegrad bench --section peaks --isa amx --threads "$threads" >"$out/peaks-amx.txt" 2>&1 || rc=1
step "peaks (amx, $threads threads):"; grep -E 'peak|ceil' "$out/peaks-amx.txt" | tee -a "$out/summary.txt"

ISA_A=avx512 ISA_B=amx bench/ab_compare.sh -n "$rounds" -o "$out/ab-json" . . -- \
  --section attn --threads "$threads" --reps 3 >"$out/ab-avx512-amx.txt" 2>"$out/ab.log" || rc=1
step "avx512 (A) against amx (B), attention, $threads threads:"; tee -a "$out/summary.txt" <"$out/ab-avx512-amx.txt"
step "exit $rc; logs in $out"
exit $rc
