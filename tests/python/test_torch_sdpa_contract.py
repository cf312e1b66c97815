"""tilegrad.torch keeps torch.nn.functional.scaled_dot_product_attention's
contract, case by case, against a float64 reference on the
same bf16 inputs (PyTorch 1.13 and 2.x):

* every mask shape that broadcasts to (B, H, qL, kL), (qL, 1) included, bool
  and additive;
* a float mask that requires grad gets dL/dS (scale-free, after softcap),
  summed over its broadcast dims;
* empty tensors in -> empty (or zero) tensors out, as PyTorch;
* NaN in the inputs reaches the outputs (the C forward propagates it);
* a value head dim of its own outside the kernels' (multiples of 8 up to
  512): a clear error naming the limit
  (dtypes, precision= and dropout: test_torch_precision_dropout.py);
* modules pickle and deepcopy; MultiHeadAttention's key_padding_mask.

Tolerances, per element: O within 2^-8 |ref| (its one bf16 rounding) plus
2 x the first-order f32 bound (kL + D + 64)(1 + max|L|) 2^-24 P.|V|
(test_torch_wrappers' rule); mask gradients within 2^-6 of the summed magnitudes P (|dP| + |D|) of each
reduced element of dS = P (dP - D) (the bf16 rounding of the result and of O,
which enters through D, and the f32 recomputation).
"""
import copy
import math
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402

from conftest import bf16_randn as bf  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")

F64 = torch.float64



