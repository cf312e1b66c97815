#!/usr/bin/env python3
"""FlashAttention-2 backward, tilegrad vs PyTorch CPU, side by side.

The peer is what a user would run instead of tilegrad: PyTorch's SDPA
backward in whichever dtype is *faster* on this CPU. So every shape is timed
in PyTorch float32 and bfloat16 (by default; --torch-dtypes restricts it) and
tilegrad's speedup is quoted against the faster of the two, shape by shape
(medians; the "best" column is the same ratio from each contender's fastest
run: where it is far from the median's, the row was disturbed, and one
run of it decides nothing).
Which dtype wins depends on the CPU (a bf16 dot unit or not) and on the
PyTorch build, so it is measured rather than assumed.

All contenders get the same Q, K, V, dO (drawn in bf16; the float32 run gets
them upcast, which is exact) and the same thread count; their runs alternate
(torch f32, torch bf16, tilegrad, torch f32, ...), each timed call right
after an untimed one (and 50 ms after the other's, only where a second
OpenMP runtime is loaded: pause_between_contenders), and each reports the
median of --reps timed runs after one warm-up.

  torch     autograd.grad of F.scaled_dot_product_attention (scale 1/sqrt(D),
            is_causal; GQA through repeat_interleave inside the graph, so its
            backward sums the group's gradients) on the flash attention CPU
            backend when torch takes the shape, else whatever SDPA picks (the
            table says which). Gradients come out in the run's dtype.
  tilegrad  tg_attn_train_bwd_step, as the torch op calls it: compute_d and
            the backward (dK/dV written, not added to) in one call, writing
            dQ/dK/dV in bf16, i.e. the same bf16-in/bf16-out step. O and L
            come from tilegrad's forward (untimed). With --via-op: autograd.grad
            through tilegrad.torch.attention instead (the torch op, what a
            model's backward pays: the same call, plus PyTorch's dispatch and
            the returned gradients' allocation, as on torch's side).

Throughput is 10*B*H*L^2*D FLOP (x0.5 causal) over the median time (the
forward with --forward: 4*B*H*L^2*D), also given as a fraction of the
ceilings `tilegrad bench --section peaks` measures on this machine at the
same thread count: the f32 FMA peak, and the ceiling of the table and
precision mode (--precision; `tilegrad bench --precision`) for the step,
or with --forward for the forward.

Sliding windows (--windowed, or a 7th field W in --shapes): the timed step
is the forward *and* the backward, on both sides, since SDPA takes a window
only as a dense mask that its forward pays for too:
  torch     F.scaled_dot_product_attention with an additive [L, L] mask in
            the run's dtype (0 on the visible band, -inf elsewhere; causal
            folded into it), then autograd.grad, the graph rebuilt each run.
  tilegrad  tg_attn_train_fwd (O bf16, L) + the backward step above, both
            with tg_attn_options.window = W.
Their FLOP count the visible (i, k) pairs only: 14*B*H*D*pairs (4 forward,
10 backward), so %FMA stays honest; torch's dense-mask work is not credited.

Needs PyTorch 2.x, numpy and a built tilegrad (build/libtilegrad.so and
build/tilegrad, or $TILEGRAD_LIB and $TILEGRAD_CLI); see bench/README.md.

  python3 bench/vs_torch.py --threads 1,2 --json bench/results/vs-torch.json
"""
import argparse
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
import tilegrad  # noqa: E402,F401  (the package in python/, loaded from the source tree)
from tilegrad import capi  # noqa: E402
from tilegrad.errors import TilegradError  # noqa: E402

# The covering grid: every (L, D, causal) of the grid, with (B, H,
# H_kv) cycling through B in {1, 2, 4}, H in {8, 16}, with and without GQA;
# B*H is lowered (B first) where a step would exceed MAX_GFLOP, which kept one
# full run with torch bf16 alone within ~15 minutes at 2 threads (timing torch
# f32 too about doubles that).
LS, DS = (512, 1024, 2048, 4096), (64, 128, 256)
HEADS = ((1, 8, 8), (2, 16, 4), (4, 8, 8), (1, 16, 4), (2, 8, 8), (4, 16, 16),
         (1, 8, 2), (2, 16, 16), (4, 8, 2), (1, 16, 16), (2, 8, 2), (4, 16, 4))
