#!/usr/bin/env python3
"""Train a Hugging Face Llama on the CPU: tilegrad's attention vs sdpa and eager.

What a user of transformers sees: a whole training step (forward, loss,
backward, gradient clipping, AdamW) of a Llama-style model built from a
LlamaConfig, with attn_implementation = "tilegrad" (registered by
`tilegrad.transformers`), "sdpa" or "eager"; nothing else differs.

  * Model: byte-level vocabulary (256 tokens, so no tokenizer download),
    GQA; the default is hidden 512, 8 layers, 8 query / 2 KV heads of 64,
    MLP 2048: 30.7M parameters. --quick: 2 layers of hidden 256 (2.1M).
  * Data: deterministic text (a seeded generator of English-like sentences
    with numbers and arithmetic, or --text FILE), cut into consecutive
    windows of --seq bytes; every backend gets the same batches and the same
    initial weights (both checked by SHA-256 of the bytes).
  * dtype: bf16 autocast (f32 weights, f32 AdamW: the master copy) where the
    CPU has a bf16 unit (x86 avx512_bf16 / amx_bf16, aarch64 bf16), float32
    elsewhere: PyTorch's faster dtype on each, as bench/vs_torch.py measures
    it. --dtype overrides; all backends run the same one.
  * Fairness: each backend trains in its own process (so its peak RSS is
    its own), all at --threads (torch.set_num_threads and OMP_NUM_THREADS,
    which tilegrad's OpenMP reads too); the processes take turns, --block
    steps at a time in an order that rotates every round, so drift of the
    machine's speed hits every backend alike.

Reported per backend and sequence length: tokens/s (median over the steps
after --warmup), the attention's share of the step (the attention function
timed in the forward by a wrapper, and in the backward between two identity
autograd nodes around it; median of the per-step shares), peak RSS
(ru_maxrss of the backend's process) and the RSS before training (model
built), final loss. The loss curves are overlaid in a PNG (matplotlib; skipped
with a note where it is missing) and must agree within bf16 noise: the
trailing moving average (window --smooth) of each backend's loss stays within
--loss-rtol (default 1%, relative) of sdpa's (or, without sdpa, the first
backend's) at every step. 1% is a few bf16 roundings of the loss (relative
spacing 2^-8 = 0.39%): the two stock backends, eager and sdpa, differed by
0.07% over 30 steps at seq 512 in bf16 (AMD EPYC, 2 threads), while a wrong
mask or gradient moves the curve by far more within a few steps (a causal
leak drops the loss at once). eager vs sdpa is printed as the yardstick. The
exit status is 1 where a backend disagrees or failed.

  python bench/train_model.py --quick --threads 2
  python bench/train_model.py --seq 2048,4096 --threads 16 --json train-16t.json  # + .png
"""
import argparse
import hashlib
import json
import os
import platform
import random
import statistics
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("tilegrad", "sdpa", "eager")

# (hidden, layers, heads, kv heads, MLP width): head dim = hidden / heads.
DEFAULT_MODEL = (512, 8, 8, 2, 2048)
QUICK_MODEL = (256, 2, 4, 2, 1024)


# ----------------------------------------------------------------- the data

WORDS = {
    "name": "Ada Bram Cleo Dara Emil Fenn Gala Hugo Iris Jude Kira Lars Mona Nils Oona Per".split(),
    "noun": ("kernel tile thread cache buffer matrix vector head query key value gradient "
             "batch token layer model loop stride block lane register queue").split(),
    "adj": "small large fast slow warm cold even odd dense sparse exact wide narrow".split(),
    "verb": "reads writes sums scales copies splits moves sorts checks loads stores packs".split(),
    "place": "the first row|the last column|each tile|the shared cache|every lane|the next block".split("|"),
}


