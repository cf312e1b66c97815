"""tilegrad.transformers with packed batches: a tiny Llama and a tiny Qwen2
(its second layer sliding, window 8) with attn_implementation="tilegrad"
take several documents flattened into one row -- position_ids restarting
at 0 (transformers' find_packed_sequence_indices, TRL's padding-free
collator) or DataCollatorWithFlattening(return_flash_attn_kwargs=True)'s
cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k -- and must give
the loss and every parameter gradient of the same documents run one by one
with attn_implementation="eager" (transformers' own attention in torch
ops), through tilegrad.torch.varlen_attention; also Mistral, Gemma 2 (softcap),
Gemma 3, gpt-oss (sinks) and DeepSeek-V3 (MLA, Dv != D) in
test_transformers.py's tiny configs and with no dense mask
built: transformers' sdpa_mask (the only builder of a [B, 1, qL, kL] mask
the tilegrad mask interface calls) raises if it runs, the dense attention
is never called, and the mask interface hands the layers the [B, L] int32
document index of each token.

Tolerance (float32): the packed and the one-by-one runs compute the same
float32 math in another order (GEMMs over 57 rows against a document's
rows, attention sums in the kernels' order against eager's), as
test_transformers.py's float32 comparison of tilegrad against eager on the
same batch: its bound, max |a - b| <= 1e-4 * max |b| per tensor (loss and
each parameter gradient; reordered float32 sums over 2 layers and the
backward predict ~1e-5). The loss is the sum over all documents' tokens
divided by their count (num_items_in_batch), so the packed loss is the sum
of the documents' and its gradients the sum of theirs.

Skips when transformers (>= 5) is not importable, unless
TG_REQUIRE_TRANSFORMERS=1.
"""
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
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float32_default_dtype"),
              pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS,
                                 reason=f"torch {torch.__version__} < 2.4: no custom ops")]

VOCAB, WINDOW = 96, 8
F32_RTOL = 1e-4
#: documents of 13, 1, 29 and 14 tokens (one of length 1; two longer than the window)
LENGTHS = (13, 1, 29, 14)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One thread (tiny tensors; see test_transformers.py)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _config(family):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, initializer_range=0.2, pad_token_id=0)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW,
                                    max_window_layers=1)


FAMILIES = ("llama", "qwen2")


def _model(family, attn):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(copy.deepcopy(_config(family)),
                                            attn_implementation=attn,
                                            dtype=torch.float32).eval()


