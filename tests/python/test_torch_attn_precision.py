"""tilegrad.torch attention's precision modes, attn_precision= "exact" |
"split" | "bf16" (the C library's tg_ctx_set_attn_precision),
against float64 PyTorch autograd (1.13 and 2.x).

The mode decides how the products that take the attention weights P or the
score gradient dS run when the compute dtype is bf16: O = P.V in the
forward, dQ = dS.K, dK = dS^T.Q and dV = P^T.dO in the backward. P and dS
are f32 values in the kernels; each of them is used

  * exact: as is (f32 products), except the forward's P where the table
    runs O = P.V on its bf16 unit (amx): as split's pair, e = 2^-16, held
    as the forward's e on every table (a bound for all of them);
  * split: as a pair of bf16, hi = bf16(x), lo = bf16(x - hi): the operand
    carries a relative error of at most e = 2^-16;
  * bf16:  rounded once to bf16 (RNE): e = 2^-8.

So each term of those sums carries a relative error of at most e, and a
sum's error is at most e times the sum of its terms' magnitudes:

  O:  e (P.|V|)                    dv: e (P^T.|dO|)    (summed over a kv group)
  dq: scale e (P(|dP| + |D|)).|K|  dk: scale e (P(|dP| + |D|))^T.|Q|
      (|dS| = |P (dP - D)| <= P(|dP| + |D|); softcap's 1 - tanh^2 <= 1)

plus, for dq and dk, the backward being fed the forward's O (through
D = rowsum(O_bf16 . dO)): the mode moves O by the O bound above, so D by
e ((P.|V|) . |dO|) summed over the row, and dS by P times that.

The tolerance of each element is test_torch_wrappers' for the exact
kernels (the bf16 rounding of each output, 2^-8 |ref|, plus SAFETY = 2 times
the bf16-O-through-D and the first-order f32 terms), plus SAFETY times the
mode's terms above. SAFETY = 2 also covers the second-order terms (the
output's RNE rounding acts on the computed value, whose distance from the
reference includes the mode's error: 2^-8 e M, below e M). For exact's
backward e = 0: its gradients' bound is test_torch_wrappers' own plus O's
e through D. split's terms (2^-16) are 1/256 of the output rounding's scale, so exact and split meet one bound in practice;
bf16 mode's are of the output rounding's own size. Measured (avx512bf16
table), largest error / tolerance: exact and split 0.9 (O, dv: the output
rounding term is tight), 0.15-0.45 (dq, dk); bf16 0.3-0.45 (O, dv),
0.05-0.14 (dq, dk) -- its per-term bound adds worst-case errors that in fact
partly cancel. Held to exact's bound (e = 0), bf16 mode fails every case
(hundreds of O elements outside it).

float32 inputs compute in f32 in every mode: bitwise the same results.
"""

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402
from tilegrad import capi  # noqa: E402
from test_torch_wrappers import (SAFETY, U32, UBF, bf, check, ref_attention,  # noqa: E402
                                 scale_of, sum_group)

pytestmark = pytest.mark.usefixtures("float32_default_dtype")

F64 = torch.float64
MODES = ("exact", "split", "bf16")
#: relative error per term of a product taking P or dS (module docstring):
#: the backward's, and the forward's O = P.V
PER_TERM = {"exact": 0.0, "split": 2.0 ** -16, "bf16": 2.0 ** -8}
PER_TERM_FWD = dict(PER_TERM, exact=2.0 ** -16)


def run(q, k, v, dO, attn_precision, **kw):
    """O and the gradients of fresh leaves (copies of q, k, v) in one mode."""
    ts = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = tt.attention(*ts, attn_precision=attn_precision, **kw)
    o.backward(dO.to(o.dtype))
    return [o.detach()] + [t.grad for t in ts]