def ref(q, k, v, mask=None, causal_off=None, scale=None, cap=None):
    """float64 softmax(S) @ V (GQA by repeat); mask bool (True = attend) or
    additive, broadcast by torch; causal: key k visible iff k <= i + off.
    A row that sees no key gives 0 (tilegrad's and PyTorch's CPU rule)."""
    g = q.shape[1] // k.shape[1]
    q, k, v = q.detach(), k.detach(), v.detach()
    mask = None if mask is None else mask.detach()
    Q, K, V = q.to(F64), k.to(F64).repeat_interleave(g, 1), v.to(F64).repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = scale * Q @ K.transpose(-1, -2)
    if cap is not None:
        S = cap * torch.tanh(S / cap)
    qL, kL = S.shape[-2:]
    if mask is not None:
        if mask.dtype == torch.bool:
            S = S.masked_fill(~mask, -math.inf)
        else:
            S = S + mask.to(F64)
    if causal_off is not None:
        vis = torch.arange(kL).view(1, kL) <= torch.arange(qL).view(qL, 1) + causal_off
        S = S.masked_fill(~vis, -math.inf)
    dead = torch.isinf(S).all(-1, keepdim=True)
    P = torch.softmax(S.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    O = P @ V
    # per-element bound: O's bf16 rounding + SAFETY 2 x the first-order f32
    # bound of the online softmax and P.V (test_torch_wrappers' rule)
    L = torch.logsumexp(S.masked_fill(dead, 0.0), -1).nan_to_num(0.0)
    rel = (kL + q.shape[-1] + 64) * (1 + float(L.abs().max()) if L.numel() else 1) * 2 ** -24
    O.tol = 2 ** -8 * O.abs() + 2 * rel * (P @ V.abs()) + 1e-30
    return O


def close(got, want, what):
    got = got.detach().to(F64)
    err = (got - want).abs()
    assert bool((err <= want.tol).all()), \
        f"{what}: max err/tol {float((err / want.tol).max()):.3g}"


B, H, HKV, QL, KL, D = 2, 4, 2, 7, 11, 16
MASK_SHAPES = [(QL, 1), (KL,), (1, KL), (QL, KL), (H, 1, KL), (H, QL, 1), (B, 1, QL, 1),
               (B, 1, 1, KL), (1, H, QL, KL), (B, H, QL, KL), (B, H, 1, 1), ()]


@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_any_broadcastable_mask_shape(shape, kind):
    q, k, v = bf(B, H, QL, D, seed=1), bf(B, HKV, KL, D, seed=2), bf(B, HKV, KL, D, seed=3)
    g = torch.Generator().manual_seed(sum(shape) + 7)
    if kind == "bool":
        mask = torch.rand(shape, generator=g) < 0.6     # dead rows included: O row 0
    else:
        mask = (2 * torch.randn(shape, generator=g)).to(torch.bfloat16).float()
    o = tt.attention(q, k, v, mask=mask)
    close(o, ref(q, k, v, mask), f"mask {kind} {shape}")
    # the SDPA front, 4-D, top-left causal off
    o2 = tt.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.equal(o, o2)


def test_mask_views_with_any_strides():
    """A transposed (non-unit key stride) or sliced mask view gives what its
    contiguous copy gives."""
    q, k, v = bf(B, H, QL, D, seed=1), bf(B, HKV, KL, D, seed=2), bf(B, HKV, KL, D, seed=3)
    g = torch.Generator().manual_seed(3)
    mt = (2 * torch.randn(KL, QL, generator=g)).to(torch.bfloat16).t()   # strides (1, QL)
    ms = (2 * torch.randn(B, H, QL, 2 * KL, generator=g)).to(torch.bfloat16)[..., ::2]
    for m in (mt, ms):
        assert not m.is_contiguous()
        assert torch.equal(tt.attention(q, k, v, mask=m), tt.attention(q, k, v, mask=m.contiguous()))


def test_mask_broadcast_over_keys_sdpa_and_grads():
    """(qL, 1): the case that raised TypeError in _mask_args; through
    autograd too (q/k/v gradients finite and equal to the full-mask run)."""
    q, k, v = bf(B, H, QL, D, seed=1, rg=True), bf(B, HKV, KL, D, seed=2, rg=True), \
        bf(B, HKV, KL, D, seed=3, rg=True)
    m = (torch.randn(QL, 1) * 3).to(torch.bfloat16).float()
    o = tt.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    close(o, ref(q, k, v, m), "(qL, 1)")
    o.float().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    tt.attention(q, k, v, mask=m.expand(QL, KL).contiguous()).float().sum().backward()
    for a, t in zip(grads, (q, k, v)):
        assert torch.equal(a, t.grad)


def ref_dmask(q, k, v, do, mask_shape, mask, causal_off=None, cap=None, scale=None):
    """float64 autograd of O w.r.t. an additive mask of mask_shape, and the
    summed magnitudes P (|dP| + |D|) of each reduced element (tolerance)."""
    M = mask.detach().to(F64).requires_grad_(True)
    g = q.shape[1] // k.shape[1]
    Q, K, V = q.to(F64), k.to(F64).repeat_interleave(g, 1), v.to(F64).repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    S = scale * Q @ K.transpose(-1, -2)
    if cap is not None:
        S = cap * torch.tanh(S / cap)
    Sm = (S + M.expand(S.shape)).detach().requires_grad_(True)
    Sc = Sm
    if causal_off is not None:
        qL, kL = S.shape[-2:]
        vis = torch.arange(kL).view(1, kL) <= torch.arange(qL).view(qL, 1) + causal_off
        Sc = Sm.masked_fill(~vis, -math.inf)
    P = torch.softmax(Sc, -1)
    O = P @ V
    dO = do.to(F64)
    (O * dO).sum().backward()
    dS = Sm.grad
    full = (dS.shape)
    lead = dS.dim() - len(mask_shape)
    with torch.no_grad():   # the magnitudes of dS = P (dP - D): its terms
        absum = P * ((dO @ V.transpose(-1, -2)).abs() + (O * dO).sum(-1, keepdim=True).abs())
    want = dS
    if lead:
        want, absum = want.sum(tuple(range(lead))), absum.sum(tuple(range(lead)))
    dims = tuple(i for i, n in enumerate(mask_shape) if n == 1 and want.shape[i] != 1)
    if dims:
        want, absum = want.sum(dims, keepdim=True), absum.sum(dims, keepdim=True)
    assert full == S.shape
    return want, absum


@pytest.mark.parametrize("shape,causal,cap", [
    ((B, H, QL, KL), False, None), ((QL, KL), True, None), ((QL, 1), False, None),
    ((H, 1, KL), False, 30.0), ((B, 1, 1, KL), True, 5.0), ((1,), False, None)], ids=str)
def test_mask_gets_its_gradient(shape, causal, cap):
    q, k, v = bf(B, H, QL, D, seed=11), bf(B, HKV, KL, D, seed=12), bf(B, HKV, KL, D, seed=13)
    g = torch.Generator().manual_seed(5)
    mask = torch.randn(shape, generator=g).to(torch.bfloat16).float().requires_grad_(True)
    do = bf(B, H, QL, D, seed=14)
    o = tt.attention(q, k, v, mask=mask, causal=causal, softcap=cap)
    o.backward(do)
    assert mask.grad is not None and mask.grad.shape == mask.shape
    assert mask.grad.dtype == torch.float32
    want, absum = ref_dmask(q, k, v, do, shape, mask, KL - QL if causal else None, cap)
    err = (mask.grad.to(F64) - want).abs()
    tol = 2 ** -6 * absum + 1e-6
    assert bool((err <= tol).all()), f"dmask {shape}: max err/tol {float((err / tol).max()):.3g}"


def test_bf16_mask_gradient_and_only_mask_requires_grad():
    q, k, v = bf(1, 2, 5, 8, seed=1), bf(1, 2, 6, 8, seed=2), bf(1, 2, 6, 8, seed=3)
    mask = bf(1, 2, 5, 6, seed=4, rg=True)
    o = tt.attention(q, k, v, mask=mask)
    o.float().sum().backward()
    assert mask.grad.dtype == torch.bfloat16 and mask.grad.shape == mask.shape
    assert q.grad is None
    # every row of dS sums to zero (softmax is shift-invariant)
    assert float(mask.grad.float().sum(-1).abs().max()) < 2e-2


EMPTY = [  # q shape, kv shape
    ((B, H, 0, D), (B, HKV, KL, D)),
    ((B, H, QL, D), (B, HKV, 0, D)),
    ((0, H, QL, D), (0, HKV, KL, D)),
    ((B, 0, QL, D), (B, 0, KL, D)),
    ((B, H, 0, D), (B, HKV, 0, D)),
    ((B, H, QL, 0), (B, HKV, KL, 0)),
]


@pytest.mark.parametrize("qs,ks", EMPTY, ids=str)
def test_empty_in_empty_out(qs, ks):
    q, k, v = (torch.zeros(s, dtype=torch.bfloat16, requires_grad=True) for s in (qs, ks, ks))
    enable = qs[1] != ks[1]
    o = tt.scaled_dot_product_attention(q, k, v, enable_gqa=enable)
    assert o.shape == qs and o.dtype == torch.bfloat16
    assert not bool(o.float().abs().sum())            # kL = 0: zeros, as PyTorch's CPU SDPA
    F = torch.nn.functional
    # (PyTorch 2.9's own CPU SDPA dies with SIGFPE on zero heads or batch: not compared)
    if hasattr(F, "scaled_dot_product_attention") and qs[1] == ks[1] and qs[0] and qs[1]:
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        assert want.shape == o.shape and torch.equal(want, o.float())
    o.float().sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and not bool(t.grad.float().abs().sum())
    # with a mask (which gets a zero gradient), causal
    m = torch.zeros(qs[2], ks[2], requires_grad=True)
    tt.attention(q, k, v, mask=m, causal=True).float().sum().backward()
    assert m.grad.shape == m.shape and not bool(m.grad.abs().sum())


def test_rms_norm_empty():
    x = torch.zeros(0, 16, requires_grad=True)
    w = torch.ones(16, requires_grad=True)
    y = tt.rms_norm(x, w, 1e-5)
    assert y.shape == (0, 16)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros(16))


