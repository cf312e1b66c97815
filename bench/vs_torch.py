#!/usr/bin/env python3
"""FlashAttention-2 backward, tilegrad vs PyTorch CPU, side by side.

Both contenders get the same bf16 Q, K, V, dO and thread count; their runs
alternate (torch, tilegrad, torch, ...) and each reports the median of
--reps timed runs after one warm-up.

  torch     autograd.grad of F.scaled_dot_product_attention (bf16, scale
            1/sqrt(D), is_causal; GQA through repeat_interleave inside the
            graph, so its backward sums the group's gradients) on the flash
            attention CPU backend when torch takes the shape, else whatever
            SDPA picks (the table says which).
  tilegrad  zero dK/dV + compute_d + tg_flash_attn_train_bwd_bf16 + the three
            bf16 casts of dQ/dK/dV, i.e. the same bf16-in/bf16-out step. O and
            L come from tilegrad's forward (untimed).

Throughput is 10*B*H*L^2*D FLOP (x0.5 causal) over the median time, also
given as a fraction of the ceilings `tilegrad bench --section peaks` measures
on this machine at the same thread count: the f32 FMA peak, and the issue's
exact-mode ceiling (QK^T and dO.V^T at the bf16-dot rate, the rest at FMA).

Needs PyTorch 2.x (pip install torch numpy) and a built tilegrad
(build/libtilegrad.so and build/tilegrad, or $TILEGRAD_LIB and $TILEGRAD_CLI);
see bench/README.md.

  python3 bench/vs_torch.py --threads 1,2 --json bench/results/vs-torch.json
"""
import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
import tilegrad  # noqa: E402  (the package in python/, loaded from the source tree)
from tilegrad import capi  # noqa: E402

# The covering grid: every (L, D, causal) of the grid, with (B, H,
# H_kv) cycling through B in {1, 2, 4}, H in {8, 16}, with and without GQA;
# B*H is lowered (B first) where a step would exceed MAX_GFLOP, to keep one
# full run within ~15 minutes at 2 threads.
LS, DS = (512, 1024, 2048, 4096), (64, 128, 256)
HEADS = ((1, 8, 8), (2, 16, 4), (4, 8, 8), (1, 16, 4), (2, 8, 8), (4, 16, 16),
         (1, 8, 2), (2, 16, 16), (4, 8, 2), (1, 16, 16), (2, 8, 2), (4, 16, 4))
MAX_GFLOP = 200.0
QUICK = ((1, 8, 8, 512, 64, 0), (1, 8, 2, 512, 128, 1), (2, 8, 8, 1024, 64, 1))


def flop(B, H, L, D, causal):
    return 10.0 * B * H * L * L * D * (0.5 if causal else 1.0)


def grid():
    shapes, i = [], 0
    for L in LS:
        for D in DS:
            for causal in (0, 1):
                B, H, Hkv = HEADS[i % len(HEADS)]
                i += 1
                while flop(B, H, L, D, causal) / 1e9 > MAX_GFLOP and (B > 1 or H > 8):
                    if B > 1:
                        B //= 2
                    else:
                        H, Hkv = 8, max(1, Hkv // 2)
                shapes.append((B, H, Hkv, L, D, causal))
    return shapes


def parse_shapes(text):
    out = []
    for item in text.split(";"):
        B, H, Hkv, L, D, causal = (int(x) for x in item.split(","))
        out.append((B, H, Hkv, L, D, causal))
    return out


def measure_peaks(threads):
    """The CLI's ceilings at `threads` (GFLOP/s): fma, exact-mode ceiling."""
    exe = os.environ.get("TILEGRAD_CLI") or os.path.join(REPO, "build", "tilegrad")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([exe, "bench", "--section", "peaks", "--threads", str(threads),
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        peaks = json.load(open(f.name))["peaks"]
    return peaks["fma_f32_gflops"], peaks["attn_exact_ceiling_gflops"]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bits(t):
    """bf16 torch tensor -> contiguous numpy uint16 (raw bits)."""
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


class TorchStep:
    def __init__(self, q, k, v, do, causal, scale):
        gqa = q.shape[1] // k.shape[1]
        self.inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        qq, kk, vv = self.inputs
        if gqa > 1:
            kk, vv = kk.repeat_interleave(gqa, 1), vv.repeat_interleave(gqa, 1)
        self.backend = "flash"
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                self.out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal),
                                                          scale=scale)
        except (ImportError, RuntimeError):
            self.backend = "sdpa-default"
            self.out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal),
                                                      scale=scale)
        self.do = do

    def __call__(self):
        return torch.autograd.grad(self.out, self.inputs, self.do, retain_graph=True)


