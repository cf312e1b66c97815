#!/usr/bin/env python3
"""The parts of vs_torch.py's tilegrad step, timed apart: compute_d, the
backward (dK, dV written), the three f32 -> bf16 casts, and the whole step;
medians of 15 calls each, bf16 mode, per shape and thread count.

  python step_parts.py THREADS "B,H,Hkv,L,D,causal;..."
"""
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import vs_torch as V  # noqa: E402
import torch  # noqa: E402


def main():
    threads = int(sys.argv[1])
    torch.set_num_threads(threads)
    ctx = V.capi.Context()
    ctx.threads, ctx.attn_precision = threads, "bf16"
    print(f"{threads} threads, bf16 mode: medians of 15 calls, ms")
    for spec in sys.argv[2].split(";"):
        B, H, Hkv, L, D, causal = map(int, spec.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
        s = V.TilegradStep(ctx, q, k, v, do, causal, 1 / math.sqrt(D))

        def compute_d():
            ctx.call("tg_flash_attn_train_bwd_compute_d_bf16", s.o, s.do, s.Dv, B, H, L, D)

        def bwd():
            ctx.call("tg_attn_train_bwd", V.BF16, s.q, s.k, s.v, s.L, s.do, s.Dv, s.dq, s.dk,
                     s.dv, s.p, None, None, s.causal, s.opt)

        def casts():
            for src, dst in zip((s.dq, s.dk, s.dv), s.grads):
                ctx.call("tg_f32_to_bf16_cast", src, dst, src.size)

        parts = {}
        for name, f in (("compute_d", compute_d), ("bwd", bwd), ("casts", casts), ("step", s)):
            f()
            parts[name] = statistics.median(V.timed(f) for _ in range(15))
        share = (parts["compute_d"] + parts["casts"]) / parts["step"]
        print(f"{spec:20s} " + " ".join(f"{n} {t:8.3f}" for n, t in parts.items()) +
              f"   compute_d + casts {100 * share:4.1f}% of the step")


if __name__ == "__main__":
    main()
