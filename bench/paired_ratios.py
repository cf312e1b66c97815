#!/usr/bin/env python3
"""Medians of per-round ratios from a paired experiment log.

A paired experiment runs one binary under several configurations (an
environment override each), all of them in every round, in an order that
rotates between rounds, so that a slow stretch of the machine hits every
configuration alike (bench/results/xeon16-amx/README.md). The
log is a sequence of blocks, one per run:

    == r<round> <group words...> <config>
    <rows of `tilegrad bench --section attn`: number, shape, GFLOP, ms, ...>

The first 4 rows of a block are read as backward steps, any further ones
as forwards (the bench prints the attention rows first). For each group,
row and configuration this prints the median ms over the rounds and the
median, min and max of the per-round ratio to the --base configuration.

    python3 bench/paired_ratios.py LOG --base c4
"""
import argparse
import collections
import re
import statistics


def read(path):
    times = collections.defaultdict(dict)  # (group, kind, shape) -> {(round, config): ms}
    configs, head, n = [], None, 0
    for line in open(path):
        if line.startswith("=="):
            words = line.split()[1:]
            rnd = int(re.fullmatch(r"r(\d+)", words[0]).group(1))
            head, n = (rnd, " ".join(words[1:-1]), words[-1]), 0
            if words[-1] not in configs:
                configs.append(words[-1])
        elif head and line[:1].isdigit():
            f = line.split()
            times[(head[1], "bwd" if n < 4 else "fwd", f[1])][(head[0], head[2])] = float(f[3])
            n += 1
    return times, configs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--base", help="the configuration the ratios divide by (default: the first seen)")
    args = ap.parse_args()
    times, configs = read(args.log)
    base = args.base or configs[0]
    print(f"ratios to {base}: median of the per-round ratios [min-max], rounds")
    for key in sorted(times):
        v = times[key]
        cells = []
        for c in configs:
            runs = [t for (r, cc), t in v.items() if cc == c]
            if not runs:  # a configuration this group did not run
                continue
            ms = statistics.median(runs)
            cell = f"{c} {ms:8.2f}"
            if c != base:
                x = [t / v[(r, base)] for (r, cc), t in v.items() if cc == c and (r, base) in v]
                cell += f" {statistics.median(x):.3f} [{min(x):.2f}-{max(x):.2f}] n={len(x)}"
            cells.append(cell)
        print(f"{key[0]:10s} {key[1]} {key[2]:24s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
