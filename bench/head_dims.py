#!/usr/bin/env python3
"""Head dims between the multiples of 32 against their neighbours.

Runs `tilegrad bench --section attn --json` over one shape at every head dim
of a range (default 1,8,8,1024,D full attention, D 64-192 in steps of 8),
--rounds times per ISA table, the tables' order rotating every round so that
the machine's drift hits each alike. Per table, pass (the backward step and
the forward) and D: the median over the rounds of each round's median
GFLOP/s, and for D not a multiple of 32 its ratio to the nearest multiple of
32 (the better of the two where both are as near). The target it checks:
D 72-152 within 10% of that neighbour (ratio >= 0.90).

  python3 bench/head_dims.py --threads 2 --rounds 5 --isa avx512bf16,avx512,avx2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_bench(args, isa, shapes):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [args.tilegrad, "bench", "--section", "attn", "--threads", str(args.threads),
               "--reps", str(args.reps), "--precision", args.precision, "--isa", isa,
               "--shapes", shapes, "--json", f.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(f.name) as g:
            return json.load(g)


def nearest_multiple_ratio(rates, d):
    lo, hi = d // 32 * 32, d // 32 * 32 + 32
    near = [x for x in (lo, hi) if abs(x - d) == min(d - lo, hi - d) and x in rates]
    return rates[d] / max(rates[x] for x in near) if near else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tilegrad", default=os.path.join(HERE, "..", "build", "tilegrad"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per shape and run")
    ap.add_argument("--isa", default="auto", help="comma list of tables (default auto)")
    ap.add_argument("--precision", default="exact", choices=["exact", "split", "bf16"])
    ap.add_argument("--shape", default="1,8,8,1024,{D},0",
                    help="B,H,Hkv,L,{D},causal (default 1,8,8,1024,{D},0)")
    ap.add_argument("--dims", default="64-192:8", help="FIRST-LAST:STEP (default 64-192:8)")
    args = ap.parse_args()
    span, step = args.dims.split(":")
    first, last = (int(x) for x in span.split("-"))
    dims = list(range(first, last + 1, int(step)))
    shapes = ";".join(args.shape.format(D=d) for d in dims)
    tables = args.isa.split(",")
    rates = {(t, p): {d: [] for d in dims} for t in tables for p in ("bwd", "fwd")}
    cpu = None
    for r in range(args.rounds):
        for t in tables[r % len(tables):] + tables[:r % len(tables)]:
            out = run_bench(args, t, shapes)
            cpu = out["cpu"]
            for row in out["attention_bwd"]["results"]:
                rates[(t, "bwd")][row["D"]].append(row["gflops"])
                rates[(t, "fwd")][row["D"]].append(row["fwd"]["gflops"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"CPU {cpu}; {args.threads} threads; {args.precision} mode; shape {args.shape}; "
          f"GFLOP/s: medians over {args.rounds} rounds of each run's median of {args.reps} calls")
    print("D 72-152 against the nearest multiple of 32 (target >= 0.90)")
    for (t, p), by_d in rates.items():
        med = {d: statistics.median(v) for d, v in by_d.items()}
        ratios = {d: nearest_multiple_ratio(med, d) for d in dims if d % 32}
        inside = [ratios[d] for d in ratios if 72 <= d <= 152 and ratios[d] is not None]
        known = [d for d in ratios if ratios[d] is not None]
        span = f"{min(inside):.2f}-{max(inside):.2f}" if inside else "none in the range"
        worst = min(known, key=lambda d: ratios[d]) if known else None
        print(f"\n{t} {p}: D 72-152 {span}" +
              (f"; worst D {worst} {ratios[worst]:.2f}" if known else ""))
        print("  D      " + " ".join(f"{d:>6}" for d in dims))
        print("  GFLOP/s" + " ".join(f"{med[d]:6.0f}" for d in dims))
        print("  ratio  " + " ".join(f"{ratios[d]:6.2f}" if d in ratios and ratios[d] else
                                     f"{'':>6}" for d in dims))


if __name__ == "__main__":
    main()
