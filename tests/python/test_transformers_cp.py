"""tilegrad.transformers.context_parallel: a transformers model's attention
through tilegrad.ring on a sequence sharded across processes.

2 processes on gloo over loopback (``torch.multiprocessing`` spawn, 1
thread each, test_torch_ring's helpers) hold the same tiny Llama
(``attn_implementation="tilegrad"``, float32, GQA 4:2) and run its forward
and backward inside ``context_parallel()`` on their rows of the batch from
``context_parallel_inputs`` (input ids, global position ids, labels shifted
over the whole sequence, the whole batch's token count). The parent sums
the ranks' losses and parameter gradients (each rank's is its tokens' part)
and compares them with one process running the model on the whole batch:

* contiguous chunks, a batch of 2 sequences;
* the zigzag layout (its rows' positions jump inside a rank: transformers
  then sees a "packed" chunk, which the ring ignores);
* packed documents (``cu_seqlens=``, position ids restarting per document,
  the first label of each document ignored): the reference is the model on
  the packing, whose restarting position ids transformers and tilegrad turn
  into ``varlen_attention`` over the documents.

Tolerance, normwise per tensor: max|a - b| <= TOL max|b|, TOL = 2^-14, as
test_torch_ddp.py argues it for a reordered float32 sum over the batch's
rows (here the tokens' rows split between the ranks, plus the ring's f32
merge of two partial attentions per row, a few ulps); observed in the test
output. The same ranks without ``context_parallel`` (each attending within
its chunk only) miss the gradients by far more (asserted > 100 TOL), so the
comparison sees a missing ring.

Also: local position ids (0..L_r-1 on every rank, a model not given the
sharded ones) raise ValueError on every rank naming the wrong rank; a
padding mask is refused (NotImplementedError) on every rank before the ring
sends anything; blocks do not nest. Skipped without transformers or gloo.
"""
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
transformers = pytest.importorskip("transformers")
import tilegrad.transformers as tgt  # noqa: E402
from tilegrad import ring  # noqa: E402
from test_torch_ddp import catch as _catch, free_port, gloo_on_loopback, \
    start_gloo_worker  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")

WORLD, VOCAB, S = 2, 64, 40
TOL = 2.0 ** -14
DOCS = [10, 1, 17, 12]           # packed: a document of one token, one across the ranks

# name: layout, batch, packed
SCENARIOS = {"contiguous-b2": ("contiguous", 2, False), "zigzag": ("zigzag", 1, False),
             "packed-contiguous": ("contiguous", 1, True), "packed-zigzag": ("zigzag", 1, True)}


def _model():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128,
                                   initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation="tilegrad", dtype=torch.float32).train()


def _cu():
    return torch.tensor([0] + DOCS, dtype=torch.int64).cumsum(0).to(torch.int32)


def _batch(name):
    """(input_ids [B, S], labels [B, S], cu_seqlens or None)."""
    _, B, packed = SCENARIOS[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    ids = torch.randint(1, VOCAB, (B, S), generator=g)
    labels = ids.clone()
    if not packed:
        return ids, labels, None
    labels[0, _cu()[:-1].long()] = -100     # no document predicts the next one's first token
    return ids, labels, _cu()


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _step(model, **kwargs):
    model.zero_grad(set_to_none=True)
    loss = model(**kwargs).loss
    loss.backward()
    return loss.item(), _grads(model)


def _worker(rank, N, port, out_dir, lib_path):
    dist = start_gloo_worker(rank, N, port, lib_path)
    try:
        model = _model()
        res = {}
        for name, (layout, _, _) in SCENARIOS.items():
            ids, labels, cu = _batch(name)
            inputs = tgt.context_parallel_inputs(ids, labels, layout=layout, cu_seqlens=cu)
            with tgt.context_parallel(layout=layout, cu_seqlens=cu):
                res[name] = _step(model, **inputs)
            if name == "contiguous-b2":       # without the ring: each chunk on its own
                res["local"] = _step(model, **inputs)
        ids, labels, _ = _batch("contiguous-b2")
        inputs = tgt.context_parallel_inputs(ids, labels)
        b0 = ring.bytes_sent()
        with tgt.context_parallel():
            local_pos = dict(inputs, position_ids=torch.arange(S // N).unsqueeze(0))
            res["positions"] = _catch(lambda: model(**local_pos))
            padded = dict(inputs, attention_mask=torch.ones_like(inputs["input_ids"]))
            if rank == 0:                     # padding on one rank only
                padded["attention_mask"][0, 0] = 0
            res["padding"] = _catch(lambda: model(**padded))
            res["nested"] = _catch(lambda: tgt.context_parallel().__enter__())
        res["sent"] = ring.bytes_sent() - b0
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _ratio(a, b):
    return ((a - b).abs().max() / (TOL * b.abs().max())).item()


def test_context_parallel_llama_two_ranks(tmp_path, lib):
    gloo_on_loopback()
    import torch.multiprocessing as mp
    ctx = mp.spawn(_worker, args=(WORLD, free_port(), str(tmp_path), lib.path), nprocs=WORLD,
                   join=False)
    t0 = time.monotonic()
    while not ctx.join(timeout=1):        # raises with the child's traceback on a failure
        if time.monotonic() - t0 > 180:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the context-parallel ranks did not finish in 180 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    model = _model()
    worst = {}
    for name in SCENARIOS:
        ids, labels, cu = _batch(name)
        kwargs = dict(input_ids=ids, labels=labels)
        if cu is not None:    # the packing's positions: transformers finds the documents
            kwargs["position_ids"] = ring._doc_positions(torch.arange(S), cu.tolist())[None]
        ref_loss, ref_grads = _step(model, **kwargs)
        loss = sum(r[name][0] for r in ranks)
        grads = {n: sum(r[name][1][n] for r in ranks) for n in ref_grads}
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (name, loss, ref_loss)
        ratios = {n: _ratio(grads[n], ref_grads[n]) for n in ref_grads}
        w = max(ratios, key=ratios.get)
        assert ratios[w] <= 1.0, f"{name}: {w} off by {ratios[w]:.3g} x TOL; {ratios}"
        worst[name] = ratios[w]
        if name == "contiguous-b2":   # the test sees a missing ring
            local = {n: sum(r["local"][1][n] for r in ranks) for n in ref_grads}
            far = max(_ratio(local[n], ref_grads[n]) for n in ref_grads)
            assert far > 100, f"chunks on their own are only {far:.3g} x TOL off"
    print("context parallel, worst gradient error / TOL: " +
          ", ".join(f"{n} {x:.2g}" for n, x in worst.items()), file=sys.stderr)

    for r in range(WORLD):
        e = ranks[r]
        assert e["sent"] == 0, f"rank {r} sent {e['sent']} bytes for calls it refused"
        assert e["positions"].startswith("ValueError") and \
            "position_ids of rank(s) [1]" in e["positions"], e["positions"]
        if r == 0:
            assert e["padding"].startswith("NotImplementedError") and \
                "padding" in e["padding"], e["padding"]
        else:
            assert e["padding"].startswith("RuntimeError") and "[0]" in e["padding"], \
                e["padding"]
        assert e["nested"].startswith("RuntimeError") and "nest" in e["nested"], e["nested"]


def test_context_parallel_needs_a_group():
    dist = pytest.importorskip("torch.distributed")
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        with tgt.context_parallel():
            pass
