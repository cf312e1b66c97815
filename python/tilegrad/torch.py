"""tilegrad kernels as PyTorch operators and modules (CPU tensors).

On PyTorch >= 2.4 every kernel is a ``torch.library.custom_op`` in the
``tilegrad::`` namespace, with a fake (meta) implementation and registered
autograd, so ``torch.compile(fullgraph=True)``, ``torch.export`` and
``torch.library.opcheck`` understand them:

* ``tilegrad::attn_fwd(q, k, v, mask, causal, scale, softcap, q_offset,
  dropout_p, seed, threads, deterministic, attn_precision, window=0,
  sinks=None) -> (o, lse)`` -- ``tg_attn_train_fwd`` on bfloat16 or float32
  tensors (all of one dtype); v may have its own head dim Dv (o then has
  Dv columns); ``attn_precision`` is the ``tg_attn_precision`` value
  (0 exact, 1 split, 2 bf16; it matters for bfloat16 tensors only);
  ``window`` the sliding window (0 = none), ``sinks`` None or float32 [H]
  sink logits (lse then includes the sink);
* ``tilegrad::attn_bwd(do, q, k, v, o, lse, mask, causal, scale, softcap,
  q_offset, dropout_p, seed, threads, deterministic, attn_precision,
  window=0, sinks=None) -> (dq, dk, dv, dsinks)`` --
  ``tg_attn_train_bwd_step`` (compute_d and the backward in one call,
  dq, dk, dv written in q's dtype); dsinks float32 [H] (shape (0,) without
  sinks);
* ``tilegrad::rms_norm_fwd(x, weight, eps, threads, deterministic) -> (y, r)``
  -- ``tg_rms_norm_forward_f32``;
* ``tilegrad::rms_norm_bwd(dy, x, weight, r, threads, deterministic) ->
  (dx, dw)`` -- ``tg_rms_norm_backward_dx_f32`` + ``_dw_f32``.

The ops take tensors directly: the C functions get ``t.data_ptr()`` through
ctypes inside the op's implementation (opaque to Dynamo), contiguous inputs
are never copied and strided ``[B, H, L, D]`` views (e.g.
``x.view(B, L, H, D).transpose(1, 2)``) go to the attention kernels by their
strides. Plain eager calls (no torch.compile, export or jit tracing, no
torch_function or torch_dispatch mode, no functorch transform, no tensor
subclass) run the same implementations behind plain
``torch.autograd.Function`` s instead of through the dispatcher: the same
bits, 0.1-0.4 ms less per forward + backward (``_direct``); with no graph
to record the forward is the implementation alone. On PyTorch < 2.4
(Debian's 1.13) the Functions are the only path (no compile/export support).

User-facing functions: :func:`attention`, :func:`scaled_dot_product_attention`,
:func:`rms_norm`, :func:`varlen_attention` (packed sequences, flash-attn's
``flash_attn_varlen_func``; ops ``tilegrad::varlen_attn_fwd`` / ``_bwd`` in
:mod:`tilegrad._torch_varlen`), :func:`flex_attention` (a torch ``BlockMask``'s
blocks only, :mod:`tilegrad._torch_flex`); modules :class:`RMSNorm`, :class:`Attention`,
:class:`MultiHeadAttention`. python/README.md lists what differs from PyTorch.
Context-parallel attention over ``torch.distributed`` (the sequence sharded
across processes): :func:`ring_attention` with :func:`ring_shard`,
:func:`ring_unshard`, :func:`ring_positions`, from :mod:`tilegrad.ring`.

Threads: each call runs on this thread's tilegrad context with
``torch.get_num_threads()`` threads unless ``threads=`` says otherwise; the
attention functions set that context's precision mode (``attn_precision=``)
the same way, per call.
"""
import math
from typing import Optional, Sequence, Tuple, Union

import torch

from . import capi as _capi
from ._torch_common import (_ATTN_DTYPES, ATTN_PRECISIONS, PRECISIONS,  # noqa: F401
                            _attn_options, _attn_params, _attn_precision_arg, _bhl_strides,
                            _compute_dtype, _context, _dropout_p_arg, _dropout_seed,
                            _inner_unit, _need_attn_dtype, _need_attn_precision, _need_dtype,
                            _need_v_head_dim, _no_key_outputs, _ptr, _sinks_arg, _sinks_grad,
                            _threads_arg, _window_arg)
# context-parallel attention over torch.distributed, re-exported
from .ring import ring_attention, ring_positions, ring_shard, ring_unshard
# how the ops run (custom ops, or their Functions on eager calls), shared with
# the step kernels' and the fused loss's modules
from ._torch_paths import (HAVE_CUSTOM_OPS, _autocast_cast, _check_cpu, _custom_op,  # noqa: F401
                           _direct, _forward, _needs_grad)
# the step's memory-bound kernels (RoPE, SwiGLU/GeGLU) and the fused linear
# cross-entropy (the LM head and the loss in chunks), re-exported
from ._torch_lce import causal_lm_loss, linear_cross_entropy
from ._torch_linear import linear
from ._torch_step import apply_rotary_pos_emb, geglu, glu_linear, rope, swiglu
# packed sequences (flash_attn_varlen_func), re-exported
from ._torch_varlen import varlen_attention
# block-sparse masks (a torch BlockMask's blocks as varlen documents), re-exported
from ._torch_flex import flex_attention

