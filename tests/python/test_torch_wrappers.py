"""tilegrad.torch: the operators (torch.library custom ops on PyTorch >= 2.4,
autograd Functions on 1.13) and the modules against PyTorch autograd of a
float64 reference (CPU; PyTorch 1.13 and 2.x).

Attention (bf16). The wrapper's inputs are bf16 tensors, held exactly by the
float64 reference (plain autograd of softmax(S).V with the same scale,
softcap, GQA, causal rule and mask). The wrapper's results differ from the
reference only by

  * one bf16 rounding of each output: O, and dq/dk/dv (tg_f32_to_bf16_cast):
    2^-8 |ref| (bf16 unit roundoff; RNE);
  * the backward is fed O rounded to bf16 (through D = rowsum(O_bf16 . dO)):
    |dD| <= 2^-8 sum_d |O||dO|, which moves dS = P (dP - D) by P |dD|:
    dq by scale (P |dD|) . |K|, dk by scale (P |dD|)^T . |Q| (summed over the
    query heads of a kv group), dv not at all;
  * f32 arithmetic (and the f32 rounding of L), bounded to first order by
    (n + 64)(1 + |L|max) 2^-24 times the magnitudes of the summed terms,
    n = kL + g qL + D: M_q = scale (P (|dP| + |D|)) . |K|,
    M_k = scale (P (|dP| + |D|))^T . |Q|, M_v = P^T . |dO|, M_o = P . |V|
    (softcap only multiplies dS by 1 - tanh^2 <= 1).

  tolerance = 2^-8 |ref| + SAFETY * (input-perturbation + f32 terms),
  SAFETY = 2, element by element -- the oracle suite's rules
  (tests/python/README.md), with the two bf16 roundings the wrapper adds.

RMSNorm (f32): the oracle's first-order f32 bounds (test_suite_oracle's
`_rms_bounds`) for dx and dw, and (dim + 16) 2^-24 |y| for y.

The model test compares a tiny transformer built from the drop-ins with the
same model on float64 PyTorch attention/RMSNorm (q/k/v rounded to bf16 as the
kernel sees them): loss within 2^-10 relative, every parameter gradient within
2^-6 normwise (4 bf16 units: O and the attention gradients are each rounded
once to bf16, 2^-8 relative per element; measured: 4e-6 and 3e-3) -- then
trains it.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the wrappers need PyTorch (python3-torch)")
import tilegrad as tg  # noqa: E402
import tilegrad.torch as tt  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")

U32 = 2.0 ** -24
UBF = 2.0 ** -8
SAFETY = 2.0
F64 = torch.float64


def bf(shape, gen, std=1.0, requires_grad=True):
    t = (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(torch.bfloat16)
    return t.requires_grad_(requires_grad)


def scale_of(D, mult=1.0):
    return float(np.float32(mult / math.sqrt(D)))     # the params struct holds a float


def ref_attention(Q, K, V, mask, causal, scale, cap, q_off):
    """float64 reference: returns O, P and L = logsumexp(S) for the bounds. mask: None,
    bool (True = attend) or additive float (exact bf16 values)."""
    g = Q.shape[1] // K.shape[1]
    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
    S = scale * (Q @ Kr.transpose(-1, -2))
    if cap is not None and cap != 1.0:
        S = cap * torch.tanh(S / cap)
    qL, kL = S.shape[-2:]
    vis = torch.ones(S.shape, dtype=torch.bool)
    if causal:
        vis = vis & (torch.arange(kL).view(1, kL) <= torch.arange(qL).view(qL, 1) + q_off)
    if mask is not None:
        if mask.dtype == torch.bool:
            vis = vis & mask
        else:
            m = mask.to(F64)
            vis = vis & torch.isfinite(m)
            S = S + torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    Sm = S.masked_fill(~vis, -math.inf)
    P = torch.softmax(Sm, -1)
    return P @ Vr, P, torch.logsumexp(Sm.detach(), -1)


def sum_group(x, g):
    B, H = x.shape[:2]
    return x.reshape(B, H // g, g, *x.shape[2:]).sum(2)


def check(name, got, ref, tol, info):
    got = got.detach().to(F64)
    err = (got - ref).abs()
    bad = ~(err <= tol)
    if bool(bad.any()):
        r = (err / tol).nan_to_num(nan=math.inf)
        w = tuple(int(i) for i in np.unravel_index(int(r.argmax()), tuple(r.shape)))
        raise AssertionError(f"{name}: {int(bad.sum())}/{bad.numel()} outside tolerance; worst "
                             f"{w}: got {got[w].item()!r} ref {ref[w].item()!r} "
                             f"tol {tol[w].item():.3e} | {info}")
    return float((err / tol).max())


ATTN_CASES = [
    # B, H, Hkv, qL, kL, D, causal, mask, softcap, layout, scale_mult
    (1, 2, 2, 17, 17, 16, False, None, None, "bhld", 1.0),
    (2, 4, 2, 23, 40, 32, True, None, None, "blhd", 1.0),
    (2, 4, 1, 33, 19, 8, False, "bool", None, "bhld", 2.0),
    (1, 6, 3, 20, 31, 64, True, "float", 30.0, "blhd", 1.0),
    (2, 2, 1, 9, 70, 24, True, "bool_bcast", 5.0, "bhld", 0.5),
]


@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_grads_vs_float64_autograd(case):
    B, H, Hkv, qL, kL, D, causal, mask_kind, cap, layout, smult = case
    gen = torch.Generator().manual_seed(hash(case) % 2 ** 31)
    if layout == "blhd":       # [B, L, H, D] storage seen as [B, H, L, D]: strided views
        q = bf(((B, qL, H, D)), gen).detach().transpose(1, 2).requires_grad_(True)
        k = bf(((B, kL, Hkv, D)), gen).detach().transpose(1, 2).requires_grad_(True)
    else:
        q, k = bf((B, H, qL, D), gen), bf((B, Hkv, kL, D), gen)
    v = bf((B, Hkv, kL, D), gen)
    mask = None
    if mask_kind in ("bool", "bool_bcast"):
        shape = (B, 1, 1, kL) if mask_kind == "bool_bcast" else (B, H, qL, kL)
        mask = torch.rand(shape, generator=gen) < 0.7
        mask[..., 0] = True                       # no fully masked row here
    elif mask_kind == "float":
        mask = (2 * torch.randn((1, H, qL, kL), generator=gen)).to(torch.bfloat16).float()
        mask[..., 5:9][torch.rand((1, H, qL, 4), generator=gen) < 0.5] = -math.inf
    scale = scale_of(D, smult)
    o = tt.attention(q, k, v, mask=mask, causal=causal, scale=scale, softcap=cap)
    assert o.dtype == torch.bfloat16 and o.shape == (B, H, qL, D)
    dO = bf((B, H, qL, D), gen, requires_grad=False)
    o.backward(dO)

    Q, K, V = (t.detach().to(F64).requires_grad_(True) for t in (q, k, v))
    O, P, L = ref_attention(Q, K, V, mask, causal, scale, cap, kL - qL)
    O.backward(dO.to(F64))
    g = H // Hkv
    with torch.no_grad():
        Kr, Vr = K.abs().repeat_interleave(g, 1), V.abs().repeat_interleave(g, 1)
        dOd = dO.to(F64)
        dP = dOd @ V.repeat_interleave(g, 1).transpose(-1, -2)
        Dx = (O * dOd).sum(-1, keepdim=True)
        P = P.detach()
        Lmax = float(L.abs().max())
        rel = (kL + g * qL + D + 64) * (1 + Lmax) * U32
        Mds = P * (dP.abs() + Dx.abs())
        dD = (UBF + (D + 4) * U32) * (O.abs() * dOd.abs()).sum(-1, keepdim=True)
        tol_o = UBF * O.abs() + SAFETY * rel * (P @ Vr)
        tol_q = UBF * Q.grad.abs() + SAFETY * scale * (((P * dD) + rel * Mds) @ Kr)
        tol_k = UBF * K.grad.abs() + SAFETY * sum_group(
            scale * ((P * dD) + rel * Mds).transpose(-1, -2) @ Q.abs(), g)
        tol_v = UBF * V.grad.abs() + SAFETY * sum_group(rel * P.transpose(-1, -2) @ dOd.abs(), g)
    info = f"case={case}"
    check("O", o, O.detach(), tol_o + 1e-30, info)
    check("dq", q.grad, Q.grad, tol_q + 1e-30, info)
    check("dk", k.grad, K.grad, tol_k + 1e-30, info)
    check("dv", v.grad, V.grad, tol_v + 1e-30, info)
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16


def test_attention_float32_path_is_the_bf16_path():
    """float32 inputs with precision="bf16" are cast to bf16 through autograd:
    with bf16-exact values the output and every gradient equal the bf16
    path's, bitwise."""
    gen = torch.Generator().manual_seed(1)
    qb, kb, vb = bf((2, 4, 11, 16), gen), bf((2, 2, 13, 16), gen), bf((2, 2, 13, 16), gen)
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (qb, kb, vb))
    dO = bf((2, 4, 11, 16), gen, requires_grad=False)
    ob = tt.attention(qb, kb, vb, causal=True)
    ob.backward(dO)
    o32 = tt.attention(q32, k32, v32, causal=True, precision="bf16")
    assert o32.dtype == torch.float32
    o32.backward(dO.float())
    assert torch.equal(o32, ob.float())
    for a, b in ((q32, qb), (k32, kb), (v32, vb)):
        assert a.grad.dtype == torch.float32 and torch.equal(a.grad, b.grad.float())


