"""The `tilegrad` package's numpy API (python/tilegrad): every kernel function,
the Context, the exceptions.

The oracle modules check the kernels' math through the raw binding
(`tilegrad.capi`); this module checks the Pythonic layer on top of it:

* plumbing: each array function gives **bitwise** the result of the raw
  `Context.call` with hand-built arguments (shapes inferred right, strides of
  numpy views passed right, accumulating outputs accumulated), on a
  deterministic context so the comparison is exact;
* a float64 numpy reference as a sanity check of the meaning (loose: the
  precise tolerances live in the oracle modules);
* every refusal: the exception class per status, the library's message, and
  no output byte changed; Python-side refusals (TypeError / ValueError)
  before the library is called.
"""
import ctypes
import math
import pickle
import platform
import threading

import numpy as np
import pytest

import tilegrad as tg
from tilegrad import capi

BF = tg.bf16


@pytest.fixture(scope="module")
def dctx(lib):
    """Deterministic 2-thread context: exact comparisons against raw calls."""
    with tg.Context(threads=2, deterministic=True, lib=lib) as c:
        yield c


def bf16(rng, shape, std=1.0):
    return BF.from_float(rng.standard_normal(shape) * std)


def f32(rng, shape, std=1.0):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------
# library, context, errors

def test_library_and_context(lib):
    assert tg.library() is lib and lib.has("tg_flash_attn_train_fwd_bf16")
    assert not lib.has("tg_no_such_kernel")
    assert tg.find_library() and lib.status_str(capi.TG_ERR_BAD_SHAPE)
    c = tg.Context(threads=3)
    assert c.threads == 3 and not c.deterministic and c.last_error == ""
    c.threads = None
    assert c.threads == 0
    c.deterministic = True
    assert c.deterministic
    c.isa = "portable"
    assert c.isa == "portable" and c.isa_id == capi.TG_ISA_PORTABLE
    c.isa = "auto"
    assert c.isa in capi.ISA_NAMES and c.isa != "auto"
    # ISA_NAMES is the library's list: "auto", portable and this
    # architecture's tables, each name and value round-tripping through
    # tg_isa_from_name / tg_isa_name
    names = capi.ISA_NAMES
    assert names == lib.isa_names() and list(names)[:2] == ["auto", "portable"]
    assert len(names) == 1 + lib.func("tg_isa_count")() == len(set(names.values()))
    for name, value in names.items():
        assert lib.isa_from_name(name) == value and lib.isa_name(value) == name
    assert ("avx2" if platform.machine() in ("x86_64", "AMD64") else "neon") in names
    assert lib.isa_from_name("sse9") is None
    assert lib.isa_name(max(names.values()) + 1) == "unknown"
    # the tg_isa constants capi.py still spells out agree with the library
    # (TG_ISA_AVX512_BF16 is "avx512bf16"); another architecture's tables
    # are "unknown" to it
    consts = {n: v for n, v in vars(capi).items() if n.startswith("TG_ISA_")}
    assert len(consts) >= 2
    for const, value in consts.items():
        assert lib.isa_name(value) in (const[len("TG_ISA_"):].lower().replace("_", ""),
                                       "unknown"), const
    assert "Context(" in repr(c)
    with pytest.raises(tg.BadParamsError) as ei:
        c.threads = -1
    e = ei.value
    assert e.status == capi.TG_ERR_BAD_PARAMS and e.func == "tg_ctx_set_threads"
    assert "thread" in e.detail and e.detail in str(e) and e.status_str in str(e)
    assert c.last_error == e.detail
    assert c.threads == 0                 # unchanged by the refused call
    with pytest.raises(tg.UnsupportedError, match="not available"):
        c.isa = 99
    with pytest.raises(ValueError, match="unknown isa"):
        c.isa = "sse9"
    if lib.has("tg_ctx_set_attn_schedule"):
        assert c.attn_schedule == "kv"
        c.attn_schedule = "atomic"
        assert c.attn_schedule == "atomic"
        with pytest.raises(tg.BadParamsError, match="schedule"):
            c.attn_schedule = 7
        with pytest.raises(ValueError, match="unknown attn_schedule"):
            c.attn_schedule = "fast"
        assert tg.Context(attn_schedule="atomic").attn_schedule == "atomic"
    c.close()
    c.close()                              # idempotent
    with pytest.raises(ValueError, match="closed"):
        c.threads = 1
    with pytest.raises(ValueError, match="closed"):
        tg.transpose_2d(np.ones((2, 2), np.float32), ctx=c)
    assert repr(c) == "Context(closed)"


