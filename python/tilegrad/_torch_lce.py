"""Fused linear cross-entropy: the LM head and the loss in chunks of tokens,
so the ``[T, V]`` logits never exist whole (in float32 or bf16).

For each chunk of ``C`` tokens (h_c ``[C, H]``, labels y_c ``[C]``):

    z_c   = h_c @ W^T (+ b)                        [C, V]  PyTorch's GEMM
    z_c   = c * tanh(z_c / c)                      (softcap c, Gemma 2)
    loss += CE(z_c, y_c); g_c = dloss/dz_c         in place over z_c (the C kernel)
    g_c  *= 1 - tanh^2                             (softcap's derivative)
    dh_c  = g_c @ W                                [C, H]
    dW   += g_c^T @ h_c,  db += sum_t g_c          float32 accumulators

The gradients are computed in the forward (as Liger-Kernel's fused linear
cross-entropy does: the chunk's logits are at hand then) and the backward
only scales them by the loss's incoming gradient. Loss semantics are
``torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index,
label_smoothing)`` with HF's ``num_items_in_batch`` divisor; float64 inputs
compute the chunk's loss in float64 torch ops (the C kernel is f32/bf16), so
the float64 path is gradcheck-exact and tests the chunking itself.

Public: :func:`linear_cross_entropy`, :func:`causal_lm_loss` (re-exported by
:mod:`tilegrad.torch`). The op ``tilegrad::linear_cross_entropy_fwd`` is a
``torch.library.custom_op`` with a fake impl and registered autograd on
PyTorch >= 2.4; plain eager calls take an autograd Function around the same
implementation (``tilegrad._torch_paths._forward``), PyTorch 1.13 only that.
"""
import math
import os
from typing import Optional, Tuple

import torch

from . import capi as _capi
from ._torch_common import _context, _ptr, _threads_arg
from ._torch_paths import (HAVE_CUSTOM_OPS, _autocast_cast, _check_cpu, _custom_op,
                           _direct, _forward)

Tensor = torch.Tensor

REDUCTIONS = ("mean", "sum")

# ---------------------------------------------------------------------------
# the chunk size


def _cache_bytes(level: int) -> int:
    """Size of this CPU's level-``level`` data/unified cache (per instance)
    from /sys, else os.sysconf, else 0. Read once, at import."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in sorted(os.listdir(base)):
            d = os.path.join(base, idx)
            with open(os.path.join(d, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as f:
                txt = f.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
            return int(txt.rstrip("KMG")) * mult
    except (OSError, ValueError):
        pass
    try:
        return max(0, int(os.sysconf(f"SC_LEVEL{level}_CACHE_SIZE")))
    except (ValueError, OSError, AttributeError):
        return 0


#: The last-level cache (per instance), the chunk's budget; 32 MiB where
#: /sys and sysconf say nothing.
_LLC_BYTES = _cache_bytes(3) or _cache_bytes(2) or (32 << 20)

#: Tokens per chunk: the power of two nearest LLC / (2 V), the tokens whose
#: bf16 logits fill the last-level cache (so the kernel reads the chunk the
#: GEMM just wrote, and the backward GEMMs its gradient, from the LLC rather
#: than memory), within [_CHUNK_MIN, _CHUNK_MAX]: below 256 tokens the dW
#: GEMM of a chunk ([V, C] x [C, H], K = C) is bound by the traffic of its
#: [V, H] output and W is streamed once more per chunk; above 1024 the
#: chunk's logits only cost memory. Measured on the 2-core Xeon (AMX, 300 MiB
#: L3, shared with other jobs: +-30% between runs), bf16 autocast, T 2048,
#: fwd + bwd (bench/lce_bench.py --chunks, one run each):
#:   H 896, V 151936: C 128 10.7 s, 256 11.5 s, 512 7.9 s, 1024 6.9 s, 2048 7.6 s
#:     (peak RSS above the inputs 1097 / 1134 / 1208 / 1357 / 1653 MiB);
#:     the rule gives 1024 (LLC / 2V = 1035);
#:   H 2048, V 32000: C 256 3.4 s, 512 5.5 s, 1024 4.7 s, 2048 5.4 s (no
#:     trend above the noise; 544-653 MiB); the rule gives 1024.
_CHUNK_MIN, _CHUNK_MAX = 256, 1024


def _auto_chunk(n_tok: int, vocab: int) -> int:
    """Tokens per chunk for ``n_tok`` tokens and a vocabulary of ``vocab``
    (the rule above _CHUNK_MIN)."""
    target = max(1.0, _LLC_BYTES / (2.0 * vocab))
    c = 1 << max(0, round(math.log2(target)))        # the nearest power of two
    c = max(_CHUNK_MIN, min(_CHUNK_MAX, c))
    return max(1, min(c, n_tok))


# ---------------------------------------------------------------------------
# the implementation (tensors in, tensors out; the only place that calls C)

def _chunk_loss_f64(z: Tensor, y: Tensor, divisor: float, ignore_index: int,
                    eps: float) -> Tuple[float, Tensor]:
    """float64 logits chunk [C, V] -> (sum_t loss_t / divisor, dloss/dz in
    place of z): torch's formulas in float64 (the C kernel is f32)."""
    V = z.shape[1]
    keep = y != ignore_index
    yk = torch.where(keep, y, torch.zeros_like(y))
    logp = torch.log_softmax(z, dim=1)
    nll = -logp.gather(1, yk.unsqueeze(1)).squeeze(1)
    loss_t = (1 - eps) * nll - eps * logp.mean(1) if eps else nll
    loss = float(torch.where(keep, loss_t, torch.zeros_like(loss_t)).sum()) / divisor
    g = torch.exp(logp, out=z)
    g.scatter_add_(1, yk.unsqueeze(1), torch.full_like(g[:, :1], -(1 - eps)))
    if eps:
        g.sub_(eps / V)
    g.mul_(1.0 / divisor)
    g.masked_fill_(~keep.unsqueeze(1), 0.0)
    return loss, g


