"""PyTorch-autograd oracle for tilegrad's attention kernels 1-3 (KERNELS.md):

  1. tg_flash_attn_train_bwd_compute_d_bf16
  2. tg_flash_attn_train_bwd_bf16
  3. tg_f32_to_bf16_cast
  (+ tg_attn_params_init and tg_flash_attn_train_fwd_bf16 when exported)

The oracle
----------
Q, K, V, dO and the additive mask are bf16 values, held exactly as float64
torch tensors. The forward is written out by hand (no SDPA): GQA by
repeat_interleave of K/V over the head dim, S = scale*Q.K^T, optional softcap
c*tanh(s/c) *before* the mask, bottom-right-aligned causality (key k visible to
query i iff k <= i + kL - qL), additive mask with -inf entries. Fully masked
rows are handled explicitly (torch's softmax would give NaN there): their P
row is 0 and they contribute no gradient.

tilegrad's backward does not see O; it sees L (f32) and D = rowsum(O_bf16*dO)
(f32, from its own compute_d kernel on the bf16-rounded O). Its exact answer
for *those* inputs is the gradient of the surrogate

    F(Q, K, V) = sum_ik P~[i,k] * dP[i,k]  -  sum_i D[i] * sum_k P~[i,k],
    P~ = exp(S(Q,K) - L)   (L, D constants),   dP = dO . V^T,

since dF/dV = P~^T dO and dF/dS = P~ (dP - D): exactly the contract's
formulas, with the chain rule through scale, softcap and GQA done by torch
autograd in float64. Two checks per example:

  (a) tight: tilegrad vs autograd of F with the L and D tilegrad was given.
      Only tilegrad's own f32 arithmetic separates them; the tolerance is a
      first-order worst-case f32 error bound built from the magnitudes of the
      summed terms (|Q|.|K|, |dO|.|V|, P~(|dP|+|D|), ...), never from the
      result, because dQ/dK sums cancel (see `_tight_bounds`).
  (b) end to end: tilegrad vs plain torch autograd of O = softmax(S).V
      (float64, the true gradient). The tolerance is (a)'s plus an explicit
      bound of what feeding bf16-rounded O (through D) and f32-rounded L
      perturbs: |dD| <= 2^-8 sum_d |O||dO| + compute_d's error, which moves
      dS by P|dD|, and |dL| <= 2^-24|L| which moves P by a relative 2^-23|L|.
  The surrogate itself is validated in every example: with the exact (f64) L
  and D its gradient must equal plain autograd to ~1e-12.
"""
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the oracle needs PyTorch (python3-torch)")
from hypothesis import given, settings, strategies as st  # noqa: E402

import tilegrad as tg  # noqa: E402
from tilegrad import capi as tgc  # noqa: E402

torch.set_default_dtype(torch.float64)

U32 = 2.0 ** -24   # f32 unit roundoff
UBF = 2.0 ** -8    # bf16 unit roundoff (8 significant bits)
SAFETY = 2.0       # multiplier on the first-order worst-case bounds
FLOOR = 1e-30


def examples(n):
    """Per-test example count, scaled by $TG_ORACLE_EXAMPLES (default 1)."""
    return max(1, int(n * float(os.environ.get("TG_ORACLE_EXAMPLES", "1"))))      # absolute floor (f32 subnormal granularity is ~1e-45)

BWD = "tg_flash_attn_train_bwd_bf16"
CD = "tg_flash_attn_train_bwd_compute_d_bf16"
FWD = "tg_flash_attn_train_fwd_bf16"
BF16_NAN = np.uint16(0x7FC0)


def require(lib, *names):
    missing = [n for n in names if not lib.has(n)]
    if missing:
        pytest.skip("not in the library yet: " + ", ".join(missing))


# ---------------------------------------------------------------------------
# bf16 data and strided storage

def bf16_rand(rng, shape, std=1.0):
    """Random bf16 values: (raw bits uint16, exact values float64 tensor)."""
    x = (rng.standard_normal(shape) * std).astype(np.float32)
    t = torch.from_numpy(x).to(torch.bfloat16)
    bits = t.view(torch.int16).numpy().view(np.uint16).copy()
    return bits, t.to(torch.float64)