def test_context_attn_precision(lib):
    """tg_ctx_set/get_attn_precision by name: a round trip through every
    mode, the constructor kwarg, repr, and refusals that leave it unchanged."""
    if not lib.has("tg_ctx_set_attn_precision"):
        pytest.skip("the library has no tg_ctx_set_attn_precision")
    assert [lib.attn_precision_name(i) for i in range(3)] == ["exact", "split", "bf16"]
    assert lib.attn_precision_name(3) == "unknown"
    c = tg.Context()
    assert c.attn_precision == "exact" and c.attn_precision_id == capi.TG_ATTN_PRECISION_EXACT
    for name, value in capi.ATTN_PRECISION_NAMES.items():
        c.attn_precision = name
        assert c.attn_precision == name and c.attn_precision_id == value
        assert f"attn_precision={name!r}" in repr(c)
        c.attn_precision = capi.TG_ATTN_PRECISION_EXACT     # by value too
        assert c.attn_precision == "exact"
    c.attn_precision = "SPLIT"                              # names ignore case, as isa's
    assert c.attn_precision == "split"
    with pytest.raises(ValueError, match="unknown attn_precision 'f32'") as ei:
        c.attn_precision = "f32"
    assert all(n in str(ei.value) for n in ("'bf16'", "'exact'", "'split'"))
    with pytest.raises(tg.BadParamsError, match="tg_attn_precision"):
        c.attn_precision = 3
    assert c.attn_precision == "split"                      # unchanged by the refusals
    c.close()
    for name in ("exact", "split", "bf16"):
        with tg.Context(attn_precision=name, threads=2) as c2:
            assert c2.attn_precision == name and c2.threads == 2
    with pytest.raises(ValueError, match="unknown attn_precision"):
        tg.Context(attn_precision="fp8")
    # the mode reaches the bf16 kernels through the context: bf16 rounds P
    # and dS on every table (2^-8 per term), split is within 2^-16 per term
    # of exact (equal to it on tables without bf16 dot products)
    rng = np.random.default_rng(4)
    q, k, v, do = (bf16(rng, (1, 2, 40, 32)) for _ in range(4))
    with tg.Context(deterministic=True) as c3:
        o, lse = tg.flash_attn_train_fwd(q, k, v, causal=True, ctx=c3)
    res = {}
    for name in ("exact", "split", "bf16"):
        with tg.Context(deterministic=True, attn_precision=name) as c3:
            assert c3.attn_precision == name
            o3, _ = tg.flash_attn_train_fwd(q, k, v, causal=True, ctx=c3)
            # the backward fed one O and L: its f32 gradients show its own mode
            res[name] = (tg.bf16_to_f32(o3),) + tg.flash_attn_backward(
                q, k, v, o, lse, do, causal=True, ctx=c3)
    for i, (x, s, b) in enumerate(zip(res["exact"], res["split"], res["bf16"])):
        d_split, d_bf16 = (float(np.linalg.norm(y - x) / np.linalg.norm(x)) for y in (s, b))
        # O is bf16: split moves it only where an output rounding flips
        # (~1e-4 normwise vs bf16's ~2e-3); the f32 gradients by the
        # per-term errors' ratio, 256 (~600 measured)
        assert d_bf16 > 2 ** -12 and d_split <= d_bf16 / (4 if i == 0 else 32), \
            (i, d_split, d_bf16)


def test_default_context_is_per_thread():
    a = tg.default_context()
    assert tg.default_context() is a
    other = []
    t = threading.Thread(target=lambda: other.append(tg.default_context()))
    t.start()
    t.join()
    assert other[0] is not a and other[0].lib is a.lib


def test_library_not_found(tmp_path):
    with pytest.raises(tg.LibraryNotFoundError, match="TILEGRAD_LIB"):
        tg.find_library(str(tmp_path / "nope.so"))
    bad = tmp_path / "libbad.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(tg.LibraryNotFoundError, match="cannot load"):
        tg.Library(str(bad))


def test_error_classes():
    builtin = {capi.TG_ERR_NULL_ARG: ValueError, capi.TG_ERR_BAD_SHAPE: ValueError,
               capi.TG_ERR_UNSUPPORTED: NotImplementedError, capi.TG_ERR_BAD_INDEX: IndexError,
               capi.TG_ERR_BAD_PARAMS: ValueError, capi.TG_ERR_OVERFLOW: OverflowError,
               capi.TG_ERR_NO_MEMORY: MemoryError, capi.TG_ERR_ALIAS: ValueError}
    for status, base in builtin.items():
        e = tg.errors.error_for_status("tg_x", status, "what", "detail")
        assert isinstance(e, tg.TilegradError) and isinstance(e, base)
        assert type(e).status == status == e.status
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e) and str(e2) == str(e)
    e = tg.errors.error_for_status("tg_x", 42, "new", "")
    assert type(e) is tg.TilegradError and e.status == 42


def test_raw_call_argument_checks(lib, dctx):
    with pytest.raises(TypeError, match="dtype"):
        dctx.call("tg_transpose_2d", np.ones((2, 2)), np.ones((2, 2), np.float32), 2, 2)
    with pytest.raises(ValueError, match="C-contiguous"):
        dctx.call("tg_transpose_2d", np.ones((2, 4), np.float32)[:, ::2],
                  np.ones((2, 2), np.float32), 2, 2)


def test_attn_params(lib):
    p = tg.attn_params(2, 8, 2, 33, 17, 64)
    want = capi.attn_params(2, 8, 2, 33, 17, 64, float(np.float32(1 / 8)))
    assert p == want and p.softcapping == 1.0 and p.qL_off == 17 - 33
    p = tg.attn_params(1, 4, 4, 5, 9, 16, scale=0.5, softcap=30.0, q_offset=0,
                       q_strides=(1000, 100, 20))
    assert (p.scale, p.softcapping, p.qL_off) == (0.5, 30.0, 0)
    assert tuple(p.Q_strides) == (1000, 100, 20) and tuple(p.K_strides) == (4 * 9 * 16, 144, 16)
    assert "qL_off=0" in repr(p) and p.as_dict()["Q_strides"] == (1000, 100, 20)
    with pytest.raises(tg.BadShapeError, match="H=3 H_kv=2"):
        tg.attn_params(1, 3, 2, 5, 5, 16)
    with pytest.raises(ValueError, match="int32"):
        tg.attn_params(1, 1, 1, 2 ** 31, 5, 16)


# ---------------------------------------------------------------------------
# attention

def _attn_ref(q, k, v, mask_add, causal, scale, cap, q_off):
    """float64 numpy forward: O, L (dead rows: O 0, L -inf)."""
    Q, K, V = (BF.to_float(a).astype(np.float64) for a in (q, k, v))
    g = Q.shape[1] // K.shape[1]
    K, V = np.repeat(K, g, 1), np.repeat(V, g, 1)
    S = scale * Q @ np.swapaxes(K, -1, -2)
    if cap != 1.0:
        S = cap * np.tanh(S / cap)
    qL, kL = S.shape[-2:]
    if causal:
        S = np.where(np.arange(kL)[None, :] <= np.arange(qL)[:, None] + q_off, S, -np.inf)
    if mask_add is not None:
        S = S + mask_add
    m = S.max(-1, keepdims=True)
    live = np.isfinite(m)
    E = np.where(live, np.exp(S - np.where(live, m, 0)), 0)
    Z = E.sum(-1, keepdims=True)
    P = E / np.where(Z > 0, Z, 1)
    L = np.where(live, m + np.log(np.where(Z > 0, Z, 1)), -np.inf)[..., 0]
    return P @ V, L


