#!/usr/bin/env python3
r"""What a call of tilegrad.torch.attention costs around its kernels: a
forward + backward (autograd.grad) and a forward alone (no_grad) through the
autograd Functions that eager calls take (tilegrad.torch._direct) and
through the torch.library custom ops (the path before, still the one that
torch.compile, export and fake tensors take), with PyTorch's SDPA beside
them; bf16 tensors, bf16 mode, alternating call by call (the two paths
swap places every round), medians of PAIRS rounds, microseconds.

  python bench/op_overhead.py --threads 2 --pairs 41 --shapes \
      "1,1,1,16,64,1;1,8,8,128,64,1;1,8,2,256,128,0;1,6,2,384,128,0;1,8,8,1024,64,0"

Needs PyTorch >= 2.4 (the custom ops) and the tilegrad package: python/ of
this tree is put first on sys.path; TILEGRAD_LIB names the library.
"""
import argparse
import os
import statistics
import sys
import time

here = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(here, "..", "python"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--threads", type=int, default=2, help="torch and tilegrad threads (2)")
    ap.add_argument("--pairs", type=int, default=41, help="rounds of every contender (41)")
    ap.add_argument("--shapes", default="1,1,1,16,64,1;1,8,8,128,64,1;1,8,8,1024,64,0",
                    help="'B,H,Hkv,L,D,causal;...' (bf16 tensors)")
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import tilegrad.torch as tt
    import tilegrad._torch_paths as paths
    threads, pairs = a.threads, a.pairs
    if not tt.HAVE_CUSTOM_OPS:
        raise SystemExit(f"torch {torch.__version__} has no custom ops (needs >= 2.4): nothing to compare")
    torch.set_num_threads(threads)
    direct_ok = paths._CAN_GO_DIRECT
    print(f"torch {torch.__version__}, {threads} threads, bf16 mode, {pairs} rounds; "
          "medians, us (direct: the autograd Functions; ops: the custom ops)")
    print(f"{'B,H,Hkv,L,D,causal':20s} {'fwd+bwd direct':>14s} {'ops':>8s} {'SDPA':>8s} "
          f"{'direct/ops':>10s} | {'fwd direct':>10s} {'ops':>8s} {'SDPA':>8s} {'direct/ops':>10s}")
    for spec in a.shapes.split(";"):
        B, H, Hkv, L, D, causal = map(int, spec.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v, do = (torch.randn(B, h, L, D, generator=g).bfloat16() for h in (H, Hkv, Hkv, H))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        gqa = H != Hkv

        def ours(direct, grad):
            paths._CAN_GO_DIRECT = direct
            if not grad:
                with torch.no_grad():
                    tt.attention(q, k, v, causal=bool(causal), attn_precision="bf16")
                return
            o = tt.attention(q, k, v, causal=bool(causal), attn_precision="bf16")
            torch.autograd.grad(o, (q, k, v), do)

        def sdpa(grad):
            if not grad:
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                   enable_gqa=gqa)
                return
            o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=gqa)
            torch.autograd.grad(o, (q, k, v), do)

        row = []
        for grad in (True, False):
            runs = {"direct": lambda: ours(True, grad), "ops": lambda: ours(False, grad),
                    "sdpa": lambda: sdpa(grad)}
            times = {n: [] for n in runs}
            for f in runs.values():
                f()
            order = list(runs.items())
            for i in range(pairs):   # direct and ops swap places every round
                for n, f in (order if i % 2 == 0 else [order[1], order[0], order[2]]):
                    a = time.perf_counter()
                    f()
                    times[n].append(time.perf_counter() - a)
            m = {n: statistics.median(t) * 1e6 for n, t in times.items()}
            row.append(f"{m['direct']:10.0f} {m['ops']:8.0f} {m['sdpa']:8.0f} "
                       f"{m['direct'] / m['ops']:10.3f}")
        print(f"{spec:20s} {row[0][:]:>} | {row[1]}", flush=True)
    paths._CAN_GO_DIRECT = direct_ok


if __name__ == "__main__":
    main()
