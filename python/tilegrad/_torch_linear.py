"""``F.linear`` under CPU autocast without the cast weights kept for the
backward.

Under autocast a model's float32 weights are cast to bf16 for each
``F.linear``, and the bf16 copy is what the linear's backward keeps:
autocast's cache holds it through the forward and the graph holds it until
that layer's backward. Across a model one bf16 copy of every weight lives
through the forward into the backward (Qwen2.5-0.5B's layers: 0.72 GB).
Each projection also casts its own input, so q, k and v keep three bf16
copies of the one normed input, and gate and up two (at Qwen2.5-0.5B's
widths and 4096 tokens, 22 MB and 15 MB a layer where 7.3 MB each would do).

:func:`linear` computes what ``F.linear`` computes under autocast, with the
same torch GEMMs in the same layouts (the same bits, forward and backward:
tests/python/test_step_kernels.py compares them), but

* keeps the float32 weight, which exists anyway, and casts it again in the
  backward (one more read of the weight a step);
* shares the cast of an input among the layers that read it one after the
  other: the last input cast is remembered by weak references, with the
  input's version counter, so an input changed in place is cast again.

The gradients reach float32 weights and inputs in float32, as through
autocast's casts, so the q, k and v gradients of one input are summed in
float32 as before.
"""
import threading
import weakref
from typing import Optional

import torch

from ._torch_paths import _IS_COMPILING, _direct, _needs_grad

Tensor = torch.Tensor

#: the last input cast of this thread: (weakref input, its version, dtype,
#: weakref cast); weak both ways, so it keeps nothing alive
_LAST_CAST = threading.local()


def _autocast_dtype() -> Optional[torch.dtype]:
    """CPU autocast's dtype, or None when it is off."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        on, dt = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    else:
        on, dt = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return dt if on else None


def _shared_cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, the same tensor as the previous call's when that call
    cast this very ``x`` (same object, unchanged since) to the same dtype."""
    if x.dtype == dtype:
        return x
    last = getattr(_LAST_CAST, "entry", None)
    if last is not None:
        src, version, dt, cast = last
        out = cast()
        if out is not None and src() is x and version == x._version and dt == dtype:
            return out
    out = x.to(dtype)
    _LAST_CAST.entry = (weakref.ref(x), x._version, dtype, weakref.ref(out))
    return out


class _AutocastLinear(torch.autograd.Function):
    """F.linear in ``dtype`` on float32 weights, saving the float32 weight.
    The backward's GEMMs are those of F.linear's autograd (mm of the
    flattened gradient: dx = g W, dW = g^T x, db = sum_t g)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        xc = _shared_cast(x, dtype)
        with torch.autocast("cpu", enabled=False):
            out = torch.nn.functional.linear(
                xc, weight.to(dtype), None if bias is None else bias.to(dtype))
        ctx.save_for_backward(xc, weight)
        ctx.dtypes = (x.dtype, dtype, None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        xc, weight = ctx.saved_tensors
        x_dtype, dtype, bias_dtype = ctx.dtypes
        need = ctx.needs_input_grad
        g = dout.to(dtype).reshape(-1, dout.shape[-1])           # [T, out]
        dx = dw = db = None
        with torch.autocast("cpu", enabled=False):
            if need[0]:
                dx = g.mm(weight.to(dtype)).view(xc.shape).to(x_dtype)
            if need[1]:
                dw = g.t().mm(xc.reshape(-1, xc.shape[-1])).to(weight.dtype)
            if need[2]:
                db = g.sum(0).to(bias_dtype)
        return dx, dw, db, None


def linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``torch.nn.functional.linear(input, weight, bias)``; under CPU
    autocast with weights wider than its dtype (float32 master weights,
    with a graph to record) it keeps no cast weight for the backward and
    shares one cast of an input among the layers that read it in a row
    (module docstring). Elsewhere (no autocast, no grad, torch.compile,
    tracing, tensor subclasses) it is F.linear itself."""
    dtype = _autocast_dtype()
    if (dtype is None or not weight.is_floating_point() or weight.dtype == dtype
            or not input.is_floating_point() or not _needs_grad(input, weight, bias)
            or not _direct(input, weight, bias)
            or (_IS_COMPILING is not None and _IS_COMPILING())):
        return torch.nn.functional.linear(input, weight, bias)
    return _AutocastLinear.apply(input, weight, bias, dtype)
