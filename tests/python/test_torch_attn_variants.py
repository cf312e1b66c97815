"""tilegrad.torch attention variants: sliding window (``window=W``), attention
sinks (``sinks=``, a gradient for them) and a value head dim Dv != D, on the
custom ops (PyTorch >= 2.4) and on the autograd Functions (1.13).

Oracle: PyTorch autograd of a plain float64 implementation on the same
inputs (bf16 inputs are exact in float64), written from the definitions:

* window: a dense boolean mask, key k visible to query i iff
  ``k > i + q_offset - W`` (and, causal, ``k <= i + q_offset``);
* sinks: a sink column s_h concatenated to the scores, softmax over
  ``[S, s_h]``, the column dropped (it has no value); the sinks' gradient
  from autograd through the concatenation;
* Dv: V's own shape ``[B, H_kv, kL, Dv]``;
* dropout: the kernels' keep flags (tg_attn_dropout_keep), as
  test_torch_precision_dropout.py.

Tolerances, per element: test_torch_wrappers' bound (tests/python/README.md)
with Dv in place of D where the sums run over V's columns,

  tol_X = u_out |ref| + SAFETY * (input perturbation + first-order f32 terms),

u_out = 2^-8 (bf16: one rounding of O and of each gradient; the backward
is fed the bf16 O through D_vec = rowsum(O dO): |dD| <= (2^-8 + (Dv+4) 2^-24)
sum|O||dO|) or 2^-24 (float32), f32 terms (kL + g qL + max(D, Dv) + 64)
(1 + max|L|) 2^-24 times the summed magnitudes, L including the sink. The
sinks' gradient -sum_{b,i} p_sink D_vec (p_sink = e^{s_h - L}): moved by
p_sink |dD| through D_vec and by p_sink |D_vec| times the relative error of
e^{-L} (the f32 term), plus (B qL + 64) 2^-24 sum p_sink |D_vec| for its
own f32 sum. The mask gradient (recomputed in f32 torch ops) within SAFETY
(4 u_out + rel) of the reduced magnitudes P (|dP| + |D_vec|), as
test_torch_sdpa_contract.py's 2^-6 for bf16. Observed worst error/tol
(printed to stderr; AMD EPYC, AVX2 table, torch 2.9.1): bf16 O 0.95, dv
0.94, dq 0.93, dk 0.61, dmask 0.15, dsinks 0.014; float32 at most 0.005. A
window off by one key or a sink counted twice fails 10 and 8 of the 12 cases.

These need the C engine's variant support (a library that ignores the
options' new fields fails them); the error, signature and opcheck-schema
tests do not.
"""
import math
import sys

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402
from test_torch_wrappers import F64, SAFETY, U32, UBF, check, sum_group  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")