def to_bf16_bits(t):
    """float tensor -> raw bf16 bits (torch's round-to-nearest-even)."""
    return t.to(torch.float32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


LAYOUTS = ("bhld", "blhd", "bhld_pad", "blhd_pad")


def layout_strides(layout, B, Hx, L, D):
    rs = D + 8 if layout.endswith("_pad") else D     # padded rows
    if layout.startswith("bhld"):
        return (Hx * L * rs, L * rs, rs)
    return (L * Hx * rs, rs, Hx * rs)                # [B, L, H, D] storage


def store_strided(bits, strides, fill=BF16_NAN):
    """Scatter logical [n0, n1, n2, inner] bits into a flat buffer with the
    given element strides (innermost 1). Gaps hold bf16 NaN, so a kernel that
    reads outside the logical elements produces NaN and fails."""
    n0, n1, n2, inner = bits.shape
    size = (n0 - 1) * strides[0] + (n1 - 1) * strides[1] + (n2 - 1) * strides[2] + inner
    buf = np.full(size, fill, dtype=np.uint16)
    it = buf.itemsize
    view = np.lib.stride_tricks.as_strided(
        buf, shape=bits.shape, strides=tuple(s * it for s in strides) + (it,))
    view[...] = bits
    return buf


# ---------------------------------------------------------------------------
# the reference (float64 torch)

def scores(Q, K, g, scale, cap, causal, madd, mvis):
    """S [B,H,qL,kL] and visibility; Q [B,H,qL,D], K [B,Hkv,kL,D]."""
    Kr = K.repeat_interleave(g, dim=1)
    s = scale * (Q @ Kr.transpose(-1, -2))
    S = cap * torch.tanh(s / cap) if cap != 1.0 else s
    qL, kL = Q.shape[2], K.shape[2]
    vis = torch.ones(S.shape, dtype=torch.bool)
    if causal:
        i = torch.arange(qL).view(qL, 1)
        k = torch.arange(kL).view(1, kL)
        vis = vis & (k <= i + (kL - qL))
    if madd is not None:
        vis = vis & mvis
        S = S + madd
    return s, S, vis


def forward_exact(S, vis, V, g):
    """Exact L (natural-log logsumexp, -inf on fully masked rows), P, O."""
    Sm = torch.where(vis, S, torch.tensor(-math.inf)).detach()
    m = Sm.max(dim=-1, keepdim=True).values          # softmax is shift-invariant
    live = torch.isfinite(m)
    m0 = torch.where(live, m, torch.zeros_like(m))
    Sv = torch.where(vis, S, m0)                       # finite everywhere
    E = torch.where(vis, torch.exp(Sv - m0), torch.zeros_like(S))
    Z = E.sum(-1, keepdim=True)
    P = E / torch.where(Z > 0, Z, torch.ones_like(Z))
    L = torch.where(live, m0 + torch.log(torch.where(Z > 0, Z, torch.ones_like(Z))),
                    torch.full_like(m, -math.inf)).squeeze(-1)
    O = P @ V.repeat_interleave(g, dim=1)
    return L, P, O


def surrogate_P(S, vis, L):
    """P~ = exp(S - L) on visible entries, 0 elsewhere; NaN-free gradients."""
    Lc = L.unsqueeze(-1)
    live = torch.isfinite(Lc)
    L0 = torch.where(live, Lc, torch.zeros_like(Lc))
    Sv = torch.where(vis, S, L0)
    return torch.where(vis & live, torch.exp(Sv - L0), torch.zeros_like(S))


class Case:
    """One attention problem: bf16 inputs, strided buffers, params."""

    def __init__(self, B, H, g, qL, kL, D, causal, mask, dead_rows, cap, layouts,
                 threads, seed, scale_mult=1.0, isa=None):
        self.B, self.H, self.g, self.qL, self.kL, self.D = B, H, g, qL, kL, D
        self.Hkv = H // g
        self.causal, self.mask_mode, self.cap, self.threads = causal, mask, cap, threads
        self.isa = isa
        self.scale = float(np.float32(scale_mult / math.sqrt(D)))
        rng = np.random.default_rng(seed)
        self.rng = rng
        Hkv = self.Hkv
        self.q_bits, self.Q = bf16_rand(rng, (B, H, qL, D))
        self.k_bits, self.K = bf16_rand(rng, (B, Hkv, kL, D))
        self.v_bits, self.V = bf16_rand(rng, (B, Hkv, kL, D))
        self.do_bits, self.dO = bf16_rand(rng, (B, H, qL, D))

        # additive bf16 mask, possibly broadcast over batch and/or head
        self.madd = self.mvis = None
        self.mask_buf = self.mparams = None
        if mask != "none":
            Bm = 1 if mask in ("bcast_b", "bcast_bh") else B
            Hm = 1 if mask in ("bcast_h", "bcast_bh") else H
            mb, mv = bf16_rand(rng, (Bm, Hm, qL, kL), std=2.0)
            ninf = rng.random((Bm, Hm, qL, kL)) < 0.15
            if dead_rows:
                ninf[:, :, rng.random(qL) < 0.3, :] = True
            mb = np.where(ninf, np.uint16(0xFF80), mb)        # bf16 -inf
            mv = torch.where(torch.from_numpy(ninf), torch.tensor(-math.inf), mv)
            rs = kL + (3 if seed % 2 else 0)                   # padded mask rows sometimes
            ms = (0 if Bm == 1 else Hm * qL * rs, 0 if Hm == 1 else qL * rs, rs)
            # store_strided needs a full 4-D logical tensor: expand the broadcast dims
            full = np.broadcast_to(mb, (B, H, qL, kL))
            size = (B - 1) * ms[0] + (H - 1) * ms[1] + (qL - 1) * ms[2] + kL
            buf = np.full(size, BF16_NAN, dtype=np.uint16)
            view = np.lib.stride_tricks.as_strided(
                buf, shape=(B, H, qL, kL), strides=tuple(2 * s for s in ms) + (2,))
            view[...] = full    # broadcast dims alias the same memory: same values
            self.mask_buf = buf
            self.mparams = tgc.AttnMaskParams()
            for j in range(3):
                self.mparams.M_strides[j] = ms[j]
            mv = mv.expand(B, H, qL, kL)
            self.mvis = torch.isfinite(mv)
            self.madd = torch.where(self.mvis, mv, torch.zeros_like(mv))

        lq, lk, lv, lo = layouts
        self.layouts = layouts
        qs = layout_strides(lq, B, H, qL, D)
        ks = layout_strides(lk, B, Hkv, kL, D)
        vs = layout_strides(lv, B, Hkv, kL, D)
        os_ = layout_strides(lo, B, H, qL, D)
        self.q_buf = store_strided(self.q_bits, qs)
        self.k_buf = store_strided(self.k_bits, ks)
        self.v_buf = store_strided(self.v_bits, vs)
        self.do_buf = store_strided(self.do_bits, os_)
        self.o_strides = os_
        self.params = tgc.attn_params(B, H, Hkv, qL, kL, D, self.scale, cap,
                                      Q_strides=qs, K_strides=ks, V_strides=vs, O_strides=os_)

    def describe(self):
        return (f"B={self.B} H={self.H} gqa={self.g} qL={self.qL} kL={self.kL} D={self.D} "
                f"causal={self.causal} mask={self.mask_mode} cap={self.cap} "
                f"layouts={self.layouts} threads={self.threads} isa={self.isa} scale={self.scale}")

    def S(self, Q, K):
        return scores(Q, K, self.g, self.scale, self.cap, self.causal, self.madd, self.mvis)


# ---------------------------------------------------------------------------
# error bounds

def _sum_group(x, g):
    """[B,H,...] -> [B,H/g,...] summing the query heads that share a KV head."""
    B, H = x.shape[:2]
    return x.reshape(B, H // g, g, *x.shape[2:]).sum(2)


def _tight_bounds(c, s, S, vis, Pt, dP, Dv, L):
    """First-order worst-case bound of tilegrad's f32 error against the
    surrogate gradient with the same L and D, element by element.

    With u = 2^-24 and n-term f32 sums bounded by (n + slack)*u*sum|terms|:
      S   : e_S  = (D+8)u * scale*|Q|.|K|  + 8u(|S| + |mask|)
      P   : rel_P = e_S + 8u(|S| + |L|) + 16u        (exp(S - L) in f32)
      dP  : e_dP = (D+8)u * |dO|.|V|
      dS  : e_dS = P rel_P |dP - D| + P (e_dP + 8u(|dP| + |D|))
      softcap g = 1 - tanh^2(s/c): e_dSraw = e_dS g + |dS|(2 g e_S/|c| + 12u)
      dQ  : scale * (e_dSraw + (kL+8)u * P(|dP|+|D|)) . |K|
      dK  : scale * (e_dSraw + (g*qL+8)u * P(|dP|+|D|))^T . |Q|
      dV  : (P rel_P + (g*qL+8)u P)^T . |dO|
      dK/dV accumulate: the prefill counts as one more summed term, so
      (g*qL+8)u * |prefill| is added by the caller.
    The magnitude terms (P(|dP|+|D|), |Q|.|K| ...) bound every partial sum, so
    cancellation in dQ/dK cannot make the tolerance too small.
    """
    u = U32
    Q, K, V, dO, g = c.Q, c.K, c.V, c.dO, c.g
    Kr, Vr = K.repeat_interleave(g, 1).abs(), V.repeat_interleave(g, 1).abs()
    zero = torch.zeros_like(S)
    A_s = c.scale * (Q.abs() @ Kr.transpose(-1, -2))
    Sabs = torch.where(vis, S.abs(), zero)
    mabs = c.madd.abs() if c.madd is not None else zero
    Labs = torch.where(torch.isfinite(L), L.abs(), torch.zeros_like(L)).unsqueeze(-1)
    eS = (c.D + 8) * u * A_s + 8 * u * (Sabs + mabs)
    relP = eS + 8 * u * (Sabs + Labs) + 16 * u
    edP = (c.D + 8) * u * (dO.abs() @ Vr.transpose(-1, -2))
    Dc = Dv.unsqueeze(-1)
    Mds = Pt * (dP.abs() + Dc.abs())
    edS = Pt * relP * (dP - Dc).abs() + Pt * (edP + 8 * u * (dP.abs() + Dc.abs()))
    if c.cap != 1.0:
        gc = 1 - torch.tanh(s / c.cap) ** 2
        dS = Pt * (dP - Dc)
        edS = edS * gc + dS.abs() * (2 * gc * eS / abs(c.cap) + 12 * u)
    nq = g * c.qL
    bq = c.scale * ((edS + (c.kL + 8) * u * Mds) @ Kr)
    bk = _sum_group(c.scale * ((edS + (nq + 8) * u * Mds).transpose(-1, -2) @ Q.abs()), g)
    bv = _sum_group((Pt * relP + (nq + 8) * u * Pt).transpose(-1, -2) @ dO.abs(), g)
    return bq, bk, bv


def _input_perturbation_bounds(c, s, vis, P, dP, Dexact, dD_bound, L):
    """Bound of how much the D and L tilegrad is fed (bf16-rounded O, f32 L)
    move the exact gradient: dS changes by P*|dD| + P*rel_L*|dP - D|,
    P by P*rel_L, with rel_L = 2u|L| (f32 rounding of L, to first order)."""
    g = c.g
    Kr = c.K.repeat_interleave(g, 1).abs()
    Labs = torch.where(torch.isfinite(L), L.abs(), torch.zeros_like(L)).unsqueeze(-1)
    relL = 2 * U32 * Labs + 4 * U32
    Dc = Dexact.unsqueeze(-1)
    ddS = P * dD_bound.unsqueeze(-1) + P * relL * ((dP - Dc).abs() + dD_bound.unsqueeze(-1))
    if c.cap != 1.0:
        ddS = ddS * (1 - torch.tanh(s / c.cap) ** 2)
    bq = c.scale * (ddS @ Kr)
    bk = _sum_group(c.scale * (ddS.transpose(-1, -2) @ c.Q.abs()), g)
    bv = _sum_group((P * relL).transpose(-1, -2) @ c.dO.abs(), g)
    return bq, bk, bv


def assert_close(name, got, ref, tol, case, extra=""):
    got = torch.as_tensor(got, dtype=torch.float64)
    err = (got - ref).abs()
    bad = ~(err <= tol)          # NaN counts as bad
    if bool(bad.any()):
        idx = tuple(int(x) for x in torch.nonzero(bad)[0])
        ratio = (err / tol).nan_to_num(nan=math.inf)
        worst = tuple(int(x) for x in np.unravel_index(int(ratio.argmax()), tuple(ratio.shape)))
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.numel()} elements outside tolerance; "
            f"first {idx}: got {got[idx].item()!r} ref {ref[idx].item()!r} tol {tol[idx].item():.3e}; "
            f"worst {worst}: got {got[worst].item()!r} ref {ref[worst].item()!r} "
            f"tol {tol[worst].item():.3e}\n  case: {case.describe()} {extra}")
    return float((err / tol).max()) if err.numel() else 0.0


