"""Packed sequences: ``flash_attn_varlen_func`` on tilegrad's kernels.

Documents packed one after another along the rows, each attending only to
itself: q ``(total_q, H, D)``, k ``(total_k, H_kv, D)``, v ``(total_k, H_kv,
Dv)``, document d holding the query rows ``[cu_seqlens_q[d],
cu_seqlens_q[d + 1])`` and the key rows ``[cu_seqlens_k[d], cu_seqlens_k[d +
1])``. The C entry points (``tg_attn_varlen_fwd``, ``tg_attn_varlen_bwd_step``,
include/tilegrad.h) visit the documents' own tiles only: no mask, no
``[total_q, total_k]`` anything.

Public: :func:`varlen_attention` (re-exported by :mod:`tilegrad.torch`),
flash-attn's argument names and meanings. On PyTorch >= 2.4 the kernels are
the custom ops

* ``tilegrad::varlen_attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k,
  max_seqlen_q, max_seqlen_k, causal, scale, softcap, window, dropout_p,
  seed, threads, deterministic, attn_precision, sinks) -> (o, lse)`` -- o
  ``(total_q, H, Dv)`` in q's dtype, lse ``(H, total_q)`` float32
  (flash-attn's ``softmax_lse`` layout); ``softcap`` the params' value (1.0
  = none), ``window`` tilegrad's one-sided W (0 = none), ``max_seqlen_*`` -1
  or a bound checked against the offsets;
* ``tilegrad::varlen_attn_bwd(do, q, k, v, o, lse, cu_seqlens_q,
  cu_seqlens_k, causal, scale, softcap, window, dropout_p, seed, threads,
  deterministic, attn_precision, sinks) -> (dq, dk, dv, dsinks)`` --
  ``tg_attn_varlen_bwd_step``, the gradients written in q's dtype, dsinks
  float32 ``(H,)`` (``(0,)`` without sinks)

with fake implementations and registered autograd; plain eager calls run
the same implementations behind an autograd Function
(:func:`tilegrad._torch_paths._forward`), the only path on PyTorch 1.13.
"""
import math
from typing import Optional, Tuple

import torch

from . import capi as _capi
from ._torch_common import (_attn_options, _attn_precision_arg, _context, _dropout_p_arg,
                            _dropout_seed, _need_attn_dtype, _need_attn_precision, _need_dtype,
                            _need_v_head_dim, _ptr, _sinks_arg, _sinks_grad, _threads_arg)
from ._torch_paths import (_IS_COMPILING, HAVE_CUSTOM_OPS, _autocast_cast, _check_cpu,
                           _custom_op, _forward)

__all__ = ["varlen_attention"]

Tensor = torch.Tensor

_I32_MAX = 2 ** 31 - 1
_FWD, _BWD = "tilegrad::varlen_attn_fwd", "tilegrad::varlen_attn_bwd"


# ---------------------------------------------------------------------------
# the ops' checks (every call: a direct torch.ops.tilegrad call cannot make a
# kernel read outside a tensor)