def _raw_fwd(ctx, q, k, v, p, mask_full, causal):
    """The raw call on contiguous copies (mask: full [B,H,qL,kL] bf16 or None)."""
    B, H, qL, D = q.shape
    o = np.full((B, H, qL, D), 0x7FC0, np.uint16)
    L = np.full((B, H, qL), np.nan, np.float32)
    mp = None
    if mask_full is not None:
        mp = capi.AttnMaskParams()
        mp.M_strides[0], mp.M_strides[1], mp.M_strides[2] = (H * qL * mask_full.shape[-1],
                                                             qL * mask_full.shape[-1],
                                                             mask_full.shape[-1])
        mask_full = np.ascontiguousarray(mask_full)
    ctx.call("tg_flash_attn_train_fwd_bf16", np.ascontiguousarray(q), np.ascontiguousarray(k),
             np.ascontiguousarray(v), o, L, p, mp, mask_full, int(causal))
    return o, L


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cap", [1.0, 20.0])
def test_attention_forward_and_backward(lib, dctx, causal, cap):
    """Strided views in ([B,L,H,D] storage transposed), GQA 4:2, a mask
    broadcast over batch: bitwise equal to the raw calls on contiguous copies;
    O and L near the float64 reference; the backward accumulates into dk/dv."""
    rng = np.random.default_rng(7 + int(causal) + int(cap))
    B, H, Hkv, qL, kL, D = 2, 4, 2, 19, 23, 24
    q = bf16(rng, (B, qL, H, D)).transpose(0, 2, 1, 3)            # strided views
    k = bf16(rng, (B, kL, Hkv, D)).transpose(0, 2, 1, 3)
    v = bf16(rng, (B, Hkv, kL, D))
    mask = bf16(rng, (1, H, qL, kL))
    mask[..., 3] = BF.BF16_NEG_INF
    scale = 0.3
    o, L = tg.flash_attn_train_fwd(q, k, v, mask=mask, causal=causal, scale=scale,
                                   softcap=cap, ctx=dctx)
    assert o.dtype == np.uint16 and o.shape == (B, H, qL, D) and L.shape == (B, H, qL)
    p = tg.attn_params(B, H, Hkv, qL, kL, D, scale, softcap=cap)
    o_raw, L_raw = _raw_fwd(dctx, q, k, v, p, np.broadcast_to(mask, (B, H, qL, kL)), causal)
    assert same_bits(o, o_raw) and same_bits(L, L_raw)
    madd = BF.to_float(mask).astype(np.float64)
    O_ref, L_ref = _attn_ref(q, k, v, madd, causal, float(np.float32(scale)), cap, kL - qL)
    np.testing.assert_allclose(BF.to_float(o), O_ref, rtol=2 ** -7, atol=2 ** -7)
    np.testing.assert_allclose(L, L_ref, rtol=1e-5, atol=1e-5)

    # backward: do strided too; dk/dv accumulate onto given values
    do = bf16(rng, (B, qL, H, D)).transpose(0, 2, 1, 3)
    dk0, dv0 = f32(rng, (B, Hkv, kL, D)), f32(rng, (B, Hkv, kL, D))
    dk, dv = dk0.copy(), dv0.copy()
    dq, dk_r, dv_r = tg.flash_attn_backward(q, k, v, o, L, do, mask=mask, causal=causal,
                                            scale=scale, softcap=cap, dk=dk, dv=dv, ctx=dctx)
    assert dk_r is dk and dv_r is dv and dq.shape == (B, H, qL, D)
    Dv = np.full((B, H, qL), np.nan, np.float32)
    dctx.call("tg_flash_attn_train_bwd_compute_d_bf16", o, np.ascontiguousarray(do), Dv,
              B, H, qL, D)
    assert same_bits(tg.flash_attn_train_bwd_compute_d(o, do, ctx=dctx), Dv)
    rq = np.full((B, H, qL, D), np.nan, np.float32)
    rk, rv = dk0.copy(), dv0.copy()
    mp = capi.AttnMaskParams()
    mp.M_strides[0], mp.M_strides[1], mp.M_strides[2] = 0, qL * kL, kL
    dctx.call("tg_flash_attn_train_bwd_bf16", np.ascontiguousarray(q), np.ascontiguousarray(k),
              v, L, np.ascontiguousarray(do), Dv, rq, rk, rv, p, mp,
              np.ascontiguousarray(mask), int(causal))
    assert same_bits(dq, rq) and same_bits(dk, rk) and same_bits(dv, rv)
    # fresh dk/dv when not given = the accumulated minus the prefill
    _, dk2, dv2 = tg.flash_attn_train_bwd(q, k, v, L, do, Dv, mask=mask, causal=causal,
                                          scale=scale, softcap=cap, ctx=dctx)
    np.testing.assert_allclose(dk2 + dk0, dk, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dv2 + dv0, dv, rtol=1e-5, atol=1e-5)


def test_attention_mask_forms(lib, dctx):
    """bool, float and bf16 masks of any broadcastable shape give the same
    result as the materialised full bf16 mask."""
    rng = np.random.default_rng(3)
    B, H, qL, kL, D = 2, 2, 9, 13, 16
    q, k, v = bf16(rng, (B, H, qL, D)), bf16(rng, (B, H, kL, D)), bf16(rng, (B, H, kL, D))
    keep = rng.random((qL, kL)) < 0.7
    keep[:, 0] = True
    full = np.broadcast_to(np.where(keep, np.uint16(0), BF.BF16_NEG_INF), (B, H, qL, kL))
    ref, _ = tg.flash_attn_train_fwd(q, k, v, mask=np.ascontiguousarray(full), ctx=dctx)
    for m in (keep, keep[None], keep[None, None], np.where(keep, 0.0, -np.inf),
              np.where(keep, 0.0, -np.inf).astype(np.float32)[None],
              np.broadcast_to(keep, (B, 1, qL, kL)), full[:, :1],
              np.asfortranarray(np.where(keep, np.uint16(0), BF.BF16_NEG_INF))):
        o, _ = tg.flash_attn_train_fwd(q, k, v, mask=m, ctx=dctx)
        assert same_bits(o, ref), f"mask shape {np.shape(m)} dtype {np.asarray(m).dtype}"
    # a per-key padding mask [B, 1, 1, kL]
    pad = np.ones((B, 1, 1, kL), bool)
    pad[1, ..., 10:] = False
    o, _ = tg.flash_attn_train_fwd(q, k, v, mask=pad, ctx=dctx)
    ref1, _ = tg.flash_attn_train_fwd(q[1:], np.ascontiguousarray(k[1:, :, :10]),
                                      np.ascontiguousarray(v[1:, :, :10]), ctx=dctx)
    np.testing.assert_allclose(BF.to_float(o[1:]), BF.to_float(ref1), rtol=2 ** -7, atol=1e-6)
    with pytest.raises(ValueError, match="does not broadcast"):
        tg.flash_attn_train_fwd(q, k, v, mask=keep[:, :5], ctx=dctx)
    with pytest.raises(TypeError):
        tg.flash_attn_train_fwd(q, k, v, mask=keep.astype(np.int32), ctx=dctx)


