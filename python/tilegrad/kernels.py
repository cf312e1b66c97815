"""Every kernel of the tilegrad contract as a numpy function.

Conventions (python/README.md has the table):

* Shapes are inferred from the arrays; sizes that the C API takes as scalars
  are never passed by hand (except where an array cannot tell them, e.g. the
  head count of a token-major ``[seq, heads*dim]`` matrix).
* bf16 data: ``numpy.uint16`` raw bits or ``ml_dtypes.bfloat16``; outputs
  take the dtype of the matching input. f32 data: float arrays, converted to
  C-contiguous float32 when they are not (inputs only). ids / targets: integer
  arrays in ``[0, 2**32)``.
* Attention tensors are ``[B, heads, L, D]`` numpy arrays, possibly strided
  views (e.g. a ``[B, L, H, D]`` buffer transposed): their strides go into
  ``tg_attn_params`` as they are (innermost stride must be 1; any other
  layout is copied first). Kernels without strides get C-contiguous copies
  where needed.
* Outputs are returned as new arrays, or written into ``out=``-style
  arguments (exact shape, float32 / bf16, C-contiguous unless the kernel
  takes strides, writeable). "Accumulating" outputs (``grad_weight``,
  ``dk``/``dv``, ``loss``...) are added into when given, zero-filled when not.
* Every call validates in Python what the library cannot see (dtypes, that
  the arrays' shapes agree, so no kernel can read or write outside a
  buffer) -- ``TypeError`` / ``ValueError`` -- and the library validates the
  rest, raising a :class:`tilegrad.TilegradError` subclass with its message.
  Either way nothing is written on error.
* ``ctx``: a :class:`tilegrad.Context`; default: this thread's
  :func:`tilegrad.default_context`.
"""
import ctypes
import math

import numpy as np

from . import bf16 as _bf16
from .capi import AttnMaskParams, _set_strides, attn_params_init, default_context
from .capi import CeOptions
from .capi import RopeParams

__all__ = [
    "attn_params", "flash_attn_train_fwd", "flash_attn_train_bwd_compute_d",
    "flash_attn_train_bwd", "flash_attn_backward", "f32_to_bf16_cast", "bf16_to_f32",
    "rms_norm_forward", "rms_norm_compute_rms_inv", "rms_norm_backward_dx",
    "rms_norm_backward_dw", "rms_norm_backward", "softmax_backward", "embedding_backward",
    "cross_entropy_fwd_bwd", "cross_entropy_fwd_bwd_ex", "transpose_2d", "causal_attention_backward",
    "flash_attn_vec_reduce", "flash_attn_vec_reduce_tq_hb_undo", "fwht_sign_undo",
    "fwht_sign_undo_", "pack_vec_partials",
]

_U32_MAX = 2 ** 32 - 1
_I32_MAX = 2 ** 31 - 1


# ---------------------------------------------------------------------------
# helpers

def _ctx(ctx):
    return ctx if ctx is not None else default_context()


def _ptr(a):
    return None if a is None else ctypes.c_void_p(a.ctypes.data)


def _call(ctx, name, *args):
    ctx.call(name, *args)


def _u32(name, v):
    v = int(v)
    if v < 0 or v > _U32_MAX:
        raise ValueError(f"{name} = {v} does not fit the C API's uint32")
    return v


def _f32_in(a, name):
    """float input -> C-contiguous float32 (copy only when needed)."""
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise TypeError(f"{name}: expected a float array, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _ids_in(a, name):
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) > _U32_MAX):
        raise ValueError(f"{name}: values must lie in [0, 2**32) (got min {int(a.min())}, "
                         f"max {int(a.max())})")
    return np.ascontiguousarray(a, dtype=np.uint32)


