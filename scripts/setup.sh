#!/usr/bin/env bash
# Installs what tilegrad needs from Debian's packages; idempotent (does
# nothing when everything is there).
#
#   scripts/setup.sh bench   what `tilegrad bench` needs: cmake, make, gcc
#                            (libgomp comes with it). scripts/bench.sh.
#   scripts/setup.sh test    (the default) everything scripts/test.sh runs:
#                            the bench's packages and the rest below.
#
# The test packages: cmocka (the C suites), pkg-config (cmocka and the
# installed-package consumer check), OpenBLAS (the training example's matrix
# products, examples/); clang with its runtimes (libclang-rt-14-dev:
# libFuzzer, sanitizers; libomp-14-dev: OpenMP with Archer for TSan) for the
# Metal twins' host shim (tests/metal), the fuzzer and the race check (fuzz/);
# python3 with numpy, pytest, hypothesis and torch (the PyTorch oracle,
# tests/python), -venv, -setuptools, -wheel (the offline `pip install
# ./python` check, python/ci_install_check.sh). The aarch64 stage
# (scripts/test_aarch64.sh): the cross gcc (its libgomp comes with it) and
# its C library (only a Recommends of the cross gcc, so named here),
# qemu-user, and the target's libraries as Debian's arm64 packages
# (multiarch: the arm64 architecture is added to dpkg): cmocka, libgomp1 and
# OpenBLAS, whose libc6:arm64 is the loader qemu runs the suites with.
set -euo pipefail
mode="${1:-test}"
bench_pkgs=(cmake make gcc libc6-dev)
test_pkgs=(pkg-config libcmocka-dev libopenblas-dev
           clang libclang-rt-14-dev libomp-14-dev
           python3 python3-numpy python3-pytest python3-hypothesis python3-torch
           python3-venv python3-setuptools python3-wheel
           gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libcmocka-dev:arm64 libgomp1:arm64
           libopenblas-dev:arm64)
case "$mode" in
  bench) pkgs=("${bench_pkgs[@]}") ;;
  test) pkgs=("${bench_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: scripts/setup.sh [bench|test]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ "$mode" = test ]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
