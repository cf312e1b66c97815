"""tilegrad._torch_flex.flex_attention (a torch BlockMask on tg_attn_varlen_fwd /
_bwd_step: each (batch, query block) a document of its kv blocks' keys).

Oracles, on the same inputs (bf16 inputs are exact in float64):

* forward and backward: PyTorch autograd of a float64 attention written out
  on the dense boolean mask that torch's own ``create_mask`` builds from the
  BlockMask's ``mask_mod`` (GQA by ``repeat_interleave``; softcap
  ``c*tanh(s/c)`` before the mask; a row that sees no key: output 0, as
  flex_attention gives it), cross-checked against torch's SDPA in float64;
* forward: torch's own ``flex_attention`` (eager; its CPU path of PyTorch
  2.9), skipped where it does not run.

Tolerances, per tensor, on the max abs error against the float64 reference
relative to the reference's max abs value:

* float32: ``2^-15``. The kernels compute in f32: each output is a sum of at
  most a few hundred f32 terms here (n u = 512 * 2^-24 = 2^-15);
* bfloat16: ``2^-6``. Each output and gradient is rounded once to bf16
  (2^-9 relative), and the backward's D = rowsum(dO o O) is taken from the
  bf16-rounded O (an error of 2^-8 of |O| |dO| that every dS of the row
  carries); 2^-6 leaves 4x over that.
* torch's eager flex_attention: float32 within twice the float32 bound of
  ours; bfloat16: its math path rounds the scores and the probabilities to
  bf16 itself, so ours must be within ``2^-4`` of it and no farther from the
  float64 reference than torch's own result is (+ 2^-9).

Observed worst error / tolerance is printed to stderr (-s).

Masks: causal, packed documents (one shorter than a block, one spanning
several blocks), prefix-LM, sliding window, per-batch documents (a BlockMask
of batch B), per-head windows (a BlockMask of H heads), a mask whose first
query block sees nothing; GQA, Lq and Lk not multiples of 128, Lq != Lk,
block sizes 128, 64 and (32, 64), a kv batch of 1; softcap, Dv != D,
return_lse with its gradient; a mask_mod that only runs under vmap; a
BlockMask built by hand (from_kv_blocks: a full tail block, the noop
mask_mod); the refusals (score_mod by name, a function as block_mask,
lengths, duplicate blocks, GQA without enable_gqa); determinism; the work
is the blocks' only (the documents' pairs, no dense mask).

Needs torch >= 2.5 (torch.nn.attention.flex_attention: BlockMask,
create_block_mask, create_mask); skipped before (Debian's torch 1.13).
"""
import math
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="the torch front needs PyTorch")
if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
    pytest.skip(f"torch {torch.__version__} < 2.5: no flex_attention / BlockMask",
                allow_module_level=True)
fa = pytest.importorskip("torch.nn.attention.flex_attention",
                         reason="this torch has no flex_attention")
import tilegrad._torch_flex as tf  # noqa: E402
from tilegrad._torch_flex import flex_attention  # noqa: E402

pytestmark = [pytest.mark.usefixtures("float32_default_dtype"),
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

F64 = torch.float64
TOL = {torch.float32: 2.0 ** -15, torch.bfloat16: 2.0 ** -6}
WORST = {}


@pytest.fixture(autouse=True, scope="module")
def _needs_varlen(lib):
    if not lib.has("tg_attn_varlen_fwd"):
        pytest.skip(f"tg_attn_varlen_fwd is not exported by {lib.path}")


def teardown_module(module):
    if WORST:
        print("\ntest_flex_attention worst error/tol: " +
              ", ".join(f"{k} {v:.3f}" for k, v in sorted(WORST.items())), file=sys.stderr)


def scale_of(D):
    return float(torch.tensor(1 / math.sqrt(D), dtype=torch.float32))  # the params' float


def draw(shape, gen, dtype):
    return torch.randn(shape, generator=gen).to(dtype).requires_grad_(True)


def close(name, got, ref, tol, key=None):
    err = float((got.detach().to(F64) - ref.detach()).abs().max())
    bound = tol * float(ref.detach().abs().max()) + 1e-30
    r = err / bound
    k = key or name
    WORST[k] = max(WORST.get(k, 0.0), r)
    assert r <= 1.0, f"{name}: max abs error {err:.3e} > {bound:.3e} ({r:.2f}x the tolerance)"
    return r


# ---------------------------------------------------------------------------
# masks (mask_mods as torch's docs write them)

def causal(b, h, q, k):
    return q >= k


def doc_ids(lens):
    return torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))


