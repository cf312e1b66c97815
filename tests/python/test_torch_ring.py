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
from test_torch_ddp import free_port, gloo_on_loopback  # noqa: E402
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


def _catch(fn):
    try:
        fn()
    except Exception as e:     # the message and class, checked by the parent
        return f"{type(e).__name__}: {e}"
    return None


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
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)     # _inputs draws as the parent does
    import torch.distributed as dist
    from tilegrad import capi
    assert os.path.samefile(capi.library().path, lib_path), (capi.library().path, lib_path)
    dist.init_process_group("gloo", rank=rank, world_size=N,
                            timeout=datetime.timedelta(seconds=60))
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


def _spawn(N, tmp_path, lib):
    gloo_on_loopback()
    import torch.multiprocessing as mp
    ctx = mp.spawn(_worker, args=(N, free_port(), str(tmp_path), lib.path), nprocs=N,
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
