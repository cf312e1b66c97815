#!/usr/bin/env bash
# Builds tilegrad and runs every test: the C suites (ctest, Release), the same
# suites under AddressSanitizer + UndefinedBehaviorSanitizer, the PyTorch
# oracle and Python package suite (pytest), the pip-install check, a short
# libFuzzer run and the ThreadSanitizer race check. Installs what it needs
# first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

echo "== build (Release) and ctest"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" >/dev/null
(cd build && ctest --output-on-failure)

echo "== build (ASan + UBSan) and ctest"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTG_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure)

echo "== PyTorch oracle and Python package (pytest)"
TILEGRAD_LIB="$PWD/build/libtilegrad.so" /usr/bin/python3 -m pytest tests/python -q

echo "== pip install ./python in a fresh venv, then import it from elsewhere"
bash python/ci_install_check.sh --offline

echo "== libFuzzer: replay fuzz/corpus, then 60 s of fuzzing (fuzz/README.md)"
bash fuzz/run.sh 60

echo "== race check: ThreadSanitizer + Archer over every accumulating kernel"
bash scripts/race_check.sh