def _need_varlen_shapes(op: str, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor,
                        **like_o: Tensor) -> None:
    """q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv, Dv), H a
    multiple of H_kv; the offsets 1-D int32 CPU tensors of one length n_docs
    + 1 >= 2; like_o: o and do (total_q, H, Dv), lse (H, total_q)."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or tuple(k.shape[:2]) != tuple(v.shape[:2]):
        raise ValueError(f"{op}: q (total_q, H, D), k (total_k, H_kv, D) and v (total_k, H_kv, "
                         f"Dv) expected; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    total_q, H, D = q.shape
    Hkv = k.shape[1]
    if k.shape[2] != D or (Hkv == 0) != (H == 0) or (H and H % Hkv):
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} disagree (head dim, "
                         "or H not a multiple of H_kv)")
    _need_v_head_dim(op, D, v.shape[2])
    for name, x in (("total_q", total_q), ("total_k", k.shape[0])):
        if x > _I32_MAX:
            raise ValueError(f"{op}: {name} = {x} does not fit the offsets' int32")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or \
                cu.device.type != "cpu":
            raise TypeError(f"{op}: {name} must be a 1-D int32 CPU tensor (n_docs + 1 offsets), "
                            f"got {getattr(cu, 'dtype', type(cu).__name__)} "
                            f"{tuple(getattr(cu, 'shape', ()))}")
    if cu_q.numel() < 2 or cu_q.numel() != cu_k.numel():
        raise ValueError(f"{op}: cu_seqlens_q and cu_seqlens_k hold n_docs + 1 >= 2 offsets "
                         f"each, one n_docs for both; got {cu_q.numel()} and {cu_k.numel()}")
    if cu_q.numel() - 1 > _I32_MAX:
        raise ValueError(f"{op}: n_docs = {cu_q.numel() - 1} does not fit an int32")
    Dv = v.shape[2]
    for name, t in like_o.items():
        want = (H, total_q) if name == "lse" else (total_q, H, Dv)
        if tuple(t.shape) != want:
            raise ValueError(f"{op}: {name} must have shape {want}, got {tuple(t.shape)}")


def _need_offsets(op: str, name: str, cu: Tensor, total: int) -> None:
    """cu holds 0, ..., total, non-decreasing (read from the tensor: n_docs
    + 1 integers)."""
    first, last = int(cu[0]), int(cu[-1])
    if first != 0:
        raise ValueError(f"{op}: {name}[0] = {first}: the offsets start at 0")
    steps = cu[1:] - cu[:-1]
    if bool((steps < 0).any()):
        d = int((steps < 0).nonzero()[0, 0])
        raise ValueError(f"{op}: {name} decreases at document {d}: {name}[{d}] = {int(cu[d])} > "
                         f"{name}[{d + 1}] = {int(cu[d + 1])} (offsets are non-decreasing)")
    if last != total:
        raise ValueError(f"{op}: {name}[-1] = {last} must be the packed length {total}")


def _need_max_seqlen(op: str, name: str, max_seqlen: int, cu: Tensor) -> None:
    """max_seqlen -1 (not checked) or >= the longest document (flash-attn
    sizes its grid by it: a smaller value would leave rows uncomputed)."""
    if max_seqlen < 0:
        return
    longest = int((cu[1:] - cu[:-1]).max())
    if longest > max_seqlen:
        raise ValueError(f"{op}: max_seqlen_{name} = {max_seqlen} is less than the longest "
                         f"document's {longest} {'query' if name == 'q' else 'key'} rows "
                         f"(cu_seqlens_{name}); flash_attn_varlen_func would leave rows "
                         "past it uncomputed")


def _need_window_sinks(op: str, window: int, sinks: Optional[Tensor], H: int) -> None:
    if not 0 <= window < 2 ** 32:
        raise ValueError(f"{op}: window must be 0 (none) or in [1, 2^32), got {window}")
    if sinks is not None and (sinks.dtype != torch.float32 or tuple(sinks.shape) != (H,) or
                              sinks.device.type != "cpu"):
        raise ValueError(f"{op}: sinks must be a float32 CPU tensor of shape ({H},) (one logit "
                         f"per query head); got {sinks.dtype} {tuple(sinks.shape)} on "
                         f"{sinks.device}")


# ---------------------------------------------------------------------------
# the C calls

def _row_unit(t: Tensor) -> Tensor:
    """t itself when its innermost stride is 1 (or that dim has size <= 1),
    else a contiguous copy: the kernels read D at unit stride."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _strides(t: Tensor) -> Tuple[int, int, int]:
    """(batch, head, row) element strides of a packed (rows, heads, D) view,
    as the params struct takes them (B = 1: batch stride 0)."""
    return 0, t.stride(1), t.stride(0)


def _varlen_params(q: Tensor, k: Tensor, v: Tensor, o: Tensor, scale: float,
                   softcap: float) -> "_capi.AttnParams":
    """tg_attn_params for the packed views (B = 1, qL = total_q, kL = total_k;
    O_strides: o's in the forward, do's in the backward)."""
    total_q, H, D = q.shape
    total_k, Hkv = k.shape[:2]
    return _capi.attn_params(1, H, Hkv, total_q, total_k, D, float(scale), float(softcap),
                             Q_strides=_strides(q), K_strides=_strides(k),
                             V_strides=_strides(v), O_strides=_strides(o))


def _docs(cu_q: Tensor, cu_k: Tensor) -> "_capi.AttnVarlen":
    """tg_attn_varlen over the two contiguous int32 offset tensors (the
    caller keeps them alive over the call)."""
    return _capi.AttnVarlen(cu_q.data_ptr(), cu_k.data_ptr(), cu_q.numel() - 1, 0, None)


