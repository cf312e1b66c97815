"""Builds libtilegrad with CMake and bundles it in the `tilegrad` package.

`pip install ./python` (from the repository root) runs this: the build_py
step configures the repository's CMake project (the parent directory of this
file) in the setuptools build directory, builds only the `tilegrad` shared
library target (tests and CLI off), and copies `libtilegrad.so` and
`tilegrad.h` into `tilegrad/_lib/`.

The sdist carries the library's C sources under `csrc/` (CMakeLists.txt,
cmake/, isa/, engine/, kernels/, include/), so `pip install tilegrad-X.tar.gz`
builds the same way from them, with no repository around it.

The package loads the library with ctypes and has no Python extension
module, so one wheel serves every CPython 3 of a platform: it is tagged
`py3-none-<platform>` (e.g. `py3-none-linux_x86_64`), not `cp311-cp311-...`.

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
from setuptools.command.sdist import sdist as _sdist
from setuptools.dist import Distribution

try:                                    # setuptools >= 70.1 has its own
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:                 # no wheel support: setup.py install only
        _bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# What the library's CMake build needs (TG_BUILD_CLI=OFF, TG_BUILD_TESTS=OFF).
C_SOURCES = ("CMakeLists.txt", "cmake", "isa", "engine", "kernels", "include")
SDIST_CSRC = os.path.join(HERE, "csrc")  # present in an unpacked sdist


def source_root():
    """The CMake project: csrc/ in an unpacked sdist, else the repository."""
    return SDIST_CSRC if os.path.isdir(SDIST_CSRC) else REPO


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
    src = source_root()
    if not os.path.exists(os.path.join(src, "CMakeLists.txt")) or \
            not os.path.exists(os.path.join(src, "include", "tilegrad.h")):
        _fail(f"{src} holds no tilegrad C sources: install from a checkout "
              "(pip install ./python from its root) or from the sdist")
    cmake = shutil.which("cmake")
    if cmake is None:
        _fail("cmake not found on PATH (Debian: apt-get install cmake make gcc)")
    cached = _cached_source(build_dir)
    if cached and os.path.realpath(cached) != os.path.realpath(src):
        shutil.rmtree(build_dir)          # a cache from another source tree
    configure = [cmake, "-S", src, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DTG_BUILD_TESTS=OFF", "-DTG_BUILD_CLI=OFF"] + shlex.split(os.environ.get("TILEGRAD_CMAKE_ARGS", ""))
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
        shutil.copyfile(os.path.join(source_root(), "include", "tilegrad.h"),
                        os.path.join(dest, "tilegrad.h"))


class sdist(_sdist):
    """Adds the library's C sources to the sdist as csrc/."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        src = source_root()
        for name in C_SOURCES:
            path, dest = os.path.join(src, name), os.path.join(base_dir, "csrc", name)
            if os.path.isdir(path):
                shutil.copytree(path, dest, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(path, dest)


commands = {"build_py": build_py, "sdist": sdist}
if _bdist_wheel is not None:
    class bdist_wheel(_bdist_wheel):
        """py3-none-<platform>: ctypes, no extension module, any CPython 3."""

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    commands["bdist_wheel"] = bdist_wheel

setup(cmdclass=commands, distclass=BinaryDistribution)
