"""Low-level ctypes binding of libtilegrad (the C API of include/tilegrad.h).

Most users want the array functions of :mod:`tilegrad` (shapes inferred from
numpy arrays) or :mod:`tilegrad.torch`. This module is the layer below them:

* :func:`find_library` / :func:`library` -- locate and load the shared
  library once (see "Which library is loaded" in python/README.md);
* :class:`AttnParams` / :class:`AttnMaskParams` -- the byte-exact
  ``tg_attn_params`` (160 bytes, Metal's offsets, asserted at import) and
  ``tg_attn_mask_params``; :func:`attn_params_init` calls
  ``tg_attn_params_init``, :func:`attn_params` is its pure-Python twin with
  optional explicit strides;
* :class:`AttnOptions` -- ``tg_attn_options`` (dropout, sliding window,
  value head dim, attention sinks; 48 bytes, asserted) for the dtype
  entry points ``tg_attn_train_fwd`` / ``_bwd`` / ``_bwd_compute_d`` /
  ``_bwd_step`` (a CPU extension: float32 attention, ``TG_DTYPE_*``; the
  step's gradients in bf16 or float32) and ``tg_attn_dropout_keep``;
* :class:`AttnVarlen` -- ``tg_attn_varlen`` (packed sequences: the
  documents' cumulative lengths, an optional mask per document; 32 bytes,
  asserted) for
  ``tg_attn_varlen_fwd`` / ``_bwd`` / ``_bwd_step``;
* :class:`Library` -- the CDLL with argtypes declared from the header;
  ``has(name)`` says whether an entry point is exported;
* :data:`ISA_NAMES` -- ``{name: tg_isa value}`` of the ISAs the library
  lists (``Library.isa_names()`` of the default library, read on first
  access);
* :class:`Context` -- a ``tg_ctx`` (threads, deterministic mode, ISA, the
  FA-2 backward's schedule and the attention precision mode).
  ``Context.call(name, *args)`` calls ``tg_<kernel>(ctx, *args)`` with raw
  buffers (C-contiguous numpy arrays by pointer, ``None`` as NULL, params
  structs by reference) and raises a :class:`~tilegrad.errors.TilegradError`
  subclass carrying ``tg_status_str`` and ``tg_ctx_last_error`` on a non-zero
  status.
"""
import ctypes
import os
import threading

import numpy as np

from .errors import (TG_ERR_ALIAS, TG_ERR_BAD_INDEX, TG_ERR_BAD_PARAMS,  # noqa: F401
                     TG_ERR_BAD_SHAPE, TG_ERR_BUSY, TG_ERR_NO_MEMORY, TG_ERR_NULL_ARG,
                     TG_ERR_OVERFLOW, TG_ERR_UNSUPPORTED, TG_OK, error_for_status)

# tg_isa values (include/tilegrad.h; ABI: an ISA keeps its number). Which
# ISAs a library has, and their names, come from the library itself:
# Library.isa_names(), ISA_NAMES.
TG_ISA_AUTO = 0
TG_ISA_PORTABLE = 1
TG_ISA_AVX512 = 2
TG_ISA_AVX2 = 3
TG_ISA_AVX512_BF16 = 4
TG_ISA_AMX = 5
TG_ISA_NEON = 6        # aarch64
TG_ISA_NEON_BF16 = 7   # aarch64 with FEAT_BF16
# tg_attn_schedule (how the FA-2 backward shares out dK/dV work)
TG_ATTN_SCHEDULE_KV = 0
TG_ATTN_SCHEDULE_ATOMIC = 1
ATTN_SCHEDULE_NAMES = {"kv": TG_ATTN_SCHEDULE_KV, "atomic": TG_ATTN_SCHEDULE_ATOMIC}
# tg_attn_precision (how the attention's products taking P or dS run on bf16
# inputs: O += P.V, dQ += dS.K, dK += dS^T.Q, dV += P^T.dO)
TG_ATTN_PRECISION_EXACT = 0
TG_ATTN_PRECISION_SPLIT = 1
TG_ATTN_PRECISION_BF16 = 2
ATTN_PRECISION_NAMES = {"exact": TG_ATTN_PRECISION_EXACT, "split": TG_ATTN_PRECISION_SPLIT,
                        "bf16": TG_ATTN_PRECISION_BF16}
