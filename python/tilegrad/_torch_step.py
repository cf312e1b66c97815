"""The training step's memory-bound kernels as torch ops: RoPE and the gated
linear units (SwiGLU, GeGLU), each one pass over its tensors in the C
library (``tg_rope_forward`` / ``_backward``, ``tg_glu_forward`` /
``_backward``), computed in float32 and rounded once to the output dtype.

Re-exported by :mod:`tilegrad.torch` (``tt.rope``, ``tt.apply_rotary_pos_emb``,
``tt.swiglu``, ``tt.geglu``, ``tt.glu_linear``); on PyTorch >= 2.4 they are the custom ops

* ``tilegrad::rope_fwd(x, cos, sin, interleaved, out_dtype, threads) -> y``
  and ``tilegrad::rope_bwd(dy, cos, sin, interleaved, out_dtype, threads) -> dx``;
* ``tilegrad::glu_fwd(gate, up, act, threads) -> y`` and
  ``tilegrad::glu_bwd(dy, gate, up, act, threads) -> (dgate, dup)``;
* ``tilegrad::glu_linear_fwd(gate, up, weight, bias, act, threads) -> out``
  and ``tilegrad::glu_linear_bwd(dout, gate, up, weight, want_db, act,
  threads) -> (dgate, dup, dweight, dbias)`` (the GLU and the linear layer
  after it, the product formed again in the backward: ``tt.glu_linear``)

with fake implementations and registered autograd (compile, export), and
plain eager calls run the same implementations behind autograd Functions,
as the attention and RMSNorm ops do (``tilegrad._torch_paths._forward``).
"""
import ctypes
from typing import Optional, Tuple

import torch

from . import capi as _capi
from ._torch_common import _context, _ptr, _threads_arg
from ._torch_paths import HAVE_CUSTOM_OPS, _autocast_cast, _check_cpu, _custom_op, _forward

Tensor = torch.Tensor

#: the dtypes these kernels take (tg_dtype); float16/float64 inputs are refused
_DTYPES = {torch.bfloat16: _capi.TG_DTYPE_BF16, torch.float32: _capi.TG_DTYPE_F32}
#: tg_dtype -> torch dtype (the ops carry output dtypes as ints)
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
#: tg_glu_act values by name
GLU_ACTS = {"silu": 0, "gelu_tanh": 1}


def _need_dtype(op: str, **ts: Tensor) -> None:
    for name, t in ts.items():
        if t.dtype not in _DTYPES:
            raise TypeError(f"{op}: {name} is {t.dtype}; the kernels take float32 or bfloat16")


# ---------------------------------------------------------------------------
# RoPE: x [B, H, L, D] (any strides, D contiguous), cos/sin [B or 1, L, R]

def _table_view(t: Tensor) -> Tensor:
    """cos or sin as [B or 1, L, R] with R contiguous (a copy only if not)."""
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t


