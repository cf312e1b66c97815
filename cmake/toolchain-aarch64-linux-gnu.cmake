# Cross build for aarch64 Linux with Debian's cross gcc (gcc-aarch64-linux-gnu,
# its libgomp comes with it), tests run under qemu-user (scripts/test_aarch64.sh):
#
#   cmake -S . -B build-aarch64 --toolchain cmake/toolchain-aarch64-linux-gnu.cmake
#
# Libraries for the target (cmocka for the tests, OpenBLAS for the training
# example) are Debian's arm64 packages (dpkg --add-architecture arm64;
# libcmocka-dev:arm64), installed multiarch under /usr/lib/aarch64-linux-gnu;
# pkg-config looks only there.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Headers and libraries of the target only: the cross toolchain's own root
# and the multiarch directories of the arm64 packages (/usr/include is shared
# by all architectures; /usr/lib/x86_64-linux-gnu is never searched).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# ctest runs every test executable under qemu-aarch64, each table's suites on
# a CPU model of its own (tests/CMakeLists.txt passes it as qemu's QEMU_CPU):
# portable and neon on cortex-a72 (Armv8.0-A, no FEAT_BF16: neon must not
# need it), neonbf16 on max (qemu's every feature, FEAT_BF16 among them)
# without pointer authentication: qemu computes its cipher in software, and
# with it the neonbf16 suites ran 3x slower (test_attention 106 s against
# 36 s); nothing here depends on it.
# The programs run on the arm64 packages' own loader and libraries
# (libc6:arm64, libgomp1:arm64, libcmocka0:arm64 under /lib/aarch64-linux-gnu),
# not with `-L /usr/aarch64-linux-gnu`: that takes the cross toolchain's
# ld.so (glibc 2.36-8cross1 in bookworm) but the multiarch libc.so.6 that
# libcmocka0:arm64 brings (2.36-9+deb12u*), and with the two builds mixed
# pthread_create never returns.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
set(TG_QEMU_CPU_portable cortex-a72)
set(TG_QEMU_CPU_neon cortex-a72)
set(TG_QEMU_CPU_neonbf16 max,pauth=off)