# tg_dtype (element type of Q, K, V, dO, O and the mask in tg_attn_train_*;
# also tg_attn_train_bwd_step's grad_dtype, the type of dQ, dK, dV)
TG_DTYPE_BF16 = 0
TG_DTYPE_F32 = 1
DTYPE_NAMES = {"bf16": TG_DTYPE_BF16, "float32": TG_DTYPE_F32}
# tg_attn_options.flags bits: the forward's O in float32 for bf16 inputs too;
# the backward writes dK, dV instead of adding to them
TG_ATTN_OPT_O_F32 = 1
TG_ATTN_OPT_DKV_WRITE = 2

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
BUNDLED_LIB = os.path.join(_PKG_DIR, "_lib", "libtilegrad.so")


class LibraryNotFoundError(OSError):
    """No libtilegrad shared library was found (or it could not be loaded)."""


def _source_tree_lib():
    """<repo>/build/libtilegrad.so when this package runs from the repository's
    python/ directory (not installed), else None."""
    repo = os.path.dirname(os.path.dirname(_PKG_DIR))
    if os.path.exists(os.path.join(repo, "CMakeLists.txt")) and \
            os.path.exists(os.path.join(repo, "include", "tilegrad.h")):
        return os.path.join(repo, "build", "libtilegrad.so")
    return None


def candidate_paths(path=None):
    """The locations tried, in order: ``path``, ``$TILEGRAD_LIB``, the library
    bundled in the installed package, ``<repo>/build/libtilegrad.so`` (source
    tree only)."""
    out = []
    if path:
        return [os.fspath(path)]
    env = os.environ.get("TILEGRAD_LIB")
    if env:
        return [env]          # an explicit override is never second-guessed
    out.append(BUNDLED_LIB)
    src = _source_tree_lib()
    if src:
        out.append(src)
    return out


def find_library(path=None):
    """Path of the shared library that :func:`library` loads."""
    tried = candidate_paths(path)
    for p in tried:
        if os.path.exists(p):
            return p
    raise LibraryNotFoundError(
        "libtilegrad not found; tried " + ", ".join(tried) +
        ". Install the package (pip install ./python builds it), build it "
        "(cmake -S . -B build && cmake --build build) or set TILEGRAD_LIB.")


# --------------------------------------------------------------------------
# Parameter ABI

class AttnParams(ctypes.Structure):
    """``tg_attn_params`` (byte-identical to Metal's AttnParams)."""
    _fields_ = [
        ("B", ctypes.c_int32), ("H", ctypes.c_int32), ("D", ctypes.c_int32),
        ("qL", ctypes.c_int32), ("kL", ctypes.c_int32), ("gqa_factor", ctypes.c_int32),
        ("scale", ctypes.c_float), ("softcapping", ctypes.c_float),
        ("NQ", ctypes.c_int32), ("NK", ctypes.c_int32),
        ("NQ_aligned", ctypes.c_int32), ("NK_aligned", ctypes.c_int32),
        ("qL_rem", ctypes.c_int32), ("kL_rem", ctypes.c_int32),
        ("qL_off", ctypes.c_int32), ("_pad", ctypes.c_int32),
        ("Q_strides", ctypes.c_int64 * 3), ("K_strides", ctypes.c_int64 * 3),
        ("V_strides", ctypes.c_int64 * 3), ("O_strides", ctypes.c_int64 * 3),
    ]

    def __eq__(self, other):
        return isinstance(other, AttnParams) and bytes(self) == bytes(other)

    __hash__ = None

    def as_dict(self):
        d = {}
        for name, _ in self._fields_:
            v = getattr(self, name)
            d[name] = v if isinstance(v, (int, float)) else tuple(v)
        return d

    def __repr__(self):
        return "AttnParams(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


class AttnMaskParams(ctypes.Structure):
    """``tg_attn_mask_params``: mask strides (batch, head, row) in elements."""
    _fields_ = [("M_strides", ctypes.c_int64 * 3)]

    def __repr__(self):
        return f"AttnMaskParams(M_strides={tuple(self.M_strides)})"


# The contract (KERNELS.md, "Attention parameter ABI"): 160 bytes, Metal's offsets.
_EXPECTED_OFFSETS = {
    "B": 0, "H": 4, "D": 8, "qL": 12, "kL": 16, "gqa_factor": 20,
    "scale": 24, "softcapping": 28,
    "NQ": 32, "NK": 36, "NQ_aligned": 40, "NK_aligned": 44,
    "qL_rem": 48, "kL_rem": 52, "qL_off": 56, "_pad": 60,
    "Q_strides": 64, "K_strides": 88, "V_strides": 112, "O_strides": 136,
}
assert ctypes.sizeof(AttnParams) == 160, ctypes.sizeof(AttnParams)
for _name, _off in _EXPECTED_OFFSETS.items():
    assert getattr(AttnParams, _name).offset == _off, (_name, getattr(AttnParams, _name).offset)