@pytest.mark.parametrize("where", ["q", "k", "v", "mask"])
def test_nan_in_inputs_propagates_to_output(where):
    """One NaN in q, k, v or the additive mask: the NaN elements of O are
    exactly those of the float64 reference (PyTorch's rule)."""
    q, k, v = bf(1, 1, 4, 8, seed=1), bf(1, 1, 5, 8, seed=2), bf(1, 1, 5, 8, seed=3)
    mask = torch.zeros(4, 5)
    {"q": q, "k": k, "v": v, "mask": mask}[where][..., 3, 0] = math.nan
    o = tt.attention(q, k, v, mask=mask)
    want = ref(q, k, v, mask)
    assert bool(torch.isnan(want).any())
    assert torch.equal(torch.isnan(o), torch.isnan(want))


def test_nan_in_grad_output_propagates():
    q, k, v = bf(1, 1, 4, 8, seed=1, rg=True), bf(1, 1, 5, 8, seed=2, rg=True), \
        bf(1, 1, 5, 8, seed=3, rg=True)
    do = torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16)
    do[0, 0, 2, 1] = math.nan
    tt.attention(q, k, v).backward(do)
    assert bool(torch.isnan(q.grad[0, 0, 2]).all())
    assert bool(torch.isnan(k.grad).any()) and bool(torch.isnan(v.grad).any())


