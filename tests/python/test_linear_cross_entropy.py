"""tilegrad.torch.linear_cross_entropy / causal_lm_loss (python/tilegrad/_torch_lce.py)
against the unfused loss: F.linear + F.cross_entropy(logits.float()) and
transformers' ForCausalLMLoss.

Tolerances (u = 2^-24):
* float64: the chunk's loss is computed in float64 torch ops, so the fused
  and unfused results differ only by float64 reassociation (chunked sums):
  rtol 1e-10 / atol 1e-12, and torch.autograd.gradcheck on a small case.
* float32 (against the float64 loss of the same float32 inputs): a logit is
  an f32 dot product of H terms and dh a sum over V terms; the worst-case
  rounding of the longest sum, gamma_K with K = H + V, plus a few roundings
  around it, times the largest magnitude of the result:
  atol = 4 (H + V) u max|ref|.
* bf16 (autocast, or bf16 tensors): per-element bounds (_bf16_bounds),
  with w = 2^-8 the bf16 unit roundoff (a rounding moves x by <= w |x|;
  two paths that round nearly equal f32 values may land one spacing, 2 w,
  apart), checked against the float64 loss of the same bf16-rounded inputs
  (the fused path's own roundings) and against the unfused loss in the same
  dtype (both paths' roundings). The logits z = h W^T + b are bf16 GEMM
  outputs: within w |z| + H u A of the exact ones (A = |h| |W|^T + |b|,
  the f32 sums), 2 w |z| + 2 H u A between the two paths. The unfused
  softcap c tanh(z / c) runs in bf16: three roundings more, w |z| + 2 w
  |c tanh(z / c)|. A softmax whose logits move by at most d_t = max_i dz_ti
  moves each p by a factor within e^(+-2 d_t): |dp| <= p (e^(2 d_t) - 1);
  the softcap's factor s = 1 - tanh^2 moves by 0.77 dz / c at most (max
  |d tanh^2 / dx| = 0.7698). The logit gradient g is rounded to bf16 once
  on the fused path, once more on the unfused (five more with the
  softcap's bf16 backward). Each gradient is a sum of g times a bf16
  operand (dW = g^T h, dh = g W, db = sum_t g): it moves by sum |dg|
  |operand| and by its outputs' roundings, bounded by the sum of |g|
  |operand| (the fused path's dW: its chunks' bf16 partials and the final
  rounding; one more rounding on the unfused path). The loss moves by at
  most 2 d_t per token (lse and the label's logit).
  Both paths' GEMMs are torch's: torch 1.13 accumulated bf16 GEMMs in bf16
  on a 2-core AMD EPYC without a bf16 unit (g^T h off by 0.016 sum |g| |h|,
  8 times one rounding; torch 2.9.1 there: 0.0017), so no rounding bound
  holds for either path and the bf16 cases run on torch >= 2.
"""
import math

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import torch.nn.functional as F  # noqa: E402

import tilegrad.torch as tt  # noqa: E402
from tilegrad import kernels as tk  # noqa: E402

U = 2.0 ** -24


def _data(N, H, V, dtype, seed, ignore_frac=0.25, scale=1.0, batch=None):
    g = torch.Generator().manual_seed(seed)
    lead = (N,) if batch is None else (batch, N)
    h = (torch.randn(*lead, H, generator=g, dtype=torch.float64) * scale).to(dtype)
    w = (torch.randn(V, H, generator=g, dtype=torch.float64) / math.sqrt(H)).to(dtype)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    y = torch.randint(0, V, lead, generator=g)
    y[torch.rand(lead, generator=g) < ignore_frac] = -100
    return h, w, b, y


def _unfused(h, w, y, b=None, eps=0.0, cap=None, reduction="mean", num_items=None):
    z = F.linear(h, w, b)
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    z = z.float() if z.dtype == torch.bfloat16 else z
    V = w.shape[0]
    red = "sum" if num_items is not None else reduction
    loss = F.cross_entropy(z.reshape(-1, V), y.reshape(-1), label_smoothing=eps, reduction=red)
    return loss / num_items if num_items is not None else loss


