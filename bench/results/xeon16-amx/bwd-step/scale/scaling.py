#!/usr/bin/env python3
"""1 -> 16 thread scaling of the step from `tilegrad bench` outputs in this
folder (scale-MODE-1t[-rN].txt against scale-MODE-16t[-rN].txt): per shape
the step's speedup, and that over the FMA peak's speedup measured in the
same two runs (the target: >= 0.9)."""
import glob
import os
import re


def load(path):
    text = open(path).read()
    peak = float(re.search(r"f32 FMA peak\s+([\d.]+)", text).group(1))
    bwd = text.split("FlashAttention-2 training forward")[0]
    ms = {m.group(1): float(m.group(2))
          for m in re.finditer(r"^\d+\s+(\S+)\s+[\d.]+\s+([\d.]+)", bwd, re.M)}
    return peak, ms


here = os.path.dirname(os.path.abspath(__file__))
for one in sorted(glob.glob(os.path.join(here, "scale-*-1t*.txt"))):
    sixteen = one.replace("-1t", "-16t")
    if not os.path.exists(sixteen):
        continue
    p1, m1 = load(one)
    p16, m16 = load(sixteen)
    peak = p16 / p1
    rows = [(k, m1[k] / m16[k]) for k in m1 if k in m16]
    print(f"{os.path.basename(one)}: FMA peak {p1:.0f} -> {p16:.0f} GFLOP/s ({peak:.2f}x); "
          f"{sum(s / peak >= 0.9 for _, s in rows)} of {len(rows)} >= 0.9")
    for k, s in rows:
        print(f"  {k:28s} {m1[k]:8.2f} -> {m16[k]:7.2f} ms  {s:5.1f}x  {s / peak:.2f}")