__all__ = ["attention", "scaled_dot_product_attention", "rms_norm", "RMSNorm", "Attention",
           "MultiHeadAttention", "HAVE_CUSTOM_OPS", "ring_attention", "ring_shard",
           "ring_unshard", "ring_positions", "rope", "apply_rotary_pos_emb", "swiglu", "geglu",
           "glu_linear", "linear_cross_entropy", "causal_lm_loss", "varlen_attention",
           "flex_attention", "linear", "Linear"]

Tensor = torch.Tensor

_I32_MAX = 2 ** 31 - 1


def _mask_view(mask: Tensor, B: int, H: int, qL: int, kL: int) -> Tuple[Tensor, Tuple[int, int, int]]:
    """4-D bf16 mask broadcastable to [B, H, qL, kL] -> (expanded view, its
    (batch, head, row) strides). Broadcast batch/head/row dims keep stride 0
    (no copy); a mask broadcast over keys (last dim 1, e.g. shape (qL, 1)) is
    materialised along the keys only, since the kernel reads keys at unit
    stride."""
    if mask.shape[-1] == 1 and kL > 1:
        mask = mask.expand(*mask.shape[:-1], kL).contiguous()
    m = _inner_unit(mask).expand(B, H, qL, kL)
    st = tuple(0 if n == 1 else int(s) for n, s in zip(m.shape[:3], m.stride()[:3]))
    return m, st


def _mask_args(mask: Optional[Tensor], B: int, H: int, qL: int, kL: int):
    """-> (mask view or None, AttnMaskParams or None) for the C call."""
    if mask is None:
        return None, None
    m, ms = _mask_view(mask, B, H, qL, kL)
    mp = _capi.AttnMaskParams()
    for j in range(3):
        mp.M_strides[j] = ms[j]
    return m, mp


def _is_empty(q: Tensor, k: Tensor) -> bool:
    return q.numel() == 0 or k.shape[2] == 0


