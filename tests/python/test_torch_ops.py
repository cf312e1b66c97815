"""tilegrad.torch's custom ops (PyTorch >= 2.4): torch.library.opcheck on each
op, torch.compile(fullgraph=True) of a small transformer block with zero graph
breaks matching eager, torch.export of it, and "no copies": the kernels read
contiguous and strided [B, H, L, D] inputs in place.

Skipped on PyTorch < 2.4 (no torch.library.custom_op; the front then runs on
autograd Functions, tested by test_torch_wrappers.py)."""
import copy
import math

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402
import tilegrad._torch_paths as paths  # noqa: E402
from conftest import bf16_randn as bf  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float32_default_dtype"),
              pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS,
                                 reason=f"torch {torch.__version__} < 2.4: no custom ops")]



# ---------------------------------------------------------------------------
# opcheck

def _attn_cases():
    B, H, Hkv, qL, kL, D = 2, 4, 2, 9, 13, 16
    q, k, v = bf(B, H, qL, D, seed=1, rg=True), bf(B, Hkv, kL, D, seed=2, rg=True), \
        bf(B, Hkv, kL, D, seed=3, rg=True)
    qs = bf(B, qL, H, D, seed=4).transpose(1, 2).requires_grad_(True)   # strided BLHD view
    mask = torch.zeros(1, H, qL, kL, dtype=torch.bfloat16)
    mask[..., 3] = -math.inf
    mrow = bf(qL, 1, seed=5).reshape(1, 1, qL, 1).requires_grad_(True)  # broadcast over keys
    sc = 1 / math.sqrt(D)
    f32 = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    seed = torch.tensor(12345, dtype=torch.int64)
    # (q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads, det,
    #  attn_precision: 0 exact, 1 split, 2 bf16)
    return [
        (q, k, v, None, False, sc, 1.0, kL - qL, 0.0, None, 1, True, 0),
        (qs, k, v, mask, True, sc, 1.0, kL - qL, 0.0, None, 2, True, 2),
        (q, k, v, mrow, False, sc, 30.0, 0, 0.0, None, 1, True, 1),
        (q.detach(), k.detach(), v.detach(), None, True, 0.5, 1.0, 0, 0.0, None, 1, False, 0),
        (*f32, mask.float(), True, sc, 1.0, kL - qL, 0.0, None, 2, True, 2),  # float32 kernels
        (*f32, None, False, sc, 1.0, 0, 0.25, seed, 2, True, 1),              # dropout
    ]


@pytest.mark.parametrize("i", range(6))
def test_opcheck_attn_fwd(i):
    args = _attn_cases()[i]
    torch.library.opcheck(torch.ops.tilegrad.attn_fwd.default, args)


def test_opcheck_attn_bwd():
    # bf16 with a mask (attn_precision bf16), bf16 softcap (split), float32 with dropout
    for case in (1, 2, 5):
        q, k, v, mask, causal, sc, cap, off, p, seed, th, det, ap = _attn_cases()[case]
        q, k, v = q.detach(), k.detach(), v.detach()
        mask = None if mask is None else mask.detach()
        o, lse = torch.ops.tilegrad.attn_fwd(q, k, v, mask, causal, sc, cap, off, p, seed, th,
                                             det, ap)
        do = bf(*o.shape, seed=9).to(q.dtype)
        torch.library.opcheck(torch.ops.tilegrad.attn_bwd.default,
                              (do, q, k, v, o, lse, mask, causal, sc, cap, off, p, seed, th,
                               det, ap))


def test_opcheck_rms_norm():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 24, generator=g).requires_grad_(True)
    w = torch.randn(24, generator=g).requires_grad_(True)
    torch.library.opcheck(torch.ops.tilegrad.rms_norm_fwd.default, (x, w, 1e-5, 0, True))
    y, r = torch.ops.tilegrad.rms_norm_fwd(x.detach(), w.detach(), 1e-5, 0, True)
    torch.library.opcheck(torch.ops.tilegrad.rms_norm_bwd.default,
                          (torch.randn(3, 5, 24, generator=g), x.detach(), w.detach(), r,
                           0, True))


# ---------------------------------------------------------------------------
# no copies: the kernels read the caller's memory (strided views by strides)

