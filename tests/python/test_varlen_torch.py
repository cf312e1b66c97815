"""tilegrad.torch.varlen_attention (packed sequences, flash_attn_varlen_func's
API) on tg_attn_varlen_fwd / _bwd_step: the custom ops (PyTorch >= 2.4), the
eager direct path and the autograd Function (1.13).

Oracle: PyTorch autograd of a float64 implementation on the same inputs
(bf16 inputs are exact in float64): one attention over all packed rows with
a dense block-diagonal boolean mask, written from the definitions -- query
i of document d sees key k iff k is a key of d and, with ``ii = i -
cu_seqlens_q[d]``, ``kk = k - cu_seqlens_k[d]``, ``off = len_k - len_q``:
``kk <= ii + off`` (causal) and ``kk > ii + off - W`` (window_size (left,
.): W = left + 1); sinks as a concatenated score column dropped after the
softmax; dropout through the kernels' keep flags, document d's drawn as a
B = 1, len_q x len_k problem from the counter offset sum over the earlier
documents of ceil(H len_q len_k / 4) (include/tilegrad.h) -- the reference
is test_torch_attn_variants' ``ref_variants`` fed that mask.

Tolerances, per element: test_torch_attn_variants' bound (u_out |ref| +
SAFETY * (input perturbation + first-order f32 terms), u_out = 2^-8 for bf16,
one rounding of O and of each gradient, 2^-24 for float32) with its f32 term
taken per document: the kernels sum each document on its own, so a pair of
document d carries rel_d = (len_k + g len_q + max(D, Dv) + 64) (1 + max|L|)
2^-24 (the whole-problem lengths would loosen it by total / len). Observed
worst error/tol is printed to stderr.

Also: documents of length 1, an empty document (a repeated offset), a
document of 150 rows (more than one 128-row query block), causal with len_q
!= len_k per document (rows that see no key: O = 0), documents without keys
or without queries; NaN in one document reaches no other document's outputs
or gradients (bitwise the same as without it); bad offsets raise a clear
error and, through the C entry points, write nothing; window_size /
softcap / max_seqlen mapping and refusals; int64 offsets, float16 and
autocast; opcheck, torch.compile(fullgraph=True), the fakes and the direct
path (>= 2.4).
"""
import ctypes
import math
import os
import re
import sys

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad as tg  # noqa: E402
import tilegrad.torch as tt  # noqa: E402
import tilegrad._torch_paths as paths  # noqa: E402
import tilegrad._torch_varlen as tv  # noqa: E402
from tilegrad import capi  # noqa: E402
from test_torch_attn_variants import ref_variants  # noqa: E402
from test_torch_wrappers import F64, SAFETY, U32, UBF, check, sum_group  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")
needs_ops = pytest.mark.skipif(not tt.HAVE_CUSTOM_OPS,
                               reason=f"torch {torch.__version__} < 2.4: no custom ops")

ENTRY_POINTS = ("tg_attn_varlen_fwd", "tg_attn_varlen_bwd", "tg_attn_varlen_bwd_step")


@pytest.fixture(autouse=True, scope="module")
def _needs_varlen(lib):
    if not lib.has("tg_attn_varlen_fwd"):
        pytest.skip(f"tg_attn_varlen_fwd is not exported by {lib.path}")


def _offsets(lens):
    return torch.tensor([0] + list(lens), dtype=torch.int64).cumsum(0).to(torch.int32)


def _scale(D):
    return float(torch.tensor(1 / math.sqrt(D), dtype=torch.float32))


# ---------------------------------------------------------------------------
# the reference

def block_mask(cu_q, cu_k, causal, W):
    """[total_q, total_k] bool: the pairs that see each other."""
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    vis = torch.zeros(tq, tk, dtype=torch.bool)
    for d in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[d]), int(cu_q[d + 1]), int(cu_k[d]), int(cu_k[d + 1])
        lq, lk = q1 - q0, k1 - k0
        ii, kk = torch.arange(lq).view(lq, 1), torch.arange(lk).view(1, lk)
        m = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            m &= kk <= ii + lk - lq
        if W:
            m &= kk > ii + lk - lq - W
        vis[q0:q1, k0:k1] = m
    return vis


