# Cross build for aarch64 Linux with Debian's cross gcc (gcc-aarch64-linux-gnu,
# its libgomp comes with it), tests run under qemu-user (scripts/test_aarch64.sh):
#
#   cmake -S . -B build-aarch64 --toolchain cmake/toolchain-aarch64-linux-gnu.cmake
#         [-DTG_QEMU_CPU=max|cortex-a72|...]
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

# ctest runs every test executable under qemu-aarch64 with the CPU model
# TG_QEMU_CPU: `max` has FEAT_BF16 (the neonbf16 table runs), `cortex-a72`
# has none (the predicate must say no and the neonbf16 suites skip).
# The programs run on the arm64 packages' own loader and libraries
# (libc6:arm64, libgomp1:arm64, libcmocka0:arm64 under /lib/aarch64-linux-gnu),
# not with `-L /usr/aarch64-linux-gnu`: that takes the cross toolchain's
# ld.so (glibc 2.36-8cross1 in bookworm) but the multiarch libc.so.6 that
# libcmocka0:arm64 brings (2.36-9+deb12u*), and with the two builds mixed
# pthread_create never returns.
set(TG_QEMU_CPU max CACHE STRING "qemu-aarch64 -cpu model the tests run on")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -cpu ${TG_QEMU_CPU})