def _out(a, name, shape, dtype=np.float32, contiguous=True):
    """Validate a caller-provided output array (never copied)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(a).__name__}")
    dtype = np.dtype(dtype)
    ok = a.dtype == dtype if dtype != np.uint16 else _bf16.is_bf16_dtype(a.dtype)
    if not ok:
        raise TypeError(f"{name}: expected dtype {dtype}, got {a.dtype}")
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
    if contiguous and not a.flags["C_CONTIGUOUS"]:
        raise ValueError(f"{name} must be C-contiguous")
    if not a.flags["WRITEABLE"]:
        raise ValueError(f"{name} is not writeable")
    return a


def _new_or(out, name, shape, dtype=np.float32, zero=False):
    if out is None:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    return _out(out, name, shape, dtype)


def _rows_dim(shape, name):
    if len(shape) < 1:
        raise ValueError(f"{name} must have at least one dimension")
    dim = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return _u32(f"{name} rows", rows), _u32(f"{name} last dim", dim)


def _same_shape(a, b, na, nb):
    if a.shape != b.shape:
        raise ValueError(f"{nb} has shape {b.shape}, {na} has {a.shape}; they must agree")


# ---------------------------------------------------------------------------
# attention: layout and params

def _elem_strides(a):
    """Element strides (batch, head, row) of a 4-D bf16 view the kernel can
    address directly, or None when it must be copied."""
    it = a.itemsize
    st = a.strides
    if any(s < 0 or s % it for s in st):
        return None
    if a.shape[3] > 1 and st[3] != it:
        return None
    return tuple(s // it for s in st[:3])


def _bf16_4d(a, name):
    """-> (raw-bits view, element strides, original dtype); copies only a
    layout the kernel cannot take (negative/odd strides, inner stride != 1)."""
    arr = np.asarray(a)
    dt = arr.dtype
    b = _bf16.bits(arr, name)
    if b.ndim != 4:
        raise ValueError(f"{name}: expected a 4-D [B, heads, L, D] array, got shape {b.shape}")
    s = _elem_strides(b)
    if s is None:
        b = np.ascontiguousarray(b)
        s = _elem_strides(b)
    return b, s, dt


def attn_params(B, H, H_kv, qL, kL, D, scale=None, softcap=None, q_offset=None,
                q_strides=None, k_strides=None, v_strides=None, o_strides=None):
    """A :class:`tilegrad.capi.AttnParams` built by ``tg_attn_params_init``
    (contiguous strides, ``qL_off = kL - qL``, Metal tiling fields), then
    overridden where given: ``scale`` (default ``1/sqrt(D)``), ``softcap``
    (``None`` or 1 = off), ``q_offset`` (the causal ``qL_off``), strides
    (batch, head, row; in elements)."""
    for n, v in (("B", B), ("H", H), ("H_kv", H_kv), ("qL", qL), ("kL", kL), ("D", D)):
        if int(v) > _I32_MAX:
            raise ValueError(f"{n} = {v} does not fit the params struct's int32")
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    p = attn_params_init(B, H, H_kv, qL, kL, D, float(scale))
    if softcap is not None:
        p.softcapping = float(softcap)
    if q_offset is not None:
        p.qL_off = int(q_offset)
    return _set_strides(p, q_strides, k_strides, v_strides, o_strides)


def _mask_args(mask, B, H, qL, kL):
    """mask -> (bits view, AttnMaskParams) or (None, None). Accepts bf16
    (additive), bool (True = attend -> 0, False -> -inf) or float (additive,
    rounded to bf16), of any shape broadcastable to [B, H, qL, kL]; broadcast
    dimensions get stride 0, no copy."""
    if mask is None:
        return None, None
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        m = np.where(m, np.uint16(0), _bf16.BF16_NEG_INF).astype(np.uint16)
    elif m.dtype.kind == "f":
        m = _bf16.from_float(m).reshape(m.shape)
    else:
        m = _bf16.bits(m, "mask")
    if m.ndim > 4:
        raise ValueError(f"mask: at most 4 dims [B, H, qL, kL], got shape {m.shape}")
    try:
        v = np.broadcast_to(m, (B, H, qL, kL))
    except ValueError:
        raise ValueError(f"mask of shape {m.shape} does not broadcast to "
                         f"[B, H, qL, kL] = {(B, H, qL, kL)}") from None
    s = _elem_strides(v)
    if s is None:
        v = np.broadcast_to(np.ascontiguousarray(m), (B, H, qL, kL))
        s = _elem_strides(v)
    # size-1 dims: any stride addresses the same element; make it 0
    s = tuple(0 if n == 1 else x for n, x in zip(v.shape[:3], s))
    mp = AttnMaskParams()
    for j in range(3):
        mp.M_strides[j] = s[j]
    return v, mp


def _attn_setup(q, k, v, scale, softcap, q_offset, o_strides):
    qb, qs, qdt = _bf16_4d(q, "q")
    kb, ks, _ = _bf16_4d(k, "k")
    vb, vs, _ = _bf16_4d(v, "v")
    B, H, qL, D = qb.shape
    Bk, Hkv, kL, Dk = kb.shape
    if kb.shape != vb.shape:
        raise ValueError(f"k {kb.shape} and v {vb.shape} must have the same shape")
    if Bk != B or Dk != D:
        raise ValueError(f"q {qb.shape} and k {kb.shape} disagree in batch or head dim")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"query heads H = {H} must be a multiple of kv heads {Hkv} (GQA)")
    p = attn_params(B, H, Hkv, qL, kL, D, scale, softcap, q_offset, qs, ks, vs, o_strides)
    return qb, kb, vb, qdt, p


def flash_attn_train_fwd(q, k, v, *, mask=None, causal=False, scale=None, softcap=None,
                         q_offset=None, out=None, lse=None, ctx=None):
    """Attention forward (``tg_flash_attn_train_fwd_bf16``).

    q ``[B, H, qL, D]``, k, v ``[B, H_kv, kL, D]`` bf16 (H a multiple of H_kv:
    GQA, query head h reads kv head ``h // (H // H_kv)``); mask additive,
    broadcastable to ``[B, H, qL, kL]`` (see :func:`_mask_args`); causal:
    key k visible to query i iff ``k <= i + q_offset`` (default
    ``kL - qL``, bottom-right aligned); scale default ``1/sqrt(D)``; softcap
    c: scores ``c*tanh(s/c)``. Returns ``(o, lse)``: o bf16 ``[B,H,qL,D]``
    (``out`` may be a strided writeable view), lse float32 ``[B,H,qL]``
    (natural-log logsumexp; -inf for a row that sees no key, whose o row is 0).
    """
    ctx = _ctx(ctx)
    qb, kb, vb, qdt, p = _attn_setup(q, k, v, scale, softcap, q_offset, None)
    B, H, qL, D = qb.shape
    if out is None:
        o = np.empty((B, H, qL, D), np.uint16)
        o_bits = o
    else:
        _out(out, "out", (B, H, qL, D), np.uint16, contiguous=False)
        o = out
        o_bits = _bf16.bits(out, "out")
    os_ = _elem_strides(o_bits)
    if os_ is None:
        raise ValueError("out: strides must be >= 0 with a unit innermost stride")
    _set_strides(p, O_strides=os_)
    mbits, mp = _mask_args(mask, B, H, qL, kb.shape[2])
    L = _new_or(lse, "lse", (B, H, qL))
    _call(ctx, "tg_flash_attn_train_fwd_bf16", _ptr(qb), _ptr(kb), _ptr(vb), _ptr(o_bits),
          _ptr(L), p, mp, _ptr(mbits), 1 if causal else 0)
    if out is None:
        o = _bf16.like(o, qdt)
    return o, L


def flash_attn_train_bwd_compute_d(o, do, *, out=None, ctx=None):
    """``D[b,h,i] = sum_d o*do`` (``tg_flash_attn_train_bwd_compute_d_bf16``):
    o, do bf16 ``[B, H, qL, D]`` -> float32 ``[B, H, qL]``."""
    ctx = _ctx(ctx)
    ob = np.ascontiguousarray(_bf16.bits(o, "o"))
    dob = np.ascontiguousarray(_bf16.bits(do, "do"))
    if ob.ndim != 4:
        raise ValueError(f"o: expected a 4-D [B, H, qL, D] array, got shape {ob.shape}")
    _same_shape(ob, dob, "o", "do")
    B, H, qL, D = (_u32(n, x) for n, x in zip(("B", "H", "qL", "D"), ob.shape))
    Dv = _new_or(out, "out", (B, H, qL))
    _call(ctx, "tg_flash_attn_train_bwd_compute_d_bf16", _ptr(ob), _ptr(dob), _ptr(Dv),
          B, H, qL, D)
    return Dv


def flash_attn_train_bwd(q, k, v, lse, do, delta, *, mask=None, causal=False, scale=None,
                         softcap=None, q_offset=None, dq=None, dk=None, dv=None, ctx=None):
    """FA-2 backward (``tg_flash_attn_train_bwd_bf16``).

    q, k, v, mask, causal, scale, softcap, q_offset as in
    :func:`flash_attn_train_fwd`; lse float32 ``[B,H,qL]`` from the forward;
    do bf16 ``[B,H,qL,D]`` (any strides: they are the params' O_strides);
    delta float32 ``[B,H,qL]`` from :func:`flash_attn_train_bwd_compute_d`.
    Returns ``(dq, dk, dv)`` float32: dq ``[B,H,qL,D]`` (written), dk, dv
    ``[B,H_kv,kL,D]`` (accumulated into ``dk``/``dv`` when given, else
    fresh)."""
    ctx = _ctx(ctx)
    dob, dos, _ = _bf16_4d(do, "do")
    qb, kb, vb, _, p = _attn_setup(q, k, v, scale, softcap, q_offset, dos)
    B, H, qL, D = qb.shape
    Hkv, kL = kb.shape[1], kb.shape[2]
    if dob.shape != qb.shape:
        raise ValueError(f"do {dob.shape} must have q's shape {qb.shape}")
    L = _f32_in(lse, "lse")
    De = _f32_in(delta, "delta")
    for n, a in (("lse", L), ("delta", De)):
        if a.shape != (B, H, qL):
            raise ValueError(f"{n}: expected shape {(B, H, qL)}, got {a.shape}")
    mbits, mp = _mask_args(mask, B, H, qL, kL)
    dQ = _new_or(dq, "dq", (B, H, qL, D))
    dK = _new_or(dk, "dk", (B, Hkv, kL, D), zero=True)
    dV = _new_or(dv, "dv", (B, Hkv, kL, D), zero=True)
    if dK is dV or np.shares_memory(dK, dV):
        raise ValueError("dk and dv must not overlap")
    _call(ctx, "tg_flash_attn_train_bwd_bf16", _ptr(qb), _ptr(kb), _ptr(vb), _ptr(L),
          _ptr(dob), _ptr(De), _ptr(dQ), _ptr(dK), _ptr(dV), p, mp, _ptr(mbits),
          1 if causal else 0)
    return dQ, dK, dV


def flash_attn_backward(q, k, v, o, lse, do, *, mask=None, causal=False, scale=None,
                        softcap=None, q_offset=None, dq=None, dk=None, dv=None, ctx=None):
    """The whole attention backward: :func:`flash_attn_train_bwd_compute_d`
    on (o, do), then :func:`flash_attn_train_bwd`. Returns ``(dq, dk, dv)``
    float32 (dk/dv accumulate into given arrays)."""
    delta = flash_attn_train_bwd_compute_d(o, do, ctx=ctx)
    return flash_attn_train_bwd(q, k, v, lse, do, delta, mask=mask, causal=causal,
                                scale=scale, softcap=softcap, q_offset=q_offset,
                                dq=dq, dk=dk, dv=dv, ctx=ctx)


# ---------------------------------------------------------------------------
# 3. cast

def f32_to_bf16_cast(x, *, out=None, ctx=None):
    """float32 -> raw bf16 bits (``tg_f32_to_bf16_cast``): round to nearest
    even, any NaN -> 0x7FC0, +-inf kept. Returns uint16 of x's shape (or
    fills ``out``: uint16 / ml_dtypes.bfloat16)."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    dst = _new_or(out, "out", xs.shape, np.uint16)
    _call(ctx, "tg_f32_to_bf16_cast", _ptr(xs), _ptr(dst), ctypes.c_uint64(xs.size))
    return dst


def bf16_to_f32(x):
    """Exact widening of bf16 (raw bits or ml_dtypes.bfloat16) to float32
    (numpy; bf16 -> f32 is a shift, no kernel needed)."""
    return _bf16.to_float(x).reshape(np.shape(x))


# ---------------------------------------------------------------------------
# 4-5. RMSNorm

def _rms_w(w, dim, name="w"):
    w = _f32_in(w, name)
    if w.shape != (dim,):
        raise ValueError(f"{name}: expected shape ({dim},), got {w.shape}")
    return w


def _rms_r(r, rows, lead_shape):
    r = _f32_in(r, "r")
    if r.size != rows or r.shape not in (tuple(lead_shape), (rows,)):
        raise ValueError(f"r: expected shape {tuple(lead_shape)}, got {r.shape}")
    return r


def rms_norm_forward(x, w, eps=1e-6, *, out=None, rms_inv=None, return_rms_inv=False,
                     ctx=None):
    """``y = x * r * w`` with ``r = 1/sqrt(mean(x^2) + eps)`` per row
    (``tg_rms_norm_forward_f32``). x ``[..., dim]``, w ``[dim]``. Returns y, or
    ``(y, r)`` when ``return_rms_inv`` (r shape ``x.shape[:-1]``; also written
    into ``rms_inv`` when given)."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    rows, dim = _rows_dim(xs.shape, "x")
    ws = _rms_w(w, dim)
    y = _new_or(out, "out", xs.shape)
    r = None
    if rms_inv is not None:
        r = _out(rms_inv, "rms_inv", xs.shape[:-1])
    elif return_rms_inv:
        r = np.empty(xs.shape[:-1], np.float32)
    _call(ctx, "tg_rms_norm_forward_f32", _ptr(xs), _ptr(ws), _ptr(y), _ptr(r), rows, dim,
          float(eps))
    return (y, r) if return_rms_inv else y


def rms_norm_compute_rms_inv(x, eps=1e-6, *, out=None, ctx=None):
    """``r[b] = 1/sqrt(mean_j x[b,j]^2 + eps)`` (``tg_rms_norm_compute_rms_inv_f32``);
    x ``[..., dim]`` -> r ``x.shape[:-1]``."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    rows, dim = _rows_dim(xs.shape, "x")
    r = _new_or(out, "out", xs.shape[:-1])
    _call(ctx, "tg_rms_norm_compute_rms_inv_f32", _ptr(xs), _ptr(r), rows, dim, float(eps))
    return r


def rms_norm_backward_dx(x, w, dy, r, *, out=None, ctx=None):
    """RMSNorm input gradient from r (``tg_rms_norm_backward_dx_f32``):
    ``dx = r*(dy*w - x*s*r^2/dim)``, ``s = sum dy*x*w``. x, dy ``[..., dim]``,
    w ``[dim]``, r ``x.shape[:-1]``."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    rows, dim = _rows_dim(xs.shape, "x")
    ws = _rms_w(w, dim)
    dys = _f32_in(dy, "dy")
    _same_shape(xs, dys, "x", "dy")
    rs = _rms_r(r, rows, xs.shape[:-1])
    dx = _new_or(out, "out", xs.shape)
    _call(ctx, "tg_rms_norm_backward_dx_f32", _ptr(xs), _ptr(ws), _ptr(dys), _ptr(rs),
          _ptr(dx), rows, dim)
    return dx


def rms_norm_backward_dw(x, dy, r, *, out=None, ctx=None):
    """RMSNorm weight gradient ``dw[i] = sum_b dy*x*r`` (``tg_rms_norm_backward_dw_f32``,
    writes). x, dy ``[..., dim]``, r ``x.shape[:-1]`` -> dw ``[dim]``."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    rows, dim = _rows_dim(xs.shape, "x")
    dys = _f32_in(dy, "dy")
    _same_shape(xs, dys, "x", "dy")
    rs = _rms_r(r, rows, xs.shape[:-1])
    dw = _new_or(out, "out", (dim,))
    _call(ctx, "tg_rms_norm_backward_dw_f32", _ptr(xs), _ptr(dys), _ptr(rs), _ptr(dw),
          rows, dim)
    return dw


def rms_norm_backward(x, w, dy, eps=1e-6, *, grad_input=None, grad_weight=None, ctx=None):
    """Fused RMSNorm backward (``tg_rms_norm_backward``). Returns
    ``(grad_input, grad_weight)``: grad_input written; grad_weight ``[dim]``
    accumulated into the given array, or fresh."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    rows, dim = _rows_dim(xs.shape, "x")
    ws = _rms_w(w, dim)
    dys = _f32_in(dy, "dy")
    _same_shape(xs, dys, "x", "dy")
    gi = _new_or(grad_input, "grad_input", xs.shape)
    gw = _new_or(grad_weight, "grad_weight", (dim,), zero=True)
    _call(ctx, "tg_rms_norm_backward", _ptr(xs), _ptr(ws), _ptr(dys), _ptr(gi), _ptr(gw),
          rows, dim, float(eps))
    return gi, gw


# ---------------------------------------------------------------------------
# 6-9

def softmax_backward(sm, grad_out, *, out=None, ctx=None):
    """``grad_in = sm*(grad_out - sum_j sm*grad_out)`` per row (``tg_softmax_backward``);
    sm (the softmax output), grad_out ``[..., row_len]``."""
    ctx = _ctx(ctx)
    s = _f32_in(sm, "sm")
    g = _f32_in(grad_out, "grad_out")
    _same_shape(s, g, "sm", "grad_out")
    rows, n = _rows_dim(s.shape, "sm")
    gi = _new_or(out, "out", s.shape)
    _call(ctx, "tg_softmax_backward", _ptr(s), _ptr(g), _ptr(gi), rows, n)
    return gi


def embedding_backward(grad_out, ids, vocab_size=None, *, grad_weight=None, ctx=None):
    """``grad_weight[ids[t], :] += grad_out[t, :]`` (``tg_embedding_backward``).
    grad_out ``ids.shape + (dim,)``; returns grad_weight ``[vocab_size, dim]``
    (accumulated into the given one, whose first dim is the vocab size, or
    fresh). An id >= vocab_size raises BadIndexError, nothing written."""
    ctx = _ctx(ctx)
    go = _f32_in(grad_out, "grad_out")
    idx = _ids_in(ids, "ids")
    if go.ndim < 1 or go.shape[:-1] != idx.shape:
        raise ValueError(f"grad_out {go.shape} must be ids.shape {idx.shape} + (dim,)")
    dim = go.shape[-1]
    if vocab_size is None:
        if grad_weight is None:
            raise ValueError("give vocab_size or grad_weight")
        vocab_size = np.shape(grad_weight)[0]
    vocab = _u32("vocab_size", vocab_size)
    gw = _new_or(grad_weight, "grad_weight", (vocab, dim), zero=True)
    _call(ctx, "tg_embedding_backward", _ptr(go), _ptr(idx), _ptr(gw), vocab,
          _u32("seq_len", idx.size), _u32("dim", dim))
    return gw


def cross_entropy_fwd_bwd(logits, targets, pad_id, count=None, *, grad=None, loss=None,
                          ctx=None):
    """Cross-entropy loss and gradient (``tg_cross_entropy_fwd_bwd``).

    logits ``[..., vocab]``, targets ``logits.shape[:-1]``; positions whose
    target is ``pad_id`` are ignored (grad row 0). count: the divisor
    (default: the number of non-pad positions; 0 -> nothing is written).
    Returns ``(loss, grad)``: loss a Python float (``loss`` may be a
    1-element float32 array, accumulated into), grad float32 like logits
    (``(softmax - onehot)/count``). A non-pad target >= vocab raises
    BadIndexError, nothing written."""
    ctx = _ctx(ctx)
    lg = _f32_in(logits, "logits")
    tg = _ids_in(targets, "targets")
    if lg.ndim < 1 or lg.shape[:-1] != tg.shape:
        raise ValueError(f"logits {lg.shape} must be targets.shape {tg.shape} + (vocab,)")
    n_pos, vocab = _rows_dim(lg.shape, "logits")
    pad = _u32("pad_id", pad_id)
    if count is None:
        count = int((tg != pad).sum())
    cnt = _u32("count", count)
    g = _new_or(grad, "grad", lg.shape, zero=True)
    if loss is None:
        lo = np.zeros(1, np.float32)
    else:
        lo = _out(loss, "loss", (1,))
    _call(ctx, "tg_cross_entropy_fwd_bwd", _ptr(lg), _ptr(tg), _ptr(g), _ptr(lo), n_pos,
          vocab, pad, cnt)
    return float(lo[0]), g


def cross_entropy_fwd_bwd_ex(logits, targets, count=None, *, ignore_index=-100,
                             label_smoothing=0.0, grad_scale=1.0, grad=None, loss=None,
                             ctx=None):
    """PyTorch's cross-entropy loss and its gradient
    (``tg_cross_entropy_fwd_bwd_ex``).

    logits ``[n_pos, vocab]`` float32 or bf16 (raw ``uint16`` bits or
    ``ml_dtypes.bfloat16``); a view with a row stride (unit inner stride) is
    used as it is. targets ``[n_pos]`` integer; rows whose target is
    ``ignore_index`` are ignored (grad row 0). count: the divisor, any
    positive number (default: the non-ignored rows). label_smoothing eps as
    ``torch.nn.functional.cross_entropy``; the grad is multiplied by
    ``grad_scale``. Returns ``(loss, grad)``: loss a Python float (``loss``
    may be a 1-element float32 array, accumulated into), grad like logits
    (its dtype; ``grad=logits`` computes in place; a given grad must have
    logits' layout). A target outside [0, vocab) that is not ignore_index
    raises BadIndexError, nothing written; with every row ignored and no
    count given, returns ``(nan, zeros)`` as torch's mean."""
    ctx = _ctx(ctx)
    lg = np.asarray(logits)
    is_bf16 = _bf16.is_bf16_dtype(lg.dtype)
    if not is_bf16:
        if lg.dtype.kind != "f":
            raise TypeError(f"logits: expected float32 or bf16, got dtype {lg.dtype}")
        if lg.dtype != np.float32:
            lg = lg.astype(np.float32)
    bits = _bf16.bits(lg, "logits") if is_bf16 else lg
    if bits.ndim != 2:
        raise ValueError(f"logits must be 2-D [n_pos, vocab], got shape {bits.shape}")
    it = bits.itemsize
    if (bits.shape[1] > 1 and bits.strides[1] != it) or bits.strides[0] < 0 or \
            bits.strides[0] % it:
        bits = np.ascontiguousarray(bits)
    n_pos, vocab = _u32("n_pos", bits.shape[0]), _u32("vocab", bits.shape[1])
    ld = bits.strides[0] // it if n_pos > 1 else vocab
    tg = np.asarray(targets)
    if tg.dtype.kind not in "iu":
        raise TypeError(f"targets: expected an integer array, got dtype {tg.dtype}")
    if tg.shape != (n_pos,):
        raise ValueError(f"targets must have shape ({n_pos},), got {tg.shape}")
    tg = np.ascontiguousarray(tg, dtype=np.int64)
    kept = int((tg != ignore_index).sum())
    if count is None:
        count = kept
    if grad is None:
        g = np.zeros(bits.shape, lg.dtype)
        g_bits, g_ld = (_bf16.bits(g) if is_bf16 else g), vocab
    else:
        g_bits = _bf16.bits(grad, "grad") if is_bf16 else grad
        if not isinstance(grad, np.ndarray) or g_bits.dtype != bits.dtype or \
                g_bits.shape != bits.shape or g_bits.strides != bits.strides:
            raise ValueError("grad must be an array of logits' dtype, shape and strides")
        g, g_ld = grad, ld
    if g_ld != ld:           # a fresh grad is contiguous: copy logits to its layout
        bits = np.ascontiguousarray(bits)
        ld = vocab
    lo = np.zeros(1, np.float32) if loss is None else _out(loss, "loss", (1,))
    if count == 0 and kept == 0:        # torch's mean over no token: nan, zero grads
        g_bits[...] = 0
        return float("nan"), g
    opt = CeOptions(ignore_index, label_smoothing, grad_scale)
    _call(ctx, "tg_cross_entropy_fwd_bwd_ex", 0 if is_bf16 else 1, _ptr(bits), _ptr(tg),
          _ptr(g_bits), _ptr(lo), n_pos, vocab, ld, float(count), opt)
    return float(lo[0]), g


def transpose_2d(x, *, out=None, ctx=None):
    """``out[c, r] = x[r, c]`` (``tg_transpose_2d``); x float32 ``[rows, cols]``."""
    ctx = _ctx(ctx)
    xs = _f32_in(x, "x")
    if xs.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {xs.shape}")
    rows, cols = _u32("rows", xs.shape[0]), _u32("cols", xs.shape[1])
    o = _new_or(out, "out", (cols, rows))
    _call(ctx, "tg_transpose_2d", _ptr(xs), _ptr(o), rows, cols)
    return o


# ---------------------------------------------------------------------------
# 10. causal attention backward (token-major)

def causal_attention_backward(grad_out, q, k, v, n_heads=None, n_kv_heads=None, *,
                              grad_q=None, grad_k=None, grad_v=None, ctx=None):
    """Naive causal attention backward (``tg_causal_attention_backward``),
    token-major, scale ``1/sqrt(head_dim)``. Either 3-D arrays q, grad_out
    ``[seq, H, D]`` and k, v ``[seq, H_kv, D]`` (heads inferred), or 2-D
    ``[seq, H*D]`` / ``[seq, H_kv*D]`` with ``n_heads`` and ``n_kv_heads``.
    Returns ``(grad_q, grad_k, grad_v)`` shaped like q, k, v: grad_q written,
    grad_k/grad_v accumulated into the given arrays (or fresh)."""
    ctx = _ctx(ctx)
    go, Q, K, V = (_f32_in(a, n) for a, n in ((grad_out, "grad_out"), (q, "q"), (k, "k"),
                                                (v, "v")))
    _same_shape(Q, go, "q", "grad_out")
    _same_shape(K, V, "k", "v")
    if Q.ndim == 3:
        seq, H, D = Q.shape
        if K.ndim != 3 or K.shape[0] != seq or K.shape[2] != D:
            raise ValueError(f"k {K.shape} must be [seq, H_kv, D] with q {Q.shape}")
        Hkv = K.shape[1]
        if (n_heads not in (None, H)) or (n_kv_heads not in (None, Hkv)):
            raise ValueError("n_heads / n_kv_heads disagree with the 3-D shapes")
    elif Q.ndim == 2:
        if n_heads is None or n_kv_heads is None:
            raise ValueError("2-D token-major inputs need n_heads and n_kv_heads")
        H, Hkv = int(n_heads), int(n_kv_heads)
        seq = Q.shape[0]
        if H < 1 or Hkv < 1 or Q.shape[1] % H:
            raise ValueError(f"q width {Q.shape[1]} is not n_heads={H} times a head dim")
        D = Q.shape[1] // H
        if K.ndim != 2 or K.shape != (seq, Hkv * D):
            raise ValueError(f"k must be [seq, n_kv_heads*head_dim] = {(seq, Hkv * D)}, "
                             f"got {K.shape}")
    else:
        raise ValueError(f"q must be 2-D or 3-D, got shape {Q.shape}")
    gq = _new_or(grad_q, "grad_q", Q.shape)
    gk = _new_or(grad_k, "grad_k", K.shape, zero=True)
    gv = _new_or(grad_v, "grad_v", V.shape, zero=True)
    if np.shares_memory(gk, gv):
        raise ValueError("grad_k and grad_v must not overlap")
    _call(ctx, "tg_causal_attention_backward", _ptr(go), _ptr(Q), _ptr(K), _ptr(V), _ptr(gq),
          _ptr(gk), _ptr(gv), _u32("seq_len", seq), _u32("n_heads", H),
          _u32("n_kv_heads", Hkv), _u32("head_dim", D))
    return gq, gk, gv


# ---------------------------------------------------------------------------
# 11. decode reduce

def pack_vec_partials(partials, S, M):
    """Build the ``htmp`` buffer of the split-KV decode kernel from
    partials ``[nrows, nwg, DV]`` (unnormalised outputs), S and M
    ``[nrows, nwg]`` (sum of exp weights, running max): the interleaved
    layout of KERNELS.md kernel 11. Returns a flat float32 array."""
    P = np.asarray(partials, np.float32)
    if P.ndim != 3 or P.shape[2] % 4:
        raise ValueError(f"partials must be [nrows, nwg, DV] with DV % 4 == 0, got {P.shape}")
    nrows, nwg, DV = P.shape
    S = np.asarray(S, np.float32)
    M = np.asarray(M, np.float32)
    if S.shape != (nrows, nwg) or M.shape != (nrows, nwg):
        raise ValueError(f"S and M must be [nrows, nwg] = {(nrows, nwg)}")
    head = P.reshape(nrows, nwg, DV // 4, 4).transpose(0, 2, 1, 3).reshape(-1)
    tail = np.stack([S, M], axis=-1).reshape(-1)
    return np.concatenate([head, tail]).astype(np.float32)


def _vec_reduce(name, htmp, nrows, head_dim, out, ctx):
    ctx = _ctx(ctx)
    h = _f32_in(htmp, "htmp").reshape(-1)
    nrows, head_dim = _u32("nrows", nrows), _u32("head_dim", head_dim)
    per = nrows * (head_dim + 2)
    if per == 0 or h.size == 0:
        nwg = 0            # let the library refuse the zero size with its message
    else:
        nwg, rem = divmod(h.size, per)
        if rem:
            raise ValueError(f"htmp has {h.size} floats, not a multiple of "
                             f"nrows*(head_dim+2) = {per}")
    dst = _new_or(out, "out", (nrows, head_dim))
    _call(ctx, name, _ptr(h), _ptr(dst), nrows, head_dim, _u32("nwg", nwg))
    return dst


def flash_attn_vec_reduce(htmp, nrows, head_dim, *, out=None, ctx=None):
    """Combine split-KV decode partials (``tg_flash_attn_vec_reduce``). htmp
    flat float32 of ``nrows*nwg*(head_dim+2)`` values (see
    :func:`pack_vec_partials`; nwg inferred) -> ``[nrows, head_dim]``."""
    return _vec_reduce("tg_flash_attn_vec_reduce", htmp, nrows, head_dim, out, ctx)


def flash_attn_vec_reduce_tq_hb_undo(htmp, nrows, head_dim, *, out=None, ctx=None):
    """The reduce, then the normalised Walsh-Hadamard transform and D1 sign
    undo (``tg_flash_attn_vec_reduce_tq_hb_undo``; head_dim 256 or 512)."""
    return _vec_reduce("tg_flash_attn_vec_reduce_tq_hb_undo", htmp, nrows, head_dim, out,
                       ctx)


def fwht_sign_undo_(data, *, ctx=None):
    """In place: FWHT, times ``1/sqrt(head_dim)``, D1 sign undo
    (``tg_fwht_sign_undo_f32``). data: C-contiguous writeable float32
    ``[..., head_dim]`` (head_dim 256 or 512). Returns data."""
    ctx = _ctx(ctx)
    if not isinstance(data, np.ndarray) or data.dtype != np.float32:
        raise TypeError("fwht_sign_undo_: data must be a float32 numpy array")
    _out(data, "data", data.shape)
    heads, dim = _rows_dim(data.shape, "data")
    _call(ctx, "tg_fwht_sign_undo_f32", _ptr(data), heads, dim)
    return data


def fwht_sign_undo(data, *, ctx=None):
    """Out-of-place :func:`fwht_sign_undo_` (returns a new float32 array)."""
    d = np.array(data, dtype=np.float32, order="C", copy=True)
    return fwht_sign_undo_(d, ctx=ctx)


# ---------------------------------------------------------------------------
# 12. RoPE, 13. gated linear units

__all__ += ["rope_forward", "rope_backward", "glu_forward", "glu_backward"]

_ROPE_LAYOUTS = {"rotate_half": 0, "interleaved": 1}
_GLU_ACTS = {"silu": 0, "gelu_tanh": 1}


def _f32_or_bf16(a, name):
    """-> (array the kernel reads: float32 or raw uint16 bits, tg_dtype,
    original dtype); floats other than float32 are converted."""
    a = np.asarray(a)
    if _bf16.is_bf16_dtype(a.dtype):
        return _bf16.bits(a, name), 0, a.dtype
    if a.dtype.kind != "f":
        raise TypeError(f"{name}: expected float32 or bf16 data, got dtype {a.dtype}")
    return (a if a.dtype == np.float32 else a.astype(np.float32)), 1, np.dtype(np.float32)


def _strides_or_copy(a, ndim, name):
    """(array, element strides of all but the last dim), copying a layout
    whose innermost stride is not 1 or whose strides are negative."""
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    it = a.itemsize
    bad = any(s < 0 or s % it for s in a.strides) or (a.shape[-1] > 1 and a.strides[-1] != it)
    if bad:
        a = np.ascontiguousarray(a)
    return a, tuple(s // it for s in a.strides[:-1])


def _rope(name, x, cos, sin, layout, out, out_dtype, ctx):
    ctx = _ctx(ctx)
    if layout not in _ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_ROPE_LAYOUTS)}, got {layout!r}")
    xs, xt, xdt = _f32_or_bf16(x, "x")
    xs, xst = _strides_or_copy(xs, 4, "x")
    B, H, L, D = xs.shape
    tabs = []
    for nm, t in (("cos", cos), ("sin", sin)):
        ts, tt_, tdt = _f32_or_bf16(t, nm)
        if ts.ndim == 2:
            ts = ts[None]
        ts, tst = _strides_or_copy(ts, 3, nm)
        if ts.shape[0] not in (1, B) or ts.shape[1] != L:
            raise ValueError(f"{nm}: expected shape [{B} or 1, {L}, R], got {ts.shape}")
        tabs.append((ts, tt_, tdt, (tst[0] if ts.shape[0] == B and B > 1 else 0, tst[1])))
    (cs, ct, cdt, cst), (ss, st_, sdt, sst) = tabs
    if ct != st_ or cs.shape != ss.shape:
        raise ValueError("cos and sin must have one dtype and one shape")
    R = cs.shape[2]
    if out_dtype is None:  # torch's promotion of x and the tables
        out_dtype = xdt if xt == ct else np.float32
    out_dtype = np.dtype(out_dtype)
    yt = 0 if _bf16.is_bf16_dtype(out_dtype) else 1
    if yt == 1 and out_dtype != np.float32:
        raise TypeError(f"out_dtype must be float32 or bf16, got {out_dtype}")
    if out is None:
        y = np.empty((B, H, L, D), np.uint16 if yt == 0 else np.float32)
    else:
        y = out if yt == 1 else _bf16.bits(out, "out")
        if y.shape != (B, H, L, D) or not y.flags["WRITEABLE"]:
            raise ValueError(f"out: expected a writeable array of shape {(B, H, L, D)}")
        if (y.dtype == np.float32) != (yt == 1):
            raise TypeError(f"out: expected dtype {out_dtype}, got {out.dtype}")
    y, yst = _strides_or_copy(y, 4, "out")
    if out is not None and not np.shares_memory(y, out):
        raise ValueError("out: its layout cannot be written in place (inner stride != 1)")
    p = RopeParams()
    p.B, p.H, p.L, p.D, p.rotary_dim = B, H, L, D, R
    p.layout, p.x_dtype, p.y_dtype, p.table_dtype = _ROPE_LAYOUTS[layout], xt, yt, ct
    for j in range(3):
        p.x_strides[j], p.y_strides[j] = xst[j], yst[j]
    for j in range(2):
        p.cos_strides[j], p.sin_strides[j] = cst[j], sst[j]
    _call(ctx, name, _ptr(xs), _ptr(cs), _ptr(ss), _ptr(y), ctypes.byref(p))
    return _bf16.like(y, out_dtype) if yt == 0 and out is None else (out if out is not None else y)


def rope_forward(x, cos, sin, *, layout="rotate_half", out=None, out_dtype=None, ctx=None):
    """RoPE as HF's ``apply_rotary_pos_emb`` on one of q, k
    (``tg_rope_forward``). x ``[B, H, L, D]`` (float32 or bf16; strided views
    such as a ``[B, L, H, D]`` buffer transposed go in as they are), cos and
    sin ``[B or 1, L, R]`` or ``[L, R]`` (R = rotary_dim: the first R features
    rotate, the rest pass through), ``layout`` "rotate_half" or
    "interleaved". The result has ``out_dtype`` (default: x's dtype if the
    tables share it, else float32, as torch promotes); ``out`` may be x
    itself (in place)."""
    return _rope("tg_rope_forward", x, cos, sin, layout, out, out_dtype, ctx)


def rope_backward(dy, cos, sin, *, layout="rotate_half", out=None, out_dtype=None, ctx=None):
    """The transpose of :func:`rope_forward` (``tg_rope_backward``): dx from
    dy with the same tables and conventions."""
    return _rope("tg_rope_backward", dy, cos, sin, layout, out, out_dtype, ctx)


def _glu_2d(a, name, shape=None):
    """-> (array, tg_dtype, dtype, row stride in elements) of a 2-D operand."""
    b, t, dt = _f32_or_bf16(a, name)
    b, st = _strides_or_copy(b, 2, name)
    if shape is not None and b.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {b.shape}")
    return b, t, dt, st[0] if b.shape[0] > 1 else b.shape[1]


def _glu_out(out, name, shape, t, dt):
    if out is None:
        o = np.empty(shape, np.float32 if t == 1 else np.uint16)
        return o, o, shape[1]
    b, ot, _, st = _glu_2d(out, name, shape)
    if ot != t or not b.flags["WRITEABLE"] or not np.shares_memory(b, out):
        raise ValueError(f"{name}: expected a writeable {dt} array of shape {shape} "
                         "with inner stride 1")
    return out, b, st


def glu_forward(gate, up, act="silu", *, out=None, ctx=None):
    """``act(gate) * up`` (``tg_glu_forward``), act "silu" (SwiGLU) or
    "gelu_tanh" (GeGLU). gate, up ``[rows, cols]`` of one dtype (float32 or
    bf16), row-strided views allowed (the chunks of a fused gate_up); ``out``
    may be gate or up itself."""
    ctx = _ctx(ctx)
    if act not in _GLU_ACTS:
        raise ValueError(f"act must be one of {sorted(_GLU_ACTS)}, got {act!r}")
    g, t, dt, gs = _glu_2d(gate, "gate")
    u, ut, _, us = _glu_2d(up, "up", g.shape)
    if ut != t:
        raise TypeError("gate and up must have one dtype")
    res, y, ys = _glu_out(out, "out", g.shape, t, dt)
    rows, cols = _u32("rows", g.shape[0]), _u32("cols", g.shape[1])
    _call(ctx, "tg_glu_forward", _ptr(g), _ptr(u), _ptr(y), _GLU_ACTS[act], t, rows, cols,
          ctypes.c_int64(gs), ctypes.c_int64(us), ctypes.c_int64(ys))
    return _bf16.like(res, dt) if out is None and t == 0 else res


def glu_backward(gate, up, dy, act="silu", *, dgate=None, dup=None, ctx=None):
    """``(dgate, dup) = (dy * up * act'(gate), dy * act(gate))``
    (``tg_glu_backward``); dgate may be gate itself and dup up itself."""
    ctx = _ctx(ctx)
    if act not in _GLU_ACTS:
        raise ValueError(f"act must be one of {sorted(_GLU_ACTS)}, got {act!r}")
    g, t, dt, gs = _glu_2d(gate, "gate")
    u, ut, _, us = _glu_2d(up, "up", g.shape)
    d, dyt, _, ds = _glu_2d(dy, "dy", g.shape)
    if not (ut == t == dyt):
        raise TypeError("gate, up and dy must have one dtype")
    rg, og, ogs = _glu_out(dgate, "dgate", g.shape, t, dt)
    ru, ou, ous = _glu_out(dup, "dup", g.shape, t, dt)
    rows, cols = _u32("rows", g.shape[0]), _u32("cols", g.shape[1])
    _call(ctx, "tg_glu_backward", _ptr(g), _ptr(u), _ptr(d), _ptr(og), _ptr(ou),
          _GLU_ACTS[act], t, rows, cols, ctypes.c_int64(gs), ctypes.c_int64(us),
          ctypes.c_int64(ds), ctypes.c_int64(ogs), ctypes.c_int64(ous))
    if t == 0:
        rg = _bf16.like(rg, dt) if dgate is None else rg
        ru = _bf16.like(ru, dt) if dup is None else ru
    return rg, ru
