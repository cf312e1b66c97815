"""The training step's other kernels through torch and transformers:
tilegrad.torch.rope / apply_rotary_pos_emb / swiglu / geglu / glu_linear against float64
references and autograd, and tilegrad.transformers.use_tilegrad_kernels on
tiny configs of each family it knows (2 layers, hidden 64, 4 query over 2
kv heads, vocab 96, batch 2 x 37 tokens) against the same model unpatched.

Tolerances.
* The ops against float64 (float32 in and out): each output is a sum of two
  products (RoPE) or a product with sigmoid / tanh (the GLUs), computed in
  float32: a few float32 roundings, a few u = 2^-24 relative to the terms;
  the GLUs' exp has ~2 ulp (docs/KERNELS.md). Stated: |a - b| <= 1e-6 *
  (|b| + max|b| * 2^-10) elementwise-ish, checked as max |a - b| <= 2e-6 *
  max |b|. bfloat16 outputs: the float32 value rounded once, so within half
  a bf16 ulp (2^-9 relative) plus that: max |a - b| <= 2^-8 * |b| per
  element, with a floor of 2^-8 * max|b| * 2^-8 for values near 0.
* Models, float32: the patched and unpatched models compute the same math
  with other roundings (RoPE's sums fused, the GLU in one pass, the loss's
  log-sum-exp in chunks): as test_transformers.py's float32 bound, max
  |a - b| <= 1e-4 * max |b| per tensor (loss, every gradient).
* Models, bf16 autocast: the unpatched GLU rounds silu(gate) to bf16 before
  the product, the fused one rounds once; the dW of the fused loss is summed
  over token chunks in float32 (the unfused one is one bf16 GEMM). A bf16
  rounding that falls differently moves an activation by one bf16 ulp
  (2^-8) and spreads through the layers: as test_transformers.py's bf16
  bound, the loss within 2^-6 relative and all gradients together within
  2^-4 norm-wise.
"""
import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float32_default_dtype")]

F64_RTOL = 2e-6


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _max_rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _norm_rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _bf16_close(a, b):
    """a (bf16 output) within half a bf16 ulp of b (float64) plus float32 noise."""
    a, b = a.detach().double(), b.detach().double()
    bound = 2.0 ** -8 * b.abs() + 2.0 ** -16 * b.abs().max()
    return bool(((a - b).abs() <= bound).all())


# ---------------------------------------------------------------------------
# RoPE

def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope_ref(x, cos, sin, interleaved=False):
    """float64 reference: x [B, H, L, D], cos/sin [B or 1, L, R]."""
    x, cos, sin = x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    R = cos.shape[-1]
    rot, rest = x[..., :R], x[..., R:]
    if interleaved:
        pairs = torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)
        y = rot * cos + pairs * sin
    else:
        y = rot * cos + _rotate_half(rot) * sin
    return torch.cat((y, rest), dim=-1)


