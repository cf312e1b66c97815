#!/usr/bin/env python3
"""Train Hugging Face models of real families on the CPU: sdpa vs tilegrad.

What a user of transformers sees: a whole training step (forward, the loss as
`model(input_ids, labels=labels).loss`, backward, gradient clipping at 1.0,
AdamW with float32 moments) of a model built with `from_config` from a real
family's published config (random weights, seeded: no download), for each
backend in a process of its own:

  sdpa          attn_implementation="sdpa"
  tilegrad      attn_implementation="tilegrad" (`import tilegrad.transformers`)
  tilegrad-all  the same plus tilegrad.transformers.use_tilegrad_kernels(model,
                rope=True, swiglu=True, rms_norm=True,
                fused_linear_cross_entropy=True) (skipped, said so, where that
                function is missing or refuses the model)
  sdpa-compile  torch.compile(model) with sdpa: what a user might pick
                instead (a compile failure is reported by name; skipped when
                the first step takes over --compile-timeout; --no-compile)
  eager         attn_implementation="eager" (optional: the loss check's yardstick)

  * Configs (--configs; the published values are in train_model_parts.py's
    CONFIGS: widths, heads, vocabulary, rope, windows, softcaps, tied
    embeddings as published; the output names every reduction, --layers N
    overrides it):
      llama-style    Llama-style widths: hidden 768, 6 layers, 12/4 heads of 64,
                     MLP 2048, vocab 32000; seq 2048,4096
      llama-3.2-1b   4 of 16 layers (llama3 rope scaling, tied); seq 2048
      qwen2.5-0.5b   in full (24 layers, q/k/v biases, tied); seq 2048
      gemma-2-2b     2 of 26 layers (one sliding, one global; head dim 256,
                     softcaps 50 / 30, GeGLU, tied); seq 1024. NB: sdpa drops
                     the attention softcap (transformers' sdpa path has no
                     such argument); tilegrad and eager apply it
      bert-base      BertForSequenceClassification (2 labels), 12 layers;
                     seq 128 (batch 32) and 512 (batch 8), lr 5e-5
    Changes for every config: use_cache off (training) and dropout off (the
    backends draw different dropout masks, and the loss check compares
    curves step by step). --quick: a byte-level toy Llama (hidden 256, 2
    layers, vocab 256) at seq 512, 8 steps, without sdpa-compile: the CI
    smoke test, under a minute on 2 cores.
  * Data: deterministic generated text (English-like sentences, sums,
    counts), one byte per token, the 256 bytes mapped to 256 ids of the
    config's vocabulary (seeded; ids >= 1000, clear of special tokens):
    learnable, while the LM head and the loss still span the whole
    vocabulary. BERT: a window's label is whether it holds more digits than
    the median window. Every backend gets the same batches and the same
    initial weights (both checked by SHA-256).
  * dtype: bf16 autocast (f32 weights and AdamW: the master copy) where the
    CPU has a bf16 unit (x86 avx512_bf16 / amx_bf16, aarch64 bf16), float32
    elsewhere: PyTorch's faster dtype on each (bench/vs_torch.py).
  * Fairness: every backend at the same --threads (torch.set_num_threads
    and OMP_NUM_THREADS, which tilegrad's OpenMP reads too), each thread
    count with fresh processes. The processes are built one after another,
    then take turns, --block steps at a time in an order that rotates every
    round, so drift of the machine's speed hits every backend alike. They
    all stay alive (weights, gradients, AdamW state: ~16 bytes a parameter
    each, plus activations), so where the estimated sum exceeds the memory
    available (--schedule auto, the default) they run one after another
    instead, and the output says "processes: sequential".

Reported per config x seq x threads x backend: tokens/s (median over the
steps after --warmup), peak RSS (ru_maxrss of the backend's process) and
RSS once the model is built, the loss curve (PNG, overlaid per config; skipped
with a note without matplotlib) and the loss check: the trailing moving
average (window --smooth) of each backend's loss stays within --loss-rtol
(default 1%, relative) of sdpa's at every step. 1% is a few bf16 roundings
of the loss (relative spacing 2^-8 = 0.39%): the two stock backends, eager
and sdpa, differed by 0.07% over 30 steps at seq 512 in bf16 (AMD EPYC, 2
threads), while a wrong mask or gradient moves the curve by far more within
a few steps (a causal leak drops the loss at once).

Where the time goes: after the timed steps, --profile-steps step(s) per backend
under torch.profiler (CPU), the self time of every traced op (no double
counting) put into one category: attention (anything under the attention
function the model calls, or an sdpa / tilegrad attention op or its backward
node), loss (cross-entropy, log_softmax, nll, a linear cross-entropy, and
non-GEMM ops on [.., V] logits: their float copies, the softcap, the fill_ of
their gradient), lm_head (GEMMs with a vocabulary-sized dim, [V, H] weight
casts and gradient adds), gemm (aten::mm/addmm/bmm/linear/matmul and their
backward nodes), embedding (the embedding and its backward), norm_elementwise
(norms, activations, mul/add, rope pieces, tilegrad's step kernels), copies
(to/_to_copy/copy_/contiguous/clone, autocast casts), optimizer (AdamW,
zero_grad, clip_grad_norm_), other; untraced: the step's wall time less the
traced self times (Python between ops). The check: the
categories a backend does not replace among gemm, lm_head, copies and other
must cost the same as with sdpa within 5% (PASS/FAIL with the ratio; printed
and in the JSON, not in the exit status: it is a target, and one step on a
shared machine is noisy). Per process the OpenMP runtime torch's library and
tilegrad's resolved to (dlsym of omp_get_max_threads through each library's
handle, dladdr) and every libgomp/libomp in /proc/self/maps: one pool serves
both only if they are the same file.

The exit status is 1 where a backend other than sdpa-compile / eager failed or
its loss disagrees.

sdpa-compile's inductor kernels show as "other" (## Call CompiledFxGraph);
its GEMMs stay aten::mm. eager has no attention anchor: its matmuls and
softmax count in their own categories. The toy (V = hidden = 256) gets no
vocabulary-shaped rules: its LM head counts as gemm (as loss inside a fused
linear cross-entropy).

  python bench/train_model.py --quick --threads 2
  python bench/train_model.py --configs llama-style --seq 4096 --threads 2,16 --json ls.json
  python bench/train_model.py --configs qwen2.5-0.5b --threads 16 --steps 50 --json q.json  # + q.png
"""
import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_model_parts import (  # noqa: E402  (bench/ on the path first)
    BACKENDS, CATEGORIES, CHECKED, CONFIGS, DEFAULT_BACKENDS, REAL, breakdown, build_model,
    config_kwargs, cpu_has_bf16_unit, cpu_model, dense_packed_mask, describe, layers_run,
    make_batches, openmp_report, packed_rows, plot, replaced_categories)


