#!/usr/bin/env python3
"""Thread scaling of the backward step from two `tilegrad bench` outputs
(text, as the CLI prints it) of the same shapes at a low and a high thread
count: per shape the step's speedup, and that over the FMA peak's speedup
measured in the same two runs (the target: >= 0.9).

  bench/scaling_ratio.py LOW.txt HIGH.txt [LOW.txt HIGH.txt ...]

e.g. build/tilegrad bench --section attn --threads 1 > a.txt, the same with
--threads 16 > b.txt, then bench/scaling_ratio.py a.txt b.txt.
"""
import argparse
import os
import re
import sys


def load(path):
    with open(path) as f:
        text = f.read()
    m = re.search(r"f32 FMA peak\s+([\d.]+)", text)
    if not m:
        raise SystemExit(f"{path}: no 'f32 FMA peak' line (not a tilegrad bench output?)")
    bwd = text.split("FlashAttention-2 training forward")[0]
    ms = {r.group(1): float(r.group(2))
          for r in re.finditer(r"^\d+\s+(\S+)\s+[\d.]+\s+([\d.]+)", bwd, re.M)}
    return float(m.group(1)), ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="LOW.txt HIGH.txt",
                    help="pairs of tilegrad bench outputs: low thread count, then high")
    ap.add_argument("--target", type=float, default=0.9,
                    help="the step's speedup over the peak's that counts as scaling (0.9)")
    a = ap.parse_args(argv)
    if len(a.files) % 2:
        ap.error("give the files in pairs: LOW.txt HIGH.txt")
    for lo, hi in zip(a.files[0::2], a.files[1::2]):
        p1, m1 = load(lo)
        p2, m2 = load(hi)
        peak = p2 / p1
        rows = [(k, m1[k] / m2[k]) for k in m1 if k in m2]
        if not rows:
            raise SystemExit(f"{lo}, {hi}: no shape in both")
        print(f"{os.path.basename(lo)}: FMA peak {p1:.0f} -> {p2:.0f} GFLOP/s ({peak:.2f}x); "
              f"{sum(s / peak >= a.target for _, s in rows)} of {len(rows)} >= {a.target}")
        for k, s in rows:
            print(f"  {k:28s} {m1[k]:8.2f} -> {m2[k]:7.2f} ms  {s:5.1f}x  {s / peak:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
