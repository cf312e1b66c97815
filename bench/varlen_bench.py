#!/usr/bin/env python3
"""Packed rows' attention, forward + backward: tilegrad's varlen kernels
against what a user runs without them.

Each row packs documents (a fixed length, or lengths drawn from a
long-tailed distribution) and is timed four ways, in one process, taking
turns call by call (medians):

  varlen        tilegrad.torch.varlen_attention: the documents' tiles only
  one-doc       tilegrad.torch.attention, the row as one causal document
                (the work varlen saves: its tiles / varlen's)
  tg-dense      tilegrad.torch.attention with transformers' dense
                block-diagonal mask (tilegrad without varlen)
  sdpa-dense    torch's scaled_dot_product_attention with that mask
                (what transformers' sdpa backend runs on a packed row)

bf16 inputs where the CPU has a bf16 unit, else float32 (--dtype).
Reports ms per fwd+bwd and the ratios; --json writes the rows. Every call
allocates its outputs, as training does, and where malloc has handed the
freed tensors' pages back to the kernel it faults them in again: the
header line shows GLIBC_TUNABLES, which sets how malloc keeps freed memory.

  TILEGRAD_LIB=build/libtilegrad.so python3 bench/varlen_bench.py --threads 2
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tilegrad  # noqa: E402
import tilegrad.torch as tgt  # noqa: E402
from train_model_parts import cpu_model  # noqa: E402


def doc_lengths(kind, row, rng):
    """Document lengths filling `row` tokens: "fixed:N" or "tail" (64-2048,
    log-uniform: many short documents, a few long ones; the last is cut)."""
    if kind.startswith("fixed:"):
        n = int(kind.split(":")[1])
        return [n] * (row // n) + ([row % n] if row % n else [])
    lens, total = [], 0
    while total < row:
        n = int(round(64 * 32 ** rng.random()))
        n = min(n, row - total)
        lens.append(n)
        total += n
    return lens


def block_mask(lens, dtype):
    """transformers' packed mask: causal within each document, [1, 1, L, L] additive."""
    L = sum(lens)
    doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.arange(L)
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    m = torch.zeros(L, L, dtype=dtype)
    m.masked_fill_(~allowed, float("-inf"))
    return m[None, None]


def timed(fn, grads):
    t0 = time.perf_counter()
    out = fn()
    out.backward(grads)
    return (time.perf_counter() - t0) * 1e3


def bench_row(args, lens, rng_seed):
    torch.manual_seed(rng_seed)
    H, Hk, D = args.heads, args.kv_heads, args.head_dim
    L = sum(lens)
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    q = torch.randn(L, H, D, dtype=dt, requires_grad=True)
    k = torch.randn(L, Hk, D, dtype=dt, requires_grad=True)
    v = torch.randn(L, Hk, D, dtype=dt, requires_grad=True)
    do = torch.randn(L, H, D, dtype=dt)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
    mx = max(lens)
    # head-major views for the dense calls, leaves of their own
    qh, kh, vh = (t.detach().transpose(0, 1)[None].contiguous().requires_grad_() for t in (q, k, v))
    doh = do.transpose(0, 1)[None].contiguous()
    mask = block_mask(lens, dt)
    calls = {
        "varlen": (lambda: tgt.varlen_attention(q, k, v, cu, cu, mx, mx, causal=True), do),
        "one-doc": (lambda: tgt.attention(qh, kh, vh, causal=True), doh),
        "tg-dense": (lambda: tgt.attention(qh, kh, vh, mask=mask), doh),
        "sdpa-dense": (lambda: torch.nn.functional.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, enable_gqa=True), doh),
    }
    names = [n for n in calls if n in args.methods]
    times = {n: [] for n in names}
    for rep in range(args.warmup + args.reps):
        for n in names:  # taking turns
            fn, g = calls[n]
            t = timed(fn, g)
            for x in (q, k, v, qh, kh, vh):
                x.grad = None
            if rep >= args.warmup:
                times[n].append(t)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="4096",
                    help="comma list of row lengths (default 4096; the issue's: 4096-16384)")
    ap.add_argument("--docs", default="fixed:512,fixed:256,tail",
                    help="comma list of document-length kinds: fixed:N or tail (default "
                         "fixed:512,fixed:256,tail)")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--threads", type=int, default=0, help="torch and tilegrad threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--methods", default="varlen,one-doc,tg-dense,sdpa-dense")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    args.methods = args.methods.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    import random
    rng = random.Random(args.seed)
    print(f"CPU {cpu_model()}; torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}); tilegrad table {tilegrad.Context().isa}; "
          f"{torch.get_num_threads()} threads; "
          f"H {args.heads}/{args.kv_heads}, D {args.head_dim}, {args.dtype}; medians of "
          f"{args.reps} alternating fwd+bwd calls, ms; "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    print(f"{'row':>6} {'documents':>22} " + " ".join(f"{n:>10}" for n in args.methods) +
          "   one-doc/varlen  sdpa-dense/varlen  tg-dense/varlen")
    rows = []
    for row in (int(x) for x in args.rows.split(",")):
        for kind in args.docs.split(","):
            lens = doc_lengths(kind, row, rng)
            med = bench_row(args, lens, args.seed)
            desc = f"{kind} ({len(lens)} docs)"
            ratio = {n: med[n] / med["varlen"] for n in med if "varlen" in med and n != "varlen"}
            print(f"{row:>6} {desc:>22} " + " ".join(f"{med.get(n, float('nan')):>10.1f}" for n in args.methods) +
                  "   " + "  ".join(f"{ratio.get(n, float('nan')):>14.2f}x" for n in ("one-doc", "sdpa-dense", "tg-dense")))
            rows.append({"row": row, "docs": kind, "lens": lens, "ms": med, "vs_varlen": ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
