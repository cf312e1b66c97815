#!/usr/bin/env python3
"""Ring attention across 4 hosts (network namespaces) at several link bandwidths.

Drives ``tests/multihost/run.sh bench``: for each --rates entry a fresh set
of hosts whose links are limited by tc's tbf (``none``: the veth's own
speed), one rank per host, 1 thread each, bf16, causal, zigzag layout. Each
rank runs tilegrad.torch.ring_attention forward + backward on its chunk,
--reps times after a warm-up, in three modes (tests/multihost/worker.py
``cmd_bench``):

  step      the real ring
  comm      the same ring with the kernels replaced by nothing (the forward
            pairs return an empty partial): its messages alone, in its order
  compute   the same ring with the messages replaced by nothing (chunks
            "arrive" as zeros): its kernels and merges alone

(medians of the slowest host per repetition), and

  overlap = (comm + compute - step) / min(comm, compute)

1: the shorter of the two fully hidden behind the longer; 0: they add. The
model (docs/RING.md, "Across hosts") is evaluated from the link rate and the
measured compute:

  step ~ N max(compute / N, bytes per hop / rate) + one dK/dV hop

with the tc rate ("nominal") and with the rate the ring's messages reached
in the comm mode ("effective": bytes sent / comm time; TCP/IP headers,
gloo's per-message costs and tbf's shaping take the rest).

  sudo python3 bench/multihost_ring_bench.py --rates "none 1gbit 100mbit" \\
      --json /tmp/multihost-ring.json

Needs root (namespaces), the torch 2.9.1 venv and a built library
(TILEGRAD_LIB, default build/libtilegrad.so).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATES = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8}       # bytes/s


def model(r, W=None):
    """docs/RING.md's step from the link rate (bytes/s) and the measured
    compute alone: per ring step max(compute per step, kv hop), the forward
    then the backward (whose hop carries the kv chunk and the f32 dK/dV sum),
    plus the last dK/dV hop home. None: no rate (the veth's own)."""
    W = W or RATES.get(r["rate"])
    if W is None:
        return None
    N = r["hosts"]
    tf, tb = r["compute_fwd"] / N, r["compute_bwd"] / N      # one ring step's kernels
    kv, g = r["kv_bytes"] / W, r["grad_bytes"] / W
    return (N - 1) * max(tf, kv) + tf + (N - 1) * max(tb, kv + g) + tb + g


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="none 1gbit 100mbit", help="tc rates, or none")
    p.add_argument("--shape", default="1,8,8,4096,64", help="B,H,H_kv,S,D (whole sequence)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--hosts", type=int, default=4, help="hosts (ranks), default 4")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TG_MH_HOSTS=str(a.hosts))
        rc = subprocess.call(["bash", os.path.join(REPO, "tests/multihost/run.sh"), "bench",
                              "--rates", a.rates, "--out", d, "--shape", a.shape,
                              "--reps", str(a.reps)], env=env)
        if rc:
            sys.exit(rc)          # 77: skipped (run.sh said why)
        rows = [json.load(open(os.path.join(d, f"bench-{r}.json"))) for r in a.rates.split()]
    r0 = rows[0]
    print(f"ring attention on {r0['hosts']} hosts (network namespaces, 1 thread each on a "
          f"{os.cpu_count()}-core machine): B,H,H_kv,S,D = {r0['shape']}, bf16, causal, zigzag; "
          f"kv chunk {r0['kv_bytes'] / 1e6:.2f} MB, dK/dV chunk {r0['grad_bytes'] / 1e6:.2f} MB; "
          f"median of {r0['reps']}")
    cols = ("link", "step ms", "fwd + bwd ms", "comm alone ms", "compute alone ms (fwd + bwd)",
            "overlap", "effective link MB/s", "model ms (nominal rate)", "model ms (effective)")
    print("| " + " | ".join(cols) + " |\n|" + " ---: |" * len(cols))
    for r in rows:
        N = r["hosts"]
        # the ring's bytes per host: (N-1) kv chunks each pass, N dK/dV chunks
        sent = 2 * (N - 1) * r["kv_bytes"] + N * r["grad_bytes"]
        r["link_MBps"] = sent / r["comm"] / 1e6
        m, me = model(r), model(r, sent / r["comm"])   # the rate the ring's messages got
        r["model"], r["model_effective"] = m, me
        print(f"| {r['rate']} | {1e3 * r['step']:.0f} | {1e3 * r['step_fwd']:.0f} + "
              f"{1e3 * r['step_bwd']:.0f} | {1e3 * r['comm']:.0f} | {1e3 * r['compute']:.0f} "
              f"({1e3 * r['compute_fwd']:.0f} + {1e3 * r['compute_bwd']:.0f}) | "
              f"{r['overlap']:.2f} | {r['link_MBps']:.0f} | "
              f"{'-' if m is None else f'{1e3 * m:.0f}'} | {1e3 * me:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
