"""Context-parallel attention with tilegrad under torchrun (docs/RING.md).

One host, 2 processes:
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 examples/ring_attention.py
Two hosts (run on each; NODE = 0 on the first, 1 on the second; HOST0 = the
first host's address, reachable from the second):
    GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=16 torchrun --nnodes 2 --nproc_per_node 1 \
        --node_rank NODE --master_addr HOST0 --master_port 29500 examples/ring_attention.py

Every rank draws the same whole sequence (seeded), keeps its zigzag shard,
runs the ring forward and backward, and rank 0 checks the gathered output
against the single-process kernels on the whole sequence.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tilegrad.torch as tt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="1,8,2,2048,64", help="B,H,H_kv,S,D")
    a = p.parse_args()
    B, H, Hkv, S, D = (int(x) for x in a.shape.split(","))
    dist.init_process_group("gloo")          # torchrun's environment: rank, world, master
    rank, N = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn((B, h, S, D), generator=g).to(torch.bfloat16)
                   for h in (H, Hkv, Hkv, H))
    shard = lambda x: tt.ring_shard(x, N, rank, layout="zigzag")  # noqa: E731
    ql, kl, vl = (shard(x).requires_grad_(True) for x in (q, k, v))
    t0 = time.perf_counter()
    o = tt.ring_attention(ql, kl, vl, causal=True, layout="zigzag")
    o.backward(shard(do))
    step = time.perf_counter() - t0
    # positions of this rank's rows, e.g. for rotary embeddings
    pos = tt.ring_positions(S, N, rank, layout="zigzag")

    parts = [torch.empty_like(o) for _ in range(N)] if rank == 0 else None
    for r in range(1, N):                    # gather O on rank 0 (sizes differ: p2p)
        if rank == r:
            dist.send(o, 0)
        elif rank == 0:
            parts[r] = torch.empty((B, H, len(tt.ring_positions(S, N, r, "zigzag")), D),
                                   dtype=o.dtype)
            dist.recv(parts[r], r)
    if rank == 0:
        parts[0] = o
        full = tt.ring_unshard(parts, layout="zigzag")
        ref = tt.attention(q, k, v, causal=True)
        err = (full.float() - ref.float()).abs().max().item()
        print(f"{N} ranks, rows {pos[:3].tolist()}...: step {1e3 * step:.1f} ms on rank 0, "
              f"max |O - single process| = {err:.3g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
