"""tg_attn_train_bwd_step, the whole attention backward step in one call,
through the raw binding (tilegrad.capi), and the torch op that calls it.

* bitwise: the step against the three-call sequence it replaces,
  tg_attn_train_bwd_compute_d + tg_attn_train_bwd (TG_ATTN_OPT_DKV_WRITE)
  + tg_f32_to_bf16_cast of each gradient (bf16 gradients; float32: the
  f32 results themselves), on the same context: dtypes bf16 and float32
  with gradients in either, GQA, causal with qL != kL (rows that see no
  key), a broadcast mask, softcap, a sliding window with sinks (d_sinks
  accumulating onto a prefill), Dv != D, dropout, tile edges, a NaN input
  (the cast's 0x7FC0), O and dO in a [B, qL, H, Dv] layout (O read through
  the params' O_strides, dO's), keys long enough for several key ranges;
  1 to 3 threads, deterministic or not, the CPU's ISA and portable, each
  precision mode, the machine's own work plan and plans for 16 and 64 CPUs
  (one with one-tile key chunks: tilegrad_testing.h's hooks), so that each
  way the bf16 gradients are written (one key range or several, one query
  group or several) is met; dQ, dK, dV prefilled with garbage (written,
  not added to) and the TG_ATTN_OPT_DKV_WRITE flag given or not (implied);
* the ctypes signature, parameter by parameter against include/tilegrad.h;
* the atomic schedule: bf16 gradients take the KV schedule's bits;
* refusals: a grad_dtype or dtype outside tg_dtype, NULL O, an unsupported
  head dim, outputs overlapping O or each other (extents in grad_dtype's
  element size): the exception class of the status, the library's message,
  no output byte (dQ, dK, dV, d_sinks) changed;
* the torch op tilegrad::attn_bwd (PyTorch >= 2.4; the autograd Function
  on 1.13), now one call of the step: its gradients are bitwise those of
  compute_d + tg_attn_train_bwd (DKV_WRITE) + torch's ``.to(q.dtype)``,
  the op's earlier body, directly and through autograd.

The math itself is the autograd oracles' (test_torch_*.py, run on the op).
Every test skips while the library does not export the step.
"""
import contextlib
import ctypes
import math
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the oracle suite needs PyTorch")
import tilegrad as tg  # noqa: E402
import tilegrad.torch as tt  # noqa: E402
from tilegrad import _torch_common as tc  # noqa: E402
from tilegrad import capi  # noqa: E402

BF = tg.bf16
# the oracle modules set torch's default dtype to float64 at import
pytestmark = pytest.mark.usefixtures("float32_default_dtype")
STEP = "tg_attn_train_bwd_step"
DKV = capi.TG_ATTN_OPT_DKV_WRITE
F32, BF16 = capi.TG_DTYPE_F32, capi.TG_DTYPE_BF16


@pytest.fixture(scope="module", autouse=True)
def _needs_step(lib):
    if not lib.has(STEP):
        pytest.skip(f"{STEP} is not exported by {lib.path}")


def test_signature_follows_the_header():
    """capi's argtypes for the step, parameter by parameter against the
    prototype in include/tilegrad.h (ints for the tg_dtype pair and causal,
    struct pointers for the params, mask params and options)."""
    hdr = os.path.join(os.path.dirname(__file__), "..", "..", "include", "tilegrad.h")
    with open(hdr) as f:
        text = f.read()
    proto = re.search(r"tg_status\s+tg_attn_train_bwd_step\s*\(([^)]*)\)", text)
    assert proto, "no tg_attn_train_bwd_step prototype in include/tilegrad.h"
    params = [" ".join(x.split()) for x in proto.group(1).split(",")]
    sig = capi.KERNEL_SIGNATURES[STEP]
    assert len(params) == len(sig) == 17, (params, sig)
    want = {"tg_dtype": capi._I, "int": capi._I, "const tg_attn_params": capi._PP,
            "const tg_attn_mask_params": capi._PM, "const tg_attn_options": capi._PO}
    for decl, t in zip(params, sig):
        base = decl.rsplit(" ", 1)[0].rstrip("*").strip()
        name = decl.rsplit(" ", 1)[1]
        if name.startswith("*") or decl.split()[-2].endswith("*"):
            assert t is want.get(base, capi._P), (decl, t)
        else:
            assert t is want[base], (decl, t)


