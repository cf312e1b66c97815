"""tilegrad.rope_forward / rope_backward / glu_forward / glu_backward (the
numpy functions over tg_rope_* and tg_glu_*) against float64 numpy
references written from the formulas, with bounds from tests/test_rope.c
and tests/test_glu.c (the C suites hold the kernels to them element by
element; here the bindings' layouts, dtypes, promotion and in place)."""
import numpy as np
import pytest

import tilegrad as tg

BF = tg.bf16
U = 2.0 ** -24


@pytest.fixture(scope="module")
def ctx(lib):
    with tg.Context(threads=2, lib=lib) as c:
        yield c


def rope_ref(x, c, s, layout, backward):
    """float64 reference: x [B, H, L, D], c, s [B or 1, L, R]."""
    x = x.astype(np.float64)
    c = c.astype(np.float64)[:, None]
    s = s.astype(np.float64)[:, None]
    R = c.shape[-1]
    h = R // 2
    y = x.copy()
    xr = x[..., :R]
    if layout == "rotate_half":
        idx = np.r_[np.arange(h, R), np.arange(0, h)]
        sign = np.r_[-np.ones(h), np.ones(h)]
    else:
        idx = np.arange(R) ^ 1
        sign = np.where(np.arange(R) % 2 == 0, -1.0, 1.0)
    partner = xr[..., idx]
    if not backward:
        p2 = sign * partner * s
    else:
        p2 = -sign * partner * s[..., idx]
    y[..., :R] = xr * c + p2
    return y, np.abs(xr * c) + np.abs(p2)


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("backward", [False, True])
def test_rope_f32_transposed_view(ctx, layout, backward):
    rng = np.random.default_rng(1)
    B, L, H, D, R = 2, 7, 3, 24, 16
    store = rng.uniform(-3, 3, (B, L, H, D)).astype(np.float32)
    x = store.transpose(0, 2, 1, 3)  # HF's q.transpose(1, 2): no copy
    c = rng.uniform(-1.5, 1.5, (B, L, R)).astype(np.float32)
    s = rng.uniform(-1.5, 1.5, (B, L, R)).astype(np.float32)
    f = tg.rope_backward if backward else tg.rope_forward
    y = f(x, c, s, layout=layout, ctx=ctx)
    want, mag = rope_ref(x, c, s, layout, backward)
    assert y.dtype == np.float32 and y.shape == (B, H, L, D)
    err = np.abs(y - want)
    err[..., :R] -= 2.0001 * U * mag + 2.0 ** -148
    assert (err <= 0).all()
    assert (y[..., R:] == x[..., R:]).all()


def test_rope_bf16_broadcast_promotion_in_place(ctx):
    rng = np.random.default_rng(2)
    B, H, L, D = 1, 4, 9, 64
    x = BF.from_float(rng.uniform(-2, 2, (B, H, L, D)))
    c16 = BF.from_float(rng.uniform(-1, 1, (L, D)))      # [L, R]: broadcast
    s16 = BF.from_float(rng.uniform(-1, 1, (L, D)))
    y = tg.rope_forward(x, c16, s16, ctx=ctx)
    assert y.dtype == x.dtype                            # bf16 x, bf16 tables: bf16
    want, mag = rope_ref(BF.to_float(x).reshape(x.shape), BF.to_float(c16).reshape(1, L, D),
                         BF.to_float(s16).reshape(1, L, D), "rotate_half", False)
    f32part = 2.0001 * U * mag
    got = BF.to_float(y).reshape(y.shape).astype(np.float64)
    assert (np.abs(got - want) <= f32part + 2.0 ** -8 * (np.abs(want) + f32part) + 2.0 ** -133).all()
    # bf16 x with float32 tables: float32 out (torch's promotion), the f32 bound
    c32, s32 = BF.to_float(c16).reshape(L, D), BF.to_float(s16).reshape(L, D)
    y32 = tg.rope_forward(x, c32, s32, ctx=ctx)
    assert y32.dtype == np.float32
    assert (np.abs(y32 - want) <= f32part + 2.0 ** -148).all()
    # in place, and back: dx = R^T y recovers x within two roundings of |x|, |y|
    xx = BF.to_float(x).reshape(x.shape).copy()
    tg.rope_forward(xx, c32, s32, out=xx, ctx=ctx)
    assert (xx == y32).all()
    with pytest.raises(ValueError):
        tg.rope_forward(x, c16[:3], s16[:3], ctx=ctx)
    with pytest.raises(ValueError, match="layout"):
        tg.rope_forward(x, c16, s16, layout="pairs", ctx=ctx)