CASES = [
    # B, H, Hkv, qL, kL, D, causal, mask, softcap, scale_mult
    (2, 4, 2, 37, 70, 32, True, None, None, 1.0),
    (1, 2, 1, 64, 48, 64, False, "bool", None, 2.0),
    (1, 3, 3, 20, 31, 16, True, "float", 30.0, 1.0),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_modes_vs_float64_autograd(case, mode):
    B, H, Hkv, qL, kL, D, causal, mask_kind, cap, smult = case
    gen = torch.Generator().manual_seed(hash(case) % 2 ** 31)
    q, k, v = bf((B, H, qL, D), gen), bf((B, Hkv, kL, D), gen), bf((B, Hkv, kL, D), gen)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand((B, 1, qL, kL), generator=gen) < 0.7
        mask[..., 0] = True                       # no fully masked row here
    elif mask_kind == "float":
        mask = (2 * torch.randn((1, H, qL, kL), generator=gen)).to(torch.bfloat16).float()
    scale = scale_of(D, smult)
    dO = bf((B, H, qL, D), gen, requires_grad=False)
    o, dq, dk, dv = run(q, k, v, dO, mode, mask=mask, causal=causal, scale=scale, softcap=cap)
    assert o.dtype == dq.dtype == dk.dtype == dv.dtype == torch.bfloat16

    Q, K, V = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    O, P, L = ref_attention(Q, K, V, mask, causal, scale, cap, kL - qL)
    O.backward(dO.to(F64))
    g, e, e_o = H // Hkv, PER_TERM[mode], PER_TERM_FWD[mode]
    with torch.no_grad():
        Kr, Vr = K.abs().repeat_interleave(g, 1), V.abs().repeat_interleave(g, 1)
        dOd = dO.to(F64)
        dP = dOd @ V.repeat_interleave(g, 1).transpose(-1, -2)
        Dx = (O * dOd).sum(-1, keepdim=True)
        P, O = P.detach(), O.detach()
        # test_torch_wrappers' terms for the exact kernels: f32 (first
        # order, f32 L included) and the bf16 O fed to the backward (via D)
        rel = (kL + g * qL + D + 64) * (1 + float(L.abs().max())) * U32
        Mds = P * (dP.abs() + Dx.abs())
        PV = P @ Vr
        dD = (UBF + (D + 4) * U32) * (O.abs() * dOd.abs()).sum(-1, keepdim=True)
        # the mode's: e per term of P.V, dS.K, dS^T.Q, P^T.dO, and through D
        dD = dD + e_o * (PV * dOd.abs()).sum(-1, keepdim=True)
        tol_o = UBF * O.abs() + SAFETY * (rel + e_o) * PV
        tol_q = UBF * Q.grad.abs() + SAFETY * scale * (((P * dD) + (rel + e) * Mds) @ Kr)
        tol_k = UBF * K.grad.abs() + SAFETY * sum_group(
            scale * ((P * dD) + (rel + e) * Mds).transpose(-1, -2) @ Q.abs(), g)
        tol_v = UBF * V.grad.abs() + SAFETY * sum_group(
            (rel + e) * P.transpose(-1, -2) @ dOd.abs(), g)
    info = f"case={case} attn_precision={mode}"
    check("O", o, O, tol_o + 1e-30, info)
    check("dq", dq, Q.grad, tol_q + 1e-30, info)
    check("dk", dk, K.grad, tol_k + 1e-30, info)
    check("dv", dv, V.grad, tol_v + 1e-30, info)


def _rel_diff(a, b):
    a, b = a.to(F64), b.to(F64)
    return float((a - b).norm() / b.norm())


def test_split_is_much_closer_to_exact_than_bf16():
    """The mode reaches the kernels: bf16 mode rounds P and dS on every
    microkernel table, so it differs from exact in every output; split
    differs from exact by far less (a 2^-16 operand error flips the odd bf16
    output rounding; measured ~10-25x less normwise than bf16 mode here).
    On tables with bf16 dot products (avx512bf16, amx) split runs the hi +
    lo products, so some outputs differ from exact; elsewhere it computes
    exactly as exact (the header's contract): bitwise equal."""
    gen = torch.Generator().manual_seed(5)
    B, H, Hkv, qL, kL, D = 2, 4, 2, 64, 96, 64
    q, k, v = bf((B, H, qL, D), gen), bf((B, Hkv, kL, D), gen), bf((B, Hkv, kL, D), gen)
    dO = bf((B, H, qL, D), gen, requires_grad=False)
    res = {m: run(q, k, v, dO, m, causal=True, deterministic=True) for m in MODES}
    names = ("O", "dq", "dk", "dv")
    for name, x, s, b in zip(names, res["exact"], res["split"], res["bf16"]):
        d_bf16, d_split = _rel_diff(b, x), _rel_diff(s, x)
        assert d_bf16 > 2 ** -12, (name, d_bf16)     # many elements moved by ~1 bf16 ulp
        assert d_split <= d_bf16 / 4, (name, d_split, d_bf16)
    isa = tt._context(0, True).isa
    split_differs = any(not torch.equal(s, x) for s, x in zip(res["split"], res["exact"]))
    if isa in ("avx512bf16",) or isa.startswith("amx"):
        assert split_differs, f"{isa}: split gave exact's bits in every output"
    elif isa in ("portable", "avx2", "avx512"):
        assert not split_differs, f"{isa}: split must compute as exact"


@pytest.mark.parametrize("precision", [None, "f32"])
def test_float32_compute_is_the_same_in_every_mode(precision):
    """float32 compute dtype (float32 inputs, or float16/float64 with
    precision="f32"): the mode is ignored, bitwise."""
    gen = torch.Generator().manual_seed(7)
    dtype = torch.float32 if precision is None else F64
    mk = lambda *s: torch.randn(s, generator=gen, dtype=F64).to(dtype)  # noqa: E731
    q, k, v, dO = mk(2, 4, 33, 32), mk(2, 2, 50, 32), mk(2, 2, 50, 32), mk(2, 4, 33, 32)
    mask = torch.randn(33, 50, generator=gen, dtype=F64).to(dtype).requires_grad_(True)
    res = {}
    for m in MODES:
        mk_ = mask.detach().clone().requires_grad_(True)
        res[m] = run(q, k, v, dO, m, mask=mk_, causal=True, precision=precision) + [mk_.grad]
    for m in ("split", "bf16"):
        for a, b in zip(res[m], res["exact"]):
            assert a.dtype == dtype and torch.equal(a, b), m


def test_mode_applies_to_bf16_compute_of_float32_inputs():
    """precision="bf16" makes the compute dtype bf16, so the mode applies:
    float32 inputs with bf16-exact values give the bf16 inputs' results in
    every mode, bitwise, and bf16 mode differs from exact."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = bf((1, 2, 40, 16), gen), bf((1, 2, 40, 16), gen), bf((1, 2, 40, 16), gen)
    dO = bf((1, 2, 40, 16), gen, requires_grad=False)
    got = {}
    for m in MODES:
        r32 = run(q.float(), k.float(), v.float(), dO, m, precision="bf16")
        rbf = run(q, k, v, dO, m)
        for a, b in zip(r32, rbf):
            assert a.dtype == torch.float32 and torch.equal(a, b.float()), m
        got[m] = r32
    assert not torch.equal(got["bf16"][0], got["exact"][0])


def test_backward_runs_in_its_forwards_mode(monkeypatch):
    """The mode travels with the graph: a backward runs in its own call's
    mode whatever mode other calls set on the thread's context in between,
    and the context is set only when the mode changes (one ctypes call)."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = bf((1, 2, 24, 16), gen), bf((1, 2, 30, 16), gen), bf((1, 2, 30, 16), gen)
    dO = bf((1, 2, 24, 16), gen, requires_grad=False)
    ref = run(q, k, v, dO, "bf16")
    ts = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    o = tt.attention(*ts, attn_precision="bf16")
    tt.attention(q, k, v, attn_precision="exact")            # the context is now exact
    o.backward(dO)
    for a, b in zip([o.detach()] + [t.grad for t in ts], ref):
        assert torch.equal(a, b)

    sets = []
    prop = capi.Context.attn_precision
    monkeypatch.setattr(capi.Context, "attn_precision", property(
        prop.fget, lambda self, p: (sets.append(p), prop.fset(self, p))[1]))
    for m in ("exact", "exact", "bf16", "bf16", "split", "exact"):    # the backward left bf16
        tt.attention(q, k, v, attn_precision=m)
    assert sets == [capi.TG_ATTN_PRECISION_EXACT, capi.TG_ATTN_PRECISION_BF16,
                    capi.TG_ATTN_PRECISION_SPLIT, capi.TG_ATTN_PRECISION_EXACT]
    tt.attention(q, k, v, attn_precision="bf16", deterministic=True)
    assert tt._context(0, True).attn_precision == "bf16"     # per context: 2 caches
    assert tt._context(0, False).attn_precision == "exact"


def test_bad_attn_precision_is_a_clear_error():
    q = torch.randn(1, 1, 4, 8)
    for bad in ("f32", "BF16", "fp8", None, 2):
        for call in (lambda: tt.attention(q, q, q, attn_precision=bad),
                     lambda: tt.scaled_dot_product_attention(q, q, q, attn_precision=bad),
                     lambda: tt.Attention(attn_precision=bad),
                     lambda: tt.MultiHeadAttention(16, 2, attn_precision=bad)):
            with pytest.raises(ValueError, match="attn_precision must be one of "
                                                 r"\('exact', 'split', 'bf16'\)"):
                call()


def test_modules_store_and_pass_attn_precision():
    import copy
    import pickle
    gen = torch.Generator().manual_seed(10)
    q, k, v = bf((1, 2, 20, 16), gen), bf((1, 2, 20, 16), gen), bf((1, 2, 20, 16), gen)
    a = tt.Attention(causal=True, attn_precision="bf16")
    assert a.attn_precision == "bf16" and "attn_precision='bf16'" in repr(a)
    assert "attn_precision='exact'" in repr(tt.Attention())
    want = tt.attention(q, k, v, causal=True, attn_precision="bf16")
    assert torch.equal(a(q, k, v), want)
    assert not torch.equal(want, tt.attention(q, k, v, causal=True))
    for a2 in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert a2.attn_precision == "bf16" and torch.equal(a2(q, k, v), want)

    m = tt.MultiHeadAttention(32, 4, 2, precision="bf16", attn_precision="split")
    assert m.attn.attn_precision == "split" and "attn_precision='split'" in repr(m)
    x = torch.randn(2, 9, 32, generator=gen)
    y = m(x)
    m.attn.attn_precision = "bf16"
    assert not torch.equal(m(x), y)
    m.attn.attn_precision = "split"
    assert torch.equal(m(x), y)
    assert torch.equal(tt.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                       attn_precision="bf16"),
                       tt.attention(q, k, v, causal=True, q_offset=0, attn_precision="bf16"))