def test_attention_dead_rows_no_grad_and_partial_grads():
    gen = torch.Generator().manual_seed(2)
    q, k, v = bf((1, 2, 6, 8), gen), bf((1, 2, 5, 8), gen), bf((1, 2, 5, 8), gen)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[2] = False                                   # query row 2 sees no key
    o = tt.attention(q, k, v, mask=mask)
    o.float().sum().backward()
    assert (o[:, :, 2] == 0).all() and (q.grad[:, :, 2] == 0).all()
    assert all(bool(torch.isfinite(t.grad.float()).all()) for t in (q, k, v))
    # causal with qL > kL: the first qL - kL rows see no key (bottom-right)
    o2 = tt.attention(bf((1, 1, 7, 8), gen), k[:, :1], v[:, :1], causal=True)
    assert (o2[0, 0, :2] == 0).all() and (o2[0, 0, 2:] != 0).any()
    # only q requires grad; under no_grad there is no graph
    k2, v2 = k.detach(), v.detach()
    q.grad = None
    tt.attention(q, k2, v2).float().sum().backward()
    assert q.grad is not None and k2.grad is None
    with torch.no_grad():
        assert tt.attention(q, k, v).grad_fn is None


def test_sdpa_dropin_semantics():
    """scaled_dot_product_attention: torch's arguments and semantics (top-left
    causal, enable_gqa, bool/float masks, 3-D inputs)."""
    gen = torch.Generator().manual_seed(3)
    B, H, Hkv, qL, kL, D = 2, 4, 2, 5, 9, 16
    q, k, v = bf((B, H, qL, D), gen), bf((B, Hkv, kL, D), gen), bf((B, Hkv, kL, D), gen)
    o = tt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    Q, K, V = (t.detach().to(F64) for t in (q, k, v))
    O = ref_attention(Q, K, V, None, True, scale_of(D), None, 0)[0]   # top-left: q_off = 0
    assert float((o.detach().to(F64) - O).abs().max()) < 2 ** -6
    o_br = tt.attention(q, k, v, causal=True)                          # bottom-right
    assert not torch.equal(o, o_br)
    with pytest.raises(ValueError, match="enable_gqa"):
        tt.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="not both"):
        tt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(qL, qL, dtype=torch.bool),
                                        is_causal=True)
    m = torch.rand(qL, kL, generator=gen) < 0.6
    m[:, 0] = True
    o3 = tt.scaled_dot_product_attention(q[:, 0], k[:, 0], v[:, 0], attn_mask=m, scale=0.25)
    assert o3.shape == (B, qL, D)
    O3 = ref_attention(Q[:, :1], K[:, :1], V[:, :1], m, False, 0.25, None, 0)[0]
    assert float((o3.detach().to(F64) - O3[:, 0]).abs().max()) < 2 ** -6
    F = torch.nn.functional
    if hasattr(F, "scaled_dot_product_attention"):                    # PyTorch >= 2.0
        want = F.scaled_dot_product_attention(Q[:, :2], K, V, is_causal=True)
        got = tt.scaled_dot_product_attention(q[:, :2], k, v, is_causal=True)
        assert float((got.detach().to(F64) - want).abs().max()) < 2 ** -6