def test_value_head_dim_outside_the_kernels_is_a_clear_error():
    """A value head dim of its own must be a multiple of 8 up to 512 (and D
    too); refused before any kernel call (test_torch_attn_variants.py has
    the supported ones against float64 autograd)."""
    for D, Dv in ((16, 12), (16, 520), (12, 16), (16, 0)):
        q, k, v = bf(1, 2, 4, D), bf(1, 2, 5, D), bf(1, 2, 5, Dv)
        with pytest.raises(NotImplementedError,
                           match=rf"Dv = {Dv} != query/key head dim D = {D}.*multiples of 8"):
            tt.scaled_dot_product_attention(q, k, v)


def test_modules_pickle_and_deepcopy():
    torch.manual_seed(0)
    mods = [tt.RMSNorm(16, eps=1e-5, threads=1),
            tt.Attention(causal=True, softcap=30.0, deterministic=True),
            tt.MultiHeadAttention(32, 4, 2, precision="bf16", threads=2)]
    x = torch.randn(2, 5, 16)
    x32 = torch.randn(2, 5, 32)
    qkv = (bf(1, 2, 5, 8, seed=1), bf(1, 2, 5, 8, seed=2), bf(1, 2, 5, 8, seed=3))
    for m in mods:
        args = qkv if isinstance(m, tt.Attention) else \
            (x32,) if isinstance(m, tt.MultiHeadAttention) else (x,)
        y = m(*args)
        for m2 in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
            assert type(m2) is type(m) and torch.equal(m2(*args), y)
            assert repr(m2) == repr(m)


def test_multihead_key_padding_mask():
    torch.manual_seed(1)
    m = tt.MultiHeadAttention(16, 2, causal=False, precision="bf16")
    x = torch.randn(2, 6, 16)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True                         # batch 0: the last two keys are padding
    y = m(x, key_padding_mask=pad)
    # the same as an explicit attend-mask, and unchanged by the padded keys' values
    keep = (~pad).view(2, 1, 1, 6)
    assert torch.equal(y, m(x, mask=keep))
    assert torch.equal(y, m(x, mask=torch.ones(6, 6, dtype=torch.bool), key_padding_mask=pad))
    x2 = x.clone()
    x2[0, 4:] = 100.0
    assert torch.allclose(m(x2, key_padding_mask=pad)[0, :4], y[0, :4])
    with pytest.raises(ValueError, match="key_padding_mask"):
        m(x, key_padding_mask=pad.float())