def _no_key_rows(o: Tensor, lse: Tensor, sinks: Optional[Tensor]) -> None:
    """o (total_q, H, Dv), lse (H, total_q) when no document has a key: O = 0,
    L = -inf, or with sinks L = s_h (a NaN or +inf sink: its head's O and L
    NaN, as the kernels and the dense front)."""
    o.zero_()
    if sinks is None:
        lse.fill_(-math.inf)
        return
    bad = torch.isnan(sinks) | torch.isposinf(sinks)
    lse.copy_(sinks.masked_fill(bad, math.nan).view(-1, 1).expand(lse.shape))
    o.masked_fill_(bad.view(1, -1, 1), math.nan)


def _varlen_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                     scale: float, softcap: float, window: int, dropout_p: float,
                     seed: Optional[Tensor], threads: int, deterministic: bool,
                     attn_precision: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """tg_attn_varlen_fwd: o (total_q, H, Dv) of q's dtype, contiguous, and
    lse (H, total_q) float32 (-inf for a row that sees no key; with sinks
    it includes the sink). q, k, v bfloat16 or float32 (one dtype; views
    with a unit innermost stride are read in place)."""
    dt = _need_attn_dtype(_FWD, q, k=k, v=v)
    _need_varlen_shapes(_FWD, q, k, v, cu_seqlens_q, cu_seqlens_k)
    _need_window_sinks(_FWD, window, sinks, q.shape[1])
    ap = _need_attn_precision(_FWD, attn_precision)
    total_q, H, D = q.shape
    total_k, Dv = k.shape[0], v.shape[2]
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    _need_offsets(_FWD, "cu_seqlens_q", cu_q, total_q)
    _need_offsets(_FWD, "cu_seqlens_k", cu_k, total_k)
    _need_max_seqlen(_FWD, "q", max_seqlen_q, cu_q)
    _need_max_seqlen(_FWD, "k", max_seqlen_k, cu_k)
    o = q.new_empty((total_q, H, Dv))
    lse = q.new_empty((H, total_q), dtype=torch.float32)
    if sinks is not None:
        sinks = sinks.contiguous()
    if total_q == 0 or H == 0:
        return o, lse
    if total_k == 0:             # every document without keys: zeros (L = -inf or s_h)
        _no_key_rows(o, lse, sinks)
        return o, lse
    q, k, v = _row_unit(q), _row_unit(k), _row_unit(v)
    ctx = _context(threads, deterministic, ap)
    ctx.call("tg_attn_varlen_fwd", dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse),
             _varlen_params(q, k, v, o, scale, softcap), _docs(cu_q, cu_k),
             1 if causal else 0,
             _attn_options(dropout_p, seed, window, Dv if Dv != D else 0, sinks))
    return o, lse


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                     scale, softcap, window, dropout_p, seed, threads, deterministic,
                     attn_precision, sinks):
    total_q, H, _ = q.shape
    return (q.new_empty((total_q, H, v.shape[2])),
            q.new_empty((H, total_q), dtype=torch.float32))


def _varlen_bwd_impl(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                     cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, causal: bool, scale: float,
                     softcap: float, window: int, dropout_p: float, seed: Optional[Tensor],
                     threads: int, deterministic: bool, attn_precision: int,
                     sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """tg_attn_varlen_bwd_step (D = rowsum(dO o O) and the backward in one
    call): dq, dk, dv in q's dtype, contiguous, the shapes of q, k, v (f32
    results rounded once to bf16 by the kernel for bf16), and dsinks float32
    (H,) (shape (0,) without sinks)."""
    dt = _need_attn_dtype(_BWD, q, do=do, k=k, v=v, o=o)
    _need_dtype(_BWD, torch.float32, lse=lse)
    _need_varlen_shapes(_BWD, q, k, v, cu_seqlens_q, cu_seqlens_k, do=do, o=o, lse=lse)
    _need_window_sinks(_BWD, window, sinks, q.shape[1])
    ap = _need_attn_precision(_BWD, attn_precision)
    total_q, H, D = q.shape
    total_k, Dv = k.shape[0], v.shape[2]
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    _need_offsets(_BWD, "cu_seqlens_q", cu_q, total_q)
    _need_offsets(_BWD, "cu_seqlens_k", cu_k, total_k)
    dsinks = torch.zeros((H,) if sinks is not None else (0,), dtype=torch.float32)
    if sinks is not None:
        sinks = sinks.contiguous()
    if total_q == 0 or H == 0 or total_k == 0:
        if sinks is not None and total_q and H:  # rows with the sink alone: O = 0 (or NaN)
            delta = (o.float() * do.float()).sum(-1).t()            # (H, total_q)
            dsinks.copy_(_sinks_grad(sinks, lse.unsqueeze(0), delta.unsqueeze(0)))
        return (q.new_zeros(q.shape), k.new_zeros(k.shape, dtype=q.dtype),
                v.new_zeros(v.shape, dtype=q.dtype), dsinks)
    q, k, v = _row_unit(q), _row_unit(k), _row_unit(v)
    # O is read through dO's strides (the params' O_strides): both contiguous
    do, o, lse = do.contiguous(), o.contiguous(), lse.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=q.dtype)
    dv = torch.empty(v.shape, dtype=q.dtype)
    ctx = _context(threads, deterministic, ap)
    ctx.call("tg_attn_varlen_bwd_step", dt, dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse),
             _ptr(do), _ptr(dq), _ptr(dk), _ptr(dv),
             _varlen_params(q, k, v, do, scale, softcap), _docs(cu_q, cu_k),
             1 if causal else 0,
             _attn_options(dropout_p, seed, window, Dv if Dv != D else 0, sinks, dsinks))
    return dq, dk, dv, dsinks