# ---------------------------------------------------------------------------
# raw buffers

def _draw(rng, shape, dt, std=1.0):
    """Random values of tg_dtype dt: raw bf16 bits (uint16) or float32."""
    x = rng.standard_normal(shape) * std
    return BF.from_float(x) if dt == BF16 else x.astype(np.float32)


def _garbage(shape, gdt):
    """A prefill for an output the call writes (bf16 0x7777, f32 7.75)."""
    return np.full(shape, 0x7777, np.uint16) if gdt == BF16 else np.full(shape, 7.75, np.float32)


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _first_diff(name, a, b):
    """How a (the step's) and b (the three calls') differ, for the message."""
    ia = a.view(np.uint16 if a.itemsize == 2 else np.uint32)
    ib = b.view(ia.dtype)
    bad = np.flatnonzero((ia != ib).reshape(-1))
    i = int(bad[0])
    fa, fb = (BF.to_float(x.reshape(-1)[i:i + 1])[0] if x.dtype == np.uint16 else
              x.reshape(-1)[i] for x in (a, b))
    at = tuple(int(j) for j in np.unravel_index(i, a.shape))
    return (f"{name}: {bad.size} of {a.size} elements differ; first at {at}: step "
            f"{ia.reshape(-1)[i]:#x} ({fa!r}), three calls {ib.reshape(-1)[i]:#x} ({fb!r})")


