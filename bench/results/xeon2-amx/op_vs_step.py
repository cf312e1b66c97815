#!/usr/bin/env python3
"""What the torch op's backward costs beyond the C step: autograd through
tilegrad.torch.attention (bf16 mode) against vs_torch.py's TilegradStep on
the same inputs, alternating, medians of PAIRS calls each, per shape.

  python op_vs_step.py THREADS PAIRS "B,H,Hkv,L,D,causal;..."
"""
import math
import os
import statistics
import sys
import time

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "python"))
import torch  # noqa: E402
import tilegrad.torch as tt  # noqa: E402
import vs_torch as V  # noqa: E402


def main():
    threads, pairs = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    print(f"{threads} threads, bf16 mode, {pairs} pairs: medians, ms")
    for spec in sys.argv[3].split(";"):
        B, H, Hkv, L, D, causal = map(int, spec.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
        ctx = V.capi.Context()
        ctx.threads, ctx.attn_precision = threads, "bf16"
        step = V.TilegradStep(ctx, q, k, v, do, causal, 1 / math.sqrt(D))
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = tt.attention(qq, kk, vv, causal=bool(causal), attn_precision="bf16", threads=threads)

        def op():
            torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True)

        step(), op()
        ts, to = [], []
        for _ in range(pairs):
            a = time.perf_counter()
            step()
            b = time.perf_counter()
            op()
            c = time.perf_counter()
            ts.append(b - a), to.append(c - b)
        ms, mo = statistics.median(ts) * 1e3, statistics.median(to) * 1e3
        print(f"{spec:20s} step {ms:8.3f}  op {mo:8.3f}  op / step {mo / ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