def glu_ref(g, u, dy, act):
    g = g.astype(np.float64)
    z = g if act == "silu" else 1.5957691216057308 * (g + 0.044715 * g ** 3)
    with np.errstate(over="ignore"):
        S, Sc = 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(z))
    a = g * S
    if act == "silu":
        da = S * (1 + g * Sc)
    else:
        da = S + g * S * Sc * 1.5957691216057308 * (1 + 3 * 0.044715 * g ** 2)
    return a * u, dy * u * da, dy * a, np.abs(z)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_fused_views_f32(ctx, act):
    rng = np.random.default_rng(3)
    rows, cols = 5, 37
    gate_up = rng.uniform(-6, 6, (rows, 2 * cols)).astype(np.float32)
    gate, up = gate_up[:, :cols], gate_up[:, cols:]     # Phi-3's chunk: strided views
    dy = rng.uniform(-2, 2, (rows, cols)).astype(np.float32)
    y = tg.glu_forward(gate, up, act, ctx=ctx)
    dg, du = tg.glu_backward(gate, up, dy, act, ctx=ctx)
    wy, wdg, wdu, az = glu_ref(gate, up, dy, act)
    # test_glu.c's bounds: (11u + 7u|z|) relative for y, dup; dgate ~ twice that
    k = 11 * U + (7 * U * az if act == "gelu_tanh" else 0)
    assert (np.abs(y - wy) <= 1.01 * k * np.abs(wy) + 1e-37).all()
    assert (np.abs(du - wdu) <= 1.01 * k * np.abs(wdu) + 1e-37).all()
    assert (np.abs(dg - wdg) <= 4 * k * (np.abs(dy * up) * (1 + az)) + 1e-37).all()
    # in place over the fused buffer: dgate over gate, dup over up
    g0 = gate_up.copy()
    tg.glu_backward(gate, up, dy, act, dgate=gate, dup=up, ctx=ctx)
    assert (gate == dg).all() and (up == du).all()
    tg.glu_forward(g0[:, :cols], g0[:, cols:], act, out=g0[:, :cols], ctx=ctx)
    assert (g0[:, :cols] == y).all()


def test_glu_bf16_and_errors(ctx):
    rng = np.random.default_rng(4)
    g = BF.from_float(rng.uniform(-100, 100, (3, 300)))
    u = BF.from_float(rng.uniform(-3, 3, (3, 300)))
    y = tg.glu_forward(g, u, "silu", ctx=ctx)
    assert y.dtype == g.dtype and np.isfinite(BF.to_float(y)).all()
    wy = glu_ref(BF.to_float(g).reshape(3, 300), BF.to_float(u).reshape(3, 300), 0, "silu")[0]
    got = BF.to_float(y).reshape(3, 300)
    assert (np.abs(got - wy) <= 2.0 ** -8 * np.abs(wy) + 12 * U * np.abs(wy) + 1e-37).all()
    with pytest.raises(TypeError):
        tg.glu_forward(g, BF.to_float(u).reshape(3, 300), ctx=ctx)
    with pytest.raises(ValueError):
        tg.glu_forward(g, u[:2], ctx=ctx)
    with pytest.raises(ValueError, match="act"):
        tg.glu_forward(g, u, "gelu", ctx=ctx)
    with pytest.raises(tg.TilegradError):  # dgate over up: refused by the library
        uu = BF.to_float(u).reshape(3, 300).copy()
        tg.glu_backward(uu, uu, uu, dgate=uu, ctx=ctx)