def test_inputs_are_read_in_place(monkeypatch):
    """The pointers the C forward gets are the tensors' own data_ptr()s,
    for contiguous q/k/v and for [B, L, H, D] storage seen as [B, H, L, D]."""
    seen = []
    real = tt._ptr
    monkeypatch.setattr(tt, "_ptr", lambda t: (seen.append(t.data_ptr()), real(t))[1])
    q, k, v = bf(1, 2, 8, 16), bf(1, 2, 8, 16, seed=1), bf(1, 2, 8, 16, seed=2)
    tt.attention(q, k, v)
    assert seen[:3] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    seen.clear()
    x = bf(1, 8, 2, 16, seed=3)
    qv = x.transpose(1, 2)                      # strides (256, 16, 32, 1): not contiguous
    tt.attention(qv, k, v)
    assert seen[0] == x.data_ptr()


# ---------------------------------------------------------------------------
# torch.compile / torch.export of a transformer block

class Block(torch.nn.Module):
    def __init__(self, dim=32, heads=4, kv_heads=2, attn_precision="exact"):
        super().__init__()
        self.norm1 = tt.RMSNorm(dim, eps=1e-5)
        self.attn = tt.MultiHeadAttention(dim, heads, kv_heads, causal=True,
                                          precision="bf16", attn_precision=attn_precision,
                                          deterministic=True)
        self.norm2 = tt.RMSNorm(dim, eps=1e-5)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _block_and_input(attn_precision="exact"):
    torch.manual_seed(0)
    return Block(attn_precision=attn_precision), torch.randn(2, 12, 32, requires_grad=True)


