"""tilegrad.torch.ring_attention: context-parallel FA-2 over torch.distributed.

2 and 4 processes on gloo over loopback (``torch.multiprocessing`` spawn,
free port, 1 thread each, as test_torch_ddp.py) run every case of ``CASES``
-- float32 and bf16, causal and not, GQA, the contiguous layout with ragged
chunk lengths and the zigzag layout with chunks of unequal size, softcap, a
scale other than 1/sqrt(D), chunks longer than a kernel tile -- forward and
backward on their chunks. The parent puts the chunks back together
(``ring_unshard``) and compares O, dq, dk, dv with

  * the single-process ``tilegrad.torch.attention`` on the whole sequence
    (the same kernels, one call), and
  * PyTorch autograd of softmax attention in float64 on the same inputs
    (test_torch_wrappers.ref_attention).

Tolerances: the per-element bounds of the existing attention tests
(test_torch_wrappers.py, tests/python/README.md): for an output X,

  tol_X = u_out |ref| + SAFETY * (input perturbation + first-order f32 terms),
  SAFETY = 2,

with u_out = 2^-8 for bf16 (the one rounding of O and of each gradient;
the backward is fed the bf16 O through D = rowsum(O dO):
|dD| <= 2^-8 sum|O||dO|) and 2^-24 for float32 (O stored in f32), and the
f32 terms (kL + g qL + D + 64)(1 + max|L|) 2^-24 times the summed magnitudes
(P.|V| for O, scale P(|dP|+|D|).|K| for dq, its transpose with |Q| for dk,
P^T.|dO| for dv). The ring adds f32 roundings of the same order: the
logsumexp merge of at most 2N partial (O, L) pairs (a few ulps of O per
merge, and of L, which the bound already carries as (1 + max|L|) u) and the
chunk-by-chunk order of the dq / dk / dv sums (the f32 term counts every
summed term, in any order). Asserted: the ring within tol of the f64
reference, the single process within tol of it (the existing claim, here on
these shapes), and ring vs single process within 2 tol (both are within tol
of the same value; bf16 results may round to neighbouring values, 1 bf16 ulp
<= 2^-7 |x|). A missing or doubled chunk, a wrong q_offset or a merge through
bf16 O fails too (tried by hand: a wrong q_offset puts 88% of O outside,
rounding each partial O to bf16 before the merge 2%). Observed worst
error/tol (ring vs f64, 2 and 4 ranks), printed to stderr: bf16 O 0.88,
dv 0.86 (the rounding term is a tight bound of a rounding), dq 0.49, dk
0.56; float32 at most 0.005.

Variants (``VARIANTS``: sliding window, sinks, both; causal and not; both
layouts): O, dq, dk, dv and the sinks' gradient (each rank's part, summed
over the ranks) against float64 autograd with test_torch_attn_variants'
bounds (its ``ref_variants`` and ``bounds``), the same terms as above, and
the single-process kernels within 2 tol. A sink merged once per chunk
instead of once per row fails them.

Packed documents (``DOC_CASES``, ``cu_seqlens=``; 2 and 3 processes):
documents of length 1, documents ending exactly at chunk boundaries, one
spanning every rank, causal and full, both layouts, GQA, a window that
crosses pieces, sinks. O, dq, dk, dv and dsinks against float64 autograd
over the block-diagonal mask with test_varlen_torch's per-document bounds
(``varlen_bounds``, ``rel_terms``), the one-process ``varlen_attention`` on
the whole packing within them and the ring within 2 tol of it; two runs
with ``deterministic=True`` bitwise equal; a group of one rank gives
varlen_attention's bits; the bytes sent are the dense ring's; bad offsets
(decreasing, not starting at 0, a wrong total, different on one rank, not
integers, B = 2) raise ValueError on every rank with nothing sent. Observed
worst error/tol: bf16 0.94 (O), float32 0.015. ``test_packed_document_pieces``
checks the calls a plan makes (no process group).

Also checked: a group of one rank (``group=`` a one-rank subgroup, the whole
sequence on it) gives the single-process bits; a 2-rank subgroup of the
4-rank world (group ranks differ from global ranks); the bytes sent per rank
are those of the ring (module docstring of tilegrad.ring); clear errors that
every rank raises together (a rank disagreeing in D, dropout on one rank,
zigzag lengths that are not the layout's), and without an initialized
process group. Skipped when torch.distributed or gloo is unavailable.
"""
import datetime
import math
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
import tilegrad.torch as tt  # noqa: E402
from tilegrad import ring  # noqa: E402
from test_torch_ddp import catch as _catch, free_port, gloo_on_loopback, \
    start_gloo_worker  # noqa: E402
from test_torch_attn_variants import bounds, ref_variants  # noqa: E402
from test_torch_wrappers import F64, SAFETY, U32, UBF, check, ref_attention, \
    sum_group  # noqa: E402

pytestmark = pytest.mark.usefixtures("float32_default_dtype")