def doc_keep(p, seed, H, cu_q, cu_k):
    """The kernels' keep flags as a [1, H, total_q, total_k] float64 block
    matrix: document d's from tg_attn_dropout_keep(B = 1, H, len_q, len_k)
    at the counter offset the header gives it."""
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    keep = torch.zeros(1, H, tq, tk, dtype=F64)
    offset = 0
    for d in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[d]), int(cu_q[d + 1]), int(cu_k[d]), int(cu_k[d + 1])
        lq, lk = q1 - q0, k1 - k0
        if lq and lk:
            opt = capi.AttnOptions(dropout_p=p, dropout_seed=int(seed) & (2 ** 64 - 1),
                                   dropout_offset=offset)
            flags = torch.empty((1, H, lq, lk), dtype=torch.uint8)
            tt._context(0, False).call("tg_attn_dropout_keep", opt, 1, H, lq, lk,
                                       tt._ptr(flags))
            keep[:, :, q0:q1, k0:k1] = flags.to(F64)
        offset += (H * lq * lk + 3) // 4
    return keep


def varlen_bounds(Q, K, V, O, P, L, p_sink, dOd, scale, u_out, R, rel_row, keep=None, p=0.0):
    """test_torch_attn_variants.bounds with its f32 term per document: R
    [total_q, total_k] holds rel_d on document d's pairs (0 elsewhere, where
    P is 0 too), rel_row [total_q, 1] its rows' rel_d."""
    g = Q.shape[1] // K.shape[1]
    Dv = V.shape[3]
    with torch.no_grad():
        Kr, Vr = K.abs().repeat_interleave(g, 1), V.repeat_interleave(g, 1)
        kp = torch.ones_like(P) if keep is None else keep / (1.0 - p)
        Pd = P * kp
        dP = (dOd @ Vr.transpose(-1, -2)) * kp
        Dx = (O * dOd).sum(-1, keepdim=True)
        Mds = P * (dP.abs() + Dx.abs())
        dD = (u_out + (Dv + 4) * U32) * (O.abs() * dOd.abs()).sum(-1, keepdim=True)
        ps = p_sink.unsqueeze(-1)
        mag_s = (ps * Dx.abs()).sum((0, 2, 3))
        tol = {
            "O": u_out * O.abs() + SAFETY * ((R * Pd) @ Vr.abs()),
            "dq": u_out * Q.grad.abs() + SAFETY * scale * (((P * dD) + R * Mds) @ Kr),
            "dk": u_out * K.grad.abs() + SAFETY * sum_group(
                scale * ((P * dD) + R * Mds).transpose(-1, -2) @ Q.abs(), g),
            "dv": u_out * V.grad.abs() + SAFETY * sum_group(
                (R * Pd).transpose(-1, -2) @ dOd.abs(), g),
            "dsinks": SAFETY * ((ps * dD).sum((0, 2, 3)) + (rel_row * ps * Dx.abs()).sum(
                (0, 2, 3))) + (Q.shape[2] + 64) * U32 * mag_s,
        }
    return {k: t + 1e-30 for k, t in tol.items()}


def rel_terms(cu_q, cu_k, g, D, Dv, L):
    finite = L[torch.isfinite(L)]
    Lmax = float(finite.abs().max()) if finite.numel() else 0.0
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    R = torch.zeros(tq, tk, dtype=F64)
    row = torch.zeros(tq, 1, dtype=F64)
    for d in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[d]), int(cu_q[d + 1]), int(cu_k[d]), int(cu_k[d + 1])
        rel = ((k1 - k0) + g * (q1 - q0) + max(D, Dv) + 64) * (1 + Lmax) * U32
        R[q0:q1, k0:k1] = rel
        row[q0:q1] = rel
    return R, row


# ---------------------------------------------------------------------------
# against float64 autograd