def _grads(loss, ts):
    ts = [t for t in ts if t is not None and t.requires_grad]
    return torch.autograd.grad(loss, ts)


def _leaf(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


CASES = [  # (N, H, V, chunk, eps, cap, bias, batch)
    (37, 24, 1500, 8, 0.0, None, False, None),     # tail chunk of 5
    (37, 24, 1500, 64, 0.2, None, True, None),     # T smaller than a chunk
    (20, 16, 333, 1, 0.1, 7.0, True, 3),           # one token per chunk, [B, T, H]
    (50, 32, 2100, 16, 0.0, 30.0, False, 2),       # softcap, ragged vocab chunks
    (9, 8, 5, None, 0.5, None, True, None),        # tiny vocab, auto chunk
]


@pytest.mark.parametrize("case", CASES)
def test_float64_matches_unfused(case):
    N, H, V, chunk, eps, cap, bias, batch = case
    h, w, b, y = _data(N, H, V, torch.float64, seed=N + V, batch=batch)
    b = b if bias else None
    h1, w1, b1 = _leaf(h, w, b)
    h2, w2, b2 = _leaf(h, w, b)
    got = tt.linear_cross_entropy(h1, w1, y, b1, label_smoothing=eps, softcap=cap,
                                  chunk_size=chunk)
    want = _unfused(h2, w2, y, b2, eps, cap)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, c in zip(_grads(got, (h1, w1, b1)), _grads(want, (h2, w2, b2))):
        assert a.dtype == c.dtype and a.shape == c.shape
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_float64_gradcheck():
    h, w, b, y = _data(6, 5, 11, torch.float64, seed=3)
    y[1] = -100

    def f(h, w, b):
        return tt.linear_cross_entropy(h, w, y, b, label_smoothing=0.3, softcap=2.0,
                                       chunk_size=4)
    assert torch.autograd.gradcheck(f, tuple(_leaf(h, w, b)))


def _f32_close(got, ref, H, V):
    ref = ref.detach()
    tol = 4 * (H + V) * U * max(float(ref.abs().max()), 1e-30)
    err = float((got.detach().double() - ref).abs().max())
    assert err <= tol, (err, tol)


@pytest.mark.parametrize("case", CASES)
def test_float32_matches_float64(case):
    N, H, V, chunk, eps, cap, bias, batch = case
    h, w, b, y = _data(N, H, V, torch.float32, seed=2 * N + V, batch=batch)
    b = b if bias else None
    h1, w1, b1 = _leaf(h, w, b)
    h2, w2, b2 = _leaf(*(None if t is None else t.double() for t in (h, w, b)))
    got = tt.linear_cross_entropy(h1, w1, y, b1, label_smoothing=eps, softcap=cap,
                                  chunk_size=chunk)
    want = _unfused(h2, w2, y, b2, eps, cap)
    assert got.dtype == torch.float32
    _f32_close(got, want, H, V)
    for a, c, t in zip(_grads(got, (h1, w1, b1)), _grads(want, (h2, w2, b2)), (h1, w1, b1)):
        assert a.dtype == torch.float32 and a.shape == t.shape
        _f32_close(a, c, H, V)


def _bf16_bounds(h, w, b, y, cap, against):
    """(loss bound, [dh, dW, db bounds]) of the fused loss in bf16 against
    "f64" (the float64 loss of the bf16-rounded inputs) or "unfused" (the
    unfused loss in bf16), elementwise: the module docstring's derivation."""
    W = 2.0 ** -8
    two = against == "unfused"
    paths = 2 if two else 1                           # the paths whose roundings count
    hd = h.reshape(-1, h.shape[-1]).to(torch.bfloat16).double()
    wd = w.to(torch.bfloat16).double()
    bd = None if b is None else b.to(torch.bfloat16).double()
    yy = y.reshape(-1)
    keep = yy != -100
    d = float(keep.sum())
    z = F.linear(hd, wd, bd)
    A = F.linear(hd.abs(), wd.abs(), None if bd is None else bd.abs())
    dz = paths * (W * z.abs() + hd.shape[1] * U * A)
    if cap is None:
        zeta, s, ds, dzeta, r = z, torch.ones_like(z), torch.zeros_like(z), dz, paths * W
    else:
        t = torch.tanh(z / cap)
        zeta, s, ds = cap * t, 1 - t * t, 0.77 * dz / cap
        dzeta = dz + (W * z.abs() + 2 * W * zeta.abs() if two else 4 * U * zeta.abs())
        r = 7 * W if two else W
    p = torch.softmax(zeta, dim=1)
    onehot = torch.zeros_like(p)
    onehot[keep, yy[keep]] = 1.0
    delta = dzeta.max(dim=1, keepdim=True).values
    g = (s * (p - onehot)).abs() / d
    dg = (s * p * torch.expm1(2 * delta) + ds * (p - onehot).abs()) / d
    dg = dg + r * (g + dg)
    ga = (g + dg) * keep[:, None]                     # ignored tokens: no gradient
    dg = dg * keep[:, None]
    dh = dg @ wd.abs() + paths * W * ga @ wd.abs()
    dW = dg.t() @ hd.abs() + (paths + 1) * W * ga.t() @ hd.abs()   # + the fused chunks' partials
    db = dg.sum(0) + paths * W * ga.sum(0)
    loss = float((2 * delta.squeeze(1) * keep).sum()) / d + 4 * U
    return loss, [dh.reshape(h.shape), dW, db]


def _f64_bf16(h, w, b, y, cap):
    """The float64 loss and gradients of the bf16-rounded inputs."""
    ins = _leaf(*(None if t is None else t.to(torch.bfloat16).double() for t in (h, w, b)))
    loss = _unfused(ins[0], ins[1], y, ins[2], cap=cap)
    return loss, _grads(loss, ins)


_BF16_GEMMS = pytest.mark.skipif(
    int(torch.__version__.split(".")[0]) < 2,
    reason="torch < 2 may accumulate bf16 GEMMs in bf16 (the module docstring)")


def _within(got, want, bound, what):
    err = (got.detach().double() - want.detach().double()).abs()
    bad = err > bound
    assert not bool(bad.any()), (what, float(err.max()), float((err / bound).max()))


def _check_bf16(got, got_grads, dtype, h, w, b, y, cap, unfused):
    """got and its gradients (of dtype) against the float64 reference and
    against the unfused loss and its gradients."""
    names = ("dh", "dW", "db")
    ref, ref_grads = _f64_bf16(h, w, b, y, cap)
    for against, want, want_grads in (("f64", ref, ref_grads), ("unfused",) + unfused):
        loss_bound, bounds = _bf16_bounds(h, w, b, y, cap, against)
        assert abs(float(got.detach()) - float(want.detach())) <= loss_bound, against
        for a, c, bound, name in zip(got_grads, want_grads, bounds, names):
            assert a.dtype == dtype
            _within(a, c, bound, f"{name} against {against}")


@_BF16_GEMMS
@pytest.mark.parametrize("cap", [None, 15.0])
def test_bf16_autocast_matches_unfused(cap):
    """float32 parameters, bf16 autocast: hidden, weight and bias go to bf16
    for the GEMMs as F.linear's; gradients come back float32 (the inputs')."""
    N, H, V = 70, 64, 3000
    h, w, b, y = _data(N, H, V, torch.float32, seed=11, scale=2.0, batch=2)
    h1, w1, b1 = _leaf(h, w, b)
    h2, w2, b2 = _leaf(h, w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = tt.linear_cross_entropy(h1, w1, y, b1, softcap=cap, chunk_size=32)
        want = _unfused(h2, w2, y, b2, cap=cap)
    assert got.dtype == want.dtype == torch.float32
    _check_bf16(got, _grads(got, (h1, w1, b1)), torch.float32, h, w, b, y, cap,
                (want, _grads(want, (h2, w2, b2))))


@_BF16_GEMMS
def test_bf16_inputs_explicit():
    """bf16 tensors without autocast: the loss float32, gradients bf16."""
    h, w, _, y = _data(40, 32, 700, torch.bfloat16, seed=12)
    h1, w1 = _leaf(h, w)
    h2, w2 = _leaf(h, w)
    got = tt.linear_cross_entropy(h1, w1, y, chunk_size=16)
    want = _unfused(h2, w2, y)
    assert got.dtype == torch.float32
    _check_bf16(got, _grads(got, (h1, w1)), torch.bfloat16, h, w, None, y, None,
                (want, _grads(want, (h2, w2))))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_num_items_in_batch(dtype):
    h, w, b, y = _data(30, 16, 400, dtype, seed=13)
    for n in (57, torch.tensor(57), 12.5):
        h1, w1 = _leaf(h, w)
        h2, w2 = _leaf(h, w)
        got = tt.linear_cross_entropy(h1, w1, y, num_items_in_batch=n, chunk_size=7)
        want = _unfused(h2, w2, y, num_items=n)
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-6)
        for a, c in zip(_grads(got, (h1, w1)), _grads(want, (h2, w2))):
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-7)