class Problem:
    """One backward problem: inputs of tg_dtype dt (Q, K, V contiguous; O
    and dO contiguous [B,H,qL,Dv] or, blhd, stored [B,qL,H,Dv] and read
    through the params' O_strides), O and L from tg_attn_train_fwd."""

    def __init__(self, ctx, seed, dt, B, H, Hkv, qL, kL, D, Dv=None, causal=False,
                 mask=None, cap=1.0, window=0, sinks=False, dropout=0.0, blhd=False,
                 nan_q=False, q_off=None):
        rng = np.random.default_rng(seed)
        Dv = Dv or D
        self.dt, self.causal, self.shape = dt, int(causal), (B, H, Hkv, qL, kL, D, Dv)
        self.Q = _draw(rng, (B, H, qL, D), dt)
        self.K = _draw(rng, (B, Hkv, kL, D), dt)
        self.V = _draw(rng, (B, Hkv, kL, Dv), dt)
        if nan_q:
            self.Q[0, H - 1, qL // 2, 1] = BF.BF16_NAN if dt == BF16 else np.nan
        self.blhd = blhd
        o_shape = (B, qL, H, Dv) if blhd else (B, H, qL, Dv)
        o_strides = (qL * H * Dv, Dv, H * Dv) if blhd else (H * qL * Dv, qL * Dv, Dv)
        self.dO = _draw(rng, o_shape, dt)
        p = capi.attn_params(B, H, Hkv, qL, kL, D, 1.0 / math.sqrt(D), cap, O_strides=o_strides,
                             V_strides=(Hkv * kL * Dv, kL * Dv, Dv))
        if q_off is not None:
            p.qL_off = q_off
        self.p = p
        self.mask = self.mp = None
        if mask == "broadcast":             # [1, H, qL, kL] over the batch, -inf columns
            m = _draw(rng, (1, H, qL, kL), dt, 2.0)
            m[..., 1::5] = BF.BF16_NEG_INF if dt == BF16 else -np.inf
            self.mask = m
            self.mp = capi.AttnMaskParams()
            self.mp.M_strides[0], self.mp.M_strides[1], self.mp.M_strides[2] = 0, qL * kL, kL
        self.sinks = (rng.standard_normal(H) * 2).astype(np.float32) if sinks else None
        if sinks:
            self.sinks[0] = -np.inf        # a head without a sink
        opt = dict(window=window, v_head_dim=Dv if Dv != D else 0)
        if dropout:
            opt.update(dropout_p=dropout, dropout_seed=int(rng.integers(2 ** 63)),
                       dropout_offset=int(rng.integers(2 ** 40)))
        self.opt_kw = opt
        self.O = np.empty(o_shape, self.Q.dtype)
        self.L = np.empty((B, H, qL), np.float32)
        ctx.call("tg_attn_train_fwd", dt, self.Q, self.K, self.V, self.O, self.L, self.p,
                 self.mp, self.mask, self.causal, self.options())

    def options(self, flags=0, d_sinks=None):
        kw = dict(self.opt_kw)
        if not (any(kw.values()) or flags or self.sinks is not None):
            return None
        o = capi.AttnOptions(flags=flags, **kw)
        if self.sinks is not None:
            o.sinks = self.sinks.ctypes.data
            if d_sinks is not None:
                o.d_sinks = d_sinks.ctypes.data
        return o

    def _contig(self, a):
        """[B,H,qL,Dv] contiguous copy of O or dO (compute_d's layout)."""
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)) if self.blhd else a

    def outputs(self, gdt):
        B, H, Hkv, qL, kL, D, Dv = self.shape
        return (_garbage((B, H, qL, D), gdt), _garbage((B, Hkv, kL, D), gdt),
                _garbage((B, Hkv, kL, Dv), gdt), np.full(H, 0.375, np.float32))

    def three_calls(self, ctx, gdt):
        """compute_d + tg_attn_train_bwd (DKV_WRITE) + the casts: (dq, dk, dv, d_sinks)."""
        B, H, Hkv, qL, kL, D, Dv = self.shape
        Dvec = np.full((B, H, qL), np.nan, np.float32)
        ctx.call("tg_attn_train_bwd_compute_d", self.dt, self._contig(self.O),
                 self._contig(self.dO), Dvec, B, H, qL, Dv)
        dq = np.full((B, H, qL, D), np.nan, np.float32)
        dk = np.full((B, Hkv, kL, D), 7.75, np.float32)
        dv = np.full((B, Hkv, kL, Dv), 7.75, np.float32)
        ds = self.outputs(gdt)[3]
        ctx.call("tg_attn_train_bwd", self.dt, self.Q, self.K, self.V, self.L, self.dO, Dvec,
                 dq, dk, dv, self.p, self.mp, self.mask, self.causal, self.options(DKV, ds))
        if gdt == F32:
            return dq, dk, dv, ds
        out = []
        for g in (dq, dk, dv):
            b = np.full(g.shape, 0x7777, np.uint16)
            ctx.call("tg_f32_to_bf16_cast", g, b, ctypes.c_uint64(g.size))
            out.append(b)
        return (*out, ds)

    def step(self, ctx, gdt, flags=0):
        dq, dk, dv, ds = self.outputs(gdt)
        ctx.call(STEP, self.dt, gdt, self.Q, self.K, self.V, self.O, self.L, self.dO, dq, dk,
                 dv, self.p, self.mp, self.mask, self.causal, self.options(flags, ds))
        return dq, dk, dv, ds


def _assert_same(got, want, what):
    for name, a, b in zip(("dq", "dk", "dv", "d_sinks"), got, want):
        assert _same(a, b), f"{what}: " + _first_diff(name, a, b)


# name: (Problem kwargs); dt is a parameter
CASES = {
    "gqa_causal_qL<kL": dict(B=2, H=4, Hkv=2, qL=37, kL=53, D=64, causal=True),
    "causal_qL>kL_dead_rows": dict(B=1, H=2, Hkv=1, qL=41, kL=19, D=32, causal=True),
    "mask_softcap_blhd": dict(B=2, H=4, Hkv=4, qL=33, kL=17, D=40, mask="broadcast", cap=20.0,
                              blhd=True),
    "window_sinks_dv_blhd": dict(B=2, H=4, Hkv=2, qL=45, kL=45, D=32, Dv=48, causal=True,
                                 window=12, sinks=True, blhd=True),
    "window_sinks_mask_qoff0": dict(B=1, H=2, Hkv=1, qL=24, kL=40, D=16, window=7, sinks=True,
                                    mask="broadcast", q_off=0),
    "dropout_gqa": dict(B=1, H=4, Hkv=1, qL=32, kL=48, D=24, causal=True, dropout=0.25),
    "tiles_d128": dict(B=1, H=2, Hkv=2, qL=96, kL=80, D=128),
    # key ranges (dQ partials) even on the machine's own plan, more planned for
    # 16 and 64 CPUs; causal: ranges whose keys some q-tiles never see
    "long_keys": dict(B=1, H=4, Hkv=4, qL=32, kL=512, D=16),
    "long_keys_gqa_causal_window": dict(B=1, H=4, Hkv=2, qL=70, kL=530, D=32, causal=True,
                                        window=300),
    "one_by_one": dict(B=1, H=1, Hkv=1, qL=1, kL=1, D=8),
    "nan_in_q": dict(B=1, H=2, Hkv=1, qL=20, kL=30, D=16, causal=True, nan_q=True),
}