def _varlen_bwd_fake(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, causal, scale, softcap,
                     window, dropout_p, seed, threads, deterministic, attn_precision, sinks):
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape),
            q.new_empty((q.shape[1],) if sinks is not None else (0,), dtype=torch.float32))


# ---------------------------------------------------------------------------
# autograd (the custom op's and the Function's)

def _varlen_save(ctx, inputs, o: Tensor, lse: Tensor) -> None:
    """What the backward takes, from the forward's 17 inputs and outputs."""
    (q, k, v, cu_q, cu_k, _max_q, _max_k, causal, scale, softcap, window, dropout_p, seed,
     threads, deterministic, attn_precision, sinks) = inputs
    ctx.args = (causal, scale, softcap, window, dropout_p)
    ctx.run = (threads, deterministic, attn_precision)
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, seed, sinks)


def _varlen_grads(varlen_bwd, ctx, do: Tensor):
    """The 17 inputs' gradients: dq, dk, dv, dsinks (None where not needed)."""
    q, k, v, o, lse, cu_q, cu_k, seed, sinks = ctx.saved_tensors
    need = ctx.needs_input_grad
    dq = dk = dv = ds = None
    if need[0] or need[1] or need[2] or need[16]:
        causal, scale, softcap, window, dropout_p = ctx.args
        threads, deterministic, attn_precision = ctx.run
        dq, dk, dv, ds = varlen_bwd(do, q, k, v, o, lse, cu_q, cu_k, causal, scale, softcap,
                                    window, dropout_p, seed, threads, deterministic,
                                    attn_precision, sinks)
    return ((dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) +
            (None,) * 13 + (ds if need[16] else None,))


if HAVE_CUSTOM_OPS:
    varlen_attn_fwd = _custom_op("varlen_attn_fwd", _varlen_fwd_impl, _varlen_fwd_fake)
    varlen_attn_bwd = _custom_op("varlen_attn_bwd", _varlen_bwd_impl, _varlen_bwd_fake)
    varlen_attn_fwd.register_autograd(
        lambda ctx, do, dlse: _varlen_grads(varlen_attn_bwd, ctx, do),
        setup_context=lambda ctx, inputs, output: _varlen_save(ctx, inputs, *output))
else:  # PyTorch < 2.4: the Function below is the only path
    varlen_attn_fwd = varlen_attn_bwd = None


