"""What the step's ops keep for the backward under CPU bf16 autocast with
float32 master weights: tilegrad.torch.linear / Linear (no bf16 weight
copies kept, one input cast shared), glu_linear and linear_cross_entropy
with float32 weights (cast inside, gradients float32, the fused loss's dW
handed to .grad without a copy), and a patched model's saved tensors.

Each comparison with F.linear under autocast is bitwise: tt.linear calls the
same GEMMs on the same bf16 values in the same layouts (dx = g W, dW = g^T x
on the flattened gradient, as F.linear's autograd), so nothing is rounded
differently. What is kept is read off torch.autograd.graph.saved_tensors_hooks
(every tensor a graph saves passes its pack hook), so no memory timing.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402

F = torch.nn.functional
pytestmark = [pytest.mark.usefixtures("float32_default_dtype"),
              pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS,
                                 reason="torch >= 2.4: older torch runs F.linear itself")]


class _Saved:
    """The tensors a graph saves while this is entered: (dtype, shape, data_ptr)."""

    def __enter__(self):
        self.rows = []

        def pack(t):
            self.rows.append((t.dtype, tuple(t.shape), t.data_ptr()))
            return t
        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    def bf16(self):
        return [r for r in self.rows if r[0] == torch.bfloat16]


def _leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _three_projections(f, x0, ws, bs):
    """q, k, v style: three layers reading one input under autocast -> the
    outputs, then every gradient of a fixed weighted sum of them."""
    leaves = [x0] + ws + [b for b in bs if b is not None]
    for t in leaves:
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = x0 * 1.5                          # a float32 activation, as a norm's output
        outs = [f(x, w, b) for w, b in zip(ws, bs)]
    weights = [torch.linspace(-1, 1, o.numel()).reshape(o.shape) for o in outs]
    sum((o.float() * c).sum() for o, c in zip(outs, weights)).backward()
    return [o.detach() for o in outs] + [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("shape,bias", [((2, 37, 64), True), ((2, 37, 64), False),
                                        ((37, 64), True), ((1, 5, 3, 64), False)])
def test_linear_is_f_linear_under_autocast_bitwise(shape, bias):
    x0, *ws = _leaves(shape, (48, 64), (16, 64), (16, 64), seed=1)
    bs = _leaves((48,), (16,), (16,), seed=2) if bias else [None] * 3
    want = _three_projections(F.linear, x0, ws, bs)
    got = _three_projections(tt.linear, x0, ws, bs)
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_linear_keeps_no_weight_copy_and_shares_the_input_cast():
    x0, *ws = _leaves((2, 37, 64), (48, 64), (16, 64), (16, 64), seed=3)
    with _Saved() as ref:
        _three_projections(F.linear, x0, ws, [None] * 3)
    with _Saved() as got:
        _three_projections(tt.linear, x0, ws, [None] * 3)
    # (autograd may save a weight transposed and an input flattened)
    w_shapes = {tuple(sorted(w.shape)) for w in ws}
    kept = lambda s: {tuple(sorted(r[1])) for r in s.bf16()}  # noqa: E731
    assert kept(ref) >= w_shapes                 # autocast keeps the bf16 weights
    assert not kept(got) & w_shapes              # tt.linear keeps none
    inputs = lambda s: {r[2] for r in s.bf16() if r[1] in ((2, 37, 64), (74, 64))}  # noqa: E731
    assert len(inputs(ref)) == 3 and len(inputs(got)) == 1


def test_linear_casts_again_after_an_in_place_change_and_outside_autocast():
    x0, w1, w2 = _leaves((5, 32), (8, 32), (8, 32), seed=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = x0 * 1.0
        a = tt.linear(x, w1)
        x.add_(1.0)                         # the shared cast is stale now
        b = tt.linear(x, w2)
        want = F.linear(x0.detach() + 1.0, w2.detach())
    assert torch.equal(b.detach(), want)
    (a.float().sum() + b.float().sum()).backward()
    assert w1.grad.dtype == torch.float32
    assert torch.equal(tt.linear(x0, w1), F.linear(x0, w1))      # no autocast: F.linear


def test_linear_module_in_place():
    m = torch.nn.Linear(64, 16)
    ref = copy.deepcopy(m)
    m.__class__ = tt.Linear
    assert isinstance(m, torch.nn.Linear) and m.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(3, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(m(x), ref(x))
    assert isinstance(copy.deepcopy(m), tt.Linear)


def test_glu_linear_master_weights_bitwise():
    """float32 down weight under autocast: cast inside, not kept; the same
    bits as before (the weight cast outside) and float32 gradients."""
    gate, up = _leaves((2, 9, 64), (2, 9, 64), seed=5)
    w, b = _leaves((32, 64), (32,), seed=6)

    def step(keep_master):
        for t in (gate, up, w, b):
            t.grad = None
        with _Saved() as saved, torch.autocast("cpu", dtype=torch.bfloat16):
            if keep_master:
                out = tt.glu_linear(gate, up, w, b)
            else:
                out = tt.glu_linear(gate, up, w.to(torch.bfloat16), b.to(torch.bfloat16))
        out.float().square().sum().backward()
        return saved, [out.detach()] + [t.grad.clone() for t in (gate, up, w, b)]
    ref_saved, want = step(False)
    got_saved, got = step(True)
    for a, c in zip(got, want):
        assert a.dtype == c.dtype and torch.equal(a, c)
    kept = lambda s: {(r[0], tuple(sorted(r[1]))) for r in s.rows}  # noqa: E731
    assert (torch.bfloat16, (32, 64)) in kept(ref_saved)
    assert (torch.bfloat16, (32, 64)) not in kept(got_saved)


def test_fused_loss_hands_its_weight_gradient_over():
    """bf16 hidden, float32 weight: dW summed and returned in float32 and
    put into weight.grad as it is (no [V, H] copy); with a loss scaled after
    the op, the gradient is scaled (a new tensor)."""
    h, w = _leaves((2, 40, 32), (300, 32), seed=7)
    y = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(8))
    with _Saved() as saved, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tt.linear_cross_entropy(h, w, y, chunk_size=16)
    dw_ptrs = {r[2] for r in saved.rows if r[1] == (300, 32)}
    assert len(dw_ptrs) == 1
    loss.backward()
    assert w.grad.dtype == torch.float32 and w.grad.data_ptr() in dw_ptrs
    first = w.grad.clone()
    w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tt.linear_cross_entropy(h.detach().to(torch.bfloat16), w, y, chunk_size=16)
    (loss * 3.0).backward()                  # the master path without autocast's cast of h
    assert torch.equal(w.grad, first * 3.0)


def test_patched_model_keeps_no_bf16_weight():
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers >= 5")
    import tilegrad.transformers as tgt
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="tilegrad")
    ids = torch.randint(1, 96, (1, 21))
    done = tgt.use_tilegrad_kernels(model)
    assert done["linear"] == 2 * 7 + 1           # q, k, v, o, gate, up, down a layer; lm_head
    w_shapes = {tuple(sorted(p.shape)) for p in model.parameters() if p.dim() == 2}
    with _Saved() as saved, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert not {tuple(sorted(r[1])) for r in saved.bf16()} & w_shapes
