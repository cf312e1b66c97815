#!/usr/bin/env bash
# Builds tilegrad (Release) and runs the main job: `tilegrad bench` on its
# built-in FA-2 backward shapes. Extra arguments go to `tilegrad bench`
# (e.g. --quick, --threads 1, --json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
exec build/tilegrad bench "$@"
