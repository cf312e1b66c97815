"""Block-sparse masks: ``flex_attention`` with a torch ``BlockMask`` on
tilegrad's packed-sequence kernels, forward and backward, on the CPU.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) describes a
mask by blocks: for each (batch, head, query block) the kv blocks that are
*full* (every pair visible: ``full_kv_indices[:full_kv_num_blocks]``) and
those that are *partial* (``kv_indices[:kv_num_blocks]``, where the
BlockMask's ``mask_mod`` decides pair by pair); a kv block in neither list is
never visited. :func:`flex_attention` runs that on ``tg_attn_varlen_fwd`` /
``tg_attn_varlen_bwd_step`` (include/tilegrad.h) without a dense mask:

* each (batch, query block) -- and each head too when the BlockMask's head
  dim is > 1 -- becomes one varlen *document*: its queries are the query
  block's rows (consecutive in the token-major q, ``[B * Lq, H, D]``), its
  keys the rows of its kv blocks, full and partial, in increasing block
  order, gathered from k and v with ``index_select`` (whose backward, an
  ``index_add``, scatters the gathered dK, dV back);
* the documents' additive mask (``tg_attn_varlen.mask``, the inputs' dtype,
  document d's ``[len_q, len_k]`` rows after those of earlier documents) is
  0 in full blocks' columns and 0 / -inf in partial blocks' columns from the
  ``mask_mod``, evaluated once per (document, partial block) on that block's
  ``(q_idx, kv_idx)`` -- all partial blocks in one broadcast call (or, when
  the function does not broadcast, through ``torch.vmap`` as torch's
  ``create_mask`` does). With no partial block no mask is passed at all.

So the work is the BlockMask's blocks only: ``sum`` over documents of
``len_q * len_k`` score pairs. A query block with no kv block is a document
without keys (its rows' output is 0, as flex_attention gives for a fully
masked row); a row of a partial block that the ``mask_mod`` masks entirely
likewise. Public: :func:`flex_attention` (the lead re-exports it from
:mod:`tilegrad.torch`).

Paths: a plain :class:`torch.autograd.Function` around the C calls (eager
only: the BlockMask's Python ``mask_mod`` and the document plan are built
outside any graph; no ``torch.compile`` / ``torch.export`` support).
Needs a PyTorch that has ``BlockMask`` (>= 2.5) for the masks; the module
itself imports on any PyTorch.
"""
import math
import weakref
from typing import List, Optional, Tuple

import torch

from . import capi as _capi
from ._torch_common import (_attn_options, _attn_precision_arg, _context, _need_v_head_dim,
                            _ptr, _threads_arg)
from ._torch_paths import _autocast_cast, _check_cpu

__all__ = ["flex_attention"]

Tensor = torch.Tensor

_I32_MAX = 2 ** 31 - 1
_OP = "flex_attention"
_DTYPES = {torch.bfloat16: _capi.TG_DTYPE_BF16, torch.float32: _capi.TG_DTYPE_F32}


# ---------------------------------------------------------------------------
# the BlockMask's fields

def _block_sizes(block_mask) -> Tuple[int, int]:
    bs = block_mask.BLOCK_SIZE
    if isinstance(bs, int):
        return bs, bs
    bq, bk = (int(x) for x in bs)
    return bq, bk


