#!/usr/bin/env python3
"""One rank of tests/multihost/run.sh (started by torchrun, one per host).

Subcommands (rank 0 checks and writes ``$TG_MH_OUT/<name>.result``):

  ring      ring attention forward + backward on 4 hosts for cases of
            tests/python/test_torch_ring.py (zigzag and ragged contiguous
            chunks, f32 and bf16, GQA, a window + sinks variant, packed
            documents through cu_seqlens=): against float64 autograd within
            that test's per-element bounds and against the single-process
            kernels (packed documents: one-process varlen_attention) within
            twice them; run twice with deterministic=True: bitwise the same
            both times.
  ddp       DDP training of a tiny Llama (attn_implementation="tilegrad"),
            one sequence of the global batch per host; losses and weights
            against one process training on the whole batch; a checkpoint
            at --ckpt-step, the final weights kept for ``resume``.
  resume    a fresh set of hosts loads that checkpoint and trains on to
            --steps: the final weights must be the uninterrupted run's bits.
  fault     ring steps in a loop; at step 2 the last host dies (kill: SIGKILL
            between its forward and backward) or loses its link (linkdown:
            eth0 down, then on with the backward); or (ddpkill) DDP steps of
            the tiny Llama, the last host SIGKILLed inside step 2's gradient
            all-reduce. Every rank records the error that ended it.
  check-fault   (not under torchrun) that fault's checks, from the records.
  bench     step, communication alone and compute alone of the ring
            (bench/multihost_ring_bench.py).

Files are written under a temporary name and renamed when complete
(``atomic_save``), so a rank killed while writing leaves no half file.
"""
import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

OUT = os.environ.get("TG_MH_OUT", ".")
ADDRS = os.environ.get("TG_MH_ADDRS", "").split(",")