def _documents(seed=1, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


def _max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def _one_by_one(family, docs):
    """The documents through the eager model one at a time: the summed loss
    (each over the whole batch's count) and the accumulated gradients."""
    model = _model(family, "eager")
    count = sum(len(d) - 1 for d in docs)
    total = 0.0
    for d in docs:
        ids = d.view(1, -1)
        if ids.shape[1] < 2:        # no token to predict; its logits reach no loss
            continue
        out = model(input_ids=ids, labels=ids, num_items_in_batch=count, use_cache=False)
        out.loss.backward()
        total = total + out.loss.detach()
    return total, _grads(model)


def _compare(got_loss, got_grads, ref_loss, ref_grads):
    assert _max_rel(got_loss, ref_loss) <= F32_RTOL, "loss"
    assert got_grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        assert _max_rel(got_grads[name], g) <= F32_RTOL, name


class _NoDenseMask:
    """Records the backend's varlen calls and what the mask interface hands
    the layers; fails on a dense mask (sdpa_mask) or a dense attention call."""

    def __init__(self, monkeypatch):
        self.varlen, self.masks = [], []
        real_varlen, real_mask = tt.varlen_attention, tgt.attention_mask

        def varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
            self.varlen.append(dict(q=tuple(q.shape), cu_q=cu_q.tolist(), cu_k=cu_k.tolist(),
                                    max_q=max_q, max_k=max_k, **kw))
            return real_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

        def no_dense(*a, **kw):
            raise AssertionError("a dense mask was built (sdpa_mask)")

        def no_attention(*a, **kw):
            raise AssertionError("the dense attention ran")

        def mask(*a, **kw):
            m = real_mask(*a, **kw)
            self.masks.append(None if m is None else (m.dtype, tuple(m.shape)))
            return m
        monkeypatch.setattr(tgt.tt, "varlen_attention", varlen)
        monkeypatch.setattr(tgt.tt, "attention", no_attention)
        monkeypatch.setattr(tgt._mu, "sdpa_mask", no_dense)
        mu.AttentionMaskInterface.register(tgt.NAME, mask)

    def check(self, family, n_tokens, cu):
        assert len(self.varlen) == 2                # one per layer
        for c in self.varlen:
            assert c["q"] == (n_tokens, 4, 16) and c["cu_q"] == c["cu_k"] == cu
            assert c["causal"] is True
        windows = [c["window_size"] for c in self.varlen]
        assert windows == ([(-1, -1)] * 2 if family == "llama" else [(-1, -1),
                                                                      (WINDOW - 1, 0)])


@pytest.fixture
def no_dense(monkeypatch):
    """no_dense() installs the spy (after the eager reference has run: eager's
    masks come from sdpa_mask)."""
    yield lambda: _NoDenseMask(monkeypatch)
    tgt.register()                                  # the real mask interface back


@pytest.mark.parametrize("use_cache", [False, None], ids=["no-cache", "cache-default"])
@pytest.mark.parametrize("family", FAMILIES)
def test_position_ids_packing_matches_one_by_one(family, use_cache, no_dense):
    """One row of documents with position_ids restarting at 0 (what TRL's
    padding-free collator sends: no attention_mask, no offsets). Without a
    cache transformers' mask interface is told of the packing (the document
    indices come from it); with the config's use_cache=True a DynamicCache
    is made and the mask is plain causal (None): the attention function
    finds the documents in position_ids, as the flash-attn backends do
    (eager would attend across documents there)."""
    docs = _documents()
    ids = torch.cat(docs).view(1, -1)
    pos = torch.cat([torch.arange(len(d)) for d in docs]).view(1, -1)
    labels = ids.clone()
    labels[pos == 0] = -100                         # no document predicts the next one's start
    count = int((labels[:, 1:] != -100).sum())
    ref = _one_by_one(family, docs)
    spy = no_dense()
    model = _model(family, "tilegrad")
    out = model(input_ids=ids, position_ids=pos, labels=labels, num_items_in_batch=count,
                use_cache=use_cache)
    out.loss.backward()
    spy.check(family, 57, [0, 13, 14, 43, 57])
    assert spy.masks and all(m == ((torch.int32, (1, 57)) if use_cache is False else None)
                             for m in spy.masks)
    assert all(c["max_q"] == c["max_k"] == 29 for c in spy.varlen)
    _compare(out.loss.detach(), _grads(model), *ref)


def test_the_comparison_sees_cross_document_attention():
    """The check has teeth: eager on the packed row with a cache object (a
    plain causal mask over all documents) misses the documents run one by
    one by far more than the tolerance."""
    docs = _documents()
    ids = torch.cat(docs).view(1, -1)
    pos = torch.cat([torch.arange(len(d)) for d in docs]).view(1, -1)
    labels = ids.clone()
    labels[pos == 0] = -100
    count = int((labels[:, 1:] != -100).sum())
    ref_loss, _ = _one_by_one("llama", docs)
    leaky = _model("llama", "eager")(input_ids=ids, position_ids=pos, labels=labels,
                                     num_items_in_batch=count, use_cache=True).loss
    assert _max_rel(leaky.detach(), ref_loss) > 100 * F32_RTOL


@pytest.mark.parametrize("positions", [True, False], ids=["with-position_ids", "offsets-only"])
@pytest.mark.parametrize("family", FAMILIES)
def test_flattening_collator_kwargs_match_one_by_one(family, positions, no_dense):
    """DataCollatorWithFlattening(return_flash_attn_kwargs=True): the offsets
    reach the attention function as keywords (with the collator's
    position_ids too, whose documents must agree; without them the rotary
    positions run on across documents, which RoPE's relative phases make
    the same attention)."""
    docs = _documents()
    collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True,
                                         return_position_ids=positions)
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    assert batch["cu_seq_lens_q"].tolist() == [0, 13, 14, 43, 57]
    assert batch["max_length_q"] == 29
    count = int((batch["labels"][:, 1:] != -100).sum())
    ref = _one_by_one(family, docs)
    spy = no_dense()
    model = _model(family, "tilegrad")
    out = model(**batch, num_items_in_batch=count, use_cache=False)
    out.loss.backward()
    spy.check(family, 57, [0, 13, 14, 43, 57])
    # with position_ids the mask interface found the documents too; without,
    # a plain causal row: no mask
    assert spy.masks and all(m == ((torch.int32, (1, 57)) if positions else None)
                             for m in spy.masks)
    _compare(out.loss.detach(), _grads(model), *ref)