def _need_rope_shapes(op: str, x: Tensor, cos: Tensor, sin: Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be [B, H, L, D]; got shape {tuple(x.shape)}")
    B, _, L, D = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() not in (2, 3) or t.shape[-2] != L or (t.dim() == 3 and t.shape[0] not in (1, B)):
            raise ValueError(f"{op}: {name} must be [B or 1, L, R] (or [L, R]) with L = {L}, "
                             f"B = {B}; got {tuple(t.shape)}")
    R = cos.shape[-1]
    if sin.shape[-1] != R or R % 2 or not 2 <= R <= D:
        raise ValueError(f"{op}: the rotary dim R = cos.shape[-1] = {R} (sin: {sin.shape[-1]}) "
                         f"must be even, 2 <= R <= D = {D}, the same for cos and sin")
    if cos.dtype != sin.dtype:
        raise TypeError(f"{op}: cos is {cos.dtype} and sin {sin.dtype}: one dtype for both")


def _rope_params(x: Tensor, y: Tensor, cos: Tensor, sin: Tensor, interleaved: bool):
    p = _capi.RopeParams()
    p.B, p.H, p.L, p.D = x.shape
    p.rotary_dim = cos.shape[-1]
    p.layout = _capi.TG_ROPE_INTERLEAVED if interleaved else _capi.TG_ROPE_ROTATE_HALF
    p.x_dtype, p.y_dtype, p.table_dtype = _DTYPES[x.dtype], _DTYPES[y.dtype], _DTYPES[cos.dtype]
    p.x_strides[:] = x.stride()[:3]
    p.y_strides[:] = y.stride()[:3]
    for dst, t in ((p.cos_strides, cos), (p.sin_strides, sin)):
        dst[:] = (t.stride(0) if t.shape[0] > 1 else 0, t.stride(1))
    return p


def _rope_call(name: str, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool,
               out_dtype: int, threads: int) -> Tensor:
    """y (or dx) = tg_rope_<name>(x (or dy)) in a tensor laid out like x."""
    op = f"tilegrad::rope_{name[:3]}"
    _need_dtype(op, x=x, cos=cos, sin=sin)
    _need_rope_shapes(op, x, cos, sin)
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = _table_view(cos), _table_view(sin)
    y = torch.empty_like(x, dtype=_TORCH_DTYPES[out_dtype])
    if y.stride(-1) != 1:
        y = torch.empty(x.shape, dtype=y.dtype)
    if x.numel():
        _context(threads, False).call(f"tg_rope_{name}", _ptr(x), _ptr(cos), _ptr(sin), _ptr(y),
                                      ctypes.byref(_rope_params(x, y, cos, sin, interleaved)))
    return y


def _rope_fwd_impl(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, out_dtype: int,
                   threads: int) -> Tensor:
    return _rope_call("forward", x, cos, sin, interleaved, out_dtype, threads)


def _rope_bwd_impl(dy: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, out_dtype: int,
                   threads: int) -> Tensor:
    return _rope_call("backward", dy, cos, sin, interleaved, out_dtype, threads)


def _rope_fake(x, cos, sin, interleaved, out_dtype, threads):
    return torch.empty_like(x, dtype=_TORCH_DTYPES[out_dtype])


def _rope_save(ctx, inputs) -> None:
    x, cos, sin, interleaved, _, threads = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (interleaved, _DTYPES[x.dtype], threads)


def _rope_grads(rope_bwd, ctx, dy: Tensor):
    cos, sin = ctx.saved_tensors
    interleaved, x_dtype, threads = ctx.args
    dx = rope_bwd(dy, cos, sin, interleaved, x_dtype, threads) if ctx.needs_input_grad[0] else None
    return dx, None, None, None, None, None


# ---------------------------------------------------------------------------
# GLU: gate, up [..., cols], rows through a row stride

def _rows_view(t: Tensor) -> Tuple[Tensor, int]:
    """t [..., cols] as (t or a contiguous copy, its row stride): the leading
    dims must flatten to rows of one stride, the cols contiguous."""
    if t.dim() == 0:
        raise ValueError("tilegrad::glu: tensors need at least one dim")
    cols = t.shape[-1]
    lead = t.shape[:-1]
    stride = t.stride(-2) if t.dim() >= 2 else cols
    expect = stride
    flat = t.stride(-1) == 1 or cols <= 1
    for n, s in zip(reversed(lead), reversed(t.stride()[:-1])):
        flat = flat and (n == 1 or s == expect)
        expect *= n
    if not flat:
        t = t.contiguous()
        stride = cols
    return t, max(int(stride), cols)


def _need_glu(op: str, gate: Tensor, up: Tensor, act: int) -> None:
    if act not in GLU_ACTS.values():
        raise ValueError(f"{op}: act must be one of {GLU_ACTS}, got {act}")
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate {tuple(gate.shape)} and up {tuple(up.shape)} must have "
                         "one shape")
    _need_dtype(op, gate=gate, up=up)
    if gate.dtype != up.dtype:
        raise TypeError(f"{op}: gate is {gate.dtype} and up {up.dtype}: one dtype for both")


