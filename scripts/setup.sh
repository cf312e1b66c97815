#!/usr/bin/env bash
# Installs what tilegrad needs to build, test and benchmark, from Debian's
# packages (idempotent: does nothing when everything is there).
set -euo pipefail
# clang: the Metal twins' host shim (tests/metal) and, with its runtimes
# (libclang-rt-14-dev: libFuzzer, sanitizers; libomp-14-dev: OpenMP with
# Archer for TSan), the fuzzer and race check (fuzz/); libopenblas-dev: the
# training example's matrix products (examples/); python3-venv, -setuptools,
# -wheel: the offline `pip install ./python` check (python/ci_install_check.sh).
# The aarch64 stage (scripts/test_aarch64.sh): the cross gcc (its libgomp comes
# with it), qemu-user, and the target's libraries as Debian's arm64 packages
# (multiarch: the arm64 architecture is added to dpkg): cmocka, libgomp1 and
# OpenBLAS, whose libc6:arm64 is the loader qemu runs the suites with.
pkgs=(cmake make gcc pkg-config libcmocka-dev libopenblas-dev
      clang libclang-rt-14-dev libomp-14-dev
      python3 python3-numpy python3-pytest python3-hypothesis python3-torch
      python3-venv python3-setuptools python3-wheel
      gcc-aarch64-linux-gnu qemu-user libcmocka-dev:arm64 libgomp1:arm64 libopenblas-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
