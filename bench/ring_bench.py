#!/usr/bin/env python3
"""Context-parallel (ring) attention on one machine: 1, 2 and 4 ranks.

Each world of N ranks is N processes on gloo over loopback
(``torch.multiprocessing`` spawn), the --threads-total threads split between
them (T // N each, at least 1: more ranks than threads oversubscribes the
cores, and the table says so). Every rank runs ``tilegrad.torch.ring_attention``
forward + backward on its chunk of one sequence (bf16 by default, causal with
the zigzag layout), --reps times after one warm-up, each repetition started
together by a barrier. Reported per N:

  step ms     median over the repetitions of the slowest rank's forward +
              backward (fwd, bwd: the same for each pass alone)
  sent MB     bytes each rank handed to torch.distributed sends per step
              (tilegrad.ring.bytes_sent; the same on every rank for even chunks)
  vs single   the single-process whole-sequence step (tilegrad.torch.attention,
              all --threads-total threads, one process) over the ring's step
  link ms     one ring exchange (every rank sends to the next and receives
              from the previous at once) of a key/value chunk, and of a
              chunk's f32 dK/dV, measured in the same world
  step compute ms
              one ring step's kernels alone, forward + backward, timed in the
              same world (every rank at once, so under the same sharing of
              the cores): each rank's queries against a visiting chunk's
              worth of keys (zigzag causal: half its own rows, no mask, the
              work of every step; otherwise all its own rows, full)
  model ms    docs/RING.md's step time from that compute and the measured
              link: with communication hidden behind compute ("overlap")
              and not at all ("serial")

  python3 bench/ring_bench.py --threads-total 2 --json bench/results/zen5/ring-2t.json

Needs PyTorch (1.13 or 2.x) with gloo and a built tilegrad (build/libtilegrad.so
or $TILEGRAD_LIB).
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import tilegrad  # noqa: E402  (the package in python/, from the source tree)
import tilegrad.torch as tt  # noqa: E402
from tilegrad import ring  # noqa: E402
from vs_torch import cpu_name  # noqa: E402  (bench/vs_torch.py)

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def _inputs(a):
    """The whole-sequence q, k, v, dO (the same in every process)."""
    B, H, Hkv, S, D = a.shape
    g = torch.Generator().manual_seed(0)
    mk = lambda h: torch.randn((B, h, S, D), generator=g).to(DTYPES[a.dtype])  # noqa: E731
    return mk(H), mk(Hkv), mk(Hkv), mk(H)


def _median_ms(xs):
    return 1e3 * statistics.median(xs)


def _timed(a, q, k, v, do, threads, barrier=None, **kw):
    """[fwd s, bwd s] of each of a.reps runs of tilegrad.torch.attention
    after one warm-up (barrier: called before each run)."""
    rows = []
    for i in range(a.reps + 1):
        ql, kl, vl = (t.clone().requires_grad_(True) for t in (q, k, v))
        if barrier:
            barrier()
        t0 = time.perf_counter()
        o = tt.attention(ql, kl, vl, threads=threads, **kw)
        t1 = time.perf_counter()
        o.backward(do)
        if i:
            rows.append([t1 - t0, time.perf_counter() - t1])
    return rows


def _link(N, rank, nbytes, reps):
    """Median seconds of one simultaneous ring exchange of nbytes."""
    import torch.distributed as dist
    out, inp = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    ts = []
    for _ in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        w = [dist.isend(out, (rank + 1) % N), dist.irecv(inp, (rank - 1) % N)]
        for x in w:
            x.wait()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts[1:])


def _worker(rank, N, port, tpr, a, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(tpr)
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=N,
                            timeout=datetime.timedelta(seconds=600))
    try:
        shard = lambda x: tt.ring_shard(x, N, rank, a.layout)  # noqa: E731
        q, k, v, do = (shard(x) for x in _inputs(a))
        rows = []                                # per repetition: fwd s, bwd s, bytes
        for i in range(a.reps + 1):
            ql, kl, vl = (t.clone().requires_grad_(True) for t in (q, k, v))
            dist.barrier()
            b0, t0 = ring.bytes_sent(), time.perf_counter()
            o = tt.ring_attention(ql, kl, vl, causal=a.causal, layout=a.layout, threads=tpr)
            t1 = time.perf_counter()
            o.backward(do)
            t2 = time.perf_counter()
            if i:
                rows.append([t1 - t0, t2 - t1, ring.bytes_sent() - b0])
        # one step's compute: zigzag causal steps each run 2 c x c blocks
        # unmasked (c = S / 2N): the local rows against half as many keys
        h = q.shape[2] // 2 if a.causal and a.layout == "zigzag" else q.shape[2]
        step = _timed(a, q, k[:, :, :h], v[:, :, :h], do, tpr, barrier=dist.barrier)
        mine = torch.cat([torch.tensor(rows, dtype=torch.float64).flatten(),
                          torch.tensor(step, dtype=torch.float64).flatten()])
        link = [0.0, 0.0]
        if N > 1:    # a key/value chunk (input dtype) and a chunk's dK/dV (f32)
            B, _, Hkv, S, D = a.shape
            row = 2 * B * Hkv * D * (S // N)
            link = [_link(N, rank, row * torch.finfo(q.dtype).bits // 8, a.reps),
                    _link(N, rank, row * 4, a.reps)]
        mine = torch.cat([mine, torch.tensor(link, dtype=torch.float64)])
        every = [torch.empty_like(mine) for _ in range(N)]
        if N > 1:
            dist.all_gather(every, mine)
        else:
            every = [mine]
        if rank == 0:
            torch.save(torch.stack(every), out_path)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world(a, N, tpr):
    """Spawn N ranks; -> dict of the medians (seconds, bytes)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.pt")
        mp.spawn(_worker, args=(N, _free_port(), tpr, a, path), nprocs=N)
        every = torch.load(path)                       # [N, reps * (3 + 2) + 2]
    reps = every[:, :3 * a.reps].view(N, a.reps, 3)
    step = every[:, 3 * a.reps:5 * a.reps].view(N, a.reps, 2)
    slowest = reps.max(0).values                       # per repetition, over the ranks
    med = lambda x: statistics.median(x.tolist())      # noqa: E731
    return dict(fwd=med(slowest[:, 0]), bwd=med(slowest[:, 1]),
                step=med((reps[:, :, 0] + reps[:, :, 1]).max(0).values),
                sent=[int(x) for x in reps[:, 0, 2].tolist()],
                step_fwd=med(step.max(0).values[:, 0]), step_bwd=med(step.max(0).values[:, 1]),
                link_kv=float(every[:, -2].max()), link_grad=float(every[:, -1].max()))