# name: H, Hkv, D, Dv, lens_q, lens_k (None: lens_q), causal, window_size, softcap,
#       sinks, dropout_p
CASES = {
    "ragged-gqa-causal-len1-empty": (4, 2, 16, 16, [7, 1, 0, 40, 13], None, True, (-1, -1),
                                     0.0, None, 0.0),
    "doc150-window-causal": (2, 1, 32, 32, [150, 3, 33], None, True, (19, 0), 0.0, None, 0.0),
    "causal-lenq!=lenk-dv32": (4, 4, 16, 32, [5, 20, 3, 1], [9, 12, 3, 4], True, (-1, -1), 0.0,
                               None, 0.0),
    "noncausal-window-softcap-gqa3-dv24": (3, 1, 8, 24, [17, 30, 2], [25, 30, 1], False,
                                           (6, -1), 5.0, None, 0.0),
    "sinks-window-nokeys-noqueries": (4, 2, 16, 16, [12, 6, 0, 20], [12, 0, 5, 20], True,
                                      (4, 0), 0.0, "mixed", 0.0),
    "noncausal-dropout-dv32": (2, 1, 16, 32, [24, 9, 31], [16, 9, 40], False, (-1, -1), 0.0,
                               None, 0.2),
}


def _draw(shape, gen, dtype):
    return torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_varlen_vs_float64_autograd(name, dtype):
    H, Hkv, D, Dv, lq, lk, causal, ws, cap, skind, p = CASES[name]
    lk = lq if lk is None else lk
    cu_q, cu_k = _offsets(lq), _offsets(lk)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q, k, v = _draw((tq, H, D), gen, dtype), _draw((tk, Hkv, D), gen, dtype), \
        _draw((tk, Hkv, Dv), gen, dtype)
    sinks = None
    if skind:
        sinks = torch.randn(H, generator=gen) * 2
        sinks[0] = -math.inf                   # a head without a sink
        sinks.requires_grad_(True)
    dO = torch.randn((tq, H, Dv), generator=gen).to(dtype)
    scale = _scale(D)
    torch.manual_seed(77)
    o = tt.varlen_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), dropout_p=p,
                            softmax_scale=scale, causal=causal, window_size=ws, softcap=cap,
                            sinks=sinks)
    assert o.dtype == dtype and o.shape == (tq, H, Dv)
    o.backward(dO)
    keep = None
    if p:
        torch.manual_seed(77)
        keep = doc_keep(p, tt._dropout_seed(p), H, cu_q, cu_k)

    W = ws[0] + 1 if ws[0] >= 0 else 0
    as4 = lambda t: t.detach().to(F64).transpose(0, 1).unsqueeze(0)  # noqa: E731
    Q, K, V = (as4(t).requires_grad_(True) for t in (q, k, v))
    S64 = None if sinks is None else sinks.detach().to(F64).requires_grad_(True)
    mask = block_mask(cu_q, cu_k, causal, W).view(1, 1, tq, tk)
    O, P, L, p_sink = ref_variants(Q, K, V, mask, False, scale, cap or None, 0, None, S64,
                                   keep, p)
    dOd = as4(dO)
    O.backward(dOd)

    u_out = UBF if dtype == torch.bfloat16 else U32
    R, rel_row = rel_terms(cu_q, cu_k, H // Hkv, D, Dv, L)
    tol = varlen_bounds(Q, K, V, O, P, L, p_sink, dOd, scale, u_out, R, rel_row, keep, p)
    info = f"case {name}, {dtype}"
    worst = {}
    for what, got, ref in (("O", o, O), ("dq", q.grad, Q.grad), ("dk", k.grad, K.grad),
                           ("dv", v.grad, V.grad)):
        worst[what] = check(what, as4(got), ref.detach(), tol[what], info)
    if sinks is not None:
        assert sinks.grad.dtype == torch.float32
        worst["dsinks"] = check("dsinks", sinks.grad, S64.grad, tol["dsinks"], info)
    print(f"{info}: error/tol " + ", ".join(f"{w} {r:.2g}" for w, r in worst.items()),
          file=sys.stderr)


def test_each_document_is_its_own_dense_problem():
    """A packed call gives, bit for bit, what tilegrad.torch.attention gives
    for each document alone (bottom-right causal, the window, GQA, Dv)."""
    gen = torch.Generator().manual_seed(8)
    lq, lk = [9, 33, 1, 20], [14, 33, 1, 6]
    cu_q, cu_k = _offsets(lq), _offsets(lk)
    q, k = _draw((63, 4, 16), gen, torch.bfloat16), _draw((54, 2, 16), gen, torch.bfloat16)
    v = _draw((54, 2, 24), gen, torch.bfloat16)
    o = tt.varlen_attention(q, k, v, cu_q, cu_k, 33, 33, causal=True, window_size=(5, 0),
                            deterministic=True)
    for d in range(4):
        a, b, c, e = int(cu_q[d]), int(cu_q[d + 1]), int(cu_k[d]), int(cu_k[d + 1])
        one = tt.attention(*(t.detach()[x:y].transpose(0, 1).unsqueeze(0)
                             for t, x, y in ((q, a, b), (k, c, e), (v, c, e))),
                           causal=True, window=6, deterministic=True)
        assert torch.equal(o.detach()[a:b], one[0].transpose(0, 1)), d


def test_nan_stays_in_its_document():
    """A NaN in one document's query reaches its own rows only: every other
    document's output and gradients are bitwise those of the run without it."""
    gen = torch.Generator().manual_seed(9)
    lens = [10, 7, 30]
    cu = _offsets(lens)
    base = [torch.randn(s, generator=gen) for s in ((47, 2, 16), (47, 2, 16), (47, 2, 16))]
    dO = torch.randn(47, 2, 16, generator=gen)
    runs = []
    for poison in (False, True):
        q, k, v = (t.clone() for t in base)
        if poison:
            q[12, 1, 3] = math.nan             # document 1 (rows 10..16)
            k[15, 0, 0] = math.nan
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        o = tt.varlen_attention(q, k, v, cu, cu, 30, 30, causal=True, deterministic=True)
        o.backward(dO)
        runs.append([o.detach(), q.grad, k.grad, v.grad])
    keep = torch.ones(47, dtype=torch.bool)
    keep[10:17] = False
    for clean, dirty in zip(*runs):
        assert torch.equal(clean[keep], dirty[keep])
        assert bool(torch.isfinite(dirty[keep]).all())
    assert bool(torch.isnan(runs[1][0][12:17]).any())


# ---------------------------------------------------------------------------
# offsets, max_seqlen, window_size, softcap and the other arguments

def _qkv(total=12, H=2, D=16):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(total, H, D, generator=g) for _ in range(3)]


