"""How the torch front's ops run, shared by every module that defines one
(tilegrad.torch, tilegrad._torch_step, tilegrad._torch_lce): on PyTorch >=
2.4 each kernel is a ``torch.library`` custom op (:func:`_custom_op`); a
plain eager call runs the op's implementation behind its autograd Function
instead (:func:`_direct`, :func:`_forward`), the same bits without the
dispatcher's cost; on older PyTorch the Functions are the only path.
Also the CPU autocast cast and the device check every op makes.
"""
from typing import Optional

import torch

Tensor = torch.Tensor

#: True when the kernels are registered as ``torch.library.custom_op`` s
#: (PyTorch >= 2.4); False: plain autograd Functions (no compile/export).
HAVE_CUSTOM_OPS = hasattr(torch, "library") and hasattr(torch.library, "custom_op") \
    and hasattr(torch.library, "register_autograd")


def _custom_op(name, impl, fake):
    """tilegrad::<name>, a CPU op with no mutated arguments, and its fake."""
    op = torch.library.custom_op(f"tilegrad::{name}", mutates_args=(),
                                 device_types="cpu")(impl)
    op.register_fake(fake)
    return op


def _private(path: str):
    """torch.<path> (a private function the checks below read), or None."""
    obj = torch
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


_IS_COMPILING = _private("compiler.is_compiling") or _private("_dynamo.is_compiling")
_IS_TRACING = _private("jit.is_tracing")
_FUNCTION_MODE = _private("_C._is_torch_function_mode_enabled")
_DISPATCH_MODES = _private("_C._len_torch_dispatch_stack")
_FUNCTORCH_LEVEL = _private("_C._functorch.peek_interpreter_stack")
_CAN_GO_DIRECT = HAVE_CUSTOM_OPS and None not in (_IS_COMPILING, _IS_TRACING, _FUNCTION_MODE,
                                                  _DISPATCH_MODES, _FUNCTORCH_LEVEL)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _direct(*ts: Optional[Tensor]) -> bool:
    """May the ops' implementations run behind their autograd Functions
    instead of through the dispatcher? In eager mode on plain tensors: no
    torch.compile / torch.export / jit tracing, no torch_function or
    torch_dispatch mode (FakeTensorMode, FlopCounterMode, ``with
    torch.device(...)``), no functorch transform, no tensor subclass. The
    same implementations, so the same bits; the dispatcher's custom-op path
    (argument defaults filled per call, autograd's generated Function, the
    backward op's own dispatch) cost 0.1-0.4 ms per forward + backward
    (bench/results/xeon2-amx/op-overhead.txt). Elsewhere, and on PyTorch
    whose private checks here are missing, the custom ops."""
    return (_CAN_GO_DIRECT and not _IS_COMPILING() and not _IS_TRACING()
            and not _FUNCTION_MODE() and _DISPATCH_MODES() == 0
            and _FUNCTORCH_LEVEL() is None
            and all(t is None or type(t) in _PLAIN_TYPES for t in ts))


def _needs_grad(*ts: Optional[Tensor]) -> bool:
    """Will autograd record a graph for these inputs?"""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _forward(op, function, impl, tensors, args, single: bool = False):
    """The first output of op(*args) through the dispatcher (a custom op),
    or, where _direct allows, function.apply(*args) (its autograd
    Function), or with no graph to record impl(*args) alone. tensors: the
    args that are tensors (or None). single: op and impl return one tensor,
    not a tuple."""
    if HAVE_CUSTOM_OPS and not _direct(*tensors):
        out = op(*args)
        return out if single else out[0]
    if not _needs_grad(*tensors):
        out = impl(*args)
        return out if single else out[0]
    return function.apply(*args)


def _autocast_cast(*ts):
    """Under CPU autocast, the floating tensors in autocast's dtype, as
    autocast hands SDPA its inputs (so a model whose rotary step returns q
    and k in float32 beside a bf16 v runs in bf16, as with SDPA)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        on, dt = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    else:
        on, dt = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    if not on:
        return ts
    return tuple(t.to(dt) if t.is_floating_point() else t for t in ts)


def _check_cpu(*ts):
    for t in ts:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"tilegrad runs on the CPU; got a tensor on {t.device}")