# name: dtype, causal, layout, B, H, H_kv, S, D, chunk lengths (contiguous;
# None: even), softcap, scale multiplier of 1/sqrt(D)
CASES = {
    "f32-full-gqa-ragged": (torch.float32, False, "contiguous", 2, 4, 2, 57, 16,
                            {2: [17, 40], 4: [9, 21, 15, 12]}, None, 1.0),
    "f32-causal-zigzag-gqa4": (torch.float32, True, "zigzag", 1, 4, 1, 150, 32, None, None, 1.0),
    "f32-causal-ragged": (torch.float32, True, "contiguous", 1, 2, 2, 61, 16,
                          {2: [44, 17], 4: [5, 30, 9, 17]}, 5.0, 1.0),
    "bf16-causal-zigzag-gqa": (torch.bfloat16, True, "zigzag", 1, 6, 3, 130, 64, None, None,
                               1.0),
    "bf16-full-long-chunks": (torch.bfloat16, False, "contiguous", 2, 2, 1, 150, 16, None, None,
                              2.0),
    "bf16-causal-ragged-gqa": (torch.bfloat16, True, "contiguous", 1, 4, 2, 45, 8,
                               {2: [30, 15], 4: [12, 3, 20, 10]}, None, 0.5),
}


# name: dtype, causal, layout, B, H, H_kv, S, D, chunk lengths (contiguous;
# None: even), window, sinks ("randn", "mixed": one head without a sink)
VARIANTS = {
    "f32-causal-zigzag-window-sinks": (torch.float32, True, "zigzag", 1, 4, 2, 70, 16, None,
                                       9, "randn"),
    "bf16-full-ragged-window": (torch.bfloat16, False, "contiguous", 1, 2, 1, 45, 16,
                                {2: [30, 15], 4: [12, 3, 20, 10]}, 12, None),
    "f32-causal-ragged-sinks": (torch.float32, True, "contiguous", 2, 2, 2, 41, 8,
                                {2: [11, 30], 4: [10, 10, 11, 10]}, None, "mixed"),
    "bf16-causal-zigzag-window": (torch.bfloat16, True, "zigzag", 1, 2, 2, 64, 32, None, 1,
                                  "randn"),
}


def _variant_inputs(name):
    """The whole-sequence q, k, v, dO and sinks (None or f32 [H]) of a variant."""
    dtype, _, _, B, H, Hkv, S, D, _, _, skind = VARIANTS[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    mk = lambda h: torch.randn((B, h, S, D), generator=g).to(dtype)  # noqa: E731
    q, k, v, do = mk(H), mk(Hkv), mk(Hkv), mk(H)
    sinks = None
    if skind is not None:
        sinks = torch.randn(H, generator=g) * 2
        if skind == "mixed":
            sinks[0] = -math.inf
    return q, k, v, do, sinks


def _run_variant(name, N, r):
    """This rank's (o, dq, dk, dv, its part of dsinks) of a variant."""
    _, causal, layout, _, _, _, _, _, lens, W, _ = VARIANTS[name]
    q, k, v, do, sinks = _variant_inputs(name)
    if lens is None or N == 1:
        q, k, v, do = (tt.ring_shard(x, N, r, layout) for x in (q, k, v, do))
    else:
        lo, hi = sum(lens[N][:r]), sum(lens[N][:r + 1])
        q, k, v, do = (x[:, :, lo:hi] for x in (q, k, v, do))
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    if sinks is not None:
        sinks.requires_grad_(True)
    o = tt.ring_attention(q, k, v, causal=causal, layout=layout, window=W, sinks=sinks)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad, None if sinks is None else sinks.grad


def _inputs(name):
    """The whole-sequence q, k, v, dO of a case (the same in every process)."""
    dtype, _, _, B, H, Hkv, S, D = CASES[name][:8]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    mk = lambda h: torch.randn((B, h, S, D), generator=g).to(dtype)  # noqa: E731
    return mk(H), mk(Hkv), mk(Hkv), mk(H)


def _lengths(name, N):
    """Chunk lengths per rank for a contiguous case (None: ring_shard's)."""
    lens = CASES[name][8]
    return None if lens is None or N == 1 else lens[N]


def _shard(x, name, N, r):
    layout = CASES[name][2]
    lens = _lengths(name, N)
    if lens is None:
        return tt.ring_shard(x, N, r, layout)
    return x[:, :, sum(lens[:r]):sum(lens[:r + 1])]


def _scale(name):
    D, mult = CASES[name][7], CASES[name][10]
    return mult / math.sqrt(D)


def _run_case(name, N, r, group=None):
    """This rank's (o, dq, dk, dv) of a case."""
    _, causal, layout = CASES[name][:3]
    q, k, v, do = (_shard(x, name, N, r) for x in _inputs(name))
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = tt.ring_attention(q, k, v, causal=causal, scale=_scale(name), softcap=CASES[name][9],
                          group=group, layout=layout)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def _errors(N, r):
    """Bad calls every rank makes together; their messages."""
    q, k, v, _ = (_shard(x, "f32-causal-zigzag-gqa4", N, r)
                  for x in _inputs("f32-causal-zigzag-gqa4"))
    out = {}
    # rank 1 has a different head dim
    D = 16 if r == 1 else 32
    out["D"] = _catch(lambda: tt.ring_attention(q[..., :D], k[..., :D], v[..., :D]))
    # only rank 0 asks for dropout
    out["dropout"] = _catch(lambda: tt.ring_attention(q, k, v, dropout_p=0.1 if r == 0 else 0))
    # contiguous chunks of ragged lengths called zigzag
    n = 10 + 3 * r
    out["zigzag"] = _catch(lambda: tt.ring_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n],
                                                     causal=True, layout="zigzag"))
    # a value head dim of its own, on every rank; sinks of the wrong shape
    out["dv"] = _catch(lambda: tt.ring_attention(q, k, v[..., :16], layout="zigzag"))
    out["sinks"] = _catch(lambda: tt.ring_attention(q, k, v, layout="zigzag",
                                                    sinks=torch.zeros(3)))
    return out