def _need_shapes(op: str, q: Tensor, k: Tensor, v: Tensor, **like_o: Tensor) -> None:
    """Shape agreement the C kernels cannot see (they trust the params
    struct for every buffer's extent): checked on every op call, so a direct
    torch.ops.tilegrad call cannot make a kernel read outside a tensor.
    like_o: o and do [B,H,qL,Dv], lse [B,H,qL]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or tuple(k.shape[:3]) != tuple(v.shape[:3]):
        raise ValueError(f"{op}: q [B,H,qL,D], k [B,H_kv,kL,D] and v [B,H_kv,kL,Dv] expected; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, qL, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or (k.shape[1] == 0) != (H == 0) or \
            (H and H % k.shape[1]):
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} disagree "
                         "(batch, head dim, or H not a multiple of H_kv)")
    Dv = v.shape[3]
    _need_v_head_dim(op, D, Dv)
    for name, t in like_o.items():
        want = (B, H, qL, Dv) if name != "lse" else (B, H, qL)
        if tuple(t.shape) != want:
            raise ValueError(f"{op}: {name} must have shape {want}, got {tuple(t.shape)}")


def _need_window_sinks(op: str, window: int, sinks: Optional[Tensor], H: int) -> None:
    """The ops' window (0 = none, else W >= 1; the C field is a uint32) and
    sinks (None or float32 [H] on the CPU)."""
    if not 0 <= window < 2 ** 32:
        raise ValueError(f"{op}: window must be 0 (none) or in [1, 2^32), got {window}")
    if sinks is None:
        return
    if sinks.dtype != torch.float32 or tuple(sinks.shape) != (H,) or \
            sinks.device.type != "cpu":
        raise ValueError(f"{op}: sinks must be a float32 CPU tensor of shape ({H},) (one "
                         f"logit per query head); got {sinks.dtype} {tuple(sinks.shape)} on "
                         f"{sinks.device}")


# ---------------------------------------------------------------------------
# operator implementations (tensors in, tensors out; the only place that
# calls the C library)

def _attn_fwd_impl(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool,
                   scale: float, softcap: float, q_offset: int, dropout_p: float,
                   seed: Optional[Tensor], threads: int, deterministic: bool,
                   attn_precision: int, window: int = 0,
                   sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """q [B,H,qL,D], k [B,Hkv,kL,D], v [B,Hkv,kL,Dv], bfloat16 or float32 (one
    dtype; strided views OK), mask None or of their dtype, 4-D broadcastable
    to [B,H,qL,kL] (additive) -> o [B,H,qL,Dv] of their dtype, contiguous, lse
    f32 [B,H,qL] (-inf for a row that sees no key; with sinks it includes
    the sink). dropout_p > 0: attention weights dropped by the C library's
    Philox stream keyed by ``seed``. attn_precision: the tg_attn_precision
    of O += P.V (bfloat16 only). window W >= 1: key k visible to query i
    iff k > i + q_offset - W (0: no window). sinks: None or float32 [H]."""
    dt = _need_attn_dtype("tilegrad::attn_fwd", q, k=k, v=v, mask=mask)
    _need_shapes("tilegrad::attn_fwd", q, k, v)
    _need_window_sinks("tilegrad::attn_fwd", window, sinks, q.shape[1])
    ap = _need_attn_precision("tilegrad::attn_fwd", attn_precision)
    B, H, qL, D = q.shape
    Dv = v.shape[3]
    o = q.new_empty((B, H, qL, Dv))
    lse = q.new_empty((B, H, qL), dtype=torch.float32)
    if sinks is not None:
        sinks = sinks.contiguous()
    if _is_empty(q, k):          # nothing to attend to: zeros, as PyTorch (L = -inf or s_h)
        _no_key_outputs(o, lse, sinks)
        return o, lse
    q, k, v = _inner_unit(q), _inner_unit(k), _inner_unit(v)
    p = _attn_params(q, k, v, _bhl_strides(o), scale, softcap, q_offset)
    m, mp = _mask_args(mask, B, H, qL, k.shape[2])
    ctx = _context(threads, deterministic, ap)
    ctx.call("tg_attn_train_fwd", dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse), p, mp,
             None if m is None else _ptr(m), 1 if causal else 0,
             _attn_options(dropout_p, seed, window, Dv if Dv != D else 0, sinks))
    return o, lse


def _attn_fwd_fake(q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads,
                   deterministic, attn_precision, window=0, sinks=None):
    B, H, qL, _ = q.shape
    return (q.new_empty((B, H, qL, v.shape[3])),
            q.new_empty((B, H, qL), dtype=torch.float32))


def _attn_bwd_impl(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                   mask: Optional[Tensor], causal: bool, scale: float, softcap: float,
                   q_offset: int, dropout_p: float, seed: Optional[Tensor], threads: int,
                   deterministic: bool, attn_precision: int, window: int = 0,
                   sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The FA-2 backward in one call, tg_attn_train_bwd_step (D = rowsum(dO*O),
    then the backward with dK, dV written): dq, dk, dv of q's dtype,
    contiguous, shapes of q, k, v (the kernel's f32 results, rounded once to
    bf16 (RNE) for bf16, by the kernel as it writes them), and dsinks,
    float32 [H] (the kernel's d_sinks, accumulated into zeros; shape (0,)
    when sinks is None). attn_precision: the tg_attn_precision of
    dQ += dS.K, dK += dS^T.Q and dV += P^T.dO (bfloat16 only)."""
    dt = _need_attn_dtype("tilegrad::attn_bwd", q, do=do, k=k, v=v, o=o, mask=mask)
    _need_dtype("tilegrad::attn_bwd", torch.float32, lse=lse)
    _need_shapes("tilegrad::attn_bwd", q, k, v, do=do, o=o, lse=lse)
    _need_window_sinks("tilegrad::attn_bwd", window, sinks, q.shape[1])
    ap = _need_attn_precision("tilegrad::attn_bwd", attn_precision)
    B, H, qL, D = q.shape
    Dv = v.shape[3]
    dsinks = torch.zeros((H,) if sinks is not None else (0,), dtype=torch.float32)
    if _is_empty(q, k):
        if sinks is not None:                    # rows with the sink alone: O = 0 (or NaN)
            delta = (o.float() * do.float()).sum(-1)
            dsinks.copy_(_sinks_grad(sinks, lse, delta))
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape), dsinks
    q, k, v = _inner_unit(q), _inner_unit(k), _inner_unit(v)
    # O is read through dO's strides (the params' O_strides): both contiguous
    do, o, lse = do.contiguous(), o.contiguous(), lse.contiguous()
    if sinks is not None:
        sinks = sinks.contiguous()
    ctx = _context(threads, deterministic, ap)
    p = _attn_params(q, k, v, _bhl_strides(do), scale, softcap, q_offset)
    m, mp = _mask_args(mask, B, H, qL, k.shape[2])
    # written in q's dtype (grad_dtype = dt), contiguous; TG_ATTN_OPT_DKV_WRITE is implied
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=q.dtype)
    dv = torch.empty(v.shape, dtype=q.dtype)
    ctx.call("tg_attn_train_bwd_step", dt, dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse),
             _ptr(do), _ptr(dq), _ptr(dk), _ptr(dv), p, mp,
             None if m is None else _ptr(m), 1 if causal else 0,
             _attn_options(dropout_p, seed, window, Dv if Dv != D else 0, sinks, dsinks))
    return dq, dk, dv, dsinks


def _attn_bwd_fake(do, q, k, v, o, lse, mask, causal, scale, softcap, q_offset, dropout_p,
                   seed, threads, deterministic, attn_precision, window=0, sinks=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((q.shape[1],) if sinks is not None else (0,), dtype=torch.float32))


def _dropout_keep(dropout_p: float, seed: Tensor, B: int, H: int, qL: int,
                  kL: int) -> Tensor:
    """The kernels' dropout keep flags as a bool [B, H, qL, kL] tensor
    (tg_attn_dropout_keep: the same Philox stream)."""
    keep = torch.empty((B, H, qL, kL), dtype=torch.uint8)
    # the flags do not depend on the thread count: the thread's default
    # context, at torch's thread count (a 1-thread request would flip the
    # cached context's count back and forth against the ops' calls)
    _context(0, False).call("tg_attn_dropout_keep", _attn_options(dropout_p, seed), B, H, qL,
                            kL, _ptr(keep))
    return keep.bool()