def atomic_save(obj, path):
    """torch.save / JSON to path + a temporary suffix, fsync, rename: the
    final name only ever holds a whole file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            if path.endswith(".json") or path.endswith(".result"):
                f.write((json.dumps(obj) if path.endswith(".json") else str(obj)).encode())
            else:
                import torch
                torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def host(rank):
    return ADDRS[rank] if 0 <= rank < len(ADDRS) else "?"


def digest(tensors):
    import torch
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


def init():
    import torch
    import torch.distributed as dist
    from tilegrad import ring
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    # the group's own timeout bounds what tilegrad does not own (DDP's
    # all-reduces, barriers): $TILEGRAD_COLLECTIVE_TIMEOUT, default 60 s, the
    # wait ring_attention gives its own messages
    dist.init_process_group("gloo", timeout=ring.collective_timeout())
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------
# ring: forward + backward equal to the single process

RING_CASES = ("f32-causal-zigzag-gqa4", "bf16-causal-ragged-gqa", "f32-full-gqa-ragged")
RING_VARIANTS = ("f32-causal-zigzag-window-sinks",)
# packed documents (cu_seqlens=): documents of length 1 and ending at chunk
# boundaries, one spanning every host, a window and sinks
RING_DOCS = ("f32-causal-ragged-gqa-len1", "bf16-causal-zigzag-span-gqa",
             "f32-causal-zigzag-window-sinks")


def _ring_case(name, N, r):
    import torch
    import tilegrad.torch as tt
    import test_torch_ring as T
    _, causal, layout = T.CASES[name][:3]
    q, k, v, do = (T._shard(x, name, N, r) for x in T._inputs(name))
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = tt.ring_attention(q, k, v, causal=causal, scale=T._scale(name),
                          softcap=T.CASES[name][9], layout=layout, deterministic=True)
    o.backward(do)
    return [x.detach() for x in (o, q.grad, k.grad, v.grad)]


def _ring_variant(name, N, r):
    """test_torch_ring._run_variant, in deterministic mode."""
    import tilegrad.torch as tt
    import test_torch_ring as T
    _, causal, layout, _, _, _, _, _, lens, W, _ = T.VARIANTS[name]
    q, k, v, do, sinks = T._variant_inputs(name)
    q, k, v, do = (tt.ring_shard(x, N, r, layout) for x in (q, k, v, do))
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    sinks.requires_grad_(True)
    o = tt.ring_attention(q, k, v, causal=causal, layout=layout, window=W, sinks=sinks,
                          deterministic=True)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad, sinks.grad


def cmd_ring(a):
    import torch
    import torch.distributed as dist
    import tilegrad.torch as tt
    import test_torch_ring as T
    from test_torch_wrappers import F64, check
    rank, N = init()
    runs = []
    for _ in range(2):       # twice: deterministic mode gives the same bits
        mine = {name: _ring_case(name, N, rank) for name in RING_CASES}
        mine.update({name: _ring_variant(name, N, rank) for name in RING_VARIANTS})
        mine.update({"docs " + name: T._run_docs(name, N, rank, deterministic=True)
                     for name in RING_DOCS})
        runs.append(mine)
    cp = _context_parallel_steps()
    every = [None] * N if rank == 0 else None
    dist.gather_object((runs, cp), every, dst=0)
    dist.barrier()
    if rank != 0:
        return
    cp_worst = _check_context_parallel([e[1] for e in every])
    every = [e[0] for e in every]
    worst = {}
    for name in RING_CASES:
        layout = T.CASES[name][2]
        full = T._inputs(name)
        single = T._single(name, *full)
        refs, tols = T._reference_and_tols(name, *full)
        ring = [tt.ring_unshard([every[r][0][name][j] for r in range(N)], layout)
                for j in range(4)]
        for what, x, s, ref, tol in zip(("O", "dq", "dk", "dv"), ring, single, refs, tols):
            info = f"{N} hosts, case {name}"
            worst[f"{name} {what}"] = check(f"ring {what}", x, ref, tol, info)
            check(f"ring - single-process {what}", x, s.to(F64), 2 * tol, info)
    for name in RING_VARIANTS:
        T._check_variant(N, [{"variants": {name: every[r][0][name]}} for r in range(N)], name)
    for name in RING_DOCS:     # against one-process varlen_attention on the whole packing
        full = T._doc_inputs(name)
        got = T._doc_unshard(name, [every[r][0]["docs " + name] for r in range(N)])
        single = T._doc_single(name, *full)
        refs, tols = T._doc_reference(name, *full)
        for what, x, s, ref, tol in zip(("O", "dq", "dk", "dv", "dsinks"), got, single, refs,
                                        tols):
            info = f"{N} hosts, documents {name}"
            if what != "dsinks":
                x, s = T._bhld(x), T._bhld(s)
            worst[f"docs {name} {what}"] = check(f"ring {what}", x, ref, tol, info)
            check(f"ring - single-process {what}", x, s.to(F64), 2 * tol, info)
    hashes = []
    for run in (0, 1):
        hashes.append(digest([t for r in range(N) for name in sorted(every[r][run])
                              for t in every[r][run][name] if t is not None]))
    assert hashes[0] == hashes[1], f"deterministic ring: run 1 {hashes[0]} != run 2 {hashes[1]}"
    w = max(worst, key=worst.get)
    atomic_save(f"{len(RING_CASES)} cases + {len(RING_VARIANTS)} variant + {len(RING_DOCS)} "
                "packed-document cases (vs one-process varlen_attention) within bounds "
                f"(worst error/bound {worst[w]:.2g}, {w}); two deterministic runs: the same "
                f"bits ({hashes[0]}); context parallel, a 2-layer Llama through "
                "tilegrad.transformers.context_parallel: loss and gradients within 2^-14 of one "
                "process (worst / bound: " + ", ".join(f"{n} {x:.2g}" for n, x in cp_worst.items())
                + ")", os.path.join(OUT, "ring.result"))


# context parallel: test_transformers_cp's model and batches across the hosts
CP_SCENARIOS = ("zigzag", "packed-zigzag", "packed-contiguous")


def _context_parallel_steps():
    """This host's (loss, gradients) of each scenario under context_parallel."""
    import tilegrad.transformers as tgt
    import test_transformers_cp as C
    model = C._model()
    res = {}
    for name in CP_SCENARIOS:
        layout = C.SCENARIOS[name][0]
        ids, labels, cu = C._batch(name)
        inputs = tgt.context_parallel_inputs(ids, labels, layout=layout, cu_seqlens=cu)
        with tgt.context_parallel(layout=layout, cu_seqlens=cu):
            res[name] = C._step(model, **inputs)
    return res