def _chunk_loss_c(ctx, z: Tensor, y: Tensor, divisor: float, ignore_index: int,
                  eps: float) -> float:
    """float32 / bfloat16 logits chunk [C, V] (unit inner stride) -> sum_t
    loss_t / divisor; dloss/dz written over z (tg_cross_entropy_fwd_bwd_ex,
    in place)."""
    out = torch.zeros(1, dtype=torch.float32)
    dt = _capi.TG_DTYPE_BF16 if z.dtype == torch.bfloat16 else _capi.TG_DTYPE_F32
    ctx.call("tg_cross_entropy_fwd_bwd_ex", dt, _ptr(z), _ptr(y), _ptr(z), _ptr(out),
             z.shape[0], z.shape[1], z.stride(0), float(divisor),
             _capi.CeOptions(ignore_index, eps, 1.0))
    return float(out[0])


#: bf16 logits chunks go to the C kernel as bf16 (read bf16, grad written in
#: place as bf16): the .float() copy and the grad's cast back are gone.
#: Measured on the 2-core Xeon (AMX), a [1024, 151936] chunk, 2 threads,
#: medians of 7 alternating: 223 ms in bf16 against 880 ms for .float() +
#: the f32 kernel + .to(bfloat16) (/tmp script; the same bits up to the
#: grad's one rounding, which both paths make). False: the f32 path.
_BF16_KERNEL = True


def _master(hidden: Tensor, t: Tensor) -> bool:
    """Is t a float32 master weight (or bias) of bf16 hidden states, as
    autocast leaves them? The op casts it for the GEMMs and returns its
    gradient in float32."""
    return hidden.dtype == torch.bfloat16 and t.dtype == torch.float32


#: Rows of dW per bf16 GEMM of a chunk's dW before its float32 sum: a
#: [rows, H] bf16 buffer instead of one of [V, H] (at V 151936, H 896:
#: 7.3 MB against 272 MB). Each element of dW is one dot over the chunk's
#: tokens whichever rows a GEMM takes. No slower: a chunk's 38 slice GEMMs
#: took 198 ms where its one [V, H] GEMM took 265 (Qwen2.5-0.5B, T 2048,
#: 2 threads, the lent Xeon, one profiled step).
_DW_ROWS = 4096