def document(lens):
    """Packed documents, causal within each."""
    ids = doc_ids(lens)

    def mask(b, h, q, k):
        return (ids[q] == ids[k]) & (q >= k)
    return mask


def batch_documents(lens_per_batch):
    """Each batch element its own packing (the BlockMask needs batch B)."""
    ids = torch.stack([doc_ids(lens) for lens in lens_per_batch])

    def mask(b, h, q, k):
        return (ids[b, q] == ids[b, k]) & (q >= k)
    return mask


def prefix_lm(n):
    def mask(b, h, q, k):
        return (k < n) | (q >= k)
    return mask


def sliding_window(w):
    def mask(b, h, q, k):
        return (q >= k) & (q - k < w)
    return mask


def head_windows(w0, dw):
    """Head h sees the w0 + dw * h keys up to the diagonal (BlockMask of H heads)."""
    def mask(b, h, q, k):
        return (q >= k) & (q - k < w0 + dw * h)
    return mask


def late_start(n):
    """Queries before n see nothing (a query block without kv blocks)."""
    def mask(b, h, q, k):
        return (q >= n) & (k <= q)
    return mask


def block_mask(mask_mod, B, H, Lq, Lk, bs):
    return fa.create_block_mask(mask_mod, B, H, Lq, Lk, device="cpu", BLOCK_SIZE=bs)


def dense(mask_mod, B, H, Lq, Lk):
    """[B or 1, H or 1, Lq, Lk] bool, torch's own create_mask."""
    return fa.create_mask(mask_mod, B, H, Lq, Lk, device="cpu")


# ---------------------------------------------------------------------------
# the float64 reference

def reference(q, k, v, allowed, scale, softcap=None):
    """(out, lse) in float64 with autograd: allowed broadcasts to [B, H, Lq, Lk];
    rows that see no key give out 0 and lse -inf."""
    g = q.shape[1] // k.shape[1]
    K = k.repeat_interleave(g, 1).expand(q.shape[0], -1, -1, -1)
    V = v.repeat_interleave(g, 1).expand(q.shape[0], -1, -1, -1)
    s = (q @ K.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~allowed, -math.inf)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    out = (e / den.clamp_min(1e-300)) @ V
    lse = (torch.log(den) + m).squeeze(-1)
    return out, lse


def leaves(*ts):
    return tuple(t.detach().to(F64).requires_grad_(True) for t in ts)


def run_both(q, k, v, bm, allowed, do, softcap=None, scale=None, **kw):
    """tilegrad's out and gradients, the float64 reference's."""
    D = q.shape[-1]
    sc = scale_of(D) if scale is None else scale
    out = flex_attention(q, k, v, bm, scale=sc, enable_gqa=True, softcap=softcap, **kw)
    out.backward(do)
    qd, kd, vd = leaves(q, k, v)
    ref, _ = reference(qd, kd, vd, allowed, sc, softcap)
    ref.backward(do.to(F64))
    return (out, q.grad, k.grad, v.grad), (ref, qd.grad, kd.grad, vd.grad)


def check_all(got, ref, dtype, tag):
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert g.dtype == dtype, (name, g.dtype)
        close(f"{tag} {name}", g, r, TOL[dtype], key=f"{dtype} {name}")


# ---------------------------------------------------------------------------
# forward + backward against float64 autograd

DOCS = [40, 150, 10, 70, 30]          # 300 rows: one under a block, one spanning blocks

