#!/usr/bin/env python3
"""Time and peak memory of tilegrad.torch.linear_cross_entropy (the fused,
chunked LM head + loss) against the unfused F.linear + F.cross_entropy(
logits.float()) forward + backward, on random inputs of an LM head's shape.

Each measurement runs in a fresh child process (so each one's peak RSS is
its own): the child builds hidden [T, H], weight [V, H] (float32 leaves;
bf16 under autocast with --dtype bf16, as a model's step), runs one warm-up
step and --steps timed steps, and reports the median step time and the
peak RSS above what it held before its first step (the inputs). Children
of the two modes alternate (--runs rounds), and the medians over rounds are
printed. --chunks sweeps the fused path's chunk size instead (the
measurement behind _CHUNK_* in python/tilegrad/_torch_lce.py).

  TILEGRAD_LIB=build/libtilegrad.so python bench/lce_bench.py --T 2048 --dtype bf16
  python bench/lce_bench.py --T 2048 --vocab 32000 --hidden 2048 --chunks 128,256,512,1024
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(a):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import torch
    import torch.nn.functional as F
    import tilegrad.torch as tt
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.T, a.hidden, generator=g).requires_grad_(True)
    w = (torch.randn(a.vocab, a.hidden, generator=g) / a.hidden ** 0.5).requires_grad_(True)
    y = torch.randint(0, a.vocab, (a.T,), generator=g)
    y[:: 10] = -100

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            if a.child == "fused":
                loss = tt.linear_cross_entropy(h, w, y, chunk_size=a.chunk or None)
            else:
                loss = F.cross_entropy(F.linear(h, w).float(), y)
        loss.backward()
        h.grad = w.grad = None
        return float(loss)

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for i in range(1 + a.steps):
        t0 = time.perf_counter()
        step()
        if i:
            times.append(time.perf_counter() - t0)
        if i == 0:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"time": statistics.median(times), "peak_mib": peak / 1024}))


def run_child(a, mode, chunk=0):
    cmd = [sys.executable, __file__, "--child", mode, "--T", str(a.T), "--hidden",
           str(a.hidden), "--vocab", str(a.vocab), "--dtype", a.dtype, "--threads",
           str(a.threads), "--steps", str(a.steps), "--chunk", str(chunk)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--T", type=int, default=2048, help="tokens (default 2048)")
    p.add_argument("--hidden", type=int, default=896, help="H (default 896, Qwen2.5-0.5B)")
    p.add_argument("--vocab", type=int, default=151936, help="V (default 151936, Qwen2.5)")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16",
                   help="bf16: float32 leaves under bf16 autocast (default); f32: float32")
    p.add_argument("--threads", type=int, default=2, help="torch and tilegrad threads")
    p.add_argument("--runs", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per child (default 2)")
    p.add_argument("--chunks", default="", help="comma list: sweep the fused chunk size")
    p.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    modes = [("fused", int(c)) for c in a.chunks.split(",")] if a.chunks else \
        [("unfused", 0), ("fused", 0)]
    res = {m: [] for m in modes}
    for _ in range(a.runs):
        for m in modes:
            res[m].append(run_child(a, *m))
    print(f"T={a.T} H={a.hidden} V={a.vocab} dtype={a.dtype} threads={a.threads} "
          f"runs={a.runs} steps={a.steps} (medians of alternating child processes)")
    for (mode, chunk), rs in res.items():
        t = statistics.median(r["time"] for r in rs)
        m = statistics.median(r["peak_mib"] for r in rs)
        name = mode + (f" chunk={chunk}" if chunk else "")
        print(f"  {name:<18} fwd+bwd {t * 1e3:9.1f} ms   peak RSS above inputs {m:8.0f} MiB")


if __name__ == "__main__":
    main()