def test_attention_errors():
    gen = torch.Generator().manual_seed(4)
    q, k, v = bf((1, 2, 4, 12), gen), bf((1, 2, 4, 12), gen), bf((1, 2, 4, 12), gen)
    with pytest.raises(tg.UnsupportedError, match="head dim D = 12"):
        tt.attention(q, k, v)
    with pytest.raises(ValueError, match="4-D"):
        tt.attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="floating"):
        tt.attention(*(t.to(torch.int32) for t in (q, k, v)))
    with pytest.raises(TypeError, match="mask"):
        tt.attention(q, k, v, mask=torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(tg.BadParamsError, match="softcapping"):
        tt.attention(bf((1, 1, 4, 8), gen), bf((1, 1, 4, 8), gen), bf((1, 1, 4, 8), gen),
                     softcap=-1.0)


# ---------------------------------------------------------------------------
# RMSNorm

def rms_bounds(x, w, dy, r, dim, rows):
    """test_suite_oracle._rms_bounds (first-order f32 bounds of dx, dw)."""
    U = U32
    R = r.unsqueeze(-1)
    Sabs = (dy * x * w).abs().sum(-1, keepdim=True)
    t1 = (dy * w).abs()
    t2 = x.abs() * Sabs * R * R / dim
    rel_r = (dim + 8) * U
    bdx = R * (t1 * (rel_r + 4 * U) + t2 * (4 * rel_r + (dim + 8) * U))
    bdw = (rows + 8) * U * (dy * x * R).abs().sum(0) + rel_r * (dy * x * R).abs().sum(0)
    return bdx, bdw


@pytest.mark.parametrize("shape,eps", [((3, 5, 40), 1e-5), ((1, 257), 1e-6), ((64, 8), 1e-3)])
def test_rms_norm_grads_vs_float64_autograd(shape, eps):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen, dtype=torch.float32).requires_grad_(True)
    w = torch.randn(shape[-1], generator=gen, dtype=torch.float32).requires_grad_(True)
    dy = torch.randn(shape, generator=gen, dtype=torch.float32)
    eps32 = float(np.float32(eps))
    y = tt.rms_norm(x, w, eps32)
    assert y.dtype == torch.float32
    y.backward(dy)
    X, W = x.detach().to(F64).requires_grad_(True), w.detach().to(F64).requires_grad_(True)
    r = torch.rsqrt((X * X).mean(-1, keepdim=True) + eps32)
    Y = X * r * W
    Y.backward(dy.to(F64))
    dim = shape[-1]
    rows = x.numel() // dim
    X2, dY2 = (t.detach().to(F64).reshape(rows, dim) for t in (x, dy))
    W2 = w.detach().to(F64)
    bdx, bdw = rms_bounds(X2, W2, dY2, r.detach().reshape(rows), dim, rows)
    info = f"shape={shape} eps={eps}"
    check("y", y, Y.detach(), SAFETY * (dim + 16) * U32 * Y.detach().abs() + 1e-30, info)
    check("dx", x.grad, X.grad, (SAFETY * bdx + 1e-30).reshape(shape), info)
    check("dw", w.grad, W.grad, SAFETY * bdw + 1e-30, info)


