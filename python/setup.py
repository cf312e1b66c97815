"""Builds libtilegrad with CMake and bundles it in the `tilegrad` package.

`pip install ./python` (from the repository root) runs this: the build_py
step configures the repository's CMake project (the parent directory of this
file) in the setuptools build directory, builds only the `tilegrad` shared
library target (tests and CLI off), and copies `libtilegrad.so` and
`tilegrad.h` into `tilegrad/_lib/`. The wheel is tagged for the platform.

Needs: cmake >= 3.18, a C11 compiler with OpenMP (gcc + libgomp). Optional
environment variables at install time (none is required):
  TILEGRAD_CMAKE_ARGS          extra arguments for the cmake configure step
  CMAKE_BUILD_PARALLEL_LEVEL   build jobs (default: the CPU count)
  TILEGRAD_PREBUILT_LIB        bundle this already built libtilegrad.so
                               instead of running cmake
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BinaryDistribution(Distribution):
    """The package carries a native library: a platform wheel, not 'any'."""

    def has_ext_modules(self):
        return True


def _fail(msg):
    sys.stderr.write(f"\ntilegrad setup: {msg}\n\n")
    raise SystemExit(1)


def _cached_source(build_dir):
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    with open(cache, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return line.split("=", 1)[1].strip()
    return None


def build_library(build_dir):
    """Configure + build the `tilegrad` target; returns the library's path."""
    if not os.path.exists(os.path.join(REPO, "CMakeLists.txt")) or \
            not os.path.exists(os.path.join(REPO, "include", "tilegrad.h")):
        _fail(f"{REPO} is not the tilegrad repository: install from a checkout "
              "(pip install ./python from its root)")
    cmake = shutil.which("cmake")
    if cmake is None:
        _fail("cmake not found on PATH (Debian: apt-get install cmake make gcc)")
    cached = _cached_source(build_dir)
    if cached and os.path.realpath(cached) != os.path.realpath(REPO):
        shutil.rmtree(build_dir)          # a cache from another checkout
    configure = [cmake, "-S", REPO, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DTG_BUILD_TESTS=OFF"] + shlex.split(os.environ.get("TILEGRAD_CMAKE_ARGS", ""))
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    build = [cmake, "--build", build_dir, "--target", "tilegrad", "--parallel", jobs]
    for cmd in (configure, build):
        print("tilegrad setup:", " ".join(shlex.quote(c) for c in cmd), flush=True)
        try:
            subprocess.check_call(cmd)
        except subprocess.CalledProcessError as e:
            _fail(f"the CMake build failed ({e}); it needs a C11 compiler with "
                  "OpenMP (Debian: apt-get install gcc make cmake)")
    lib = os.path.join(build_dir, "libtilegrad.so")
    if not os.path.exists(lib):
        _fail(f"CMake did not produce {lib}")
    return os.path.realpath(lib)


class build_py(_build_py):
    def run(self):
        super().run()
        if self.dry_run:
            return
        lib = os.environ.get("TILEGRAD_PREBUILT_LIB")
        if lib:
            if not os.path.exists(lib):
                _fail(f"TILEGRAD_PREBUILT_LIB={lib} does not exist")
            lib = os.path.realpath(lib)
        else:
            build_temp = os.path.abspath(self.get_finalized_command("build").build_temp)
            lib = build_library(os.path.join(build_temp, "cmake"))
        # editable installs import from the source tree: put the library there
        root = HERE if getattr(self, "editable_mode", False) else self.build_lib
        dest = os.path.join(root, "tilegrad", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, "libtilegrad.so"))
        shutil.copyfile(os.path.join(REPO, "include", "tilegrad.h"),
                        os.path.join(dest, "tilegrad.h"))


setup(cmdclass={"build_py": build_py}, distclass=BinaryDistribution)