# ---------------------------------------------------------------------------
# the backward check

def run_backward_case(lib, ctx_factory, c, seed):
    ctx = ctx_factory(c.threads, isa=c.isa)
    B, H, Hkv, qL, kL, D, g = c.B, c.H, c.Hkv, c.qL, c.kL, c.D, c.g

    # exact forward (f64) -> O, L
    s, S, vis = c.S(c.Q, c.K)
    L_exact, P_exact, O_exact = forward_exact(S, vis, c.V, g)
    L_fed = L_exact.to(torch.float32)                       # what a f32 forward hands over
    L_np = np.ascontiguousarray(L_fed.numpy())
    o_bits = to_bf16_bits(O_exact)
    O_bf = torch.from_numpy(tg.bf16.to_float(o_bits).astype(np.float64))

    # kernel 1: D = rowsum(O_bf16 * dO) -- vs torch
    D_tg = np.full(B * H * qL, np.nan, dtype=np.float32)
    ctx.call(CD, np.ascontiguousarray(o_bits.reshape(-1)),
             np.ascontiguousarray(c.do_bits.reshape(-1)), D_tg, B, H, qL, D)
    D_ref = (O_bf * c.dO).sum(-1)
    # products of two bf16 values are exact in f32; only the D-term sum rounds
    tolD = SAFETY * (D + 4) * U32 * (O_bf.abs() * c.dO.abs()).sum(-1) + FLOOR
    assert_close("compute_d", torch.from_numpy(D_tg.astype(np.float64)).view(B, H, qL),
                 D_ref, tolD, c)
    D_fed = torch.from_numpy(D_tg.astype(np.float64)).view(B, H, qL)

    # kernel 2
    dQ = np.full(B * H * qL * D, np.nan, dtype=np.float32)          # writes
    dK0 = c.rng.standard_normal(B * Hkv * kL * D).astype(np.float32)  # accumulates
    dV0 = c.rng.standard_normal(B * Hkv * kL * D).astype(np.float32)
    dK, dV = dK0.copy(), dV0.copy()
    try:
        ctx.call(BWD, c.q_buf, c.k_buf, c.v_buf, L_np, c.do_buf, D_tg, dQ, dK, dV,
                 c.params, c.mparams, c.mask_buf, int(c.causal))
    except tg.TilegradError as e:
        if c.cap != 1.0 and e.status == tgc.TG_ERR_UNSUPPORTED:
            # allowed by the contract; but then nothing may have been written
            assert np.isnan(dQ).all()
            assert dK.tobytes() == dK0.tobytes() and dV.tobytes() == dV0.tobytes()
            return {}
        raise AssertionError(f"{e}\n  case: {c.describe()}") from e

    # (a) surrogate gradient with the L and D tilegrad was given
    Q = c.Q.clone().requires_grad_(True)
    K = c.K.clone().requires_grad_(True)
    V = c.V.clone().requires_grad_(True)
    s_, S_, vis_ = c.S(Q, K)
    L_in = L_fed.to(torch.float64)
    Pt = surrogate_P(S_, vis_, L_in)
    dP = c.dO @ V.repeat_interleave(g, 1).transpose(-1, -2)
    F = (Pt * dP).sum() - (D_fed.unsqueeze(-1) * Pt).sum()
    gQ, gK, gV = torch.autograd.grad(F, (Q, K, V))

    with torch.no_grad():
        bq, bk, bv = _tight_bounds(c, s, S, vis, Pt.detach(), dP.detach(), D_fed, L_in)
    dQ_t = torch.from_numpy(dQ.astype(np.float64)).view(B, H, qL, D)
    dK_t = torch.from_numpy(dK.astype(np.float64)).view(B, Hkv, kL, D)
    dV_t = torch.from_numpy(dV.astype(np.float64)).view(B, Hkv, kL, D)
    dK0_t = torch.from_numpy(dK0.astype(np.float64)).view(B, Hkv, kL, D)
    dV0_t = torch.from_numpy(dV0.astype(np.float64)).view(B, Hkv, kL, D)
    refK, refV = dK0_t + gK, dV0_t + gV
    tq = SAFETY * bq + FLOOR
    # the prefill is one more summed term: an implementation may accumulate
    # each query head / query block separately, every add rounding against it
    nacc = (g * qL + 8) * U32
    tk = SAFETY * (bk + nacc * dK0_t.abs()) + FLOOR
    tv = SAFETY * (bv + nacc * dV0_t.abs()) + FLOOR
    ratios = {
        "dQ": assert_close("dQ (tight)", dQ_t, gQ, tq, c, f"seed={seed}"),
        "dK": assert_close("dK (tight, prefill + grad)", dK_t, refK, tk, c, f"seed={seed}"),
        "dV": assert_close("dV (tight, prefill + grad)", dV_t, refV, tv, c, f"seed={seed}"),
    }

    # the surrogate with the exact L and D is plain autograd -- validate that,
    # then (b) compare tilegrad end to end with plain autograd
    Q2 = c.Q.clone().requires_grad_(True)
    K2 = c.K.clone().requires_grad_(True)
    V2 = c.V.clone().requires_grad_(True)
    s2, S2, vis2 = c.S(Q2, K2)
    _, _, O2 = forward_exact(S2, vis2, V2, g)
    aQ, aK, aV = torch.autograd.grad((O2 * c.dO).sum(), (Q2, K2, V2))
    with torch.no_grad():
        D_exact = (O_exact * c.dO).sum(-1)
        Pe = surrogate_P(S, vis, L_exact)
    Q3 = c.Q.clone().requires_grad_(True)
    K3 = c.K.clone().requires_grad_(True)
    V3 = c.V.clone().requires_grad_(True)
    s3, S3, vis3 = c.S(Q3, K3)
    Pt3 = surrogate_P(S3, vis3, L_exact)
    dP3 = c.dO @ V3.repeat_interleave(g, 1).transpose(-1, -2)
    F3 = (Pt3 * dP3).sum() - (D_exact.unsqueeze(-1) * Pt3).sum()
    sQ, sK, sV = torch.autograd.grad(F3, (Q3, K3, V3))
    with torch.no_grad():
        mq, mk, mv = _tight_bounds(c, s, S, vis, Pe, dP.detach(), D_exact, L_exact)
    for nm, a, b, m in (("Q", sQ, aQ, mq), ("K", sK, aK, mk), ("V", sV, aV, mv)):
        # (a-b) is f64 rounding only: 2^-53 vs the f32 bound's 2^-24 scale
        assert bool(((a - b).abs() <= m * 1e-6 + 1e-300).all()), f"surrogate != autograd for d{nm}"

    with torch.no_grad():
        # |D_fed - D_exact| <= 2^-8 sum|O||dO| (bf16 rounding of O) + compute_d error
        dD = UBF * (O_exact.abs() * c.dO.abs()).sum(-1) + tolD
        assert bool(((D_fed - D_exact).abs() <= dD).all())
        pq, pk, pv = _input_perturbation_bounds(c, s, vis, Pe, dP.detach(), D_exact, dD, L_exact)
    assert_close("dQ (vs autograd)", dQ_t, aQ, tq + SAFETY * pq, c, f"seed={seed}")
    assert_close("dK (vs autograd)", dK_t, dK0_t + aK, tk + SAFETY * pk, c, f"seed={seed}")
    assert_close("dV (vs autograd)", dV_t, dV0_t + aV, tv + SAFETY * pv, c, f"seed={seed}")

    # fully masked rows: zero dQ, exactly
    dead = ~vis.any(-1)
    if bool(dead.any()):
        assert bool((dQ_t[dead] == 0).all()), "fully masked rows must give dQ = 0"
    return ratios


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def attn_cases(draw):
    B = draw(st.integers(1, 2))
    H = draw(st.integers(1, 4))
    g = draw(st.sampled_from(_divisors(H)))
    qL = draw(st.integers(1, 70))
    kL = draw(st.integers(1, 70))
    D = draw(st.sampled_from(list(range(8, 129, 8))))
    causal = draw(st.booleans())
    mask = draw(st.sampled_from(["none", "full", "bcast_b", "bcast_h", "bcast_bh"]))
    dead_rows = draw(st.booleans())
    cap = draw(st.sampled_from([1.0, 1.0, 5.0, 30.0]))
    layouts = tuple(draw(st.sampled_from(LAYOUTS)) for _ in range(4))
    threads = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    scale_mult = draw(st.sampled_from([1.0, 0.5, 2.0, 4.0]))
    isa = draw(st.sampled_from([None, tgc.TG_ISA_PORTABLE]))   # best ISA / plain C
    return dict(B=B, H=H, g=g, qL=qL, kL=kL, D=D, causal=causal, mask=mask,
                dead_rows=dead_rows, cap=cap, layouts=layouts, threads=threads,
                seed=seed, scale_mult=scale_mult, isa=isa)


