#!/usr/bin/env python3
"""Block-sparse masks on the CPU: tilegrad's flex_attention (a torch
BlockMask's blocks as varlen documents) against tilegrad's varlen kernels
and torch's own flex_attention.

One row (--rows tokens) per mask, each timed in one process, the methods
taking turns call by call (medians):

  tg-flex        tilegrad._torch_flex.flex_attention, forward + backward
                 (the BlockMask's plan, its documents, is made on the first
                 call and kept with it, as a model's layers share one mask:
                 tg-plan is what a new BlockMask adds once)
  tg-flex-fwd    the same, forward only (no graph)
  tg-plan        the plan alone (documents, gather index, partial blocks'
                 mask from the mask_mod), per call
  tg-varlen      tilegrad.torch.varlen_attention, forward + backward, on the
                 same documents causal within each (document mask only: the
                 native route the BlockMask route is measured against)
  torch-eager    torch's flex_attention forward, eager (its CPU math path:
                 every score of the row materialised)
  torch-compiled torch.compile(flex_attention) forward (its CPU template;
                 left out with a note when it does not compile; the first
                 call, the compile, is not timed)
  torch-eager-bwd torch's eager flex_attention forward + backward (not in
                 the default list: it materialises the row's scores and keeps
                 them for the backward)

Masks (--masks): "document" (documents of --doc-len tokens, causal within
each) and "prefix-lm" (the first --prefix tokens seen by every query, causal
after them), BlockMasks from create_block_mask with --block-size. bf16
inputs by default (--dtype). Prints ms per call and the ratios (tg-flex /
tg-varlen: what the BlockMask route costs over the native one; torch's
forward / tg-flex-fwd); --json writes the rows.

  TILEGRAD_LIB=build/libtilegrad.so python3 bench/flex_bench.py --threads 2

Use OMP_WAIT_POLICY=passive on a shared host (torch's and tilegrad's
OpenMP regions alternate; threads spinning after one slow the other).
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tilegrad  # noqa: E402
import tilegrad.torch as tgt  # noqa: E402
import tilegrad._torch_flex as tflex  # noqa: E402
from train_model_parts import cpu_model  # noqa: E402  (bench/ is the script's directory)

METHODS = ("tg-flex", "tg-flex-fwd", "tg-plan", "tg-varlen", "torch-eager", "torch-compiled")
ALL_METHODS = METHODS + ("torch-eager-bwd",)


def mask_mods(args):
    """{name: (mask_mod, document lengths or None)} for --masks."""
    out = {}
    L = args.rows
    for name in args.masks:
        if name == "document":
            n = args.doc_len
            lens = [n] * (L // n) + ([L % n] if L % n else [])
            ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))

            def document(b, h, q, k, ids=ids):
                return (ids[q] == ids[k]) & (q >= k)
            out[name] = (document, lens)
        elif name == "prefix-lm":
            p = args.prefix if args.prefix is not None else L // 4

            def prefix_lm(b, h, q, k, p=p):
                return (k < p) | (q >= k)
            out[name] = (prefix_lm, None)
        else:
            raise SystemExit(f"unknown mask {name!r}: document or prefix-lm")
    return out


def timed(fn, grads=None):
    t0 = time.perf_counter()
    out = fn()
    if grads is not None:
        out.backward(grads)
    return (time.perf_counter() - t0) * 1e3


def bench_mask(args, name, mask_mod, lens, fa):
    torch.manual_seed(args.seed)
    L, H, Hk, D = args.rows, args.heads, args.kv_heads, args.head_dim
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    q = torch.randn(1, H, L, D, dtype=dt, requires_grad=True)
    k = torch.randn(1, Hk, L, D, dtype=dt, requires_grad=True)
    v = torch.randn(1, Hk, L, D, dtype=dt, requires_grad=True)
    do = torch.randn(1, H, L, D, dtype=dt)
    bm = fa.create_block_mask(mask_mod, None, None, L, L, device="cpu",
                              BLOCK_SIZE=args.block_size)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    calls = {
        "tg-flex": (lambda: tflex.flex_attention(q, k, v, bm, enable_gqa=True), do),
        "tg-flex-fwd": (lambda: tflex.flex_attention(qd, kd, vd, bm, enable_gqa=True), None),
        "tg-plan": (lambda: tflex._plan(bm, 1, 1, H, Hk, L, L, dt), None),
        "torch-eager": (lambda: fa.flex_attention(qd, kd, vd, block_mask=bm, enable_gqa=True),
                        None),
        "torch-eager-bwd": (lambda: fa.flex_attention(q, k, v, block_mask=bm,
                                                      enable_gqa=True), do),
    }
    notes = []
    if lens is not None:
        # packed layout [L, heads, D], leaves of their own
        qp, kp, vp = (t.detach()[0].transpose(0, 1).contiguous().requires_grad_()
                      for t in (q, k, v))
        dop = do[0].transpose(0, 1).contiguous()
        cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
        mx = max(lens)
        calls["tg-varlen"] = (lambda: tgt.varlen_attention(qp, kp, vp, cu, cu, mx, mx,
                                                           causal=True), dop)
    if "torch-compiled" in args.methods:
        compiled = torch.compile(fa.flex_attention)
        try:
            t0 = time.perf_counter()
            compiled(qd, kd, vd, block_mask=bm, enable_gqa=True)
            notes.append(f"torch-compiled: compile {time.perf_counter() - t0:.1f} s")
            calls["torch-compiled"] = (lambda: compiled(qd, kd, vd, block_mask=bm,
                                                        enable_gqa=True), None)
        except Exception as e:  # noqa: BLE001 - any compile failure is a note
            notes.append(f"torch-compiled: does not compile here ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:120]})")
    names = [n for n in args.methods if n in calls]
    times = {n: [] for n in names}
    leaves = [q, k, v] + ([qp, kp, vp] if lens is not None else [])
    for rep in range(args.warmup + args.reps):
        for n in names:  # taking turns
            fn, g = calls[n]
            if g is None:
                with torch.no_grad():
                    t = timed(fn)
            else:
                t = timed(fn, g)
            for x in leaves:
                x.grad = None
            if rep >= args.warmup:
                times[n].append(t)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    blocks = int(bm.kv_num_blocks.sum()) + int(bm.full_kv_num_blocks.sum())
    notes.append(f"BlockMask blocks: {blocks} of "
                 f"{(-(-L // args.block_size)) ** 2} ({bm.sparsity():.1f}% sparse)")
    return med, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rows", type=int, default=4096, help="tokens in the row (default 4096)")
    ap.add_argument("--doc-len", type=int, default=512,
                    help="document length of the document mask (default 512)")
    ap.add_argument("--prefix", type=int, default=None,
                    help="prefix of the prefix-LM mask (default rows / 4)")
    ap.add_argument("--masks", default="document,prefix-lm",
                    help="comma list of document, prefix-lm (default both)")
    ap.add_argument("--block-size", type=int, default=128, help="BlockMask block (default 128)")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch and tilegrad threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma list of {', '.join(ALL_METHODS)} (default all but "
                         "torch-eager-bwd)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    args.methods = args.methods.split(",")
    args.masks = args.masks.split(",")
    for m in args.methods:
        if m not in ALL_METHODS:
            raise SystemExit(f"unknown method {m!r}: one of {', '.join(ALL_METHODS)}")
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:
        raise SystemExit(f"torch {torch.__version__} has no flex_attention (needs >= 2.5)")
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU {cpu_model()}; torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}); tilegrad table {tilegrad.Context().isa}; "
          f"{torch.get_num_threads()} threads; "
          f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}; row {args.rows}, "
          f"H {args.heads}/{args.kv_heads}, D {args.head_dim}, {args.dtype}, blocks of "
          f"{args.block_size}; medians of {args.reps} alternating calls, ms")
    print(f"{'mask':>10} " + " ".join(f"{n:>14}" for n in args.methods) +
          "   flex/varlen  eager/flex-fwd  compiled/flex-fwd")
    rows = []
    for name, (mm, lens) in mask_mods(args).items():
        med, notes = bench_mask(args, name, mm, lens, fa)
        fwd = med.get("tg-flex-fwd")
        ratio = {
            "flex/varlen": med["tg-flex"] / med["tg-varlen"]
            if "tg-flex" in med and "tg-varlen" in med else None,
            "eager/flex-fwd": med["torch-eager"] / fwd if fwd and "torch-eager" in med else None,
            "compiled/flex-fwd": med["torch-compiled"] / fwd
            if fwd and "torch-compiled" in med else None,
        }
        fmt = (lambda x, w: f"{x:>{w}.2f}x" if x is not None else f"{'-':>{w + 1}}")
        print(f"{name:>10} " + " ".join(
            f"{med[n]:>14.1f}" if n in med else f"{'-':>14}" for n in args.methods) +
            "   " + fmt(ratio["flex/varlen"], 10) + " " + fmt(ratio["eager/flex-fwd"], 14) +
            " " + fmt(ratio["compiled/flex-fwd"], 17))
        for n in notes:
            print(f"{'':>10} {n}")
        rows.append({"mask": name, "ms": med, "ratios": ratio, "notes": notes})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "rows": rows,
                       "args": {k: v for k, v in vars(args).items() if k != "json"}}, f,
                      indent=1)


if __name__ == "__main__":
    main()