def _need_lce_args(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor],
                   divisor: Optional[Tensor]) -> None:
    """Shapes and dtypes the op needs (checked on every op call: a direct
    torch.ops call cannot make the kernel read outside a tensor)."""
    op = "tilegrad::linear_cross_entropy_fwd"
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: hidden [N, H] and weight [V, H] expected; got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}")
    if labels.dim() != 1 or labels.shape[0] != hidden.shape[0] or labels.dtype != torch.int64:
        raise ValueError(f"{op}: labels must be int64 [N] = [{hidden.shape[0]}]; got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape ({weight.shape[0]},), got "
                         f"{tuple(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype and not _master(hidden, t):
            raise TypeError(f"{op}: {name} must have hidden's dtype {hidden.dtype} (or be "
                            f"float32 beside bfloat16 hidden), got {t.dtype}")
    if hidden.dtype not in (torch.float32, torch.bfloat16, torch.float64):
        raise TypeError(f"{op}: hidden must be float32, bfloat16 or float64, got {hidden.dtype}")
    if divisor is not None and divisor.numel() != 1:
        raise ValueError(f"{op}: divisor must have one element, got shape "
                         f"{tuple(divisor.shape)}")


def _lce_fwd_impl(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor],
                  divisor: Optional[Tensor], ignore_index: int, reduction_sum: bool,
                  label_smoothing: float, softcap: float, chunk_size: int, want_dh: bool,
                  want_dw: bool, want_db: bool,
                  threads: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """hidden [N, H], weight [V, H], labels int64 [N], bias None or [V] (one
    float dtype) -> (loss, dh [N, H], dw [V, H], db [V]) with dh, dw, db in
    hidden's dtype (shape (0,) where not wanted) and loss a 0-dim float32
    (float64 for float64 inputs). The divisor: divisor's value (HF's
    num_items_in_batch) if given, else the non-ignored labels (mean) or 1
    (reduction_sum). softcap 0: none; chunk_size >= 1 tokens."""
    _need_lce_args(hidden, weight, labels, bias, divisor)
    op = "linear_cross_entropy"
    N, H = hidden.shape
    V = weight.shape[0]
    dt = hidden.dtype
    loss_dt = torch.float64 if dt == torch.float64 else torch.float32
    keep = labels != ignore_index
    bad = keep & ((labels < 0) | (labels >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: labels[{i}] = {int(labels[i])} is outside [0, vocab = {V}) "
                         f"and is not ignore_index = {ignore_index}")
    kept = int(keep.sum())
    if divisor is not None:
        d = float(divisor.reshape(()).item())
        if math.isnan(d) or d < 0 or math.isinf(d):
            raise ValueError(f"{op}: num_items_in_batch = {d} must be finite and >= 0")
        if d == 0 and kept:
            raise ValueError(f"{op}: num_items_in_batch = 0 with {kept} labels that are not "
                             "ignore_index")
    else:
        d = 1.0 if reduction_sum else float(kept)
    dh = hidden.new_zeros((N, H) if want_dh else (0,))
    acc_dt = torch.float64 if dt == torch.float64 else torch.float32
    dw = None if want_dw else torch.zeros((0,), dtype=acc_dt)    # [V, H]: the first chunk's
    db = torch.zeros((V,) if want_db and bias is not None else (0,), dtype=acc_dt)
    if kept == 0:        # nothing to learn from: torch's 0/0 = nan for a mean, 0 for a sum
        loss = math.nan if d == 0 else 0.0
        dw = torch.zeros((V, H) if want_dw else (0,), dtype=weight.dtype)
        return (torch.tensor(loss, dtype=loss_dt), dh, dw,
                db.to(bias.dtype if bias is not None else dt))
    ctx = _context(threads, False) if dt != torch.float64 else None
    hidden = hidden.contiguous()
    w_dt, b_dt = weight.dtype, None if bias is None else bias.dtype
    # float32 master weights of bf16 hidden states: cast here, for the
    # GEMMs only (this copy is not kept: the backward needs no weight)
    weight = weight.to(dt).contiguous()
    bias = None if bias is None else bias.to(dt)
    labels = labels.contiguous()
    wt = weight.t()
    total = 0.0
    # buffers reused by every chunk: a fresh [C, V] or [V, H] tensor per chunk
    # comes from mmap and its page faults cost more than its GEMM
    C = min(chunk_size, N)
    zbuf = torch.empty((C, V), dtype=dt)
    dw_part = None       # a bf16 chunk's dW slice, before its f32 sum
    with torch.autocast("cpu", enabled=False):       # inputs are cast already
        for c0 in range(0, N, chunk_size):
            c1 = min(N, c0 + chunk_size)
            y = labels[c0:c1]
            if not bool(keep[c0:c1].any()):
                continue                              # an all-ignored chunk: grads 0
            h = hidden[c0:c1]
            z = zbuf[:c1 - c0]                        # [c, V] = h W^T (+ b)
            if bias is not None:
                torch.addmm(bias, h, wt, out=z)
            else:
                torch.mm(h, wt, out=z)
            t = None
            if softcap:
                # in place where the chunk allows: [C, V] float32 temporaries are
                # 1 GB each at V 256000 (Gemma 2)
                t = z.float() if dt == torch.bfloat16 else z.clone()
                t.div_(softcap).tanh_()
                z = t * softcap                                   # f32 (f64) capped logits
            elif dt == torch.bfloat16 and not _BF16_KERNEL:
                z = z.float()
            if dt == torch.float64:
                part, g = _chunk_loss_f64(z, y, d, ignore_index, label_smoothing)
            else:
                part, g = _chunk_loss_c(ctx, z, y, d, ignore_index, label_smoothing), z
            total += part
            if not (want_dh or want_dw or want_db):
                continue
            if t is not None:                 # d(c tanh(x/c))/dx = 1 - tanh^2
                g = g.mul_(t.mul_(t).neg_().add_(1.0))
            if g.dtype != dt:
                g = g.to(dt)
            if want_dh:
                torch.mm(g, weight, out=dh[c0:c1])
            if want_dw:
                if dt == torch.bfloat16 and (dw is not None or c1 < N or w_dt != dt):
                    # bf16 chunks: dW's rows in slices, each one bf16 GEMM into a
                    # small buffer, then copied (the first chunk) or added into the
                    # float32 sum while the slice is in cache (no [V, H] bf16
                    # temporary beside the sum, no pass over it to convert it)
                    first = dw is None
                    if first:
                        dw = torch.empty((V, H), dtype=acc_dt)
                        dw_part = torch.empty((min(V, _DW_ROWS), H), dtype=dt)
                    for r0 in range(0, V, _DW_ROWS):
                        r1 = min(V, r0 + _DW_ROWS)
                        part = torch.mm(g[:, r0:r1].t(), h, out=dw_part[:r1 - r0])
                        if first:
                            dw[r0:r1].copy_(part)
                        else:
                            dw[r0:r1].add_(part)
                elif dw is None:
                    # dW itself: one GEMM in dt (a single bf16 chunk of a bf16
                    # weight: the unfused loss's one bf16 GEMM; float32 / float64:
                    # the sum's start)
                    dw = torch.mm(g.t(), h)
                else:
                    dw.addmm_(g.t(), h)
            if db.numel():
                db.add_(g.sum(0, dtype=acc_dt))
    # the chunk buffers freed before dW's cast to its dtype (the op's peak)
    z = g = t = None
    del zbuf, dw_part, weight, wt
    loss = torch.tensor(total, dtype=loss_dt)
    if dw is None:       # every chunk ignored but for rows outside all chunks: none
        dw = torch.zeros((V, H), dtype=w_dt)
    return (loss, dh, dw.to(w_dt) if dw.dtype != w_dt else dw,
            db.to(b_dt) if db.numel() and db.dtype != b_dt else db)


def _lce_fwd_fake(hidden, weight, labels, bias, divisor, ignore_index, reduction_sum,
                  label_smoothing, softcap, chunk_size, want_dh, want_dw, want_db, threads):
    dt = hidden.dtype
    loss_dt = torch.float64 if dt == torch.float64 else torch.float32
    N, H = hidden.shape
    V = weight.shape[0]
    return (hidden.new_empty((), dtype=loss_dt), hidden.new_empty((N, H) if want_dh else (0,)),
            weight.new_empty((V, H) if want_dw else (0,)),
            (bias if bias is not None else hidden).new_empty(
                (V,) if want_db and bias is not None else (0,)))


def _lce_save(ctx, dh: Tensor, dw: Tensor, db: Tensor) -> None:
    ctx.save_for_backward(dh, dw, db)


def _scaled(grad: Tensor, dloss: Tensor) -> Tensor:
    """grad * dloss; grad itself for the usual dloss of exactly 1
    (``loss.backward()``), so a [V, H] weight gradient is handed to the
    weight's .grad as it is (autograd takes it over once this node's saved
    tensors are released) and not copied next to itself."""
    if _direct(grad, dloss) and dloss.numel() == 1 and float(dloss) == 1.0:
        return grad
    return grad * dloss.to(grad.dtype)


def _lce_grads(ctx, dloss: Tensor):
    """The gradients of the op's 14 inputs: the forward's, scaled by dloss."""
    dh, dw, db = ctx.saved_tensors
    need = tuple(ctx.needs_input_grad) + (False,) * 14
    gh = dh * dloss.to(dh.dtype) if need[0] and dh.numel() else None
    gw = _scaled(dw, dloss) if need[1] and dw.numel() else None
    gb = _scaled(db, dloss) if need[3] and db.numel() else None
    return (gh, gw, None, gb) + (None,) * 10


def _lce_setup_context(ctx, inputs, output):
    _lce_save(ctx, *output[1:])


def _lce_backward(ctx, dloss, ddh, ddw, ddb):
    return _lce_grads(ctx, dloss)


#: tilegrad::linear_cross_entropy_fwd (PyTorch >= 2.4; None on 1.13, where
#: _LCEFunction is the only path)
linear_cross_entropy_fwd = None
if HAVE_CUSTOM_OPS:
    linear_cross_entropy_fwd = _custom_op("linear_cross_entropy_fwd", _lce_fwd_impl,
                                          _lce_fwd_fake)
    linear_cross_entropy_fwd.register_autograd(_lce_backward, setup_context=_lce_setup_context)


class _LCEFunction(torch.autograd.Function):
    """The op's implementation behind autograd, without the dispatcher."""

    @staticmethod
    def forward(ctx, *inputs):
        loss, dh, dw, db = _lce_fwd_impl(*inputs)
        _lce_save(ctx, dh, dw, db)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        return _lce_grads(ctx, dloss)


# ---------------------------------------------------------------------------
# user-facing functions

def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor,
                         bias: Optional[Tensor] = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         softcap: Optional[float] = None, num_items_in_batch=None,
                         chunk_size: Optional[int] = None,
                         threads: Optional[int] = None) -> Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), labels)``
    without the logits: the LM head and the loss computed in chunks of
    tokens, the gradients of hidden, weight and bias in the forward.

    hidden ``[..., H]`` and labels ``[...]`` (already aligned: no shift
    here, see :func:`causal_lm_loss`), weight ``[V, H]`` (a tied embedding's
    weight works as is), bias ``[V]`` or None. ``ignore_index``,
    ``label_smoothing`` and ``reduction`` ("mean" or "sum"; "none" is not
    supported: it needs each token's gradient scaled by its own incoming
    gradient, known only after the forward) as ``F.cross_entropy``;
    ``softcap`` c: the logits are ``c * tanh(z / c)`` before the loss
    (Gemma 2's ``final_logit_softcapping``); ``num_items_in_batch`` (a
    number or a one-element tensor, HF's gradient-accumulation divisor): the
    loss is the sum over tokens divided by it (reduction must then be
    "mean"). With every label ignored: nan for a mean, 0 for a sum, zero
    gradients (as torch).

    dtypes: float32 and bfloat16 run the C kernel (bfloat16 logits chunks
    read and their gradients written in bf16 by the kernel, computed in
    f32); float64 computes each chunk's loss in float64 torch ops. weight
    and bias have hidden's dtype, or are float32 beside bfloat16 hidden (a
    mixed-precision model's master weights: cast inside for the GEMMs, no
    copy kept, dW summed and returned in float32). Under CPU autocast hidden
    is cast to its dtype, as ``F.linear`` would, and float32 weights stay
    masters, so the logits and the loss are those of ``F.linear`` under
    autocast upcast to float32 (HF's ``logits.float()``). The loss is
    float32 (float64 for float64 inputs); the gradients come back in the
    inputs' dtypes.

    chunk_size: tokens per chunk (None: from the vocabulary, see
    ``_auto_chunk``); threads: the C kernel's (None: torch's).
    """
    _check_cpu(hidden, weight, labels, bias)
    if isinstance(num_items_in_batch, Tensor):
        _check_cpu(num_items_in_batch)
    if reduction not in REDUCTIONS:
        if reduction == "none":
            raise NotImplementedError(
                "linear_cross_entropy: reduction='none' is not supported (the gradients are "
                "computed in the forward, and per-token losses would need each token's own "
                "incoming gradient); use 'mean' or 'sum'")
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, got "
                         f"{reduction!r}")
    if num_items_in_batch is not None and reduction != "mean":
        raise ValueError("linear_cross_entropy: num_items_in_batch divides the sum over tokens; "
                         "give it with reduction='mean' (the default), not 'sum'")
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must be in [0, 1], got "
                         f"{label_smoothing}")
    cap = 0.0 if softcap is None else float(softcap)
    if softcap is not None and not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"linear_cross_entropy: softcap must be None or a finite number > 0, "
                         f"got {softcap}")
    if weight.dim() != 2:
        raise ValueError(f"linear_cross_entropy: weight must be [V, H], got shape "
                         f"{tuple(weight.shape)}")
    V, H = weight.shape
    if hidden.dim() < 1 or hidden.shape[-1] != H:
        raise ValueError(f"linear_cross_entropy: hidden [..., H = {H}] expected (weight is "
                         f"[V, H] = {tuple(weight.shape)}); got {tuple(hidden.shape)}")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"linear_cross_entropy: labels must have shape hidden.shape[:-1] = "
                         f"{tuple(hidden.shape[:-1])}, got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"linear_cross_entropy: labels must be integers, got {labels.dtype}")
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(f"linear_cross_entropy: bias must have shape ({V},), got "
                         f"{tuple(bias.shape)}")
    if V == 0 or V >= 2 ** 32 or H == 0:
        raise ValueError(f"linear_cross_entropy: vocab V = {V} and hidden H = {H} must be >= 1 "
                         "(V < 2^32)")
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
        raise ValueError(f"linear_cross_entropy: chunk_size must be None or >= 1, got "
                         f"{chunk_size}")
    # under autocast hidden is cast; float32 master weights (and bias) stay:
    # the op casts them for its GEMMs, keeps no copy and returns their
    # gradients in float32, as through autocast's cast
    hidden, = _autocast_cast(hidden)
    weight, bias = (t if t is None or _master(hidden, t) else _autocast_cast(t)[0]
                    for t in (weight, bias))
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype and not _master(hidden, t):
            raise TypeError(f"linear_cross_entropy: hidden ({hidden.dtype}) and {name} "
                            f"({t.dtype}) must have one dtype (as F.linear), or float32 "
                            "weights beside bfloat16 hidden")
    if hidden.dtype not in (torch.float32, torch.bfloat16, torch.float64):
        raise TypeError(f"linear_cross_entropy: float32, bfloat16 or float64 inputs, got "
                        f"{hidden.dtype}")
    h2 = hidden.reshape(-1, H)
    y = labels.reshape(-1).to(torch.int64)
    N = h2.shape[0]
    if N >= 2 ** 32:
        raise ValueError(f"linear_cross_entropy: {N} tokens do not fit the kernel's uint32")
    div = None
    if num_items_in_batch is not None:
        div = num_items_in_batch if isinstance(num_items_in_batch, Tensor) else \
            torch.tensor(float(num_items_in_batch), dtype=torch.float64)
    chunk = int(chunk_size) if chunk_size is not None else _auto_chunk(N, V)
    grad_on = torch.is_grad_enabled()
    want = [grad_on and t is not None and t.requires_grad for t in (hidden, weight, bias)]
    args = (h2, weight, y, bias, div, int(ignore_index), reduction == "sum", eps, cap, chunk,
            want[0], want[1], want[2], _threads_arg(threads))
    return _forward(linear_cross_entropy_fwd, _LCEFunction, _lce_fwd_impl,
                    (h2, weight, y, bias, div), args)


def causal_lm_loss(hidden: Tensor, weight: Tensor, labels: Tensor, bias: Optional[Tensor] = None,
                   *, num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels: Optional[Tensor] = None, softcap: Optional[float] = None,
                   label_smoothing: float = 0.0, chunk_size: Optional[int] = None,
                   threads: Optional[int] = None) -> Tensor:
    """transformers' ``ForCausalLMLoss`` on the hidden states instead of the
    logits: ``ForCausalLMLoss(F.linear(hidden, weight, bias), labels, V,
    num_items_in_batch, ignore_index, shift_labels)`` through
    :func:`linear_cross_entropy`. hidden ``[..., T, H]``, labels ``[..., T]``
    unshifted: they are padded with ignore_index by one and shifted
    (``labels[..., 1:]``), so position t predicts labels[t + 1];
    ``shift_labels`` given: used as they are. The loss is the sum over
    tokens divided by ``num_items_in_batch`` when it is given, else the
    mean over the labels that are not ignore_index. softcap as Gemma 2's
    ``final_logit_softcapping`` (HF applies it to the logits before the
    loss). label_smoothing: ``F.cross_entropy``'s (HF's ForCausalLMLoss
    passes none; 0 = HF's loss)."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    return linear_cross_entropy(hidden, weight, shift_labels, bias, ignore_index=ignore_index,
                                reduction="mean", label_smoothing=label_smoothing,
                                softcap=softcap, num_items_in_batch=num_items_in_batch,
                                chunk_size=chunk_size, threads=threads)
