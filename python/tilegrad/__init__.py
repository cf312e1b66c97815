"""tilegrad: Metal-style training kernels on CPUs, from Python.

    import numpy as np, tilegrad as tg
    o, lse = tg.flash_attn_train_fwd(q, k, v, causal=True)      # bf16 numpy arrays
    dq, dk, dv = tg.flash_attn_backward(q, k, v, o, lse, do, causal=True)

* :mod:`tilegrad.kernels` -- every kernel of the contract as a numpy function
  (re-exported here);
* :mod:`tilegrad.torch` -- the kernels as ``torch.library`` custom ops
  (``tilegrad::attn_fwd`` ...; PyTorch >= 2.4, autograd Functions on older
  torch), functions and ``nn.Module`` s (attention, RMSNorm); imported on
  first access;
* :mod:`tilegrad.transformers` -- ``attn_implementation="tilegrad"`` for
  Hugging Face transformers (registered on import; needs transformers >= 5);
* :mod:`tilegrad.capi` -- the raw ctypes binding (params structs, Context.call);
* :mod:`tilegrad.bf16` -- bfloat16 helpers (raw uint16 bits / ml_dtypes);
* :mod:`tilegrad.errors` -- the exception per status code.

The shared library is found at first use: ``$TILEGRAD_LIB``, else the copy
bundled by ``pip install``, else ``<repo>/build/libtilegrad.so`` when running
from the source tree.
"""
from . import bf16, errors
from .capi import (Context, Library, LibraryNotFoundError, default_context, find_library,
                   library)
from .errors import (AliasError, BadIndexError, BadParamsError, BadShapeError, BusyError,
                     NoMemoryError, NullArgError, SizeOverflowError, TilegradError,
                     UnsupportedError)
from .kernels import *  # noqa: F401,F403
from .kernels import __all__ as _kernel_names

__version__ = "0.2.1"

f32_to_bf16 = f32_to_bf16_cast  # noqa: F405  (short alias)

__all__ = [
    "Context", "Library", "LibraryNotFoundError", "default_context", "find_library",
    "library", "TilegradError", "NullArgError", "BadShapeError", "UnsupportedError",
    "BadIndexError", "BadParamsError", "SizeOverflowError", "NoMemoryError", "BusyError",
    "AliasError", "bf16",
    "errors", "f32_to_bf16", "__version__",
] + list(_kernel_names)


def __getattr__(name):
    # `tilegrad.torch` / `tilegrad.transformers` without importing torch or
    # transformers at `import tilegrad`
    if name in ("torch", "transformers"):
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'tilegrad' has no attribute {name!r}")
