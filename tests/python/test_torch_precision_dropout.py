"""tilegrad.torch attention: the dtypes it computes in and its dropout,
against float64 PyTorch autograd (1.13 and 2.x).

* float32 inputs compute in float32: O and the gradients within 1e-5 (max
  abs) of float64 on unit-variance inputs up to L = 4096 (PyTorch's float32
  SDPA: ~3e-7). The bound is the issue's; the kernels' error is ~1e-6 (f32
  accumulation over L keys with compensated dK/dV sums in the C library).
* float16 inputs compute in float32 (exact widening): the result is within
  the float16 rounding of the output and the gradients.
* float64 inputs need precision= ("f32" or "bf16"); precision="bf16" on
  float32 inputs gives bf16 accuracy; mixed dtypes are refused.
* dropout_p: the kernels' keep flags (tg_attn_dropout_keep, the same
  Philox stream) reproduce O and every gradient in a float64 reference that
  applies them; torch.manual_seed makes a call repeat; the fraction kept is
  1 - p within 6 binomial standard deviations; p = 0 is no dropout.
"""
import math

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402

F64 = torch.float64


def ref_f64(q, k, v, mask=None, causal=False, keep=None, p=0.0):
    """float64 attention with autograd (GQA by repeat; bool mask True =
    attend; causal bottom-right; dropout by the given keep flags)."""
    g = q.shape[1] // k.shape[1]
    K, V = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    S = q @ K.transpose(-1, -2) / math.sqrt(q.shape[-1])
    qL, kL = S.shape[-2:]
    if mask is not None:
        S = S.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else S + mask
    if causal:
        vis = torch.arange(kL).view(1, kL) <= torch.arange(qL).view(qL, 1) + (kL - qL)
        S = S.masked_fill(~vis, -math.inf)
    dead = torch.isinf(S).all(-1, keepdim=True)    # a row that sees no key: P = 0
    P = torch.softmax(S.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    if keep is not None:
        P = torch.where(keep, P / (1 - p), torch.zeros_like(P))
    return P @ V


def leaves(shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=F64).to(dtype).requires_grad_(True) for s in shapes]


def f64_twins(ts):
    return [t.detach().to(F64).requires_grad_(True) for t in ts]


def max_errs(ts, o, twins, o64, do):
    """max |err| of O and of each input's gradient against the f64 twins."""
    o.backward(do.to(o.dtype))
    o64.backward(do.to(F64))
    errs = {"O": float((o.detach().to(F64) - o64.detach()).abs().max())}
    for name, t, t64 in zip("qkv", ts, twins):
        errs["d" + name] = float((t.grad.to(F64) - t64.grad).abs().max())
    return errs


@pytest.mark.parametrize("B,H,Hkv,qL,kL,D,causal,masked", [
    (1, 1, 1, 4096, 4096, 64, False, False),
    (1, 1, 1, 4096, 4096, 64, True, False),
    (2, 4, 2, 37, 300, 64, True, True),
    (1, 2, 1, 513, 129, 128, False, True),
    (1, 1, 1, 1, 1, 8, False, False),
], ids=str)
def test_float32_inputs_get_float32_accuracy(B, H, Hkv, qL, kL, D, causal, masked):
    ts = leaves([(B, H, qL, D), (B, Hkv, kL, D), (B, Hkv, kL, D)], torch.float32, seed=qL + kL)
    twins = f64_twins(ts)
    mask = None
    if masked:
        g = torch.Generator().manual_seed(7)
        mask = torch.rand(B, 1, qL, kL, generator=g) > 0.3
        mask[..., 0, :] = False             # a row that sees no key: O = 0 there
    do = torch.randn(B, H, qL, D, generator=torch.Generator().manual_seed(3), dtype=F64)
    o = tt.attention(*ts, mask=mask, causal=causal)
    assert o.dtype == torch.float32
    o64 = ref_f64(*twins, mask=mask, causal=causal)
    errs = max_errs(ts, o, twins, o64, do)
    assert all(e <= 1e-5 for e in errs.values()), errs
    assert all(t.grad.dtype == torch.float32 for t in ts)