def _model(N, cf, cb, link_kv, link_grad):
    """docs/RING.md: (overlapped, serial) step seconds on N ranks from one
    step's forward and backward compute (cf, cb) and the link times."""
    if N == 1:
        return cf + cb, cf + cb
    over = (N - 1) * max(cf, link_kv) + cf + (N - 1) * max(cb, link_kv + link_grad) + cb \
        + link_grad
    serial = N * (cf + cb) + (N - 1) * (2 * link_kv + link_grad) + link_grad
    return over, serial


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="world sizes (default 1,2,4)")
    p.add_argument("--threads-total", type=int, default=len(os.sched_getaffinity(0)),
                   help="threads split between the ranks (default: the usable cores)")
    p.add_argument("--shape", default="1,8,8,4096,64", help="B,H,H_kv,S,D (whole sequence)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--full", dest="causal", action="store_false", help="not causal")
    p.add_argument("--layout", choices=ring.LAYOUTS,
                   help="default: zigzag for causal, contiguous for full")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    a.shape = tuple(int(x) for x in a.shape.split(","))
    a.layout = a.layout or ("zigzag" if a.causal else "contiguous")
    ranks = [int(x) for x in a.ranks.split(",")]
    cores = len(os.sched_getaffinity(0))
    if "GLOO_SOCKET_IFNAME" not in os.environ and any(
            n == "lo" for _, n in socket.if_nameindex()):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"

    B, H, Hkv, S, D = a.shape
    flop = (4 + 10) * B * H * S * S * D * (0.5 if a.causal else 1.0)
    q, k, v, do = _inputs(a)
    single = _timed(a, q, k, v, do, a.threads_total, causal=a.causal)
    sf, sb = (statistics.median(x) for x in zip(*single))
    isa = tilegrad.Context(threads=1).isa
    head = (f"ring attention: B,H,H_kv,S,D = {a.shape}, {'causal' if a.causal else 'full'}, "
            f"{a.dtype}, layout {a.layout}; {a.threads_total} threads in total on "
            f"{cores} cores ({cpu_name()}); tilegrad ISA table {isa}; torch "
            f"{torch.__version__}; OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
            f"median of {a.reps}\n"
            f"single process, whole sequence, {a.threads_total} threads: fwd "
            f"{1e3 * sf:.1f} ms, bwd {1e3 * sb:.1f} ms, step {1e3 * (sf + sb):.1f} ms "
            f"({flop / (sf + sb) / 1e9:.0f} GFLOP/s)")
    print(head, flush=True)
    cols = ("ranks", "thr/rank", "step ms", "fwd ms", "bwd ms", "sent/rank MB", "vs single",
            "step compute ms", "link kv ms", "link dKV ms", "model overlap ms",
            "model serial ms")
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + " ---: |" * len(cols)]
    print(lines[2] + "\n" + lines[3], flush=True)
    results = []
    for N in ranks:
        tpr = max(1, a.threads_total // N)
        r = _world(a, N, tpr)
        oversub = N * tpr > cores
        over, serial = _model(N, r["step_fwd"], r["step_bwd"], r["link_kv"], r["link_grad"])
        r.update(ranks=N, threads_per_rank=tpr, oversubscribed=oversub,
                 vs_single=(sf + sb) / r["step"], model_overlap=over, model_serial=serial)
        results.append(r)
        line = (f"| {N} | {tpr}{' (oversubscribed)' if oversub else ''} | "
                f"{1e3 * r['step']:.1f} | {1e3 * r['fwd']:.1f} | {1e3 * r['bwd']:.1f} | "
                f"{max(r['sent']) / 1e6:.2f} | {r['vs_single']:.2f}x | "
                f"{1e3 * r['step_fwd']:.1f} + {1e3 * r['step_bwd']:.1f} | "
                f"{1e3 * r['link_kv']:.2f} | {1e3 * r['link_grad']:.2f} | {1e3 * over:.1f} | "
                f"{1e3 * serial:.1f} |")
        lines.append(line)
        print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(shape=a.shape, causal=a.causal, dtype=a.dtype, layout=a.layout,
                           threads_total=a.threads_total, cores=cores, cpu=cpu_name(),
                           isa=isa, torch=torch.__version__, reps=a.reps,
                           single=dict(fwd=sf, bwd=sb),
                           results=results, table="\n".join(lines)), f, indent=1)


if __name__ == "__main__":
    main()