def ref_variants(Q, K, V, mask, causal, scale, cap, q_off, window, sinks, keep=None, p=0.0):
    """float64 reference -> (O, P, L, p_sink): P [B,H,qL,kL] the weights of
    the keys (the sink's column dropped), L the logsumexp with the sink,
    p_sink [B,H,qL] the sink's weight (zeros without sinks)."""
    g = Q.shape[1] // K.shape[1]
    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
    S = scale * (Q @ Kr.transpose(-1, -2))
    if cap is not None and cap != 1.0:
        S = cap * torch.tanh(S / cap)
    qL, kL = S.shape[-2:]
    keys, rows = torch.arange(kL).view(1, kL), torch.arange(qL).view(qL, 1) + q_off
    vis = torch.ones(S.shape, dtype=torch.bool)
    if causal:
        vis = vis & (keys <= rows)
    if window:
        vis = vis & (keys > rows - window)
    if mask is not None:
        if mask.dtype == torch.bool:
            vis = vis & mask
        else:
            m = mask.to(F64)
            vis = vis & torch.isfinite(m)
            S = S + torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    Sm = S.masked_fill(~vis, -math.inf)
    B, H = Sm.shape[:2]
    if sinks is not None:
        col = sinks.to(F64).view(1, H, 1, 1).expand(B, H, qL, 1)
        Sm = torch.cat((Sm, col), -1)
    L = torch.logsumexp(Sm.detach(), -1)
    # a row that sees nothing (no key, no sink): weights 0 and no gradient, not NaN
    dead = torch.isneginf(Sm).all(-1, keepdim=True)
    Pall = torch.softmax(Sm.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    P = Pall[..., :kL]
    p_sink = Pall[..., kL] if sinks is not None else torch.zeros(B, H, qL, dtype=F64)
    Pd = P if keep is None else P * keep / (1.0 - p)
    return Pd @ Vr, P, L, p_sink.detach()


def bounds(Q, K, V, O, P, L, p_sink, dOd, scale, u_out, keep=None, p=0.0):
    """Per-element tolerances (module docstring) of O, dq, dk, dv, dsinks
    and the unreduced dmask [B,H,qL,kL], from the float64 reference's
    leaves (after O.backward) and (P, L, p_sink) of ref_variants."""
    B, H, qL, D = Q.shape
    kL, Dv, g = K.shape[2], V.shape[3], H // K.shape[1]
    with torch.no_grad():
        Kr, Vr = K.abs().repeat_interleave(g, 1), V.repeat_interleave(g, 1)
        kp = torch.ones_like(P) if keep is None else keep / (1.0 - p)
        Pd = P * kp
        dP = (dOd @ Vr.transpose(-1, -2)) * kp
        Dx = (O * dOd).sum(-1, keepdim=True)
        Lmax = float(L[torch.isfinite(L)].abs().max())
        rel = (kL + g * qL + max(D, Dv) + 64) * (1 + Lmax) * U32
        Mds = P * (dP.abs() + Dx.abs())
        dD = (u_out + (Dv + 4) * U32) * (O.abs() * dOd.abs()).sum(-1, keepdim=True)
        ps = p_sink.unsqueeze(-1)
        mag_s = (ps * Dx.abs()).sum((0, 2, 3))
        tol = {
            "O": u_out * O.abs() + SAFETY * rel * (Pd @ Vr.abs()),
            "dq": u_out * Q.grad.abs() + SAFETY * scale * (((P * dD) + rel * Mds) @ Kr),
            "dk": u_out * K.grad.abs() + SAFETY * sum_group(
                scale * ((P * dD) + rel * Mds).transpose(-1, -2) @ Q.abs(), g),
            "dv": u_out * V.grad.abs() + SAFETY * sum_group(
                rel * Pd.transpose(-1, -2) @ dOd.abs(), g),
            "dsinks": SAFETY * ((ps * dD).sum((0, 2, 3)) + rel * mag_s) +
            (B * qL + 64) * U32 * mag_s,
            "dmask": SAFETY * (4 * u_out + rel) * Mds,
        }
    return {k: t + 1e-30 for k, t in tol.items()}


def draw(shape, gen, dtype):
    return torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)


# name: B, H, Hkv, qL, kL, D, Dv, causal, window, sinks, mask, softcap, dropout_p
CASES = {
    "window-causal": (1, 2, 2, 40, 40, 16, 16, True, 7, None, None, None, 0.0),
    "window-causal-gqa-sinks-qL<kL": (2, 4, 2, 23, 50, 32, 32, True, 13, "randn", None, None,
                                      0.0),
    "dv48-gqa4-sinks-boolmask": (1, 4, 1, 30, 30, 16, 48, False, None, "randn", "bool", None,
                                 0.0),
    "dv8-window-sinks-floatmask-qL>kL": (2, 2, 1, 37, 21, 64, 8, True, 5, "mixed", "float",
                                         None, 0.0),
    "dv24-window-noncausal-softcap": (1, 3, 3, 33, 70, 8, 24, False, 20, None, None, 20.0,
                                      0.0),
    "dropout-window-sinks-dv32": (1, 2, 1, 24, 24, 16, 32, True, 9, "randn", None, None, 0.2),
}


def _sinks(kind, H, gen):
    if kind is None:
        return None
    s = torch.randn(H, generator=gen) * 2
    if kind == "mixed":          # one head without a sink, one whose sink dominates
        s[0] = -math.inf
        s[-1] = 6.0
    return s.requires_grad_(True)