def _need_rms_shapes(op: str, x: Tensor, weight: Tensor, dy: Optional[Tensor] = None,
                     r: Optional[Tensor] = None) -> None:
    if x.dim() < 1 or tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"{op}: x [..., dim] and weight [dim] expected; got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}")
    if dy is not None and dy.shape != x.shape:
        raise ValueError(f"{op}: dy {tuple(dy.shape)} must have x's shape {tuple(x.shape)}")
    if r is not None and r.shape != x.shape[:-1]:
        raise ValueError(f"{op}: r {tuple(r.shape)} must have shape {tuple(x.shape[:-1])}")


def _rms_fwd_impl(x: Tensor, weight: Tensor, eps: float, threads: int,
                  deterministic: bool) -> Tuple[Tensor, Tensor]:
    """x f32 [..., dim], weight f32 [dim] -> y f32 like x (contiguous),
    r = rsqrt(mean(x^2) + eps) f32 x.shape[:-1]."""
    _need_dtype("tilegrad::rms_norm_fwd", torch.float32, x=x, weight=weight)
    _need_rms_shapes("tilegrad::rms_norm_fwd", x, weight)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(x.shape, dtype=torch.float32)
    r = torch.empty(x.shape[:-1], dtype=torch.float32)
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else r.numel()
    if rows == 0 or dim == 0:    # no kernel call; an empty row has mean 0
        r.fill_(1.0 / math.sqrt(eps) if eps > 0 else math.inf)
        return y, r
    _context(threads, deterministic).call(
        "tg_rms_norm_forward_f32", _ptr(x), _ptr(weight), _ptr(y), _ptr(r), rows, dim,
        float(eps))
    return y, r


def _rms_fwd_fake(x, weight, eps, threads, deterministic):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1])


def _rms_bwd_impl(dy: Tensor, x: Tensor, weight: Tensor, r: Tensor, threads: int,
                  deterministic: bool) -> Tuple[Tensor, Tensor]:
    """-> dx f32 like x, dw f32 [dim] (both written), from the forward's r."""
    _need_dtype("tilegrad::rms_norm_bwd", torch.float32, dy=dy, x=x, weight=weight, r=r)
    _need_rms_shapes("tilegrad::rms_norm_bwd", x, weight, dy=dy, r=r)
    dy, x, weight, r = dy.contiguous(), x.contiguous(), weight.contiguous(), r.contiguous()
    dx = torch.empty(x.shape, dtype=torch.float32)
    dw = torch.zeros(weight.shape, dtype=torch.float32)
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if rows == 0 or dim == 0:
        dx.zero_()
        return dx, dw
    ctx = _context(threads, deterministic)
    ctx.call("tg_rms_norm_backward_dx_f32", _ptr(x), _ptr(weight), _ptr(dy), _ptr(r),
             _ptr(dx), rows, dim)
    ctx.call("tg_rms_norm_backward_dw_f32", _ptr(x), _ptr(dy), _ptr(r), _ptr(dw), rows, dim)
    return dx, dw


def _rms_bwd_fake(dy, x, weight, r, threads, deterministic):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


# ---------------------------------------------------------------------------
# backward formulas (shared by the custom ops and the torch < 2.4 Functions)

