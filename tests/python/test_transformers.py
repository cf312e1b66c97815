"""tilegrad.transformers: the "tilegrad" attention backend of Hugging Face
transformers, on tiny configs (2 layers, hidden 64, 4 query heads over 2 kv
heads, vocab 96, batch 2 x 37 tokens: a tail past every tile) of each family
the installed transformers has among Llama, Qwen2, Qwen3, Mistral, Gemma 2,
Gemma 3, gpt-oss and DeepSeek-V3.

* float32: logits, loss and every parameter gradient against
  attn_implementation="eager" (same weights), with no padding, a left-padded
  and a right-padded batch; sliding-window layers with window 8 < 37,
  Gemma 2's softcap, gpt-oss's sinks (a parameter: its gradient is among
  those compared), DeepSeek-V3's MLA (q/k head dim 24 = 16 nope + 8 rope,
  v head dim 16: V is passed as it is);
* bfloat16 (model in bf16): the same against "sdpa" (eager where sdpa does
  not compute the model: gpt-oss, Gemma 2's softcap);
* the masks reach the kernels natively (no [qL, kL] tensor: a causal flag,
  the window, a [B, 1, 1, kL] padding mask; packed sequences the varlen
  kernels, test_varlen_transformers.py), and match eager;
* torch.compile(fullgraph=True) of forward + loss, then loss.backward(), with
  the "aot_eager" backend: no graph break, the eager gradients;
* dropout in training mode, cached decoding, the RMSNorm swap, the refusals.

The MoE families run their experts with transformers' "batched_mm"
implementation (dense tensor ops: it compiles with fullgraph=True, which
the default "grouped_mm" fallback and "eager", data-dependent, do not).

Tolerances (float32). The two backends compute the same float32 math in
another order: each attention output element is a softmax-weighted sum of
kL <= 37 terms, and a reordered sum of n float32 terms differs by at most
~n u |terms| (u = 2^-24 = 6e-8), i.e. ~2e-6 relative per attention call;
two layers forward and the backward chain a few tens of such steps, so a
difference of ~1e-5 of the tensor's scale is the worst expected. Stated
bound: max |a - b| <= 1e-4 * max |b| per tensor (logits, loss, each
gradient); measured worst (AMD EPYC, AVX2): logits 1.4e-6, loss 8.5e-8,
gradients 4.4e-6 (gpt-oss).

Tolerances (bfloat16). Both backends run the whole model in bf16 (u =
2^-8 relative per rounding), attention with float32 accumulation; where a
bf16 rounding of an activation falls differently the two models diverge by
one bf16 ulp there, and that spreads through the later layers. Stated bound:
max |a - b| <= 2^-4 * max |b| for logits and loss, and norm-wise
||a - b|| <= 2^-4 ||b|| over all gradients together (a few bf16 ulps of the
scale). A single gradient tensor can be a sum with heavy cancellation (a
router bias: both backends ~25% from float32), so per tensor the backend
must be as accurate as the reference against the float32 eager model:
err(tilegrad) <= 2 err(reference) + 2^-7 (norm-wise; max-wise for the
logits). Measured worst (AMD EPYC, AVX2): logits 0.019, all gradients
0.021 against sdpa; gpt-oss against its coarser eager reference: see
BF16_COARSE_REFERENCE.

Skips when transformers (>= 5) is not importable, unless
TG_REQUIRE_TRANSFORMERS=1 (CI's torch 2.9.1 venv), which makes that a
failure."""
import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="the transformers backend needs PyTorch")
if os.environ.get("TG_REQUIRE_TRANSFORMERS") == "1":
    import transformers  # noqa: F401  (a failure here is the point)
else:
    transformers = pytest.importorskip("transformers", minversion="5.0",
                                       reason="transformers >= 5 is not installed")
import tilegrad.torch as tt  # noqa: E402
import tilegrad.transformers as tgt  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float32_default_dtype"),
              pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS,
                                 reason=f"torch {torch.__version__} < 2.4: no custom ops")]