def _check_context_parallel(hosts):
    """The hosts' summed losses and gradients against one process on the
    whole batch (test_transformers_cp's bound) -> {scenario: worst / bound}."""
    import torch
    from tilegrad import ring
    import test_transformers_cp as C
    model = C._model()
    worst = {}
    for name in CP_SCENARIOS:
        ids, labels, cu = C._batch(name)
        kwargs = dict(input_ids=ids, labels=labels)
        if cu is not None:
            kwargs["position_ids"] = ring._doc_positions(torch.arange(C.S), cu.tolist())[None]
        ref_loss, ref_grads = C._step(model, **kwargs)
        loss = sum(h[name][0] for h in hosts)
        assert abs(loss - ref_loss) <= C.TOL * abs(ref_loss), (name, loss, ref_loss)
        ratios = {n: C._ratio(sum(h[name][1][n] for h in hosts), g) for n, g in ref_grads.items()}
        w = max(ratios, key=ratios.get)
        assert ratios[w] <= 1.0, f"context parallel {name}: {w} off by {ratios[w]:.3g} x bound"
        worst[name] = ratios[w]
    return worst


# ---------------------------------------------------------------------------
# ddp / resume: a tiny Llama

SEQ, VOCAB, LR, MOMENTUM = 32, 96, 0.05, 0.9
# Parameters and losses against the one-process run on the whole batch,
# normwise per tensor: max|a - b| <= TOL max|b|. Both are float32 runs of
# the same function differing in summation order only: a weight's gradient
# sums 4 x 31 token rows, here as 4 per-host GEMMs of 31 rows added by
# gloo's all-reduce (after DDP's division by 4, exact), there in one GEMM
# (blocked differently). A reordered n-term f32 sum moves by <= ~(n + k) u
# sum|terms| (k: the inner dims met on the way, <= 256), and the summed
# magnitudes of random-sign rows exceed the sum by ~sqrt(124) ~ 11: first
# order ~ 4,200 u of the gradient, which 4 SGD steps with momentum carry
# into the weights scaled by LR (< 1 per step) -- TOL = 2^-12 (4,096 u)
# covers it; observed ~ 2^-22 (test output).
TOL = 2.0 ** -12


def _llama():
    import torch
    import transformers
    import tilegrad.transformers as tgt
    tgt.register(deterministic=True)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   initializer_range=0.2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="tilegrad",
                                                          dtype=torch.float32)
    return model.train()


def _batch(world):
    """The global batch: one sequence per host; the same for every step."""
    import torch
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (world, SEQ), generator=g)