@settings(max_examples=examples(500))
@given(cfg=attn_cases())
def test_backward_vs_autograd(lib, ctx_factory, cfg):
    require(lib, CD, BWD)
    c = Case(**cfg)
    run_backward_case(lib, ctx_factory, c, cfg["seed"])


@pytest.mark.parametrize("cfg", [
    dict(B=1, H=2, g=2, qL=37, kL=53, D=512, causal=True, mask="full", dead_rows=True,
         cap=1.0, layouts=("blhd", "bhld", "bhld_pad", "blhd"), threads=3, seed=5),
    dict(B=2, H=2, g=1, qL=19, kL=6, D=512, causal=False, mask="bcast_h", dead_rows=False,
         cap=30.0, layouts=("bhld", "blhd_pad", "bhld", "bhld"), threads=2, seed=6),
], ids=["d512-causal-gqa", "d512-softcap"])
def test_backward_d512(lib, ctx_factory, cfg):
    require(lib, CD, BWD)
    run_backward_case(lib, ctx_factory, Case(**cfg), cfg["seed"])


@pytest.mark.parametrize("cfg", [
    # qL > kL with causal: the first qL-kL rows see no key at all (L = -inf)
    dict(B=1, H=3, g=3, qL=50, kL=9, D=64, causal=True, mask="none", dead_rows=False,
         cap=1.0, layouts=("bhld",) * 4, threads=2, seed=11),
    # every mask row fully -inf for one batch: whole batch contributes zeros
    dict(B=2, H=4, g=2, qL=33, kL=17, D=32, causal=False, mask="full", dead_rows=True,
         cap=1.0, layouts=("blhd",) * 4, threads=3, seed=12),
    # tile edges: qL multiple of 32, kL multiple of 16, and one past
    dict(B=1, H=2, g=1, qL=64, kL=48, D=128, causal=True, mask="bcast_bh", dead_rows=False,
         cap=1.0, layouts=("bhld", "blhd", "blhd", "bhld"), threads=3, seed=13),
    dict(B=1, H=2, g=2, qL=33, kL=17, D=8, causal=True, mask="none", dead_rows=False,
         cap=1.0, layouts=("bhld_pad",) * 4, threads=1, seed=14),
    dict(B=1, H=1, g=1, qL=1, kL=1, D=8, causal=True, mask="none", dead_rows=False,
         cap=1.0, layouts=("bhld",) * 4, threads=1, seed=15),
], ids=["causal-qL>kL", "dead-batch", "tile-edges", "tile-edges+1", "1x1"])
def test_backward_edges(lib, ctx_factory, cfg):
    require(lib, CD, BWD)
    run_backward_case(lib, ctx_factory, Case(**cfg), cfg["seed"])