def _mask(kind, B, H, qL, kL, gen, dtype):
    if kind == "bool":
        m = torch.rand((B, 1, qL, kL), generator=gen) < 0.7
        m[..., 0] = True
        return m
    if kind == "float":           # additive, requires grad (dL/dS through the window)
        m = (2 * torch.randn((1, H, qL, kL), generator=gen)).to(dtype)
        m[..., 3] = -math.inf
        return m.requires_grad_(True)
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_variants_vs_float64_autograd(name, dtype):
    B, H, Hkv, qL, kL, D, Dv, causal, W, skind, mkind, cap, p = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q, k, v = draw((B, H, qL, D), gen, dtype), draw((B, Hkv, kL, D), gen, dtype), \
        draw((B, Hkv, kL, Dv), gen, dtype)
    sinks = _sinks(skind, H, gen)
    mask = _mask(mkind, B, H, qL, kL, gen, dtype)
    dO = torch.randn((B, H, qL, Dv), generator=gen).to(dtype)
    scale = float(torch.tensor(1 / math.sqrt(D), dtype=torch.float32))
    torch.manual_seed(77)
    o = tt.attention(q, k, v, mask=mask, causal=causal, scale=scale, softcap=cap, window=W,
                     sinks=sinks, dropout_p=p)
    assert o.dtype == dtype and o.shape == (B, H, qL, Dv)
    o.backward(dO)
    keep = None
    if p:
        torch.manual_seed(77)
        keep = tt._dropout_keep(p, tt._dropout_seed(p), B, H, qL, kL)

    Q, K, V = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    S64 = None if sinks is None else sinks.detach().to(F64).requires_grad_(True)
    M64 = mask.detach().to(F64).requires_grad_(True) if mkind == "float" else mask
    O, P, L, p_sink = ref_variants(Q, K, V, M64, causal, scale, cap, kL - qL, W, S64, keep, p)
    dOd = dO.to(F64)
    O.backward(dOd)

    u_out = UBF if dtype == torch.bfloat16 else U32
    tol = bounds(Q, K, V, O, P, L, p_sink, dOd, scale, u_out, keep, p)
    info = f"case {name}, {dtype}"
    worst = {}
    for what, got, ref in (("O", o, O.detach()), ("dq", q.grad, Q.grad), ("dk", k.grad, K.grad),
                           ("dv", v.grad, V.grad)):
        worst[what] = check(what, got, ref, tol[what], info)
    assert v.grad.shape == v.shape and k.grad.shape == k.shape
    if sinks is not None:
        assert sinks.grad is not None and sinks.grad.dtype == torch.float32
        worst["dsinks"] = check("dsinks", sinks.grad, S64.grad, tol["dsinks"], info)
    if mkind == "float":
        worst["dmask"] = check("dmask", mask.grad, M64.grad, tol["dmask"].sum(0, keepdim=True),
                               info)
    print(f"{info}: error/tol " + ", ".join(f"{w} {r:.2g}" for w, r in worst.items()),
          file=sys.stderr)


def test_sink_gradient_accumulates_and_bf16_sinks():
    """Each backward adds its dsinks once (the op zeroes the kernel's
    accumulator); bf16 sinks get a bf16 gradient of the float32 one."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = draw((1, 2, 9, 16), gen, torch.float32), draw((1, 2, 11, 16), gen, torch.float32), \
        draw((1, 2, 11, 16), gen, torch.float32)
    s = torch.tensor([0.5, -1.0], requires_grad=True)
    tt.attention(q, k, v, sinks=s).sum().backward()
    first = s.grad.clone()
    assert bool((first != 0).all())
    tt.attention(q, k, v, sinks=s).sum().backward()
    assert torch.equal(s.grad, 2 * first)
    sb = s.detach().to(torch.bfloat16).requires_grad_(True)
    tt.attention(q, k, v, sinks=sb).sum().backward()
    assert sb.grad.dtype == torch.bfloat16


def test_sink_values_at_the_edges():
    """-inf: no sink (the result without sinks); NaN or +inf: that head's O
    NaN, the other heads' finite; kL = 0: O = 0, dsinks = 0."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(s, generator=gen) for s in ((1, 3, 6, 8), (1, 3, 7, 8), (1, 3, 7, 8)))
    plain = tt.attention(q, k, v, causal=True)
    none = tt.attention(q, k, v, causal=True, sinks=torch.full((3,), -math.inf))
    torch.testing.assert_close(none, plain, rtol=0, atol=1e-6)
    for bad in (math.nan, math.inf):
        o = tt.attention(q, k, v, sinks=torch.tensor([0.0, bad, 1.0]))
        assert bool(torch.isnan(o[:, 1]).all()) and bool(torch.isfinite(o[:, [0, 2]]).all())
    s = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    o = tt.attention(q, k[:, :, :0], v[:, :, :0], sinks=s)
    assert o.shape == (1, 3, 6, 8) and bool((o == 0).all())
    o.sum().backward()
    assert torch.equal(s.grad, torch.zeros(3))


