#!/usr/bin/env python3
"""tilegrad.torch.attention as a model calls it, whole: a forward +
backward (autograd.grad) and a forward under no_grad, bf16 tensors, bf16
mode; medians of PAIRS calls each, per shape, microseconds. The package is
the first `tilegrad` on PYTHONPATH (run it against two trees, alternating
processes, for a before/after).

  PYTHONPATH=TREE/python python attention_call.py THREADS PAIRS "B,H,Hkv,L,D,causal;..."
"""
import statistics
import sys
import time

import torch
import tilegrad.torch as tt


def main():
    threads, pairs = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    for spec in sys.argv[3].split(";"):
        B, H, Hkv, L, D, causal = map(int, spec.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
        q, k, v = (t.requires_grad_() for t in (q, k, v))

        def step():
            o = tt.attention(q, k, v, causal=bool(causal), attn_precision="bf16")
            torch.autograd.grad(o, (q, k, v), do)

        def forward():
            with torch.no_grad():
                tt.attention(q, k, v, causal=bool(causal), attn_precision="bf16")

        times = {step: [], forward: []}
        step(), forward()
        for _ in range(pairs):
            for f, ts in times.items():
                a = time.perf_counter()
                f()
                ts.append(time.perf_counter() - a)
        m = [statistics.median(ts) * 1e6 for ts in times.values()]
        print(f"{spec} {m[0]:.1f} {m[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