def test_attention_out_view_q_offset_and_inputs(lib, dctx):
    rng = np.random.default_rng(5)
    B, H, qL, kL, D = 1, 2, 6, 10, 8
    q, k, v = bf16(rng, (B, H, qL, D)), bf16(rng, (B, H, kL, D)), bf16(rng, (B, H, kL, D))
    ref, Lr = tg.flash_attn_train_fwd(q, k, v, causal=True, q_offset=0, ctx=dctx)
    p = tg.attn_params(B, H, H, qL, kL, D, q_offset=0)
    raw, _ = _raw_fwd(dctx, q, k, v, p, None, True)
    assert same_bits(ref, raw)
    # O into a strided view of a [B, qL, H, D] buffer; L into a given array
    buf = np.full((B, qL, H, D), 0x1234, np.uint16)
    L = np.zeros((B, H, qL), np.float32)
    o, L2 = tg.flash_attn_train_fwd(q, k, v, causal=True, q_offset=0, ctx=dctx,
                                    out=buf.transpose(0, 2, 1, 3), lse=L)
    assert L2 is L and same_bits(L, Lr)
    assert same_bits(np.ascontiguousarray(buf.transpose(0, 2, 1, 3)), ref)
    # a reversed (negative-stride) input is copied, not refused
    o3, _ = tg.flash_attn_train_fwd(q[:, ::-1], k[:, ::-1], v[:, ::-1], causal=True,
                                    q_offset=0, ctx=dctx)
    assert same_bits(o3, ref[:, ::-1].copy())
    # broadcast (stride-0) K/V over the batch are taken as they are
    kb, vb = np.broadcast_to(k, (3, H, kL, D)), np.broadcast_to(v, (3, H, kL, D))
    qb = np.concatenate([q] * 3)
    o4, _ = tg.flash_attn_train_fwd(qb, kb, vb, causal=True, q_offset=0, ctx=dctx)
    assert all(same_bits(o4[i:i + 1], ref) for i in range(3))


@pytest.mark.skipif(not BF.HAVE_ML_DTYPES, reason="ml_dtypes is not installed (optional)")
def test_ml_dtypes_bfloat16(lib, dctx):
    rng = np.random.default_rng(9)
    q, k, v = (bf16(rng, (1, 2, 5, 8)) for _ in range(3))
    ref, _ = tg.flash_attn_train_fwd(q, k, v, ctx=dctx)
    qm, km, vm = (BF.as_ml_dtypes(a) for a in (q, k, v))
    o, _ = tg.flash_attn_train_fwd(qm, km, vm, ctx=dctx)
    assert o.dtype == BF.bfloat16 and same_bits(o.view(np.uint16), ref)
    np.testing.assert_array_equal(qm.astype(np.float32), BF.to_float(q))
    x = f32(rng, 100)
    out = np.empty(100, BF.bfloat16)
    tg.f32_to_bf16(x, out=out, ctx=dctx)
    assert same_bits(out.view(np.uint16), x.astype(BF.bfloat16).view(np.uint16))