class _VarlenFunction(torch.autograd.Function):
    """varlen_attn_fwd / varlen_attn_bwd's implementations behind autograd,
    without the dispatcher (tilegrad._torch_paths._direct)."""

    @staticmethod
    def forward(ctx, *inputs):
        o, lse = _varlen_fwd_impl(*inputs)
        _varlen_save(ctx, inputs, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        return _varlen_grads(_varlen_bwd_impl, ctx, do)


# ---------------------------------------------------------------------------
# the function's arguments (plain Python on shapes and Python numbers)

def _window_size_arg(window_size, causal: bool) -> Tuple[int, bool]:
    """flash-attn's window_size (left, right) and causal -> (tilegrad's W, causal).

    flash-attn: query i of a document sees key k iff ``i + off - left <= k
    <= i + off + right`` (off = len_k - len_q, -1 = no limit on that side),
    and causal=True makes right 0 whatever it was (its C++ front does so).
    tilegrad's window is one-sided, key k visible iff ``k > i + off - W``:
    left >= 0 is ``W = left + 1`` (-1: no window); right 0 is the causal
    limit (so (-1, 0) or (left, 0) without causal are causal, as in
    flash-attn), right -1 none; a right window > 0 without causal (keys
    past the diagonal, but not all of them) is not something the kernels
    compute."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair (left, right) of ints, got "
                        f"{window_size!r}") from None
    for side, x in (("left", left), ("right", right)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"window_size {side} must be an int (-1: no limit), got {x!r}")
        if x < -1:
            raise ValueError(f"window_size {side} = {x}: -1 (no limit) or >= 0 keys")
    if causal:
        right = 0                       # flash-attn: causal=True sets the right window to 0
    if right > 0:
        raise ValueError(f"window_size = {tuple(window_size)} with causal=False: a right "
                         f"window of {right} keys past the diagonal is not supported (tilegrad's "
                         "window is one-sided: right must be -1, no limit, or 0, the causal "
                         "limit)")
    window = 0 if left < 0 or left + 1 >= 2 ** 32 else left + 1   # W >= 2^32: no document's
    return window, right == 0


def _softcap_arg(softcap) -> float:
    """flash-attn's softcap (0: none; c > 0: c*tanh(s/c)) -> the params'
    softcapping (1.0: none)."""
    c = float(softcap)
    if not c >= 0.0 or math.isinf(c):
        raise ValueError(f"softcap must be 0 (none) or a finite c > 0, got {softcap}")
    if c == 1.0:
        raise NotImplementedError("softcap = 1.0: the kernels read a cap of 1 as none "
                                  "(tg_attn_params.softcapping = 1.0 means off)")
    return 1.0 if c == 0.0 else c


def _max_seqlen_arg(name: str, m) -> int:
    """max_seqlen_q / _k: an int (or a one-element tensor) >= 0, checked by
    the op against the offsets; None, or a tensor under torch.compile (its
    value is not known while tracing), is not checked (-1)."""
    if m is None:
        return -1
    if isinstance(m, torch.Tensor):
        if m.numel() != 1 or m.dtype.is_floating_point or m.dtype == torch.bool:
            raise TypeError(f"max_seqlen_{name} must be an int, got a {m.dtype} tensor of shape "
                            f"{tuple(m.shape)}")
        if _IS_COMPILING is not None and _IS_COMPILING():
            return -1
        m = int(m)
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(f"max_seqlen_{name} must be an int, got {m!r}")
    if m < 0:
        raise ValueError(f"max_seqlen_{name} must be >= 0, got {m}")
    return min(m, _I32_MAX)


def _offsets_arg(name: str, cu) -> Tensor:
    """cu_seqlens_q / _k: an int32 or int64 CPU tensor -> int32 (int64
    values outside int32 refused, in eager; the op checks the rest)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of n_docs + 1 int32 offsets, got "
                        f"{type(cu).__name__}")
    _check_cpu(cu)
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64, converted), got {cu.dtype}")
    if cu.dim() != 1:
        raise ValueError(f"{name} must be 1-D (n_docs + 1 offsets), got shape {tuple(cu.shape)}")
    if cu.dtype == torch.int64:
        if not (_IS_COMPILING is not None and _IS_COMPILING()) and cu.numel() and \
                bool(((cu < 0) | (cu > _I32_MAX)).any()):
            raise ValueError(f"{name} holds offsets outside int32")
        cu = cu.to(torch.int32)
    return cu


# ---------------------------------------------------------------------------
# the function