def test_reduction_sum():
    h, w, b, y = _data(30, 16, 400, torch.float64, seed=14)
    h1, w1 = _leaf(h, w)
    h2, w2 = _leaf(h, w)
    got = tt.linear_cross_entropy(h1, w1, y, reduction="sum", label_smoothing=0.1,
                                  chunk_size=8)
    want = _unfused(h2, w2, y, eps=0.1, reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, c in zip(_grads(got, (h1, w1)), _grads(want, (h2, w2))):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_all_ignored(dtype):
    """As torch: mean -> nan, sum -> 0, sum / num_items -> 0; zero gradients."""
    h, w, b, _ = _data(12, 8, 50, dtype, seed=15)
    y = torch.full((12,), -100)
    for kw, want in (({}, math.nan), ({"reduction": "sum"}, 0.0),
                     ({"num_items_in_batch": 4}, 0.0)):
        h1, w1, b1 = _leaf(h, w, b)
        got = tt.linear_cross_entropy(h1, w1, y, b1, chunk_size=5, **kw)
        ref = _unfused(*_leaf(h, w), y, _leaf(b)[0], num_items=kw.get("num_items_in_batch"),
                       reduction=kw.get("reduction", "mean"))
        gv, rv = float(got.detach()), float(ref.detach())
        assert (math.isnan(gv) and math.isnan(rv)) or gv == rv
        assert (math.isnan(want) and math.isnan(gv)) or gv == want
        for gr in _grads(got, (h1, w1, b1)):
            assert not gr.any()


def test_ignore_index_other_value_and_chunk_of_ignored():
    """A custom ignore_index (a valid class id: that class is ignored, as
    torch) and a whole chunk of ignored labels."""
    h, w, b, y = _data(24, 8, 60, torch.float64, seed=16, ignore_frac=0.0)
    y[:8] = 5
    y[10] = 5
    h1, w1 = _leaf(h, w)
    h2, w2 = _leaf(h, w)
    got = tt.linear_cross_entropy(h1, w1, y, ignore_index=5, chunk_size=8)
    want = F.cross_entropy(F.linear(h2, w2), y, ignore_index=5)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, c in zip(_grads(got, (h1, w1)), _grads(want, (h2, w2))):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tied_embeddings(dtype):
    """The LM head is the embedding's weight: its gradient gets both paths."""
    V, H, T = 300, 16, 25
    g = torch.Generator().manual_seed(17)
    emb = torch.randn(V, H, generator=g, dtype=dtype)
    ids = torch.randint(0, V, (2, T), generator=g)
    labels = torch.randint(0, V, (2, T), generator=g)

    def run(fused):
        e = emb.clone().requires_grad_(True)
        hid = torch.tanh(F.embedding(ids, e))
        if fused:
            loss = tt.causal_lm_loss(hid, e, labels, chunk_size=9)
        elif dtype == torch.float32:     # HF's loss (it upcasts to float32)
            loss = _hf_loss(F.linear(hid, e), labels, V)
        else:                            # its shift, in float64
            shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
            loss = _unfused(hid, e, shifted)
        return loss, torch.autograd.grad(loss, e)[0]
    (a, ga), (b, gb) = run(True), run(False)
    if dtype == torch.float64:
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)
    else:       # both float32: each within the f32 bound of the exact value
        _f32_close(a.detach(), b.detach().double(), H, V + 2 * T)
        _f32_close(ga, gb.double(), H, V + 2 * T)