# name: mask_mod, B, H, Hkv, Lq, Lk, BLOCK_SIZE, BlockMask B / H (None = 1)
CASES = {
    "causal-200": (causal, 2, 4, 2, 200, 200, 128, None, None),
    "causal-qL<kL-64": (causal, 1, 2, 2, 150, 230, 64, None, None),
    "document-300-64": (document(DOCS), 1, 4, 1, 300, 300, 64, None, None),
    "document-300-128": (document(DOCS), 2, 2, 2, 300, 300, 128, None, None),
    "prefix-lm-250-64": (prefix_lm(90), 2, 4, 2, 250, 250, 64, None, None),
    "sliding-window-270-32x64": (sliding_window(50), 1, 4, 2, 270, 270, (32, 64), None, None),
    "batch-documents-B": (batch_documents([[100, 60, 60], [30, 150, 40]]), 2, 2, 1, 220, 220,
                          64, 2, None),
    "head-windows-H": (head_windows(20, 40), 1, 4, 2, 190, 190, 64, None, 4),
    "batch-docs-head-windows-BH": (fa.and_masks(batch_documents([[100, 90], [50, 140]]),
                                                head_windows(30, 50)), 2, 2, 2, 190, 190, 64,
                                   2, 2),
    "causal-full-size-BH": (causal, 2, 2, 1, 130, 130, 64, 2, 2),
    "late-start-64": (late_start(70), 1, 2, 2, 200, 200, 64, None, None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_fwd_bwd_vs_float64(case, dtype):
    mm, B, H, Hkv, Lq, Lk, bs, Bm, Hm = CASES[case]
    gen = torch.Generator().manual_seed(hash(case) % 2 ** 31)
    D = 64
    q, k, v = draw((B, H, Lq, D), gen, dtype), draw((B, Hkv, Lk, D), gen, dtype), \
        draw((B, Hkv, Lk, D), gen, dtype)
    do = torch.randn((B, H, Lq, D), generator=gen).to(dtype)
    bm = block_mask(mm, Bm, Hm, Lq, Lk, bs)
    allowed = dense(mm, B, H, Lq, Lk)
    got, ref = run_both(q, k, v, bm, allowed, do)
    check_all(got, ref, dtype, case)
    dead = ~allowed.expand(B, H, Lq, Lk).any(-1)
    if bool(dead.any()):                         # rows that see nothing: exactly 0
        assert bool((got[0].detach()[dead] == 0).all())
        assert bool((got[1][dead] == 0).all())


def test_reference_is_sdpa():
    """The hand-written float64 reference is torch's SDPA where every row sees a key."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 70, 16, generator=gen, dtype=F64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    allowed = dense(sliding_window(9), 2, 4, 70, 70)
    ref, _ = reference(q, k, v, allowed, 0.25)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=allowed, scale=0.25)
    assert float((ref - sdpa).abs().max()) < 1e-12


# ---------------------------------------------------------------------------
# forward against torch's own flex_attention

def torch_flex(q, k, v, bm, scale, **kw):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fa.flex_attention(q, k, v, block_mask=bm, scale=scale, enable_gqa=True, **kw)
    except Exception as e:  # pragma: no cover - depends on the PyTorch build
        pytest.skip(f"torch's eager flex_attention does not run here: {type(e).__name__}: {e}")


FWD_CASES = ["causal-200", "document-300-64", "prefix-lm-250-64", "sliding-window-270-32x64",
             "batch-documents-B", "head-windows-H", "batch-docs-head-windows-BH", "late-start-64",
             "causal-qL<kL-64"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", FWD_CASES)
def test_forward_vs_torch_flex(case, dtype):
    mm, B, H, Hkv, Lq, Lk, bs, Bm, Hm = CASES[case]
    gen = torch.Generator().manual_seed(7)
    D = 64
    q, k, v = (torch.randn(s, generator=gen).to(dtype)
               for s in ((B, H, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
    bm = block_mask(mm, Bm, Hm, Lq, Lk, bs)
    sc = scale_of(D)
    ours = flex_attention(q, k, v, bm, scale=sc, enable_gqa=True)
    theirs = torch_flex(q, k, v, bm, sc)
    ref, _ = reference(*(t.to(F64) for t in (q, k, v)), dense(mm, B, H, Lq, Lk), sc)
    if dtype == torch.float32:
        close(f"{case} vs torch", ours, theirs.to(F64), 2 * TOL[dtype], key="f32 vs torch flex")
    else:
        close(f"{case} vs torch", ours, theirs.to(F64), 2.0 ** -4, key="bf16 vs torch flex")
        err_ours = float((ours.to(F64) - ref).abs().max())
        err_theirs = float((theirs.to(F64) - ref).abs().max())
        assert err_ours <= err_theirs + 2.0 ** -9 * float(ref.abs().max()), (err_ours,
                                                                              err_theirs)
    close(f"{case} vs f64", ours, ref, TOL[dtype], key=f"{dtype} out")


def test_softcap_and_lse_vs_torch_flex():
    """softcap=c is the score_mod c*tanh(s/c); return_lse is flex's natural-log lse."""
    gen = torch.Generator().manual_seed(3)
    B, H, L, D, c = 1, 2, 160, 32, 2.0
    q, k, v = (torch.randn(B, H, L, D, generator=gen) for _ in range(3))
    bm = block_mask(sliding_window(40), None, None, L, L, 64)
    sc = scale_of(D)
    ours, lse = flex_attention(q, k, v, bm, scale=sc, softcap=c, return_lse=True)
    aux = {"return_aux": fa.AuxRequest(lse=True)} if hasattr(fa, "AuxRequest") else \
        {"return_lse": True}
    res = torch_flex(q, k, v, bm, sc, score_mod=lambda s, b, h, qi, ki: c * torch.tanh(s / c),
                     **aux)
    theirs, t_lse = (res[0], res[1].lse) if hasattr(fa, "AuxRequest") else res
    close("softcap out vs torch", ours, theirs.to(F64), 2 * TOL[torch.float32])
    close("lse vs torch", lse, t_lse.to(F64), 2 * TOL[torch.float32])
    assert lse.shape == (B, H, L) and lse.dtype == torch.float32


# ---------------------------------------------------------------------------
# variants

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_softcap_dv_kv_batch_one(dtype):
    """softcap, a value head dim of its own (Dv 32, D 64), key/value of batch 1
    shared by two query batches."""
    gen = torch.Generator().manual_seed(11)
    B, H, Hkv, L, D, Dv = 2, 4, 2, 180, 64, 32
    q = draw((B, H, L, D), gen, dtype)
    k, v = draw((1, Hkv, L, D), gen, dtype), draw((1, Hkv, L, Dv), gen, dtype)
    do = torch.randn((B, H, L, Dv), generator=gen).to(dtype)
    mm = prefix_lm(50)
    bm = block_mask(mm, None, None, L, L, 64)
    got, ref = run_both(q, k, v, bm, dense(mm, B, H, L, L), do, softcap=3.0)
    assert got[0].shape == (B, H, L, Dv)
    check_all(got, ref, dtype, "softcap-dv-kv1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_lse_gradient(dtype):
    """return_lse=True: the lse's own gradient (dlse_i P_ij joins dS) with out's."""
    gen = torch.Generator().manual_seed(5)
    B, H, L, D = 1, 2, 150, 32
    q, k, v = (draw((B, H, L, D), gen, dtype) for _ in range(3))
    mm = document([60, 90])
    bm = block_mask(mm, None, None, L, L, 64)
    w = torch.randn(B, H, L, D, generator=gen).to(dtype)
    wl = torch.randn(B, H, L, generator=gen)
    sc = scale_of(D)
    out, lse = flex_attention(q, k, v, bm, scale=sc, return_lse=True)
    ((out.float() * w.float()).sum() + (lse * wl).sum()).backward()
    qd, kd, vd = leaves(q, k, v)
    ro, rl = reference(qd, kd, vd, dense(mm, B, H, L, L), sc)
    ((ro * w.to(F64)).sum() + (rl * wl.to(F64)).sum()).backward()
    close("lse", lse, rl, 2.0 ** -20 if dtype == torch.float32 else 2.0 ** -12)
    check_all((out, q.grad, k.grad, v.grad), (ro, qd.grad, kd.grad, vd.grad), dtype, "lse-grad")
    # the lse alone
    for t in (q, k, v):
        t.grad = None
    _, lse = flex_attention(q, k, v, bm, scale=sc, return_lse=True)
    (lse * wl).sum().backward()
    for t in (qd, kd, vd):
        t.grad = None
    _, rl = reference(qd, kd, vd, dense(mm, B, H, L, L), sc)
    (rl * wl.to(F64)).sum().backward()
    for name, g, r in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad)):
        close(f"lse-only {name}", g, r, TOL[dtype], key=f"{dtype} lse-only")
    assert float(v.grad.abs().max()) == 0.0          # lse does not depend on v


def test_no_block_mask_is_full_attention():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (draw((2, 2, 70, 16), gen, torch.float32) for _ in range(3))
    do = torch.randn(2, 2, 70, 16, generator=gen)
    got, ref = run_both(q, k, v, None, torch.ones(1, 1, 70, 70, dtype=torch.bool), do)
    check_all(got, ref, torch.float32, "no-mask")


def test_mask_mod_only_under_vmap():
    """A mask_mod that cannot run on broadcast index tensors (torch.stack of
    its scalar arguments), or whose broadcast result has another shape (a
    reduction written for scalars), is evaluated through torch.vmap: the
    same result as its elementwise twin."""
    def pairwise(b, h, q, k):
        qk = torch.stack([q, k])               # needs q, k of one shape: scalars under vmap
        return (qk[0] >= qk[1]) & (qk[0] - qk[1] < 33)

    def reduced(b, h, q, k):
        return torch.stack([q >= k, q - k < 33]).all()     # 0-d on broadcast tensors

    def keys_only(b, h, q, k):
        return k < 50                                      # [P, 1, BK] on broadcast tensors

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 140, 16, generator=gen) for _ in range(3))
    want = flex_attention(q, k, v, block_mask(sliding_window(33), None, None, 140, 140, 32))
    for mm in (pairwise, reduced):
        assert torch.equal(flex_attention(q, k, v, block_mask(mm, None, None, 140, 140, 32)),
                           want), mm.__name__
    ko = flex_attention(q, k, v, block_mask(keys_only, None, None, 140, 140, 32))
    ref, _ = reference(q.to(F64), k.to(F64), v.to(F64), dense(keys_only, 1, 2, 140, 140),
                       scale_of(16))
    close("keys-only", ko, ref, TOL[torch.float32])