def test_sdpa_takes_window_sinks_and_value_head_dim():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 10, 16, generator=gen), torch.randn(2, 12, 16, generator=gen)
    v = torch.randn(2, 12, 40, generator=gen)
    s = torch.tensor([0.25])
    o = tt.scaled_dot_product_attention(q, k, v, window=4, sinks=s)
    assert o.shape == (2, 10, 40)
    want = tt.attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), window=4, sinks=s)
    assert torch.equal(o, want.squeeze(1))
    # is_causal: top-left diagonal, the window counts back from it
    o = tt.scaled_dot_product_attention(q, k, v, is_causal=True, window=3)
    want = tt.attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), causal=True,
                        q_offset=0, window=3)
    assert torch.equal(o, want.squeeze(1))


# ---------------------------------------------------------------------------
# bad arguments: clear errors before any C call

def test_bad_arguments_are_refused_before_the_library(monkeypatch):
    def no_call(*a, **kw):
        raise AssertionError("the C library was called")
    monkeypatch.setattr(tt, "_context", no_call)
    q, k, v = torch.zeros(1, 2, 4, 16), torch.zeros(1, 1, 5, 16), torch.zeros(1, 1, 5, 16)
    for w, err in ((-1, ValueError), (0, ValueError), (2 ** 32, ValueError), (1.5, TypeError),
                   (True, TypeError)):
        with pytest.raises(err, match="window"):
            tt.attention(q, k, v, window=w)
    for s, err, what in ((torch.zeros(3), ValueError, r"shape \(2,\)"),
                         (torch.zeros(1, 2), ValueError, r"shape \(2,\)"),
                         (torch.zeros(2, dtype=torch.int64), TypeError, "floating point"),
                         (torch.zeros(2, device="meta"), ValueError, "CPU"),
                         ([0.0, 1.0], TypeError, "tensor")):
        with pytest.raises(err, match=what):
            tt.attention(q, k, v, sinks=s)
        with pytest.raises(err, match=what):
            tt.scaled_dot_product_attention(q, k.expand(1, 2, 5, 16), v.expand(1, 2, 5, 16),
                                            sinks=s)
    for Dv in (12, 0, 520):
        with pytest.raises(NotImplementedError, match=f"Dv = {Dv}.*multiples of 8"):
            tt.attention(q, k, torch.zeros(1, 1, 5, Dv))


@pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS, reason="no torch.library custom ops")
def test_ops_check_their_new_arguments():
    q, k = torch.zeros(1, 2, 4, 16), torch.zeros(1, 1, 5, 16)
    v = torch.zeros(1, 1, 5, 24)
    base = (q, k, v, None, False, 0.25, 1.0, 1, 0.0, None, 1, False, 0)
    with pytest.raises(ValueError, match="window"):
        torch.ops.tilegrad.attn_fwd(*base, -1, None)
    for s in (torch.zeros(2, dtype=torch.float64), torch.zeros(3)):
        with pytest.raises(ValueError, match="sinks must be a float32"):
            torch.ops.tilegrad.attn_fwd(*base, 0, s)
    with pytest.raises(NotImplementedError, match="Dv = 12"):
        torch.ops.tilegrad.attn_fwd(q, k, v[..., :12], *base[3:], 0, None)
    o = torch.zeros(1, 2, 4, 16)              # o / do must have Dv columns
    lse = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match=r"do must have shape \(1, 2, 4, 24\)"):
        torch.ops.tilegrad.attn_bwd(o, q, k, v, o, lse, *base[3:], 0, None)


@pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS, reason="no torch.library custom ops")
def test_fake_impls_give_the_variant_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = torch.empty(2, 4, 9, 16), torch.empty(2, 2, 13, 16), torch.empty(2, 2, 13, 40)
        s = torch.empty(4)
        o, lse = torch.ops.tilegrad.attn_fwd(q, k, v, None, True, 0.25, 1.0, 4, 0.0, None, 1,
                                             False, 0, 5, s)
        assert o.shape == (2, 4, 9, 40) and lse.shape == (2, 4, 9)
        dq, dk, dv, ds = torch.ops.tilegrad.attn_bwd(o, q, k, v, o, lse, None, True, 0.25, 1.0,
                                                     4, 0.0, None, 1, False, 0, 5, s)
        assert (dq.shape, dk.shape, dv.shape, ds.shape) == (q.shape, k.shape, v.shape, (4,))
        assert ds.dtype == torch.float32
        *_, ds = torch.ops.tilegrad.attn_bwd(o, q, k, v, o, lse, None, True, 0.25, 1.0, 4, 0.0,
                                             None, 1, False, 0, 0, None)
        assert ds.shape == (0,)


def _opcheck_cases():
    gen = torch.Generator().manual_seed(6)
    B, H, Hkv, qL, kL, D = 1, 4, 2, 9, 13, 16
    bfd = lambda *s: torch.randn(s, generator=gen).to(torch.bfloat16)  # noqa: E731
    q, k = bfd(B, H, qL, D).requires_grad_(True), bfd(B, Hkv, kL, D).requires_grad_(True)
    v = bfd(B, Hkv, kL, 32).requires_grad_(True)
    s = torch.randn(H, generator=gen).requires_grad_(True)
    f32 = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    seed = torch.tensor(4321, dtype=torch.int64)
    sc = 0.25
    # (q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads, det,
    #  attn_precision, window, sinks)
    return [
        (q, k, v, None, True, sc, 1.0, kL - qL, 0.0, None, 1, True, 0, 4, s),
        (q, k, v[..., :D].detach().requires_grad_(True), None, False, sc, 1.0, kL - qL, 0.0,
         None, 2, True, 2, 0, s),
        (*f32, None, True, sc, 1.0, kL - qL, 0.0, None, 1, True, 0, 3, None),
        (*f32, None, False, sc, 1.0, 0, 0.25, seed, 2, True, 0, 6, s),           # dropout
    ]


@pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS, reason="no torch.library custom ops")
@pytest.mark.parametrize("i", range(4))
def test_opcheck_variants(i):
    args = _opcheck_cases()[i]
    torch.library.opcheck(torch.ops.tilegrad.attn_fwd.default, args)
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    o, lse = torch.ops.tilegrad.attn_fwd(*plain)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(o.dtype)
    torch.library.opcheck(torch.ops.tilegrad.attn_bwd.default, (do, *plain[:3], o, lse,
                                                                *plain[3:]))


@pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS, reason="no torch.library custom ops")
def test_compile_fullgraph_with_window_sinks_and_dv():
    """torch.compile(fullgraph=True) traces the variants' argument handling
    without graph breaks; aot_eager gives eager's bits, gradients included."""
    gen = torch.Generator().manual_seed(8)
    leaves = [torch.randn(s, generator=gen).requires_grad_(True)
              for s in ((1, 4, 12, 16), (1, 2, 12, 16), (1, 2, 12, 24), (4,))]

    def f(q, k, v, s):
        return tt.attention(q, k, v, causal=True, window=5, sinks=s)

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        ts = [t.detach().clone().requires_grad_(True) for t in leaves]
        o = fn(*ts)
        o.square().sum().backward()
        outs.append([o.detach()] + [t.grad for t in ts])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