def _train(model, opt, ids, steps):
    """-> the losses of these steps (SGD on ids, the same batch each step)."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _weights(model):
    m = getattr(model, "module", model)
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def _worst(got, ref):
    """max over tensors of max|a - b| / max|b|."""
    return max(((got[n] - ref[n]).abs().max() / ref[n].abs().max()).item() for n in ref)


def _ddp_steps(a, rank, N, start, ckpt=None):
    """DDP from step `start` (a checkpoint's, or 0) to a.steps; -> (model,
    per-step mean losses over the hosts)."""
    import torch
    import torch.distributed as dist
    model = _llama()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
    # find_unused_parameters: DDP then never rebuilds its buckets after the
    # first step (it does otherwise, in backward order), so a resumed run's
    # first step all-reduces in the same bucket layout as the uninterrupted
    # run's step k+1; gloo's sum order per element follows its place in the
    # bucket, and a different layout moved weights by an ulp (measured)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    if ckpt is not None:
        opt.load_state_dict(ckpt["optim"])
    ids = _batch(N)[rank:rank + 1]
    losses = []
    for step in range(start + 1, a.steps + 1):
        losses += _train(ddp, opt, ids, 1)
        if step == a.ckpt_step and rank == 0:      # every host holds the same weights
            atomic_save(dict(step=step, model=model.state_dict(), optim=opt.state_dict()),
                        os.path.join(OUT, "ckpt.pt"))
    t = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(t)
    return model, (t / N).tolist()


def cmd_ddp(a):
    import torch
    import torch.distributed as dist
    rank, N = init()
    model, losses = _ddp_steps(a, rank, N, 0)
    hashes = [None] * N
    dist.all_gather_object(hashes, digest(_weights(model).values()))
    dist.barrier()
    if rank != 0:
        return
    assert len(set(hashes)) == 1, f"the hosts' weights differ: {hashes}"
    atomic_save(_weights(model), os.path.join(OUT, "ddp-final.pt"))
    ref = _llama()                              # one process, the whole batch
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    ref_losses = _train(ref, ref_opt, _batch(N), a.steps)
    lw = max(abs(x - y) / abs(y) for x, y in zip(losses, ref_losses))
    ww = _worst(_weights(model), _weights(ref))
    assert lw <= TOL and ww <= TOL, (f"DDP vs one process: losses off by {lw:.3g}, weights by "
                                     f"{ww:.3g} (relative; TOL {TOL:.3g}); losses {losses} "
                                     f"against {ref_losses}")
    assert ref_losses[-1] < ref_losses[0], ref_losses
    n = sum(p.numel() for p in ref.parameters())
    atomic_save(f"{n} params, {a.steps} steps on {N} hosts: losses {losses[0]:.4f} -> "
                f"{losses[-1]:.4f}, vs one process: losses {lw:.2g}, weights {ww:.2g} "
                f"(TOL {TOL:.2g}); hosts bitwise equal; checkpoint at step {a.ckpt_step}",
                os.path.join(OUT, "ddp.result"))


def cmd_resume(a):
    import torch
    import torch.distributed as dist
    rank, N = init()
    ckpt = torch.load(os.path.join(OUT, "ckpt.pt"))
    model, _ = _ddp_steps(a, rank, N, ckpt["step"], ckpt)
    dist.barrier()
    if rank != 0:
        return
    want = torch.load(os.path.join(OUT, "ddp-final.pt"))
    got = _weights(model)
    bad = [n for n in want if not torch.equal(got[n], want[n])]
    assert not bad, (f"resumed from step {ckpt['step']}: {len(bad)} tensors differ from the "
                     f"uninterrupted run (worst relative {_worst(got, want):.3g}): {bad[:4]}")
    atomic_save(f"from the step-{ckpt['step']} checkpoint on fresh hosts (100 Mbit/s links) "
                f"to step {a.steps}: the uninterrupted run's bits", os.path.join(OUT, "resume.result"))


# ---------------------------------------------------------------------------
# faults

def _fault_inputs(rank, N):
    import torch
    import tilegrad.torch as tt
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 256, 32, generator=g) for _ in range(3))
    return [tt.ring_shard(x, N, rank, "zigzag").requires_grad_(True) for x in (q, k, v)]


def _ddp_fault(a, rank, N):
    """ddpkill: DDP steps of the tiny Llama; in step 2 the last host's rank
    SIGKILLs itself inside the gradient all-reduce (a comm hook, the same on
    every rank, kills it right after it posted its first bucket's
    all-reduce), while the others are in theirs. Rank 0 writes a checkpoint
    after every step (atomic_save)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    victim, step = N - 1, [0]
    model = _llama()
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    def hook(state, bucket):
        fut = default_hooks.allreduce_hook(None, bucket)
        if rank == victim and step[0] == 2:
            atomic_save({"t_fault": time.time(), "rank": rank, "bucket": bucket.index()},
                        os.path.join(OUT, f"{a.kind}.fault.json"))
            os.kill(os.getpid(), signal.SIGKILL)
        return fut
    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    ids = _batch(N)[rank:rank + 1]
    for step[0] in (1, 2, 3):
        _train(ddp, opt, ids, 1)
        if rank == 0:
            atomic_save(dict(step=step[0], model=model.state_dict(), optim=opt.state_dict()),
                        os.path.join(OUT, f"{a.kind}.step.pt"))
    raise AssertionError("DDP ran on through the fault")