def _hf_loss(logits, labels, V, **kw):
    tl = pytest.importorskip("transformers.loss.loss_utils")
    return tl.ForCausalLMLoss(logits, labels, V, **kw)


@pytest.mark.parametrize("kw", [{}, {"num_items_in_batch": 31}, {"shift": True},
                                {"softcap": 4.0}])
def test_causal_lm_loss_matches_hf(kw):
    """float32 (HF's ForCausalLMLoss upcasts the logits to float32, so a
    float64 comparison would be against float32 anyway)."""
    V, H = 250, 12
    h, w, b, y = _data(17, H, V, torch.float32, seed=18, batch=2)
    h1, w1, b1 = _leaf(h, w, b)
    h2, w2, b2 = _leaf(h, w, b)
    shift = None
    if kw.get("shift"):
        shift = torch.roll(y, -1, dims=-1)
    n = kw.get("num_items_in_batch")
    cap = kw.get("softcap")
    got = tt.causal_lm_loss(h1, w1, y, b1, num_items_in_batch=n, shift_labels=shift,
                            softcap=cap, chunk_size=6)
    z = F.linear(h2, w2, b2)
    if cap:
        z = cap * torch.tanh(z / cap)
    want = _hf_loss(z, y, V, num_items_in_batch=n, shift_labels=shift)
    _f32_close(got.detach(), want.detach().double(), H, V)
    for a, c in zip(_grads(got, (h1, w1, b1)), _grads(want, (h2, w2, b2))):
        _f32_close(a, c.double(), H, V)