def _glu_fwd_impl(gate: Tensor, up: Tensor, act: int, threads: int) -> Tensor:
    _need_glu("tilegrad::glu_fwd", gate, up, act)
    y = torch.empty(gate.shape, dtype=gate.dtype)
    if y.numel():
        (g, gs), (u, us) = _rows_view(gate), _rows_view(up)
        cols = gate.shape[-1]
        _context(threads, False).call("tg_glu_forward", _ptr(g), _ptr(u), _ptr(y), act,
                                      _DTYPES[gate.dtype], y.numel() // cols, cols, gs, us, cols)
    return y


def _glu_fwd_fake(gate, up, act, threads):
    return torch.empty(gate.shape, dtype=gate.dtype)


def _glu_bwd_impl(dy: Tensor, gate: Tensor, up: Tensor, act: int,
                  threads: int) -> Tuple[Tensor, Tensor]:
    _need_glu("tilegrad::glu_bwd", gate, up, act)
    if dy.shape != gate.shape:
        raise ValueError(f"tilegrad::glu_bwd: dy {tuple(dy.shape)} must have gate's shape "
                         f"{tuple(gate.shape)}")
    dy = dy.to(gate.dtype)
    dgate, dup = torch.empty(gate.shape, dtype=gate.dtype), torch.empty(gate.shape, dtype=gate.dtype)
    if dy.numel():
        (g, gs), (u, us), (d, ds) = _rows_view(gate), _rows_view(up), _rows_view(dy)
        cols = gate.shape[-1]
        _context(threads, False).call("tg_glu_backward", _ptr(g), _ptr(u), _ptr(d), _ptr(dgate),
                                      _ptr(dup), act, _DTYPES[gate.dtype], dy.numel() // cols,
                                      cols, gs, us, ds, cols, cols)
    return dgate, dup


def _glu_bwd_fake(dy, gate, up, act, threads):
    return torch.empty(gate.shape, dtype=gate.dtype), torch.empty(gate.shape, dtype=gate.dtype)


def _glu_save(ctx, inputs) -> None:
    gate, up, act, threads = inputs
    ctx.save_for_backward(gate, up)
    ctx.args = (act, threads)


def _glu_grads(glu_bwd, ctx, dy: Tensor):
    gate, up = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not (need[0] or need[1]):
        return None, None, None, None
    dgate, dup = glu_bwd(dy, gate, up, *ctx.args)
    return dgate if need[0] else None, dup if need[1] else None, None, None


# GLU then a linear layer (a gated MLP's down projection): the product
# act(gate) * up is not kept for the backward but formed again there

def _need_glu_linear(op: str, gate: Tensor, up: Tensor, weight: Tensor,
                     bias: Optional[Tensor], act: int) -> None:
    _need_glu(op, gate, up, act)
    if weight.dim() != 2 or weight.shape[1] != gate.shape[-1]:
        raise ValueError(f"{op}: weight [out, {gate.shape[-1]}] expected (gate is "
                         f"{tuple(gate.shape)}); got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape ({weight.shape[0]},), got "
                         f"{tuple(bias.shape)}")
    if weight.dtype != gate.dtype and not _master(gate, weight):
        raise TypeError(f"{op}: weight is {weight.dtype}, gate {gate.dtype}: one dtype (as "
                        "F.linear), or float32 weights beside bfloat16 gate")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"{op}: bias is {bias.dtype}, weight {weight.dtype}: one dtype")


def _master(gate: Tensor, weight: Tensor) -> bool:
    """Is weight a float32 master weight of bf16 activations, as autocast
    leaves them? glu_linear casts it for its GEMMs (the copy not kept for the
    backward, which casts again) and returns its gradient in float32."""
    return gate.dtype == torch.bfloat16 and weight.dtype == torch.float32


def _glu_linear_fwd_impl(gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor],
                         act: int, threads: int) -> Tensor:
    _need_glu_linear("tilegrad::glu_linear_fwd", gate, up, weight, bias, act)
    dt = gate.dtype
    with torch.autocast("cpu", enabled=False):       # (inputs cast already)
        return torch.nn.functional.linear(_glu_fwd_impl(gate, up, act, threads), weight.to(dt),
                                          None if bias is None else bias.to(dt))


def _glu_linear_fwd_fake(gate, up, weight, bias, act, threads):
    return gate.new_empty(gate.shape[:-1] + (weight.shape[0],))


def _glu_linear_bwd_impl(dout: Tensor, gate: Tensor, up: Tensor, weight: Tensor, want_db: bool,
                         act: int, threads: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dgate, dup, dweight, dbias [out] or (0,)): F.linear's backward on
    the product formed again, then the GLU's."""
    _need_glu_linear("tilegrad::glu_linear_bwd", gate, up, weight, None, act)
    cols, out = gate.shape[-1], weight.shape[0]
    if tuple(dout.shape) != tuple(gate.shape[:-1]) + (out,):
        raise ValueError(f"tilegrad::glu_linear_bwd: dout {tuple(dout.shape)} must be "
                         f"{tuple(gate.shape[:-1]) + (out,)}")
    dt = gate.dtype
    d2 = dout.to(dt).reshape(-1, out)
    with torch.autocast("cpu", enabled=False):
        y = _glu_fwd_impl(gate, up, act, threads).reshape(-1, cols)
        dweight = d2.t().mm(y).to(weight.dtype)         # [out, cols]
        dy = d2.mm(weight.to(dt)).reshape(gate.shape)   # d(product)
    del y
    dbias = d2.sum(0).to(weight.dtype) if want_db else gate.new_zeros((0,))
    dgate, dup = _glu_bwd_impl(dy, gate, up, act, threads)
    return dgate, dup, dweight, dbias


