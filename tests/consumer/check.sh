#!/usr/bin/env bash
# Installs tilegrad into a temporary prefix and builds tests/consumer/main.c
# against it both ways a C user would, then runs each build:
#   1. CMake: find_package(tilegrad CONFIG REQUIRED) -> tilegrad::tilegrad
#   2. pkg-config: gcc main.c -o app $(pkg-config --cflags --libs tilegrad)
# The commands are the ones README.md's "Ways in" gives. TG_CONSUMER_KEEP=1
# keeps the temporary directory. Needs cmake, gcc, pkg-config (scripts/setup.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/tg-consumer.XXXXXX")"
[ "${TG_CONSUMER_KEEP:-0}" = 1 ] || trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
jobs=$(nproc)

echo "-- install tilegrad into $prefix"
cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build "$tmp/build" -j"$jobs" >/dev/null
cmake --install "$tmp/build" --prefix "$prefix" >/dev/null

# what the install holds, and nothing test-only
for f in include/tilegrad.h lib/libtilegrad.so lib/cmake/tilegrad/tilegradConfig.cmake \
         lib/cmake/tilegrad/tilegradConfigVersion.cmake lib/cmake/tilegrad/tilegradTargets.cmake \
         lib/pkgconfig/tilegrad.pc; do
  [ -e "$prefix/$f" ] || { echo "check.sh: missing $prefix/$f" >&2; exit 1; }
done
soname=$(objdump -p "$prefix/lib/libtilegrad.so" | awk '/SONAME/ {print $2}')
[ -e "$prefix/lib/$soname" ] || { echo "check.sh: missing SONAME link lib/$soname" >&2; exit 1; }
if [ -e "$prefix/include/tilegrad_testing.h" ]; then
  echo "check.sh: test-only header installed" >&2; exit 1
fi

# the installed CLI finds the installed library by its rpath ($ORIGIN/../lib)
if [ -x "$prefix/bin/tilegrad" ]; then
  v=$(env -u LD_LIBRARY_PATH "$prefix/bin/tilegrad" --version | head -1)
  [ "$v" = "tilegrad $(pkg-config --modversion "$prefix/lib/pkgconfig/tilegrad.pc")" ] ||
    { echo "check.sh: installed CLI says '$v'" >&2; exit 1; }
  echo "$v (installed CLI)"
fi

echo "-- 1. CMake package: find_package(tilegrad CONFIG REQUIRED)"
want=$(sed -n 's/^#define TG_VERSION_\(MAJOR\|MINOR\) \([0-9]*\)$/\2/p' "$src/include/tilegrad.h" | paste -sd.)
cmake -S "$here" -B "$tmp/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" -DTG_WANT_VERSION="$want" >/dev/null
cmake --build "$tmp/consumer-cmake" >/dev/null
"$tmp/consumer-cmake/consumer"   # CMake sets the build tree's rpath to the prefix

echo "-- 2. pkg-config: gcc main.c -o app \$(pkg-config --cflags --libs tilegrad)"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[ "$(pkg-config --modversion tilegrad)" = "$(sed -n 's/^Version: //p' "$prefix/lib/pkgconfig/tilegrad.pc")" ]
# shellcheck disable=SC2046
gcc "$here/main.c" -o "$tmp/consumer-pc" $(pkg-config --cflags --libs tilegrad)
LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer-pc"

echo "-- install: both consumers ok"