@pytest.mark.parametrize("which", ["hidden", "weight", "bias", "none"])
def test_requires_grad_subsets(which):
    h, w, b, y = _data(20, 8, 90, torch.float32, seed=19)
    ts = {"hidden": h.clone(), "weight": w.clone(), "bias": b.clone()}
    if which != "none":
        ts[which].requires_grad_(True)
    loss = tt.linear_cross_entropy(ts["hidden"], ts["weight"], y, ts["bias"], chunk_size=6)
    ref = _unfused(h.double(), w.double(), y, b.double())
    _f32_close(loss.detach(), ref, 8, 90)
    if which == "none":
        assert not loss.requires_grad
        return
    (gr,) = torch.autograd.grad(loss, ts[which])
    hd, wd, bd = _leaf(h.double(), w.double(), b.double())
    want = torch.autograd.grad(_unfused(hd, wd, y, bd), {"hidden": hd, "weight": wd,
                                                          "bias": bd}[which])[0]
    _f32_close(gr, want, 8, 90)


def test_backward_scales_by_grad_output():
    h, w, b, y = _data(10, 8, 40, torch.float64, seed=20)
    h1, w1 = _leaf(h, w)
    h2, w2 = _leaf(h, w)
    (3.5 * tt.linear_cross_entropy(h1, w1, y, chunk_size=3)).backward()
    (3.5 * _unfused(h2, w2, y)).backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)


def test_no_grad_and_chunking_bits():
    """Under no_grad the loss alone; the loss is the same whatever the
    thread count (the kernel's sums are ordered)."""
    h, w, b, y = _data(64, 16, 500, torch.float32, seed=21)
    with torch.no_grad():
        a = tt.linear_cross_entropy(h, w, y, chunk_size=16, threads=1)
        c = tt.linear_cross_entropy(h, w, y, chunk_size=16, threads=2)
    assert torch.equal(a, c)