def _glu_linear_bwd_fake(dout, gate, up, weight, want_db, act, threads):
    return (torch.empty(gate.shape, dtype=gate.dtype), torch.empty(gate.shape, dtype=gate.dtype),
            torch.empty(weight.shape, dtype=weight.dtype),
            weight.new_empty((weight.shape[0],)) if want_db else gate.new_empty((0,)))


def _glu_linear_save(ctx, inputs) -> None:
    gate, up, weight, bias, act, threads = inputs
    ctx.save_for_backward(gate, up, weight)
    ctx.args = (bias is not None, act, threads)


def _glu_linear_grads(glu_linear_bwd, ctx, dout: Tensor):
    gate, up, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not any(need[:4]):
        return (None,) * 6
    has_bias, act, threads = ctx.args
    dgate, dup, dweight, dbias = glu_linear_bwd(dout, gate, up, weight, has_bias and need[3],
                                                act, threads)
    return (dgate if need[0] else None, dup if need[1] else None, dweight if need[2] else None,
            dbias if has_bias and need[3] else None, None, None)


# ---------------------------------------------------------------------------
# the two paths: custom ops (PyTorch >= 2.4) and autograd Functions

if HAVE_CUSTOM_OPS:
    rope_fwd = _custom_op("rope_fwd", _rope_fwd_impl, _rope_fake)
    rope_bwd = _custom_op("rope_bwd", _rope_bwd_impl, _rope_fake)
    glu_fwd = _custom_op("glu_fwd", _glu_fwd_impl, _glu_fwd_fake)
    glu_bwd = _custom_op("glu_bwd", _glu_bwd_impl, _glu_bwd_fake)
    glu_linear_fwd = _custom_op("glu_linear_fwd", _glu_linear_fwd_impl, _glu_linear_fwd_fake)
    glu_linear_bwd = _custom_op("glu_linear_bwd", _glu_linear_bwd_impl, _glu_linear_bwd_fake)

    rope_fwd.register_autograd(lambda ctx, dy: _rope_grads(rope_bwd, ctx, dy),
                               setup_context=lambda ctx, inputs, output: _rope_save(ctx, inputs))
    glu_fwd.register_autograd(lambda ctx, dy: _glu_grads(glu_bwd, ctx, dy),
                              setup_context=lambda ctx, inputs, output: _glu_save(ctx, inputs))
    glu_linear_fwd.register_autograd(
        lambda ctx, dout: _glu_linear_grads(glu_linear_bwd, ctx, dout),
        setup_context=lambda ctx, inputs, output: _glu_linear_save(ctx, inputs))
else:
    rope_fwd = rope_bwd = glu_fwd = glu_bwd = glu_linear_fwd = glu_linear_bwd = None


def _function(name: str, save, impl, grads, bwd_impl):
    """An autograd Function over impl: the forward saves what save(ctx,
    inputs) keeps and returns impl(*inputs), the backward returns
    grads(bwd_impl, ctx, dout): the custom ops' autograd, without the
    dispatcher."""
    def forward(ctx, *inputs):
        save(ctx, inputs)
        return impl(*inputs)

    def backward(ctx, dout):
        return grads(bwd_impl, ctx, dout)
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


_RopeFunction = _function("_RopeFunction", _rope_save, _rope_fwd_impl, _rope_grads,
                          _rope_bwd_impl)
_GLUFunction = _function("_GLUFunction", _glu_save, _glu_fwd_impl, _glu_grads, _glu_bwd_impl)
_GLULinearFunction = _function("_GLULinearFunction", _glu_linear_save, _glu_linear_fwd_impl,
                               _glu_linear_grads, _glu_linear_bwd_impl)


# ---------------------------------------------------------------------------
# public functions