@pytest.mark.parametrize("bad, match", [
    ([1, 5, 12], r"cu_seqlens_q\[0\] = 1.*start at 0"),
    ([0, 7, 5, 12], r"cu_seqlens_q decreases at document 1"),
    ([0, 5, 11], r"cu_seqlens_q\[-1\] = 11 must be the packed length 12"),
    ([0, 5, 13], r"cu_seqlens_q\[-1\] = 13"),
])
def test_bad_offsets_raise_before_the_library(bad, match, monkeypatch):
    def no_call(*a, **kw):
        raise AssertionError("the C library was called")
    monkeypatch.setattr(tv, "_context", no_call)
    q, k, v = _qkv()
    good = _offsets([5, 7]) if len(bad) == 3 else _offsets([5, 2, 5])
    with pytest.raises(ValueError, match=match):
        tt.varlen_attention(q, k, v, torch.tensor(bad, dtype=torch.int32), good, None, None)
    with pytest.raises(ValueError, match=match.replace("_q", "_k")):
        tt.varlen_attention(q, k, v, good, torch.tensor(bad, dtype=torch.int32), None, None)


def test_offsets_of_the_wrong_kind_raise():
    q, k, v = _qkv()
    cu = _offsets([5, 7])
    for bad, err, match in ((cu.float(), TypeError, "int32"), ([0, 5, 12], TypeError, "tensor"),
                            (cu.view(1, 3), ValueError, "1-D"),
                            (torch.tensor([0], dtype=torch.int32), ValueError, "n_docs \\+ 1 >= 2"),
                            (torch.tensor([0, 2 ** 31, 12]), ValueError, "outside int32")):
        with pytest.raises(err, match=match):
            tt.varlen_attention(q, k, v, bad, cu, None, None)
    with pytest.raises(ValueError, match="one n_docs for both"):
        tt.varlen_attention(q, k, v, cu, _offsets([5, 0, 7]), None, None)