# work plans as if the machine had these CPUs and this L2 per CPU (None: its
# own; tilegrad_testing.h): several key ranges (dQ partials), query groups
# (dK, dV parts) and one-tile key chunks, whatever this machine has; each
# with contexts (threads, deterministic, isa). Deterministic mode plans for
# the CPUs, other contexts for at most their threads (3: more than a 2-CPU
# machine has, so the forced count matters to them)
PLANS = {
    "own_plan": (None, None, [(1, False, None), (2, False, None), (2, True, None),
                              (2, False, "portable")]),
    "plan16": (16, None, [(1, True, None), (3, False, None), (2, True, "portable")]),
    "plan64_l2_0": (64, 0, [(2, True, None), (3, False, None)]),
}


@contextlib.contextmanager
def _planned(lib, cpus, l2_bytes):
    """Plans for `cpus` CPUs and `l2_bytes` of L2 (the test hooks, when the
    library exports them), restored afterwards."""
    hooks = [(name, value, reset, ctype) for name, value, reset, ctype in
             (("tg_testing_plan_cpus", cpus, 0, ctypes.c_int),
              ("tg_testing_plan_l2_bytes", l2_bytes, -1, ctypes.c_longlong))
             if value is not None]
    if not all(lib.has(h[0]) for h in hooks):
        pytest.skip("the library does not export tilegrad_testing.h's plan hooks")
    funcs = []
    for name, value, reset, ctype in hooks:
        f = getattr(lib.dll, name)
        f.restype, f.argtypes = None, [ctype]
        funcs.append((f, value, reset))
    try:
        for f, value, _ in funcs:
            f(value)
        yield
    finally:
        for f, _, reset in funcs:
            f(reset)


@pytest.fixture(scope="module")
def contexts(lib):
    made = {}

    def get(threads, det, isa, schedule=None):
        key = (threads, det, isa, schedule)
        if key not in made:
            made[key] = tg.Context(threads=threads, deterministic=det, isa=isa, lib=lib,
                                   attn_schedule=schedule)
        return made[key]

    yield get
    for c in made.values():
        c.close()


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dt", [BF16, F32], ids=["bf16", "f32"])
def test_step_is_the_three_calls_bitwise(lib, contexts, case, dt, plan):
    kw = CASES[case]
    cpus, l2_bytes, ctxs = PLANS[plan]
    with _planned(lib, cpus, l2_bytes):
        for threads, det, isa in ctxs:
            ctx = contexts(threads, det, isa)
            modes = ("exact", "split", "bf16") if dt == BF16 else ("exact",)
            for mode in modes:
                ctx.attn_precision = mode
                try:
                    prob = Problem(ctx, 17 + len(case), dt, **kw)
                    for gdt in (BF16, F32):
                        want = prob.three_calls(ctx, gdt)
                        what = (f"{case} dtype {'bf16' if dt == BF16 else 'f32'} grads "
                                f"{'bf16' if gdt == BF16 else 'f32'} threads {threads} det "
                                f"{det} isa {ctx.isa} precision {mode} {plan}")
                        _assert_same(prob.step(ctx, gdt), want, what)
                        _assert_same(prob.step(ctx, gdt, flags=DKV), want,
                                     what + " (flag DKV)")
                finally:
                    ctx.attn_precision = "exact"
    if kw.get("nan_q"):                 # the NaN reached the gradients (as 0x7FC0)
        assert (prob.step(ctx, BF16)[0] == BF.BF16_NAN).any()


