"""Minimal ctypes binding of libtilegrad for the Python oracle tests.

Loads the shared library named by the environment variable TILEGRAD_LIB
(default: <repo>/build/libtilegrad.so). Only what the tests need:

* ``AttnParams`` / ``AttnMaskParams``: the byte-exact ``tg_attn_params`` /
  ``tg_attn_mask_params`` ABI (sizes and offsets are asserted at import);
* ``Lib``: the CDLL with argtypes declared from the public header; ``has(name)``
  says whether an entry point is exported (kernels land one at a time);
* ``Ctx``: a tg_ctx (threads, determinism, ISA); ``Ctx.call(name, *args)`` calls an
  entry point and raises ``TGError`` (status, tg_status_str, tg_ctx_last_error)
  on a non-zero status. numpy arrays are passed by pointer after a dtype /
  contiguity check; ``None`` is passed as NULL.
* bf16 helpers on raw uint16 bits (numpy only; round-to-nearest-even).
"""
import ctypes
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))


def default_lib_path():
    return os.environ.get("TILEGRAD_LIB") or os.path.join(REPO_ROOT, "build", "libtilegrad.so")


# --------------------------------------------------------------------------
# Status codes (include/tilegrad.h)
TG_OK = 0
TG_ERR_NULL_ARG = 1
TG_ERR_BAD_SHAPE = 2
TG_ERR_UNSUPPORTED = 3
TG_ERR_BAD_INDEX = 4
TG_ERR_BAD_PARAMS = 5
TG_ERR_OVERFLOW = 6
TG_ERR_NO_MEMORY = 7

# tg_isa
TG_ISA_AUTO = 0
TG_ISA_PORTABLE = 1
TG_ISA_AVX512 = 2


class TGError(RuntimeError):
    def __init__(self, func, status, status_str, detail):
        self.func = func
        self.status = status
        self.status_str = status_str
        self.detail = detail
        super().__init__(f"{func} -> status {status} ({status_str}): {detail}")


# --------------------------------------------------------------------------
# Parameter ABI
class AttnParams(ctypes.Structure):
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
        return bytes(self) == bytes(other)

    def __repr__(self):
        parts = []
        for name, _ in self._fields_:
            v = getattr(self, name)
            if not isinstance(v, (int, float)):
                v = tuple(v)
            parts.append(f"{name}={v}")
        return "AttnParams(" + ", ".join(parts) + ")"


class AttnMaskParams(ctypes.Structure):
    _fields_ = [("M_strides", ctypes.c_int64 * 3)]


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