def test_rms_norm_module_dropin():
    gen = torch.Generator().manual_seed(5)
    m = tt.RMSNorm(24, eps=1e-5, dtype=torch.float32)
    with torch.no_grad():
        m.weight.copy_(torch.randn(24, generator=gen))
    x = torch.randn(2, 3, 24, generator=gen, dtype=torch.float32)
    assert torch.equal(m(x), tt.rms_norm(x, m.weight, 1e-5))
    assert set(m.state_dict()) == {"weight"} and "eps=1e-05" in repr(m)
    # no affine weight; eps=None -> finfo(dtype).eps as torch.nn.RMSNorm
    m2 = tt.RMSNorm([24], elementwise_affine=False)
    assert m2.weight is None and list(m2.parameters()) == []
    ref = x.double() * torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True)
                                   + torch.finfo(torch.float32).eps)
    assert float((m2(x).detach().double() - ref).abs().max()) < 1e-5
    # multi-dim normalized_shape; bf16 input keeps its dtype
    m3 = tt.RMSNorm((3, 8), eps=1e-6, dtype=torch.float32)
    xb = x.reshape(2, 3, 3, 8).to(torch.bfloat16).requires_grad_(True)
    yb = m3(xb)
    assert yb.dtype == torch.bfloat16 and yb.shape == xb.shape
    yb.float().sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and m3.weight.grad.shape == (3, 8)
    if hasattr(torch.nn, "RMSNorm"):                                   # PyTorch >= 2.4
        t = torch.nn.RMSNorm(24, eps=1e-5, dtype=torch.float32)
        with torch.no_grad():
            t.weight.copy_(m.weight)
        assert float((t(x) - m(x)).detach().abs().max()) < 1e-5
    with pytest.raises(ValueError, match="normalized_shape"):
        m(torch.randn(2, 23))


# ---------------------------------------------------------------------------
# a model