def test_attention_errors_write_nothing(lib, dctx):
    rng = np.random.default_rng(11)
    B, H, qL, kL = 1, 2, 5, 7

    def inputs(D):
        return (bf16(rng, (B, H, qL, D)), bf16(rng, (B, H, kL, D)), bf16(rng, (B, H, kL, D)),
                bf16(rng, (B, H, qL, D)))

    q, k, v, do = inputs(12)          # head dim 12: not a multiple of 8
    L, Dv = np.zeros((B, H, qL), np.float32), np.zeros((B, H, qL), np.float32)
    o = np.full((B, H, qL, 12), 0x1111, np.uint16)
    lse = np.full((B, H, qL), 5.0, np.float32)
    with pytest.raises(tg.UnsupportedError) as ei:
        tg.flash_attn_train_fwd(q, k, v, out=o, lse=lse, ctx=dctx)
    assert "head dim D = 12" in str(ei.value) and ei.value.func == "tg_flash_attn_train_fwd_bf16"
    assert (o == 0x1111).all() and (lse == 5).all()
    dq = np.full((B, H, qL, 12), 7.0, np.float32)
    dk, dv = np.full((B, H, kL, 12), 7.0, np.float32), np.full((B, H, kL, 12), 7.0, np.float32)
    with pytest.raises(tg.UnsupportedError, match="head dim"):
        tg.flash_attn_train_bwd(q, k, v, L, do, Dv, dq=dq, dk=dk, dv=dv, ctx=dctx)
    assert (dq == 7).all() and (dk == 7).all() and (dv == 7).all()

    q, k, v, do = inputs(16)
    dq = np.full((B, H, qL, 16), 7.0, np.float32)
    dk, dv = np.full((B, H, kL, 16), 7.0, np.float32), np.full((B, H, kL, 16), 7.0, np.float32)
    for kw, msg in ((dict(softcap=0.0), "softcapping"), (dict(scale=math.inf), "scale")):
        with pytest.raises(tg.BadParamsError, match=msg) as ei:
            tg.flash_attn_train_bwd(q, k, v, L, do, Dv, dq=dq, dk=dk, dv=dv, ctx=dctx, **kw)
        assert ei.value.detail == dctx.last_error
        assert (dq == 7).all() and (dk == 7).all() and (dv == 7).all()
    # Python-side refusals: the library is never called
    with pytest.raises(TypeError, match="bf16"):
        tg.flash_attn_train_fwd(BF.to_float(q), k, v, ctx=dctx)
    with pytest.raises(ValueError, match="GQA"):
        tg.flash_attn_train_fwd(bf16(rng, (B, 3, qL, 16)), k, v, ctx=dctx)
    with pytest.raises(ValueError, match="same shape"):
        tg.flash_attn_train_fwd(q, k, v[:, :, :3], ctx=dctx)
    with pytest.raises(ValueError, match="4-D"):
        tg.flash_attn_train_fwd(q[0], k, v, ctx=dctx)
    with pytest.raises(ValueError, match="shape"):
        tg.flash_attn_train_bwd(q, k, v, L[:, :1], do, Dv, dq=dq, dk=dk, dv=dv, ctx=dctx)
    with pytest.raises(ValueError, match="expected shape"):
        tg.flash_attn_train_bwd(q, k, v, L, do, Dv, dq=dq[:, :1], ctx=dctx)
    with pytest.raises(TypeError, match="dtype"):
        tg.flash_attn_train_bwd(q, k, v, L, do, Dv, dk=dk.astype(np.float64), ctx=dctx)
    with pytest.raises(ValueError, match="overlap"):
        tg.flash_attn_train_bwd(q, k, v, L, do, Dv, dk=dk, dv=dk, ctx=dctx)
    ro = np.zeros((B, H, qL, 16), np.uint16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        tg.flash_attn_train_fwd(q, k, v, out=ro, ctx=dctx)
    assert (dq == 7).all() and (dk == 7).all() and (dv == 7).all()


def test_compute_d_and_cast(lib, dctx):
    rng = np.random.default_rng(2)
    o, do = bf16(rng, (2, 3, 7, 40)), bf16(rng, (2, 3, 7, 40))
    D = tg.flash_attn_train_bwd_compute_d(o, do, ctx=dctx)
    ref = (BF.to_float(o).astype(np.float64) * BF.to_float(do)).sum(-1)
    np.testing.assert_allclose(D, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="agree"):
        tg.flash_attn_train_bwd_compute_d(o, do[:, :2], ctx=dctx)
    x = f32(rng, (5, 33)) * 1e3
    x[0, :4] = [np.nan, np.inf, -np.inf, 3e38]
    b = tg.f32_to_bf16_cast(x, ctx=dctx)
    assert b.dtype == np.uint16 and b.shape == x.shape and same_bits(b, BF.from_float(x))
    assert tg.f32_to_bf16 is tg.f32_to_bf16_cast
    np.testing.assert_array_equal(tg.bf16_to_f32(b)[1:], BF.to_float(b)[1:])
    assert tg.bf16_to_f32(b).shape == x.shape
    out = np.full(x.shape, 3, np.uint16)
    with pytest.raises(tg.BadShapeError, match="n"):
        tg.f32_to_bf16_cast(np.zeros(0, np.float32), ctx=dctx)
    with pytest.raises(TypeError, match="float"):
        tg.f32_to_bf16_cast(np.arange(3), ctx=dctx)
    assert tg.f32_to_bf16_cast(x.astype(np.float64), out=out, ctx=dctx) is out
    assert same_bits(out, b)


# ---------------------------------------------------------------------------
# RMSNorm, softmax, embedding, cross-entropy, transpose

def _rms_np(x, w, eps):
    X = x.astype(np.float64)
    r = 1 / np.sqrt((X * X).mean(-1) + eps)
    return X * r[..., None] * w, r


def test_rms_norm_functions(lib, dctx):
    rng = np.random.default_rng(4)
    x, w, dy = f32(rng, (3, 5, 70)), f32(rng, 70), f32(rng, (3, 5, 70))
    eps = 1e-5
    y, r = tg.rms_norm_forward(x, w, eps, return_rms_inv=True, ctx=dctx)
    assert y.shape == x.shape and r.shape == (3, 5)
    ry = np.empty((15, 70), np.float32)
    rr = np.empty(15, np.float32)
    dctx.call("tg_rms_norm_forward_f32", x, w, ry, rr, 15, 70, eps)
    assert same_bits(y.reshape(15, 70), ry) and same_bits(r.reshape(15), rr)
    y_ref, r_ref = _rms_np(x, w, np.float32(eps))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    assert same_bits(tg.rms_norm_forward(x, w, eps, ctx=dctx), y)
    rin = np.empty((3, 5), np.float32)
    tg.rms_norm_forward(x, w, eps, rms_inv=rin, ctx=dctx)
    assert same_bits(rin, r)
    assert same_bits(tg.rms_norm_compute_rms_inv(x, eps, ctx=dctx), r)

    dx = tg.rms_norm_backward_dx(x, w, dy, r, ctx=dctx)
    rdx = np.empty((15, 70), np.float32)
    dctx.call("tg_rms_norm_backward_dx_f32", x, w, dy, rr, rdx, 15, 70)
    assert same_bits(dx.reshape(15, 70), rdx)
    dw = tg.rms_norm_backward_dw(x, dy, r.reshape(-1), ctx=dctx)    # flat r accepted too
    rdw = np.empty(70, np.float32)
    dctx.call("tg_rms_norm_backward_dw_f32", x, dy, rr, rdw, 15, 70)
    assert same_bits(dw, rdw)
    gw0 = f32(rng, 70)
    gw = gw0.copy()
    gi, gw_r = tg.rms_norm_backward(x, w, dy, eps, grad_weight=gw, ctx=dctx)
    assert gw_r is gw
    np.testing.assert_allclose(gi, dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw - gw0, dw, rtol=1e-4, atol=1e-4)

    # errors: the library's (eps < 0), Python's (shapes)
    gw_before = gw.copy()
    with pytest.raises(tg.BadParamsError, match="eps") as ei:
        tg.rms_norm_backward(x, w, dy, -1.0, grad_input=gi, grad_weight=gw, ctx=dctx)
    assert "eps" in ei.value.detail and same_bits(gw, gw_before)
    with pytest.raises(tg.BadShapeError):
        tg.rms_norm_forward(np.zeros((0, 4), np.float32), np.ones(4, np.float32), ctx=dctx)
    with pytest.raises(ValueError, match="shape"):
        tg.rms_norm_forward(x, w[:5], ctx=dctx)
    with pytest.raises(ValueError, match="agree"):
        tg.rms_norm_backward_dx(x, w, dy[:1], r, ctx=dctx)
    with pytest.raises(ValueError, match="r: expected"):
        tg.rms_norm_backward_dw(x, dy, r[:1], ctx=dctx)


def test_softmax_backward(lib, dctx):
    rng = np.random.default_rng(6)
    z = f32(rng, (4, 3, 50))
    sm = np.exp(z - z.max(-1, keepdims=True))
    sm = (sm / sm.sum(-1, keepdims=True)).astype(np.float32)
    go = f32(rng, (4, 3, 50))
    gi = tg.softmax_backward(sm, go, ctx=dctx)
    raw = np.empty((12, 50), np.float32)
    dctx.call("tg_softmax_backward", sm, go, raw, 12, 50)
    assert same_bits(gi.reshape(12, 50), raw)
    S, G = sm.astype(np.float64), go.astype(np.float64)
    np.testing.assert_allclose(gi, S * (G - (S * G).sum(-1, keepdims=True)), atol=1e-6)
    with pytest.raises(ValueError, match="agree"):
        tg.softmax_backward(sm, go[:1], ctx=dctx)


def test_embedding_backward(lib, dctx):
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 11, (4, 9))                     # int64, 2-D
    go = f32(rng, (4, 9, 6))
    gw = tg.embedding_backward(go, ids, 11, ctx=dctx)
    ref = np.zeros((11, 6))
    np.add.at(ref, ids.reshape(-1), go.reshape(-1, 6).astype(np.float64))
    np.testing.assert_allclose(gw, ref, rtol=1e-5, atol=1e-5)
    raw = np.zeros((11, 6), np.float32)
    dctx.call("tg_embedding_backward", go, ids.astype(np.uint32), raw, 11, 36, 6)
    assert same_bits(gw, raw)
    acc = np.ones((11, 6), np.float32)
    assert tg.embedding_backward(go, ids, grad_weight=acc, ctx=dctx) is acc   # vocab from it
    np.testing.assert_allclose(acc, ref + 1, rtol=1e-5, atol=1e-5)
    before = acc.copy()
    bad = ids.copy()
    bad[2, 3] = 11
    with pytest.raises(tg.BadIndexError) as ei:
        tg.embedding_backward(go, bad, grad_weight=acc, ctx=dctx)
    assert "11" in ei.value.detail and isinstance(ei.value, IndexError)
    assert same_bits(acc, before)
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        tg.embedding_backward(go, -ids, grad_weight=acc, ctx=dctx)
    with pytest.raises(TypeError, match="integer"):
        tg.embedding_backward(go, ids.astype(np.float32), 11, ctx=dctx)
    with pytest.raises(ValueError, match="vocab_size or grad_weight"):
        tg.embedding_backward(go, ids, ctx=dctx)
    assert same_bits(acc, before)