def test_bad_input_refused_by_name():
    h, w, b, y = _data(10, 8, 40, torch.float32, seed=22)
    lce = tt.linear_cross_entropy
    with pytest.raises(ValueError, match="hidden"):
        lce(h[:, :7], w, y)
    with pytest.raises(ValueError, match="labels must have shape"):
        lce(h, w, y[:9])
    with pytest.raises(ValueError, match="weight must be"):
        lce(h, w[0], y)
    with pytest.raises(ValueError, match="bias"):
        lce(h, w, y, b[:5])
    with pytest.raises(TypeError, match="labels must be integers"):
        lce(h, w, y.float())
    bad = y.clone()
    bad[4] = 40
    with pytest.raises(ValueError, match=r"labels\[4\] = 40"):
        lce(h, w, bad)
    bad[4] = -1
    with pytest.raises(ValueError, match=r"labels\[4\] = -1"):
        lce(h, w, bad)
    with pytest.raises(NotImplementedError, match="reduction='none'"):
        lce(h, w, y, reduction="none")
    with pytest.raises(ValueError, match="reduction"):
        lce(h, w, y, reduction="avg")
    with pytest.raises(ValueError, match="num_items_in_batch"):
        lce(h, w, y, reduction="sum", num_items_in_batch=3)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        lce(h, w, y, num_items_in_batch=0)
    with pytest.raises(ValueError, match="label_smoothing"):
        lce(h, w, y, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap"):
        lce(h, w, y, softcap=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        lce(h, w, y, chunk_size=0)
    with pytest.raises(TypeError, match="one dtype"):
        lce(h, w.double(), y)
    with pytest.raises(ValueError, match="CPU"):
        lce(h.to("meta"), w, y)


def test_numpy_binding_matches_torch():
    """tilegrad.kernels.cross_entropy_fwd_bwd_ex (the C kernel) on a strided
    float32 view and on bf16 in place."""
    np = pytest.importorskip("numpy")
    g = torch.Generator().manual_seed(23)
    z = torch.randn(9, 2050, generator=g) * 4
    y = torch.randint(0, 2050, (9,), generator=g)
    y[2] = -100
    full = torch.zeros(9, 2060)
    full[:, :2050] = z
    loss, grad = tk.cross_entropy_fwd_bwd_ex(full.numpy()[:, :2050], y.numpy(),
                                             label_smoothing=0.1, grad_scale=2.0)
    zd = z.double().requires_grad_(True)
    ref = 2.0 * F.cross_entropy(zd, y, label_smoothing=0.1)
    (gref,) = torch.autograd.grad(ref, zd)
    assert abs(loss - float(ref) / 2.0) <= 1e-5 * abs(float(ref))
    assert np.abs(grad - gref.numpy()).max() <= 1e-6
    bits = (z.to(torch.bfloat16).view(torch.int16).numpy()).view(np.uint16).copy()
    l16, g16 = tk.cross_entropy_fwd_bwd_ex(bits, y.numpy(), grad=bits)
    assert g16 is bits and math.isfinite(l16)


# ---------------------------------------------------------------------------
# custom op: opcheck, compile without graph breaks

needs_ops = pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS, reason="torch.library.custom_op "
                               "needs PyTorch >= 2.4")


@needs_ops
def test_opcheck():
    h, w, b, y = _data(13, 8, 70, torch.float32, seed=24)
    op = torch.ops.tilegrad.linear_cross_entropy_fwd.default
    for args in ((h.requires_grad_(True), w.requires_grad_(True), y, b, None, -100, False,
                  0.1, 0.0, 4, True, True, True, 0),
                 (h.double(), w.double(), y, None, torch.tensor(9.0), -100, False, 0.0, 3.0,
                  5, True, False, False, 0)):
        torch.library.opcheck(op, args)


@needs_ops
def test_compile_fullgraph_matches_eager():
    h, w, b, y = _data(2 * 19, 16, 300, torch.float32, seed=25)
    h = h.reshape(2, 19, 16)
    y = y.reshape(2, 19)

    def step(h, w, b):
        return tt.causal_lm_loss(torch.tanh(h), w, y, b, softcap=10.0, chunk_size=8,
                                 num_items_in_batch=torch.tensor(20))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    h1, w1, b1 = _leaf(h, w, b)
    h2, w2, b2 = _leaf(h, w, b)
    a = compiled(h1, w1, b1)
    c = step(h2, w2, b2)
    assert not counters["graph_break"]
    torch.testing.assert_close(a, c, rtol=0, atol=0)
    for x, z in zip(torch.autograd.grad(a, (h1, w1, b1)), torch.autograd.grad(c, (h2, w2, b2))):
        torch.testing.assert_close(x, z, rtol=0, atol=0)
