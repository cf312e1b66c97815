#!/usr/bin/env bash
# Builds the library and the CLI (Release) and runs the main job: `tilegrad
# bench` on its built-in FA-2 backward shapes. Installs only what that needs
# (scripts/setup.sh bench: cmake, make, gcc); the test suites are not built.
# Extra arguments go to `tilegrad bench` (e.g. --quick, --threads 1,
# --json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh bench
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target tilegrad_cli >/dev/null
exec build/tilegrad bench "$@"