def sentence(rng):
    """One line: a templated sentence, a sum, or a count; all learnable."""
    kind = rng.random()
    if kind < 0.55:
        return (f"{rng.choice(WORDS['name'])} {rng.choice(WORDS['verb'])} the "
                f"{rng.choice(WORDS['adj'])} {rng.choice(WORDS['noun'])} in "
                f"{rng.choice(WORDS['place'])}.")
    if kind < 0.8:
        a, b = rng.randrange(1000), rng.randrange(1000)
        return f"{a} + {b} = {a + b}"
    noun = rng.choice(WORDS["noun"])
    n = rng.randrange(2, 9)
    return f"The {noun}s: " + ", ".join(f"{noun} {i}" for i in range(1, n + 1)) + "."


def generated_text(nbytes, seed):
    """At least nbytes of deterministic text (paragraphs of sentences)."""
    rng, parts, size = random.Random(seed), [], 0
    while size < nbytes:
        para = " ".join(sentence(rng) for _ in range(rng.randrange(3, 8))) + "\n\n"
        parts.append(para)
        size += len(para)
    return "".join(parts).encode("ascii")


def token_stream(nbytes, seed, text_file):
    """nbytes byte tokens: the file (repeated as needed) or generated text."""
    if text_file:
        with open(text_file, "rb") as f:
            data = f.read()
        if not data:
            raise ValueError(f"{text_file} is empty")
        return (data * (nbytes // len(data) + 1))[:nbytes]
    return generated_text(nbytes, seed)[:nbytes]


# ----------------------------------------------------- the machine and dtype

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model Name")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_has_bf16_unit():
    """x86: avx512_bf16 or amx_bf16; aarch64: bf16 (FEAT_BF16). Linux only;
    elsewhere False (float32)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def pick_dtype(requested):
    if requested != "auto":
        return requested, "--dtype"
    if cpu_has_bf16_unit():
        return "bf16", "auto: the CPU has a bf16 unit"
    return "f32", "auto: no bf16 unit on this CPU"


# --------------------------------------------------------------- the worker

def worker_main(conn, cfg):
    """One backend's process: build, then train --block steps per request."""
    try:
        _worker(conn, cfg)
    except BaseException:  # the parent reports it and goes on with the others
        conn.send({"error": traceback.format_exc()})
    finally:
        conn.close()


def _worker(conn, cfg):
    import resource
    from contextlib import nullcontext

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama import modeling_llama

    backend = cfg["backend"]
    torch.set_num_threads(cfg["threads"])
    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "isa": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    if backend == "tilegrad":
        sys.path.insert(0, os.path.join(REPO, "python"))
        import tilegrad
        import tilegrad.transformers
        tilegrad.transformers.register(attn_precision=cfg["tilegrad_precision"])
        info["tilegrad_precision"] = cfg["tilegrad_precision"]
        info["tilegrad_isa"] = tilegrad.Context().isa
        info["tilegrad_lib"] = tilegrad.library().path

    hidden, layers, heads, kv_heads, mlp = cfg["model"]
    config = LlamaConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=cfg["seq"], tie_word_embeddings=False, use_cache=False,
        attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(cfg["seed"])
    model = AutoModelForCausalLM.from_config(config, attn_implementation=backend,
                                             dtype=torch.float32)
    if model.config._attn_implementation != backend:
        raise RuntimeError(f"transformers runs {model.config._attn_implementation!r}, "
                           f"not {backend!r}")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    init_hash = hashlib.sha256()
    for _, p in sorted(model.state_dict().items()):
        init_hash.update(p.detach().contiguous().numpy().tobytes())

    # Tokens: steps x batch windows of seq bytes, the same for every backend.
    per_step = cfg["batch"] * cfg["seq"]
    stream = token_stream(cfg["steps"] * per_step, cfg["seed"], cfg["text"])
    tokens = torch.frombuffer(bytearray(stream), dtype=torch.uint8).long()
    tokens = tokens.view(cfg["steps"], cfg["batch"], cfg["seq"])

    clock = AttentionClock(torch)
    plain = ALL_ATTENTION_FUNCTIONS.get_interface(backend, modeling_llama.eager_attention_forward)
    ALL_ATTENTION_FUNCTIONS[backend] = clock.wrap(plain)  # this process's mapping only

    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if cfg["dtype"] == "bf16"
                else nullcontext())
    rss_unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes vs KiB

    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * rss_unit

    conn.send({"ready": True, "info": info, "init_sha256": init_hash.hexdigest(),
               "data_sha256": hashlib.sha256(stream).hexdigest(),
               "params": sum(p.numel() for p in params), "rss_before": peak_rss()})
    step = 0
    while True:
        cmd, arg = conn.recv()
        if cmd == "finish":
            conn.send({"peak_rss": peak_rss()})
            return
        records = []
        for _ in range(arg):
            batch = tokens[step]
            clock.reset()
            t0 = time.perf_counter()
            with autocast:
                loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - t0
            records.append({"step": step, "loss": loss.item(), "seconds": seconds,
                            "attn_fwd": clock.fwd, "attn_bwd": clock.bwd})
            step += 1
        conn.send({"records": records})


class AttentionClock:
    """Times an attention function, forward and backward, in a training step.

    Forward: perf_counter around the call. Backward: an identity autograd
    node after the attention (its backward runs first: the clock starts) and
    one before it on (q, k, v) (its backward runs once dq, dk, dv are all
    done: the clock stops). CPU autograd runs one node at a time on the
    calling thread, and nothing else in a Llama layer is ready between the two
    (the residual's gradient waits for the attention's), so the span is the
    attention's backward. All backends get the same wrapper."""

    def __init__(self, torch):
        self.fwd = self.bwd = 0.0
        self._bwd_start = None
        clock = self

        class AfterAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, out):
                return out

            @staticmethod
            def backward(ctx, grad):
                if clock._bwd_start is not None:
                    raise RuntimeError("two attention backwards overlap: the clock cannot time them")
                clock._bwd_start = time.perf_counter()
                return grad

        class BeforeAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                return q, k, v

            @staticmethod
            def backward(ctx, dq, dk, dv):
                clock.bwd += time.perf_counter() - clock._bwd_start
                clock._bwd_start = None
                return dq, dk, dv

        self._after, self._before = AfterAttention.apply, BeforeAttention.apply

    def reset(self):
        self.fwd = self.bwd = 0.0

    def wrap(self, attention):
        def timed_attention(module, query, key, value, attention_mask, **kwargs):
            query, key, value = self._before(query, key, value)
            t0 = time.perf_counter()
            out, weights = attention(module, query, key, value, attention_mask, **kwargs)
            self.fwd += time.perf_counter() - t0
            return self._after(out), weights
        return timed_attention