def test_backward_thread_counts_agree(lib, ctx_factory):
    """Same problem on 1, 2, 3 and 7 threads: each within the oracle bound;
    with deterministic mode on, bitwise identical across thread counts."""
    require(lib, CD, BWD)
    cfg = dict(B=2, H=4, g=2, qL=45, kL=61, D=64, causal=True, mask="bcast_b", dead_rows=True,
               cap=1.0, layouts=("blhd", "bhld", "bhld", "blhd_pad"), threads=1, seed=21)
    outs = []
    for t in (1, 2, 3, 7):
        cfg["threads"] = t
        c = Case(**cfg)
        run_backward_case(lib, ctx_factory, c, cfg["seed"])
        ctx = ctx_factory(t, deterministic=True)
        s, S, vis = c.S(c.Q, c.K)
        L, _, O = forward_exact(S, vis, c.V, c.g)
        Lnp = np.ascontiguousarray(L.to(torch.float32).numpy())
        Dv = np.zeros(c.B * c.H * c.qL, np.float32)
        ctx.call(CD, to_bf16_bits(O).reshape(-1), np.ascontiguousarray(c.do_bits.reshape(-1)),
                 Dv, c.B, c.H, c.qL, c.D)
        n_q, n_k = c.B * c.H * c.qL * c.D, c.B * c.Hkv * c.kL * c.D
        dQ, dK, dV = (np.zeros(n_q, np.float32), np.zeros(n_k, np.float32),
                      np.zeros(n_k, np.float32))
        ctx.call(BWD, c.q_buf, c.k_buf, c.v_buf, Lnp, c.do_buf, Dv, dQ, dK, dV,
                 c.params, c.mparams, c.mask_buf, 1)
        outs.append((dQ.tobytes(), dK.tobytes(), dV.tobytes()))
    assert all(o == outs[0] for o in outs), "deterministic mode differs across thread counts"