MAX_GFLOP = 200.0
# Shapes users train that the covering grid misses, appended to it as they
# are (not lowered to MAX_GFLOP: their size is the point): head dims 96-512,
# GQA up to 8 (16 query heads on 2 kv heads), one batch with few heads for
# many cores, long context (16384 and 32768, causal).
USER_SHAPES = ((1, 6, 2, 1024, 512, 1), (1, 8, 4, 1024, 256, 0), (1, 4, 4, 2560, 160, 0),
               (1, 16, 2, 3072, 64, 1), (1, 8, 8, 2048, 96, 1), (1, 6, 2, 384, 128, 0),
               (1, 8, 2, 16384, 128, 1), (1, 8, 2, 32768, 64, 1))
# Head dims between the multiples of 32 (72-152 in steps of 8; Phi-1/1.5/2
# use 80), encoder batches (8-32 sequences of 128-512, full attention: BERT
# base and large fine-tunes) and real families' shapes at their published
# heads (Phi-2: 32 heads of 80; Qwen2.5-0.5B: 14 on 2 of 64; Llama-3.2-3B: 24
# on 8 of 128; Gemma-2-2B: 8 on 4 of 256), appended as they are.
MID_D_SHAPES = tuple((1, 8, 8, 1024, D, 0) for D in (72, 80, 88, 104, 112, 120, 136, 144, 152))
ENCODER_SHAPES = ((32, 12, 12, 128, 64, 0), (16, 12, 12, 256, 64, 0), (8, 16, 16, 512, 64, 0))
FAMILY_SHAPES = ((1, 32, 32, 2048, 80, 1), (1, 14, 2, 2048, 64, 1), (1, 24, 8, 2048, 128, 1),
                 (1, 8, 4, 2048, 256, 1))
QUICK = ((1, 8, 8, 512, 64, 0), (1, 8, 2, 512, 128, 1), (2, 8, 8, 1024, 64, 1))
# --windowed: causal sliding windows W 512-4096 at L 8192-32768, and L 16384
# with W 1024 (the case the window's cost is judged on). Heads are kept low:
# the peer's dense mask is L^2 elements whatever W is. --windowed --quick: one
# small window.
WINDOWED = ((1, 2, 2, 8192, 128, 1, 512), (1, 2, 2, 8192, 128, 1, 4096),
            (1, 1, 1, 16384, 128, 1, 1024), (1, 1, 1, 32768, 128, 1, 512),
            (1, 1, 1, 32768, 128, 1, 4096))
WINDOWED_QUICK = ((1, 2, 2, 2048, 64, 1, 256),)

# PyTorch dtypes the peer may run in, by their --torch-dtypes names.
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
BF16 = 0  # tg_dtype TG_DTYPE_BF16


def flop(B, H, L, D, causal):
    return 10.0 * B * H * L * L * D * (0.5 if causal else 1.0)


def visible_pairs(L, causal, W):
    """(i, k) pairs of one head a window W leaves visible (key k > i - W,
    and k <= i when causal); as `tilegrad bench` counts them."""
    if W >= L:
        return L * (L + 1) // 2 if causal else L * L
    if causal:
        return W * (W + 1) // 2 + (L - W) * W
    return L * L - (L - W) * (L - W + 1) // 2


def window_flop(B, H, L, D, causal, W):
    """Forward (4) + backward (10) FLOP per visible pair."""
    return 14.0 * B * H * D * visible_pairs(L, causal, W)


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
    return shapes + list(USER_SHAPES + MID_D_SHAPES + ENCODER_SHAPES + FAMILY_SHAPES)


def parse_shapes(text):
    """'B,H,Hkv,L,D,causal[,W];...' -> tuples (W, the window, 0 = none)."""
    out = []
    for item in text.split(";"):
        fields = [int(x) for x in item.split(",")]
        if len(fields) not in (6, 7) or (len(fields) == 7 and fields[6] < 0):
            raise argparse.ArgumentTypeError(
                f"--shapes item {item!r}: want B,H,Hkv,L,D,causal or B,H,Hkv,L,D,causal,W")
        out.append(tuple(fields) if len(fields) == 7 and fields[6] else tuple(fields[:6]))
    return out