def test_int64_offsets_give_the_int32_bits():
    q, k, v = _qkv()
    cu = _offsets([5, 0, 7])
    a = tt.varlen_attention(q, k, v, cu, cu, 7, 7, causal=True)
    b = tt.varlen_attention(q, k, v, cu.long(), cu.long(), 7, 7, causal=True)
    assert torch.equal(a, b)


def test_the_library_refuses_bad_offsets_and_writes_nothing(lib):
    """The C entry points' own checks, bypassing the Python ones: the status's
    class, the library's message, O / L / dQ / dK / dV unchanged."""
    q, k, v = _qkv(total=12)
    p = tv._varlen_params(q, k, v, q, _scale(16), 1.0)
    ctx = tt._context(0, False)
    for bad, match in (([1, 5, 12], r"cu_seqlens_q\[0\] = 1"),
                       ([0, 7, 5, 12], r"cu_seqlens_q\[2\] = 5 < cu_seqlens_q\[1\] = 7"),
                       ([0, 5, 11], r"cu_seqlens_q\[2\] = 11")):
        cu_q = torch.tensor(bad, dtype=torch.int32)
        cu_k = _offsets([5, 7]) if len(bad) == 3 else _offsets([5, 2, 5])
        docs = tv._docs(cu_q, cu_k)
        o, lse = torch.full((12, 2, 16), 7.75), torch.full((2, 12), 7.75)
        with pytest.raises(tg.BadShapeError, match=match):
            ctx.call("tg_attn_varlen_fwd", capi.TG_DTYPE_F32, tt._ptr(q), tt._ptr(k),
                     tt._ptr(v), tt._ptr(o), tt._ptr(lse), p, docs, 1, None)
        assert bool((o == 7.75).all()) and bool((lse == 7.75).all())
        grads = [torch.full((12, 2, 16), 7.75) for _ in range(3)]
        with pytest.raises(tg.BadShapeError, match=match):
            ctx.call("tg_attn_varlen_bwd_step", capi.TG_DTYPE_F32, capi.TG_DTYPE_F32,
                     tt._ptr(q), tt._ptr(k), tt._ptr(v), tt._ptr(o), tt._ptr(lse), tt._ptr(q),
                     *(tt._ptr(g) for g in grads), p, docs, 1, None)
        assert all(bool((g == 7.75).all()) for g in grads)


def test_max_seqlen():
    """flash-attn sizes its grid by max_seqlen_*: any value >= the longest
    document is accepted (the same bits), a shorter one refused."""
    q, k, v = _qkv()
    cu = _offsets([5, 7])
    ref = tt.varlen_attention(q, k, v, cu, cu, 7, 7)
    for mq, mk in ((None, None), (100, 7), (torch.tensor(7), torch.tensor(9, dtype=torch.int32))):
        assert torch.equal(tt.varlen_attention(q, k, v, cu, cu, mq, mk), ref)
    with pytest.raises(ValueError, match="max_seqlen_q = 6 is less than the longest"):
        tt.varlen_attention(q, k, v, cu, cu, 6, 7)
    with pytest.raises(ValueError, match="max_seqlen_k = 3"):
        tt.varlen_attention(q, k, v, cu, cu, 7, 3)
    for bad, err in ((-1, ValueError), (7.0, TypeError), (True, TypeError),
                     (torch.tensor([7, 7]), TypeError)):
        with pytest.raises(err, match="max_seqlen_q"):
            tt.varlen_attention(q, k, v, cu, cu, bad, 7)


