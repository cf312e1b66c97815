#!/usr/bin/env python3
"""Plots bench/vs_torch.py results: FA-2 backward throughput vs sequence
length, one panel per head dim, one row of panels per thread count; tilegrad
and PyTorch (full and causal), with the machine's f32 FMA peak and the
exact-mode ceiling as horizontal lines.

  python3 bench/plot.py bench/results/vs-torch-2t.json -o bench/results/vs-torch.png

Needs matplotlib (pip install matplotlib, or Debian's python3-matplotlib).
Several JSON files may be given; their results are pooled.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="bench/vs_torch.py --json output(s)")
    ap.add_argument("-o", "--out", default="vs-torch.png")
    args = ap.parse_args()
    results, torch_version, cpu = [], "", ""
    for path in args.json:
        with open(path) as f:
            doc = json.load(f)
        results += doc["results"]
        torch_version, cpu = doc.get("torch", ""), doc.get("cpu", "")

    threads = sorted({r["threads"] for r in results})
    dims = sorted({r["D"] for r in results})
    fig, axes = plt.subplots(len(threads), len(dims), figsize=(4.2 * len(dims), 3.6 * len(threads)),
                             squeeze=False, sharex=True)
    for ti, t in enumerate(threads):
        for di, D in enumerate(dims):
            ax = axes[ti][di]
            rows = [r for r in results if r["threads"] == t and r["D"] == D]
            for causal, style in ((False, "-"), (True, "--")):
                sel = sorted((r for r in rows if r["causal"] == causal), key=lambda r: r["L"])
                if not sel:
                    continue
                L = [r["L"] for r in sel]
                kind = "causal" if causal else "full"
                ax.plot(L, [r["tilegrad_gflops"] for r in sel], "o" + style, color="C0",
                        label=f"tilegrad {kind}")
                ax.plot(L, [r["torch_gflops"] for r in sel], "s" + style, color="C1",
                        label=f"PyTorch {kind}")
            if rows:
                ax.axhline(rows[0]["fma_peak_gflops"], color="k", lw=0.8, label="f32 FMA peak")
                ax.axhline(rows[0]["exact_ceiling_gflops"], color="gray", lw=0.8, ls=":",
                           label="exact-mode ceiling")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"D = {D}, {t} thread{'s' if t > 1 else ''}")
            ax.set_xlabel("sequence length L")
            if di == 0:
                ax.set_ylabel("GFLOP/s (FA-2 backward step)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"tilegrad vs PyTorch {torch_version} SDPA backward, bf16 — {cpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