# --------------------------------------------------------------- the parent

def run_seq(args, seq, model_shape, dtype):
    """Train every backend at one sequence length, turn by turn; returns
    {backend: result dict}."""
    import multiprocessing as mp

    spawn = mp.get_context("spawn")
    cfg = {"seq": seq, "model": model_shape, "dtype": dtype, "threads": args.threads,
           "steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed,
           "text": args.text, "tilegrad_precision": args.tilegrad_precision}
    workers = {}
    for name in args.backends:
        here, there = spawn.Pipe()
        proc = spawn.Process(target=worker_main, args=(there, dict(cfg, backend=name)),
                             daemon=True)
        proc.start()
        there.close()
        workers[name] = (proc, here)
    results = {}
    for name, (proc, conn) in workers.items():
        msg = receive(conn, proc)
        results[name] = msg if "error" in msg else dict(msg, records=[])
    alive = [n for n in args.backends if "error" not in results[n]]
    for field in ("init_sha256", "data_sha256"):
        values = {results[n][field] for n in alive}
        if len(values) > 1:
            sys.exit(f"train_model.py: the backends' {field} differ: {values}")
    if alive:
        r = results[alive[0]]
        progress(f"seq {seq}: {r['params'] / 1e6:.1f}M parameters, {dtype}, "
                 f"{args.threads} threads, {', '.join(alive)} take turns of {args.block} step(s)")
    done, rnd = 0, 0
    while done < args.steps and alive:
        k = min(args.block, args.steps - done)
        order = alive[rnd % len(alive):] + alive[:rnd % len(alive)]
        for name in order:
            proc, conn = workers[name]
            conn.send(("run", k))
            msg = receive(conn, proc)
            if "error" in msg:
                results[name] = msg
            else:
                results[name]["records"] += msg["records"]
        alive = [n for n in alive if "error" not in results[n]]
        done += k
        rnd += 1
        progress(f"seq {seq} step {done}/{args.steps}  " + " | ".join(
            f"{n} {seq * args.batch / results[n]['records'][-1]['seconds']:.0f} tok/s "
            f"loss {results[n]['records'][-1]['loss']:.3f}" for n in alive))
    for name in alive:
        proc, conn = workers[name]
        conn.send(("finish", None))
        results[name].update(receive(conn, proc))
    for proc, conn in workers.values():
        proc.join(timeout=30)
        conn.close()
    for name in args.backends:
        if "error" in results[name]:
            progress(f"seq {seq}: {name} failed:\n{results[name]['error']}")
    return results