# --------------------------------------------------------------- the worker

def worker_main(conn, cfg):
    """One backend's process: build, then train --block steps per request."""
    try:
        _worker(conn, cfg)
    except BaseException as e:  # the parent reports it and goes on with the others
        conn.send({"error": traceback.format_exc(), "error_name": type(e).__name__})
    finally:
        conn.close()


def _worker(conn, cfg):
    import resource
    from contextlib import nullcontext

    import torch
    import transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from torch.profiler import ProfilerActivity, profile, record_function

    backend, name, seq, batch = cfg["backend"], cfg["config"], cfg["seq"], cfg["batch"]
    torch.set_num_threads(cfg["threads"])
    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "torch_isa": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}
    attn, tg_lib, tgt = {"sdpa-compile": "sdpa", "tilegrad-all": "tilegrad",
                         "tilegrad-dense": "tilegrad"}.get(backend, backend), None, None
    if attn == "tilegrad":
        sys.path.insert(0, os.path.join(REPO, "python"))
        import tilegrad
        import tilegrad.transformers as tgt
        tgt.register(attn_precision=cfg["attn_precision"])
        tg_lib = tilegrad.library().path
        info.update(tilegrad_lib=tg_lib, tilegrad_isa=tilegrad.Context().isa,
                    attn_precision=cfg["attn_precision"])
    info["openmp"] = openmp_report(torch, tg_lib)

    family = CONFIGS[name]["family"]
    model = build_model(name, layers_run(name, cfg["layers"])[0], attn, cfg["seed"])
    init_hash, seen = hashlib.sha256(), set()
    for _, p in sorted(model.state_dict().items()):
        if p.data_ptr() not in seen:             # tied weights once
            seen.add(p.data_ptr())
            init_hash.update(p.detach().contiguous().numpy())
    info["rope"] = getattr(model.config, "rope_parameters", None)
    info["layer_types"] = getattr(model.config, "layer_types", None)

    if backend == "tilegrad-all":
        use = getattr(tgt, "use_tilegrad_kernels", None)
        if use is None:
            conn.send({"skipped": "use_tilegrad_kernels missing"})
            return
        try:
            replaced = use(model, rope=True, swiglu=True, rms_norm=True,
                           fused_linear_cross_entropy=True)
        except NotImplementedError as e:
            conn.send({"skipped": f"use_tilegrad_kernels refused: {e}"})
            return
        info["replaced"] = dict(replaced) if isinstance(replaced, dict) else repr(replaced)
    if backend != "sdpa-compile" and attn != "eager":
        plain = ALL_ATTENTION_FUNCTIONS.get_interface(attn, None)

        def attention_function(*a, **kw):  # the attention category's anchor in the profile
            with record_function("attention_function"):
                return plain(*a, **kw)
        ALL_ATTENTION_FUNCTIONS[attn] = attention_function   # this process's mapping only
    step_model = torch.compile(model) if backend == "sdpa-compile" else model

    c = model.config
    dims = {c.hidden_size, c.intermediate_size, seq, batch * seq,
            c.num_attention_heads * getattr(c, "head_dim", 0) or c.hidden_size}
    # the breakdown's [.., V] / [V, H] rules: causal LMs whose V is no other dim
    vocab = None if c.vocab_size in dims or family == "bert" else c.vocab_size
    params = [p for p in model.parameters() if p.requires_grad]
    ids, labels, stream = make_batches(torch, name, cfg["steps"] + cfg["profile_steps"],
                                       batch, seq, cfg["seed"])
    extra = [{} for _ in range(len(ids))]  # per step: position_ids, a dense mask
    if cfg["packed"]:
        pos, doc, first = packed_rows(torch, len(ids), batch, seq, cfg["packed"], cfg["seed"])
        labels = labels.masked_fill(first, -100)
        for i in range(len(ids)):
            extra[i]["position_ids"] = pos[i]
            if backend == "tilegrad-dense":  # tilegrad without varlen: the dense mask
                extra[i]["attention_mask"] = dense_packed_mask(
                    torch, doc[i], torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32)
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1,
                            **{"default": {}, "foreach": {"foreach": True},
                               "fused": {"fused": True}}[cfg["adamw"]])
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if cfg["dtype"] == "bf16"
                else nullcontext())

    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def train_step(i):
        with autocast:
            loss = step_model(input_ids=ids[i], labels=labels[i], **extra[i]).loss
        loss.backward()
        with record_function("clip_grad_norm_"):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    conn.send({"ready": True, "info": info, "init_sha256": init_hash.hexdigest(),
               "data_sha256": hashlib.sha256(stream + labels.numpy().tobytes()).hexdigest(),
               "params": sum(p.numel() for p in params), "rss_before": peak_rss()})
    step, trained_rss = 0, None
    while True:
        cmd, arg = conn.recv()
        if cmd == "finish":
            conn.send({"peak_rss": peak_rss()})
            return
        if cmd == "profile":          # one step under the profiler
            if trained_rss is None:
                trained_rss = peak_rss()      # the profiler's own memory left out
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                t0 = time.perf_counter()
                train_step(step)
                wall = time.perf_counter() - t0
            step += 1
            cats, top = breakdown(prof, wall, vocab)
            conn.send({"profile": {"breakdown_ms": cats, "breakdown_top": top,
                                   "profiled_step_s": wall}, "peak_rss_trained": trained_rss})
            continue
        records = []
        for _ in range(arg):
            t0 = time.perf_counter()
            loss = train_step(step)
            records.append({"step": step, "loss": loss, "seconds": time.perf_counter() - t0})
            step += 1
        conn.send({"records": records})