# ---------------------------------------------------------------------------
# contract details around the backward call

def test_params_init_matches_contract(lib):
    require(lib, "tg_attn_params_init")
    f = lib.func("tg_attn_params_init")
    for (B, H, Hkv, qL, kL, D, scale) in [(1, 1, 1, 1, 1, 8, 0.125), (2, 8, 2, 33, 17, 64, 0.1),
                                           (3, 4, 4, 100, 7, 512, 1.0), (1, 6, 3, 32, 16, 128, 0.5)]:
        p = tgc.AttnParams()
        s = f(p, B, H, Hkv, qL, kL, D, scale)
        assert s == 0, lib.status_str(s)
        want = tgc.attn_params(B, H, Hkv, qL, kL, D, float(np.float32(scale)))
        assert bytes(p) == bytes(want), f"\n got  {p!r}\n want {want!r}"


def test_backward_errors_leave_outputs_untouched(lib, ctx_factory):
    """Unsupported head dim / inconsistent params -> error status, and no
    output byte changed (KERNELS.md Conventions)."""
    require(lib, CD, BWD)
    ctx = ctx_factory(2)
    c = Case(B=1, H=2, g=1, qL=5, kL=7, D=16, causal=False, mask="none", dead_rows=False,
             cap=1.0, layouts=("bhld",) * 4, threads=2, seed=3)
    L = np.zeros(c.B * c.H * c.qL, np.float32)
    Dv = np.zeros_like(L)
    n_q, n_k = c.B * c.H * c.qL * c.D, c.B * c.Hkv * c.kL * c.D

    def attempt(params, expect):
        dQ = np.full(n_q, 7.0, np.float32)
        dK = np.full(n_k, 7.0, np.float32)
        dV = np.full(n_k, 7.0, np.float32)
        with pytest.raises(tg.TilegradError) as ei:
            ctx.call(BWD, c.q_buf, c.k_buf, c.v_buf, L, c.do_buf, Dv, dQ, dK, dV,
                     params, None, None, 0)
        assert ei.value.status in expect, str(ei.value)
        assert ei.value.detail, "tg_ctx_last_error must say what was wrong"
        assert (dQ == 7).all() and (dK == 7).all() and (dV == 7).all()

    bad = tgc.attn_params(1, 2, 1, 5, 7, 16, c.scale)
    bad.NQ = 2                                                 # tiling disagrees with qL
    attempt(bad, {tgc.TG_ERR_BAD_PARAMS})
    bad = tgc.attn_params(1, 2, 1, 5, 7, 16, c.scale)
    bad.gqa_factor = 3                                         # H % gqa != 0
    attempt(bad, {tgc.TG_ERR_BAD_SHAPE, tgc.TG_ERR_BAD_PARAMS})
    bad = tgc.attn_params(1, 2, 1, 5, 7, 12, c.scale)          # D not a multiple of 8
    attempt(bad, {tgc.TG_ERR_UNSUPPORTED})