B, L, VOCAB, WINDOW = 2, 37, 96, 8
F32_RTOL = 1e-4
BF16_RTOL, BF16_FLOOR = 2.0 ** -4, 2.0 ** -7


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One thread for torch and the kernels (they follow torch): the tensors
    here are tiny, and on a loaded 2-core machine two threads' handoffs cost
    ~40x the work (1.2 s against 0.03 s per forward + backward)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _configs():
    """family -> a tiny config of it (only the families this transformers has)."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    specs = {
        "llama": ("LlamaConfig", {}),
        "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1)),
        "qwen3": ("Qwen3Config", dict(head_dim=16, use_sliding_window=True,
                                      sliding_window=WINDOW, max_window_layers=1)),
        "mistral": ("MistralConfig", dict(head_dim=16, sliding_window=WINDOW)),
        "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16,
                                        sliding_window=WINDOW, attn_logit_softcapping=2.0,
                                        final_logit_softcapping=30.0)),
        "gemma3": ("Gemma3TextConfig", dict(head_dim=16, query_pre_attn_scalar=16,
                                            sliding_window=WINDOW,
                                            layer_types=["sliding_attention",
                                                         "full_attention"])),
        "gpt_oss": ("GptOssConfig", dict(head_dim=16, intermediate_size=64,
                                         num_local_experts=4, num_experts_per_tok=2,
                                         sliding_window=WINDOW,
                                         layer_types=["sliding_attention",
                                                      "full_attention"])),
        "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, q_lora_rank=32,
                                                 kv_lora_rank=32, qk_nope_head_dim=16,
                                                 qk_rope_head_dim=8, v_head_dim=16,
                                                 n_routed_experts=4, num_experts_per_tok=2,
                                                 n_group=1, topk_group=1,
                                                 first_k_dense_replace=1,
                                                 moe_intermediate_size=32,
                                                 n_shared_experts=1)),
    }
    out = {}
    for family, (cls_name, extra) in specs.items():
        cls = getattr(transformers, cls_name, None)
        if cls is not None:
            out[family] = cls(**{**common, **extra})
    return out


CONFIGS = _configs()
FAMILIES = sorted(CONFIGS)
SLIDING = {"qwen2", "qwen3", "mistral", "gemma2", "gemma3", "gpt_oss"}


def _model(family, attn, dtype=torch.float32, seed=0, experts="batched_mm", **config_changes):
    """A fresh model of `family` with `attn` (and the MoE families' experts
    `experts`); the same weights for one seed."""
    cfg = copy.deepcopy(CONFIGS[family])
    for k, v in config_changes.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                             experts_implementation=experts,
                                             dtype=torch.float32)
    return model.to(dtype).eval()


def _batch(padding, seed=1):
    """ids [B, L], the 2-D attention mask (None without padding) and labels
    (-100 on padding and on the tokens predicted from a padding position:
    a left-padded query sees no key, which the backends answer differently,
    0 against eager's mean of V; no real token depends on it)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (B, L), generator=g)
    if padding == "none":
        return ids, None, ids.clone()
    am = torch.ones(B, L, dtype=torch.long)
    for b, n in enumerate((3, 9)):           # pad 3 and 9 tokens
        if padding == "left":
            am[b, :n] = 0
        else:
            am[b, L - n:] = 0
    ids = ids.masked_fill(am == 0, 0)
    labels = ids.masked_fill(am == 0, -100)
    labels[:, 1:].masked_fill_(am[:, :-1] == 0, -100)   # predicted from a padding position
    return ids, am, labels


def _run(model, ids, am, labels):
    """-> (logits at real tokens, loss, {param name: grad})."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=am, labels=labels)
    out.loss.backward()
    keep = torch.ones(B, L, dtype=torch.bool) if am is None else am.bool()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return out.logits.detach().float()[keep], out.loss.detach().float(), grads


def _max_rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _norm_rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class _AttentionSpy:
    """Records what every tt.attention call of the backend receives."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = tt.attention

        def spy(q, k, v, mask=None, causal=False, **kw):
            self.calls.append(dict(q=tuple(q.shape), v=tuple(v.shape), causal=causal,
                                   mask=None if mask is None else tuple(mask.shape), **kw))
            return real(q, k, v, mask=mask, causal=causal, **kw)
        monkeypatch.setattr(tgt.tt, "attention", spy)


# ---------------------------------------------------------------------------
# float32 against eager

@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("family", FAMILIES)
def test_float32_matches_eager(family, padding, monkeypatch):
    spy = _AttentionSpy(monkeypatch)
    ids, am, labels = _batch(padding)
    got = _run(_model(family, "tilegrad"), ids, am, labels)
    ref = _run(_model(family, "eager"), ids, am, labels)
    assert _max_rel(got[0], ref[0]) <= F32_RTOL, "logits"
    assert _max_rel(got[1], ref[1]) <= F32_RTOL, "loss"
    assert got[2].keys() == ref[2].keys() and len(ref[2]) == len(
        list(_model(family, "eager").parameters()))
    for name, g in ref[2].items():
        assert _max_rel(got[2][name], g) <= F32_RTOL, name

    # natively: no [qL, kL] mask, the window on sliding layers, the variants
    assert len(spy.calls) == 2
    for c in spy.calls:
        assert c["causal"] is True
        assert c["mask"] == (None if padding == "none" else (B, 1, 1, L))
    windows = [c["window"] for c in spy.calls]
    assert any(w == WINDOW for w in windows) == (family in SLIDING)
    if family == "gemma2":
        assert all(c["softcap"] == 2.0 for c in spy.calls)
    if family == "gpt_oss":
        assert all(c["sinks"] is not None for c in spy.calls)
        assert all(ref[2][f"model.layers.{i}.self_attn.sinks"].abs().max() > 0
                   for i in range(2))
    if family == "deepseek_v3":          # MLA: D = 16 + 8, Dv = 16
        assert all(c["q"][-1] == 24 and c["v"][-1] == 16 for c in spy.calls)


def test_variants_change_the_result():
    """The tiny configs exercise what they claim: a window of 8 < 37 tokens,
    Gemma 2's softcap and gpt-oss's sinks each move the eager logits."""
    ids, am, labels = _batch("none")

    def logits(family, **changes):
        return _model(family, "eager", **changes)(input_ids=ids).logits
    base = logits("mistral")
    assert _max_rel(logits("mistral", sliding_window=None), base) > 1e-2
    if "gemma2" in CONFIGS:
        assert _max_rel(logits("gemma2", attn_logit_softcapping=None), logits("gemma2")) > 1e-2
    if "gpt_oss" in CONFIGS:
        m = _model("gpt_oss", "eager")
        base = m(input_ids=ids).logits
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.sinks.fill_(-1e4)
        assert _max_rel(m(input_ids=ids).logits, base) > 1e-2


# ---------------------------------------------------------------------------
# bfloat16 against sdpa

#: the bf16 reference where "sdpa" does not compute the model: gpt-oss has no
#: sdpa path (from_config refuses it), and transformers' sdpa function drops
#: Gemma 2's attention softcap (logits 0.39 relative away from eager in
#: float32 on this config), so both are checked against eager in bf16
BF16_REFERENCE = {"gemma2": "eager", "gpt_oss": "eager"}
#: gpt-oss's eager attention also takes its softmax in bf16 (each weight
#: rounded, 2^-9 relative, before P.V), a coarser reference than sdpa's
#: float32 softmax: the direct bounds against it are 2^-3 (measured: logits
#: 0.042, all gradients 0.053; both backends are checked against float32 too)
BF16_COARSE_REFERENCE = {"gpt_oss": 2.0 ** -3}
#: in bf16 the MoE families route every token to every expert: top-2 of 4
#: experts turns a bf16 ulp of difference into a switched expert (logits
#: 0.19 relative apart on gpt-oss, both backends 0.54 from float32), which
#: would hide the attention under routing noise
BF16_DENSE_ROUTING = {"gpt_oss": dict(num_experts_per_tok=4),
                      "deepseek_v3": dict(num_experts_per_tok=4)}


@pytest.mark.parametrize("padding", ["none", "right"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_matches_sdpa(family, padding):
    ids, am, labels = _batch(padding)
    routing = BF16_DENSE_ROUTING.get(family, {})
    got = _run(_model(family, "tilegrad", torch.bfloat16, **routing), ids, am, labels)
    ref = _run(_model(family, BF16_REFERENCE.get(family, "sdpa"), torch.bfloat16, **routing),
               ids, am, labels)
    exact = _run(_model(family, "eager", **routing), ids, am, labels)   # float32 reference
    rtol = BF16_COARSE_REFERENCE.get(family, BF16_RTOL)
    assert _max_rel(got[0], ref[0]) <= rtol, "logits"
    assert _max_rel(got[1], ref[1]) <= rtol, "loss"
    names = sorted(ref[2])
    flat = [torch.cat([r[2][n].flatten() for n in names]) for r in (got, ref)]
    assert _norm_rel(*flat) <= rtol, "all gradients"
    # as accurate as the reference, against float32, logits and each gradient
    assert _max_rel(got[0], exact[0]) <= 2 * _max_rel(ref[0], exact[0]) + BF16_FLOOR
    for n in names:
        assert _norm_rel(got[2][n], exact[2][n]) <= \
            2 * _norm_rel(ref[2][n], exact[2][n]) + BF16_FLOOR, n


def test_bf16_autocast_matches_sdpa():
    """Mixed precision as users train: float32 weights under CPU bf16
    autocast, where Llama's rotary step hands attention float32 q, k beside
    a bf16 v; tilegrad casts them as autocast casts SDPA's inputs. Same
    bounds as the bf16 model."""
    ids, am, labels = _batch("left")
    runs = []
    for attn in ("tilegrad", "sdpa"):
        model = _model("llama", attn)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs.append(_run(model, ids, am, labels))
    got, ref = runs
    assert _max_rel(got[0], ref[0]) <= BF16_RTOL, "logits"
    assert _max_rel(got[1], ref[1]) <= BF16_RTOL, "loss"
    names = sorted(ref[2])
    flat = [torch.cat([r[2][n].flatten() for n in names]) for r in (got, ref)]
    assert _norm_rel(*flat) <= BF16_RTOL, "all gradients"


# ---------------------------------------------------------------------------
# masks

def test_mask_interface_native_and_dense():
    """What the mask interface returns: None / a [B, kL] padding mask for a
    (sliding) causal mask, bottom-right aligned; sdpa_mask's dense mask for
    a static cache's tensor offset or any other mask function."""
    from transformers import masking_utils as mu
    pad = torch.ones(B, 12, dtype=torch.bool)
    pad[0, :4] = False
    cfg = CONFIGS["mistral"]
    native = dict(batch_size=B, q_length=12, kv_length=12, config=cfg)
    assert tgt.attention_mask(**native) is None
    assert tgt.attention_mask(**native, attention_mask=torch.ones_like(pad)) is None
    assert torch.equal(tgt.attention_mask(**native, attention_mask=pad), pad)
    win = mu.sliding_window_causal_mask_function(WINDOW)
    assert tgt.attention_mask(**native, mask_function=win, local_size=WINDOW) is None
    # decode step of a dynamic cache: 1 query after 11 cached keys
    assert torch.equal(tgt.attention_mask(batch_size=B, q_length=1, kv_length=12,
                                          q_offset=11, attention_mask=pad), pad)
    dense = [
        dict(native, allow_is_causal_skip=False),             # packed / or / and masks
        dict(native, q_offset=torch.tensor(0)),               # static cache
        dict(native, kv_length=20),                           # not bottom-right
        dict(native, mask_function=win, local_size=4),        # chunked or other local size
    ]
    for kw in dense:
        m = tgt.attention_mask(**kw, attention_mask=pad)
        ref = mu.sdpa_mask(**{**kw, "allow_is_causal_skip": False}, attention_mask=pad)
        assert m.dim() == 4 and torch.equal(m, ref), kw


def test_packed_sequences_take_varlen_and_match_eager(monkeypatch):
    """position_ids restarting mid-row (packed sequences): no dense mask, the
    documents go to tilegrad.torch.varlen_attention (test_varlen_transformers.py
    has the rest), and the logits are eager's (its block-diagonal mask)."""
    spy = _AttentionSpy(monkeypatch)
    ids, _, labels = _batch("none")
    pos = torch.cat([torch.arange(15), torch.arange(L - 15)]).expand(B, L)
    outs = []
    for attn in ("tilegrad", "eager"):
        m = _model("llama", attn)
        outs.append(m(input_ids=ids, position_ids=pos, use_cache=False).logits)
    assert _max_rel(outs[0], outs[1]) <= F32_RTOL
    assert spy.calls == []


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_generation_matches_eager(cache, monkeypatch):
    """Greedy decoding of left-padded prompts, 12 new tokens past the window
    of 8: with a dynamic cache prefill and one-token steps take the native
    path; a static cache's steps (its query offset a tensor) get
    transformers' dense mask. Same tokens as eager."""
    ids, am, _ = _batch("left")
    ids, am = ids[:, :16], am[:, :16]
    spy = _AttentionSpy(monkeypatch)
    outs = [_model("mistral", attn).generate(input_ids=ids, attention_mask=am,
                                               max_new_tokens=12, do_sample=False,
                                               cache_implementation=cache)
            for attn in ("tilegrad", "eager")]
    assert torch.equal(outs[0], outs[1])
    calls = spy.calls
    assert len(calls) == 2 * 12 and calls[0]["q"][2] == 16      # prefill, 11 steps
    # prefill: [B, 1, 1, 16] padding + causal + window, in both caches (the
    # static sliding layer hands back just the 16 new keys)
    assert all(c["mask"] == (B, 1, 1, 16) and c["causal"] and c["window"] == WINDOW
               for c in calls[:2])
    if cache == "dynamic":      # the last 8 keys; padding left behind: no mask
        assert all(c["mask"] in (None, (B, 1, 1, 8)) and c["causal"] and
                   c["window"] == WINDOW for c in calls[2:])
    else:                       # a tensor query offset: dense, no causal flag
        assert all(c["mask"] == (B, 1, 1, 8) and not c["causal"] and c["window"] is None
                   for c in calls[2:])


@pytest.mark.skipif("gemma3" not in CONFIGS, reason="no Gemma 3 in this transformers")
def test_bidirectional_gemma3_goes_dense_and_matches_eager(monkeypatch):
    """use_bidirectional_attention: transformers' or-mask functions make the
    masks (full, and |i - k| < W on sliding layers) no causal pattern: they
    reach the kernels dense, with causal off, and match eager."""
    spy = _AttentionSpy(monkeypatch)
    ids, am, labels = _batch("right")
    got = _run(_model("gemma3", "tilegrad", use_bidirectional_attention=True), ids, am, labels)
    ref = _run(_model("gemma3", "eager", use_bidirectional_attention=True), ids, am, labels)
    assert _max_rel(got[0], ref[0]) <= F32_RTOL
    for name, g in ref[2].items():
        assert _max_rel(got[2][name], g) <= F32_RTOL, name
    assert len(spy.calls) == 2 and all(c["mask"] == (B, 1, L, L) and c["causal"] is False
                                       and c["window"] is None for c in spy.calls)


def test_from_pretrained(tmp_path):
    """from_pretrained(..., attn_implementation="tilegrad") loads the weights
    and runs the backend."""
    _model("qwen2", "eager").save_pretrained(tmp_path)
    ids = _batch("none")[0]
    m = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="tilegrad")
    assert m.config._attn_implementation == "tilegrad"
    assert _max_rel(m(input_ids=ids).logits, _model("qwen2", "eager")(input_ids=ids).logits) \
        <= F32_RTOL


# ---------------------------------------------------------------------------
# training: dropout, torch.compile

def test_dropout_in_training_mode():
    """attention_dropout reaches the kernels' dropout in train mode only:
    seeded runs repeat, differ from eval, and give finite gradients."""
    ids, _, labels = _batch("none")
    m = _model("llama", "tilegrad", attention_dropout=0.5)
    eval_loss = m(input_ids=ids, labels=labels).loss
    m.train()
    losses = []
    for _ in range(2):
        torch.manual_seed(7)
        losses.append(m(input_ids=ids, labels=labels).loss)
    assert torch.equal(losses[0], losses[1]) and not torch.equal(losses[0], eval_loss)
    losses[0].backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("family", [f for f in ("gemma2", "gpt_oss") if f in CONFIGS])
def test_compile_fullgraph_training_step(family):
    """forward + loss under torch.compile(fullgraph=True) ("aot_eager": the
    backward is AOTAutograd's compiled joint graph), padding, sliding window
    and softcap (Gemma 2) or sinks (gpt-oss): no graph break, the tilegrad op
    in the graph, eager's loss and gradients."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401  (aot_eager's home)
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    ids, am, labels = _batch("right")
    model = _model(family, "tilegrad")
    ref = _run(model, ids, am, labels)

    def loss_fn(ids, am, labels):
        return model(input_ids=ids, attention_mask=am, labels=labels).loss
    step = torch.compile(loss_fn, fullgraph=True, backend=backend)
    model.zero_grad(set_to_none=True)
    loss = step(ids, am, labels)
    loss.backward()
    assert len(graphs) == 1
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert ops.count("tilegrad.attn_fwd.default") == 2, ops
    assert _max_rel(loss.detach(), ref[1]) <= F32_RTOL
    for name, p in model.named_parameters():
        if name in ref[2]:
            assert _max_rel(p.grad, ref[2][name]) <= F32_RTOL, name


# ---------------------------------------------------------------------------
# RMSNorm swap

@pytest.mark.parametrize("family", [f for f in ("llama", "gemma3", "gpt_oss") if f in CONFIGS])
def test_rms_norm_swap(family):
    ids, am, labels = _batch("right")
    model = _model(family, "tilegrad")
    ref = _run(model, ids, am, labels)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    n = tgt.use_tilegrad_rms_norm(model)
    assert n >= 5 and not any(type(m).__name__.endswith("RMSNorm") and
                              not isinstance(m, tgt.TilegradRMSNorm) for m in model.modules())
    assert model.state_dict().keys() == state.keys()
    got = _run(model, ids, am, labels)
    assert _max_rel(got[0], ref[0]) <= F32_RTOL and _max_rel(got[1], ref[1]) <= F32_RTOL
    for name, g in ref[2].items():
        assert _max_rel(got[2][name], g) <= F32_RTOL, name


# ---------------------------------------------------------------------------
# registration and refusals

def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    tgt.register()
    tgt.register()
    assert AttentionInterface._global_mapping["tilegrad"] is tgt.attention_forward
    assert AttentionMaskInterface._global_mapping["tilegrad"] is tgt.attention_mask
    with pytest.raises(ValueError, match="attn_precision"):
        tgt.register(attn_precision="fast")


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(D=16, Dv=None, dtype=torch.float32):
    return (torch.randn(1, 4, 5, D, dtype=dtype), torch.randn(1, 2, 5, D, dtype=dtype),
            torch.randn(1, 2, 5, Dv or D, dtype=dtype))


@pytest.mark.parametrize("case, match", [
    (dict(D=12), "head dim 12: the kernels take head dims that are multiples of 8"),
    (dict(D=16, Dv=520), "value head dim 520"),
    (dict(dtype=torch.float64), "float32 or bfloat16"),
    (dict(output_attentions=True), "never forms the attention weights"),
    (dict(position_bias=torch.zeros(1, 4, 5, 5)), "position_bias"),
    (dict(attention_mask=object()), "BlockMask"),
    (dict(attention_mask=torch.ones(1, 5, 5, dtype=torch.bool)), r"shape \(1, 5, 5\)"),
    (dict(is_causal=False, sliding_window=4), "sliding_window=4 on a bidirectional layer"),
])
def test_refusals(case, match):
    case = dict(case)
    q, k, v = _qkv(case.pop("D", 16), case.pop("Dv", None), case.pop("dtype", torch.float32))
    mask = case.pop("attention_mask", None)
    with pytest.raises(NotImplementedError, match=match) as e:
        tgt.attention_forward(_Module(), q, k, v, mask, **case)
    assert 'use attn_implementation="sdpa" or "eager"' in str(e.value)


def test_refusal_from_a_model():
    """A model whose head dim the kernels lack fails at its first forward,
    naming the head dim and the alternatives."""
    m = _model("llama", "tilegrad", head_dim=12)
    with pytest.raises(NotImplementedError, match="head dim 12.*sdpa"):
        m(input_ids=_batch("none")[0])


def test_wrong_2d_mask():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"bool \[B, kL\]"):
        tgt.attention_forward(_Module(), q, k, v, torch.ones(1, 5))