def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: Optional[int],
                     max_seqlen_k: Optional[int], dropout_p: float = 0.0,
                     softmax_scale: Optional[float] = None, causal: bool = False,
                     window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                     return_attn_probs: bool = False, block_table: Optional[Tensor] = None, *,
                     sinks: Optional[Tensor] = None, attn_precision: str = "exact",
                     threads: Optional[int] = None) -> Tensor:
    """``flash_attn_varlen_func`` on the CPU: attention within each of the
    documents packed along the rows of q, k and v.

    q ``(total_q, H, D)``, k ``(total_k, H_kv, D)``, v ``(total_k, H_kv,
    Dv)`` (H a multiple of H_kv; D a multiple of 8 up to 512, Dv = D or its
    own multiple of 8 up to 512), views with a unit innermost stride read in
    place; cu_seqlens_q / cu_seqlens_k: int32 (int64 converted) tensors of
    n_docs + 1 offsets, 0 first, non-decreasing, total_q / total_k last
    (document d: query rows ``[cu_seqlens_q[d], cu_seqlens_q[d + 1])``, key
    rows likewise; a repeated value is an empty document). Returns o
    ``(total_q, H, Dv)`` in q's dtype (bfloat16 or float32 compute; float16
    in float32; under CPU autocast q, k, v are first cast to its dtype).

    flash-attn's meanings: ``softmax_scale`` default ``1/sqrt(D)``;
    ``causal`` bottom-right aligned per document (key k of the document
    visible to its query i iff ``k <= i + len_k - len_q``); ``window_size``
    ``(left, right)``: ``left`` keys back from that diagonal (-1: all),
    ``right`` -1 or 0 (0: the causal limit; causal=True makes it 0, as
    flash-attn does; a right window > 0 without causal is refused,
    ValueError); ``softcap`` c > 0: ``c*tanh(s/c)`` (0: none; 1.0 is
    refused: the kernels read it as none); ``dropout_p`` applied whenever
    > 0, as flash-attn (pass 0.0 in evaluation): the kernels' Philox stream
    keyed by a draw from torch's generator, each document numbering its own
    weights; ``deterministic``: bitwise-repeatable results at any thread
    count. ``max_seqlen_q`` / ``max_seqlen_k``: flash-attn sizes its grid by
    them and computes garbage rows when they are short; here the kernels
    take the lengths from the offsets, so a value >= the longest document is
    accepted whatever it is and a shorter one raises ValueError (an int, a
    one-element tensor, or None: not checked; a tensor under torch.compile
    is not checked either). ``alibi_slopes``, ``return_attn_probs=True``
    and ``block_table`` (paged KV) are refused (NotImplementedError).

    tilegrad's own keywords: ``sinks`` (float ``[H]`` sink logits, as
    :func:`tilegrad.torch.attention`: ``e^{s_h}`` joins each row's softmax
    denominator, with a gradient), ``attn_precision`` (``"exact"``,
    ``"split"``, ``"bf16"``: bf16 compute's products with P and dS),
    ``threads`` (None: ``torch.get_num_threads()``)."""
    _check_cpu(q, k, v)
    for what, bad in (("alibi_slopes", alibi_slopes is not None),
                      ("return_attn_probs=True", bool(return_attn_probs)),
                      ("block_table (paged KV)", block_table is not None)):
        if bad:
            raise NotImplementedError(f"varlen_attention: {what} is not supported")
    q, k, v = _autocast_cast(q, k, v)
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("varlen_attention takes packed 3-D tensors: q (total_q, H, D), "
                         "k (total_k, H_kv, D), v (total_k, H_kv, Dv); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    dtype = q.dtype
    if dtype in (torch.bfloat16, torch.float32):
        cdtype = dtype
    elif dtype == torch.float16:
        cdtype = torch.float32              # exact widening, as tilegrad.torch.attention
    else:
        raise TypeError(f"varlen_attention computes in bfloat16 or float32 (float16 widened); "
                        f"got {dtype}")
    H, D = q.shape[1], q.shape[2]
    if k.shape[1] == 0 and H != 0 or k.shape[1] and H % k.shape[1]:
        raise ValueError(f"query heads H = {H} must be a multiple of kv heads {k.shape[1]} "
                         "(GQA)")
    cu_q = _offsets_arg("cu_seqlens_q", cu_seqlens_q)
    cu_k = _offsets_arg("cu_seqlens_k", cu_seqlens_k)
    window, causal = _window_size_arg(window_size, bool(causal))
    cap = _softcap_arg(softcap)
    dropout_p = _dropout_p_arg(dropout_p)
    sinks = _sinks_arg(sinks, H)
    ap = _attn_precision_arg(attn_precision)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    if dtype != cdtype:
        q, k, v = q.to(cdtype), k.to(cdtype), v.to(cdtype)
    seed = _dropout_seed(dropout_p)
    o = _forward(varlen_attn_fwd, _VarlenFunction, _varlen_fwd_impl,
                 (q, k, v, cu_q, cu_k, seed, sinks),
                 (q, k, v, cu_q, cu_k, _max_seqlen_arg("q", max_seqlen_q),
                  _max_seqlen_arg("k", max_seqlen_k), causal, float(softmax_scale), cap, window,
                  dropout_p, seed, _threads_arg(threads), bool(deterministic), ap, sinks))
    return o if dtype == cdtype else o.to(dtype)