def parse_dtypes(text):
    names = []
    for name in text.split(","):
        name = name.strip().lower()
        if name not in TORCH_DTYPES:
            raise argparse.ArgumentTypeError(
                f"unknown torch dtype {name!r}; want a comma list of {', '.join(TORCH_DTYPES)}")
        if name not in names:
            names.append(name)
    return names


def measure_peaks(threads, isa, precision, forward=False):
    """The CLI's ceilings at `threads` (GFLOP/s): the f32 FMA peak and the
    FA-2 step's ceiling (with `forward`, the forward's) for tilegrad's table
    `isa` in `precision` mode (the table's bf16 unit, if any, for the
    products the mode puts there), as a function of the head dim D (exact
    mode's bf16 parts from some D on, where the table has them)."""
    exe = os.environ.get("TILEGRAD_CLI") or os.path.join(REPO, "build", "tilegrad")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([exe, "bench", "--section", "peaks", "--threads", str(threads),
                        "--isa", isa, "--precision", precision, "--json", f.name], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(f.name) as jf:
            peaks = json.load(jf)["peaks"]
    key = "attn_fwd" if forward else "attn"
    base, min_d = peaks[f"{key}_ceiling_gflops"], peaks.get(f"{key}_parts_min_d", 0)
    parts = peaks.get(f"{key}_ceiling_parts_gflops", 0)
    return peaks["fma_f32_gflops"], lambda D: parts if min_d and D >= min_d else base


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_cpu_capability():
    """What ATen dispatches its vectorised CPU kernels to (e.g. AVX512, AVX2)."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older PyTorch
        return "unknown"


def openmp_runtimes():
    """The OpenMP runtime libraries mapped into this process (Linux's
    /proc/self/maps; empty elsewhere). PyPI's torch ships libgomp.so.1 and
    libtilegrad asks for that soname, so the loader gives both the one
    runtime and one thread pool; a second runtime (Intel's or LLVM's, or a
    renamed libgomp) brings a second pool whose idle threads spin."""
    names = ("libgomp", "libiomp", "libomp")
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(names))


def pause_between_contenders():
    """Seconds to wait before each contender's calls: 50 ms where two
    OpenMP runtimes share the process, so the other pool's spinning
    threads go idle first; none with one runtime, where a pause only lets
    the cores idle: on the 2-core Xeon VM the timed call after a pause and
    an untimed call read p90s of 5-16 ms for calls of 0.5-3.5 ms (both
    sides), against 0.6-3.8 ms back to back (bench/README.md)."""
    return 0.05 if len(openmp_runtimes()) > 1 else 0.0


def make_context(isa):
    """The tilegrad Context every shape runs on, on the microkernel set `isa`
    (None: the library's choice). Exits with the library's word when it
    refuses the name."""
    if isa:
        # tg_ctx_create reads TG_ISA itself: set it so that every context
        # this process makes (the torch front's too) takes the same table.
        os.environ["TG_ISA"] = isa
    try:
        ctx = capi.Context()
        if isa and isa.lower() in capi.ISA_NAMES:
            ctx.isa = isa  # the library refuses a set this CPU or build lacks
    except TilegradError as e:
        sys.exit(f"vs_torch.py: --isa {isa}: {e}")
    # tg_ctx_create falls back to its default on a TG_ISA it does not know,
    # so check that the set the kernels will run is the one asked for.
    if isa and isa.lower() != "auto" and ctx.isa != isa.lower():
        sys.exit(f"vs_torch.py: --isa {isa}: tilegrad does not know this ISA "
                 f"(it would run '{ctx.isa}')")
    return ctx


def bits(t):
    """bf16 torch tensor -> contiguous numpy uint16 (raw bits)."""
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


class TorchStep:
    """One PyTorch SDPA forward kept with its graph; calling it runs the
    backward, in `dtype` (the bf16 inputs upcast for float32: exact)."""

    def __init__(self, q, k, v, do, causal, scale, dtype):
        gqa = q.shape[1] // k.shape[1]
        self.inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
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
        self.do = do.to(dtype)

    def __call__(self):
        return torch.autograd.grad(self.out, self.inputs, self.do, retain_graph=True)


class TorchForward:
    """PyTorch SDPA's forward alone (no graph: torch.no_grad), in `dtype`;
    returns [O]."""

    def __init__(self, q, k, v, causal, scale, dtype):
        gqa = q.shape[1] // k.shape[1]
        self.q, self.k, self.v = (t.to(dtype) for t in (q, k, v))
        if gqa > 1:  # as TorchStep: SDPA's CPU kernels take no GQA
            self.k, self.v = (t.repeat_interleave(gqa, 1) for t in (self.k, self.v))
        self.causal, self.scale, self.backend = bool(causal), scale, "flash"

    def _sdpa(self):
        return F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal,
                                              scale=self.scale)

    def __call__(self):
        with torch.no_grad():
            if self.backend == "flash":
                try:
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return [self._sdpa()]
                except (ImportError, RuntimeError):
                    self.backend = "sdpa-default"
            return [self._sdpa()]


def window_mask(L, causal, W, dtype):
    """The dense additive mask SDPA needs for a window: [L, L] of dtype, 0
    where key k is visible to query i (k > i - W, and k <= i when causal),
    -inf elsewhere; broadcast over batch and heads."""
    band = torch.ones(L, L, dtype=torch.bool).triu_(-(W - 1))
    if causal:
        band.tril_()
    mask = torch.full((L, L), float("-inf"), dtype=dtype)
    mask.masked_fill_(band, 0.0)
    return mask


class TorchWindowStep:
    """PyTorch SDPA forward + backward of a sliding window W through its
    dense mask, in `dtype`; each call builds the graph anew."""

    def __init__(self, q, k, v, do, causal, window, scale, dtype):
        self.gqa = q.shape[1] // k.shape[1]
        self.inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        self.mask = window_mask(q.shape[2], causal, window, dtype)
        self.scale, self.do = scale, do.to(dtype)
        self.backend = "flash"  # until the flash CPU backend refuses the mask

    def _forward(self):
        qq, kk, vv = self.inputs
        if self.gqa > 1:
            kk, vv = kk.repeat_interleave(self.gqa, 1), vv.repeat_interleave(self.gqa, 1)
        return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=self.mask, scale=self.scale)

    def __call__(self):
        out = None
        if self.backend == "flash":
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = self._forward()
            except (ImportError, RuntimeError):
                self.backend = "sdpa-default"
        if out is None:
            out = self._forward()
        return torch.autograd.grad(out, self.inputs, self.do)


class TilegradStep:
    """The backward step, tg_attn_train_bwd_step: D = rowsum(dO*O), the
    backward and the bf16 gradients in one call (into self.grads); with a
    window W (tg_attn_options.window) the forward is part of the timed step
    too. The f32 buffers Dv, dq, dk, dv (never touched by the step) are
    for scripts that time the parts apart with compute_d, tg_attn_train_bwd
    (self.opt has TG_ATTN_OPT_DKV_WRITE) and the three casts into self.grads
    (such a script, step_parts.py, is in git history at commit 6dbc783)."""

    def __init__(self, ctx, q, k, v, do, causal, scale, window=0):
        B, H, L, D = q.shape
        Hkv = k.shape[1]
        self.ctx, self.causal, self.shape = ctx, int(causal), (B, H, L, D)
        self.p = capi.attn_params_init(B, H, Hkv, L, L, D, scale)
        self.window = window
        # the forward ignores the flag, the step implies it, the parts' bwd needs it
        self.opt = capi.AttnOptions(flags=capi.TG_ATTN_OPT_DKV_WRITE, window=window)
        self.q, self.k, self.v, self.do = bits(q), bits(k), bits(v), bits(do)
        self.o = np.empty(q.shape, np.uint16)
        self.L = np.empty((B, H, L), np.float32)
        self.forward()
        self.grads = [np.empty(a.shape, np.uint16) for a in (q, k, v)]
        self.Dv = np.empty((B, H, L), np.float32)
        self.dq = np.empty(q.shape, np.float32)
        self.dk = np.empty(k.shape, np.float32)
        self.dv = np.empty(k.shape, np.float32)

    def forward(self):
        self.ctx.call("tg_attn_train_fwd", BF16, self.q, self.k, self.v, self.o, self.L,
                      self.p, None, None, self.causal, self.opt)
        return [self.o]

    def __call__(self):
        if self.window:
            self.forward()
        dq, dk, dv = self.grads
        self.ctx.call("tg_attn_train_bwd_step", BF16, BF16, self.q, self.k, self.v, self.o,
                      self.L, self.do, dq, dk, dv, self.p, None, None, self.causal, self.opt)
        return self.grads


class TilegradOpStep:
    """--via-op: the backward through the torch op, autograd.grad of
    tilegrad.torch.attention's output (the forward, untimed, keeps its
    graph), as a model's training step runs it."""

    def __init__(self, ctx, q, k, v, do, causal, scale):
        from tilegrad import torch as tt
        self.do = do
        self.inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        self.out = tt.attention(*self.inputs, causal=bool(causal), scale=scale,
                                attn_precision=ctx.attn_precision, threads=ctx.threads)

    def __call__(self):
        return torch.autograd.grad(self.out, self.inputs, self.do, retain_graph=True)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def max_rel_diff(ours, theirs):
    """Largest |ours - theirs| over dQ, dK, dV (O with --forward), each
    relative to max |theirs|.
    Against torch bf16 (the same bf16 math) this should be a few bf16 ulps;
    against torch f32 it is mostly the rounding of tilegrad's bf16 outputs."""
    worst = 0.0
    for a, t in zip(ours, theirs):
        a, t = a.float(), t.float()
        scale = t.abs().max().item() or 1.0
        worst = max(worst, (a - t).abs().max().item() / scale)
    return worst


def check_agreement(tg_step, torch_steps):
    """The gradient check, which is also every contender's warm-up run:
    tilegrad vs each torch dtype, and torch bf16 vs torch f32 (what bf16
    itself costs in PyTorch, to read tilegrad's f32 difference against)."""
    ours = [g if isinstance(g, torch.Tensor) else
            torch.from_numpy(g.view(np.int16)).view(torch.bfloat16) for g in tg_step()]
    theirs = {name: step() for name, step in torch_steps.items()}
    diffs = {name: max_rel_diff(ours, g) for name, g in theirs.items()}
    if "f32" in theirs and "bf16" in theirs:
        diffs["bf16_vs_f32"] = max_rel_diff(theirs["bf16"], theirs["f32"])
    return diffs


def run_shape(shape, threads, reps, ctx, seed, dtypes, forward=False, pause=0.0, via_op=False):
    B, H, Hkv, L, D, causal = shape[:6]
    window = shape[6] if len(shape) > 6 else 0
    if forward and window:
        sys.exit("vs_torch.py: --forward takes shapes without a window (a windowed row "
                 "already times forward + backward)")
    if via_op and (forward or window):
        sys.exit("vs_torch.py: --via-op times the backward of unwindowed shapes only")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g).bfloat16()
    k = torch.randn(B, Hkv, L, D, generator=g).bfloat16()
    v = torch.randn(B, Hkv, L, D, generator=g).bfloat16()
    do = torch.randn(B, H, L, D, generator=g).bfloat16()
    scale = 1.0 / math.sqrt(D)
    if forward:
        torch_steps = {name: TorchForward(q, k, v, causal, scale, TORCH_DTYPES[name])
                       for name in dtypes}
    elif window:
        torch_steps = {name: TorchWindowStep(q, k, v, do, causal, window, scale,
                                             TORCH_DTYPES[name]) for name in dtypes}
    else:
        torch_steps = {name: TorchStep(q, k, v, do, causal, scale, TORCH_DTYPES[name])
                       for name in dtypes}
    if via_op:
        tg_step = TilegradOpStep(ctx, q, k, v, do, causal, scale)
    else:
        tilegrad = TilegradStep(ctx, q, k, v, do, causal, scale, window)
        tg_step = tilegrad.forward if forward else tilegrad
    diffs = check_agreement(tg_step, torch_steps)
    t_torch, t_tg = {name: [] for name in dtypes}, []
    for _ in range(reps):
        for name, step in torch_steps.items():
            # An untimed call first takes the cost of the hand-over (and,
            # after a pause, of waking the cores: pause_between_contenders)
            time.sleep(pause)
            step()
            t_torch[name].append(timed(step))
        time.sleep(pause)
        tg_step()
        t_tg.append(timed(tg_step))

    gflop = (window_flop(B, H, L, D, causal, window) if window else
             flop(B, H, L, D, causal) * (0.4 if forward else 1.0)) / 1e9  # forward: 4 of 10
    ms_tg = statistics.median(t_tg)
    ms = {name: statistics.median(t) for name, t in t_torch.items()}
    peer = min(ms, key=ms.get)  # the faster torch dtype on this shape
    r = {"B": B, "H": H, "Hkv": Hkv, "L": L, "D": D, "causal": bool(causal),
         "window": window, "step": "fwd" if forward else "fwd+bwd" if window else "bwd",
         "threads": threads, "gflop": gflop, "tilegrad_isa": ctx.isa,
         "ms_tilegrad": ms_tg, "ms_tilegrad_reps": t_tg,
         "tilegrad_gflops": gflop / ms_tg * 1e3, "torch_dtypes": list(dtypes)}
    for name in dtypes:
        r[f"ms_torch_{name}"] = ms[name]
        r[f"ms_torch_{name}_reps"] = t_torch[name]
        r[f"torch_{name}_gflops"] = gflop / ms[name] * 1e3
        r[f"torch_{name}_backend"] = torch_steps[name].backend
        r[f"speedup_vs_torch_{name}"] = ms[name] / ms_tg
        r[f"max_rel_diff_vs_torch_{name}"] = diffs[name]
    if "bf16_vs_f32" in diffs:
        r["max_rel_diff_torch_bf16_vs_f32"] = diffs["bf16_vs_f32"]
    # The peer's figures under the keys the bf16-only script wrote, so older
    # readers of the JSON (bench/plot.py among them) compare with the peer.
    r.update({"torch_faster": peer, "ms_torch": ms[peer],
              "torch_gflops": r[f"torch_{peer}_gflops"],
              "torch_backend": r[f"torch_{peer}_backend"],
              "speedup": ms[peer] / ms_tg,
              # the same ratio from each contender's fastest run: far from the
              # median's, the row was disturbed (a busy or shared machine)
              "speedup_best": min(min(t) for t in t_torch.values()) / min(t_tg),
              "max_rel_diff_vs_torch": diffs[peer]})
    return r