# --------------------------------------------------------------- the parent

def receive(conn, proc, timeout=None):
    """The worker's next message; an error if it died without one, a skip if
    it took longer than timeout (then it is killed)."""
    if timeout is not None and not conn.poll(timeout):
        proc.kill()
        proc.join(timeout=10)
        return {"skipped": f"the first step (torch.compile) took over {timeout:g} s "
                           "(--compile-timeout)"}
    try:
        return conn.recv()
    except EOFError:
        proc.join(timeout=5)
        return {"error": f"the worker exited with status {proc.exitcode} (out of memory?)",
                "error_name": "WorkerDied"}


def progress(line):
    print(line, file=sys.stderr, flush=True)


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def worker_estimate(name, ready, batch, seq):
    """A worker's peak, roughly (bytes): its RSS once built, gradients and
    AdamW's two moments (12 bytes a parameter), activations (per token: the
    logits' bf16 / f32 copies and gradients ~12 bytes per vocabulary entry,
    ~60 bytes per hidden unit and layer)."""
    c = CONFIGS[name]["config"]
    vocab = c["vocab_size"] if CONFIGS[name]["family"] != "bert" else 0
    layers = layers_run(name, ready["layers"])[0]
    return (ready["rss_before"] + 12 * ready["params"]
            + batch * seq * (12 * vocab + 60 * c["hidden_size"] * layers))