def _tables(B, L, R, seed, dtype=torch.float32, llama3=False):
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(L, dtype=torch.float64)[None, :, None] + torch.randint(
        0, 50, (B, 1, 1), generator=g).double()
    inv = 10000.0 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    ang = pos * inv
    if llama3:                  # halves that differ, as a scaled table may
        emb = torch.cat((ang, ang * 0.5), dim=-1)
    else:
        emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("B,H,L,D,R", [(2, 3, 37, 64, 64), (1, 4, 5, 80, 32), (2, 2, 9, 8, 8),
                                       (1, 2, 17, 136, 136)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_float64_and_autograd(B, H, L, D, R, interleaved):
    g = torch.Generator().manual_seed(B * 1000 + D + R)
    # q as transformers passes it: a [B, H, L, D] view of [B, L, H, D] storage
    x = torch.randn(B, L, H, D, generator=g).transpose(1, 2).requires_grad_(True)
    cos, sin = _tables(B, L, R, seed=D, llama3=True)
    y = tt.rope(x, cos, sin, interleaved=interleaved)
    ref = _rope_ref(x, cos, sin, interleaved)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert _max_rel(y, ref) <= F64_RTOL
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_(True)
    _rope_ref(x64, cos, sin, interleaved).backward(dy.double())
    assert _max_rel(x.grad, x64.grad) <= F64_RTOL


def test_rope_dtypes_and_layouts():
    g = torch.Generator().manual_seed(7)
    B, H, L, D = 2, 3, 11, 32
    cos, sin = _tables(1, L, D, seed=3)
    xb = torch.randn(B, H, L, D, generator=g).bfloat16()
    # bf16 x with float32 tables -> float32 (torch's promotion, as transformers' q * cos)
    y = tt.rope(xb, cos, sin)
    assert y.dtype == torch.float32 and _max_rel(y, _rope_ref(xb, cos, sin)) <= F64_RTOL
    # bf16 x and tables -> bf16, rounded once
    yb = tt.rope(xb, cos.bfloat16(), sin.bfloat16())
    assert yb.dtype == torch.bfloat16
    assert _bf16_close(yb, _rope_ref(xb, cos.bfloat16(), sin.bfloat16()))
    # unsqueeze_dim=2: x [B, L, H, D]
    x2 = torch.randn(B, L, H, D, generator=g)
    y2 = tt.rope(x2, cos, sin, unsqueeze_dim=2)
    assert y2.shape == x2.shape
    assert _max_rel(y2, _rope_ref(x2.transpose(1, 2), cos, sin).transpose(1, 2)) <= F64_RTOL
    # apply_rotary_pos_emb: transformers' signature, q and k
    q, k = torch.randn(B, H, L, D, generator=g), torch.randn(B, 1, L, D, generator=g)
    qe, ke = tt.apply_rotary_pos_emb(q, k, cos, sin)
    assert _max_rel(qe, _rope_ref(q, cos, sin)) <= F64_RTOL
    assert _max_rel(ke, _rope_ref(k, cos, sin)) <= F64_RTOL


@pytest.mark.parametrize("case, match", [
    (lambda x, c, s: tt.rope(x[..., :7], c[..., :7], s[..., :7]), "even"),
    (lambda x, c, s: tt.rope(x, c[:, :3], s[:, :3]), "L ="),
    (lambda x, c, s: tt.rope(x.double(), c, s), "float32 or bfloat16"),
    (lambda x, c, s: tt.rope(x, c.requires_grad_(True), s), "requires grad"),
    (lambda x, c, s: tt.rope(x, c, s, unsqueeze_dim=3), "unsqueeze_dim"),
    (lambda x, c, s: tt.rope(x[0], c, s), r"\[B, H, L, D\]"),
])
def test_rope_refusals(case, match):
    x = torch.randn(2, 2, 5, 8)
    c, s = _tables(1, 5, 8, seed=1)
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=match):
        case(x, c, s)


# ---------------------------------------------------------------------------
# SwiGLU / GeGLU

def _glu_ref(kind, gate, up):
    g, u = gate.double(), up.double()
    act = torch.nn.functional.silu(g) if kind == "swiglu" else \
        torch.nn.functional.gelu(g, approximate="tanh")
    return act * u


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
@pytest.mark.parametrize("shape", [(2, 37, 50), (3, 17), (1,)])
def test_glu_matches_float64_and_autograd(kind, shape):
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    gate = (torch.randn(shape, generator=g) * 4).requires_grad_(True)
    up = torch.randn(shape, generator=g).requires_grad_(True)
    f = getattr(tt, kind)
    y = f(gate, up)
    assert y.dtype == torch.float32 and _max_rel(y, _glu_ref(kind, gate, up)) <= F64_RTOL
    dy = torch.randn(shape, generator=g)
    y.backward(dy)
    g64, u64 = gate.detach().double().requires_grad_(True), up.detach().double().requires_grad_(True)
    _glu_ref(kind, g64, u64).backward(dy.double())
    assert _max_rel(gate.grad, g64.grad) <= F64_RTOL
    assert _max_rel(up.grad, u64.grad) <= F64_RTOL


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_glu_bf16_and_fused_views(kind):
    g = torch.Generator().manual_seed(11)
    # Phi-3's gate_up_proj output: gate and up are the two halves of one buffer
    gate_up = torch.randn(2, 13, 2 * 40, generator=g).bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    y = getattr(tt, kind)(gate, up)
    assert y.dtype == torch.bfloat16 and y.shape == gate.shape
    assert _bf16_close(y, _glu_ref(kind, gate, up))
    # large |gate| does not overflow; NaN reaches only its element
    big = torch.tensor([-100.0, -88.0, 0.0, 88.0, 100.0, float("nan")])
    out = getattr(tt, kind)(big, torch.ones(6))
    assert torch.isnan(out[5]) and torch.isfinite(out[:5]).all()
    assert _max_rel(out[:5], _glu_ref(kind, big[:5], torch.ones(5))) <= F64_RTOL


def test_glu_refusals():
    with pytest.raises(ValueError, match="one shape"):
        tt.swiglu(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        tt.geglu(torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_glu_linear_matches_float64_and_autograd(kind, bias):
    """F.linear(glu(gate, up), W, b) with the product formed again in the
    backward: float32 against float64 (the bound above on each output: the
    GLU's few roundings, then a float32 GEMM of K = 50 terms: 50 u more of
    the absolute sums, inside the stated 2e-6 max|b| at these sizes)."""
    g = torch.Generator().manual_seed(23 + bias)
    gate = (torch.randn(2, 37, 50, generator=g) * 4).requires_grad_(True)
    up = torch.randn(2, 37, 50, generator=g).requires_grad_(True)
    w = (torch.randn(24, 50, generator=g) / 7).requires_grad_(True)
    b = torch.randn(24, generator=g).requires_grad_(True) if bias else None
    act = "silu" if kind == "swiglu" else "gelu_tanh"
    out = tt.glu_linear(gate, up, w, b, act=act)
    leaves64 = [t.detach().double().requires_grad_(True) for t in (gate, up, w) + ((b,) if bias else ())]
    ref = torch.nn.functional.linear(_glu_ref(kind, *leaves64[:2]), *leaves64[2:])
    assert out.dtype == torch.float32 and _max_rel(out, ref) <= F64_RTOL
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    ref.backward(dout.double())
    for t, t64 in zip((gate, up, w) + ((b,) if bias else ()), leaves64):
        assert _max_rel(t.grad, t64.grad) <= F64_RTOL


def test_glu_linear_keeps_no_product_and_matches_unfused_bf16():
    """bf16: the same GEMMs as swiglu then F.linear (same bits here), and the
    backward keeps gate, up and W, not the [rows, cols] product."""
    g = torch.Generator().manual_seed(31)
    gate_up = torch.randn(3, 40, 2 * 64, generator=g).bfloat16()
    w = (torch.randn(32, 64, generator=g) / 8).bfloat16()
    ins = [gate_up.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    ref_ins = [gate_up.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = tt.glu_linear(*ins[0].chunk(2, dim=-1), ins[1])
    assert (3, 40, 64) in saved and (32, 64) in saved, saved
    assert saved.count((3, 40, 64)) == 2, saved          # gate and up, no product
    ref = torch.nn.functional.linear(tt.swiglu(*ref_ins[0].chunk(2, dim=-1)), ref_ins[1])
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    dout = torch.randn(out.shape, generator=g).bfloat16()
    out.backward(dout)
    ref.backward(dout)
    for a, c in zip(ins, ref_ins):
        assert torch.equal(a.grad, c.grad)


def test_glu_linear_nan_reaches_what_it_touches():
    """A NaN gate element: its row of the output and its column of dW are
    NaN, everything else finite."""
    g = torch.Generator().manual_seed(37)
    gate = torch.randn(5, 8, generator=g)
    gate[0, 3] = float("nan")
    gate.requires_grad_(True)
    up = torch.randn(5, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 8, generator=g, requires_grad=True)
    out = tt.glu_linear(gate, up, w)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1:]).all()
    out.backward(torch.ones_like(out))
    assert torch.isnan(w.grad[:, 3]).all()
    assert torch.isfinite(w.grad[:, [0, 1, 2, 4, 5, 6, 7]]).all()
    assert torch.isfinite(gate.grad[1:]).all() and torch.isfinite(up.grad[1:]).all()


def test_glu_linear_refusals():
    with pytest.raises(ValueError, match="weight"):
        tt.glu_linear(torch.randn(3, 4), torch.randn(3, 4), torch.randn(5, 3))
    with pytest.raises(ValueError, match="bias"):
        tt.glu_linear(torch.randn(3, 4), torch.randn(3, 4), torch.randn(5, 4), torch.randn(4))
    with pytest.raises(ValueError, match="act"):
        tt.glu_linear(torch.randn(3, 4), torch.randn(3, 4), torch.randn(5, 4), act="relu")
    with pytest.raises(TypeError, match="one dtype"):
        tt.glu_linear(torch.randn(3, 4), torch.randn(3, 4), torch.randn(5, 4).bfloat16())


def test_ops_compile_without_graph_breaks():
    if not tt.HAVE_CUSTOM_OPS:
        pytest.skip(f"torch {torch.__version__} < 2.4: no custom ops")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 7, 16, generator=g, requires_grad=True)
    gate, up = torch.randn(7, 24, generator=g, requires_grad=True), torch.randn(7, 24, generator=g)
    cos, sin = _tables(1, 7, 16, seed=2)

    w = torch.randn(5, 24, generator=g, requires_grad=True)

    def f(x, gate, up):
        return (tt.rope(x, cos, sin).sum() + tt.swiglu(gate, up).sum()
                + tt.geglu(gate, up).sum() + tt.glu_linear(gate, up, w).sum())

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, gate, up)
    assert torch.allclose(got, f(x, gate, up))
    for op, args in ((torch.ops.tilegrad.rope_fwd, (x, cos, sin, False, 1, 0)),
                     (torch.ops.tilegrad.glu_fwd, (gate, up, 0, 0)),
                     (torch.ops.tilegrad.glu_linear_fwd, (gate, up, w, None, 0, 0))):
        torch.library.opcheck(op, args)


# ---------------------------------------------------------------------------
# use_tilegrad_kernels on tiny models

transformers = None
if os.environ.get("TG_REQUIRE_TRANSFORMERS") == "1":
    import transformers  # noqa: F811  (a failure here is the point)
else:
    try:
        import transformers  # noqa: F811
        if int(transformers.__version__.split(".")[0]) < 5:
            transformers = None
    except ImportError:
        transformers = None
needs_transformers = pytest.mark.skipif(transformers is None or not tt.HAVE_CUSTOM_OPS,
                                        reason="transformers >= 5 and torch >= 2.4 needed")

B, L, VOCAB = 2, 37, 96


def _configs():
    if transformers is None:
        return {}
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    specs = {
        "llama": ("LlamaConfig", dict(tie_word_embeddings=True)),
        "qwen2": ("Qwen2Config", {}),
        "qwen3": ("Qwen3Config", dict(head_dim=16)),
        "mistral": ("MistralConfig", dict(head_dim=16)),
        "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16,
                                        sliding_window=8, attn_logit_softcapping=2.0,
                                        final_logit_softcapping=3.0)),
        "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=16,
                                            sliding_window=8,
                                            layer_types=["sliding_attention",
                                                         "full_attention"])),
        "phi3": ("Phi3Config", dict(partial_rotary_factor=0.5)),
        "phi": ("PhiConfig", dict(partial_rotary_factor=0.5)),
    }
    out = {}
    for family, (cls_name, extra) in specs.items():
        cls = getattr(transformers, cls_name, None)
        if cls is not None:
            out[family] = cls(**{**common, **extra})
    return out