def test_window_size_and_causal_map_as_flash_attn():
    """(-1, 0) is causal with or without causal=True; causal=True makes any
    right window 0 (flash-attn's rule); (left, 0) is W = left + 1 causal,
    (left, -1) W = left + 1 bidirectional; same bits either way."""
    q, k, v = _qkv(total=30)
    cu = _offsets([18, 12])
    run = lambda **kw: tt.varlen_attention(q, k, v, cu, cu, 18, 18, **kw)  # noqa: E731
    causal = run(causal=True)
    assert torch.equal(run(window_size=(-1, 0)), causal)
    assert torch.equal(run(causal=True, window_size=(-1, 5)), causal)
    assert not torch.equal(run(), causal)
    w4 = run(causal=True, window_size=(3, 0))
    assert torch.equal(run(window_size=(3, 0)), w4)
    assert torch.equal(run(causal=True, window_size=[3, 7]), w4)
    assert not torch.equal(w4, causal)
    ref = torch.cat([tt.attention(*(t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v)),
                                  window=4)[0].transpose(0, 1) for a, b in ((0, 18), (18, 30))])
    assert torch.equal(run(window_size=(3, -1)), ref)
    for ws, err, match in (((3, 2), ValueError, "right window of 2"),
                           ((-2, -1), ValueError, "left = -2"), ((1.0, 0), TypeError, "int"),
                           ((1,), TypeError, "pair")):
        with pytest.raises(err, match=match):
            run(window_size=ws)


def test_softcap_and_refusals():
    q, k, v = _qkv()
    cu = _offsets([5, 7])
    run = lambda *a, **kw: tt.varlen_attention(q, k, v, cu, cu, 7, 7, *a, **kw)  # noqa: E731
    assert not torch.equal(run(softcap=2.0), run())
    assert torch.equal(run(softcap=0.0), run())
    with pytest.raises(NotImplementedError, match="softcap = 1.0"):
        run(softcap=1.0)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="softcap"):
            run(softcap=bad)
    for kw, match in ((dict(alibi_slopes=torch.zeros(2)), "alibi_slopes"),
                      (dict(return_attn_probs=True), "return_attn_probs"),
                      (dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "block_table")):
        with pytest.raises(NotImplementedError, match=match):
            run(**kw)
    with pytest.raises(ValueError, match="dropout_p"):
        run(dropout_p=1.0)
    with pytest.raises(ValueError, match="3-D"):
        tt.varlen_attention(q[None], k[None], v[None], cu, cu, 7, 7)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        tt.varlen_attention(q, k[:, :1].expand(12, 3, 16).contiguous(), v[:, :1].expand(
            12, 3, 16).contiguous(), cu, cu, 7, 7)
    with pytest.raises(TypeError, match="float64"):
        tt.varlen_attention(q.double(), k.double(), v.double(), cu, cu, 7, 7)
    with pytest.raises(NotImplementedError, match="Dv = 12"):
        tt.varlen_attention(q, k, v[..., :12], cu, cu, 7, 7)


def test_dtypes_autocast_and_strided_views(monkeypatch):
    """float16 computes in float32 (output float16); CPU bf16 autocast casts
    float32 inputs as for SDPA; a (rows, heads, D) view with D contiguous is
    read in place."""
    q, k, v = _qkv(total=20, H=2, D=32)
    cu = _offsets([9, 11])
    f32 = tt.varlen_attention(q, k, v, cu, cu, 11, 11, causal=True)
    h = tt.varlen_attention(q.half(), k.half(), v.half(), cu, cu, 11, 11, causal=True)
    assert h.dtype == torch.float16
    assert torch.equal(h, tt.varlen_attention(q.half().float(), k.half().float(),
                                              v.half().float(), cu, cu, 11, 11,
                                              causal=True).half())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = tt.varlen_attention(q, k, v, cu, cu, 11, 11, causal=True)
    assert a.dtype == torch.bfloat16
    assert torch.equal(a, tt.varlen_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu,
                                              11, 11, causal=True))
    big = torch.zeros(20, 2, 48)
    big[..., 8:40] = q
    view = big[..., 8:40]                      # strides (96, 48, 1): not contiguous
    seen = []
    real = tv._ptr
    monkeypatch.setattr(tv, "_ptr", lambda t: (seen.append(t.data_ptr()), real(t))[1])
    assert torch.equal(tt.varlen_attention(view, k, v, cu, cu, 11, 11, causal=True), f32)
    assert seen[0] == view.data_ptr()