def cmd_fault(a):
    import torch
    import tilegrad.torch as tt
    rank, N = init()
    if a.kind == "ddpkill":
        return _ddp_fault(a, rank, N)
    victim = N - 1
    for step in (1, 2, 3):
        q, k, v = _fault_inputs(rank, N)
        o = tt.ring_attention(q, k, v, causal=True, layout="zigzag", timeout=a.timeout)
        if step == 2 and rank == victim:           # mid-step: after the forward
            atomic_save({"t_fault": time.time(), "rank": rank},
                        os.path.join(OUT, f"{a.kind}.fault.json"))
            if a.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
        o.sum().backward()
        if rank == 0:    # a per-step output, as a training loop writes checkpoints
            atomic_save({"step": step, "o": o.detach(), "dq": q.grad},
                        os.path.join(OUT, f"{a.kind}.step.pt"))
    raise AssertionError("the ring ran on through the fault")


#: what gloo says when a peer's connection is gone or silent
GLOO_PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Timed out",
                    "timed out", "Connection refused", "Broken pipe")


def cmd_check_fault(a):
    """Every host's torchrun exited non-zero; every rank but a killed one
    recorded an error that names a peer rank and its host, within 60 s of
    the fault (ddpkill: within the process group's timeout, --timeout, plus
    15 s), a RingPeerError for the ring's faults and gloo's own peer error
    for DDP's; in the ring the rank that receives from the victim names the
    victim; the per-step output is whole (step 1's) and no temporary file
    is left."""
    rcs = [int(x) for x in a.rcs.split()]
    N = len(rcs)
    victim = N - 1
    ddp = a.kind == "ddpkill"
    limit = a.timeout + 15 if ddp else 60
    fault = json.load(open(os.path.join(a.out, f"{a.kind}.fault.json")))
    assert fault["rank"] == victim, fault
    assert all(rc != 0 for rc in rcs), f"a host exited 0 after the fault: {rcs}"
    lines = []
    for r in range(N):
        path = os.path.join(a.out, f"{a.kind}.error.{r}.json")
        if a.kind in ("kill", "ddpkill") and r == victim:
            assert not os.path.exists(path), "the killed rank wrote an error record"
            continue
        assert os.path.exists(path), f"rank {r} ended without recording an error: {rcs}"
        e = json.load(open(path))
        dt = e["t"] - fault["t_fault"]
        assert dt < limit, f"rank {r} raised {dt:.1f} s after the fault (limit {limit} s): {e}"
        if ddp:
            assert any(w in e["msg"] for w in GLOO_PEER_ERRORS), e
            assert e["peer"] is not None and e["peer"] != r, e
        else:
            assert e["type"] == "RingPeerError" and e["peer"] is not None, e
        assert f"peer rank {e['peer']} at {host(e['peer'])}" in e["msg"], e
        lines.append(f"rank {r}: {dt:.1f} s, names rank {e['peer']}")
    if not ddp:
        e0 = json.load(open(os.path.join(a.out, f"{a.kind}.error.0.json")))
        assert e0["peer"] == victim, f"rank 0 receives from rank {victim} but named {e0['peer']}"
    import torch
    left = glob.glob(os.path.join(a.out, "*.tmp-*"))
    assert not left, f"temporary files left: {left}"
    step = torch.load(os.path.join(a.out, f"{a.kind}.step.pt"))
    if ddp:      # the step-1 checkpoint, whole: every weight and its momentum
        model, optim = step["model"], step["optim"]
        assert step["step"] == 1 and len(optim["state"]) == len(model) > 0, step.keys()
        assert all(bool(torch.isfinite(t).all()) for t in model.values())
    else:
        assert step["step"] == 1 and step["o"].shape == step["dq"].shape, step.keys()
    print(f"{a.kind}: " + "; ".join(lines) + "; exits " + " ".join(map(str, rcs)) +
          "; the step output whole (step 1), no temporary file")


# ---------------------------------------------------------------------------
# bench: the ring's step, its communication alone, its compute alone

class _Done:
    def wait(self, timeout=None):
        return True


