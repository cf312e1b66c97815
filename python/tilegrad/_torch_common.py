"""What :mod:`tilegrad.torch` and :mod:`tilegrad.ring` share to call the C
library on torch tensors: this thread's contexts, tensor pointers and
strides, the attention params struct of tensor views, the attention dtypes,
and the checks of the ``threads=`` and ``attn_precision=`` arguments.

Both modules import this one and neither imports the other's internals
(tilegrad.torch re-exports tilegrad.ring's public names).
"""
import ctypes
import threading
from typing import Optional, Tuple

import torch

from . import capi as _capi

Tensor = torch.Tensor

#: the dtypes the attention ops take (the C library's tg_dtype)
_ATTN_DTYPES = {torch.bfloat16: _capi.TG_DTYPE_BF16, torch.float32: _capi.TG_DTYPE_F32}

#: attn_precision= values (the C library's tg_attn_precision, by name): how
#: the products taking the attention weights P or the score gradient dS run
#: when the compute dtype is bf16 (ignored for float32).
ATTN_PRECISIONS = ("exact", "split", "bf16")


# ---------------------------------------------------------------------------
# contexts: one per (calling thread, deterministic flag), created lazily, so
# nothing that holds a ctypes handle is ever stored in a module or a graph

_tls = threading.local()


def _context(threads: int, deterministic: bool,
             attn_precision: Optional[int] = None) -> "_capi.Context":
    """This thread's Context for ``deterministic``, set to ``threads`` threads
    (0: follow ``torch.get_num_threads()``, read at each call) and, unless
    None, to the ``tg_attn_precision`` value ``attn_precision`` (the
    attention ops pass theirs on every call; the others leave it as is)."""
    cache = getattr(_tls, "ctxs", None)
    if cache is None:
        cache = _tls.ctxs = {}
    entry = cache.get(bool(deterministic))
    if entry is None:       # [context, its precision mode: library default exact]
        entry = cache[bool(deterministic)] = [
            _capi.Context(deterministic=bool(deterministic)), _capi.TG_ATTN_PRECISION_EXACT]
    c = entry[0]
    n = threads if threads > 0 else torch.get_num_threads()
    if c.threads != n:
        c.threads = n                       # one cheap ctypes call, only on change
    if attn_precision is not None and entry[1] != attn_precision:
        c.attn_precision = attn_precision   # likewise
        entry[1] = attn_precision
    return c


# ---------------------------------------------------------------------------
# tensors as the C kernels take them

def _ptr(t: Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _bhl_strides(t: Tensor) -> Tuple[int, int, int]:
    """(batch, head, row) element strides of a 4-D tensor the kernels take
    in place (innermost stride 1)."""
    return t.stride()[:3]


def _inner_unit(t: Tensor) -> Tensor:
    """``t`` itself when its innermost stride is 1 (or that dim has size <= 1),
    else a contiguous copy: the kernels need unit stride along D / keys."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _attn_params(q: Tensor, k: Tensor, v: Tensor, o_strides, scale: float, softcap: float,
                 q_offset: int) -> "_capi.AttnParams":
    """The 160-byte params struct for these views (O_strides: the output's
    in the forward, dO's in the backward); the C kernel validates it."""
    B, H, qL, D = q.shape
    Hkv, kL = k.shape[1], k.shape[2]
    p = _capi.attn_params(B, H, Hkv, qL, kL, D, float(scale), float(softcap),
                          Q_strides=_bhl_strides(q), K_strides=_bhl_strides(k),
                          V_strides=_bhl_strides(v), O_strides=o_strides)
    p.qL_off = int(q_offset)
    return p


# ---------------------------------------------------------------------------
# argument checks (plain Python: traced by Dynamo without breaks)

def _threads_arg(threads: Optional[int]) -> int:
    if threads is None:
        return 0
    if int(threads) < 0:
        raise ValueError(f"threads must be None (follow torch.get_num_threads()) or >= 1, "
                         f"got {threads}")
    return int(threads)


def _attn_precision_arg(attn_precision: str) -> int:
    """attn_precision= name -> the ops' tg_attn_precision value."""
    if attn_precision not in ATTN_PRECISIONS:
        raise ValueError(f"attn_precision must be one of {ATTN_PRECISIONS}, "
                         f"got {attn_precision!r}")
    return _capi.ATTN_PRECISION_NAMES[attn_precision]


def _window_arg(window: Optional[int]) -> int:
    """window= (None: no window; W >= 1: key k visible to query i iff
    k > i + q_offset - W) -> the ops' window (0 = none)."""
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be None or an int >= 1, got {window!r}")
    if not 1 <= window < 2 ** 32:
        raise ValueError(f"window must be None (no window) or an int in [1, 2^32): the W "
                         f"keys up to the diagonal; got {window}")
    return window


def _sinks_arg(sinks: Optional[Tensor], H: int) -> Optional[Tensor]:
    """sinks= (None, or a floating point CPU tensor of H logits, one per query
    head) -> float32 [H], converted through autograd (a gradient reaches the
    caller's tensor in its own dtype)."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be None or a tensor of {H} logits (one per query head), "
                        f"got {type(sinks).__name__}")
    if sinks.device.type != "cpu":
        raise ValueError(f"tilegrad runs on the CPU; sinks is on {sinks.device}")
    if not sinks.dtype.is_floating_point:
        raise TypeError(f"sinks must be a floating point tensor, got {sinks.dtype}")
    if tuple(sinks.shape) != (H,):
        raise ValueError(f"sinks must have shape ({H},), one logit per query head; got "
                         f"{tuple(sinks.shape)}")
    return sinks.to(torch.float32)


def _sinks_grad(sinks: Tensor, lse: Tensor, delta: Tensor) -> Tensor:
    """The sinks' gradient, float32 [H]: -sum_{b,i} e^{s_h - L[b,h,i]} delta[b,h,i]
    with lse = L [B,H,qL] (the sink included) and delta = rowsum(dO * O)
    [B,H,qL]; the sink's weight is 0 where s_h = -inf (no sink). Summed in
    float64."""
    s = sinks.double().view(1, -1, 1)
    p_sink = torch.exp(s - lse.double()).masked_fill(torch.isneginf(s), 0.0)
    return (-(p_sink * delta.double()).sum((0, 2))).float()
