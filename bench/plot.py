#!/usr/bin/env python3
"""Plots bench/vs_torch.py results: FA-2 backward throughput vs sequence
length, one panel per head dim, one row of panels per thread count; tilegrad
and its peer, the faster of PyTorch's f32 and bf16 SDPA backward on each shape
(full and causal; the peer's marker says which dtype won), with the machine's
f32 FMA peak and the exact-mode ceiling as horizontal lines.

  python3 bench/plot.py bench/results/vs-torch-2t.json -o bench/results/vs-torch.png

Needs matplotlib (pip install matplotlib, or Debian's python3-matplotlib).
Several JSON files may be given; their results are pooled. Files from the
older bf16-only script (no `torch_faster` in a row) plot with bf16 as the peer.
Sliding-window rows (`window` > 0, from `vs_torch.py --windowed`) are left out.
"""
import argparse
import json
import os
import signal
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The marker of the peer's points, by the torch dtype that was faster there.
DTYPE_MARKERS = {"f32": "^", "bf16": "s"}


def peer_dtype(r):
    return r.get("torch_faster", "bf16")  # the bf16-only script had no other


def output_target(path):
    """The file an image for `path` replaces (a symlink is followed, as the C
    CLI does); exits 2 now, before any plotting, if it cannot be written: the
    directory must exist and take a new file, the path must not be a
    directory or a device."""
    real = os.path.realpath(path)
    where = os.path.dirname(real)
    why = None
    if os.path.isdir(real) or path.endswith("/"):
        why = "is a directory"
    elif not os.path.isdir(where):
        why = f"directory {os.path.dirname(path) or '.'} does not exist"
    elif os.path.exists(real) and not os.path.isfile(real):
        why = "is not a regular file"
    else:
        try:  # proves the directory takes a new file (permissions, read-only mount)
            fd, probe = tempfile.mkstemp(dir=where, prefix="." + os.path.basename(real) + ".tmp-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            why = f"cannot create a file in {where}: {e.strerror}"
    if why:
        sys.exit(f"plot.py: -o {path}: {why}")
    return real


def save_atomic(fig, path, **savefig_kw):
    """Saves fig to a temporary next to path and renames it over path only
    once complete: an error or a signal leaves path as it was and no
    temporary behind."""
    real = output_target(path)
    fmt = os.path.splitext(real)[1][1:].lower() or "png"
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real),
                               prefix="." + os.path.basename(real) + ".tmp-")
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # SIGTERM unwinds like Ctrl-C: cleanup below
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, **savefig_kw)
            f.flush()
            os.fsync(f.fileno())
        mode = os.stat(real).st_mode & 0o7777 if os.path.exists(real) else \
            0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        signal.signal(signal.SIGTERM, old_term)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="bench/vs_torch.py --json output(s)")
    ap.add_argument("-o", "--out", default="vs-torch.png")
    args = ap.parse_args()
    output_target(args.out)  # fail now, not after reading and plotting
    results, torch_version, cpu, isas, timed = [], "", "", set(), set()
    for path in args.json:
        with open(path) as f:
            doc = json.load(f)
        # windowed rows time another step (forward + backward) on other
        # shapes: they are tables, not points on these curves
        results += [r for r in doc["results"] if not r.get("window")]
        torch_version, cpu = doc.get("torch", ""), doc.get("cpu", "")
        timed.update(doc.get("torch_dtypes", ["bf16"]))
        if doc.get("tilegrad_isa"):
            isas.add(doc["tilegrad_isa"])

    dtypes = sorted(timed, key=list(DTYPE_MARKERS).index)
    peer_name = "PyTorch, faster dtype," if len(dtypes) > 1 else f"PyTorch {dtypes[0]}"
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
                # `torch_gflops` is the peer's (the faster dtype's) throughput.
                ax.plot(L, [r["torch_gflops"] for r in sel], style, color="C1",
                        label=f"{peer_name} {kind} ({'filled' if causal else 'open'})")
                for dtype, marker in DTYPE_MARKERS.items():
                    pts = [r for r in sel if peer_dtype(r) == dtype]
                    ax.plot([r["L"] for r in pts], [r["torch_gflops"] for r in pts], marker,
                            color="C1", fillstyle="full" if causal else "none", ls="none")
            if rows:
                ax.axhline(rows[0]["fma_peak_gflops"], color="k", lw=0.8, label="f32 FMA peak")
                ax.axhline(rows[0].get("ceiling_gflops", rows[0].get("exact_ceiling_gflops")), color="gray", lw=0.8, ls=":",
                           label="exact-mode ceiling")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_title(f"D = {D}, {t} thread{'s' if t > 1 else ''}")
            ax.set_xlabel("sequence length L")
            if di == 0:
                ax.set_ylabel("GFLOP/s (FA-2 backward step)")
    # One legend for the figure, below the panels, where it hides no point:
    # every panel's entries (a panel may lack causal or full rows) and the
    # marker key saying which torch dtype was the faster peer at a point.
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if len(dtypes) > 1:
        for dtype in dtypes:
            handles[f"PyTorch {dtype} was faster"] = plt.Line2D(
                [], [], marker=DTYPE_MARKERS[dtype], color="C1", ls="none")
    legend_in = 0.1 + 0.2 * ((len(handles) + 3) // 4)  # inches: 4 entries a row
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=8,
               frameon=False)
    peer = (f"the faster of PyTorch {torch_version} SDPA backward {' / '.join(dtypes)} per shape"
            if len(dtypes) > 1 else f"PyTorch {torch_version} SDPA backward {dtypes[0]}")
    isa = f", tilegrad ISA {', '.join(sorted(isas))}" if isas else ""
    fig.suptitle(f"tilegrad vs {peer} — {cpu}{isa}", fontsize=10)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    save_atomic(fig, args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