def run_one(args, name, seq, threads, dtype):
    """Every backend on one config x seq x threads -> ({backend: result}, batch,
    schedule): processes taking turns (alternate), or one after another
    (sequential) where their estimated sum exceeds the memory available."""
    import multiprocessing as mp

    spawn = mp.get_context("spawn")
    os.environ["OMP_NUM_THREADS"] = str(threads)   # read by the spawned workers' OpenMP
    batch = args.batch or CONFIGS[name].get("batch", {}).get(seq, 1)
    cfg = {"config": name, "layers": args.layers, "seq": seq, "batch": batch, "dtype": dtype,
           "threads": threads, "steps": args.steps, "profile_steps": args.profile_steps,
           "lr": args.lr or CONFIGS[name].get("lr", 3e-4), "seed": args.seed,
           "attn_precision": args.attn_precision, "adamw": args.adamw, "packed": args.packed}
    workers, results, hashes = {}, {}, {}
    tag = f"{name} seq {seq} {threads}t"

    def start(b):
        here, there = spawn.Pipe()
        proc = spawn.Process(target=worker_main, args=(there, dict(cfg, backend=b)), daemon=True)
        proc.start()
        there.close()
        workers[b] = (proc, here)
        msg = receive(here, proc)
        results[b] = dict(msg, records=[], layers=args.layers) if "ready" in msg else msg
        progress(f"{tag}: {b} " + (
            f"built ({msg['params'] / 1e6:.1f}M parameters, RSS {msg['rss_before'] / 2**30:.2f} GiB)"
            if "ready" in msg else status_line(msg)))
        for field in ("init_sha256", "data_sha256") if "ready" in msg else ():
            if hashes.setdefault(field, msg[field]) != msg[field]:
                sys.exit(f"train_model.py: {tag}: {b}'s {field} differs from the first backend's")
        return "ready" in msg

    def train(group):
        """The steps, the profiles and the end of the backends in group."""
        done, rnd = 0, 0
        alive = [b for b in group if "ready" in results[b]]
        while done < args.steps and alive:
            k = min(args.block, args.steps - done)
            for b in alive[rnd % len(alive):] + alive[:rnd % len(alive)]:
                proc, conn = workers[b]
                conn.send(("run", k))
                first = b == "sdpa-compile" and done == 0
                msg = receive(conn, proc, args.compile_timeout if first else None)
                if "records" in msg:
                    results[b]["records"] += msg["records"]
                else:
                    results[b] = msg
            alive = [b for b in alive if "ready" in results[b]]
            done, rnd = done + k, rnd + 1
            progress(f"{tag} step {done}/{args.steps}  " + " | ".join(
                f"{b} {seq * batch / results[b]['records'][-1]['seconds']:.0f} tok/s "
                f"loss {results[b]['records'][-1]['loss']:.3f}" for b in alive))
        # the profiled steps, taking turns as the timed ones; every one before any
        # worker exits (a process tearing down takes CPU)
        for i in range(args.profile_steps + 1):
            cmd = "profile" if i < args.profile_steps else "finish"
            ready = [b for b in alive if "ready" in results[b]]
            for b in ready[i % max(1, len(ready)):] + ready[:i % max(1, len(ready))]:
                proc, conn = workers[b]
                conn.send((cmd, None))
                msg = receive(conn, proc)
                if "error" in msg:
                    results[b] = msg
                    continue
                results[b].setdefault("profiles", []).extend([msg.pop("profile")] if
                                                             "profile" in msg else [])
                results[b].update(msg)
        for b in group:
            proc, conn = workers[b]
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
            conn.close()

    schedule, pending = args.schedule, list(args.backends)
    while pending and not start(pending[0]):     # the first that builds decides
        train([pending.pop(0)])
    if pending and schedule == "auto":
        need = len(pending) * worker_estimate(name, results[pending[0]], batch, seq)
        avail = mem_available()
        schedule = "alternate" if avail is None or need <= 0.9 * (
            avail + results[pending[0]]["rss_before"]) else "sequential"
        progress(f"{tag}: {len(pending)} workers need ~{need / 2**30:.1f} GiB, "
                 f"{'unknown' if avail is None else f'{avail / 2**30:.1f} GiB'} available: "
                 f"{schedule}")
    if schedule == "sequential":
        for i, b in enumerate(pending):
            if i:
                start(b)
            train([b])
    else:
        for b in pending[1:]:
            start(b)
        train(pending)
    for b, r in results.items():
        if "error" in r:
            progress(f"{tag}: {b} failed:\n{r['error']}")
    return results, batch, schedule


