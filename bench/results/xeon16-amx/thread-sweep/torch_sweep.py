"""PyTorch SDPA backward (bf16, flash CPU backend, as vs_torch.py times it) of one shape at several
thread counts, counts alternating round by round; per count the median over
the rounds of the fastest of 3 calls, and the speedup over the first.

  python torch_sweep.py ROUNDS B,H,Hkv,L,D,causal THREADS...
"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

rounds = int(sys.argv[1])
B, H, Hkv, L, D, causal = map(int, sys.argv[2].split(","))
counts = [int(x) for x in sys.argv[3:]]
g = torch.Generator().manual_seed(1)
q = torch.randn(B, H, L, D, generator=g).bfloat16().requires_grad_()
k = torch.randn(B, Hkv, L, D, generator=g).bfloat16().requires_grad_()
v = torch.randn(B, Hkv, L, D, generator=g).bfloat16().requires_grad_()
do = torch.randn(B, H, L, D, generator=g).bfloat16()


kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the graph kept: the backward alone is timed
    out = F.scaled_dot_product_attention(q, kk, vv, is_causal=bool(causal), scale=1 / math.sqrt(D))


def step():
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


times = {c: [] for c in counts}
for _ in range(rounds):
    for c in counts:
        torch.set_num_threads(c)
        best = 1e30
        for _ in range(3):
            t0 = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - t0)
        times[c].append(best)
print(f"{sys.argv[2]} torch {torch.__version__} bf16 backward, {rounds} rounds: threads ms speedup")
first = statistics.median(times[counts[0]])
for c in counts:
    m = statistics.median(times[c])
    print(f"  {c:3d} {m * 1e3:9.2f} {first / m:6.2f}x")