CONFIGS = _configs()
FAMILIES = sorted(CONFIGS)


def _model(family, seed=0):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = copy.deepcopy(CONFIGS[family])        # a config object of its own
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="tilegrad",
                                            dtype=torch.float32).eval()


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (B, L), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100                # ignored tokens
    return ids, labels


def _step(model, ids, labels, autocast=False, **kw):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return out, out.loss.detach().float(), grads


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_matches_unpatched(family):
    import tilegrad.transformers as tgt
    ids, labels = _batch()
    ref_model, model = _model(family), _model(family)
    _, ref_loss, ref_grads = _step(ref_model, ids, labels)
    done = tgt.use_tilegrad_kernels(model)
    fits = tgt._STEP_FAMILIES[CONFIGS[family].model_type]
    assert set(done) == fits
    assert all(n >= 1 for n in done.values()), done
    assert model.state_dict().keys() == ref_model.state_dict().keys()
    out, loss, grads = _step(model, ids, labels)
    assert out.logits is None                # the fused loss forms no logits
    assert _max_rel(loss, ref_loss) <= 1e-4
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        assert _max_rel(grads[name], g) <= 1e-4, name
    # bf16 autocast: the same within bf16's bound
    _, ref_loss, ref_grads = _step(ref_model, ids, labels, autocast=True)
    _, loss, grads = _step(model, ids, labels, autocast=True)
    assert _max_rel(loss, ref_loss) <= 2.0 ** -6
    names = sorted(ref_grads)
    assert _norm_rel(torch.cat([grads[n].flatten() for n in names]),
                     torch.cat([ref_grads[n].flatten() for n in names])) <= 2.0 ** -4
    # without labels: transformers' own forward, logits as before
    with torch.no_grad():
        assert _max_rel(model(input_ids=ids).logits, ref_model(input_ids=ids).logits) <= 1e-4