def test_packed_rows_of_a_batch(no_dense):
    """Two rows, each packing its own documents (position_ids restarting in
    each): the rows flattened, every document its own."""
    docs = _documents(seed=2, lengths=(9, 21, 12, 5, 13))
    rows = [torch.cat(docs[:2]), torch.cat(docs[2:])]      # 30 tokens each
    ids = torch.stack(rows)
    pos = torch.stack([torch.cat([torch.arange(len(d)) for d in part])
                       for part in (docs[:2], docs[2:])])
    labels = ids.clone()
    labels[pos == 0] = -100
    count = int((labels[:, 1:] != -100).sum())
    ref = _one_by_one("qwen2", docs)
    spy = no_dense()
    model = _model("qwen2", "tilegrad")
    out = model(input_ids=ids, position_ids=pos, labels=labels, num_items_in_batch=count,
                use_cache=False)
    out.loss.backward()
    spy.check("qwen2", 60, [0, 9, 30, 42, 47, 60])
    assert spy.masks and all(m == (torch.int32, (2, 30)) for m in spy.masks)
    _compare(out.loss.detach(), _grads(model), *ref)


@pytest.mark.parametrize("route", ["offsets", "position_ids"])
def test_compile_fullgraph_packed_training_step(route):
    """torch.compile(fullgraph=True, "aot_eager") of forward + loss with a
    cache object (the config's use_cache): one graph holding the two
    varlen ops -- the collator's offsets, or the documents of position_ids
    as fixed-size offsets (B * L + 1, empty documents at the end) -- and
    the eager call's loss and gradients."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)
    docs = _documents()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": d.tolist()} for d in docs])
    if route == "position_ids":
        batch = {k: batch[k] for k in ("input_ids", "position_ids", "labels")}
    model = _model("qwen2", "tilegrad")
    ref = model(**batch).loss
    ref.backward()
    ref_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    step = torch.compile(lambda b: model(**b).loss, fullgraph=True, backend=backend)
    loss = step(batch)
    loss.backward()
    assert len(graphs) == 1
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert ops.count("tilegrad.varlen_attn_fwd.default") == 2, ops
    assert not any("tilegrad.attn_fwd" in o for o in ops)
    _compare(loss.detach(), _grads(model), ref.detach(), ref_grads)


OTHER_FAMILIES = ("mistral", "gemma2", "gemma3", "gpt_oss", "deepseek_v3")


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_other_families_packed(family, no_dense):
    """test_transformers.py's tiny configs of the families whose attention
    carries more (sliding layers of window 8, Gemma 2's softcap, gpt-oss's
    sinks with their gradient, DeepSeek-V3's MLA with Dv != D), packed by
    position_ids: the same loss and gradients as one document at a time."""
    import test_transformers as tr
    if family not in tr.CONFIGS:
        pytest.skip(f"this transformers has no {family}")
    docs = _documents()
    ids = torch.cat(docs).view(1, -1)
    pos = torch.cat([torch.arange(len(d)) for d in docs]).view(1, -1)
    labels = ids.clone()
    labels[pos == 0] = -100
    count = int((labels[:, 1:] != -100).sum())
    ref = tr._model(family, "eager")
    total = 0.0
    for d in docs:
        if len(d) > 1:
            out = ref(input_ids=d.view(1, -1), labels=d.view(1, -1), num_items_in_batch=count,
                      use_cache=False)
            out.loss.backward()
            total = total + out.loss.detach()
    spy = no_dense()
    model = tr._model(family, "tilegrad")
    out = model(input_ids=ids, position_ids=pos, labels=labels, num_items_in_batch=count,
                use_cache=False)
    out.loss.backward()
    assert len(spy.varlen) == 2 and all(c["cu_q"] == [0, 13, 14, 43, 57] for c in spy.varlen)
    if family in tr.SLIDING:
        assert any(c["window_size"] == (WINDOW - 1, 0) for c in spy.varlen)
    if family == "gpt_oss":
        assert all(c["sinks"] is not None for c in spy.varlen)
    _compare(out.loss.detach(), _grads(model), total, _grads(ref))


# ---------------------------------------------------------------------------
# the mask interface and the refusals

def test_mask_interface_reads_the_packed_mask():
    """The [B, L] document indices for transformers' packed causal and
    sliding-window masks; anything else as before (dense or None)."""
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])
    ids = mu.find_packed_sequence_indices(pos)
    packed = mu.packed_sequence_mask_function(ids)
    cfg = _config("qwen2")
    kw = dict(batch_size=1, q_length=10, kv_length=10, config=cfg, allow_is_causal_skip=False)
    causal = mu.and_masks(mu.causal_mask_function, packed)
    m = tgt.attention_mask(mask_function=causal, **kw)
    assert m.dtype == torch.int32 and m.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2, 2]]
    sliding = mu.and_masks(mu.sliding_window_causal_mask_function(WINDOW), packed)
    assert torch.equal(tgt.attention_mask(mask_function=sliding, local_size=WINDOW, **kw), m)
    dense = [
        dict(mask_function=mu.and_masks(mu.sliding_window_causal_mask_function(4), packed),
             local_size=4),                              # not the config's window
        dict(mask_function=mu.and_masks(causal, lambda b, h, q, k: q >= 0)),   # one more
        dict(mask_function=mu.and_masks(mu.bidirectional_mask_function, packed)),
        dict(mask_function=causal, q_offset=torch.tensor(0)),                   # static cache
    ]
    for extra in dense:
        got = tgt.attention_mask(**{**kw, **extra})
        assert got.dim() == 4 and got.dtype == torch.bool, extra


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(B=1, L=6):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(B, 4, L, 16, generator=g), torch.randn(B, 2, L, 16, generator=g),
            torch.randn(B, 2, L, 16, generator=g))


def test_refusals_and_disagreements():
    q, k, v = _qkv()
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    pad = torch.ones(1, 6, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="padding mask.*sdpa"):
        tgt.attention_forward(_Module(), q, k, v, pad, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with pytest.raises(ValueError, match="only cu_seq_lens_q"):
        tgt.attention_forward(_Module(), q, k, v, None, cu_seq_lens_q=cu)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="disagree"):
        tgt.attention_forward(_Module(), q, k, v, docs, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    with pytest.raises(NotImplementedError, match="bidirectional"):
        tgt.attention_forward(_Module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                              is_causal=False, sliding_window=4)
    with pytest.raises(ValueError, match=r"bool \[B, kL\].*int32 document"):
        tgt.attention_forward(_Module(), q, k, v, docs.long())


def test_offsets_and_document_indices_agree():
    """The attention function on its own: the collator's offsets, the
    document indices and a per-document loop give the same bits."""
    q, k, v = _qkv(B=1, L=9)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.int32)
    a, _ = tgt.attention_forward(_Module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                 max_length_q=5, max_length_k=5)
    b, _ = tgt.attention_forward(_Module(), q, k, v, docs)
    c, _ = tgt.attention_forward(_Module(), q, k, v, docs, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert a.shape == (1, 9, 4, 16) and torch.equal(a, b) and torch.equal(a, c)
    for s, e in ((0, 4), (4, 9)):
        one, _ = tgt.attention_forward(_Module(), q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], None)
        assert torch.equal(a[:, s:e], one)


@pytest.mark.parametrize("family", FAMILIES)
def test_block_mask_matches_one_by_one(family, monkeypatch):
    """A flex BlockMask handed to the model as its attention_mask (transformers
    passes a 4-D BlockMask through untouched) runs on tilegrad.torch.
    flex_attention, its blocks only: a document-causal BlockMask of the
    packed row gives the loss and gradients of the documents one by one.
    A given mask is the whole mask (as a 4-D tensor is): the layer's own
    sliding window is not added, so Qwen2 (window 8) runs documents of at
    most 8 tokens, where the window cuts nothing."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    lengths = (7, 1, 8, 5) if family == "qwen2" else LENGTHS
    docs = _documents(lengths=lengths)
    ids = torch.cat(docs).view(1, -1)
    pos = torch.cat([torch.arange(len(d)) for d in docs]).view(1, -1)
    labels = ids.clone()
    labels[pos == 0] = -100
    count = int((labels[:, 1:] != -100).sum())
    ref = _one_by_one(family, docs)
    doc_id = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def document_causal(b, h, q, kv):
        return (doc_id[q] == doc_id[kv]) & (kv <= q)
    n = ids.shape[1]
    block_mask = fa.create_block_mask(document_causal, None, None, n, n, device="cpu",
                                      BLOCK_SIZE=8)
    calls = []
    real = tt.flex_attention

    def flex(*a, **kw):
        calls.append(kw["block_mask"])
        return real(*a, **kw)
    monkeypatch.setattr(tgt.tt, "flex_attention", flex)
    monkeypatch.setattr(tgt.tt, "attention", lambda *a, **kw: pytest.fail("dense attention ran"))
    model = _model(family, "tilegrad")
    out = model(input_ids=ids, attention_mask=block_mask, labels=labels,
                num_items_in_batch=count, use_cache=False)
    out.loss.backward()
    assert len(calls) == 2 and all(c is block_mask for c in calls)
    _compare(out.loss.detach(), _grads(model), *ref)