# ---------------------------------------------------------------------------
# forward (optional: only when exported)

@settings(max_examples=examples(100))
@given(cfg=attn_cases())
def test_forward_vs_torch(lib, ctx_factory, cfg):
    require(lib, FWD)
    c = Case(**cfg)
    ctx = ctx_factory(c.threads, isa=c.isa)
    s, S, vis = c.S(c.Q, c.K)
    L, P, O = forward_exact(S, vis, c.V, c.g)
    osz = len(c.do_buf)
    O_buf = np.full(osz, BF16_NAN, np.uint16)
    Lo = np.full(c.B * c.H * c.qL, np.nan, np.float32)
    try:
        ctx.call(FWD, c.q_buf, c.k_buf, c.v_buf, O_buf, Lo, c.params, c.mparams,
                 c.mask_buf, int(c.causal))
    except tg.TilegradError as e:
        if c.cap != 1.0 and e.status == tgc.TG_ERR_UNSUPPORTED:
            return
        raise
    u = U32
    it = O_buf.itemsize
    Og = np.lib.stride_tricks.as_strided(
        O_buf, shape=(c.B, c.H, c.qL, c.D),
        strides=tuple(x * it for x in c.o_strides) + (it,)).copy()
    Og = torch.from_numpy(tg.bf16.to_float(Og).astype(np.float64))
    Kr = c.K.repeat_interleave(c.g, 1).abs()
    Vr = c.V.repeat_interleave(c.g, 1).abs()
    zero = torch.zeros_like(S)
    mabs = c.madd.abs() if c.madd is not None else zero
    eS = (c.D + 8) * u * c.scale * (c.Q.abs() @ Kr.transpose(-1, -2)) + \
        8 * u * (torch.where(vis, S.abs(), zero) + mabs)
    eSmax = torch.where(vis, eS, zero).amax(-1)
    Labs = torch.where(torch.isfinite(L), L.abs(), torch.zeros_like(L))
    # L = m + log(sum exp(S - m)): error <= max_k e_S + (kL+8)u + 8u|L|
    tolL = SAFETY * (eSmax + (c.kL + 8) * u + 8 * u * Labs) + FLOOR
    Lt = torch.from_numpy(Lo.astype(np.float64)).view(c.B, c.H, c.qL)
    fin = torch.isfinite(L)
    assert bool((torch.isinf(Lt[~fin]) & (Lt[~fin] < 0)).all()), "fully masked rows need L = -inf"
    assert_close("L", torch.where(fin, Lt, zero[..., 0]), torch.where(fin, L, zero[..., 0]),
                 tolL, c)
    # O: relative P error <= 2 e_S,max + (kL+16)u per row, then one bf16 rounding
    relP = (2 * eSmax + (c.kL + 16) * u).unsqueeze(-1)
    eO = relP * (P @ Vr) + (c.kL + 8) * u * (P @ Vr)
    tolO = SAFETY * eO + UBF * (O.abs() + SAFETY * eO) + FLOOR
    assert_close("O", Og, O, tolO, c)