def test_cross_entropy(lib, dctx):
    rng = np.random.default_rng(10)
    logits = f32(rng, (2, 7, 30), 3.0)
    targets = rng.integers(0, 30, (2, 7))
    pad = 5
    targets[0, :3] = pad
    loss, grad = tg.cross_entropy_fwd_bwd(logits, targets, pad, ctx=dctx)
    live = targets != pad
    count = int(live.sum())
    Z = logits.astype(np.float64)
    lse = np.log(np.exp(Z - Z.max(-1, keepdims=True)).sum(-1)) + Z.max(-1)
    zt = np.take_along_axis(Z, targets[..., None], -1)[..., 0]
    assert abs(loss - ((lse - zt)[live]).sum() / count) < 1e-5
    P = np.exp(Z - lse[..., None])
    onehot = np.eye(30)[targets]
    gref = np.where(live[..., None], (P - onehot) / count, 0)
    np.testing.assert_allclose(grad, gref, atol=1e-6)
    rg, rl = np.zeros((14, 30), np.float32), np.zeros(1, np.float32)
    dctx.call("tg_cross_entropy_fwd_bwd", logits, targets.astype(np.uint32), rg, rl, 14, 30,
              pad, count)
    assert same_bits(grad.reshape(14, 30), rg) and np.float32(loss) == rl[0]
    # the loss accumulates into a given array; count overrides the divisor
    acc = np.array([1.25], np.float32)
    loss2, _ = tg.cross_entropy_fwd_bwd(logits, targets, pad, count=2 * count, loss=acc,
                                        ctx=dctx)
    assert loss2 == acc[0] and abs(loss2 - (1.25 + loss / 2)) < 1e-5
    # count == 0 writes nothing
    g0 = np.full((2, 7, 30), 9.0, np.float32)
    assert tg.cross_entropy_fwd_bwd(logits, targets, pad, count=0, grad=g0, ctx=dctx)[0] == 0
    assert (g0 == 9).all()
    bad = targets.copy()
    bad[1, 1] = 30
    before = acc.copy()
    with pytest.raises(tg.BadIndexError, match="30"):
        tg.cross_entropy_fwd_bwd(logits, bad, pad, grad=g0, loss=acc, ctx=dctx)
    assert (g0 == 9).all() and same_bits(acc, before)
    with pytest.raises(ValueError, match="targets.shape"):
        tg.cross_entropy_fwd_bwd(logits, targets[:1], pad, ctx=dctx)