class TilegradStep:
    def __init__(self, ctx, q, k, v, do, causal, scale):
        B, H, L, D = q.shape
        Hkv = k.shape[1]
        self.ctx, self.causal, self.shape = ctx, int(causal), (B, H, L, D)
        self.p = capi.attn_params_init(B, H, Hkv, L, L, D, scale)
        self.q, self.k, self.v, self.do = bits(q), bits(k), bits(v), bits(do)
        self.o = np.empty(q.shape, np.uint16)
        self.L = np.empty((B, H, L), np.float32)
        ctx.call("tg_flash_attn_train_fwd_bf16", self.q, self.k, self.v, self.o, self.L,
                 self.p, None, None, self.causal)
        self.Dv = np.empty((B, H, L), np.float32)
        self.dq = np.empty(q.shape, np.float32)
        self.dk = np.empty(k.shape, np.float32)
        self.dv = np.empty(k.shape, np.float32)
        self.grads = [np.empty(a.shape, np.uint16) for a in (self.dq, self.dk, self.dv)]

    def __call__(self):
        B, H, L, D = self.shape
        self.dk.fill(0.0)
        self.dv.fill(0.0)
        self.ctx.call("tg_flash_attn_train_bwd_compute_d_bf16", self.o, self.do, self.Dv,
                      B, H, L, D)
        self.ctx.call("tg_flash_attn_train_bwd_bf16", self.q, self.k, self.v, self.L, self.do,
                      self.Dv, self.dq, self.dk, self.dv, self.p, None, None, self.causal)
        for src, dst in zip((self.dq, self.dk, self.dv), self.grads):
            self.ctx.call("tg_f32_to_bf16_cast", src, dst, src.size)
        return self.grads


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def check_agreement(tg_step, torch_step):
    """Largest |tilegrad - torch| per gradient, relative to max |torch|: both
    are bf16 results of the same math, so this should be a few bf16 ulps."""
    ours = tg_step()
    theirs = torch_step()
    worst = 0.0
    for a, t in zip(ours, theirs):
        a = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).float()
        t = t.float()
        scale = t.abs().max().item() or 1.0
        worst = max(worst, (a - t).abs().max().item() / scale)
    return worst


def run_shape(shape, threads, reps, ctx, seed):
    B, H, Hkv, L, D, causal = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).bfloat16()
    k = torch.randn(B, Hkv, L, D, generator=g).bfloat16()
    v = torch.randn(B, Hkv, L, D, generator=g).bfloat16()
    do = torch.randn(B, H, L, D, generator=g).bfloat16()
    scale = 1.0 / math.sqrt(D)
    torch_step = TorchStep(q, k, v, do, causal, scale)
    tg_step = TilegradStep(ctx, q, k, v, do, causal, scale)
    rel_diff = check_agreement(tg_step, torch_step)  # also the warm-up of both
    t_torch, t_tg = [], []
    for _ in range(reps):
        # A pause lets the other OpenMP runtime's idle threads stop spinning.
        time.sleep(0.05)
        t_torch.append(timed(torch_step))
        time.sleep(0.05)
        t_tg.append(timed(tg_step))
    return {"B": B, "H": H, "Hkv": Hkv, "L": L, "D": D, "causal": bool(causal),
            "threads": threads, "gflop": flop(B, H, L, D, causal) / 1e9,
            "torch_backend": torch_step.backend,
            "ms_torch": statistics.median(t_torch), "ms_tilegrad": statistics.median(t_tg),
            "ms_torch_reps": t_torch, "ms_tilegrad_reps": t_tg,
            "max_rel_diff_vs_torch": rel_diff}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma list (default 1,2)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 small shapes")
    ap.add_argument("--shapes", help="'B,H,Hkv,L,D,causal;...' instead of the grid")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes) if args.shapes else (QUICK if args.quick else grid())
    results = []
    print(f"torch {torch.__version__}, tilegrad {tilegrad.__file__}, {cpu_name()}, {os.cpu_count()} cpus")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        fma, ceil = measure_peaks(threads)
        ctx = capi.Context(threads=threads)
        print(f"\n{threads} thread(s): f32 FMA peak {fma:.1f} GFLOP/s, exact-mode ceiling "
              f"{ceil:.1f} GFLOP/s; median of {args.reps}")
        print(f"{'B,H,Hkv,L,D,causal':<22}{'torch ms':>10}{'tilegrad ms':>12}{'speedup':>9}"
              f"{'GFLOP/s':>9}{'%FMA':>6}{'%ceil':>6}  torch backend, max rel diff")
        for si, shape in enumerate(shapes):
            r = run_shape(shape, threads, args.reps, ctx, args.seed + si)
            r["tilegrad_gflops"] = r["gflop"] / r["ms_tilegrad"] * 1e3
            r["torch_gflops"] = r["gflop"] / r["ms_torch"] * 1e3
            r["speedup"] = r["ms_torch"] / r["ms_tilegrad"]
            r["pct_fma_peak"] = 100 * r["tilegrad_gflops"] / fma
            r["pct_exact_ceiling"] = 100 * r["tilegrad_gflops"] / ceil
            r["fma_peak_gflops"], r["exact_ceiling_gflops"] = fma, ceil
            results.append(r)
            name = ",".join(str(x) for x in shape)
            print(f"{name:<22}{r['ms_torch']:>10.1f}{r['ms_tilegrad']:>12.1f}"
                  f"{r['speedup']:>8.2f}x{r['tilegrad_gflops']:>9.1f}{r['pct_fma_peak']:>6.1f}"
                  f"{r['pct_exact_ceiling']:>6.1f}  {r['torch_backend']}, "
                  f"{r['max_rel_diff_vs_torch']:.1e}", flush=True)
        ctx.close()
        sp = [r["speedup"] for r in results if r["threads"] == threads]
        print(f"speedup at {threads} thread(s): min {min(sp):.2f}x, median "
              f"{statistics.median(sp):.2f}x, max {max(sp):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench/vs_torch.py", "torch": torch.__version__,
                       "cpu": cpu_name(), "reps": args.reps,
                       "statistic": "median, alternating runs after one warm-up",
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
