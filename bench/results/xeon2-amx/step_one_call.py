#!/usr/bin/env python3
"""The backward step in one call against the three calls it replaces, paired:
tg_attn_train_bwd_step with bf16 gradients vs tg_attn_train_bwd_compute_d +
tg_attn_train_bwd (TG_ATTN_OPT_DKV_WRITE) + three tg_f32_to_bf16_cast, the
two alternating call by call in one process on one context; the median of
the per-pair time ratios (step / three), per shape. Also checks that the
two give the same bits.

  python step_one_call.py THREADS PAIRS PRECISION "B,H,Hkv,L,D,causal;..."
"""
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import vs_torch as V  # noqa: E402


def main():
    threads, pairs, prec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(threads)
    print(f"{threads} threads, {prec} mode, {pairs} pairs: medians, ms; ratio = step / three calls")
    for spec in sys.argv[4].split(";"):
        B, H, Hkv, L, D, causal = map(int, spec.split(","))
        ctx = V.capi.Context()
        ctx.threads, ctx.attn_precision = threads, prec
        g = torch.Generator().manual_seed(1)
        q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
        s = V.TilegradStep(ctx, q, k, v, do, causal, 1 / math.sqrt(D))
        one = [np.empty(a.shape, np.uint16) for a in s.grads]

        def three():
            ctx.call("tg_flash_attn_train_bwd_compute_d_bf16", s.o, s.do, s.Dv, B, H, L, D)
            ctx.call("tg_attn_train_bwd", V.BF16, s.q, s.k, s.v, s.L, s.do, s.Dv, s.dq, s.dk,
                     s.dv, s.p, None, None, s.causal, s.opt)
            for src, dst in zip((s.dq, s.dk, s.dv), s.grads):
                ctx.call("tg_f32_to_bf16_cast", src, dst, src.size)

        def step():
            ctx.call("tg_attn_train_bwd_step", V.BF16, V.BF16, s.q, s.k, s.v, s.o, s.L, s.do,
                     one[0], one[1], one[2], s.p, None, None, s.causal, None)

        three(), step()
        same = all(np.array_equal(a, b) for a, b in zip(s.grads, one))
        t3, t1, r = [], [], []
        for _ in range(pairs):
            a = time.perf_counter()
            three()
            b = time.perf_counter()
            step()
            c = time.perf_counter()
            t3.append(b - a), t1.append(c - b), r.append((c - b) / (b - a))
        print(f"{spec:20s} three {statistics.median(t3) * 1e3:8.3f}  step "
              f"{statistics.median(t1) * 1e3:8.3f}  ratio {statistics.median(r):.3f}  "
              f"same bits {same}", flush=True)


if __name__ == "__main__":
    main()