def test_step_takes_the_kv_schedule_for_bf16_gradients(contexts):
    """bf16 gradients: the KV schedule whatever the context asked (the
    ATOMIC one adds to f32): the bits of the three calls on a KV context."""
    kv, atomic = contexts(2, False, None), contexts(2, False, None, "atomic")
    assert atomic.attn_schedule == "atomic"
    for case in ("gqa_causal_qL<kL", "window_sinks_dv_blhd", "dropout_gqa"):
        for dt in (BF16, F32):
            prob = Problem(kv, 5, dt, **CASES[case])
            _assert_same(prob.step(atomic, BF16), prob.three_calls(kv, BF16),
                         f"{case} atomic context, bf16 gradients")


def test_step_refusals_write_nothing(contexts):
    ctx = contexts(2, False, None)
    prob = Problem(ctx, 3, BF16, B=1, H=2, Hkv=1, qL=9, kL=13, D=16, causal=True, sinks=True)
    B, H, Hkv, qL, kL, D, Dv = prob.shape

    def refused(exc, gdt=BF16, dt=BF16, O=prob.O, outs=None, p=prob.p, Q=prob.Q, K=prob.K,
                V=prob.V, match=None):
        """The call raises exc (its status's class, the library's message) and
        leaves dQ, dK, dV and d_sinks as they were."""
        outs = outs or prob.outputs(gdt if gdt in (BF16, F32) else BF16)
        before = [a.copy() for a in outs]
        dq, dk, dv, ds = outs
        with pytest.raises(exc, match=match) as ei:
            ctx.call(STEP, dt, gdt, Q, K, V, O, prob.L, prob.dO, dq, dk, dv, p, None, None,
                     1, prob.options(0, ds))
        e = ei.value
        assert e.func == STEP and e.detail and e.detail == ctx.last_error, e
        assert e.status_str in str(e) and e.detail in str(e)
        for name, a, b in zip(("dq", "dk", "dv", "d_sinks"), outs, before):
            assert _same(a, b), f"{name} written by a refused call ({e})"
        return e

    for gdt in (5, 2, -1):       # the message names the argument and its value
        e = refused(tg.BadParamsError, gdt=gdt, match="grad_dtype")
        assert str(gdt) in e.detail, e.detail
    refused(tg.BadParamsError, dt=5, match="dtype")
    refused(tg.NullArgError, O=None)
    # head dim 12 (not a multiple of 8): as tg_attn_train_bwd
    p12 = capi.attn_params(B, H, Hkv, qL, kL, 12, 0.25)
    q12, k12 = np.zeros((B, H, qL, 12), np.uint16), np.zeros((B, Hkv, kL, 12), np.uint16)
    v12 = np.zeros((B, Hkv, kL, 12), np.uint16)
    outs12 = (_garbage((B, H, qL, 12), BF16), _garbage((B, Hkv, kL, 12), BF16),
              _garbage((B, Hkv, kL, 12), BF16), np.full(H, 0.375, np.float32))
    refused(tg.UnsupportedError, p=p12, Q=q12, K=k12, V=v12, outs=outs12, match="head dim")

    # the outputs' extents are in grad_dtype's element size: dK right after
    # dQ in one buffer runs; one element into dQ is refused
    for gdt in (BF16, F32):
        nq, nk, nv = B * H * qL * D, B * Hkv * kL * D, B * Hkv * kL * Dv
        buf = _garbage(nq + nk + nv, gdt)
        dq, dk, dv = buf[:nq], buf[nq:nq + nk], buf[nq + nk:]
        want = prob.three_calls(ctx, gdt)
        ds = np.full(H, 0.375, np.float32)
        ctx.call(STEP, BF16, gdt, prob.Q, prob.K, prob.V, prob.O, prob.L, prob.dO, dq, dk, dv,
                 prob.p, None, None, 1, prob.options(0, ds))
        _assert_same((dq.reshape(want[0].shape), dk.reshape(want[1].shape),
                      dv.reshape(want[2].shape), ds), want, "adjacent outputs")
        buf = _garbage(nq + nk + nv, gdt)
        ovl = (buf[:nq], buf[nq - 1:nq - 1 + nk], _garbage(nv, gdt),
               np.full(H, 0.375, np.float32))
        refused(tg.AliasError, gdt=gdt, outs=ovl)
        # an output over the input O (dO's layout, the params' O strides)
        if gdt == BF16:
            o_as = prob.O.reshape(-1)
            refused(tg.AliasError, gdt=gdt, outs=(o_as[:nq], _garbage(nk, gdt),
                                                  _garbage(nv, gdt),
                                                  np.full(H, 0.375, np.float32)))