def test_empty_shapes_and_documents_without_keys():
    q, k, v = _qkv(total=6)
    s = torch.tensor([0.5, 1.0], requires_grad=True)
    qg = q.clone().requires_grad_(True)
    o = tt.varlen_attention(qg, k[:0], v[:0], _offsets([2, 4]), _offsets([0, 0]), 4, 0,
                            sinks=s)
    assert o.shape == (6, 2, 16) and bool((o == 0).all())
    o.sum().backward()
    assert bool((qg.grad == 0).all()) and torch.equal(s.grad, torch.zeros(2))
    e = tt.varlen_attention(q[:0], k, v, _offsets([0]), _offsets([6]), 0, 6)
    assert e.shape == (0, 2, 16)
    # a document without queries: its keys get zero gradients
    kg = k.clone().requires_grad_(True)
    tt.varlen_attention(q[:3], kg, v, _offsets([3, 0]), _offsets([2, 4]), 3, 4).sum().backward()
    assert bool((kg.grad[2:] == 0).all()) and bool((kg.grad[:2] != 0).any())


def test_dropout_repeats_with_the_seed():
    q, k, v = _qkv(total=30)
    cu = _offsets([18, 12])
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(tt.varlen_attention(q, k, v, cu, cu, 18, 18, dropout_p=0.3))
    assert torch.equal(*runs)
    assert not torch.equal(runs[0], tt.varlen_attention(q, k, v, cu, cu, 18, 18, dropout_p=0.3))


def test_signatures_follow_the_header():
    """capi's argtypes for the three entry points, parameter by parameter
    against include/tilegrad.h, and tg_attn_varlen's fields in order."""
    hdr = os.path.join(os.path.dirname(__file__), "..", "..", "include", "tilegrad.h")
    with open(hdr) as f:
        text = f.read()
    want = {"tg_dtype": capi._I, "int": capi._I, "const tg_attn_params": capi._PP,
            "const tg_attn_varlen": capi._PV, "const tg_attn_options": capi._PO}
    for name in ENTRY_POINTS:
        proto = re.search(r"tg_status\s+" + name + r"\s*\(([^)]*)\)", text)
        assert proto, name
        params = [" ".join(x.split()) for x in proto.group(1).split(",")]
        sig = capi.KERNEL_SIGNATURES[name]
        assert len(params) == len(sig), (name, params, sig)
        for decl, t in zip(params, sig):
            base = decl.rsplit(" ", 1)[0].rstrip("*").strip()
            if decl.rsplit(" ", 1)[1].startswith("*") or decl.split()[-2].endswith("*"):
                assert t is want.get(base, capi._P), (name, decl, t)
            else:
                assert t is want[base], (name, decl, t)
    end = text.index("} tg_attn_varlen;")
    body = text[text.rindex("typedef struct {", 0, end) + len("typedef struct {"):end]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = re.findall(r"(\w+);", body)
    assert fields == [f for f, _ in capi.AttnVarlen._fields_]


# ---------------------------------------------------------------------------
# the custom ops (PyTorch >= 2.4)