def attn_params(B, H, H_kv, qL, kL, D, scale, softcapping=1.0,
                Q_strides=None, K_strides=None, V_strides=None, O_strides=None):
    """Python twin of tg_attn_params_init (contiguous [B, heads, L, D] by
    default), with optional explicit strides."""
    p = AttnParams()
    p.B, p.H, p.D, p.qL, p.kL = B, H, D, qL, kL
    p.gqa_factor = H // H_kv
    p.scale, p.softcapping = scale, softcapping
    p.NQ, p.NK = -(-qL // 32), -(-kL // 16)
    p.NQ_aligned, p.NK_aligned = qL // 32, kL // 16
    p.qL_rem, p.kL_rem = qL % 32, kL % 16
    p.qL_off, p._pad = kL - qL, 0
    q = Q_strides or (H * qL * D, qL * D, D)
    k = K_strides or (H_kv * kL * D, kL * D, D)
    v = V_strides or (H_kv * kL * D, kL * D, D)
    o = O_strides or (H * qL * D, qL * D, D)
    for field, s in (("Q_strides", q), ("K_strides", k), ("V_strides", v), ("O_strides", o)):
        arr = getattr(p, field)
        for j in range(3):
            arr[j] = int(s[j])
    return p


# --------------------------------------------------------------------------
# Signatures (include/tilegrad.h)
_P = ctypes.c_void_p
_U32 = ctypes.c_uint32
_F = ctypes.c_float
_I = ctypes.c_int
_SIGS = {
    "tg_flash_attn_train_bwd_compute_d_bf16": [_P, _P, _P, _P, _U32, _U32, _U32, _U32],
    "tg_flash_attn_train_bwd_bf16": [_P] * 10 + [ctypes.POINTER(AttnParams),
                                                 ctypes.POINTER(AttnMaskParams), _P, _I],
    "tg_flash_attn_train_fwd_bf16": [_P] * 6 + [ctypes.POINTER(AttnParams),
                                                ctypes.POINTER(AttnMaskParams), _P, _I],
    "tg_attn_params_init": [ctypes.POINTER(AttnParams), _I, _I, _I, _I, _I, _I, _F],
    "tg_f32_to_bf16_cast": [_P, _P, _P, ctypes.c_uint64],
    "tg_rms_norm_compute_rms_inv_f32": [_P, _P, _P, _U32, _U32, _F],
    "tg_rms_norm_backward_dx_f32": [_P, _P, _P, _P, _P, _P, _U32, _U32],
    "tg_rms_norm_backward_dw_f32": [_P, _P, _P, _P, _P, _U32, _U32],
    "tg_rms_norm_backward": [_P, _P, _P, _P, _P, _P, _U32, _U32, _F],
    "tg_rms_norm_forward_f32": [_P, _P, _P, _P, _P, _U32, _U32, _F],
    "tg_softmax_backward": [_P, _P, _P, _P, _U32, _U32],
    "tg_embedding_backward": [_P, _P, _P, _P, _U32, _U32, _U32],
    "tg_cross_entropy_fwd_bwd": [_P, _P, _P, _P, _P, _U32, _U32, _U32, _U32],
    "tg_transpose_2d": [_P, _P, _P, _U32, _U32],
    "tg_causal_attention_backward": [_P] * 8 + [_U32, _U32, _U32, _U32],
}


class Lib:
    def __init__(self, path=None):
        self.path = path or default_lib_path()
        self.dll = ctypes.CDLL(self.path)
        d = self.dll
        d.tg_status_str.restype = ctypes.c_char_p
        d.tg_status_str.argtypes = [_I]
        d.tg_ctx_create.restype = _I
        d.tg_ctx_create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        d.tg_ctx_destroy.restype = None
        d.tg_ctx_destroy.argtypes = [_P]
        d.tg_ctx_set_threads.restype = _I
        d.tg_ctx_set_threads.argtypes = [_P, _I]
        d.tg_ctx_set_deterministic.restype = _I
        d.tg_ctx_set_deterministic.argtypes = [_P, _I]
        d.tg_ctx_last_error.restype = ctypes.c_char_p
        d.tg_ctx_last_error.argtypes = [_P]
        d.tg_ctx_set_isa.restype = _I
        d.tg_ctx_set_isa.argtypes = [_P, _I]
        d.tg_ctx_get_isa.restype = _I
        d.tg_ctx_get_isa.argtypes = [_P]
        self._funcs = {}

    def has(self, name):
        try:
            getattr(self.dll, name)
            return True
        except AttributeError:
            return False

    def func(self, name):
        f = self._funcs.get(name)
        if f is None:
            f = getattr(self.dll, name)  # AttributeError when not exported
            f.restype = _I
            f.argtypes = _SIGS[name]
            self._funcs[name] = f
        return f

    def status_str(self, s):
        r = self.dll.tg_status_str(int(s))
        return r.decode() if r is not None else "<NULL>"


_DTYPE_OK = (np.float32, np.uint16, np.uint32)


def _ptr(a):
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        assert a.dtype.type in _DTYPE_OK, a.dtype
        assert a.flags["C_CONTIGUOUS"], "pass C-contiguous buffers"
        return a.ctypes.data_as(ctypes.c_void_p)
    if isinstance(a, (AttnParams, AttnMaskParams)):
        return ctypes.byref(a)
    return a  # plain scalar


class Ctx:
    def __init__(self, lib, threads=None, deterministic=False, isa=None):
        self.lib = lib
        h = ctypes.c_void_p()
        s = lib.dll.tg_ctx_create(ctypes.byref(h))
        if s != TG_OK:
            raise TGError("tg_ctx_create", s, lib.status_str(s), "")
        self.h = h
        if threads is not None:
            self._check("tg_ctx_set_threads", lib.dll.tg_ctx_set_threads(self.h, int(threads)))
        if deterministic:
            self._check("tg_ctx_set_deterministic", lib.dll.tg_ctx_set_deterministic(self.h, 1))
        if isa is not None:
            self._check("tg_ctx_set_isa", lib.dll.tg_ctx_set_isa(self.h, int(isa)))

    def isa(self):
        return self.lib.dll.tg_ctx_get_isa(self.h)

    def last_error(self):
        r = self.lib.dll.tg_ctx_last_error(self.h)
        return r.decode(errors="replace") if r is not None else "<NULL>"

    def _check(self, name, s):
        if s != TG_OK:
            raise TGError(name, s, self.lib.status_str(s), self.last_error())

    def call(self, name, *args):
        """Calls tg_<kernel>(ctx, *args); raises TGError on a non-zero status."""
        f = self.lib.func(name)
        self._check(name, f(self.h, *[_ptr(a) for a in args]))

    def close(self):
        if self.h is not None:
            self.lib.dll.tg_ctx_destroy(self.h)
            self.h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------
# bf16 helpers (raw bits in uint16)
def bf16_to_f32(bits):
    """Exact widening of raw bf16 bits to float32."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x):
    """float32 -> raw bf16 bits, round to nearest even, NaN -> 0x7FC0."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)