def test_hand_built_block_mask_full_tail_and_noop_mask_mod():
    """BlockMask.from_kv_blocks: block-diagonal (each query block sees its own kv
    block and block 0), all full, the short last block (Lq = Lk = 100, blocks
    of 32: 4 rows) too; the noop mask_mod; no partial block, so no mask."""
    L, bs = 100, 32
    n = -(-L // bs)
    full = torch.zeros(1, 1, n, n, dtype=torch.bool)
    for j in range(n):
        full[0, 0, j, j] = full[0, 0, j, 0] = True
    fnum, find = fa._dense_to_ordered(full.to(torch.int8))
    pnum = torch.zeros_like(fnum)
    pind = torch.zeros_like(find)
    bm = fa.BlockMask.from_kv_blocks(pnum, pind, fnum, find, BLOCK_SIZE=bs, seq_lengths=(L, L))
    gen = torch.Generator().manual_seed(9)
    q, k, v = (draw((1, 2, L, 16), gen, torch.float32) for _ in range(3))
    do = torch.randn(1, 2, L, 16, generator=gen)
    blk = torch.arange(L) // bs
    allowed = (blk.view(-1, 1) == blk.view(1, -1)) | (blk.view(1, -1) == 0)
    got, ref = run_both(q, k, v, bm, allowed, do)
    check_all(got, ref, torch.float32, "hand-built")
    cu_q, groups, rows, _ = tf._plan(bm, 1, 1, 2, 2, L, L, torch.float32)
    assert groups[0].mask is None              # full blocks only: no mask at all


def test_no_kv_block_at_all():
    """A BlockMask that lists no kv block: output 0 (lse -inf), gradients 0."""
    n = torch.zeros(1, 1, 2, dtype=torch.int32)
    ind = torch.zeros(1, 1, 2, 2, dtype=torch.int32)
    bm = fa.BlockMask.from_kv_blocks(n, ind, BLOCK_SIZE=64, seq_lengths=(100, 100))
    q, k, v = (torch.randn(1, 2, 100, 16, requires_grad=True) for _ in range(3))
    out, lse = flex_attention(q, k, v, bm, return_lse=True)
    assert bool((out == 0).all()) and bool(torch.isneginf(lse).all())
    out.sum().backward()
    assert all(bool((t.grad == 0).all()) for t in (q, k, v))


def test_work_is_the_blocks_only():
    """The documents hold the BlockMask's blocks' pairs, not Lq x Lk; the mask
    exists only where partial blocks are."""
    L, bs = 1024, 128
    bm = block_mask(document([512, 512]), None, None, L, L, bs)
    cu_q, groups, rows, _ = tf._plan(bm, 1, 1, 4, 4, L, L, torch.bfloat16)
    g = groups[0]
    len_q = (cu_q[1:] - cu_q[:-1]).long()
    len_k = (g.cu_k[1:] - g.cu_k[:-1]).long()
    pairs = int((len_q * len_k).sum())
    blocks = int(bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum())
    assert pairs == blocks * bs * bs == 20 * bs * bs      # of 64 blocks
    assert g.mask.numel() == pairs < L * L // 3
    assert rows.numel() == int(len_k.sum())     # the gathered token-major rows (all kv heads)


def test_plan_is_kept_with_its_block_mask():
    """A model's layers share a BlockMask: its plan is made once per shape and
    dtype, and made again when the mask's block tensors change in place."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (draw((1, 2, 200, 16), gen, torch.float32) for _ in range(3))
    bm = block_mask(causal, None, None, 200, 200, 64)
    calls = []
    real = tf._plan

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    tf._plan, before = counting, None
    try:
        before = flex_attention(q, k, v, bm)
        assert torch.equal(flex_attention(q, k, v, bm), before) and len(calls) == 1
        flex_attention(q, k, v.to(torch.bfloat16).float(), bm)   # same shape and dtype
        assert len(calls) == 1
        bm.kv_num_blocks.add_(0)                                  # changed in place
        assert torch.equal(flex_attention(q, k, v, bm), before) and len(calls) == 2
    finally:
        tf._plan = real


def test_deterministic_and_threads():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (draw((1, 4, 260, 32), gen, torch.bfloat16) for _ in range(3))
    bm = block_mask(document(DOCS[:3] + [60]), None, None, 260, 260, 64)
    res = []
    for threads in (1, 2, 1):
        for t in (q, k, v):
            t.grad = None
        out = flex_attention(q, k, v, bm, threads=threads, deterministic=True)
        out.float().square().sum().backward()
        res.append([out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()])
    for r in res[1:]:
        assert all(torch.equal(a, b) for a, b in zip(res[0], r))


def test_float16_and_autocast():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 96, 16, generator=gen) for _ in range(3))
    bm = block_mask(causal, None, None, 96, 96, 32)
    o16 = flex_attention(q.half(), k.half(), v.half(), bm)
    assert o16.dtype == torch.float16
    o32 = flex_attention(q.half().float(), k.half().float(), v.half().float(), bm)
    assert torch.equal(o16, o32.half())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ob = flex_attention(q, k, v, bm)
    assert ob.dtype == torch.bfloat16
    assert torch.equal(ob, flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), bm))


# ---------------------------------------------------------------------------
# refusals

def test_refusals():
    q = torch.randn(1, 4, 64, 16)
    k = torch.randn(1, 2, 64, 16)
    bm = block_mask(causal, None, None, 64, 64, 32)
    with pytest.raises(NotImplementedError, match="score_mod"):
        flex_attention(q, q, q, bm, score_mod=lambda s, b, h, i, j: s)
    with pytest.raises(TypeError, match="score_mod"):
        flex_attention(q, q, q, lambda s, b, h, i, j: s)          # torch's 4th positional
    with pytest.raises(ValueError, match="enable_gqa"):
        flex_attention(q, k, k, bm)
    with pytest.raises(ValueError, match="created for"):
        flex_attention(q[:, :, :50], q, q, bm)
    with pytest.raises(ValueError, match="batch and head dims"):
        flex_attention(q, q, q, block_mask(causal, 3, None, 64, 64, 32))
    with pytest.raises(NotImplementedError, match="softcap = 1.0"):
        flex_attention(q, q, q, bm, softcap=1.0)
    with pytest.raises(TypeError, match="bfloat16 or float32"):
        flex_attention(q.double(), q.double(), q.double(), bm)
    # a kv block listed as partial and as full
    dup = fa.BlockMask.from_kv_blocks(bm.full_kv_num_blocks.clone(),
                                      bm.full_kv_indices.clone(), bm.full_kv_num_blocks,
                                      bm.full_kv_indices, BLOCK_SIZE=32, seq_lengths=(64, 64))
    with pytest.raises(ValueError, match="more than once"):
        flex_attention(q, q, q, dup)


def test_same_object_as_tilegrad_torch():
    import tilegrad.torch as tt
    if hasattr(tt, "flex_attention"):
        assert tt.flex_attention is flex_attention