def summarize(rows, dtypes):
    """Speedups vs the faster peer over one thread count's shapes."""
    sp = [r["speedup"] for r in rows]
    best = [r["speedup_best"] for r in rows]
    s = {"threads": rows[0]["threads"], "shapes": len(sp),
         "speedup_min": min(sp), "speedup_median": statistics.median(sp),
         "speedup_max": max(sp),
         "speedup_geomean": math.exp(sum(math.log(x) for x in sp) / len(sp)),
         "shapes_ge_1x": sum(x >= 1.0 for x in sp),
         "speedup_best_min": min(best), "speedup_best_max": max(best),
         "torch_wins": {name: sum(r["torch_faster"] == name for r in rows) for name in dtypes}}
    for name in dtypes:
        s[f"max_rel_diff_vs_torch_{name}"] = max(r[f"max_rel_diff_vs_torch_{name}"] for r in rows)
    if len(dtypes) == 2:
        s["max_rel_diff_torch_bf16_vs_f32"] = max(r["max_rel_diff_torch_bf16_vs_f32"]
                                                  for r in rows)
    return s


# (header, width, alignment) of the table's columns; "faster" names the
# torch dtype that is the peer, "speedup" is that dtype's time / tilegrad's.
COLS = (("B,H,Hkv,L,D,causal[,W]", 26, "<"), ("tilegrad ms", 12, ">"), ("torch f32", 11, ">"),
        ("torch bf16", 11, ">"), ("faster", 7, ">"), ("speedup", 9, ">"), ("best", 7, ">"),
        ("GFLOP/s", 9, ">"), ("%FMA", 6, ">"), ("%ceil", 6, ">"),
        ("diff bf16", 10, ">"), ("diff f32", 10, ">"), ("  torch backend", 0, "<"))