def test_transpose(lib, dctx):
    rng = np.random.default_rng(12)
    x = f32(rng, (37, 70))
    assert same_bits(tg.transpose_2d(x, ctx=dctx), x.T.copy())
    assert same_bits(tg.transpose_2d(x[:, ::2], ctx=dctx), x[:, ::2].T.copy())
    out = np.empty((70, 37), np.float32)
    assert tg.transpose_2d(x, out=out, ctx=dctx) is out and same_bits(out, x.T.copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        tg.transpose_2d(x, out=np.empty((37, 70), np.float32).T, ctx=dctx)
    with pytest.raises(ValueError, match="2-D"):
        tg.transpose_2d(x[0], ctx=dctx)
    with pytest.raises(tg.BadShapeError):
        tg.transpose_2d(np.zeros((0, 3), np.float32), ctx=dctx)


def test_aliasing(lib, dctx):
    """An out= array over an input: AliasError (a ValueError), nothing
    written; the exact in-place pairs give the out-of-place bits."""
    rng = np.random.default_rng(13)
    x = f32(rng, (40, 40))
    snap = x.copy()
    with pytest.raises(tg.AliasError, match="tg_transpose_2d: output overlaps input") as e:
        tg.transpose_2d(x, out=x, ctx=dctx)
    assert isinstance(e.value, ValueError) and e.value.status == capi.TG_ERR_ALIAS
    assert same_bits(x, snap)
    z = f32(rng, (6, 50))
    sm = np.exp(z - z.max(-1, keepdims=True))
    sm = (sm / sm.sum(-1, keepdims=True)).astype(np.float32)
    go = f32(rng, (6, 50))
    want = tg.softmax_backward(sm, go, ctx=dctx)
    assert tg.softmax_backward(sm, go, out=go, ctx=dctx) is go and same_bits(go, want)
    w = f32(rng, (50,))
    want = tg.rms_norm_forward(z, w, ctx=dctx)
    assert tg.rms_norm_forward(z, w, out=z, ctx=dctx) is z and same_bits(z, want)
    with pytest.raises(tg.AliasError, match="y overlaps x"):  # a partial overlap
        tg.rms_norm_forward(z[1:], w, out=z[:-1], ctx=dctx)


def test_causal_attention_backward(lib, dctx):
    rng = np.random.default_rng(13)
    seq, H, Hkv, D = 21, 4, 2, 12
    go, q = f32(rng, (seq, H, D)), f32(rng, (seq, H, D))
    k, v = f32(rng, (seq, Hkv, D)), f32(rng, (seq, Hkv, D))
    gq, gk, gv = tg.causal_attention_backward(go, q, k, v, ctx=dctx)
    assert gq.shape == q.shape and gk.shape == k.shape
    r = [np.zeros((seq, n * D), np.float32) for n in (H, Hkv, Hkv)]
    dctx.call("tg_causal_attention_backward", go, q, k, v, *r, seq, H, Hkv, D)
    assert same_bits(gq.reshape(seq, -1), r[0]) and same_bits(gk.reshape(seq, -1), r[1])
    assert same_bits(gv.reshape(seq, -1), r[2])
    # 2-D token-major with head counts; accumulation into given grad_k / grad_v
    gk2, gv2 = np.ones((seq, Hkv * D), np.float32), np.ones((seq, Hkv * D), np.float32)
    gq2, _, _ = tg.causal_attention_backward(go.reshape(seq, -1), q.reshape(seq, -1),
                                             k.reshape(seq, -1), v.reshape(seq, -1), H, Hkv,
                                             grad_k=gk2, grad_v=gv2, ctx=dctx)
    assert same_bits(gq2, r[0])
    np.testing.assert_allclose(gk2 - 1, r[1], atol=1e-6)
    # numpy reference of the causal attention gradient (float64)
    Q, K, V, G = (a.astype(np.float64).transpose(1, 0, 2) for a in (q, k, v, go))
    K, V = np.repeat(K, H // Hkv, 0), np.repeat(V, H // Hkv, 0)
    S = Q @ K.transpose(0, 2, 1) / math.sqrt(D)
    S = np.where(np.tri(seq, dtype=bool), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    dP = G @ V.transpose(0, 2, 1)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dQ = (dS @ K / math.sqrt(D)).transpose(1, 0, 2)
    dVr = (P.transpose(0, 2, 1) @ G).reshape(Hkv, H // Hkv, seq, D).sum(1).transpose(1, 0, 2)
    np.testing.assert_allclose(gq, dQ, atol=1e-5)
    np.testing.assert_allclose(gv, dVr, atol=1e-5)
    # n_heads % n_kv_heads != 0: the library refuses, nothing written
    a, b = np.ones((4, 24), np.float32), np.ones((4, 16), np.float32)
    g1, g2, g3 = np.full((4, 24), 5.0, np.float32), np.full((4, 16), 5.0, np.float32), \
        np.full((4, 16), 5.0, np.float32)
    with pytest.raises(tg.BadShapeError) as ei:
        tg.causal_attention_backward(a, a, b, b, 3, 2, grad_q=g1, grad_k=g2, grad_v=g3, ctx=dctx)
    assert ei.value.detail and (g1 == 5).all() and (g2 == 5).all() and (g3 == 5).all()
    with pytest.raises(ValueError, match="n_heads and n_kv_heads"):
        tg.causal_attention_backward(a, a, b, b, ctx=dctx)
    with pytest.raises(ValueError, match="overlap"):
        tg.causal_attention_backward(a, a, b, b, 3, 2, grad_k=g2, grad_v=g2, ctx=dctx)


# ---------------------------------------------------------------------------
# decode reduce and FWHT

_SIGN_TABLE = bytes.fromhex(
    "a73b91f46dc2580eb37f24d68945ea1c63afd852970be13d76c419fe4a852cdb"
    "d34ea8179c5be63172b90df5438a6ec7582f94e1b63d0a7cc561d84fa3971e85")


def _fwht_ref(x):
    """Normalised Sylvester-order Walsh-Hadamard transform, then the D1 sign."""
    n = x.shape[-1]
    Hm = np.array([[1.0]])
    while Hm.shape[0] < n:
        Hm = np.block([[Hm, Hm], [Hm, -Hm]])
    y = x.astype(np.float64) @ Hm.T / math.sqrt(n)
    bits = np.array([(_SIGN_TABLE[j >> 3] >> (j & 7)) & 1 for j in range(n)])
    return y * np.where(bits == 1, -1.0, 1.0)


def test_decode_reduce_and_fwht(lib, dctx):
    rng = np.random.default_rng(14)
    nrows, nwg, DV = 3, 5, 256
    parts = f32(rng, (nrows, nwg, DV))
    S = rng.random((nrows, nwg)).astype(np.float32) + 0.5
    M = f32(rng, (nrows, nwg))
    M[0, 2] = -np.inf                                  # an empty workgroup
    htmp = tg.pack_vec_partials(parts, S, M)
    assert htmp.shape == (nrows * nwg * (DV + 2),)
    out = tg.flash_attn_vec_reduce(htmp, nrows, DV, ctx=dctx)
    a = np.exp(M.astype(np.float64) - M.max(1, keepdims=True))
    ref = (parts * a[..., None]).sum(1) / (S * a).sum(1)[:, None]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    raw = np.empty((nrows, DV), np.float32)
    dctx.call("tg_flash_attn_vec_reduce", htmp, raw, nrows, DV, nwg)
    assert same_bits(out, raw)
    fused = tg.flash_attn_vec_reduce_tq_hb_undo(htmp, nrows, DV, ctx=dctx)
    assert same_bits(fused, tg.fwht_sign_undo(out, ctx=dctx))
    np.testing.assert_allclose(fused, _fwht_ref(ref), rtol=1e-4, atol=1e-5)
    d = out.copy()
    assert tg.fwht_sign_undo_(d, ctx=dctx) is d and same_bits(d, tg.fwht_sign_undo(out, ctx=dctx))
    x512 = f32(rng, (2, 512))
    np.testing.assert_allclose(tg.fwht_sign_undo(x512, ctx=dctx), _fwht_ref(x512), atol=1e-5)

    # refusals
    h128 = tg.pack_vec_partials(parts[..., :128], S, M)
    o = np.full((nrows, 128), 4.0, np.float32)
    with pytest.raises(tg.UnsupportedError, match="256") as ei:
        tg.flash_attn_vec_reduce_tq_hb_undo(h128, nrows, 128, out=o, ctx=dctx)
    assert ei.value.detail and (o == 4).all()
    d128 = np.full((2, 128), 4.0, np.float32)
    with pytest.raises(tg.UnsupportedError):
        tg.fwht_sign_undo_(d128, ctx=dctx)
    assert (d128 == 4).all()
    with pytest.raises(ValueError, match="multiple"):
        tg.flash_attn_vec_reduce(htmp[:-1], nrows, DV, ctx=dctx)
    with pytest.raises(tg.BadShapeError):
        tg.flash_attn_vec_reduce(np.zeros(0, np.float32), nrows, DV, ctx=dctx)
    with pytest.raises(TypeError):
        tg.fwht_sign_undo_(x512.astype(np.float64), ctx=dctx)
    with pytest.raises(ValueError, match="DV % 4"):
        tg.pack_vec_partials(parts[..., :6], S, M)


# ---------------------------------------------------------------------------
# The raw binding of the dtype / options entry points (CPU extension): f32
# attention with dropout through capi, the mask from tg_attn_dropout_keep.

def test_capi_attn_float32_dropout(lib, dctx):
    assert ctypes.sizeof(capi.AttnOptions) == 48
    rng = np.random.default_rng(18)
    B, H, Hk, L, D, p = 1, 2, 1, 40, 16, 0.3
    prm = capi.attn_params_init(B, H, Hk, L, L, D, 0.25, lib=lib)
    Q, dO = f32(rng, (B, H, L, D)), f32(rng, (B, H, L, D))
    K, V = f32(rng, (B, Hk, L, D)), f32(rng, (B, Hk, L, D))
    opt = capi.AttnOptions(dropout_p=p, dropout_seed=int(rng.integers(2**63)),
                           dropout_offset=2**64 - 3)
    O, Lse = np.empty_like(Q), np.empty((B, H, L), np.float32)
    dctx.call("tg_attn_train_fwd", capi.TG_DTYPE_F32, Q, K, V, O, Lse, prm, None, None, 1, opt)
    keep = np.empty((B, H, L, L), np.uint8)
    dctx.call("tg_attn_dropout_keep", opt, B, H, L, L, keep)
    assert 0.5 < keep.mean() < 0.9
    s = np.einsum("bhid,bkd->bhik", Q.astype(np.float64), K[:, 0].astype(np.float64)) * 0.25
    s[..., np.triu(np.ones((L, L), bool), 1)] = -np.inf
    P = np.exp(s - s.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    ref = np.einsum("bhik,bkd->bhid", P * keep / (1 - np.float32(p)), V[:, 0].astype(np.float64))
    np.testing.assert_allclose(O, ref, rtol=0, atol=1e-5)
    Dv = np.empty((B, H, L), np.float32)
    dctx.call("tg_attn_train_bwd_compute_d", capi.TG_DTYPE_F32, O, dO, Dv, B, H, L, D)
    dQ, dK, dV = np.empty_like(Q), np.zeros_like(K), np.zeros_like(V)
    dctx.call("tg_attn_train_bwd", capi.TG_DTYPE_F32, Q, K, V, Lse, dO, Dv, dQ, dK, dV, prm,
              None, None, 1, opt)
    refV = np.einsum("bhik,bhid->bkd", P * keep / (1 - np.float32(p)), dO.astype(np.float64))
    np.testing.assert_allclose(dV[:, 0], refV, rtol=0, atol=1e-5)
    for bad, field in ((capi.AttnOptions(dropout_p=1.0), "dropout_p"),
                       (capi.AttnOptions(flags=4), "flags")):
        o = np.full_like(O, 4.0)
        with pytest.raises(tg.BadParamsError, match=field):
            dctx.call("tg_attn_train_fwd", capi.TG_DTYPE_F32, Q, K, V, o, Lse, prm, None, None,
                      1, bad)
        assert (o == 4).all()
    with pytest.raises(tg.BadParamsError, match="dtype"):
        dctx.call("tg_attn_train_bwd_compute_d", 2, O, dO, Dv, B, H, L, D)
