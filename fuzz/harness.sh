# Sourced by fuzz/run.sh, fuzz/coverage.sh and scripts/race_check.sh.
#
#   tg_build_harness fuzz|race|cov BUILD_DIR
#
# Installs what the harnesses need (scripts/setup.sh: clang,
# libclang-rt-14-dev, libomp-14-dev, cmake) and builds one variant of the
# fuzz/ CMake project with clang into BUILD_DIR.
tg_build_harness() {
  local kind=$1 build=$2
  scripts/setup.sh
  mkdir -p "$build"
  CC=clang cmake -S fuzz -B "$build" -DTG_HARNESS="$kind" >/dev/null 2>"$build/configure.log" ||
    { cat "$build/configure.log" >&2; return 2; }
  if grep -q "does not build with clang" "$build/configure.log"; then
    echo "note: isa/common/ does not build with clang at AVX-512; portable microkernels only"
  fi
  cmake --build "$build" -j"$(nproc)" >/dev/null
}