def status_line(r):
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    last = r["error"].strip().splitlines()[-1]
    return f"failed ({r.get('error_name')}): {last}"


def moving_average(xs, window):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def summarize(results, seq, batch, args):
    """Per-backend figures, the loss agreement and the breakdown check."""
    rows = {}
    for b, r in results.items():
        if "ready" not in r:
            rows[b] = {k: r[k] for k in ("skipped", "error", "error_name") if k in r}
            continue
        timed = r["records"][args.warmup:]
        losses = [x["loss"] for x in r["records"]]
        rows[b] = {
            "tokens_per_s": statistics.median(batch * seq / x["seconds"] for x in timed),
            "step_s": statistics.median(x["seconds"] for x in timed),
            "first_step_s": r["records"][0]["seconds"],
            "peak_rss_mib": r.get("peak_rss_trained", r["peak_rss"]) / 2**20,
            "peak_rss_with_profiler_mib": r["peak_rss"] / 2**20,
            "rss_before_mib": r["rss_before"] / 2**20,
            "losses": losses, "step_seconds": [x["seconds"] for x in r["records"]],
            "final_loss": losses[-1], "params": r["params"], "info": r["info"],
            "breakdown_ms": None, "breakdown_top": None, "profiled_step_s": None}
        profiles = r.get("profiles")
        if profiles:          # the median of each category over the profiled steps
            rows[b].update(
                breakdown_ms={c: statistics.median(p["breakdown_ms"][c] for p in profiles)
                              for c in CATEGORIES},
                breakdown_top=profiles[-1]["breakdown_top"],
                profiled_step_s=statistics.median(p["profiled_step_s"] for p in profiles),
                profiled_steps_ms=[p["breakdown_ms"] for p in profiles])
    ok = [b for b in rows if "losses" in rows[b]]
    agreement, check = {}, {}
    ref = "sdpa" if "sdpa" in ok else (ok[0] if ok else None)
    if ref:
        ref_ma = moving_average(rows[ref]["losses"], args.smooth)
        for b in (x for x in ok if x != ref):
            ma = moving_average(rows[b]["losses"], args.smooth)
            worst = max(abs(a - c) / abs(c) for a, c in zip(ma, ref_ma))
            agreement[b] = {"vs": ref, "max_rel_diff": worst, "ok": worst <= args.loss_rtol}
    base = rows.get("sdpa", {}).get("breakdown_ms")
    for b in (x for x in ok if x.startswith("tilegrad") and base and rows[x]["breakdown_ms"]):
        check[b] = {}
        replaced = replaced_categories(b, rows[b]["info"].get("replaced"))
        for c in (c for c in CHECKED if c not in replaced):
            mine, theirs = rows[b]["breakdown_ms"][c], base[c]
            share = theirs / (1e3 * rows["sdpa"]["profiled_step_s"])
            ratio = mine / theirs if theirs > 0 else None
            # below 1% of sdpa's step (a model without an LM head...): shown, not judged
            check[b][c] = {"ratio": ratio, "share_of_sdpa_step": share,
                           "ok": None if share < 0.01 else abs(ratio - 1) <= 0.05}
    return rows, agreement, check