def _reduce_to(g: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum a [B, H, qL, kL] gradient over the dims ``shape`` broadcast."""
    lead = g.dim() - len(shape)
    if lead:
        g = g.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if dims:
        g = g.sum(dim=dims, keepdim=True)
    return g


def _attn_dmask(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                mask: Tensor, causal: bool, scale: float, softcap: float,
                q_offset: int, dropout_p: float, seed: Optional[Tensor],
                window: int) -> Tensor:
    """dL/dS_masked = P * (dP - rowsum(O * dO)) for the additive mask (the
    C backward does not output dS): recomputed in f32 torch ops from the
    saved tensors, [B, H, qL, kL] memory. P = exp(S - L) as the kernel's
    (L holds the sink, if any); with dropout dP is taken through the
    kernels' keep flags and 1/(1-p)."""
    if _is_empty(q, k):
        return torch.zeros(mask.shape, dtype=mask.dtype)
    g = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(g, 1)
    vf = v.float().repeat_interleave(g, 1)
    s = scale * (q.float() @ kf.transpose(-1, -2))                 # [B, H, qL, kL]
    if softcap != 1.0:
        s = softcap * torch.tanh(s / softcap)
    s = s + mask.float()
    qL, kL = s.shape[-2], s.shape[-1]
    keys, rows = torch.arange(kL).view(1, kL), torch.arange(qL).view(qL, 1) + q_offset
    if causal:
        s = s.masked_fill(keys > rows, -math.inf)
    if window:
        s = s.masked_fill(keys <= rows - window, -math.inf)
    L = lse.unsqueeze(-1)
    # a row that sees no key has L = -inf: P = 0 there (not exp(-inf + inf))
    p = torch.where(torch.isinf(L) & (L < 0), torch.zeros_like(s), torch.exp(s - L))
    dof = do.float()
    dp = dof @ vf.transpose(-1, -2)
    if dropout_p:
        B, H = q.shape[:2]
        keep = _dropout_keep(dropout_p, seed, B, H, qL, kL)
        dp = torch.where(keep, dp / (1.0 - dropout_p), torch.zeros_like(dp))
    delta = (o.float() * dof).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    return _reduce_to(ds, mask.shape).to(mask.dtype)


def _attn_grads(attn_bwd, saved, args, do: Tensor, need: Sequence[bool]):
    """(dq, dk, dv, dmask, dsinks) from the saved (q, k, v, o, lse, mask,
    seed, sinks) and the op's scalar args; ``need`` = needs_input_grad of
    (q, k, v, mask, sinks)."""
    q, k, v, o, lse, mask, seed, sinks = saved
    (causal, scale, softcap, q_offset, dropout_p, threads, deterministic, attn_precision,
     window) = args
    dq = dk = dv = dm = ds = None
    if need[0] or need[1] or need[2] or need[4]:
        dq, dk, dv, ds = attn_bwd(do, q, k, v, o, lse, mask, causal, scale, softcap, q_offset,
                                  dropout_p, seed, threads, deterministic, attn_precision,
                                  window, sinks)
    if need[3]:
        dm = _attn_dmask(do, q, k, v, o, lse, mask, causal, scale, softcap, q_offset,
                         dropout_p, seed, window)
    return dq, dk, dv, dm, ds if need[4] else None


def _attn_save(ctx, inputs, o: Tensor, lse: Tensor) -> None:
    """What the backward takes, saved on ctx from attention's 15 inputs
    (attn_fwd's arguments) and its outputs: the custom op's setup_context
    and the autograd Function's forward."""
    (q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads,
     deterministic, attn_precision, window, sinks) = inputs
    ctx.args = (causal, scale, softcap, q_offset, dropout_p, threads, deterministic,
                attn_precision, window)
    ctx.save_for_backward(q, k, v, o, lse, mask, seed, sinks)


def _attn_input_grads(attn_bwd, ctx, do: Tensor):
    """The gradients of attention's 15 inputs from ctx (_attn_save) and do,
    by attn_bwd (the custom op or its implementation). The dispatcher drops
    trailing arguments equal to their defaults (window=0, sinks=None):
    needs_input_grad covers those passed, and autograd drops the trailing
    None gradients of the others."""
    need = tuple(ctx.needs_input_grad) + (False,) * 15
    dq, dk, dv, dm, ds = _attn_grads(attn_bwd, ctx.saved_tensors, ctx.args, do,
                                     need[:4] + need[14:15])
    return (dq, dk, dv, dm) + (None,) * 10 + (ds,)


def _rms_save(ctx, inputs, r: Tensor) -> None:
    """rms_norm's (x, weight, eps, threads, deterministic) and its r, saved
    on ctx for _rms_grads (both paths)."""
    ctx.args = tuple(inputs[3:])
    ctx.save_for_backward(inputs[0], inputs[1], r)


def _rms_grads(rms_bwd, ctx, dy: Tensor):
    """rms_norm's (dx, dw, None, None, None) from ctx's saved (x, weight, r)
    and args (threads, deterministic)."""
    x, weight, r = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not (need[0] or need[1]):
        return None, None, None, None, None
    dx, dw = rms_bwd(dy, x, weight, r, *ctx.args)
    return dx if need[0] else None, dw if need[1] else None, None, None, None


if HAVE_CUSTOM_OPS:
    attn_fwd = _custom_op("attn_fwd", _attn_fwd_impl, _attn_fwd_fake)
    attn_bwd = _custom_op("attn_bwd", _attn_bwd_impl, _attn_bwd_fake)
    rms_norm_fwd = _custom_op("rms_norm_fwd", _rms_fwd_impl, _rms_fwd_fake)
    rms_norm_bwd = _custom_op("rms_norm_bwd", _rms_bwd_impl, _rms_bwd_fake)

    def _attn_setup_context(ctx, inputs, output):
        _attn_save(ctx, inputs, output[0], output[1])

    def _attn_backward(ctx, do, dlse):
        return _attn_input_grads(attn_bwd, ctx, do)

    attn_fwd.register_autograd(_attn_backward, setup_context=_attn_setup_context)

    def _rms_setup_context(ctx, inputs, output):
        _rms_save(ctx, inputs, output[1])

    def _rms_backward(ctx, dy, dr):
        return _rms_grads(rms_norm_bwd, ctx, dy)

    rms_norm_fwd.register_autograd(_rms_backward, setup_context=_rms_setup_context)

else:  # PyTorch < 2.4: the autograd Functions below are the only path
    attn_fwd = attn_bwd = rms_norm_fwd = rms_norm_bwd = None


class _AttnFunction(torch.autograd.Function):
    """attn_fwd / attn_bwd's implementations behind autograd, without the
    dispatcher (see _direct)."""

    @staticmethod
    def forward(ctx, *inputs):
        o, lse = _attn_fwd_impl(*inputs)
        _attn_save(ctx, inputs, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        return _attn_input_grads(_attn_bwd_impl, ctx, do)


class _RMSFunction(torch.autograd.Function):
    """rms_norm_fwd / rms_norm_bwd's implementations behind autograd."""

    @staticmethod
    def forward(ctx, *inputs):
        y, r = _rms_fwd_impl(*inputs)
        _rms_save(ctx, inputs, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _rms_grads(_rms_bwd_impl, ctx, dy)


def _attn_call(q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads,
               deterministic, attn_precision, window, sinks):
    """attention's o (_forward)."""
    return _forward(attn_fwd, _AttnFunction, _attn_fwd_impl, (q, k, v, mask, seed, sinks),
                    (q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed,
                     threads, deterministic, attn_precision, window, sinks))


def _rms_call(x, weight, eps, threads, deterministic):
    """rms_norm's y (_forward)."""
    return _forward(rms_norm_fwd, _RMSFunction, _rms_fwd_impl, (x, weight),
                    (x, weight, eps, threads, deterministic))


# ---------------------------------------------------------------------------
# argument checks (plain Python on shapes: traced by Dynamo without breaks)

# PRECISIONS / ATTN_PRECISIONS (the precision= and attn_precision= values),
# _compute_dtype, _dropout_p_arg, _dropout_seed: from _torch_common (ring and
# the varlen front take them too)


def _prepare_mask(mask, B: int, H: int, qL: int, kL: int,
                  dtype: torch.dtype) -> Optional[Tensor]:
    """mask (bool: True = attend; float: additive, converted to ``dtype``
    (the kernels') through autograd, so it can get a gradient) -> 4-D
    ``dtype`` tensor broadcastable to [B, H, qL, kL] (a view with leading
    1-dims; no copy when it has that dtype)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(mask)
    _check_cpu(mask)
    if mask.dim() > 4:
        raise ValueError(f"mask: at most 4 dims [B, H, qL, kL], got shape {tuple(mask.shape)}")
    full = (B, H, qL, kL)
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    if any(s != 1 and s != f for s, f in zip(shape, full)):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"[B, H, qL, kL] = {full}")
    if mask.dtype == torch.bool:
        m = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -math.inf)
    elif mask.dtype.is_floating_point:
        m = mask.to(dtype)
    else:
        raise TypeError(f"attention mask must be bool or floating point, got {mask.dtype}")
    return m.reshape(shape)


# ---------------------------------------------------------------------------
# functions

def attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
              causal: bool = False, scale: Optional[float] = None,
              softcap: Optional[float] = None, q_offset: Optional[int] = None, *,
              dropout_p: float = 0.0, window: Optional[int] = None,
              sinks: Optional[Tensor] = None, precision: Optional[str] = None,
              attn_precision: str = "exact", threads: Optional[int] = None,
              deterministic: bool = False) -> Tensor:
    """FA-2 attention on the CPU: ``softmax(S) @ v`` with
    ``S = scale * q @ k^T`` (``softcap`` c: ``c*tanh(S/c)``), then the causal
    limit, the sliding window and the additive mask.

    q ``[B, H, qL, D]``; k ``[B, H_kv, kL, D]``, v ``[B, H_kv, kL, Dv]`` with
    H a multiple of H_kv (GQA); D a multiple of 8 up to 512, and Dv = D or
    its own multiple of 8 up to 512 (the output is ``[B, H, qL, Dv]``).
    Strided views with a unit innermost stride are used in place. mask: bool
    (True = attend) or additive float, any shape broadcastable to
    ``[B, H, qL, kL]`` (in the compute dtype; a float mask that requires
    grad gets ``dL/dS``, summed over its broadcast dims). causal: key k
    visible to query i iff ``k <= i + q_offset``, default
    ``q_offset = kL - qL`` (bottom-right). scale default ``1/sqrt(D)``.
    window W (an int >= 1; None = none): key k visible to query i iff
    ``k > i + q_offset - W``, transformers' ``sliding_window`` (with causal:
    the W keys up to and including the diagonal). sinks: None or a float
    tensor ``[H]`` of per-head sink logits s_h (gpt-oss): ``e^{s_h}`` joins
    each row's softmax denominator, ``O_i = sum_k e^{S_ik} v_k / (sum_k
    e^{S_ik} + e^{s_h})`` (a row that sees no key gives 0); a sinks tensor
    that requires grad gets its gradient (in its own dtype; the kernels
    compute in float32).
    dropout_p: each attention weight is dropped with this probability and
    the kept ones scaled by ``1/(1 - dropout_p)``, as SDPA; the keep flags
    come from the C library's counter-based Philox stream, keyed by a value
    drawn from torch's default generator, and the backward recomputes them.

    Precision: bfloat16 inputs compute in bf16 with f32 accumulation;
    float32 inputs in float32 (max abs error ~1e-6 against float64 on
    unit-variance inputs); float16 inputs in float32 (output cast back).
    ``precision="bf16"`` rounds other dtypes to bf16 (faster, bf16-accurate);
    ``precision="f32"`` computes in float32 (float64 inputs need one of the
    two). q, k and v must have one dtype; under CPU autocast they are first
    cast to its dtype, as SDPA's inputs are.

    attn_precision: how the products that take the attention weights P or
    the score gradient dS (``O = P.V``; ``dQ = dS.K``, ``dK = dS^T.Q``,
    ``dV = P^T.dO``) run when the compute dtype is bfloat16 (bf16 inputs,
    or ``precision="bf16"``): ``"exact"`` (default: P and dS stay f32,
    f32 products), ``"split"`` (P and dS as bf16 hi + lo pairs on the CPU's
    bf16 dot units: relative error <= 2^-16 per term, within bf16
    outputs' rounding) or ``"bf16"`` (P and dS rounded to bf16: 2^-8 per
    term, as FlashAttention-2 and PyTorch's CPU kernel do). ``precision=``
    picks the compute dtype, ``attn_precision`` refines bf16 compute only:
    with a float32 compute dtype every mode gives the same bits. split and
    bf16 are faster on CPUs with bf16 dot products (AVX512_BF16, AMX);
    elsewhere split computes exactly as exact. The mask gradient is
    recomputed in f32 in every mode.

    threads: None = ``torch.get_num_threads()``; deterministic: bitwise
    identical results across runs and thread counts (in every mode).
    """
    _check_cpu(q, k, v)
    q, k, v = _autocast_cast(q, k, v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("attention takes 4-D [B, heads, L, D] tensors; got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    cdtype = _compute_dtype(q.dtype, precision)
    ap = _attn_precision_arg(attn_precision)
    dropout_p = _dropout_p_arg(dropout_p)
    window = _window_arg(window)
    B, H, qL, D = q.shape
    Bk, Hkv, kL, Dk = k.shape
    sinks = _sinks_arg(sinks, H)
    _need_v_head_dim("attention", D, v.shape[-1])
    if tuple(v.shape[:3]) != (Bk, Hkv, kL):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in batch, "
                         "heads and length")
    if Bk != B or Dk != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree in batch or "
                         "head dim")
    if Hkv == 0 and H != 0 or Hkv and H % Hkv:
        raise ValueError(f"query heads H = {H} must be a multiple of kv heads {Hkv} (GQA)")
    for n, x in (("B", B), ("H", H), ("qL", qL), ("kL", kL), ("D", D), ("Dv", v.shape[-1])):
        if x > _I32_MAX:
            raise ValueError(f"{n} = {x} does not fit the kernels' int32")
    dtype = q.dtype
    if dtype != cdtype:
        q, k, v = (t.to(cdtype) for t in (q, k, v))
    m = _prepare_mask(mask, B, H, qL, kL, cdtype)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    o = _attn_call(q, k, v, m, bool(causal), float(scale),
                   1.0 if softcap is None else float(softcap),
                   kL - qL if q_offset is None else int(q_offset), dropout_p,
                   _dropout_seed(dropout_p), _threads_arg(threads), bool(deterministic), ap,
                   window, sinks)
    return o if dtype == cdtype else o.to(dtype)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *, window: Optional[int] = None,
                                 sinks: Optional[Tensor] = None,
                                 precision: Optional[str] = None,
                                 attn_precision: str = "exact",
                                 threads: Optional[int] = None,
                                 deterministic: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on the tilegrad
    kernels: the same arguments and semantics (``is_causal`` top-left
    aligned, ``attn_mask`` bool = attend / float = additive, ``enable_gqa``),
    3-D ``[N, L, E]`` or 4-D ``[N, H, L, E]`` CPU tensors, ``dropout_p``
    (applied whenever it is non-zero, as SDPA); value may have its own head
    dim Ev (a multiple of 8; the output then has Ev columns, as SDPA).
    ``window`` and ``sinks`` (``[H]``, H = 1 for 3-D inputs) as
    :func:`attention`; the window counts back from the same diagonal as
    the causal limit (``is_causal``: top-left, else bottom-right).
    ``precision`` (the compute dtype) and ``attn_precision`` (exact / split
    / bf16 products with P and dS, bf16 compute only) as :func:`attention`;
    other differences in python/README.md."""
    _attn_precision_arg(attn_precision)          # refused before any reshaping
    if is_causal and attn_mask is not None:
        raise ValueError("give either attn_mask or is_causal, not both (as PyTorch)")
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
    if query.dim() != 4:
        raise ValueError(f"expected 3-D or 4-D tensors, got {tuple(query.shape)}")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads, key {key.shape[1]}: "
                         "pass enable_gqa=True for grouped-query attention")
    out = attention(query, key, value, mask=attn_mask, causal=is_causal, scale=scale,
                    q_offset=0 if is_causal else None, dropout_p=dropout_p, window=window,
                    sinks=sinks, precision=precision, attn_precision=attn_precision,
                    threads=threads, deterministic=deterministic)
    return out.squeeze(1) if squeeze else out


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-6, *,
             threads: Optional[int] = None, deterministic: bool = False) -> Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` over the last dim, in f32
    on the tilegrad kernels (bf16/float16 inputs are widened exactly,
    float64 inputs rounded to f32; the output has x's dtype). ``weight=None``:
    no scale."""
    _check_cpu(x, weight)
    dtype = x.dtype
    if not dtype.is_floating_point:
        raise TypeError(f"rms_norm needs a floating point tensor, got x.dtype = {dtype}")
    if x.dim() < 1:
        raise ValueError("rms_norm needs at least one dim (the normalised one)")
    dim = x.shape[-1]
    if weight is None:
        weight = torch.ones(dim, dtype=torch.float32)
    if tuple(weight.shape) != (dim,):
        raise ValueError(f"weight must have shape ({dim},), got {tuple(weight.shape)}")
    y = _rms_call(x.to(torch.float32), weight.to(torch.float32), float(eps),
                  _threads_arg(threads), bool(deterministic))
    return y if dtype == torch.float32 else y.to(dtype)


# ---------------------------------------------------------------------------
# modules (plain attributes only: they pickle and deepcopy)

class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` on tilegrad (the same arguments; PyTorch >= 2.4 has
    the original). ``eps=None`` uses ``torch.finfo(x.dtype).eps`` as PyTorch
    does. A multi-dim ``normalized_shape`` normalises over the trailing dims
    together."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: Optional[float] = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 threads: Optional[int] = None, deterministic: bool = False):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.threads, self.deterministic = threads, deterministic
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - n:]) != self.normalized_shape:
            raise ValueError(f"input trailing shape {tuple(x.shape[x.dim() - n:])} != "
                             f"normalized_shape {self.normalized_shape}")
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        lead = x.shape[:x.dim() - n]
        xf = x.reshape(*lead, -1)
        w = self.weight.reshape(-1) if self.weight is not None else None
        return rms_norm(xf, w, eps, threads=self.threads,
                        deterministic=self.deterministic).reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose forward is :func:`linear`: under CPU
    autocast no bf16 copy of the weight is kept for the backward, and
    layers reading one input in a row share its cast. The same parameters,
    state dict and bits; an ``nn.Linear`` becomes one in place with
    ``module.__class__ = tilegrad.torch.Linear``, as
    :func:`tilegrad.transformers.use_tilegrad_kernels` does."""

    def forward(self, input: Tensor) -> Tensor:
        return linear(input, self.weight, self.bias)


class Attention(torch.nn.Module):
    """Parameter-free module around :func:`attention`:
    ``Attention(causal=True)(q, k, v, mask=None)``. ``dropout`` (the
    attention weights' dropout probability) applies in training mode only,
    as ``nn.MultiheadAttention``'s. ``precision`` (compute dtype) and
    ``attn_precision`` (exact / split / bf16 products with P and dS, bf16
    compute only) as :func:`attention`."""

    def __init__(self, causal: bool = False, scale: Optional[float] = None,
                 softcap: Optional[float] = None, dropout: float = 0.0, *,
                 precision: Optional[str] = None, attn_precision: str = "exact",
                 threads: Optional[int] = None, deterministic: bool = False):
        super().__init__()
        self.causal, self.scale, self.softcap = causal, scale, softcap
        self.dropout = _dropout_p_arg(dropout)
        _attn_precision_arg(attn_precision)
        self.precision, self.attn_precision = precision, attn_precision
        self.threads, self.deterministic = threads, deterministic

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return attention(q, k, v, mask=mask, causal=self.causal, scale=self.scale,
                         softcap=self.softcap, dropout_p=self.dropout if self.training else 0.0,
                         precision=self.precision,
                         attn_precision=getattr(self, "attn_precision", "exact"),
                         threads=self.threads, deterministic=self.deterministic)

    def extra_repr(self) -> str:
        return (f"causal={self.causal}, scale={self.scale}, softcap={self.softcap}, "
                f"dropout={self.dropout}, precision={self.precision}, "
                f"attn_precision={getattr(self, 'attn_precision', 'exact')!r}")


class MultiHeadAttention(torch.nn.Module):
    """Batch-first self-attention block (q/k/v/out projections, GQA) whose
    core is :func:`attention`: ``x [B, L, embed_dim] -> [B, L, embed_dim]``.

    Not a drop-in for ``torch.nn.MultiheadAttention``: self-attention only,
    always batch-first, returns the output tensor only (no attention
    weights), separate q/k/v projections (GQA), ``causal`` (bottom-right)
    built in. ``forward(x, mask=None, key_padding_mask=None)``: ``mask`` as
    in :func:`attention` (bool True = attend, or additive), broadcastable to
    ``[B, num_heads, L, L]``; ``key_padding_mask`` ``[B, L]`` bool with
    ``nn.MultiheadAttention``'s convention (True = padding, ignored).
    ``num_kv_heads`` (default num_heads) must divide num_heads; the head dim
    ``embed_dim // num_heads`` must be a multiple of 8. ``dropout`` as
    ``nn.MultiheadAttention``'s (attention weights, training mode only);
    ``precision`` and ``attn_precision`` as :func:`attention` (stored on the
    inner :class:`Attention`, ``self.attn``)."""

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 causal: bool = True, bias: bool = False, softcap: Optional[float] = None,
                 dropout: float = 0.0, *,
                 precision: Optional[str] = None, attn_precision: str = "exact",
                 threads: Optional[int] = None, deterministic: bool = False, device=None,
                 dtype=None):
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be a multiple of num_heads "
                             f"({num_heads}), num_heads of num_kv_heads ({num_kv_heads})")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        fk = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(embed_dim, num_heads * self.head_dim, **fk)
        self.k_proj = torch.nn.Linear(embed_dim, num_kv_heads * self.head_dim, **fk)
        self.v_proj = torch.nn.Linear(embed_dim, num_kv_heads * self.head_dim, **fk)
        self.out_proj = torch.nn.Linear(num_heads * self.head_dim, embed_dim, **fk)
        self.attn = Attention(causal=causal, softcap=softcap, dropout=dropout,
                              precision=precision, attn_precision=attn_precision,
                              threads=threads, deterministic=deterministic)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None) -> Tensor:
        B, L, _ = x.shape
        D = self.head_dim
        # [B, L, heads*D] -> strided [B, heads, L, D] views: no copies
        q = self.q_proj(x).view(B, L, self.num_heads, D).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.num_kv_heads, D).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.num_kv_heads, D).transpose(1, 2)
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (B, L):
                raise ValueError(f"key_padding_mask must be a bool [B, L] = {(B, L)} tensor, "
                                 f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
            keep = (~key_padding_mask).view(B, 1, 1, L)        # True = attend
            if mask is None:
                mask = keep
            elif mask.dtype == torch.bool:
                mask = mask & keep
            else:
                mask = mask.masked_fill(~keep, -math.inf)
        o = self.attn(q, k, v, mask=mask)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, self.num_heads * D))