def receive(conn, proc):
    """The worker's next message, or an error if it died without one."""
    try:
        return conn.recv()
    except EOFError:
        proc.join(timeout=5)
        return {"error": f"the worker exited with status {proc.exitcode} (out of memory?)"}


def progress(line):
    print(line, file=sys.stderr, flush=True)


def moving_average(xs, window):
    """Trailing mean of the last `window` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def summarize(results, seq, batch, warmup, smooth, rtol):
    """Per-backend figures and the loss agreement, from the raw records."""
    rows = {}
    for name, r in results.items():
        if "error" in r:
            rows[name] = {"error": r["error"]}
            continue
        timed = r["records"][warmup:]
        losses = [x["loss"] for x in r["records"]]
        rows[name] = {
            "tokens_per_s": statistics.median(batch * seq / x["seconds"] for x in timed),
            "step_s": statistics.median(x["seconds"] for x in timed),
            "attn_share": statistics.median((x["attn_fwd"] + x["attn_bwd"]) / x["seconds"]
                                            for x in timed),
            "attn_fwd_s": statistics.median(x["attn_fwd"] for x in timed),
            "attn_bwd_s": statistics.median(x["attn_bwd"] for x in timed),
            "peak_rss_mib": r["peak_rss"] / 2**20, "rss_before_mib": r["rss_before"] / 2**20,
            "final_loss": losses[-1], "final_loss_smoothed": moving_average(losses, smooth)[-1],
            "losses": losses, "step_seconds": [x["seconds"] for x in r["records"]],
            "attn_seconds": [x["attn_fwd"] + x["attn_bwd"] for x in r["records"]],
            "params": r["params"], "info": r["info"]}
    ok = [n for n in rows if "error" not in rows[n]]
    agreement = {}
    if len(ok) > 1:
        ref = "sdpa" if "sdpa" in ok else ok[0]
        ref_ma = moving_average(rows[ref]["losses"], smooth)
        for name in (n for n in ok if n != ref):
            ma = moving_average(rows[name]["losses"], smooth)
            worst = max(abs(a - b) / abs(b) for a, b in zip(ma, ref_ma))
            agreement[name] = {"vs": ref, "max_rel_diff": worst, "ok": worst <= rtol}
    return rows, agreement


def print_table(seq, rows, agreement, rtol, smooth):
    print(f"\nseq {seq}")
    print(f"{'backend':<9} {'tokens/s':>9} {'vs sdpa':>8} {'step s':>8} {'attn share':>10} "
          f"{'attn fwd s':>10} {'attn bwd s':>10} {'peak RSS MiB':>12} {'RSS before':>10} "
          f"{'final loss':>10}")
    sdpa = rows.get("sdpa", {}).get("tokens_per_s")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<9} failed: {r['error'].strip().splitlines()[-1]}")
            continue
        speed = f"{r['tokens_per_s'] / sdpa:.2f}x" if sdpa else "-"
        print(f"{name:<9} {r['tokens_per_s']:>9.0f} {speed:>8} {r['step_s']:>8.3f} "
              f"{100 * r['attn_share']:>9.1f}% {r['attn_fwd_s']:>10.3f} {r['attn_bwd_s']:>10.3f} "
              f"{r['peak_rss_mib']:>12.0f} {r['rss_before_mib']:>10.0f} {r['final_loss']:>10.4f}")
    for name, a in agreement.items():
        print(f"loss curve {name} vs {a['vs']}: max relative difference of the {smooth}-step "
              f"moving average {100 * a['max_rel_diff']:.2f}% "
              f"({'ok' if a['ok'] else 'FAIL'}, limit {100 * rtol:g}%)")


def plot(path, per_seq, smooth):
    """The loss curves, one panel per seq; a line style per backend, so that
    curves lying on each other stay visible."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(f"matplotlib is not importable: no PNG ({path})")
        return None
    fig, axes = plt.subplots(1, len(per_seq), figsize=(6 * len(per_seq), 4), squeeze=False)
    for ax, (seq, rows) in zip(axes[0], per_seq.items()):
        for i, (name, r) in enumerate(x for x in rows.items() if "error" not in x[1]):
            ax.plot(r["losses"], color=f"C{i}", linestyle=("-", "--", ":")[i % 3],
                    linewidth=2.5 - 0.7 * i, label=name)
        ax.set_title(f"seq {seq} (the check: {smooth}-step moving averages)")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("loss (nats/byte)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"loss curves: {path}")
    return path


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a 2-layer model of 2.1M at seq 1024 for 12 steps: about a minute on 2 cores")
    ap.add_argument("--seq", default=None,
                    help="comma list of sequence lengths (default 2048,4096; --quick 1024)")
    ap.add_argument("--steps", type=int, default=None, help="steps per backend (default 20; --quick 12)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="first steps left out of the timings (default 2)")
    ap.add_argument("--block", type=int, default=1, help="steps per turn (default 1)")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help="comma list of tilegrad, sdpa, eager (default all three)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads (default: all CPUs)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bf16", "f32"),
                    help="bf16 autocast or float32 (default auto: bf16 where the CPU has a bf16 unit)")
    ap.add_argument("--tilegrad-precision", default="exact", choices=("exact", "split", "bf16"),
                    help="tilegrad.transformers.register(attn_precision=): how tilegrad's bf16 "
                    "kernels multiply by P and dS (default exact)")
    ap.add_argument("--model", default=None,
                    help="hidden,layers,heads,kv_heads,mlp (default %s; --quick %s)"
                    % (",".join(map(str, DEFAULT_MODEL)), ",".join(map(str, QUICK_MODEL))))
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=0, help="weights and text seed (default 0)")
    ap.add_argument("--text", default=None, help="train on this file's bytes instead of generated text")
    ap.add_argument("--smooth", type=int, default=None,
                    help="moving-average window of the loss check (default 5; --quick 3)")
    ap.add_argument("--loss-rtol", type=float, default=0.01,
                    help="allowed relative difference of the smoothed losses (default 0.01)")
    ap.add_argument("--png", default=None,
                    help="loss-curve plot (default: the --json path with .png, else train_model.png)")
    ap.add_argument("--json", default=None, help="write every figure and loss to this file")
    args = ap.parse_args(argv)

    quick = args.quick
    args.seq = [int(s) for s in (args.seq or ("1024" if quick else "2048,4096")).split(",")]
    args.steps = args.steps if args.steps is not None else (12 if quick else 20)
    args.warmup = args.warmup if args.warmup is not None else 2
    args.smooth = args.smooth if args.smooth is not None else (3 if quick else 5)
    model = args.model.split(",") if args.model else (QUICK_MODEL if quick else DEFAULT_MODEL)
    args.model = tuple(int(x) for x in model)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad or not args.backends or len(set(args.backends)) != len(args.backends):
        ap.error(f"--backends: a comma list of distinct names from {', '.join(BACKENDS)}")
    if len(args.model) != 5 or args.model[0] % args.model[2] or args.model[2] % args.model[3] \
            or (args.model[0] // args.model[2]) % 2:
        ap.error("--model: hidden,layers,heads,kv_heads,mlp with heads | hidden, kv_heads | heads "
                 "and an even head dim (rotary embeddings)")
    if min(args.seq) < 2 or args.steps < 1 or args.batch < 1 or args.block < 1 \
            or args.threads < 1 or args.smooth < 1:
        ap.error("--seq (>= 2), --steps, --batch, --block, --threads and --smooth must be positive")
    if not 0 <= args.warmup < args.steps:
        ap.error("--warmup must be >= 0 and below --steps")
    if args.text and not os.path.isfile(args.text):
        ap.error(f"--text {args.text}: no such file")
    if not args.png:
        args.png = os.path.splitext(args.json)[0] + ".png" if args.json else "train_model.png"
    return args


def main(argv=None):
    args = parse_args(argv)
    # Before any worker starts: torch's and tilegrad's OpenMP both read it.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    dtype, why = pick_dtype(args.dtype)
    t0 = time.perf_counter()
    per_seq, agreements, report = {}, {}, {"seqs": {}}
    for seq in args.seq:
        results = run_seq(args, seq, args.model, dtype)
        rows, agreement = summarize(results, seq, args.batch, args.warmup, args.smooth,
                                    args.loss_rtol)
        per_seq[seq], agreements[seq] = rows, agreement
        report["seqs"][str(seq)] = {"backends": rows, "loss_agreement": agreement}

    infos = [r["info"] for rows in per_seq.values() for r in rows.values() if "error" not in r]
    info = dict(infos[0]) if infos else {}
    for other in infos:  # the tilegrad worker's info has the library's ISA
        info.update(other)
    params = next((r["params"] for rows in per_seq.values() for r in rows.values()
                   if "error" not in r), 0)
    hidden, layers, heads, kv_heads, mlp = args.model
    print(f"CPU {cpu_model()}; torch ISA {info.get('isa')}; {info.get('threads')} threads "
          f"(OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}); "
          f"torch {info.get('torch')}; transformers {info.get('transformers')}"
          + (f"; tilegrad ISA {info['tilegrad_isa']}, attn_precision "
             f"{info['tilegrad_precision']} ({info['tilegrad_lib']})"
             if "tilegrad_isa" in info else ""))
    print(f"model: Llama, hidden {hidden}, {layers} layers, {heads} heads / {kv_heads} KV heads "
          f"of {hidden // heads}, MLP {mlp}, vocab 256 (bytes): {params / 1e6:.1f}M parameters; "
          f"batch {args.batch}; {args.steps} steps ({args.warmup} warm-up); AdamW lr {args.lr}")
    print(f"dtype: {'bf16 autocast, f32 weights and AdamW' if dtype == 'bf16' else 'float32'} ({why})")
    print(f"data: {'bytes of ' + args.text if args.text else 'generated text, seed %d' % args.seed}")
    for seq in args.seq:
        print_table(seq, per_seq[seq], agreements[seq], args.loss_rtol, args.smooth)
    ran = any("error" not in r for rows in per_seq.values() for r in rows.values())
    png = plot(args.png, per_seq, args.smooth) if ran else None
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s")

    failed = any("error" in r for rows in per_seq.values() for r in rows.values())
    disagree = any(not a["ok"] for ag in agreements.values() for a in ag.values())
    if args.json:
        report.update({
            "cpu": cpu_model(), "machine": platform.machine(), "info": info,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "model": {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads,
                      "mlp": mlp, "vocab": 256, "params": params},
            "dtype": dtype, "dtype_why": why, "threads": args.threads, "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "block": args.block, "lr": args.lr,
            "seed": args.seed, "text": args.text, "smooth": args.smooth,
            "tilegrad_precision": args.tilegrad_precision,
            "loss_rtol": args.loss_rtol, "png": png, "wall_s": wall,
            "ok": not failed and not disagree})
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"json: {args.json}")
    return 1 if failed or disagree else 0


if __name__ == "__main__":
    sys.exit(main())