def print_run(run, args):
    rows, agreement, check = run["backends"], run["loss_agreement"], run["breakdown_check"]
    params = next((r["params"] for r in rows.values() if "params" in r), 0)
    packed = run.get("packed")
    rows_are = f", packed with documents of {packed[0]}-{packed[1]} tokens" if packed else ""
    print(f"\n{run['config']}, seq {run['seq']}{rows_are}, batch {run['batch']}, {run['threads']} "
          f"threads ({params / 1e6:.1f}M parameters; processes: {run['schedule']})")
    print(f"{'backend':<13} {'tokens/s':>9} {'vs sdpa':>8} {'step s':>8} {'1st step s':>10} "
          f"{'peak RSS MiB':>12} {'RSS before':>10} {'final loss':>10}")
    sdpa = rows.get("sdpa", {}).get("tokens_per_s")
    for b, r in rows.items():
        if "losses" not in r:
            print(f"{b:<13} {status_line(r)}")
            continue
        speed = f"{r['tokens_per_s'] / sdpa:.2f}x" if sdpa else "-"
        print(f"{b:<13} {r['tokens_per_s']:>9.0f} {speed:>8} {r['step_s']:>8.3f} "
              f"{r['first_step_s']:>10.2f} {r['peak_rss_mib']:>12.0f} "
              f"{r['rss_before_mib']:>10.0f} {r['final_loss']:>10.4f}")
    for b, a in agreement.items():
        print(f"loss curve {b} vs {a['vs']}: max relative difference of the {args.smooth}-step "
              f"moving average {100 * a['max_rel_diff']:.2f}% "
              f"({'ok' if a['ok'] else 'FAIL'}, limit {100 * args.loss_rtol:g}%)")
    prof = [b for b, r in rows.items() if r.get("breakdown_ms")]
    if prof:
        print(f"where the time goes: self time of the traced ops in {args.profile_steps} "
              "profiled step(s), ms (% of the step)")
        print(f"{'category':<17}" + "".join(f"{b:>20}" for b in prof))
        for c in CATEGORIES:
            cells = ((rows[b]["breakdown_ms"][c], 1e3 * rows[b]["profiled_step_s"]) for b in prof)
            print(f"{c:<17}" + "".join(f"{ms:>12.1f} ({100 * ms / step:>3.0f}%)"
                                       for ms, step in cells))
        print(f"{'step (profiled)':<17}" + "".join(
            f"{1e3 * rows[b]['profiled_step_s']:>12.1f}{'':>7}" for b in prof))
    for b, cats in check.items():
        print(f"check {b} vs sdpa (not replaced, the same within 5%): " + ", ".join(
            f"{c} " + (f"{v['ratio']:.3f} " if v["ratio"] is not None else "- ")
            + ("PASS" if v["ok"] else "FAIL" if v["ok"] is not None else "(< 1% of the step)")
            for c, v in cats.items()))
    for b, r in rows.items():
        if "replaced" in r.get("info", {}):
            print(f"{b}: use_tilegrad_kernels replaced {r['info']['replaced']}")
        omp = r.get("info", {}).get("openmp")
        if omp:
            line = f"OpenMP {b}: torch -> {omp['torch']}"
            if "tilegrad" in omp:
                line += (f"; tilegrad -> {omp['tilegrad']} ("
                         f"{'one pool' if omp['one_pool'] else 'two pools: different files'})")
            resolved = {omp["torch"], omp.get("tilegrad", omp["torch"])}
            if set(omp["mapped"]) != resolved:
                line += f"; mapped: {', '.join(omp['mapped']) or 'none'}"
            print(line)