def test_float16_inputs_compute_in_float32():
    ts = leaves([(1, 2, 50, 32), (1, 2, 70, 32), (1, 2, 70, 32)], torch.float16, seed=1)
    twins = f64_twins(ts)
    do = torch.randn(1, 2, 50, 32, generator=torch.Generator().manual_seed(2), dtype=F64)
    o = tt.attention(*ts)
    assert o.dtype == torch.float16
    errs = max_errs(ts, o, twins, ref_f64(*twins), do)
    # one float16 rounding of O and of each gradient (2^-11 relative, values
    # of magnitude < 4 here) on float32 results
    assert all(e <= 4 * 2 ** -11 for e in errs.values()), errs
    assert all(t.grad.dtype == torch.float16 for t in ts)


def test_float64_needs_precision_and_bf16_rounds():
    ts = leaves([(1, 2, 6, 16)] * 3, F64, seed=4)
    with pytest.raises(TypeError, match='precision="f32"'):
        tt.attention(*ts)
    o = tt.attention(*ts, precision="f32")
    assert o.dtype == F64
    assert float((o - ref_f64(*ts)).detach().abs().max()) < 1e-5
    t32 = [t.detach().float() for t in ts]
    err_bf16 = float((tt.attention(*t32, precision="bf16").double() - ref_f64(*ts))
                     .detach().abs().max())
    assert 1e-4 < err_bf16 < 2e-2        # bf16-accurate, and really rounded
    with pytest.raises(ValueError, match="precision"):
        tt.attention(*t32, precision="f64")
    with pytest.raises(TypeError, match="one dtype"):
        tt.attention(t32[0], t32[1].to(torch.bfloat16), t32[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,masked", [(False, False), (True, True)])
def test_dropout_matches_reference_with_the_kernels_keep_flags(dtype, causal, masked):
    B, H, Hkv, qL, kL, D, p = 2, 4, 2, 33, 70, 32, 0.3
    ts = leaves([(B, H, qL, D), (B, Hkv, kL, D), (B, Hkv, kL, D)], dtype, seed=9)
    twins = f64_twins(ts)
    mask = None
    if masked:
        mask = torch.randn(qL, kL, generator=torch.Generator().manual_seed(5), dtype=F64)
        mask = mask.to(dtype).requires_grad_(True)
    do = torch.randn(B, H, qL, D, generator=torch.Generator().manual_seed(6), dtype=F64)
    torch.manual_seed(1234)
    o = tt.attention(*ts, mask=mask, causal=causal, dropout_p=p)
    torch.manual_seed(1234)
    keep = tt._dropout_keep(p, tt._dropout_seed(p), B, H, qL, kL)
    m64 = None if mask is None else mask.detach().to(F64).requires_grad_(True)
    o64 = ref_f64(*twins, mask=m64, causal=causal, keep=keep, p=p)
    errs = max_errs(ts, o, twins, o64, do)
    if masked:
        errs["dmask"] = float((mask.grad.to(F64) - m64.grad).abs().max())
    bound = 1e-5 if dtype == torch.float32 else 4e-2    # bf16: one rounding of inputs' results
    assert all(e <= bound for e in errs.values()), errs
    # the same generator state repeats the call; another one differs
    torch.manual_seed(1234)
    assert torch.equal(tt.attention(*ts, mask=mask, causal=causal, dropout_p=p), o)
    torch.manual_seed(99)
    assert not torch.equal(tt.attention(*ts, mask=mask, causal=causal, dropout_p=p), o)


def test_dropout_fraction_kept_and_p_zero():
    p, n = 0.2, 4 * 8 * 64 * 64
    torch.manual_seed(0)
    keep = tt._dropout_keep(p, tt._dropout_seed(p), 4, 8, 64, 64)
    kept = int(keep.sum())
    assert abs(kept - (1 - p) * n) <= 6 * math.sqrt(n * p * (1 - p))
    q, k, v = leaves([(1, 2, 9, 16)] * 3, torch.float32, seed=3)
    assert torch.equal(tt.attention(q, k, v, dropout_p=0.0), tt.attention(q, k, v))
    for bad in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="dropout_p"):
            tt.scaled_dot_product_attention(q, k, v, dropout_p=bad)


def test_module_dropout_only_in_training():
    m = tt.MultiHeadAttention(32, 4, 2, dropout=0.5, dtype=torch.float32)
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(2)
    assert not torch.equal(a, m(x))
    assert "dropout=0.5" in repr(m.attn)
