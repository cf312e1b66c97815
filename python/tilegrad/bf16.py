"""bfloat16 on numpy: raw bits in ``uint16`` arrays, or ``ml_dtypes.bfloat16``.

tilegrad's bf16 buffers hold raw bfloat16 bits. Every function of
:mod:`tilegrad` that takes bf16 data accepts either a ``numpy.uint16`` array
of raw bits or, when the optional package ``ml_dtypes`` is installed, an
array of dtype ``ml_dtypes.bfloat16`` (the same bits); outputs take the
dtype of the corresponding input.
"""
import numpy as np

try:  # optional dependency
    import ml_dtypes as _ml_dtypes
    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
    HAVE_ML_DTYPES = True
except Exception:  # pragma: no cover - depends on the machine
    _ml_dtypes = None
    bfloat16 = None
    HAVE_ML_DTYPES = False

BF16_NAN = np.uint16(0x7FC0)
BF16_NEG_INF = np.uint16(0xFF80)
BF16_POS_INF = np.uint16(0x7F80)


def is_bf16_dtype(dtype):
    """True for uint16 (raw bits) and ml_dtypes.bfloat16."""
    dtype = np.dtype(dtype)
    return dtype == np.uint16 or dtype.name == "bfloat16"


def bits(a, name="array"):
    """The raw-bits ``uint16`` view of a bf16 array (no copy; strides kept).
    Raises TypeError for any other dtype."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        return a.view(np.uint16)
    raise TypeError(f"{name}: expected bf16 data (numpy.uint16 raw bits or "
                    f"ml_dtypes.bfloat16), got dtype {a.dtype}; convert floats with "
                    "tilegrad.f32_to_bf16 or tilegrad.bf16.from_float")


def like(bits_arr, template_dtype):
    """View raw bits as ``template_dtype`` (uint16 or ml_dtypes.bfloat16)."""
    template_dtype = np.dtype(template_dtype)
    if template_dtype.name == "bfloat16":
        return bits_arr.view(template_dtype)
    return bits_arr


def to_float(a):
    """Exact widening of bf16 (raw bits or ml_dtypes.bfloat16) to float32."""
    b = np.ascontiguousarray(bits(a))
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_float(x):
    """float -> raw bf16 bits (uint16), round to nearest even, any NaN ->
    0x7FC0, +-inf kept (numpy only; :func:`tilegrad.f32_to_bf16` does the same
    with the library's kernel)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), BF16_NAN, r)


def as_ml_dtypes(b):
    """View raw uint16 bits as ``ml_dtypes.bfloat16`` (needs ml_dtypes)."""
    if not HAVE_ML_DTYPES:
        raise ImportError("ml_dtypes is not installed (pip install ml_dtypes)")
    return np.asarray(b, dtype=np.uint16).view(bfloat16)
