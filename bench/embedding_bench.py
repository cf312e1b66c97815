#!/usr/bin/env python3
"""The embedding's backward: PyTorch's (torch.nn.Embedding through autograd:
a zero-filled float32 weight gradient [V, H], then embedding_dense_backward's
row adds) against tilegrad's (the same zero fill, torch.zeros, then one
tg_embedding_backward call, ids cast to int32 inside the timing), on the same
ids and grad_out, at real families' vocab and hidden sizes.

Per case (family, T) and round, every timing below runs once, in one order
on even rounds and reversed on odd ones, each timed call right after an
untimed one of the same kind; --runs rounds, medians printed:
  torch     torch.autograd.grad(emb(ids), emb.weight, grad_out): the graph
            built untimed, the backward timed (zeros + row adds);
  tilegrad  torch.zeros(V, H) + tg_embedding_backward;
  zeros     torch.zeros(V, H) alone: the floor both pay (a fresh [V, H]
            float32 buffer is page-faulted in and zeroed every call);
  adds      the row adds alone, into one gradient allocated and zeroed
            before the rounds (no page faults): torch's index_add_(0, ids,
            grad_out) (the sums embedding_dense_backward makes) against
            tg_embedding_backward.
The two gradients are compared once per case (max |diff|: 0 expected, both
add a repeated id's rows in token order).

  TILEGRAD_LIB=build/libtilegrad.so python bench/embedding_bench.py --threads 2 --runs 7
  python bench/embedding_bench.py --families qwen2.5-0.5b --tokens 2048 --runs 3
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from vs_torch import cpu_name  # noqa: E402  (bench/vs_torch.py)

#: family -> (vocab V, hidden H) of its input embedding
FAMILIES = {
    "qwen2.5-0.5b": (151936, 896),
    "llama-3.2-1b": (128256, 2048),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--threads", type=int, default=2, help="torch and tilegrad threads")
    ap.add_argument("--runs", type=int, default=7, help="alternating rounds (median)")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"comma list of {', '.join(FAMILIES)}")
    ap.add_argument("--tokens", default="2048,4096", help="comma list of T (ids per step)")
    ap.add_argument("--repeat-ids", action="store_true",
                    help="draw ids from the first 1000 rows (heavy repeats) instead of all V")
    a = ap.parse_args()
    if a.threads < 1 or a.runs < 1:
        ap.error("--threads and --runs must be >= 1")
    fams = [f for f in a.families.split(",") if f]
    for f in fams:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; known: {', '.join(FAMILIES)}")
    tokens = [int(t) for t in a.tokens.split(",") if t]

    import torch
    import tilegrad
    from tilegrad._torch_common import _context, _ptr
    torch.set_num_threads(a.threads)
    ctx = _context(a.threads, False)
    print(f"cpu: {cpu_name()}")
    print(f"torch {torch.__version__}, tilegrad {tilegrad.__version__}, threads {a.threads}, "
          f"runs {a.runs} (medians of alternating rounds), ids "
          f"{'from 1000 rows' if a.repeat_ids else 'uniform over V'}")
    print(f"{'family':<14} {'V':>7} {'H':>5} {'T':>5} {'zeros ms':>9} {'torch ms':>9} "
          f"{'tilegrad ms':>11} {'torch/tg':>8} {'adds torch':>10} {'adds tg':>8} {'torch/tg':>8} "
          f"{'max|diff|':>10}")

    def tg_add(gw, g, ids):
        """gw[ids[t]] += g[t] (gw [V, H], accumulates)."""
        ids32 = ids.to(torch.int32)
        ctx.call("tg_embedding_backward", _ptr(g), _ptr(ids32), _ptr(gw), gw.shape[0],
                 ids.numel(), gw.shape[1])
        return gw

    for fam in fams:
        V, H = FAMILIES[fam]
        emb = torch.nn.Embedding(V, H)
        for T in tokens:
            gen = torch.Generator().manual_seed(T)
            ids = torch.randint(0, 1000 if a.repeat_ids else V, (T,), generator=gen)
            g = torch.randn(T, H, generator=gen)

            def run_torch():
                out = emb(ids)
                t0 = time.perf_counter()
                (gw,) = torch.autograd.grad(out, emb.weight, g)
                t = time.perf_counter() - t0
                return t, gw

            def run_tg():
                t0 = time.perf_counter()
                gw = tg_add(torch.zeros(V, H), g, ids)
                return time.perf_counter() - t0, gw

            acc = torch.zeros(V, H)             # faulted in once, reused by both

            def run_adds_torch():
                t0 = time.perf_counter()
                acc.index_add_(0, ids, g)
                return time.perf_counter() - t0, acc

            def run_adds_tg():
                t0 = time.perf_counter()
                tg_add(acc, g, ids)
                return time.perf_counter() - t0, acc

            def run_zeros():
                t0 = time.perf_counter()
                z = torch.zeros(V, H)
                return time.perf_counter() - t0, z

            diff = (run_torch()[1] - run_tg()[1]).abs().max().item()
            fns = {"torch": run_torch, "tg": run_tg, "zeros": run_zeros,
                   "adds_torch": run_adds_torch, "adds_tg": run_adds_tg}
            times = {k: [] for k in fns}
            for r in range(a.runs):
                order = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for name in order:
                    fns[name]()                      # untimed, same contender
                    times[name].append(fns[name]()[0] * 1e3)
            m = {k: statistics.median(v) for k, v in times.items()}
            print(f"{fam:<14} {V:>7} {H:>5} {T:>5} {m['zeros']:>9.2f} {m['torch']:>9.2f} "
                  f"{m['tg']:>11.2f} {m['torch'] / m['tg']:>8.3f} {m['adds_torch']:>10.2f} "
                  f"{m['adds_tg']:>8.2f} {m['adds_torch'] / m['adds_tg']:>8.3f} {diff:>10.2e}",
                  flush=True)
            del acc


if __name__ == "__main__":
    main()