def _need_block_mask(block_mask, B: int, H: int, Lq: int, Lk: int):
    """The BlockMask's tensors, checked against the inputs: -> (kv_num_blocks,
    kv_indices, full_kv_num_blocks or None, full_kv_indices or None), int64,
    [Bm, Hm, NQB(, W)] with Bm in (1, B), Hm in (1, H)."""
    need = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
            "BLOCK_SIZE", "seq_lengths", "mask_mod")
    if not all(hasattr(block_mask, a) for a in need):
        if callable(block_mask):
            raise TypeError(
                f"{_OP}: block_mask must be a torch BlockMask (create_block_mask(mask_mod, B, "
                f"H, Lq, Lk, device='cpu')), got the function {block_mask!r}: a score_mod "
                "goes as score_mod= (refused: tilegrad runs no score function), a mask_mod "
                "through create_block_mask")
        raise TypeError(f"{_OP}: block_mask must be None or a torch BlockMask, got "
                        f"{type(block_mask).__name__}")
    kvn, kvi = block_mask.kv_num_blocks, block_mask.kv_indices
    fkn, fki = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    for name, t in (("kv_num_blocks", kvn), ("kv_indices", kvi),
                    ("full_kv_num_blocks", fkn), ("full_kv_indices", fki)):
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"{_OP}: the block_mask's {name} is on {t.device}; tilegrad runs "
                             "on the CPU (create_block_mask(..., device='cpu') or "
                             "block_mask.to('cpu'))")
    if kvi.dim() != 4 or kvn.dim() != 3 or tuple(kvn.shape) != tuple(kvi.shape[:3]) or (
            fki is not None and (fki.dim() != 4 or tuple(fkn.shape) != tuple(fki.shape[:3]) or
                                 tuple(fki.shape[:3]) != tuple(kvi.shape[:3]))):
        raise ValueError(f"{_OP}: a BlockMask with kv_num_blocks [B, H, q blocks] and "
                         f"kv_indices [B, H, q blocks, kv blocks] expected; got "
                         f"{tuple(kvn.shape)}, {tuple(kvi.shape)}")
    Bm, Hm = kvi.shape[0], kvi.shape[1]
    if Bm not in (1, B) or Hm not in (1, H):
        raise ValueError(f"{_OP}: the block_mask's batch and head dims ({Bm}, {Hm}) must be 1 "
                         f"or the query's ({B}, {H})")
    sl = tuple(int(x) for x in block_mask.seq_lengths)
    if sl != (Lq, Lk):
        raise ValueError(f"{_OP}: block_mask was created for (q_len, kv_len) = {sl} but got "
                         f"q_len = {Lq}, kv_len = {Lk}: create a new block mask for these "
                         "lengths (or block_mask._adjust(q_len, kv_len), which crops it to the "
                         "upper left corner)")
    BQ, BK = _block_sizes(block_mask)
    if BQ < 1 or BK < 1:
        raise ValueError(f"{_OP}: BLOCK_SIZE must be positive, got {block_mask.BLOCK_SIZE}")
    nqb = -(-Lq // BQ)
    if kvi.shape[2] < nqb:
        raise ValueError(f"{_OP}: the block_mask has {kvi.shape[2]} query blocks of {BQ} rows; "
                         f"q_len = {Lq} needs {nqb}")
    to64 = (lambda t: None if t is None else t.to(torch.int64))
    return to64(kvn), to64(kvi), to64(fkn), to64(fki)


# ---------------------------------------------------------------------------
# the mask_mod on the partial blocks

def _no_getitem_transform():
    """torch's TransformGetItemToIndex (``tensor[idx]`` with a tensor index
    as ``torch.ops.aten.index``, so a mask_mod that looks values up in a
    tensor runs under vmap), as create_mask uses it; a no-op context where
    this PyTorch lacks it."""
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
        return TransformGetItemToIndex()
    except Exception:  # pragma: no cover - depends on the PyTorch version
        import contextlib
        return contextlib.nullcontext()


def _eval_mask_mod(mask_mod, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """mask_mod on P blocks at once: b, h [P], q_idx [P, BQ], kv_idx [P, BK]
    (int64) -> bool [P, BQ, BK] (True: the pair is visible). First one call
    on broadcast index tensors ([P, 1, 1], [P, BQ, 1], [P, 1, BK]: what any
    elementwise mask_mod of q_idx and kv_idx computes on); if that raises
    or gives another shape, torch.vmap over keys, queries and blocks
    (create_mask's way: the mask_mod sees 0-d tensors)."""
    P, BQ, BK = q_idx.shape[0], q_idx.shape[1], kv_idx.shape[1]
    want = (P, BQ, BK)
    try:
        out = mask_mod(b.view(P, 1, 1), h.view(P, 1, 1), q_idx.view(P, BQ, 1),
                       kv_idx.view(P, 1, BK))
        # only a result of the full shape: one of another shape (a pair's value
        # that ignores q_idx or kv_idx, or a reduction) is left to vmap
        if isinstance(out, torch.Tensor) and tuple(out.shape) == want:
            return out.to(torch.bool)
    except Exception:
        pass
    fn = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
    fn = torch.vmap(fn, in_dims=(None, None, 0, None))
    fn = torch.vmap(fn, in_dims=(0, 0, 0, 0))
    with _no_getitem_transform():
        out = fn(b, h, q_idx, kv_idx)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        raise TypeError(f"{_OP}: the block_mask's mask_mod must return one bool per (b, h, "
                        f"q_idx, kv_idx); got {type(out).__name__} "
                        f"{tuple(getattr(out, 'shape', ()))} for {want}")
    return out.to(torch.bool)


def _is_noop(mask_mod) -> bool:
    """torch's noop_mask (BlockMask.from_kv_blocks without a mask_mod):
    every pair of a partial block visible."""
    return mask_mod is None or (getattr(mask_mod, "__name__", "") == "noop_mask" and
                                getattr(mask_mod, "__module__", "").startswith("torch."))


# ---------------------------------------------------------------------------
# the documents

class _Group:
    """One C call: query heads [h0, h0 + nh) over the gathered key rows
    [k0, k0 + nk) (hkv heads each), the documents' key offsets and mask."""
    __slots__ = ("h0", "nh", "hkv", "k0", "nk", "cu_k", "mask")

    def __init__(self, h0, nh, hkv, k0, nk, cu_k, mask):
        self.h0, self.nh, self.hkv, self.k0, self.nk = h0, nh, hkv, k0, nk
        self.cu_k, self.mask = cu_k, mask


class _Plan:
    """What the autograd Function needs besides the tensors it saves."""
    __slots__ = ("groups", "cu_q", "n_docs", "TQ", "H", "D", "Dv", "dt", "scale", "softcap",
                 "threads", "deterministic", "ap")


def _plan_head(mask_mod, kvn, kvi, fkn, fki, hm: int, h_eval: int, B: int, Bk: int,
               Hkv: int, hk: Optional[int], Lq: int, Lk: int, BQ: int, BK: int,
               dtype: torch.dtype):
    """The documents of BlockMask head hm (its mask_mod evaluated at head
    h_eval): one per (batch b, query block j), d = b * nqb + j. -> (key
    offsets cu_k int32 [n_docs + 1], the rows to gather (int64 [NG]: with hk
    None, all kv heads, rows of the token-major k [Bk * Lk, Hkv * D]; for kv
    head hk, rows of k.reshape(Bk * Hkv * Lk, D)), the documents' mask or
    None)."""
    nqb, nkb = -(-Lq // BQ), -(-Lk // BK)
    nd = B * nqb
    bsel = torch.arange(B) if kvi.shape[0] == B else torch.zeros(B, dtype=torch.int64)
    status = torch.zeros(nd * nkb, dtype=torch.int8)       # 0 none, 1 partial, 2 full
    count = torch.zeros(nd * nkb, dtype=torch.int32)
    for kind, num, ind, name in ((1, kvn, kvi, "kv"), (2, fkn, fki, "full_kv")):
        if num is None:
            continue
        n = num[bsel, hm, :nqb]                             # [B, nqb]
        ind = ind[bsel, hm, :nqb, :]                        # [B, nqb, W]
        W = ind.shape[-1]
        if bool(((n < 0) | (n > W)).any()):
            raise ValueError(f"{_OP}: block_mask {name}_num_blocks holds counts outside "
                             f"[0, {W}]")
        listed = torch.arange(W).view(1, 1, W) < n.unsqueeze(-1)
        cols = ind[listed]
        if cols.numel() and bool(((cols < 0) | (cols >= nkb)).any()):
            raise ValueError(f"{_OP}: block_mask {name}_indices lists a kv block outside "
                             f"[0, {nkb}) (kv_len = {Lk}, {BK} keys a block)")
        docs = torch.arange(nd).view(B, nqb, 1).expand(B, nqb, W)[listed]
        pos = docs * nkb + cols
        count.index_add_(0, pos, torch.ones_like(pos, dtype=torch.int32))
        status[pos] = kind
    if count.numel() and int(count.max()) > 1:
        at = int((count > 1).nonzero()[0, 0])
        raise ValueError(f"{_OP}: block_mask lists kv block {at % nkb} more than once for query "
                         f"block {at // nkb % nqb} (batch {at // nkb // nqb}; kv_indices and "
                         "full_kv_indices must be disjoint)")
    sel = status.view(nd, nkb).nonzero()                    # (doc, block), in block order
    d_s, c_s = sel[:, 0], sel[:, 1]
    blen = torch.clamp(Lk - c_s * BK, max=BK)               # a last block may be short
    len_k = torch.zeros(nd, dtype=torch.int64).index_add_(0, d_s, blen)
    cu_k64 = torch.cat([torch.zeros(1, dtype=torch.int64), len_k.cumsum(0)])
    NG = int(cu_k64[-1])
    if NG > _I32_MAX:
        raise ValueError(f"{_OP}: {NG} gathered key rows do not fit the offsets' int32")
    gpos = blen.cumsum(0) - blen                            # each block's first gathered row
    b_s = d_s // nqb
    kvb = b_s if Bk == B else torch.zeros_like(b_s)
    # token-major rows (batch, key) -> b * Lk + key; one kv head's rows of
    # k.reshape(Bk * Hkv * Lk, D): (batch, kv head, key) -> (b * Hkv + hk) * Lk + key
    key = torch.repeat_interleave(c_s * BK - gpos, blen) + torch.arange(NG)
    if hk is None:
        rows = torch.repeat_interleave(kvb * Lk, blen) + key
    else:
        rows = torch.repeat_interleave((kvb * Hkv + hk) * Lk, blen) + key
    mask = None
    part = status[d_s * nkb + c_s] == 1
    if bool(part.any()) and not _is_noop(mask_mod):
        mask = _partial_mask(mask_mod, d_s[part], c_s[part], blen[part],
                             (gpos - cu_k64[d_s])[part], len_k, nqb, h_eval, Lq, Lk, BQ, BK,
                             dtype)
    return cu_k64.to(torch.int32), rows, mask


def _partial_mask(mask_mod, d_p: Tensor, c_p: Tensor, blen_p: Tensor, col_p: Tensor,
                  len_k: Tensor, nqb: int, h_eval: int, Lq: int, Lk: int, BQ: int, BK: int,
                  dtype: torch.dtype) -> Optional[Tensor]:
    """The documents' additive mask (flat, document d's [len_q, len_k] rows
    after the earlier ones'): 0 everywhere but in the partial blocks' pairs
    that the mask_mod masks (-inf). d_p, c_p: each partial block's document
    and kv block; blen_p its keys, col_p its first column in its document.
    None when the mask_mod masks nothing."""
    nd = len_k.numel()
    j_all = torch.arange(nd) % nqb
    len_q = torch.clamp(Lq - j_all * BQ, max=BQ)
    moff = (len_q * len_k).cumsum(0) - len_q * len_k
    total = int((len_q * len_k).sum())
    P = d_p.numel()
    j_p, b_p = d_p % nqb, d_p // nqb
    r, cc = torch.arange(BQ), torch.arange(BK)
    q_idx = j_p.view(P, 1) * BQ + r.view(1, BQ)
    kv_idx = c_p.view(P, 1) * BK + cc.view(1, BK)
    # rows / keys past the lengths (a short last block) are evaluated at the
    # last index and thrown away: a mask_mod may look its indices up in a
    # tensor of Lq / Lk entries
    allowed = _eval_mask_mod(mask_mod, b_p, torch.full((P,), h_eval, dtype=torch.int64),
                             q_idx.clamp(max=Lq - 1), kv_idx.clamp(max=Lk - 1))
    lq_p = len_q[d_p]
    inside = (r.view(1, BQ, 1) < lq_p.view(P, 1, 1)) & (cc.view(1, 1, BK) < blen_p.view(P, 1, 1))
    if bool((allowed | ~inside).all()):
        return None
    # each partial block's pairs written at their places in their document's
    # rows: 0 (visible) or -inf, the pairs past a short block's end left out
    offs = (moff[d_p] + col_p).view(P, 1, 1) + r.view(1, BQ, 1) * len_k[d_p].view(P, 1, 1) + \
        cc.view(1, 1, BK)
    vals = torch.where(allowed, torch.zeros((), dtype=dtype),
                       torch.full((), -math.inf, dtype=dtype))
    mask = torch.zeros(total, dtype=dtype)
    if bool(inside.all()):
        mask[offs.view(-1)] = vals.reshape(-1)
    else:
        mask[offs[inside]] = vals[inside]
    return mask


def _plan(block_mask, B: int, Bk: int, H: int, Hkv: int, Lq: int, Lk: int,
          dtype: torch.dtype):
    """-> (cu_q, the groups (their gathered rows' ranges), the gather index,
    the gathered rows' kv heads: Hkv, rows of the token-major k [Bk * Lk,
    Hkv * D], when the BlockMask has one head; 1, rows of k.reshape(Bk * Hkv
    * Lk, D), when it has a head dim, one group per head)."""
    if block_mask is None:                  # every pair: one document per batch
        BQ, BK = Lq, Lk
        kvn = torch.zeros(1, 1, 1, dtype=torch.int64)
        kvi = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
        fkn, fki, mask_mod, Hm = torch.ones_like(kvn), kvi, None, 1
    else:
        kvn, kvi, fkn, fki = _need_block_mask(block_mask, B, H, Lq, Lk)
        BQ, BK = _block_sizes(block_mask)
        mask_mod, Hm = block_mask.mask_mod, kvi.shape[1]
    nqb = -(-Lq // BQ)
    len_q = torch.clamp(Lq - (torch.arange(B * nqb) % nqb) * BQ, max=BQ)
    cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), len_q.cumsum(0)]).to(torch.int32)
    groups: List[_Group] = []
    rows: List[Tensor] = []
    k0 = 0
    if Hm == 1:                             # one mask for every head: one call, GQA in it
        cu_k, r, mask = _plan_head(mask_mod, kvn, kvi, fkn, fki, 0, 0, B, Bk, Hkv, None, Lq,
                                   Lk, BQ, BK, dtype)
        groups.append(_Group(0, H, Hkv, 0, r.shape[0], cu_k, mask))
        return cu_q, groups, r, Hkv
    g = H // Hkv
    for h in range(H):                      # a mask per head: a call per head, H = 1
        cu_k, r, mask = _plan_head(mask_mod, kvn, kvi, fkn, fki, h, h, B, Bk, Hkv, h // g, Lq,
                                   Lk, BQ, BK, dtype)
        groups.append(_Group(h, 1, 1, k0, r.shape[0], cu_k, mask))
        rows.append(r)
        k0 += r.shape[0]
    return cu_q, groups, torch.cat(rows), 1


# A model's layers share one BlockMask: each plan is kept with its BlockMask
# (dropped with it), per shape and dtype, and made again when the mask's
# block tensors were changed in place (their version counters).
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _plan_cached(block_mask, B: int, Bk: int, H: int, Hkv: int, Lq: int, Lk: int,
                 dtype: torch.dtype):
    if block_mask is None or not hasattr(block_mask, "kv_num_blocks"):
        return _plan(block_mask, B, Bk, H, Hkv, Lq, Lk, dtype)   # (which refuses a non-mask)
    parts = (block_mask.kv_num_blocks, block_mask.kv_indices,
             block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    key = (B, Bk, H, Hkv, Lq, Lk, dtype, block_mask.mask_mod,
           tuple(None if t is None else (id(t), t._version) for t in parts))
    try:
        mine = _PLANS.setdefault(block_mask, {})
    except TypeError:                       # not weak-referenceable: no cache
        return _plan(block_mask, B, Bk, H, Hkv, Lq, Lk, dtype)
    if key not in mine:
        mine.clear()                        # one plan per mask: the last shape's
        mine[key] = _plan(block_mask, B, Bk, H, Hkv, Lq, Lk, dtype)
    return mine[key]


# ---------------------------------------------------------------------------
# the C calls

def _params(plan: _Plan, g: _Group, q: Tensor, k: Tensor, v: Tensor) -> "_capi.AttnParams":
    """B = 1 params of one group: q [TQ, nh, D] (a head slice of the
    token-major q), k [nk, hkv, D], v [nk, hkv, Dv] through their strides;
    O (and dO) [nh, TQ, Dv] head-major."""
    st = (lambda t: (0, t.stride(1), t.stride(0)))
    return _capi.attn_params(1, g.nh, g.hkv, plan.TQ, g.nk, plan.D, plan.scale, plan.softcap,
                             Q_strides=st(q), K_strides=st(k), V_strides=st(v),
                             O_strides=(0, plan.TQ * plan.Dv, plan.Dv))


def _docs(plan: _Plan, g: _Group) -> "_capi.AttnVarlen":
    return _capi.AttnVarlen(plan.cu_q.data_ptr(), g.cu_k.data_ptr(), plan.n_docs, 0,
                            None if g.mask is None else g.mask.data_ptr())


def _slices(plan: _Plan, g: _Group, qt: Tensor, kg: Tensor, vg: Tensor):
    return (qt[:, g.h0:g.h0 + g.nh], kg[g.k0:g.k0 + g.nk], vg[g.k0:g.k0 + g.nk])


def _fwd(plan: _Plan, qt: Tensor, kg: Tensor, vg: Tensor) -> Tuple[Tensor, Tensor]:
    """o [H, TQ, Dv] (head-major, q's dtype), lse [H, TQ] float32."""
    o = torch.empty((plan.H, plan.TQ, plan.Dv), dtype=qt.dtype)
    lse = torch.empty((plan.H, plan.TQ), dtype=torch.float32)
    ctx = _context(plan.threads, plan.deterministic, plan.ap)
    opt = _attn_options(0.0, None, 0, plan.Dv if plan.Dv != plan.D else 0)
    for g in plan.groups:
        og, lg = o[g.h0:g.h0 + g.nh], lse[g.h0:g.h0 + g.nh]
        if g.nk == 0:                       # no document of these heads has a key
            og.zero_()
            lg.fill_(-math.inf)
            continue
        q, k, v = _slices(plan, g, qt, kg, vg)
        ctx.call("tg_attn_varlen_fwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(og), _ptr(lg),
                 _params(plan, g, q, k, v), _docs(plan, g), 0, opt)
    return o, lse


def _bwd(plan: _Plan, qt: Tensor, kg: Tensor, vg: Tensor, o: Tensor, lse: Tensor,
         do: Optional[Tensor], dlse: Optional[Tensor]):
    """dq [TQ, H, D], dk, dv like kg, vg, in q's dtype. Without an lse
    gradient: tg_attn_varlen_bwd_step (rowsum(dO o O) and the backward in
    one call, the gradients rounded once). With one: the lse's gradient
    enters as D' = rowsum(dO o O) - dlse (dS = P o (dP - D')) through
    tg_attn_varlen_bwd, f32 gradients rounded to q's dtype after."""
    dtype = qt.dtype
    if do is None:
        do = torch.zeros_like(o)
    do = do.contiguous()
    with_lse = dlse is not None and bool((dlse != 0).any())
    dq = torch.empty(qt.shape, dtype=dtype)
    dk = torch.empty(kg.shape, dtype=dtype)
    dv = torch.empty(vg.shape, dtype=dtype)
    ctx = _context(plan.threads, plan.deterministic, plan.ap)
    v_hd = plan.Dv if plan.Dv != plan.D else 0
    for g in plan.groups:
        dqg = dq[:, g.h0:g.h0 + g.nh]
        if g.nk == 0:
            dqg.zero_()
            continue
        q, k, v = _slices(plan, g, qt, kg, vg)
        og, lg, dog = o[g.h0:g.h0 + g.nh], lse[g.h0:g.h0 + g.nh], do[g.h0:g.h0 + g.nh]
        dkg, dvg = dk[g.k0:g.k0 + g.nk], dv[g.k0:g.k0 + g.nk]
        out_q = dqg if g.nh == plan.H else torch.empty((plan.TQ, g.nh, plan.D), dtype=dtype)
        p, docs = _params(plan, g, q, k, v), _docs(plan, g)
        if not with_lse:
            ctx.call("tg_attn_varlen_bwd_step", plan.dt, plan.dt, _ptr(q), _ptr(k), _ptr(v),
                     _ptr(og), _ptr(lg), _ptr(dog), _ptr(out_q), _ptr(dkg), _ptr(dvg), p, docs,
                     0, _attn_options(0.0, None, 0, v_hd))
        else:
            delta = ((og.float() * dog.float()).sum(-1) - dlse[g.h0:g.h0 + g.nh]).contiguous()
            f_q = torch.empty(out_q.shape, dtype=torch.float32)
            f_k = torch.empty(dkg.shape, dtype=torch.float32)
            f_v = torch.empty(dvg.shape, dtype=torch.float32)
            ctx.call("tg_attn_varlen_bwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(lg),
                     _ptr(dog), _ptr(delta), _ptr(f_q), _ptr(f_k), _ptr(f_v), p, docs, 0,
                     _attn_options(0.0, None, 0, v_hd, flags=_capi.TG_ATTN_OPT_DKV_WRITE))
            out_q.copy_(f_q)
            dkg.copy_(f_k)
            dvg.copy_(f_v)
        if out_q is not dqg:
            dqg.copy_(out_q)
    return dq, dk, dv


class _FlexFunction(torch.autograd.Function):
    """The C calls behind autograd: (qt [TQ, H, D], kg [NG, hkv, D], vg
    [NG, hkv, Dv], plan) -> (o [H, TQ, Dv], lse [H, TQ])."""

    @staticmethod
    def forward(ctx, qt, kg, vg, plan):
        o, lse = _fwd(plan, qt, kg, vg)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(qt, kg, vg, o, lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qt, kg, vg, o, lse = ctx.saved_tensors
        if do is None and dlse is None:
            return None, None, None, None
        dq, dk, dv = _bwd(ctx.plan, qt, kg, vg, o, lse, do, dlse)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                None)


# ---------------------------------------------------------------------------
# the function

def _softcap_arg(softcap) -> float:
    """softcap= (None: none; c > 0: scores c*tanh(s/c)) -> the params'
    softcapping (1.0 = off)."""
    if softcap is None:
        return 1.0
    c = float(softcap)
    if not c > 0.0 or math.isinf(c):
        raise ValueError(f"{_OP}: softcap must be None (none) or a finite c > 0, got {softcap}")
    if c == 1.0:
        raise NotImplementedError(f"{_OP}: softcap = 1.0: the kernels read a cap of 1 as none "
                                  "(tg_attn_params.softcapping = 1.0 means off)")
    return c


def flex_attention(query: Tensor, key: Tensor, value: Tensor, block_mask=None,
                   scale: Optional[float] = None, enable_gqa: bool = False, *,
                   score_mod=None, softcap: Optional[float] = None, return_lse: bool = False,
                   attn_precision: str = "exact", threads: Optional[int] = None,
                   deterministic: bool = False):
    """``torch.nn.attention.flex_attention.flex_attention`` with a
    ``BlockMask`` on the CPU, forward and backward, visiting the mask's
    blocks only.

    query ``[B, H, Lq, D]``, key ``[B, H_kv, Lk, D]`` (or batch 1, shared by
    every query batch), value ``[B, H_kv, Lk, Dv]``; H != H_kv needs
    ``enable_gqa=True`` (H a multiple of H_kv), as torch's. D a multiple of
    8 up to 512, Dv = D or its own multiple of 8 up to 512. bfloat16 or
    float32 (float16 computes in float32; under CPU autocast the inputs are
    first cast to its dtype); gradients in the inputs' dtype. Returns out
    ``[B, H, Lq, Dv]`` (with ``return_lse=True`` also the natural-log
    logsumexp ``[B, H, Lq]`` float32, -inf for a row that sees no key,
    differentiable like torch's).

    block_mask: a ``BlockMask`` from ``create_block_mask(mask_mod, B, H,
    Lq, Lk, device="cpu", BLOCK_SIZE=...)`` (or ``BlockMask.from_kv_blocks``)
    whose ``seq_lengths`` are ``(Lq, Lk)`` (torch's rule); batch and head dims
    of 1 broadcast, any ``BLOCK_SIZE`` (query and kv block sizes of their
    own), a last block shorter than the block size. As torch's kernels read
    it: kv blocks listed in neither ``kv_indices`` nor ``full_kv_indices``
    are not visited, full blocks are visible whole, partial blocks pair by
    pair where ``mask_mod(b, h, q_idx, kv_idx)`` is True. With a head dim of
    1 the mask is one for every head: the ``mask_mod`` is evaluated at
    ``h = 0`` (as ``create_block_mask(..., H=None)`` built the blocks);
    ``b`` is the batch index. None: every pair visible.

    scale: default ``1/sqrt(D)``. score_mod: refused by name
    (NotImplementedError: tilegrad runs no arbitrary score function);
    ``softcap=c`` is the tanh softcap ``c*tanh(s/c)`` a score_mod would
    write. attn_precision (``"exact"``, ``"split"``, ``"bf16"``: bf16
    compute's products with P and dS), threads (None:
    ``torch.get_num_threads()``), deterministic (bitwise-repeatable results
    at any thread count) as :func:`tilegrad.torch.attention`."""
    if score_mod is not None:
        raise NotImplementedError(
            f"{_OP}: score_mod is not supported: tilegrad runs no arbitrary score function "
            "(a tanh softcap is softcap=c; masks go in block_mask)")
    _check_cpu(query, key, value)
    query, key, value = _autocast_cast(query, key, value)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"{_OP} takes 4-D tensors: query [B, H, Lq, D], key [B, H_kv, Lk, D], "
                         f"value [B, H_kv, Lk, Dv]; got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"{_OP}: query, key and value must have one dtype, got {query.dtype}, "
                        f"{key.dtype}, {value.dtype}")
    dtype = query.dtype
    if dtype in _DTYPES:
        cdtype = dtype
    elif dtype == torch.float16:
        cdtype = torch.float32              # exact widening, as tilegrad.torch.attention
    else:
        raise TypeError(f"{_OP} computes in bfloat16 or float32 (float16 widened); got {dtype}")
    B, H, Lq, D = query.shape
    Bk, Hkv, Lk, Dk = key.shape
    Dv = value.shape[3]
    if tuple(value.shape[:3]) != (Bk, Hkv, Lk):
        raise ValueError(f"{_OP}: key {tuple(key.shape)} and value {tuple(value.shape)} must "
                         "agree in batch, heads and length")
    if Dk != D:
        raise ValueError(f"{_OP}: query and key head dims differ ({D} and {Dk})")
    if Bk not in (B, 1):
        raise ValueError(f"{_OP}: key and value batch {Bk} must be the query's {B} or 1")
    if Hkv != H and not enable_gqa:
        raise ValueError(f"{_OP}: expect query and key/value to have the same number of heads "
                         f"but got Hq={H} and Hkv={Hkv}; try setting enable_gqa=True for GQA")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{_OP}: the number of query heads {H} must be a multiple of kv "
                         f"heads {Hkv} (GQA)")
    _need_v_head_dim(_OP, D, Dv)
    cap = _softcap_arg(softcap)
    ap = _attn_precision_arg(attn_precision)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D > 0 else 1.0
    for n, x in (("B * Lq", B * Lq), ("Lk", Lk), ("H", H), ("D", D), ("Dv", Dv)):
        if x > _I32_MAX:
            raise ValueError(f"{_OP}: {n} = {x} does not fit the kernels' int32")
    if dtype != cdtype:
        query, key, value = (t.to(cdtype) for t in (query, key, value))
    TQ = B * Lq
    if TQ == 0 or H == 0 or Lk == 0 or Dv == 0:
        # nothing to attend to: zeros (lse -inf), gradients 0 through autograd
        none = sum(t.reshape(-1)[:0].sum() for t in (query, key, value))   # 0, no NaN
        out = query.new_zeros((B, H, Lq, Dv)) + none
        out = out if dtype == cdtype else out.to(dtype)
        if return_lse:
            return out, torch.full((B, H, Lq), -math.inf)
        return out
    with torch.no_grad():
        cu_q, groups, rows, hkv_s = _plan_cached(block_mask, B, Bk, H, Hkv, Lq, Lk, cdtype)
    plan = _Plan()
    plan.groups, plan.cu_q, plan.n_docs, plan.TQ = groups, cu_q, cu_q.numel() - 1, TQ
    plan.H, plan.D, plan.Dv, plan.dt = H, D, Dv, _DTYPES[cdtype]
    plan.scale, plan.softcap = float(scale), cap
    plan.threads, plan.deterministic, plan.ap = _threads_arg(threads), bool(deterministic), ap
    # queries token-major (a view for B = 1); keys and values gathered by
    # index_select (its backward index_adds dK, dV back): rows of the
    # token-major [Bk * Lk, H_kv * D] (a copy for H_kv > 1) with one mask for
    # every head, else one head's rows of [Bk * H_kv * Lk, D] (a view)
    qt = query.transpose(1, 2).reshape(TQ, H, D)
    if qt.stride(-1) != 1:
        qt = qt.contiguous()
    if groups[0].nh == H:                   # one group of every head
        kf, vf = key.transpose(1, 2).reshape(-1, Hkv * D), value.transpose(1, 2).reshape(
            -1, Hkv * Dv)
    else:
        kf, vf = key.reshape(-1, D), value.reshape(-1, Dv)
    NG = rows.shape[0]
    kg = kf.index_select(0, rows).view(NG, hkv_s, D)
    vg = vf.index_select(0, rows).view(NG, hkv_s, Dv)
    o, lse = _FlexFunction.apply(qt, kg, vg, plan)
    out = o.view(H, B, Lq, Dv).transpose(0, 1)
    if dtype != cdtype:
        out = out.to(dtype)
    if return_lse:
        return out, lse.view(H, B, Lq).transpose(0, 1)
    return out