# ---------------------------------------------------------------------------
# kernel 3: f32 -> bf16 cast vs torch

def _special_f32():
    bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000,             # +-0, +-inf
            0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000,  # subnormals, ties
            0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,               # ties to even / not
            0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF,               # overflow to inf or not
            0x7F800001, 0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFF800001,   # NaNs
            0x7FA00000, 0x7F80FFFF, 0x3F800000, 0xBF800000, 0x00800000]
    return np.array(bits, dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("isa", [None, tgc.TG_ISA_PORTABLE], ids=["best-isa", "portable"])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 27, 65536, 65536 * 3 + 17])
def test_cast_vs_torch(lib, ctx_factory, threads, n, isa):
    ctx = ctx_factory(threads, isa=isa)
    rng = np.random.default_rng(n * 7 + threads)
    # random bit patterns cover every exponent; mix in normal-range values and
    # exact round-half cases
    x = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    half = rng.random(n) < 0.2
    x = np.where(half, (x & np.uint32(0xFFFF0000)) | np.uint32(0x8000), x)
    x = x.view(np.float32).copy()
    normal = rng.random(n) < 0.3
    x[normal] = rng.standard_normal(int(normal.sum())).astype(np.float32)
    sp = _special_f32()
    x[: min(n, len(sp))] = sp[: min(n, len(sp))]
    dst = np.full(n, 0x1234, np.uint16)
    ctx.call("tg_f32_to_bf16_cast", x, dst, n)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    assert (dst[nan] == 0x7FC0).all(), "NaN must become 0x7FC0"
    assert np.isnan(tg.bf16.to_float(ref[nan])).all()
    bad = np.nonzero(dst[~nan] != ref[~nan])[0]
    assert bad.size == 0, (f"{bad.size} mismatches; first: x=0x{x[~nan].view(np.uint32)[bad[0]]:08x} "
                           f"got 0x{dst[~nan][bad[0]]:04x} torch 0x{ref[~nan][bad[0]]:04x}")
    # and the binding's own numpy RNE agrees with torch (sanity of the helper)
    assert (tg.bf16.from_float(x)[~nan] == ref[~nan]).all()