def rope(x: Tensor, cos: Tensor, sin: Tensor, *, unsqueeze_dim: int = 1,
         interleaved: bool = False, threads: Optional[int] = None) -> Tensor:
    """Rotary position embedding of ``x`` as transformers'
    ``apply_rotary_pos_emb`` applies it to one of q or k: x ``[B, H, L, D]``
    (``unsqueeze_dim=1``) or ``[B, L, H, D]`` (``unsqueeze_dim=2``), strided
    views read in place; cos, sin ``[B or 1, L, R]`` as the model's rotary
    embedding returns them (R <= D: the first R features rotate, the rest
    pass through, as Phi-3's partial rotary). ``interleaved``: GPT-J's
    pairs (2i, 2i+1) instead of rotate-half. The result has
    ``torch.promote_types(x.dtype, cos.dtype)`` and x's layout, computed in
    float32 and rounded once; its gradient flows to x (the tables are the
    model's constants: one that requires grad is refused)."""
    _check_cpu(x, cos, sin)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"rope: unsqueeze_dim must be 1 (x [B, H, L, D]) or 2 "
                         f"(x [B, L, H, D]), got {unsqueeze_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"rope: {name} requires grad; the kernel gives no "
                                      "gradient for the tables")
    xv = x.transpose(1, 2) if unsqueeze_dim == 2 else x
    out_dtype = _DTYPES.get(torch.promote_types(x.dtype, cos.dtype))
    if out_dtype is None:
        raise TypeError(f"rope: x {x.dtype} with tables {cos.dtype}: the kernels take "
                        "float32 or bfloat16")
    y = _forward(rope_fwd, _RopeFunction, _rope_fwd_impl, (xv, cos, sin),
                 (xv, cos, sin, bool(interleaved), out_dtype, _threads_arg(threads)), single=True)
    return y.transpose(1, 2) if unsqueeze_dim == 2 else y


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                         unsqueeze_dim: int = 1) -> Tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)``
    on :func:`rope` (rotate-half; partial where cos is narrower than the head)."""
    return (rope(q, cos, sin, unsqueeze_dim=unsqueeze_dim),
            rope(k, cos, sin, unsqueeze_dim=unsqueeze_dim))


def _glu_inputs(name: str, gate: Tensor, up: Tensor) -> Tuple[Tensor, Tensor]:
    """gate and up in their promoted dtype, which the kernels must take."""
    dtype = torch.promote_types(gate.dtype, up.dtype)
    if dtype not in _DTYPES:
        raise TypeError(f"{name}: gate {gate.dtype}, up {up.dtype}: the kernels take float32 "
                        "or bfloat16")
    return gate.to(dtype), up.to(dtype)


def _glu(name: str, gate: Tensor, up: Tensor, threads: Optional[int]) -> Tensor:
    _check_cpu(gate, up)
    gate, up = _glu_inputs(name, gate, up)
    act = GLU_ACTS["silu" if name == "swiglu" else "gelu_tanh"]
    return _forward(glu_fwd, _GLUFunction, _glu_fwd_impl, (gate, up),
                    (gate, up, act, _threads_arg(threads)), single=True)


def swiglu(gate: Tensor, up: Tensor, *, threads: Optional[int] = None) -> Tensor:
    """``silu(gate) * up`` (Llama's MLP) in one pass, float32 inside, rounded
    once to the inputs' (promoted) dtype; saves gate and up, not silu(gate)."""
    return _glu("swiglu", gate, up, threads)


def geglu(gate: Tensor, up: Tensor, *, threads: Optional[int] = None) -> Tensor:
    """``gelu(gate, approximate="tanh") * up`` (Gemma's MLP) in one pass."""
    return _glu("geglu", gate, up, threads)


def glu_linear(gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *,
               act: str = "silu", threads: Optional[int] = None) -> Tensor:
    """``F.linear(act(gate) * up, weight, bias)``, a gated MLP's down
    projection on its SwiGLU (``act="silu"``) or GeGLU (``"gelu_tanh"``)
    product, without keeping the product for the backward: the backward
    forms it again from gate and up (one more GLU pass) for weight's
    gradient. Saves gate, up and weight, where swiglu followed by F.linear
    keeps the product too: at Qwen2.5-0.5B's widths and 4096 tokens, 40 MB
    a layer in bf16. The GEMMs are torch's, as F.linear's. weight and bias
    have gate's dtype, or are float32 beside bfloat16 gate and up (master
    weights: cast for the GEMMs, the copy not kept, the gradients float32).
    Under CPU autocast gate and up are cast as F.linear casts them, and
    float32 weights stay masters: the same bits as F.linear under
    autocast."""
    _check_cpu(gate, up, weight, bias)
    if act not in GLU_ACTS:
        raise ValueError(f"glu_linear: act must be one of {sorted(GLU_ACTS)}, got {act!r}")
    gate, up = _glu_inputs("glu_linear", gate, up)
    gate, up = _autocast_cast(gate, up)
    # float32 master weights stay float32 (cast inside, no copy kept)
    if not _master(gate, weight):
        weight, bias = (None if t is None else _autocast_cast(t)[0] for t in (weight, bias))
    return _forward(glu_linear_fwd, _GLULinearFunction, _glu_linear_fwd_impl,
                    (gate, up, weight, bias),
                    (gate, up, weight, bias, GLU_ACTS[act], _threads_arg(threads)), single=True)
