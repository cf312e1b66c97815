"""pytest configuration for the PyTorch-autograd oracle suite.

* Imports the `tilegrad` package from the source tree (<repo>/python is put
  first on sys.path, so an installed copy does not shadow it) and loads the
  library it finds: $TILEGRAD_LIB, else <repo>/build/libtilegrad.so.
* Skips the whole suite (with a clear message) only when torch is not
  importable (the test modules also guard their top-level torch import with
  pytest.importorskip); a missing library is a hard error, not a skip.
* Hypothesis profiles: "ci" (default; derandomized, no deadline) and
  "explore" (random draws). Select with HYPOTHESIS_PROFILE=explore; the test
  modules scale their per-test example counts by TG_ORACLE_EXAMPLES (default
  1, e.g. 10 for a longer bug hunt). Neither profile writes an example
  database (.hypothesis/) into the working tree; a failure prints the
  @reproduce_failure blob instead.
"""
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_PYPKG = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "python")
if _PYPKG not in sys.path:
    sys.path.insert(0, _PYPKG)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
    _TORCH_ERR = ""
except Exception as e:  # pragma: no cover - depends on the machine
    HAVE_TORCH = False
    _TORCH_ERR = f"{type(e).__name__}: {e}"

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", deadline=None, derandomize=True, print_blob=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile(
        "explore", deadline=None, derandomize=False, print_blob=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass


def _lib_path():
    from tilegrad import capi
    paths = capi.candidate_paths()
    return next((p for p in paths if os.path.exists(p)), paths[-1])


def pytest_report_header(config):
    import tilegrad
    lines = [f"tilegrad package: {os.path.dirname(tilegrad.__file__)}",
             f"tilegrad library: {_lib_path()}"]
    if not HAVE_TORCH:
        lines.append(f"torch not importable ({_TORCH_ERR}): the oracle suite is skipped")
    return lines


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    skip = pytest.mark.skip(reason=f"torch is not importable ({_TORCH_ERR})")
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def lib():
    """The package's process-wide tilegrad.capi.Library (the one the array
    functions and the torch wrappers use too)."""
    from tilegrad import capi
    path = _lib_path()
    if not os.path.exists(path):
        pytest.fail(f"tilegrad library not found at {path}: build it "
                    "(cmake -S . -B build && cmake --build build) or set TILEGRAD_LIB")
    lib = capi.library()
    assert os.path.samefile(lib.path, path), (lib.path, path)
    return lib


@pytest.fixture(scope="session")
def ctx_factory(lib):
    """ctx_factory(threads, deterministic=False, isa=None) -> a cached tg_ctx.
    isa: None / TG_ISA_AUTO = the best the CPU has, TG_ISA_PORTABLE = the
    plain-C microkernels (the tests draw both, so each path meets the oracle)."""
    from tilegrad import Context
    cache = {}

    def make(threads=None, deterministic=False, isa=None):
        key = (threads, deterministic, isa)
        if key not in cache:
            cache[key] = Context(threads=threads, deterministic=deterministic, isa=isa, lib=lib)
        return cache[key]

    yield make
    for c in cache.values():
        c.close()



def pytest_sessionstart(session):
    """TG_REQUIRE_CUSTOM_OPS=1 (the CI step on the PyPI torch): fail at once
    unless torch imports and tilegrad.torch registered its torch.library
    custom ops, so the compile/export/opcheck tests cannot be skipped
    silently. TG_TORCH_VIA_OPS=1 (with it): eager calls go through the
    custom ops too, not the autograd Functions that skip the dispatcher
    (tilegrad._torch_paths._direct), so the suite covers both paths."""
    if os.environ.get("TG_REQUIRE_CUSTOM_OPS") != "1":
        return
    if not HAVE_TORCH:
        pytest.exit(f"TG_REQUIRE_CUSTOM_OPS=1 but torch is not importable ({_TORCH_ERR})",
                    returncode=3)
    import tilegrad.torch as tt
    if not tt.HAVE_CUSTOM_OPS:
        pytest.exit(f"TG_REQUIRE_CUSTOM_OPS=1 but torch {tt.torch.__version__} has no "
                    "torch.library.custom_op (needs >= 2.4)", returncode=3)
    if os.environ.get("TG_TORCH_VIA_OPS") == "1":
        import tilegrad._torch_paths as paths
        paths._CAN_GO_DIRECT = False


@pytest.fixture
def float32_default_dtype():
    """The oracle modules set torch's default dtype to float64 at import; the
    torch-front tests build float32 modules and tensors (they use this
    fixture through pytestmark)."""
    import torch
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(old)


def bf16_randn(*shape, seed=0, rg=False):
    """A seeded standard-normal bf16 tensor (requires grad if rg)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_(rg)