@pytest.mark.parametrize("attn_precision", ["exact", "bf16"])
def test_compile_fullgraph_zero_graph_breaks_matches_eager(attn_precision):
    import torch._dynamo as dynamo
    model, x = _block_and_input(attn_precision)
    dynamo.reset()
    exp = dynamo.explain(model)(x)
    assert exp.graph_break_count == 0, exp.break_reasons
    assert exp.graph_count == 1

    y_eager = model(x)
    gx_eager, *gp_eager = torch.autograd.grad(y_eager.square().sum(),
                                              [x] + list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    gx, *gp = torch.autograd.grad(y.square().sum(), [x] + list(model.parameters()))
    # the same kernels run in the same order (deterministic mode): the same bits
    assert torch.equal(y, y_eager)
    assert torch.equal(gx, gx_eager)
    for a, b in zip(gp, gp_eager):
        assert torch.equal(a, b)
    if attn_precision != "exact":
        # the mode reached the kernels through the graph: the block on exact
        # products gives other bits (bf16 mode rounds P and dS on every table)
        exact, _ = _block_and_input("exact")
        assert not torch.equal(exact(x), y)


def test_compile_attention_attn_precision_bf16():
    """attention(..., attn_precision="bf16") alone under
    torch.compile(fullgraph=True): one graph, the eager bits, and a mode
    change between calls is honoured (the compiled graph bakes in the
    constant; a recompile for the other mode, not a stale context)."""
    import torch._dynamo as dynamo

    def f(q, k, v, ap):
        return tt.attention(q, k, v, causal=True, attn_precision=ap, deterministic=True)

    q, k, v = bf(1, 2, 24, 16, seed=1), bf(1, 2, 24, 16, seed=2), bf(1, 2, 24, 16, seed=3)
    dynamo.reset()
    exp = dynamo.explain(f)(q, k, v, "bf16")
    assert exp.graph_break_count == 0, exp.break_reasons
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    y = compiled(*leaves, "bf16")
    y.float().square().sum().backward()
    eager = [t.detach().requires_grad_(True) for t in (q, k, v)]
    y_eager = f(*eager, "bf16")
    y_eager.float().square().sum().backward()
    assert torch.equal(y, y_eager)
    for a, b in zip(leaves, eager):
        assert torch.equal(a.grad, b.grad)
    assert torch.equal(compiled(q, k, v, "exact"), f(q, k, v, "exact"))
    assert not torch.equal(compiled(q, k, v, "exact"), y.detach())


def test_compile_inductor_fullgraph_matches_eager():
    """The default backend (Inductor) compiles the block too; its fused
    torch ops may round differently from eager: compared to 1e-4."""
    model, x = _block_and_input()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    try:
        y = compiled(x)
    except Exception as e:   # no C++ compiler for Inductor on this machine
        if "compiler" in str(e).lower() or "cpp" in str(e).lower():
            pytest.skip(f"Inductor unavailable: {type(e).__name__}")
        raise
    y_eager = model(x)
    assert float((y - y_eager).detach().abs().max()) < 1e-4
    y.square().sum().backward()


def test_export_block():
    model, x = _block_and_input()
    ep = torch.export.export(model, (x.detach(),))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "tilegrad.attn_fwd.default" in targets and "tilegrad.rms_norm_fwd.default" in targets
    assert torch.equal(ep.module()(x.detach()), model(x.detach()))


def test_block_pickles_and_deepcopies(tmp_path):
    model, x = _block_and_input()
    y = model(x)
    m2 = copy.deepcopy(model)
    assert torch.equal(m2(x), y)
    path = tmp_path / "block.pt"
    torch.save(model, path)
    m3 = torch.load(path, weights_only=False)
    assert torch.equal(m3(x), y)


def test_ops_check_their_dtypes():
    q = bf(1, 1, 4, 8)
    with pytest.raises(TypeError, match="attn_fwd: q must be torch.bfloat16 or torch.float32"):
        torch.ops.tilegrad.attn_fwd(q.double(), q, q, None, False, 1.0, 1.0, 0, 0.0, None, 0,
                                    False, 0)
    with pytest.raises(TypeError, match="attn_fwd: k must be torch.float32"):
        torch.ops.tilegrad.attn_fwd(q.float(), q, q, None, False, 1.0, 1.0, 0, 0.0, None, 0,
                                    False, 0)
    with pytest.raises(TypeError, match="rms_norm_fwd: x must be torch.float32"):
        torch.ops.tilegrad.rms_norm_fwd(q.double(), torch.ones(8), 1e-5, 0, False)

    # shapes the C kernels cannot see are checked on every call (no reads
    # outside a tensor through a direct op call)
    k1 = bf(2, 1, 4, 8)
    with pytest.raises(ValueError, match="attn_fwd: q .* and k .* disagree"):
        torch.ops.tilegrad.attn_fwd(q, k1, k1, None, False, 1.0, 1.0, 0, 0.0, None, 0, False, 0)
    o, lse = torch.ops.tilegrad.attn_fwd(q, q, q, None, False, 1.0, 1.0, 0, 0.0, None, 0, False,
                                         0)
    with pytest.raises(ValueError, match="attn_bwd: do must have shape"):
        torch.ops.tilegrad.attn_bwd(bf(1, 1, 5, 8), q, q, q, o, lse, None, False, 1.0, 1.0, 0,
                                    0.0, None, 0, False, 0)
    with pytest.raises(ValueError, match="needs seed"):
        torch.ops.tilegrad.attn_fwd(q, q, q, None, False, 1.0, 1.0, 0, 0.5, None, 0, False, 0)
    # attn_precision is a tg_attn_precision value, checked before the kernels
    for bad in (3, -1):
        with pytest.raises(ValueError, match=r"attn_fwd: attn_precision must be 0 \(exact\)"):
            torch.ops.tilegrad.attn_fwd(q, q, q, None, False, 1.0, 1.0, 0, 0.0, None, 0, False,
                                        bad)
        with pytest.raises(ValueError, match="attn_bwd: attn_precision"):
            torch.ops.tilegrad.attn_bwd(q, q, q, q, o, lse, None, False, 1.0, 1.0, 0, 0.0, None,
                                        0, False, bad)
    with pytest.raises(ValueError, match="rms_norm_fwd: x .* and weight"):
        torch.ops.tilegrad.rms_norm_fwd(torch.ones(3, 8), torch.ones(9), 1e-5, 0, False)


def test_cpu_autocast_casts_the_inputs():
    """Under CPU bf16 autocast, float32 q, k beside a bf16 v (what a rotary
    step gives under autocast) are cast to bf16 as autocast casts SDPA's
    inputs: the same bits as bf16 inputs, gradients in the inputs' dtypes."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 19, 16, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 19, 16, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 19, 16, generator=g).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = tt.attention(q, k, v, causal=True)
    ref = tt.attention(q.detach().bfloat16(), k.detach().bfloat16(), v.detach(), causal=True)
    assert o.dtype == torch.bfloat16 and torch.equal(o, ref)
    o.float().sum().backward()
    assert q.grad.dtype == torch.float32 and v.grad.dtype == torch.bfloat16


# ---------------------------------------------------------------------------
# eager calls skip the dispatcher (tt._direct); traced and fake ones do not

def _attn_outputs(monkeypatch, direct, **kw):
    """attention's output and q, k, v, mask, sinks gradients through the
    direct path or through the custom op (tt._direct forced off); dropout's
    seed drawn after torch.manual_seed(5)."""
    monkeypatch.setattr(paths, "_CAN_GO_DIRECT", direct)
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, qL, kL, D = 2, 4, 2, 13, 21, 16
    q, k, v, mask, do = (torch.randn(s, generator=g).bfloat16() for s in
                         ((B, H, qL, D), (B, Hkv, kL, D), (B, Hkv, kL, D), (1, H, qL, kL),
                          (B, H, qL, D)))
    sinks = torch.nn.Parameter(torch.randn(H, generator=g))
    ins = [t.requires_grad_(True) for t in (q, k, v, mask)] + [sinks]
    torch.manual_seed(5)
    o = tt.attention(q, k, v, mask, causal=True, sinks=sinks, deterministic=True, **kw)
    o.backward(do)
    return [o.detach()] + [t.grad for t in ins]


@pytest.mark.parametrize("kw", [{}, {"attn_precision": "bf16", "window": 5},
                                {"dropout_p": 0.25, "softcap": 20.0}])
def test_direct_path_matches_the_op_bitwise(monkeypatch, kw):
    """The autograd Function that eager calls take and the custom op run the
    same implementations: the same output and gradients, bit for bit (bf16,
    a mask and sinks that take gradients, dropout drawn from one seed)."""
    direct = _attn_outputs(monkeypatch, True, **kw)
    op = _attn_outputs(monkeypatch, False, **kw)
    for a, b in zip(direct, op):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_direct_path_rms_norm_matches_the_op(monkeypatch):
    out = []
    for direct in (True, False):
        monkeypatch.setattr(paths, "_CAN_GO_DIRECT", direct)
        x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(2), requires_grad=True)
        w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 24))
        y = tt.rms_norm(x, w, 1e-5)
        y.square().sum().backward()
        out.append((y.detach(), x.grad, w.grad))
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_direct_path_taken_only_in_plain_eager(monkeypatch):
    """Plain eager calls (tensors and Parameters, grad or no grad) skip the
    dispatcher; fake tensors, torch_function and torch_dispatch modes,
    compile and functorch transforms reach the custom op (the Function
    raises here if they did not)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    if None in (paths._IS_COMPILING, paths._IS_TRACING, paths._FUNCTION_MODE,
                paths._DISPATCH_MODES, paths._FUNCTORCH_LEVEL):
        pytest.skip(f"torch {torch.__version__} lacks a check of tt._direct: custom ops only")
    monkeypatch.setattr(paths, "_CAN_GO_DIRECT", True)   # (TG_TORCH_VIA_OPS=1 turns it off)
    q = bf(1, 2, 8, 16)
    assert tt._direct(q, torch.nn.Parameter(q.float()), None)
    calls = []
    real_apply, real_impl = tt._AttnFunction.apply, tt._attn_fwd_impl
    monkeypatch.setattr(tt._AttnFunction, "apply",
                        lambda *a: (calls.append("Function"), real_apply(*a))[1])
    monkeypatch.setattr(tt, "_attn_fwd_impl",
                        lambda *a: (calls.append("impl"), real_impl(*a))[1])
    qg = q.clone().requires_grad_(True)
    ref = tt.attention(qg, q, q)                 # a graph: the Function (then its impl)
    with torch.no_grad():
        tt.attention(qg, q, q)                   # none: the implementation alone
    tt.attention(q, q, q)
    assert calls == ["Function", "impl", "impl", "impl"]

    def refuse(*a):
        raise AssertionError("the direct path ran under a mode or transform")
    # (the op's registered implementation is the original function object)
    monkeypatch.setattr(tt._AttnFunction, "apply", refuse)
    monkeypatch.setattr(tt, "_attn_fwd_impl", refuse)
    with FakeTensorMode():
        x = torch.empty(1, 2, 8, 16, dtype=torch.bfloat16)
        assert tt.attention(x, x, x).shape == (1, 2, 8, 16)
    with torch.device("cpu"):                       # a torch_function mode
        tt.attention(q, q, q)
    with FlopCounterMode(display=False):            # a torch_dispatch mode
        tt.attention(q, q, q)
    compiled = torch.compile(lambda a: tt.attention(a, a, a), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(q), ref)
    with pytest.raises(RuntimeError, match="setup_context"):  # functorch: the op's message
        torch.func.grad(lambda a: tt.attention(a, a, a).float().sum())(q)
