#!/usr/bin/env python3
"""What vs_torch.py's 50 ms pause between contenders does to short calls.

The forward of a shape, tilegrad (bf16 mode) and PyTorch SDPA bf16, after
10 untimed calls of each, timed three ways, 40 runs each, every timed call right after an untimed one of the
same side: each side alone; alternating back to back; alternating with a
50 ms sleep before each side's untimed call (vs_torch.py until it gained
pause_between_contenders). Prints min / median / p90 in ms and the OpenMP
runtimes the process has mapped.

  TILEGRAD_LIB=$PWD/build/libtilegrad.so python bench/results/xeon2-amx/pause_noise.py 1,6,2,384,128,0
"""
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import vs_torch as V  # noqa: E402
import torch  # noqa: E402

THREADS, RUNS = 2, 40


def stats(ts):
    ts = sorted(ts)
    return f"min {ts[0]:6.3f} med {ts[len(ts) // 2]:6.3f} p90 {ts[9 * len(ts) // 10]:6.3f}"


def main():
    B, H, Hkv, L, D, causal = map(int, sys.argv[1].split(","))
    torch.set_num_threads(THREADS)
    ctx = V.capi.Context()
    ctx.threads, ctx.attn_precision = THREADS, "bf16"
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
    ours = V.TilegradStep(ctx, q, k, v, do, causal, 1 / math.sqrt(D)).forward
    theirs = V.TorchForward(q, k, v, causal, 1 / math.sqrt(D), torch.bfloat16)
    print(f"{sys.argv[1]} forward, {THREADS} threads; OpenMP runtimes: {V.openmp_runtimes()}")
    for _ in range(10):  # warm-up: PyTorch's first calls of a shape run slower
        theirs(), ours()
    for mode in ("alone", "back to back", "50 ms pause"):
        t_ours, t_theirs = [], []
        for side, times in ((theirs, t_theirs), (ours, t_ours)):
            if mode != "alone":
                continue
            for _ in range(RUNS):
                side()
                times.append(V.timed(side))
        if mode != "alone":
            pause = 0.05 if mode == "50 ms pause" else 0.0
            for _ in range(RUNS):
                for side, times in ((theirs, t_theirs), (ours, t_ours)):
                    time.sleep(pause)
                    side()
                    times.append(V.timed(side))
        print(f"  {mode:13s} tilegrad {stats(t_ours)} | torch {stats(t_theirs)} | "
              f"median ratio {sorted(t_theirs)[RUNS // 2] / sorted(t_ours)[RUNS // 2]:.2f}x")


if __name__ == "__main__":
    main()