assert ctypes.sizeof(AttnMaskParams) == 24


class AttnOptions(ctypes.Structure):
    """``tg_attn_options`` (48 bytes): pass ``None`` instead for the defaults.

    * ``dropout_p`` in [0, 1): dropout of the attention weights, the mask
      drawn from Philox4x32-10 with key ``dropout_seed`` and counter base
      ``dropout_offset`` (docs/KERNELS.md);
    * ``flags``: ``TG_ATTN_OPT_*`` bits (``TG_ATTN_OPT_O_F32``, the forward's
      O in float32 for bf16 inputs too; ``TG_ATTN_OPT_DKV_WRITE``, the
      backward writes dK, dV instead of adding to them; other bits are
      refused);
    * ``window`` W >= 1: sliding window, key k visible to query i iff
      ``k > i + qL_off - W`` (0 = none);
    * ``v_head_dim`` Dv: the columns of V, O, dO and dV (a multiple of 8 up
      to 512; 0 = the params' D);
    * ``sinks``: address of H float32 sink logits (``None`` = no sinks);
    * ``d_sinks``: backward only, address of H float32 that the sinks'
      gradient is *added* to (``None`` = not wanted).

    The two addresses are plain integers (``ndarray.ctypes.data``,
    ``Tensor.data_ptr()``): the caller keeps the buffers alive."""
    _fields_ = [("dropout_p", ctypes.c_float), ("flags", ctypes.c_uint32),
                ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
                ("window", ctypes.c_uint32), ("v_head_dim", ctypes.c_uint32),
                ("sinks", ctypes.c_void_p), ("d_sinks", ctypes.c_void_p)]

    def __repr__(self):
        return (f"AttnOptions(dropout_p={self.dropout_p}, flags={self.flags:#x}, "
                f"dropout_seed={self.dropout_seed}, dropout_offset={self.dropout_offset}, "
                f"window={self.window}, v_head_dim={self.v_head_dim}, "
                f"sinks={self.sinks and hex(self.sinks)}, "
                f"d_sinks={self.d_sinks and hex(self.d_sinks)})")


# include/tilegrad.h: 48 bytes, these offsets
_EXPECTED_OPTION_OFFSETS = {"dropout_p": 0, "flags": 4, "dropout_seed": 8, "dropout_offset": 16,
                            "window": 24, "v_head_dim": 28, "sinks": 32, "d_sinks": 40}
assert ctypes.sizeof(AttnOptions) == 48, ctypes.sizeof(AttnOptions)
for _name, _off in _EXPECTED_OPTION_OFFSETS.items():
    assert getattr(AttnOptions, _name).offset == _off, (_name, getattr(AttnOptions, _name).offset)