# ---------------------------------------------------------------------------
# the torch op: bitwise the earlier body (compute_d + tg_attn_train_bwd +
# torch's .to(q.dtype))


def _old_op_bwd(do, q, k, v, o, lse, mask, causal, scale, softcap, q_offset, dropout_p, seed,
                threads, deterministic, attn_precision, window=0, sinks=None):
    """tilegrad::attn_bwd's body before the step: compute_d, the f32 backward
    with dK, dV written, torch's RNE cast to q's dtype."""
    dt = tc._ATTN_DTYPES[q.dtype]
    B, H, qL, D = q.shape
    Dv = v.shape[3]
    dsinks = torch.zeros((H,) if sinks is not None else (0,), dtype=torch.float32)
    q, k, v = tc._inner_unit(q), tc._inner_unit(k), tc._inner_unit(v)
    do, o, lse = do.contiguous(), o.contiguous(), lse.contiguous()
    ctx = tc._context(threads, deterministic, attn_precision)
    delta = torch.empty((B, H, qL), dtype=torch.float32)
    ctx.call("tg_attn_train_bwd_compute_d", dt, tc._ptr(o), tc._ptr(do), tc._ptr(delta), B, H,
             qL, Dv)
    p = tc._attn_params(q, k, v, tc._bhl_strides(do), scale, softcap, q_offset)
    m, mp = tt._mask_args(mask, B, H, qL, k.shape[2])
    dq = torch.full(q.shape, math.nan, dtype=torch.float32)
    dk = torch.full(k.shape, 7.75, dtype=torch.float32)
    dv = torch.full(v.shape, 7.75, dtype=torch.float32)
    ctx.call("tg_attn_train_bwd", dt, tc._ptr(q), tc._ptr(k), tc._ptr(v), tc._ptr(lse),
             tc._ptr(do), tc._ptr(delta), tc._ptr(dq), tc._ptr(dk), tc._ptr(dv), p, mp,
             None if m is None else tc._ptr(m), 1 if causal else 0,
             tt._attn_options(dropout_p, seed, window, Dv if Dv != D else 0,
                              None if sinks is None else sinks.contiguous(), dsinks, DKV))
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dsinks