def _worker(rank, N, port, out_dir, lib_path):
    dist = start_gloo_worker(rank, N, port, lib_path)
    try:
        res = {"cases": {}, "bytes": {}}
        for name in CASES:
            b0 = ring.bytes_sent()
            res["cases"][name] = _run_case(name, N, rank)
            res["bytes"][name] = ring.bytes_sent() - b0
        # every rank alone in a group of one, on the whole sequence
        singles = [dist.new_group([r]) for r in range(N)]
        name = "bf16-causal-ragged-gqa"
        res["single"] = _run_case(name, 1, 0, group=singles[rank])
        if N == 4:   # a 2-rank ring of global ranks 1 and 3
            pair = dist.new_group([1, 3])
            if rank in (1, 3):
                res["pair"] = _run_case("f32-causal-zigzag-gqa4", 2, rank // 2, group=pair)
        res["variants"] = {name: _run_variant(name, N, rank) for name in VARIANTS}
        res["errors"] = _errors(N, rank)
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(N, tmp_path, lib, worker=None):
    gloo_on_loopback()
    import torch.multiprocessing as mp
    ctx = mp.spawn(worker or _worker, args=(N, free_port(), str(tmp_path), lib.path), nprocs=N,
                   join=False)
    deadline, t0 = 120, time.monotonic()
    while not ctx.join(timeout=1):        # raises with the child's traceback on a failure
        if time.monotonic() - t0 > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {N} ring ranks did not finish in {deadline} s")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(N)]


def _single(name, q, k, v, do):
    """The single-process kernels on the whole sequence: (o, dq, dk, dv)."""
    causal = CASES[name][1]
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = tt.attention(q, k, v, causal=causal, scale=_scale(name), softcap=CASES[name][9])
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


def _reference_and_tols(name, q, k, v, do):
    """float64 autograd (O, dq, dk, dv) and the per-element tolerances of
    the module docstring."""
    dtype, causal = CASES[name][:2]
    scale, cap = _scale(name), CASES[name][9]
    H, Hkv, S, D = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    Q, K, V = (t.to(F64).requires_grad_(True) for t in (q, k, v))
    O, P, L = ref_attention(Q, K, V, None, causal, scale, cap, 0)
    dOd = do.to(F64)
    O.backward(dOd)
    u_out = UBF if dtype == torch.bfloat16 else U32
    g = H // Hkv
    with torch.no_grad():
        Kr, Vr = K.abs().repeat_interleave(g, 1), V.abs().repeat_interleave(g, 1)
        dP = dOd @ V.repeat_interleave(g, 1).transpose(-1, -2)
        Dx = (O * dOd).sum(-1, keepdim=True)
        P = P.detach()
        rel = (S + g * S + D + 64) * (1 + float(L.abs().max())) * U32
        Mds = P * (dP.abs() + Dx.abs())
        dD = (u_out + (D + 4) * U32) * (O.abs() * dOd.abs()).sum(-1, keepdim=True)
        tols = (u_out * O.abs() + SAFETY * rel * (P @ Vr),
                u_out * Q.grad.abs() + SAFETY * scale * (((P * dD) + rel * Mds) @ Kr),
                u_out * K.grad.abs() + SAFETY * sum_group(
                    scale * ((P * dD) + rel * Mds).transpose(-1, -2) @ Q.abs(), g),
                u_out * V.grad.abs() + SAFETY * sum_group(
                    rel * P.transpose(-1, -2) @ dOd.abs(), g))
    refs = (O.detach(), Q.grad, K.grad, V.grad)
    return refs, tuple(t + 1e-30 for t in tols)


def _unshard(ranks, name, key="cases"):
    N = len(ranks)
    layout = CASES[name][2]
    parts = [r[key][name] for r in ranks]
    return tuple(tt.ring_unshard([p[j] for p in parts], layout) for j in range(4))


def _bytes_expected(name, N, r):
    """The ring's sends of rank r: the key/value chunks N - 1 times forward
    and backward (input dtype), its dK/dV sums N times (f32)."""
    dtype, _, layout, B, _, Hkv, S, D = CASES[name][:8]
    lens = _lengths(name, N) or [len(tt.ring_positions(S, N, j, layout)) for j in range(N)]
    es = torch.finfo(dtype).bits // 8
    row = B * Hkv * D * 2                             # k and v of one position
    kv = sum(lens[(r - s) % N] for s in range(N - 1)) * row * es
    grads = sum(lens) * row * 4 if N > 1 else 0
    return 2 * kv + grads


def _check_world(N, ranks):
    worst = {}
    for name in CASES:
        full = _inputs(name)
        ring = _unshard(ranks, name)
        single = _single(name, *full)
        refs, tols = _reference_and_tols(name, *full)
        for what, a, b, ref, tol in zip(("O", "dq", "dk", "dv"), ring, single, refs, tols):
            info = f"{N} ranks, case {name}"
            assert a.dtype == CASES[name][0] and a.shape == ref.shape
            worst[(name, what)] = check(f"ring {what}", a, ref, tol, info)
            check(f"single-process {what}", b, ref, tol, info)
            check(f"ring - single-process {what}", a, b.to(F64), 2 * tol, info)
        for r in range(N):
            assert ranks[r]["bytes"][name] == _bytes_expected(name, N, r), (name, r)
    for dtype in (torch.float32, torch.bfloat16):
        mine = {k: x for k, x in worst.items() if CASES[k[0]][0] == dtype}
        (n, w), ratio = max(mine.items(), key=lambda kv: kv[1])
        print(f"{N} ranks, {dtype}: worst ring error/tol {ratio:.3g} ({n}, {w}); by output "
              + ", ".join(f"{o} {max(x for k, x in mine.items() if k[1] == o):.2g}"
                          for o in ("O", "dq", "dk", "dv")), file=sys.stderr)

    for name in VARIANTS:
        _check_variant(N, ranks, name)

    # one-rank groups: the single-process kernels' bits
    name = "bf16-causal-ragged-gqa"
    single = _single(name, *_inputs(name))
    for r in range(N):
        for a, b in zip(ranks[r]["single"], single):
            assert torch.equal(a, b), f"rank {r} alone: not the single-process bits"

    # errors: raised on every rank, with the reason where it arose
    for r in range(N):
        e = ranks[r]["errors"]
        assert e["D"].startswith("ValueError") and "disagree in ['D'" in e["D"], e["D"]
        if r == 0:
            assert e["dropout"].startswith("ValueError") and "dropout" in e["dropout"]
        else:
            assert e["dropout"].startswith("RuntimeError") and "[0]" in e["dropout"]
        assert "layout='zigzag'" in e["zigzag"], e["zigzag"]
        assert e["dv"].startswith("ValueError") and "value head dim" in e["dv"], e["dv"]
        assert e["sinks"].startswith("ValueError") and "shape (4,)" in e["sinks"], e["sinks"]


def _check_variant(N, ranks, name):
    """A window / sinks variant against float64 autograd and the single
    process (module docstring)."""
    dtype, causal, layout = VARIANTS[name][:3]
    W = VARIANTS[name][9]
    q, k, v, do, sinks = _variant_inputs(name)
    parts = [r["variants"][name] for r in ranks]
    ring_out = [tt.ring_unshard([p[j] for p in parts], layout) for j in range(4)]
    if sinks is not None:
        ring_out.append(sum(p[4] for p in parts))     # every rank's rows' part
    scale = 1 / math.sqrt(q.shape[3])
    # the single process, whole sequence
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    s1 = None if sinks is None else sinks.clone().requires_grad_(True)
    o1 = tt.attention(*ts, causal=causal, window=W, sinks=s1)
    o1.backward(do)
    single = [o1.detach()] + [t.grad for t in ts] + ([] if s1 is None else [s1.grad])
    # float64 autograd
    Q, K, V = (t.to(F64).requires_grad_(True) for t in (q, k, v))
    S64 = None if sinks is None else sinks.to(F64).requires_grad_(True)
    O, P, L, p_sink = ref_variants(Q, K, V, None, causal, scale, None, 0, W, S64)
    O.backward(do.to(F64))
    tol = bounds(Q, K, V, O, P, L, p_sink, do.to(F64), scale,
                 UBF if dtype == torch.bfloat16 else U32)
    refs = [O.detach(), Q.grad, K.grad, V.grad] + ([] if S64 is None else [S64.grad])
    for what, a, b, ref in zip(("O", "dq", "dk", "dv", "dsinks"), ring_out, single, refs):
        info = f"{N} ranks, variant {name}"
        check(f"ring {what}", a, ref, tol[what], info)
        check(f"single-process {what}", b, ref, tol[what], info)
        check(f"ring - single-process {what}", a, b.to(F64), 2 * tol[what], info)


def test_ring_two_ranks(tmp_path, lib):
    _check_world(2, _spawn(2, tmp_path, lib))


def test_ring_four_ranks(tmp_path, lib):
    ranks = _spawn(4, tmp_path, lib)
    _check_world(4, ranks)
    # global ranks 1 and 3 as a ring of two
    name = "f32-causal-zigzag-gqa4"
    full = _inputs(name)
    pair = tuple(tt.ring_unshard([ranks[r]["pair"][j] for r in (1, 3)], "zigzag")
                 for j in range(4))
    refs, tols = _reference_and_tols(name, *full)
    for what, a, ref, tol in zip(("O", "dq", "dk", "dv"), pair, refs, tols):
        check(f"subgroup ring {what}", a, ref, tol, "group = ranks 1, 3")


def test_ring_needs_an_initialized_group():
    dist = pytest.importorskip("torch.distributed")
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        tt.ring_attention(q, q, q)


def test_window_pairs_skip_chunks_outside_the_window():
    """The (query chunk, key chunk) pairs a rank runs with a window: those
    wholly before every query's window are skipped, the window passed only
    where its edge crosses the pair, q_offset = query start - key start."""
    segs = [[(0, 10, 10 * r)] for r in range(4)]       # contiguous, 10 rows each
    plan = ring._Plan(None, 3, 4, segs, True, 0.25, 1.0, 5, torch.float32, 1, False, 0)
    assert list(plan.pairs(0)) == [] and list(plan.pairs(1)) == []
    assert list(plan.pairs(2)) == [((0, 10, 30), (0, 10, 20), False, 10, 5)]
    assert list(plan.pairs(3)) == [((0, 10, 30), (0, 10, 30), True, 0, 5)]
    wide = ring._Plan(None, 3, 4, segs, False, 0.25, 1.0, 25, torch.float32, 1, False, 0)
    assert [p[2:] for s in range(4) for p in wide.pairs(s)] == \
        [(False, 30, 25), (False, 20, 25), (False, 0, 0), (False, 0, 0)]


def test_shard_unshard_round_trip():
    x = torch.arange(2 * 3 * 23 * 8, dtype=torch.float32).view(2, 3, 23, 8)
    for N in (1, 2, 4):
        for layout in ring.LAYOUTS:
            parts = [tt.ring_shard(x, N, r, layout) for r in range(N)]
            assert torch.equal(tt.ring_unshard(parts, layout), x)
            pos = torch.cat([tt.ring_positions(23, N, r, layout) for r in range(N)])
            assert sorted(pos.tolist()) == list(range(23))
    # zigzag on 2 ranks: chunks 0 and 3, then 1 and 2, of tensor_split's 4
    assert tt.ring_positions(10, 2, 0, "zigzag").tolist() == [0, 1, 2, 8, 9]
    assert tt.ring_positions(10, 2, 1, "zigzag").tolist() == [3, 4, 5, 6, 7]
    with pytest.raises(ValueError, match="layout"):
        tt.ring_shard(x, 2, 0, "striped")
    with pytest.raises(ValueError, match="non-empty"):
        tt.ring_positions(5, 4, 0, "zigzag")
    with pytest.raises(ValueError, match="at least 4 rows"):    # a zigzag chunk would be empty
        tt.ring_unshard([x[:, :, :1], x[:, :, :2]], "zigzag")


def _fault_worker(rank, port, out_dir, fault):
    """Two ranks; rank 1 stalls ("hang": 3 timeouts inside its forward's
    kernels) or dies ("die": exits there) while rank 0 runs on. Each rank
    saves the error its ring_attention raised (None: none)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    timeout = 2.0
    if rank == 1:
        fwd = ring._fwd_pair

        def stalled(*a, **kw):
            if fault == "die":
                os._exit(0)            # no goodbye: the sockets close with the process
            time.sleep(3 * timeout)
            return fwd(*a, **kw)
        ring._fwd_pair = stalled
    q = torch.randn(1, 2, 16, 8)
    q.requires_grad_(True)
    err = None
    try:
        tt.ring_attention(q, q, q, timeout=timeout).sum().backward()
    except ring.RingPeerError as e:
        err = dict(msg=str(e), rank=e.rank, peer=e.peer)
    torch.save(err, os.path.join(out_dir, f"fault{rank}.pt"))
    os._exit(0)    # the group is broken: its destructor would wait on the dead messages


@pytest.mark.parametrize("fault", ["hang", "die"])
def test_ring_peer_fault_names_the_peer(tmp_path, fault):
    """A peer that stops answering (hang: past ``timeout=``) or dies (its
    sockets close): ring_attention raises RingPeerError on the other rank,
    naming the peer rank it waited on, instead of waiting out gloo's 30
    minutes. tests/multihost runs the same across network namespaces."""
    gloo_on_loopback()
    import torch.multiprocessing as mp
    ctx = mp.spawn(_fault_worker, args=(free_port(), str(tmp_path), fault), nprocs=2,
                   join=False)
    t0 = time.monotonic()
    while not ctx.join(timeout=1):
        if time.monotonic() - t0 > 120:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{fault}: the ranks did not finish in 120 s")
    err = torch.load(tmp_path / "fault0.pt")
    assert err is not None, f"{fault}: rank 0 raised no RingPeerError"
    assert err["rank"] == 0 and err["peer"] == 1, err
    assert "peer rank 1" in err["msg"] and "rank 0 of 2" in err["msg"], err
    if fault == "hang":
        assert "imed out" in err["msg"] or "no answer" in err["msg"], err


def test_ring_timeout_argument():
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            ring._timeout_arg(bad)
    assert ring._timeout_arg(None).total_seconds() == float(
        os.environ.get("TILEGRAD_COLLECTIVE_TIMEOUT") or ring.DEFAULT_TIMEOUT)
    # the same wait, for init_process_group(timeout=): DDP's collectives are torch's
    assert ring.collective_timeout() == ring._timeout_arg(None)
    assert ring.collective_timeout(7.5) == datetime.timedelta(seconds=7.5)
    with pytest.raises(ValueError, match="timeout"):
        ring.collective_timeout(0)


# ---------------------------------------------------------------------------
# packed documents (cu_seqlens=): against one-process varlen_attention

# name: dtype, causal, layout, H, H_kv, D, document lengths, chunk lengths
# per world size (contiguous; None: ring_shard's), window, sinks
DOC_CASES = {
    # documents of length 1, and documents ending at every chunk boundary
    # (2 ranks: 8; 3 ranks: 7 and 28; 4 ranks: 7, 8 and 28)
    "f32-causal-ragged-gqa-len1": (torch.float32, True, "contiguous", 4, 2, 16,
                                   [1, 5, 1, 1, 20, 1, 14, 3],
                                   {2: [8, 38], 3: [7, 21, 18], 4: [7, 1, 20, 18]}, None, None),
    # one document over every rank's rows (zigzag: each rank's two chunks);
    # 3 ranks: the first ends at the first chunk boundary
    "bf16-causal-zigzag-span-gqa": (torch.bfloat16, True, "zigzag", 4, 1, 32,
                                    [20, 1, 97, 1, 1], None, None, None),
    # full attention: the pieces of keys after the queries too
    "f32-full-gqa3": (torch.float32, False, "contiguous", 3, 1, 8, [9, 30, 1, 17], None, None,
                      None),
    "bf16-full-zigzag-len1": (torch.bfloat16, False, "zigzag", 2, 2, 16,
                              [1, 1, 30, 1, 14, 1, 1], None, None, None),
    # window and sinks: the window's edge crosses pieces (the dense calls)
    "f32-causal-zigzag-window-sinks": (torch.float32, True, "zigzag", 4, 2, 16, [40, 3, 27],
                                       None, 9, "mixed"),
    "bf16-full-window": (torch.bfloat16, False, "contiguous", 2, 1, 16, [5, 33, 22],
                         {2: [30, 30], 3: [5, 25, 30], 4: [20, 18, 12, 10]}, 12, None),
}


def _doc_offsets(name):
    lens = DOC_CASES[name][6]
    return torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)


def _doc_inputs(name):
    """The packed q (S, H, D), k, v (S, H_kv, D), dO and sinks of a case."""
    dtype, _, _, H, Hkv, D, lens = DOC_CASES[name][:7]
    S = sum(lens)
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    mk = lambda h: torch.randn((S, h, D), generator=g).to(dtype)  # noqa: E731
    q, k, v, do = mk(H), mk(Hkv), mk(Hkv), mk(H)
    sinks = None
    if DOC_CASES[name][9] is not None:
        sinks = torch.randn(H, generator=g) * 2
        sinks[0] = -math.inf              # a head without a sink
    return q, k, v, do, sinks


def _doc_shard(x, name, N, r):
    """Rank r's rows of a packed (S, ...) tensor."""
    layout, lens = DOC_CASES[name][2], DOC_CASES[name][7]
    if lens is None or N == 1:
        return tt.ring_shard(x, N, r, layout, dim=0)
    return x[sum(lens[N][:r]):sum(lens[N][:r + 1])]


def _bhld(x):
    """packed (rows, heads, D) -> [1, heads, rows, D] (a view)."""
    return x.transpose(0, 1).unsqueeze(0)


def _run_docs(name, N, r, deterministic=False, group=None):
    """This rank's (o, dq, dk, dv) in the packed layout and its part of dsinks."""
    _, causal, layout = DOC_CASES[name][:3]
    W = DOC_CASES[name][8]
    q, k, v, do, sinks = _doc_inputs(name)
    q, k, v, do = (_doc_shard(x, name, N, r) for x in (q, k, v, do))
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    if sinks is not None:
        sinks.requires_grad_(True)
    o = tt.ring_attention(_bhld(q), _bhld(k), _bhld(v), causal=causal, layout=layout,
                          window=W, sinks=sinks, cu_seqlens=_doc_offsets(name),
                          deterministic=deterministic, group=group)
    o = o[0].transpose(0, 1)
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad, None if sinks is None else sinks.grad


def _doc_errors(N, r):
    """Bad offsets, the same call on every rank (but "differ"); their
    messages, and whether the ring sent anything before raising."""
    name = "f32-causal-ragged-gqa-len1"
    q, k, v, _, _ = (None if x is None else _bhld(_doc_shard(x, name, N, r))
                     for x in _doc_inputs(name))
    cu = _doc_offsets(name)
    S = int(cu[-1])
    b0 = ring.bytes_sent()
    out = {}
    bad = cu.clone()
    bad[3], bad[4] = int(cu[4]), int(cu[3])
    out["decreasing"] = _catch(lambda: tt.ring_attention(q, k, v, True, cu_seqlens=bad))
    short = cu.clone()
    short[-1] = S - 1
    out["total"] = _catch(lambda: tt.ring_attention(q, k, v, True, cu_seqlens=short))
    differ = cu.clone()
    if r == 1:
        differ[2] += 1
    out["differ"] = _catch(lambda: tt.ring_attention(q, k, v, True, cu_seqlens=differ))
    out["start"] = _catch(lambda: tt.ring_attention(q, k, v, True, cu_seqlens=cu + 1))
    out["dtype"] = _catch(lambda: tt.ring_attention(q, k, v, True, cu_seqlens=cu.float()))
    two = torch.cat([q, q])
    out["batch"] = _catch(lambda: tt.ring_attention(two, torch.cat([k, k]), torch.cat([v, v]),
                                                    True, cu_seqlens=cu))
    out["sent"] = ring.bytes_sent() - b0
    return out


def _docs_worker(rank, N, port, out_dir, lib_path):
    dist = start_gloo_worker(rank, N, port, lib_path)
    try:
        res = {"cases": {}, "bytes": {}}
        for name in DOC_CASES:
            b0 = ring.bytes_sent()
            res["cases"][name] = _run_docs(name, N, rank)
            res["bytes"][name] = ring.bytes_sent() - b0
        name = "bf16-causal-zigzag-span-gqa"
        res["det"] = [_run_docs(name, N, rank, deterministic=True) for _ in range(2)]
        single = None
        for r in range(N):     # every rank alone in a group of one (new_group: all call it)
            g = dist.new_group([r])
            if r == rank:
                single = g
        res["single"] = _run_docs("f32-causal-ragged-gqa-len1", 1, 0, group=single)
        res["errors"] = _doc_errors(N, rank)
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _doc_single(name, q, k, v, do, sinks):
    """One-process varlen_attention on the whole packed sequence: (o, dq,
    dk, dv, dsinks)."""
    _, causal, _, _, _, _, lens = DOC_CASES[name][:7]
    W = DOC_CASES[name][8]
    cu = _doc_offsets(name)
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    s1 = None if sinks is None else sinks.clone().requires_grad_(True)
    ws = (-1, -1) if W is None else (W - 1, 0 if causal else -1)
    o = tt.varlen_attention(*ts, cu, cu, max(lens), max(lens), causal=causal, window_size=ws,
                            sinks=s1)
    o.backward(do)
    return [o.detach()] + [t.grad for t in ts] + ([] if s1 is None else [s1.grad])


def _doc_reference(name, q, k, v, do, sinks):
    """float64 autograd over the block-diagonal mask and test_varlen_torch's
    per-document bounds -> (refs, tols) in the [1, heads, rows, D] layout."""
    from test_varlen_torch import block_mask, rel_terms, varlen_bounds
    dtype, causal, _, H, Hkv, D = DOC_CASES[name][:6]
    W = DOC_CASES[name][8] or 0
    cu = _doc_offsets(name)
    S = int(cu[-1])
    as4 = lambda t: _bhld(t.to(F64))  # noqa: E731
    Q, K, V = (as4(t).requires_grad_(True) for t in (q, k, v))
    S64 = None if sinks is None else sinks.to(F64).requires_grad_(True)
    mask = block_mask(cu, cu, causal, W).view(1, 1, S, S)
    scale = float(torch.tensor(1 / math.sqrt(D), dtype=torch.float32))   # the params' float
    O, P, L, p_sink = ref_variants(Q, K, V, mask, False, scale, None, 0, None, S64)
    dOd = as4(do)
    O.backward(dOd)
    R, rel_row = rel_terms(cu, cu, H // Hkv, D, D, L)
    tol = varlen_bounds(Q, K, V, O, P, L, p_sink, dOd, scale,
                        UBF if dtype == torch.bfloat16 else U32, R, rel_row)
    refs = [O.detach(), Q.grad, K.grad, V.grad] + ([] if S64 is None else [S64.grad])
    return refs, [tol[w] for w in ("O", "dq", "dk", "dv", "dsinks")][:len(refs)]


def _doc_unshard(name, parts):
    """(o, dq, dk, dv[, dsinks summed]) of the whole sequence from every
    rank's results."""
    layout = DOC_CASES[name][2]
    out = [tt.ring_unshard([p[j] for p in parts], layout, dim=0) for j in range(4)]
    if parts[0][4] is not None:
        out.append(sum(p[4] for p in parts))       # every rank's rows' part
    return out


def _check_docs(N, ranks):
    worst = {}
    for name in DOC_CASES:
        full = _doc_inputs(name)
        got = _doc_unshard(name, [r["cases"][name] for r in ranks])
        single = _doc_single(name, *full)
        refs, tols = _doc_reference(name, *full)
        whats = ("O", "dq", "dk", "dv", "dsinks")
        for what, a, b, ref, tol in zip(whats, got, single, refs, tols):
            info = f"{N} ranks, documents {name}"
            if what != "dsinks":
                assert a.dtype == DOC_CASES[name][0], (what, a.dtype)
                a, b = _bhld(a), _bhld(b)
            worst[(name, what)] = check(f"ring {what}", a, ref, tol, info)
            check(f"single-process {what}", b, ref, tol, info)
            check(f"ring - single-process {what}", a, b.to(F64), 2 * tol, info)
        # the ring's messages whatever the documents: every chunk travels
        dtype, _, layout, _, Hkv, D, lens, chunks = DOC_CASES[name][:8]
        rows = chunks[N] if chunks else [len(tt.ring_positions(sum(lens), N, j, layout))
                                         for j in range(N)]
        es = torch.finfo(dtype).bits // 8
        for r in range(N):
            kv = sum(rows[(r - s) % N] for s in range(N - 1)) * Hkv * D * 2 * es
            assert ranks[r]["bytes"][name] == 2 * kv + sum(rows) * Hkv * D * 2 * 4, (name, r)
    for dtype in (torch.float32, torch.bfloat16):
        mine = {k: x for k, x in worst.items() if DOC_CASES[k[0]][0] == dtype}
        (n, w), ratio = max(mine.items(), key=lambda kv: kv[1])
        print(f"{N} ranks, packed documents, {dtype}: worst ring error/tol {ratio:.3g} ({n}, "
              f"{w}); by output " + ", ".join(
                  f"{o} {max(x for k, x in mine.items() if k[1] == o):.2g}"
                  for o in ("O", "dq", "dk", "dv", "dsinks") if any(k[1] == o for k in mine)),
              file=sys.stderr)

    # deterministic mode: the same bits twice
    for r in range(N):
        a, b = ranks[r]["det"]
        for x, y in zip(a, b):
            assert (x is None and y is None) or torch.equal(x, y), \
                f"rank {r}: deterministic ring, two runs differ"
    # a group of one: the whole sequence in one call per pass (tg_attn_varlen_*
    # over all the documents, f32 sums rounded once): varlen_attention's bits
    name = "f32-causal-ragged-gqa-len1"
    single = _doc_single(name, *_doc_inputs(name))
    for r in range(N):
        for a, b in zip(ranks[r]["single"][:4], single):
            assert torch.equal(a, b), f"rank {r} alone: not varlen_attention's bits"

    for r in range(N):
        e = ranks[r]["errors"]
        assert e["sent"] == 0, f"rank {r}: {e['sent']} bytes sent before the errors"
        assert e["decreasing"].startswith("ValueError") and "decreases at document 3" in \
            e["decreasing"], e["decreasing"]
        assert e["total"].startswith("ValueError") and "packed length" in e["total"], e["total"]
        assert e["differ"].startswith("ValueError") and "disagree in ['cu_seqlens']" in \
            e["differ"], e["differ"]
        assert e["start"].startswith("ValueError") and "start at 0" in e["start"], e["start"]
        assert e["dtype"].startswith("ValueError") and "int32" in e["dtype"], e["dtype"]
        assert e["batch"].startswith("ValueError") and "B = 1" in e["batch"], e["batch"]


@pytest.mark.parametrize("N", [2, 3])
def test_ring_packed_documents(tmp_path, lib, N):
    _check_docs(N, _spawn(N, tmp_path, lib, _docs_worker))


def test_packed_document_pieces():
    """The calls of packed documents (no process group): a pair sharing no
    document runs nothing, a document ending at a chunk boundary leaves the
    next chunk's pair empty, a spanning one gives one full piece, the
    diagonal cuts the documents at the chunk's ends."""
    segs = [[(0, 10, 10 * r)] for r in range(3)]        # contiguous, 10 rows each
    cu = [0, 4, 10, 25, 30]       # [0,4) [4,10) ends at a boundary; [10,25) spans chunks 1, 2
    plan = lambda r, causal, W=0: ring._Plan(None, r, 3, segs, causal, 0.25, 1.0, W,  # noqa: E731
                                             torch.float32, 1, False, 0, None, cu)

    def show(calls):
        return [(q, k, None if a is None else a.tolist(), None if b is None else b.tolist(), c,
                 o, w) for q, k, a, b, c, o, w in calls]
    p1 = plan(1, True)
    assert show(p1.calls(0)) == []                      # [4, 10) ends where chunk 1 starts
    assert show(p1.calls(1)) == [((0, 10), (0, 10), [0, 10], [0, 10], True, 0, 0)]
    p2 = plan(2, True)
    assert show(p2.calls(0)) == []
    assert show(p2.calls(1)) == [((0, 5), (0, 10), [0, 5], [0, 10], False, 0, 0)]
    assert show(p2.calls(2)) == [((0, 10), (0, 10), [0, 5, 10], [0, 5, 10], True, 0, 0)]
    full = plan(1, False)                                # keys after the queries too
    assert show(full.calls(2)) == [((0, 10), (0, 5), [0, 10], [0, 5], False, 0, 0)]
    assert show(full.calls(0)) == []
    assert show(full.calls(1)) == [((0, 10), (0, 10), [0, 10], [0, 10], False, 0, 0)]
    # a window of 3: chunk 1's keys [10, 20) before chunk 2's queries [20, 25):
    # the edge crosses them (a dense call, q_offset 20 - 10); W = 1: outside
    assert show(plan(2, True, 3).calls(1)) == [((0, 5), (0, 10), None, None, False, 10, 3)]
    assert show(plan(2, True, 1).calls(1)) == []
    assert show(plan(2, True, 15).calls(1)) == [((0, 5), (0, 10), [0, 5], [0, 10], False, 0, 0)]
    # the keys' piece starts at the document's start: [10, 25) over chunk 0 .. 2
    wide = ring._Plan(None, 1, 2, [[(0, 6, 0)], [(0, 6, 6)]], True, 0.25, 1.0, 0,
                      torch.float32, 1, False, 0, None, [0, 2, 12])
    assert show(wide.calls(0)) == [((0, 6), (2, 4), [0, 6], [0, 4], False, 0, 0)]