class AttnVarlen(ctypes.Structure):
    """``tg_attn_varlen`` (32 bytes) of ``tg_attn_varlen_fwd`` / ``_bwd`` /
    ``_bwd_step``: documents packed one after another, document d holding
    query rows ``[cu_seqlens_q[d], cu_seqlens_q[d + 1])`` and key rows
    ``[cu_seqlens_k[d], cu_seqlens_k[d + 1])`` (flash_attn_varlen_func's
    ``cu_seqlens``). The two arrays are addresses (plain integers) of
    ``n_docs + 1`` int32 each, 0 first, non-decreasing, the total last;
    ``mask`` the address of an optional additive mask per document (the
    inputs' dtype, document d's ``[len_q, len_k]`` rows after those of the
    documents before it; ``None`` = none). The caller keeps them alive over
    the call."""
    _fields_ = [("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("n_docs", ctypes.c_int32), ("_pad", ctypes.c_int32),
                ("mask", ctypes.c_void_p)]

    def __repr__(self):
        return (f"AttnVarlen(cu_seqlens_q={self.cu_seqlens_q and hex(self.cu_seqlens_q)}, "
                f"cu_seqlens_k={self.cu_seqlens_k and hex(self.cu_seqlens_k)}, "
                f"n_docs={self.n_docs}, mask={self.mask and hex(self.mask)})")


assert ctypes.sizeof(AttnVarlen) == 32, ctypes.sizeof(AttnVarlen)
for _name, _off in {"cu_seqlens_q": 0, "cu_seqlens_k": 8, "n_docs": 16, "_pad": 20,
                    "mask": 24}.items():
    assert getattr(AttnVarlen, _name).offset == _off, (_name, getattr(AttnVarlen, _name).offset)


_I64x3 = ctypes.c_int64 * 3


def _set_strides(p, Q_strides=None, K_strides=None, V_strides=None, O_strides=None):
    for field, s in (("Q_strides", Q_strides), ("K_strides", K_strides),
                     ("V_strides", V_strides), ("O_strides", O_strides)):
        if s is not None:
            arr = getattr(p, field)
            for j in range(3):
                arr[j] = int(s[j])
    return p


def attn_params(B, H, H_kv, qL, kL, D, scale, softcapping=1.0,
                Q_strides=None, K_strides=None, V_strides=None, O_strides=None):
    """Pure-Python twin of ``tg_attn_params_init`` (contiguous
    ``[B, heads, L, D]`` by default), with optional explicit strides. Does not
    validate: it can build the inconsistent structs the tests need."""
    q_rows, kv_rows = (H * qL * D, qL * D, D), (H_kv * kL * D, kL * D, D)
    Qs = q_rows if Q_strides is None else Q_strides
    Ks = kv_rows if K_strides is None else K_strides
    Vs = kv_rows if V_strides is None else V_strides
    Os = q_rows if O_strides is None else O_strides
    # one constructor call, the fields in order (the torch ops build one a call)
    return AttnParams(B, H, D, qL, kL, H // H_kv, scale, softcapping,
                      -(-qL // 32), -(-kL // 16), qL // 32, kL // 16, qL % 32, kL % 16,
                      kL - qL, 0, _I64x3(*Qs), _I64x3(*Ks), _I64x3(*Vs), _I64x3(*Os))


class CeOptions(ctypes.Structure):
    """``tg_ce_options`` (24 bytes) of ``tg_cross_entropy_fwd_bwd_ex``; the
    defaults are ``TG_CE_OPTIONS_INIT`` (pass ``None`` for them):
    ``ignore_index`` -100 (targets equal to it: grad row 0, no loss),
    ``label_smoothing`` eps in [0, 1] (torch's), ``grad_scale`` 1 (the grad
    is multiplied by it), ``flags`` 0 (none defined)."""
    _fields_ = [("ignore_index", ctypes.c_int64), ("label_smoothing", ctypes.c_float),
                ("grad_scale", ctypes.c_float), ("flags", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]

    def __init__(self, ignore_index=-100, label_smoothing=0.0, grad_scale=1.0, flags=0):
        super().__init__(int(ignore_index), float(label_smoothing), float(grad_scale),
                         int(flags), 0)


# --------------------------------------------------------------------------
# Signatures (include/tilegrad.h); every kernel takes the tg_ctx first

_P = ctypes.c_void_p
_U32 = ctypes.c_uint32
_F = ctypes.c_float
_I = ctypes.c_int
_PP = ctypes.POINTER(AttnParams)
_PM = ctypes.POINTER(AttnMaskParams)
_PO = ctypes.POINTER(AttnOptions)
_PV = ctypes.POINTER(AttnVarlen)
KERNEL_SIGNATURES = {
    "tg_flash_attn_train_bwd_compute_d_bf16": [_P, _P, _P, _P, _U32, _U32, _U32, _U32],
    "tg_flash_attn_train_bwd_bf16": [_P] * 10 + [_PP, _PM, _P, _I],
    "tg_f32_to_bf16_cast": [_P, _P, _P, ctypes.c_uint64],
    "tg_flash_attn_train_fwd_bf16": [_P] * 6 + [_PP, _PM, _P, _I],
    "tg_rms_norm_forward_f32": [_P, _P, _P, _P, _P, _U32, _U32, _F],
    "tg_rms_norm_compute_rms_inv_f32": [_P, _P, _P, _U32, _U32, _F],
    "tg_rms_norm_backward_dx_f32": [_P, _P, _P, _P, _P, _P, _U32, _U32],
    "tg_rms_norm_backward_dw_f32": [_P, _P, _P, _P, _P, _U32, _U32],
    "tg_rms_norm_backward": [_P, _P, _P, _P, _P, _P, _U32, _U32, _F],
    "tg_softmax_backward": [_P, _P, _P, _P, _U32, _U32],
    "tg_embedding_backward": [_P, _P, _P, _P, _U32, _U32, _U32],
    "tg_cross_entropy_fwd_bwd": [_P, _P, _P, _P, _P, _U32, _U32, _U32, _U32],
    # ctx, tg_dtype, logits, targets (int64), grad, loss_out, n_pos, vocab, row_stride,
    # count (double), opt
    "tg_cross_entropy_fwd_bwd_ex": [_P, _I, _P, _P, _P, _P, _U32, _U32, ctypes.c_uint64,
                                    ctypes.c_double, ctypes.POINTER(CeOptions)],
    "tg_transpose_2d": [_P, _P, _P, _U32, _U32],
    "tg_causal_attention_backward": [_P] * 8 + [_U32, _U32, _U32, _U32],
    "tg_flash_attn_vec_reduce": [_P, _P, _P, _U32, _U32, _U32],
    "tg_flash_attn_vec_reduce_tq_hb_undo": [_P, _P, _P, _U32, _U32, _U32],
    "tg_fwht_sign_undo_f32": [_P, _P, _U32, _U32],
    # the dtype / options entry points (CPU extension): ctx, tg_dtype, then as above
    "tg_attn_train_fwd": [_P, _I] + [_P] * 5 + [_PP, _PM, _P, _I, _PO],
    "tg_attn_train_bwd": [_P, _I] + [_P] * 9 + [_PP, _PM, _P, _I, _PO],
    # ctx, tg_dtype dtype, tg_dtype grad_dtype, Q, K, V, O, L, dO, dQ, dK, dV, ...
    "tg_attn_train_bwd_step": [_P, _I, _I] + [_P] * 9 + [_PP, _PM, _P, _I, _PO],
    "tg_attn_train_bwd_compute_d": [_P, _I, _P, _P, _P, _U32, _U32, _U32, _U32],
    "tg_attn_dropout_keep": [_P, _PO, _U32, _U32, _U32, _U32, _P],
    # packed sequences: ctx, tg_dtype, Q, K, V, O, L, params, docs, causal, opt
    "tg_attn_varlen_fwd": [_P, _I] + [_P] * 5 + [_PP, _PV, _I, _PO],
    # ctx, tg_dtype, Q, K, V, L, dO, D_vec, dQ, dK, dV, params, docs, causal, opt
    "tg_attn_varlen_bwd": [_P, _I] + [_P] * 9 + [_PP, _PV, _I, _PO],
    # ctx, tg_dtype dtype, tg_dtype grad_dtype, Q, K, V, O, L, dO, dQ, dK, dV, ...
    "tg_attn_varlen_bwd_step": [_P, _I, _I] + [_P] * 9 + [_PP, _PV, _I, _PO],
}
_OTHER_SIGNATURES = {
    # name: (restype, argtypes)
    "tg_status_str": (ctypes.c_char_p, [_I]),
    "tg_ctx_create": (_I, [ctypes.POINTER(ctypes.c_void_p)]),
    "tg_ctx_destroy": (None, [_P]),
    "tg_ctx_set_threads": (_I, [_P, _I]),
    "tg_ctx_set_deterministic": (_I, [_P, _I]),
    "tg_ctx_last_error": (ctypes.c_char_p, [_P]),
    "tg_ctx_set_isa": (_I, [_P, _I]),
    "tg_ctx_get_isa": (_I, [_P]),
    "tg_isa_name": (ctypes.c_char_p, [_I]),
    "tg_isa_from_name": (_I, [ctypes.c_char_p, ctypes.POINTER(_I)]),
    "tg_isa_count": (_I, []),
    "tg_isa_at": (_I, [_I]),
    "tg_isa_available": (_I, [_I]),
    "tg_ctx_set_attn_schedule": (_I, [_P, _I]),
    "tg_ctx_get_attn_schedule": (_I, [_P]),
    "tg_ctx_set_attn_precision": (_I, [_P, _I]),
    "tg_ctx_get_attn_precision": (_I, [_P]),
    "tg_attn_precision_name": (ctypes.c_char_p, [_I]),
    "tg_attn_params_init": (_I, [_PP, _I, _I, _I, _I, _I, _I, _F]),
}


# RoPE and the gated linear units (kernels 12 and 13)
class RopeParams(ctypes.Structure):
    """``tg_rope_params`` (120 bytes) of ``tg_rope_forward`` / ``_backward``:
    x, y ``[B, H, L, D]`` through element strides (batch, head, row), cos and
    sin ``[B or 1, L, rotary_dim]`` (batch stride 0: broadcast); ``layout``
    ``TG_ROPE_ROTATE_HALF`` or ``TG_ROPE_INTERLEAVED``; dtypes ``TG_DTYPE_*``."""
    _fields_ = [("B", ctypes.c_int32), ("H", ctypes.c_int32), ("L", ctypes.c_int32),
                ("D", ctypes.c_int32), ("rotary_dim", ctypes.c_int32),
                ("layout", ctypes.c_int32), ("x_dtype", ctypes.c_int32),
                ("y_dtype", ctypes.c_int32), ("table_dtype", ctypes.c_int32),
                ("flags", ctypes.c_uint32), ("x_strides", ctypes.c_int64 * 3),
                ("y_strides", ctypes.c_int64 * 3), ("cos_strides", ctypes.c_int64 * 2),
                ("sin_strides", ctypes.c_int64 * 2)]


TG_ROPE_ROTATE_HALF, TG_ROPE_INTERLEAVED = 0, 1
TG_GLU_SILU, TG_GLU_GELU_TANH = 0, 1
_I64 = ctypes.c_int64
KERNEL_SIGNATURES.update({
    # ctx, x (dy), cos, sin, y (dx), params
    "tg_rope_forward": [_P, _P, _P, _P, _P, ctypes.POINTER(RopeParams)],
    "tg_rope_backward": [_P, _P, _P, _P, _P, ctypes.POINTER(RopeParams)],
    # ctx, gate, up, y, act, dtype, rows, cols, gate/up/y strides
    "tg_glu_forward": [_P, _P, _P, _P, _I, _I, _U32, _U32, _I64, _I64, _I64],
    # ctx, gate, up, dy, dgate, dup, act, dtype, rows, cols, 5 strides
    "tg_glu_backward": [_P] * 6 + [_I, _I, _U32, _U32] + [_I64] * 5,
})
_OTHER_SIGNATURES["tg_rope_params_init"] = (_I, [ctypes.POINTER(RopeParams)] + [_I] * 6)


class Library:
    """The loaded shared library with declared signatures."""

    def __init__(self, path=None):
        self.path = find_library(path)
        try:
            self.dll = ctypes.CDLL(self.path)
        except OSError as e:
            raise LibraryNotFoundError(f"cannot load {self.path}: {e}") from e
        self._funcs = {}
        for name in ("tg_status_str", "tg_ctx_create", "tg_ctx_destroy", "tg_ctx_set_threads",
                     "tg_ctx_set_deterministic", "tg_ctx_last_error"):
            self.func(name)           # the context API must exist

    def has(self, name):
        """Whether the library exports ``name``."""
        try:
            getattr(self.dll, name)
            return True
        except AttributeError:
            return False

    def func(self, name):
        """The ctypes function ``name`` with its signature declared."""
        f = self._funcs.get(name)
        if f is None:
            f = getattr(self.dll, name)  # AttributeError when not exported
            if name in KERNEL_SIGNATURES:
                f.restype, f.argtypes = _I, KERNEL_SIGNATURES[name]
            else:
                f.restype, f.argtypes = _OTHER_SIGNATURES[name]
            self._funcs[name] = f
        return f

    def status_str(self, s):
        """``tg_status_str(s)``."""
        r = self.func("tg_status_str")(int(s))
        return r.decode() if r is not None else "<NULL>"

    def isa_name(self, isa):
        """``tg_isa_name(isa)``: "unknown" for a value the library does not list."""
        r = self.func("tg_isa_name")(int(isa))
        return r.decode() if r is not None else "<NULL>"

    def isa_from_name(self, name):
        """``tg_isa_from_name``: the tg_isa value named ``name``, None for a
        name the library does not list."""
        out = _I()
        s = self.func("tg_isa_from_name")(name.encode(), ctypes.byref(out))
        return int(out.value) if s == TG_OK else None

    def isa_names(self):
        """``{name: tg_isa value}`` of the ISAs the library lists: "auto",
        then ``tg_isa_at(i)`` for ``i < tg_isa_count()`` (its architecture's
        tables from least to most preferred, including those this CPU cannot
        run)."""
        at = self.func("tg_isa_at")
        isas = [TG_ISA_AUTO] + [at(i) for i in range(self.func("tg_isa_count")())]
        return {self.isa_name(v): int(v) for v in isas}

    def attn_precision_name(self, p):
        """``tg_attn_precision_name(p)``: "exact", "split", "bf16" ("unknown"
        outside the enum)."""
        r = self.func("tg_attn_precision_name")(int(p))
        return r.decode() if r is not None else "<NULL>"

    def __repr__(self):
        return f"Library({self.path!r})"


_default_lib = None
_lib_lock = threading.Lock()


def library():
    """The process-wide :class:`Library`, loaded on first use from
    :func:`find_library`."""
    global _default_lib
    if _default_lib is None:
        with _lib_lock:
            if _default_lib is None:
                _default_lib = Library()
    return _default_lib


def attn_params_init(B, H, H_kv, qL, kL, D, scale, lib=None):
    """``tg_attn_params_init``: params for contiguous ``[B, heads, L, D]``."""
    lib = lib or library()
    p = AttnParams()
    s = lib.func("tg_attn_params_init")(ctypes.byref(p), int(B), int(H), int(H_kv),
                                        int(qL), int(kL), int(D), float(scale))
    if s != TG_OK:
        raise error_for_status("tg_attn_params_init", s, lib.status_str(s),
                               f"B={B} H={H} H_kv={H_kv} qL={qL} kL={kL} D={D} scale={scale}")
    return p


# --------------------------------------------------------------------------
# argument conversion for Context.call

_BUFFER_DTYPES = (np.dtype(np.float32), np.dtype(np.uint16), np.dtype(np.uint32),
                  np.dtype(np.uint8))


_AS_IS = (int, float, ctypes.c_void_p)  # (addresses and scalars: as they are)


def as_pointer(a):
    """ctypes argument for one raw buffer / struct / scalar."""
    if a is None or type(a) in _AS_IS:
        return a
    if isinstance(a, np.ndarray):
        if a.dtype not in _BUFFER_DTYPES and a.dtype.name != "bfloat16":
            raise TypeError(f"unsupported buffer dtype {a.dtype} (float32, uint16 = raw "
                            "bf16 bits, ml_dtypes.bfloat16, uint32 or uint8)")
        if not a.flags["C_CONTIGUOUS"]:
            raise ValueError("raw buffers must be C-contiguous (pass flat buffers with "
                             "explicit strides in the params instead)")
        return ctypes.c_void_p(a.ctypes.data)
    if isinstance(a, (AttnParams, AttnMaskParams, AttnOptions, AttnVarlen)):
        return ctypes.byref(a)
    return a  # plain scalar


def parse_attn_precision(p):
    """An attention precision mode by name ("exact", "split", "bf16") or
    ``tg_attn_precision`` value -> the value; ValueError for other names."""
    if isinstance(p, str):
        try:
            return ATTN_PRECISION_NAMES[p.lower()]
        except KeyError:
            raise ValueError(f"unknown attn_precision {p!r}; one of "
                             f"{sorted(ATTN_PRECISION_NAMES)}") from None
    return int(p)


def parse_isa(isa, lib=None):
    """An ISA by name (one the library ``lib`` lists, any case) or tg_isa
    value -> the value (None stays None); ValueError naming the library's
    ISAs for another name."""
    if isa is None:
        return None
    if isinstance(isa, str):
        lib = lib or library()
        value = lib.isa_from_name(isa.lower())
        if value is None:
            raise ValueError(f"unknown isa {isa!r}; one of {sorted(lib.isa_names())}")
        return value
    return int(isa)


def __getattr__(name):
    # ISA_NAMES from the default library, which loads on first use (not at
    # `import tilegrad`)
    if name == "ISA_NAMES":
        return library().isa_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Context:
    """A ``tg_ctx``: thread count, deterministic mode and ISA for the kernels
    called through it. Not thread-safe: use one per calling thread
    (:func:`tilegrad.default_context` keeps one per thread).

    threads: ``None`` or 0 = OpenMP's default (``OMP_NUM_THREADS``), n > 0 = n.
    deterministic: bitwise identical results across runs and thread counts.
    isa: ``None``/``"auto"`` (best the CPU has; ``TG_ISA`` env overrides) or
    one of the names the library lists (:data:`ISA_NAMES`: ``"portable"``
    and its architecture's tables); ``UnsupportedError`` if this CPU or
    build cannot run it (with the library's reason in the message),
    ``ValueError`` for a name the library does not list.
    attn_schedule: ``None`` (library default, "kv"), ``"kv"`` or ``"atomic"``.
    attn_precision: ``None`` (library default, "exact"), ``"exact"``,
    ``"split"`` or ``"bf16"``: how the attention's products that take the
    probabilities P or the score gradient dS (O += P.V, dQ += dS.K,
    dK += dS^T.Q, dV += P^T.dO) run on **bf16 inputs** -- "exact": P and dS
    in f32; "split": P and dS as bf16 hi + lo pairs on the bf16 dot units
    (relative error <= 2^-16 per term); "bf16": P and dS rounded to bf16
    (2^-8 per term, as FlashAttention-2 and PyTorch's CPU kernel). float32
    attention always computes in f32 (the mode is ignored there).
    """

    def __init__(self, threads=None, deterministic=False, isa=None, lib=None,
                 attn_schedule=None, attn_precision=None):
        self.lib = lib or library()
        self._h = None
        h = ctypes.c_void_p()
        s = self.lib.func("tg_ctx_create")(ctypes.byref(h))
        if s != TG_OK:
            raise error_for_status("tg_ctx_create", s, self.lib.status_str(s), "")
        self._h = h
        self._threads = 0
        self._deterministic = False
        if threads is not None:
            self.threads = threads
        if deterministic:
            self.deterministic = True
        if isa is not None:
            self.isa = isa
        if attn_schedule is not None:
            self.attn_schedule = attn_schedule
        if attn_precision is not None:
            self.attn_precision = attn_precision

    # -- configuration ------------------------------------------------------
    @property
    def handle(self):
        if self._h is None:
            raise ValueError("the tilegrad Context is closed")
        return self._h

    @property
    def threads(self):
        """Thread count set on this context (0 = OpenMP's default)."""
        return self._threads

    @threads.setter
    def threads(self, n):
        n = 0 if n is None else int(n)
        self._check("tg_ctx_set_threads", self.lib.func("tg_ctx_set_threads")(self.handle, n))
        self._threads = n

    @property
    def deterministic(self):
        return self._deterministic

    @deterministic.setter
    def deterministic(self, on):
        self._check("tg_ctx_set_deterministic",
                    self.lib.func("tg_ctx_set_deterministic")(self.handle, 1 if on else 0))
        self._deterministic = bool(on)

    @property
    def isa(self):
        """Name of the microkernel table in use (one of the names the library
        lists, :data:`ISA_NAMES`; never "auto")."""
        return self.lib.isa_name(self.isa_id)

    @isa.setter
    def isa(self, isa):
        self._check("tg_ctx_set_isa",
                    self.lib.func("tg_ctx_set_isa")(self.handle, parse_isa(isa, self.lib)))

    @property
    def isa_id(self):
        return int(self.lib.func("tg_ctx_get_isa")(self.handle))

    @property
    def attn_schedule(self):
        """FA-2 backward schedule: "kv" (default; atomic-free, bitwise the
        same for any thread count) or "atomic" (the Metal grid). Deterministic
        mode always uses "kv"."""
        v = int(self.lib.func("tg_ctx_get_attn_schedule")(self.handle))
        return {i: n for n, i in ATTN_SCHEDULE_NAMES.items()}.get(v, v)

    @attn_schedule.setter
    def attn_schedule(self, s):
        if isinstance(s, str):
            try:
                s = ATTN_SCHEDULE_NAMES[s.lower()]
            except KeyError:
                raise ValueError(f"unknown attn_schedule {s!r}; one of "
                                 f"{sorted(ATTN_SCHEDULE_NAMES)}") from None
        self._check("tg_ctx_set_attn_schedule",
                    self.lib.func("tg_ctx_set_attn_schedule")(self.handle, int(s)))

    @property
    def attn_precision(self):
        """Attention precision mode on bf16 inputs: "exact" (default; P and
        dS in f32), "split" (bf16 hi + lo pairs, 2^-16 relative per term) or
        "bf16" (P and dS rounded to bf16, 2^-8 per term). See
        ``tg_ctx_set_attn_precision`` in include/tilegrad.h."""
        return self.lib.attn_precision_name(self.attn_precision_id)

    @attn_precision.setter
    def attn_precision(self, p):
        self._check("tg_ctx_set_attn_precision",
                    self.lib.func("tg_ctx_set_attn_precision")(self.handle,
                                                               parse_attn_precision(p)))

    @property
    def attn_precision_id(self):
        """The ``tg_attn_precision`` value in use (0 exact, 1 split, 2 bf16)."""
        return int(self.lib.func("tg_ctx_get_attn_precision")(self.handle))

    @property
    def last_error(self):
        """``tg_ctx_last_error``: detail of the last failure ("" if none)."""
        r = self.lib.func("tg_ctx_last_error")(self.handle)
        return r.decode(errors="replace") if r is not None else ""

    # -- calls --------------------------------------------------------------
    def _check(self, name, s):
        if s != TG_OK:
            raise error_for_status(name, s, self.lib.status_str(s), self.last_error)

    def call(self, name, *args):
        """Calls ``name(ctx, *args)`` with raw arguments; raises a
        TilegradError subclass on a non-zero status."""
        f = self.lib.func(name)
        self._check(name, f(self.handle, *map(as_pointer, args)))

    # -- lifetime -----------------------------------------------------------
    def close(self):
        if self._h is not None:
            self.lib.func("tg_ctx_destroy")(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._h is None:
            return "Context(closed)"
        extra = ""
        if self.lib.has("tg_ctx_get_attn_precision"):
            extra = f", attn_precision={self.attn_precision!r}"
        return (f"Context(threads={self._threads}, deterministic={self._deterministic}, "
                f"isa={self.isa!r}{extra})")


_tls = threading.local()


def default_context():
    """This thread's default :class:`Context` (created on first use with the
    library's defaults); the array functions use it when ``ctx`` is None."""
    c = getattr(_tls, "ctx", None)
    if c is None or c._h is None:
        c = _tls.ctx = Context()
    return c