def _tbits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _torch_cases(dtype):
    g = torch.Generator().manual_seed(11)

    def r(*s):
        return torch.randn(s, generator=g, dtype=torch.float32).to(dtype)

    B, H, Hkv, qL, kL, D = 2, 4, 2, 21, 34, 32
    mask = r(1, H, qL, kL)
    mask[..., 2::7] = -math.inf
    sinks = torch.randn(H, generator=g, dtype=torch.float32)
    seed = torch.tensor(987654321, dtype=torch.int64)
    qs = r(B, qL, H, D).transpose(1, 2)          # a strided [B, L, H, D] view
    sc = 1 / math.sqrt(D)
    # (q, k, v, mask, causal, scale, softcap, q_offset, dropout_p, seed, threads, det,
    #  attn_precision, window, sinks)
    return {
        "gqa_causal": (r(B, H, qL, D), r(B, Hkv, kL, D), r(B, Hkv, kL, D), None, True, sc, 1.0,
                       kL - qL, 0.0, None, 2, False, 0, 0, None),
        "mask_softcap_strided": (qs, r(B, Hkv, kL, D), r(B, Hkv, kL, D), mask, False, sc, 30.0,
                                 kL - qL, 0.0, None, 1, True, 1, 0, None),
        "window_sinks_dv": (r(B, H, qL, D), r(B, Hkv, kL, D), r(B, Hkv, kL, 48), None, True,
                            sc, 1.0, kL - qL, 0.0, None, 2, True, 2, 9, sinks),
        "dropout_mask": (r(B, H, qL, D), r(B, Hkv, kL, D), r(B, Hkv, kL, D), mask, True, sc,
                         1.0, kL - qL, 0.2, seed, 2, False, 0, 0, None),
        "qL_gt_kL_sinks": (r(1, 2, 40, 16), r(1, 1, 17, 16), r(1, 1, 17, 16), None, True, 0.25,
                           1.0, 17 - 40, 0.0, None, 1, False, 0, 0, sinks[:2].contiguous()),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_torch_op_gradients_unchanged(dtype):
    """The op's gradients (called directly, and through autograd of the
    forward op) bitwise those of its earlier body; of q's dtype, contiguous,
    with the fake implementation's shapes and dtypes."""
    for name, args in _torch_cases(dtype).items():
        q, k, v, mask, causal, scale, cap, off, p, seed, th, det, ap, win, sinks = args
        o, lse = tt._attn_fwd_impl(*args)
        gen = torch.Generator().manual_seed(5)
        do = torch.randn(o.shape, generator=gen, dtype=torch.float32).to(dtype)
        bwd_args = (do, q, k, v, o, lse, mask, causal, scale, cap, off, p, seed, th, det, ap,
                    win, sinks)
        want = _old_op_bwd(*bwd_args)
        got = tt._attn_bwd_impl(*bwd_args)
        fake = tt._attn_bwd_fake(*bwd_args)
        if tt.HAVE_CUSTOM_OPS:
            got_op = torch.ops.tilegrad.attn_bwd(*bwd_args)
            for a, b in zip(got_op, got):
                assert torch.equal(_tbits(a), _tbits(b)), name
        for gname, a, b, f in zip(("dq", "dk", "dv", "dsinks"), got, want, fake):
            assert a.dtype == b.dtype == f.dtype and a.shape == b.shape == f.shape, \
                (name, gname, a.dtype, b.dtype, f.dtype, a.shape, b.shape, f.shape)
            assert a.is_contiguous(), (name, gname)
            if not torch.equal(_tbits(a), _tbits(b)):
                bad = (_tbits(a) != _tbits(b)).nonzero()
                i = tuple(bad[0].tolist())
                pytest.fail(f"{name} {gname}: {len(bad)} of {a.numel()} differ; first at {i}: "
                            f"step {a[i].item()!r} vs old body {b[i].item()!r}")
        # through autograd: the forward op's backward is the op above
        if q.is_contiguous():
            ql = base = q.detach().clone().requires_grad_(True)
        else:                   # the strided view: of a [B, qL, H, D] leaf
            base = q.detach().transpose(1, 2).clone().requires_grad_(True)
            ql = base.transpose(1, 2)
        kl, vl = (t.detach().clone().requires_grad_(True) for t in (k, v))
        s = None if sinks is None else sinks.detach().clone().requires_grad_(True)
        out = tt._attn_call(ql, kl, vl, mask, causal, scale, cap, off, p, seed, th, det, ap,
                            win, s)
        assert torch.equal(_tbits(out), _tbits(o)), name
        out.backward(do)
        dq_leaf = base.grad if ql is base else base.grad.transpose(1, 2)
        for gname, g, b in zip(("dq", "dk", "dv", "dsinks"),
                               (dq_leaf, kl.grad, vl.grad, None if s is None else s.grad),
                               want):
            if g is not None:
                assert torch.equal(_tbits(g), _tbits(b)), (name, gname, "autograd")


def test_torch_op_empty_shapes_unchanged():
    """The empty-shape branch: zeros of the inputs' dtype; with sinks and
    kL = 0 the sinks' gradient from O = 0 (no library call)."""
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(1, 2, 5, 16, dtype=torch.float32).to(dtype)
        k, v = torch.zeros(1, 1, 0, 16, dtype=dtype), torch.zeros(1, 1, 0, 16, dtype=dtype)
        s = torch.tensor([0.5, -1.0], dtype=torch.float32)
        o, lse = tt._attn_fwd_impl(q, k, v, None, False, 0.25, 1.0, 0, 0.0, None, 1, False, 0,
                                   0, s)
        do = torch.randn(o.shape, dtype=torch.float32).to(dtype)
        dq, dk, dv, ds = tt._attn_bwd_impl(do, q, k, v, o, lse, None, False, 0.25, 1.0, 0, 0.0,
                                           None, 1, False, 0, 0, s)
        assert dq.dtype == dk.dtype == dv.dtype == dtype and ds.dtype == torch.float32
        assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape
        assert torch.equal(ds, torch.zeros(2, dtype=torch.float32))   # O = 0: delta 0