class Block(torch.nn.Module):
    """Embedding -> RMSNorm -> causal GQA self-attention (+ residual) ->
    RMSNorm -> vocab projection; `impl` picks tilegrad or the reference."""

    def __init__(self, impl, vocab=50, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim, dtype=torch.float32)
        if impl == "tilegrad":
            self.norm1, self.norm2 = tt.RMSNorm(dim, 1e-5, dtype=torch.float32), \
                tt.RMSNorm(dim, 1e-5, dtype=torch.float32)
            self.attn = tt.MultiHeadAttention(dim, heads, kv_heads, causal=True,
                                              precision="bf16")
        else:
            self.norm1, self.norm2 = RefRMSNorm(dim), RefRMSNorm(dim)
            self.attn = RefMHA(dim, heads, kv_heads)
        self.head = torch.nn.Linear(dim, vocab, bias=False, dtype=torch.float32)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.attn(self.norm1(h))
        return self.head(self.norm2(h))


class RefRMSNorm(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x):
        X = x.to(F64)
        return (X * torch.rsqrt((X * X).mean(-1, keepdim=True) + float(np.float32(1e-5)))
                * self.weight.to(F64)).float()


class RefMHA(tt.MultiHeadAttention):
    """The same projections; the core in float64 on bf16-rounded q/k/v
    (what the kernel sees; the casts are identities for autograd)."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__(dim, heads, kv_heads, causal=True)
        self.to(torch.float32)

        def core(q, k, v, mask=None):
            q, k, v = (t.to(torch.bfloat16).to(F64) for t in (q, k, v))
            return ref_attention(q, k, v, None, True, scale_of(q.shape[-1]), None,
                                 k.shape[2] - q.shape[2])[0].float()
        del self.attn
        self.attn = core


def test_model_training_step_with_dropins():
    torch.manual_seed(0)
    model = Block("tilegrad").to(torch.float32)
    ref = Block("reference").to(torch.float32)
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, 50, (2, 12))
    target = torch.randint(0, 50, (2, 12))
    F = torch.nn.functional

    loss = F.cross_entropy(model(ids).reshape(-1, 50), target.reshape(-1))
    loss.backward()
    rloss = F.cross_entropy(ref(ids).reshape(-1, 50), target.reshape(-1))
    rloss.backward()
    assert abs(loss.item() - rloss.item()) <= 2 ** -10 * abs(rloss.item())
    rp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, gr = p.grad, rp[name].grad
        assert g is not None and bool(torch.isfinite(g).all()), name
        assert float((g - gr).norm()) <= 2 ** -6 * float(gr.norm()) + 1e-6, \
            f"{name}: |g - g_ref| = {float((g - gr).norm()):.3e}, |g_ref| = {float(gr.norm()):.3e}"

    # and it trains: a few Adam steps on one batch lower the loss
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(6):
        opt.zero_grad()
        loss = F.cross_entropy(model(ids).reshape(-1, 50), target.reshape(-1))
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < first - 0.05, (first, loss.item())


def test_inplace_change_after_forward_is_caught():
    """The wrappers save their inputs for autograd: modifying one in place
    before the backward raises, as with PyTorch's own ops."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 16, generator=gen, dtype=torch.float32)
    w = torch.ones(16, dtype=torch.float32, requires_grad=True)
    xl = x.clone().requires_grad_(True)
    h = xl * 1.0
    y = tt.rms_norm(h, w, 1e-5)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="inplace|in-place|modified"):
        y.sum().backward()
    q = bf((1, 1, 4, 8), gen)
    qq = q * 1
    o = tt.attention(qq, qq, qq)
    qq.mul_(2)
    with pytest.raises(RuntimeError, match="inplace|in-place|modified"):
        o.float().sum().backward()


def test_modules_threads_and_deterministic():
    """threads= and deterministic= reach the kernels in forward and backward:
    deterministic results agree bitwise across thread counts; the default
    follows torch.get_num_threads()."""
    torch.manual_seed(7)
    m1 = tt.MultiHeadAttention(16, 2, threads=1, deterministic=True, precision="bf16")
    m3 = tt.MultiHeadAttention(16, 2, threads=3, deterministic=True, precision="bf16")
    m3.load_state_dict(m1.state_dict())
    x = torch.randn(1, 5, 16, dtype=torch.float32, requires_grad=True)
    y1, y3 = m1(x), m3(x)
    assert torch.equal(y1, y3)
    g1 = torch.autograd.grad(y1.sum(), x)[0]
    assert tt._context(1, True).threads == 1
    g3 = torch.autograd.grad(y3.sum(), x)[0]
    assert tt._context(3, True).threads == 3
    assert torch.equal(g1, g3)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        tt.rms_norm(x, None, 1e-5)
        assert tt._context(0, False).threads == 1
    finally:
        torch.set_num_threads(n)
    assert tt._context(0, False).threads == n
    with pytest.raises(ValueError, match="threads"):
        tt.rms_norm(x, None, threads=-1)