def _op_args(dtype=torch.bfloat16, Dv=16, sinks=False, p=0.0, window=0, causal=True):
    g = torch.Generator().manual_seed(4)
    lq, lk = [5, 0, 13, 1], [7, 2, 13, 1]
    q = torch.randn(19, 4, 16, generator=g).to(dtype).requires_grad_(True)
    k = torch.randn(23, 2, 16, generator=g).to(dtype).requires_grad_(True)
    v = torch.randn(23, 2, Dv, generator=g).to(dtype).requires_grad_(True)
    s = torch.randn(4, generator=g).requires_grad_(True) if sinks else None
    seed = torch.tensor(1234, dtype=torch.int64) if p else None
    return (q, k, v, _offsets(lq), _offsets(lk), 13, 13, causal, 0.25, 1.0, window, p, seed, 1,
            True, 0, s)


OP_CASES = {"bf16-causal": {}, "bf16-window-sinks-dv32": dict(Dv=32, sinks=True, window=3),
            "f32-dropout-noncausal": dict(dtype=torch.float32, p=0.25, causal=False)}


@needs_ops
@pytest.mark.parametrize("case", list(OP_CASES))
def test_opcheck(case):
    args = _op_args(**OP_CASES[case])
    torch.library.opcheck(torch.ops.tilegrad.varlen_attn_fwd.default, args)
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    o, lse = torch.ops.tilegrad.varlen_attn_fwd(*plain)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5)).to(o.dtype)
    torch.library.opcheck(torch.ops.tilegrad.varlen_attn_bwd.default,
                          (do,) + plain[:3] + (o, lse) + plain[3:5] + plain[7:])


@needs_ops
def test_fakes_give_the_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = torch.empty(19, 4, 16), torch.empty(23, 2, 16), torch.empty(23, 2, 40)
        cu = torch.empty(5, dtype=torch.int32)
        o, lse = torch.ops.tilegrad.varlen_attn_fwd(q, k, v, cu, cu, -1, -1, True, 0.25, 1.0, 0,
                                                    0.0, None, 1, False, 0, torch.empty(4))
        assert o.shape == (19, 4, 40) and lse.shape == (4, 19) and lse.dtype == torch.float32
        dq, dk, dv, ds = torch.ops.tilegrad.varlen_attn_bwd(o, q, k, v, o, lse, cu, cu, True,
                                                            0.25, 1.0, 0, 0.0, None, 1, False,
                                                            0, None)
        assert (dq.shape, dk.shape, dv.shape, ds.shape) == (q.shape, k.shape, v.shape, (0,))


@needs_ops
def test_compile_fullgraph_matches_eager():
    """One graph, no break; the eager bits forward and backward (aot_eager)."""
    q, k, v, cu_q, cu_k = _op_args(Dv=32)[:5]
    s = torch.randn(4, generator=torch.Generator().manual_seed(6)).requires_grad_(True)

    def f(q, k, v, s):
        return tt.varlen_attention(q, k, v, cu_q, cu_k, 13, 13, causal=True, window_size=(4, 0),
                                   softcap=8.0, sinks=s, deterministic=True)
    explain = torch._dynamo.explain(f)(q, k, v, s)
    assert explain.graph_count == 1 and explain.graph_break_count == 0
    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        for t in (q, k, v, s):
            t.grad = None
        o = fn(q, k, v, s)
        o.float().square().sum().backward()
        outs.append([o.detach(), q.grad, k.grad, v.grad, s.grad])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@needs_ops
def test_direct_path_matches_the_op_bitwise(monkeypatch):
    outs = []
    for direct in (True, False):
        monkeypatch.setattr(paths, "_CAN_GO_DIRECT", direct)
        q, k, v, cu_q, cu_k = (a.detach().requires_grad_(a.is_floating_point())
                               for a in _op_args(Dv=32)[:5])
        s = torch.tensor([0.5, -1.0, 0.0, 2.0], requires_grad=True)
        torch.manual_seed(2)
        o = tt.varlen_attention(q, k, v, cu_q, cu_k, 13, 13, dropout_p=0.2, causal=True,
                                sinks=s, deterministic=True)
        o.float().square().sum().backward()
        outs.append([o.detach(), q.grad, k.grad, v.grad, s.grad])
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)
