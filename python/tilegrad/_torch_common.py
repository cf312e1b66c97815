"""What :mod:`tilegrad.torch` and :mod:`tilegrad.ring` share to call the C
library on torch tensors: this thread's contexts, tensor pointers and
strides, the attention params struct of tensor views, the attention dtypes,
the checks of the ``threads=``, ``attn_precision=``, ``precision=`` and
``dropout_p=`` arguments, the attention ops' own checks and their
``tg_attn_options``.

The modules that call attention kernels (tilegrad.torch, tilegrad.ring,
tilegrad._torch_varlen) import this one and none imports another's
internals (tilegrad.torch re-exports the others' public names).
"""
import ctypes
import math
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


# ---------------------------------------------------------------------------
# the attention ops' checks and options (the dense ops of tilegrad.torch and
# the packed-sequence ops of tilegrad._torch_varlen)

#: precision= values: "f32" computes in float32 (inputs of other float
#: dtypes converted), "bf16" in bfloat16 (inputs rounded to bf16).
PRECISIONS = ("f32", "bf16")


def _need_v_head_dim(where: str, D: int, Dv: int) -> None:
    """A value head dim Dv other than D: both multiples of 8 in [8, 512]
    (the kernels' rule; a Dv of 0 would mean D to them)."""
    if Dv != D and not all(x % 8 == 0 and 8 <= x <= 512 for x in (D, Dv)):
        raise NotImplementedError(
            f"{where}: value head dim Dv = {Dv} != query/key head dim D = {D}: the kernels "
            "take a Dv of its own when Dv and D are multiples of 8 from 8 to 512")


def _need_dtype(op: str, dtype: torch.dtype, **ts: Optional[Tensor]) -> None:
    """The ops' own contract (the functions below convert before calling)."""
    for name, t in ts.items():
        if t is not None and t.dtype != dtype:
            raise TypeError(f"{op}: {name} must be {dtype}, got {t.dtype}")


def _need_attn_dtype(op: str, q: Tensor, **ts: Optional[Tensor]) -> int:
    """q is bfloat16 or float32 and every other tensor has its dtype; -> tg_dtype."""
    if q.dtype not in _ATTN_DTYPES:
        raise TypeError(f"{op}: q must be torch.bfloat16 or torch.float32, got {q.dtype}")
    _need_dtype(op, q.dtype, **ts)
    return _ATTN_DTYPES[q.dtype]


def _need_attn_precision(op: str, attn_precision: int) -> int:
    """The ops' attn_precision: a ``tg_attn_precision`` value (0 exact,
    1 split, 2 bf16)."""
    if attn_precision not in _capi.ATTN_PRECISION_NAMES.values():
        raise ValueError(f"{op}: attn_precision must be 0 (exact), 1 (split) or 2 (bf16), "
                         f"got {attn_precision}")
    return int(attn_precision)


def _attn_options(dropout_p: float, seed: Optional[Tensor], window: int = 0,
                  v_head_dim: int = 0, sinks: Optional[Tensor] = None,
                  d_sinks: Optional[Tensor] = None,
                  flags: int = 0) -> Optional["_capi.AttnOptions"]:
    """tg_attn_options (None when every field has its default): dropout with
    Philox key = the seed tensor's value, drawn from torch's generator by the
    caller; the window (0 = none); v_head_dim (0 = D); sinks and d_sinks,
    contiguous float32 [H] tensors the caller keeps alive over the call;
    TG_ATTN_OPT_* flags."""
    if not (dropout_p or window or v_head_dim or sinks is not None or flags):
        return None
    opt = _capi.AttnOptions(flags=flags)
    if dropout_p:
        if seed is None or seed.numel() != 1 or seed.dtype != torch.int64:
            raise ValueError(f"dropout_p = {dropout_p} needs seed, a one-element int64 tensor")
        opt.dropout_p = float(dropout_p)
        opt.dropout_seed = int(seed.item()) & (2 ** 64 - 1)
        opt.dropout_offset = 0
    opt.window, opt.v_head_dim = int(window), int(v_head_dim)
    if sinks is not None:
        opt.sinks = sinks.data_ptr()
        if d_sinks is not None:
            opt.d_sinks = d_sinks.data_ptr()
    return opt


def _no_key_outputs(o: Tensor, lse: Tensor, sinks: Optional[Tensor]) -> None:
    """o, lse of rows that see no key (kL = 0): O = 0 and L = -inf, or with
    sinks L = s_h; a NaN or +inf sink makes its head's O and L NaN (as the
    kernels)."""
    o.zero_()
    if sinks is None:
        lse.fill_(-math.inf)
        return
    bad = torch.isnan(sinks) | torch.isposinf(sinks)
    H = sinks.shape[0]
    lse.copy_(sinks.masked_fill(bad, math.nan).view(1, H, 1).expand(lse.shape))
    o.masked_fill_(bad.view(1, H, 1, 1), math.nan)


def _compute_dtype(dtype: torch.dtype, precision: Optional[str]) -> torch.dtype:
    """The dtype the kernels run in for inputs of ``dtype``: bfloat16 and
    float32 as given, float16 in float32 (exact widening); ``precision``
    overrides ("f32" / "bf16"); float64 needs it (the kernels have no f64)."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be None or one of {PRECISIONS}, got {precision!r}")
    if not dtype.is_floating_point:
        raise TypeError(f"attention needs floating point tensors, got {dtype}")
    if precision is not None:
        return torch.bfloat16 if precision == "bf16" else torch.float32
    if dtype == torch.float64:
        raise TypeError("tilegrad attention has no float64 kernels: pass precision=\"f32\" "
                        "(inputs rounded to float32, max abs error ~1e-6) or precision=\"bf16\"")
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def _dropout_p_arg(dropout_p: float) -> float:
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return p


def _dropout_seed(dropout_p: float) -> Optional[Tensor]:
    """The Philox key of one dropout call, drawn from torch's default
    generator (torch.manual_seed makes runs repeat); None without dropout."""
    if not dropout_p:
        return None
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64)