def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="the byte-level toy Llama (2 layers of hidden 256) at seq 512, 8 steps, "
                         "without sdpa-compile: the CI smoke test, under a minute on 2 cores")
    ap.add_argument("--configs", default=None,
                    help=f"comma list of {', '.join(CONFIGS)} (default: all but toy; --quick: toy)")
    ap.add_argument("--backends", default=None,
                    help=f"comma list of {', '.join(BACKENDS)} (default {','.join(DEFAULT_BACKENDS)})")
    ap.add_argument("--no-compile", action="store_true", help="leave sdpa-compile out")
    ap.add_argument("--compile-timeout", type=float, default=900,
                    help="seconds sdpa-compile's first step may take before it is skipped (900)")
    ap.add_argument("--seq", default=None, help="comma list of sequence lengths (default: per config)")
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per step (default 1; bert-base 32 at seq 128, 8 at 512)")
    ap.add_argument("--threads", default=str(os.cpu_count()),
                    help="comma list of thread counts (default: all CPUs)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers of every model (default: each config's reduction, or in full)")
    ap.add_argument("--steps", type=int, default=None, help="steps per backend (default 20; --quick 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the timings (2)")
    ap.add_argument("--schedule", default="auto", choices=("auto", "alternate", "sequential"),
                    help="backends' processes alive together, taking turns (alternate), or one "
                         "after another (sequential); auto: alternate where their estimated "
                         "peaks fit in the memory available (default)")
    ap.add_argument("--block", type=int, default=1, help="steps per turn (default 1)")
    ap.add_argument("--profile-steps", type=int, default=1,
                    help="profiled steps per backend after the timed ones, taking turns (median "
                         "per category; 0: none; default 1)")
    ap.add_argument("--attn-precision", "--tilegrad-precision", default="exact",
                    choices=("exact", "split", "bf16"),
                    help="tilegrad.transformers.register(attn_precision=): how tilegrad's bf16 "
                         "kernels multiply by P and dS (default exact)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bf16", "f32"),
                    help="bf16 autocast or float32 (default auto: bf16 where the CPU has a bf16 unit)")
    ap.add_argument("--lr", type=float, default=None,
                    help="AdamW learning rate (default 3e-4, bert-base 5e-5; --quick 1e-3)")
    ap.add_argument("--adamw", default="default", choices=("default", "foreach", "fused"),
                    help="AdamW's implementation: torch's default (on the CPU a loop over the "
                         "parameters), foreach=True or fused=True")
    ap.add_argument("--packed", default=None, metavar="LO-HI",
                    help="pack each row with documents of LO-HI tokens (uniform), position_ids "
                         "restarting per document and each document's first label -100, as "
                         "DataCollatorWithFlattening does; tilegrad-dense then gets "
                         "transformers' packed mask as a dense 4-D one (tilegrad without varlen)")
    ap.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    ap.add_argument("--smooth", type=int, default=None,
                    help="moving-average window of the loss check (default 5; --quick 3)")
    ap.add_argument("--loss-rtol", type=float, default=0.01,
                    help="allowed relative difference of the smoothed losses (default 0.01)")
    ap.add_argument("--json", default=None, help="write every figure to this file (the PNG beside it)")
    ap.add_argument("--png", default=None,
                    help="loss-curve plot (default: the --json path with .png, else train_model.png)")
    args = ap.parse_args(argv)

    q = args.quick
    args.configs = [c.strip() for c in (args.configs or ("toy" if q else ",".join(REAL))).split(",")
                    if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad or not args.configs:
        ap.error(f"--configs: names from {', '.join(CONFIGS)}")
    backends = args.backends or ",".join(b for b in DEFAULT_BACKENDS
                                         if not (q and b == "sdpa-compile"))
    args.backends = [b.strip() for b in backends.split(",") if b.strip()]
    if args.packed:
        try:
            lo, hi = (int(x) for x in args.packed.split("-"))
            if not 1 <= lo <= hi:
                raise ValueError
        except ValueError:
            ap.error(f"--packed {args.packed!r}: LO-HI with 1 <= LO <= HI, e.g. 256-512")
        args.packed = (lo, hi)
    if args.no_compile:
        args.backends = [b for b in args.backends if b != "sdpa-compile"]
    if any(b not in BACKENDS for b in args.backends) or not args.backends \
            or len(set(args.backends)) != len(args.backends):
        ap.error(f"--backends: a comma list of distinct names from {', '.join(BACKENDS)}")
    args.seq = int_list(args.seq) if args.seq else None
    args.threads = int_list(args.threads)
    args.steps = args.steps if args.steps is not None else (8 if q else 20)
    args.smooth = args.smooth if args.smooth is not None else (3 if q else 5)
    args.lr = args.lr if args.lr is not None else (1e-3 if q else None)
    if (args.seq and min(args.seq) < 2) or args.steps < 1 or (args.batch or 1) < 1 \
            or args.block < 1 or not args.threads or min(args.threads) < 1 or args.smooth < 1 \
            or args.profile_steps < 0 or (args.layers is not None and args.layers < 1):
        ap.error("--seq (>= 2), --steps, --batch, --block, --threads, --smooth, --layers must "
                 "be positive, --profile-steps >= 0")
    if not 0 <= args.warmup < args.steps:
        ap.error("--warmup must be >= 0 and below --steps")
    if not args.png:
        args.png = os.path.splitext(args.json)[0] + ".png" if args.json else "train_model.png"
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dtype != "auto":
        dtype, why = args.dtype, "--dtype"
    else:
        dtype = "bf16" if cpu_has_bf16_unit() else "f32"
        why = "auto: the CPU has a bf16 unit" if dtype == "bf16" else "auto: no bf16 unit"
    t0 = time.perf_counter()
    runs = []
    for name in args.configs:
        progress(describe(name, args.layers))
        limit = CONFIGS[name]["config"]["max_position_embeddings"]
        seqs = [x for x in args.seq or CONFIGS[name]["seq"] if x <= limit]
        if len(seqs) < len(args.seq or CONFIGS[name]["seq"]):
            progress(f"{name}: seq above its max_position_embeddings {limit} left out")
        for seq in seqs:
            for threads in args.threads:
                results, batch, schedule = run_one(args, name, seq, threads, dtype)
                rows, agreement, check = summarize(results, seq, batch, args)
                runs.append({"config": name, "seq": seq, "batch": batch, "threads": threads,
                             "packed": args.packed,
                             "schedule": schedule,
                             "backends": rows, "loss_agreement": agreement,
                             "breakdown_check": check})

    infos = [r["info"] for run in runs for r in run["backends"].values() if "info" in r]
    info = {}
    for other in infos:        # a tilegrad worker's info has the library's ISA
        info.update({k: v for k, v in other.items() if k != "openmp"})
    print(f"CPU {cpu_model()}; torch ISA {info.get('torch_isa')}; torch {info.get('torch')}; "
          f"transformers {info.get('transformers')}; OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}" + (
              f"; tilegrad ISA {info['tilegrad_isa']}, attn_precision {info['attn_precision']} "
              f"({info['tilegrad_lib']})" if "tilegrad_isa" in info else ""))
    print(f"dtype: {'bf16 autocast, f32 weights and AdamW' if dtype == 'bf16' else 'float32'} "
          f"({why}); {args.steps} steps ({args.warmup} warm-up), AdamW lr "
          f"{args.lr or 'per config (3e-4, bert-base 5e-5)'} ({args.adamw}), clip 1.0")
    for name in args.configs:
        print(describe(name, args.layers))
    for run in runs:
        print_run(run, args)
    ran = any("losses" in r for run in runs for r in run["backends"].values())
    png = plot(args.png, runs, args.smooth) if ran else None
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s")

    lenient = ("sdpa-compile", "eager")
    failed = any("error" in r for run in runs for b, r in run["backends"].items()
                 if b not in lenient)
    disagree = any(not a["ok"] for run in runs for b, a in run["loss_agreement"].items()
                   if b not in lenient)
    if args.json:
        report = {
            "cpu": cpu_model(), "machine": platform.machine(), "info": info,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "configs": {n: {"description": describe(n, args.layers),
                            "layers_run": layers_run(n, args.layers)[0],
                            "reduction": layers_run(n, args.layers)[1],
                            "layers_published": CONFIGS[n]["config"]["num_hidden_layers"],
                            "kwargs": config_kwargs(n, layers_run(n, args.layers)[0])}
                        for n in args.configs},
            "runs": runs, "dtype": dtype, "dtype_why": why, "threads": args.threads,
            "steps": args.steps, "warmup": args.warmup, "block": args.block,
            "profile_steps": args.profile_steps, "lr": args.lr, "adamw": args.adamw,
            "seed": args.seed,
            "smooth": args.smooth, "loss_rtol": args.loss_rtol,
            "attn_precision": args.attn_precision, "backends": args.backends, "png": png,
            "wall_s": wall, "ok": not failed and not disagree}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"json: {args.json}")
    return 1 if failed or disagree else 0


if __name__ == "__main__":
    sys.exit(main())