def cmd_bench(a):
    import torch
    import torch.distributed as dist
    import tilegrad.torch as tt
    from tilegrad import ring
    rank, N = init()
    B, H, Hkv, S, D = (int(x) for x in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    mk = lambda h: torch.randn((B, h, S, D), generator=g).to(torch.bfloat16)  # noqa: E731
    q, k, v, do = (tt.ring_shard(x, N, rank, "zigzag") for x in (mk(H), mk(Hkv), mk(Hkv), mk(H)))
    post, fwd, bwd = ring._post, ring._fwd_pair, ring._bwd_pair

    def no_comm(plan, op, t, peer, tag, what):    # the chunks "arrive" as zeros
        if op is dist.irecv:
            t.zero_()
        return _Done(), peer, what

    def no_fwd(ctx, plan, q, k, v, causal, q_offset, window):
        return (torch.zeros(q.shape, dtype=torch.float32),
                torch.full(q.shape[:3], -math.inf, dtype=torch.float32))

    modes = {"step": (post, fwd, bwd), "comm": (post, no_fwd, lambda *x: None),
             "compute": (no_comm, fwd, bwd)}
    res = {}
    for mode, (p, f, b) in modes.items():
        ring._post, ring._fwd_pair, ring._bwd_pair = p, f, b
        ts = []
        for i in range(a.reps + 1):
            ql, kl, vl = (t.clone().requires_grad_(True) for t in (q, k, v))
            dist.barrier()
            t0 = time.perf_counter()
            o = tt.ring_attention(ql, kl, vl, causal=True, layout="zigzag", threads=1)
            t1 = time.perf_counter()
            o.backward(do)
            t2 = time.perf_counter()
            dt = torch.tensor([t2 - t0, t1 - t0, t2 - t1])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)      # the slowest host's
            if i:
                ts.append(dt.tolist())
        res[mode] = statistics.median(t[0] for t in ts)
        res[mode + "_fwd"] = statistics.median(t[1] for t in ts)
        res[mode + "_bwd"] = statistics.median(t[2] for t in ts)
    ring._post, ring._fwd_pair, ring._bwd_pair = post, fwd, bwd
    if rank == 0:
        step, comm, comp = res["step"], res["comm"], res["compute"]
        res.update(overlap=(comm + comp - step) / min(comm, comp), rate=a.rate, hosts=N,
                   shape=[B, H, Hkv, S, D], reps=a.reps, dtype="bf16", layout="zigzag",
                   kv_bytes=2 * B * Hkv * (S // N) * D * 2, grad_bytes=2 * B * Hkv * (S // N) * D * 4)
        atomic_save(res, os.path.join(OUT, f"bench-{a.rate}.json"))
        atomic_save(f"step {1e3 * step:.0f} ms, comm {1e3 * comm:.0f} ms, compute "
                    f"{1e3 * comp:.0f} ms, overlap {res['overlap']:.2f}",
                    os.path.join(OUT, f"bench-{a.rate}.result"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["ring", "ddp", "resume", "fault", "check-fault", "bench"])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--ckpt-step", type=int, default=2)
    p.add_argument("--kind", choices=["kill", "linkdown", "ddpkill"], default="kill")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--name", default="")
    p.add_argument("--out", default=OUT)
    p.add_argument("--rcs", default="")
    p.add_argument("--rate", default="none")
    p.add_argument("--shape", default="1,8,8,4096,64")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if a.cmd == "check-fault":
        return cmd_check_fault(a)
    try:
        globals()["cmd_" + a.cmd.replace("-", "_")](a)
        import torch.distributed as dist
        dist.destroy_process_group()
    except BaseException as e:
        import traceback
        traceback.print_exc()
        rank = int(os.environ.get("RANK", -1))
        peer = getattr(e, "peer", None)
        msg = str(e)
        if peer is None:         # gloo's own errors name the peer's address:port
            found = re.search(r"\[(\d+\.\d+\.\d+\.\d+)\]:\d+", msg)
            if found and found.group(1) in ADDRS:
                peer = ADDRS.index(found.group(1))
        if peer is not None:     # the host too: the rank alone does not say where to look
            msg = f"rank {rank} at {host(rank)}: lost peer rank {peer} at {host(peer)}: {msg}"
        print(f"ERROR: {msg}", file=sys.stderr, flush=True)
        if a.cmd == "fault":
            atomic_save(dict(rank=rank, peer=peer, type=type(e).__name__, msg=msg, t=time.time()),
                        os.path.join(OUT, f"{a.kind}.error.{rank}.json"))
        # the group is broken: its destructor would wait on the messages
        # the dead peer never answers
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