@needs_transformers
def test_num_items_in_batch_and_other_models_unaffected(monkeypatch):
    import tilegrad.transformers as tgt
    ids, labels = _batch()
    ref_model, model, other = _model("llama"), _model("llama"), _model("llama")
    tgt.use_tilegrad_kernels(model)
    n = int((labels[:, 1:] != -100).sum()) + 7      # as gradient accumulation passes it
    _, ref_loss, _ = _step(ref_model, ids, labels, num_items_in_batch=n)
    _, loss, _ = _step(model, ids, labels, num_items_in_batch=n)
    assert _max_rel(loss, ref_loss) <= 1e-4
    calls = []
    real = tt.apply_rotary_pos_emb
    monkeypatch.setattr(tt, "apply_rotary_pos_emb",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    _step(other, ids, labels)       # same family, not patched: transformers' RoPE
    assert not calls
    _step(model, ids, labels)
    assert len(calls) == CONFIGS["llama"].num_hidden_layers


@needs_transformers
def test_use_tilegrad_kernels_refusals():
    import tilegrad.transformers as tgt
    model = _model("llama")
    with pytest.raises(NotImplementedError, match="cross_entropy=True"):
        tgt.use_tilegrad_kernels(model, cross_entropy=True)
    tgt.use_tilegrad_kernels(model, rope=False)
    with pytest.raises(RuntimeError, match="has them already"):
        tgt.use_tilegrad_kernels(model)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64))
    assert tgt.use_tilegrad_kernels(bert) == {"linear": 8}  # q, k, v, 3 dense, pooler, classifier
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(NotImplementedError, match="'gpt2'"):
        tgt.use_tilegrad_kernels(gpt2)


@needs_transformers
def test_unpatched_model_of_a_patched_family_compiles():
    """The family's rotary function is patched module-wide; a model of it that
    was not patched still compiles with fullgraph=True (transformers' own
    rotary step under compile)."""
    import tilegrad.transformers as tgt
    ids, labels = _batch()
    tgt.use_tilegrad_kernels(_model("llama"))
    other = _model("llama")
    ref = other(input_ids=ids, labels=labels).loss
    got = torch.compile(lambda: other(input_ids=ids, labels=labels).loss, fullgraph=True,
                        backend="aot_eager")()
    assert _max_rel(got, ref) <= 1e-5