def fmt_row(cells):
    return "".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, COLS)).rstrip()


def fmt_result(r):
    def ms(name):
        return f"{r[f'ms_torch_{name}']:.1f}" if f"ms_torch_{name}" in r else "-"

    def diff(name):
        key = f"max_rel_diff_vs_torch_{name}"
        return f"{r[key]:.1e}" if key in r else "-"

    backends = {r[f"torch_{n}_backend"] for n in r["torch_dtypes"]}
    backend = backends.pop() if len(backends) == 1 else \
        " ".join(f"{n}:{r[f'torch_{n}_backend']}" for n in r["torch_dtypes"])
    name = ",".join(str(r[k]) for k in ("B", "H", "Hkv", "L", "D")) + f",{int(r['causal'])}"
    if r.get("window"):
        name += f",{r['window']}"
    return fmt_row((name, f"{r['ms_tilegrad']:.1f}", ms("f32"), ms("bf16"), r["torch_faster"],
                    f"{r['speedup']:.2f}x", f"{r['speedup_best']:.2f}x",
                    f"{r['tilegrad_gflops']:.1f}",
                    f"{r['pct_fma_peak']:.1f}", f"{r['pct_ceiling']:.1f}",
                    diff("bf16"), diff("f32"), "  " + backend))


def fmt_summary(s, dtypes):
    wins = ", ".join(f"{name} on {s['torch_wins'][name]}" for name in dtypes)
    diffs = "tilegrad vs " + ", vs ".join(
        f"torch {name} {s[f'max_rel_diff_vs_torch_{name}']:.1e}" for name in dtypes)
    if "max_rel_diff_torch_bf16_vs_f32" in s:
        diffs += f"; torch bf16 vs torch f32 {s['max_rel_diff_torch_bf16_vs_f32']:.1e}"
    t = s["threads"]
    return (f"speedup vs the faster torch at {t} thread(s): min {s['speedup_min']:.2f}x, "
            f"median {s['speedup_median']:.2f}x, max {s['speedup_max']:.2f}x, "
            f"geomean {s['speedup_geomean']:.2f}x; {s['shapes_ge_1x']}/{s['shapes']} shapes "
            f">= 1.0x; faster torch dtype: {wins}\n"
            f"best-of-runs speedup: min {s['speedup_best_min']:.2f}x, "
            f"max {s['speedup_best_max']:.2f}x\n"
            f"largest max rel diff of the gradients: {diffs}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2", help="comma list (default 1,2)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per contender (median)")
    ap.add_argument("--quick", action="store_true", help="3 small shapes (with --windowed: 1)")
    ap.add_argument("--windowed", action="store_true",
                    help="the sliding-window shapes (W 512-4096 at L 8192-32768, forward + "
                    "backward step; the peer takes the window as a dense mask) instead of the "
                    "grid")
    ap.add_argument("--shapes", type=parse_shapes,
                    help="'B,H,Hkv,L,D,causal[,W];...' instead of the grid (W: a sliding "
                    "window, timed as forward + backward)")
    ap.add_argument("--forward", action="store_true",
                    help="time the training forward alone on both sides (tg_attn_train_fwd: "
                    "O and L; SDPA without a graph), FLOP = 4*B*H*L^2*D (x0.5 causal)")
    ap.add_argument("--via-op", action="store_true",
                    help="time tilegrad's backward through its torch op (autograd.grad of "
                    "tilegrad.torch.attention) instead of the C call")
    ap.add_argument("--isa", help="tilegrad's microkernel set: auto or one of the names "
                    "`tilegrad bench --help` lists (sets TG_ISA); default: the library's choice")
    ap.add_argument("--torch-dtypes", type=parse_dtypes, default=list(TORCH_DTYPES),
                    help="PyTorch dtypes to time, the faster is the peer (default f32,bf16)")
    ap.add_argument("--precision", default="exact", choices=("exact", "split", "bf16"),
                    help="tilegrad's attention precision mode (tg_ctx_set_attn_precision; "
                    "default exact)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.shapes:
        shapes = args.shapes
    elif args.windowed:
        shapes = WINDOWED_QUICK if args.quick else WINDOWED
    else:
        shapes = QUICK if args.quick else grid()
    if any(len(s) > 6 for s in shapes) and "window" not in dict(capi.AttnOptions._fields_):
        sys.exit("vs_torch.py: this tilegrad's Python API has no tg_attn_options.window "
                 "(python/tilegrad/capi.py AttnOptions): it cannot run the windowed shapes")
    thread_counts = [int(t) for t in args.threads.split(",")]
    dtypes = args.torch_dtypes
    ctx = make_context(args.isa)
    ctx.attn_precision = args.precision
    cpu, capability = cpu_name(), torch_cpu_capability()

    print(f"CPU: {cpu} ({os.cpu_count()} cpus)")
    requested = os.environ.get("TG_ISA")  # --isa, or the caller's environment
    asked = f"TG_ISA={requested}" if requested else "the library's choice"
    print(f"tilegrad: ISA {ctx.isa} ({asked}), precision {args.precision}, {ctx.lib.path}"
          + (", through the torch op (--via-op)" if args.via_op else ""))
    print(f"torch {torch.__version__}, CPU capability {capability}; timed in "
          f"{' and '.join(dtypes)}" + (", the peer is the faster per shape"
                                       if len(dtypes) > 1 else " only"))
    print(f"threads: {args.threads}; median of {args.reps} alternating runs after one warm-up")
    runtimes, pause = openmp_runtimes(), pause_between_contenders()
    print(f"OpenMP runtimes: {', '.join(runtimes) or 'none found'}; "
          f"{pause * 1e3:.0f} ms pause before each contender's calls")
    results, summaries = [], []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        ctx.threads = threads
        fma, ceil_at = measure_peaks(threads, ctx.isa, args.precision, args.forward)
        ceils = sorted({ceil_at(s[4]) for s in shapes})
        print(f"\n{threads} thread(s): f32 FMA peak {fma:.1f} GFLOP/s, {args.precision}-mode "
              f"{'forward ' if args.forward else ''}ceiling "
              f"{' / '.join(f'{c:.1f}' for c in ceils)} GFLOP/s (by D); "
              f"times in ms, speedup = faster torch / tilegrad "
              f"(medians; best: fastest runs), "
              f"diff = tilegrad's max rel gradient diff vs each torch dtype")
        if args.forward:
            print("forward alone (tilegrad O and L, torch SDPA without a graph); "
                  "diff = max rel difference of O")
        if any(len(s) > 6 for s in shapes):
            print("shapes with a window W (7th field): forward + backward step, torch with "
                  "the dense [L, L] additive mask; GFLOP/s on the visible pairs "
                  "(14*B*H*D*pairs)")
        print(fmt_row([c[0] for c in COLS]))
        rows = []
        for si, shape in enumerate(shapes):
            r = run_shape(shape, threads, args.reps, ctx, args.seed + si, dtypes, args.forward,
                          pause, args.via_op)
            r["pct_fma_peak"] = 100 * r["tilegrad_gflops"] / fma
            ceil = ceil_at(shape[4])
            r["pct_ceiling"] = 100 * r["tilegrad_gflops"] / ceil
            r["fma_peak_gflops"], r["ceiling_gflops"] = fma, ceil
            rows.append(r)
            print(fmt_result(r), flush=True)
        summaries.append(summarize(rows, dtypes))
        print(fmt_summary(summaries[-1], dtypes))
        results += rows
    isa = ctx.isa
    ctx.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench/vs_torch.py", "cpu": cpu, "threads": thread_counts,
                       "tilegrad_isa": isa, "isa_requested": requested,
                       "tilegrad_precision": args.precision, "via_op": args.via_op,
                       "torch": torch.__version__, "torch_cpu_capability": capability,
                       "torch_dtypes": dtypes,
                       "peer": "the faster of torch_dtypes per shape (ms_torch, "
                               "torch_gflops, speedup, torch_backend, max_rel_diff_vs_torch)",
                       "reps": args.reps,
                       "statistic": "median, alternating runs after one warm-up",
                       "openmp_runtimes": runtimes, "pause_s": pause,
                       "summary": summaries, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
