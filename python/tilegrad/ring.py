"""Context-parallel (ring) FlashAttention-2 over ``torch.distributed``.

The sequence is sharded across the processes of a group; each holds its
chunk of q, k and v (``[B, H, L_r, D]`` / ``[B, H_kv, L_r, D]``) and gets its
chunk of the output. The key/value chunks travel around the ring of ranks
(point-to-point sends on the group's backend: gloo on CPUs, or MPI), never
through a transport of our own:

* forward: at step s rank r holds the key/value chunk of rank r - s and runs
  the forward kernel of its queries against it, giving a partial (O_s, L_s)
  with O_s in float32 (``TG_ATTN_OPT_O_F32``, also for bf16 inputs); the
  partials are merged with a logsumexp combine in float32,
  ``L = logaddexp(L, L_s)``, ``O = O exp(L_old - L) + O_s exp(L_s - L)``,
  and O is rounded to the input dtype once at the end. The next chunk is
  received while this one is computed.
* backward: ``D_vec = rowsum(dO * O)`` once, locally; the backward kernel of
  one (query chunk, key chunk) pair needs only the global L and D_vec, so
  the pairs are independent (each is given the global L, which holds the
  sink). The key/value chunks travel again; dQ sums
  locally; each chunk's dK/dV partial sum travels with it (every rank adds
  its part, computed into a fresh buffer while the previous ranks' sum is
  in flight) and arrives home after the last step.
* causal: global position p sees keys at positions <= p. A pair whose keys
  all come after its queries is skipped, one whose keys all come before runs
  without the mask, the diagonal pairs run causal with ``q_offset`` placing
  the query chunk against the key chunk. With ``layout="zigzag"`` (2N chunks,
  rank r holds chunks r and 2N-1-r) every rank does the same causal work.
* window W: global position p sees keys at positions > p - W (and, causal,
  <= p). A pair whose keys all lie before every query's window is skipped,
  one the window's edge crosses runs with the window (``q_offset`` placing
  the chunks as for causal), the others without.
* sinks: e^{s_h} joins each row's denominator once: the chunks' partials are
  merged without it, then the sink is merged as one more partial (O = 0,
  L = s_h). Its gradient, -sum_i e^{s_h - L_i} rowsum(dO O)_i, is this
  rank's rows' part (sum it over the group, as DDP does for parameters).

* packed documents (``cu_seqlens=``, the int32 offsets of the documents
  packed along the whole sequence, flash_attn_varlen_func's, the same on
  every rank; B = 1): position p sees only the keys of its own document
  (causal: those <= p). Chunks are either the same positions or disjoint,
  so each (query segment, key segment) pair is one of: the same segment
  (the documents cut at its ends, one ``tg_attn_varlen_fwd`` call over all
  of them, causal when the call is, each piece with len_q == len_k so the
  kernel's bottom-right alignment is the global diagonal); keys before the
  queries (at most one document spans both, the queries' first and the
  keys' last: one full, unmasked piece, or the window's edge crossing it a
  dense call with the window and ``q_offset``); keys after the queries
  (skipped when causal, else as keys before). A pair sharing no document
  runs nothing; its key/value chunk still travels on. The backward runs
  ``tg_attn_varlen_bwd`` on the same pieces, dK/dV accumulated straight
  into the travelling sum (each segment held there as ``[len, H_kv, D]``,
  the kernel's packed rows, so a piece's rows are one block).

Layouts (positions of the rows of a rank's local tensors, group ranks
0..N-1): ``"contiguous"``: rank r holds the r-th chunk, chunks in rank
order, any lengths >= 1 (ragged; the lengths are exchanged at each call).
``"zigzag"``: the sequence of length S is cut into 2N chunks as
``torch.tensor_split`` cuts it (the first S % 2N one longer); rank r holds
chunk r followed by chunk 2N-1-r. :func:`ring_shard`, :func:`ring_unshard`
and :func:`ring_positions` (e.g. for rotary position ids) convert.

Every message a call waits on (the arguments' all_gather, each chunk's
send and receive) waits at most ``timeout`` seconds (default
:data:`DEFAULT_TIMEOUT`, or ``$TILEGRAD_COLLECTIVE_TIMEOUT``), not the
group's own (gloo's default is 30 minutes): a peer that died, hung or lost
its link makes every rank raise :class:`RingPeerError`, naming the peer
rank it waited on, instead of sitting in a receive.

Not supported: attention masks (but packed documents, ``cu_seqlens=``)
and dropout (the kernels number dropout's weights by their position in the
local (qL, kL) problem, not the global one); a value head dim other than
D; double backward. docs/RING.md has the cost model and how to launch.
"""
import bisect
import datetime
import math
import os
import struct
import zlib
from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import capi as _capi
from ._torch_common import (_ATTN_DTYPES, _attn_params, _attn_precision_arg, _bhl_strides,
                            _context, _inner_unit, _ptr, _sinks_arg, _sinks_grad,
                            _threads_arg, _window_arg)

__all__ = ["ring_attention", "ring_shard", "ring_unshard", "ring_positions", "LAYOUTS",
           "bytes_sent", "RingPeerError", "DEFAULT_TIMEOUT", "collective_timeout"]

Tensor = torch.Tensor

#: values of ``layout=``
LAYOUTS = ("contiguous", "zigzag")

_bytes_sent = 0

#: seconds a call waits for any one message (``timeout=``,
#: ``$TILEGRAD_COLLECTIVE_TIMEOUT``). A message waits for its peer to reach
#: the same step of the same call, so this bounds how far the ranks may drift
#: apart, not the step: raise it where ranks do minutes of uneven work
#: between calls.
DEFAULT_TIMEOUT = 60.0


class RingPeerError(RuntimeError):
    """A message of :func:`ring_attention` to or from ``peer`` (a global
    rank; None for the arguments' all_gather) failed: the connection closed
    (the peer died) or nothing came within the timeout (it hung, or its link
    went down). The group's other messages are then in an unknown state:
    end the process and restart from a checkpoint."""

    def __init__(self, rank: int, world: int, peer: Optional[int], what: str, cause: str):
        self.rank, self.peer = rank, peer
        who = "the group" if peer is None else f"peer rank {peer}"
        super().__init__(f"ring_attention (rank {rank} of {world}): {what} {who} failed "
                         f"(dead, hung or unreachable): {cause}")


def _timeout_arg(timeout: Optional[float]) -> datetime.timedelta:
    if timeout is None:
        env = os.environ.get("TILEGRAD_COLLECTIVE_TIMEOUT", "")
        timeout = float(env) if env else DEFAULT_TIMEOUT
    timeout = float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
    return datetime.timedelta(seconds=timeout)


def collective_timeout(timeout: Optional[float] = None) -> datetime.timedelta:
    """The wait :func:`ring_attention` allows any one message (``timeout``
    seconds, else ``$TILEGRAD_COLLECTIVE_TIMEOUT``, else
    :data:`DEFAULT_TIMEOUT`), as the timedelta
    ``torch.distributed.init_process_group(timeout=)`` takes: passed there,
    the collectives tilegrad does not own (DDP's gradient all-reduces,
    barriers, checkpoint broadcasts) are bounded by the same wait instead of
    gloo's default 30 minutes."""
    return _timeout_arg(timeout)


def _wait(plan, work, peer: Optional[int], what: str) -> None:
    """work.wait() bounded by the call's timeout; a failure names the peer."""
    try:
        done = work.wait(plan.timeout)
    except RuntimeError as e:    # gloo: "Connection closed by peer [addr]:port", "Timed out ..."
        raise RingPeerError(plan.rank, plan.N, peer, what, str(e).strip()) from e
    if done is False:            # a backend that reports a timeout instead of raising
        raise RingPeerError(plan.rank, plan.N, peer, what,
                            f"no answer in {plan.timeout.total_seconds():g} s")


def bytes_sent() -> int:
    """Bytes this process has handed to ``torch.distributed`` sends in
    :func:`ring_attention` (forward and backward), since it started."""
    return _bytes_sent


# ---------------------------------------------------------------------------
# layouts: a rank's segments (local row, length, global position)

def _chunk_sizes(S: int, parts: int) -> List[int]:
    """torch.tensor_split's sizes: the first S % parts chunks one longer."""
    base, extra = divmod(S, parts)
    return [base + (i < extra) for i in range(parts)]


def _segments(layout: str, lengths: Sequence[int]) -> List[List[Tuple[int, int, int]]]:
    """Per rank, its local tensor's segments (local row, length, global
    position), from every rank's local length."""
    N = len(lengths)
    if layout == "contiguous":
        starts = [sum(lengths[:r]) for r in range(N)]
        return [[(0, lengths[r], starts[r])] for r in range(N)]
    sizes = _chunk_sizes(sum(lengths), 2 * N)
    if min(sizes) < 1:
        raise ValueError(f"layout='zigzag' on {N} ranks needs a sequence of at least {2 * N} "
                         f"rows, got {sum(lengths)}")
    starts = [sum(sizes[:c]) for c in range(2 * N)]
    want = [sizes[r] + sizes[2 * N - 1 - r] for r in range(N)]
    if list(lengths) != want:
        raise ValueError(f"layout='zigzag': ranks hold {list(lengths)} rows; a sequence of "
                         f"{sum(lengths)} cut into {2 * N} chunks (torch.tensor_split) gives "
                         f"{want} (ring_shard makes them)")
    return [[(0, sizes[r], starts[r]),
             (sizes[r], sizes[2 * N - 1 - r], starts[2 * N - 1 - r])] for r in range(N)]


def _layout_arg(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _positions(segs) -> Tensor:
    return torch.cat([torch.arange(g, g + n) for _, n, g in segs])


def ring_positions(seq_len: int, world_size: int, rank: int,
                   layout: str = "contiguous") -> Tensor:
    """Global positions (int64 ``[L_rank]``) of rank ``rank``'s rows when a
    sequence of ``seq_len`` is sharded by :func:`ring_shard` (contiguous:
    ``torch.tensor_split`` into ``world_size`` chunks)."""
    _layout_arg(layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size = {world_size})")
    parts = world_size if layout == "contiguous" else 2 * world_size
    if seq_len < parts:
        raise ValueError(f"seq_len = {seq_len} < {parts}: layout={layout!r} on {world_size} "
                         "ranks needs every chunk non-empty")
    sizes = _chunk_sizes(seq_len, parts)
    lengths = sizes if layout == "contiguous" else \
        [sizes[r] + sizes[parts - 1 - r] for r in range(world_size)]
    return _positions(_segments(layout, lengths)[rank])


def ring_shard(x: Tensor, world_size: int, rank: int, layout: str = "contiguous",
               dim: int = -2) -> Tensor:
    """Rank ``rank``'s rows of the whole-sequence tensor ``x`` (sequence
    along ``dim``: -2 fits ``[B, H, L, D]`` and ``[B, L, E]``), as
    :func:`ring_attention` with the same ``layout`` expects them."""
    return x.index_select(dim, ring_positions(x.shape[dim], world_size, rank, layout))


def ring_unshard(parts: Sequence[Tensor], layout: str = "contiguous", dim: int = -2) -> Tensor:
    """The whole-sequence tensor from every rank's part (``parts[r]`` from
    group rank r; contiguous parts may have any lengths)."""
    _layout_arg(layout)
    segs = _segments(layout, [p.shape[dim] for p in parts])
    pos = torch.cat([_positions(s) for s in segs])
    return torch.cat(list(parts), dim).index_select(dim, torch.argsort(pos))


# ---------------------------------------------------------------------------
# the plan of one call: checked on every rank, agreed by one all_gather

class _Plan:
    """What both passes need: the group and its ring, every rank's segments,
    the kernels' scalar arguments."""

    def __init__(self, group, rank, N, segs, causal, scale, softcap, window, dtype, threads,
                 deterministic, attn_precision, timeout=None, cu=None):
        self.group, self.rank, self.N, self.segs = group, rank, N, segs
        self.cu = cu                  # packed documents: the global offsets (ints), or None
        self._calls = {}
        self.timeout = timeout or _timeout_arg(None)
        self.causal, self.scale, self.softcap, self.window = causal, scale, softcap, window
        self.dt = _ATTN_DTYPES[dtype]
        self.threads, self.deterministic, self.ap = threads, deterministic, attn_precision
        world = group is None or group is dist.group.WORLD
        glob = (lambda r: r) if world else (lambda r: dist.get_global_rank(group, r))
        self.next, self.prev = glob((rank + 1) % N), glob((rank - 1) % N)

    def rows(self, r: int) -> int:
        """Rank r's chunk length."""
        return sum(n for _, n, _ in self.segs[r])

    def pairs(self, src: int):
        """(query segment, key segment, causal, q_offset, window) of this
        rank's queries against rank src's keys; fully masked pairs left out.
        Local key k sees local query i: k <= i + q_offset (causal) and
        k > i + q_offset - window (window > 0), q_offset = qg - kg."""
        W = self.window
        for qs in self.segs[self.rank]:
            for ks in self.segs[src]:
                (_, ql, qg), (_, kl, kg) = qs, ks
                first_q, last_q, first_k, last_k = qg, qg + ql - 1, kg, kg + kl - 1
                if self.causal and first_k > last_q:         # every key after every query
                    continue
                if W and last_k <= first_q - W:              # every key before every window
                    continue
                causal = self.causal and last_k > first_q    # the diagonal crosses the pair
                win = W if W and first_k <= last_q - W else 0   # the window's edge crosses it
                yield qs, ks, causal, qg - kg if causal or win else 0, win

    def calls(self, src):
        """The kernel calls of this rank's queries against rank src's keys:
        (query rows, key rows, cu_q, cu_k, causal, q_offset, window) with
        rows (first local row, count) of the local tensors and, for packed
        documents, int32 offset tensors over those rows (None: a dense
        call). Cached: the backward runs the forward's calls."""
        if src not in self._calls:
            if self.cu is None:
                self._calls[src] = [(qs[:2], ks[:2], None, None, causal, off, win)
                                    for qs, ks, causal, off, win in self.pairs(src)]
            else:
                self._calls[src] = [c for qs in self.segs[self.rank] for ks in self.segs[src]
                                    for c in [self._doc_call(qs, ks)] if c is not None]
        return self._calls[src]

    def _doc_call(self, qs, ks):
        """The packed documents' piece of one (query segment, key segment)
        pair (module docstring), or None where they share no visible key."""
        cu, W = self.cu, self.window
        (qrow, ql, qg), (krow, kl, kg) = qs, ks
        qb, kb = qg + ql, kg + kl
        if qg == kg:        # the same positions: every document cut at the segment's ends
            inner = sorted(set(cu[bisect.bisect_right(cu, qg):bisect.bisect_left(cu, qb)]))
            offs = torch.tensor([0] + [c - qg for c in inner] + [ql], dtype=torch.int32)
            return (qrow, ql), (krow, kl), offs, offs, self.causal, 0, W
        if qg < kb and kg < qb:
            raise AssertionError(f"segments overlap without being one: {qs}, {ks}")
        before = kb <= qg                      # every key before every query
        if not before and self.causal:
            return None
        lo, hi = (kb, qg) if before else (qb, kg)   # the gap between the two segments
        if bisect.bisect_left(cu, lo) < len(cu) and cu[bisect.bisect_left(cu, lo)] <= hi:
            return None     # a document starts in [lo, hi]: none holds both lo - 1 and hi
        start = cu[bisect.bisect_right(cu, lo - 1) - 1]     # the one document: [start, end)
        end = cu[bisect.bisect_right(cu, hi)]
        q0, q1 = max(qg, start), min(qb, end)
        k0, k1 = max(kg, start), min(kb, end)
        rows = (qrow + q0 - qg, q1 - q0), (krow + k0 - kg, k1 - k0)
        if before and W:
            if k1 - 1 <= q0 - W:                 # every key before every query's window
                return None
            if k0 <= q1 - 1 - W:                 # the window's edge crosses the piece
                return rows + (None, None, False, q0 - k0, W)
        one = torch.tensor([0, q1 - q0], dtype=torch.int32), \
            torch.tensor([0, k1 - k0], dtype=torch.int32)
        return rows + one + (False, 0, 0)


_META = ("B", "H", "H_kv", "D", "dtype", "causal", "layout", "scale", "softcap",
         "attn_precision", "window", "sinks", "cu_seqlens")


def _cu_seqlens_arg(cu, B: int) -> Optional[List[int]]:
    """cu_seqlens: None, or the whole sequence's document offsets (a 1-D
    int32 or int64 CPU tensor: 0 first, non-decreasing) -> a list of ints.
    The last, the packed length, is checked against the chunks' lengths
    once they are gathered."""
    if cu is None:
        return None
    if not isinstance(cu, torch.Tensor) or cu.dtype not in (torch.int32, torch.int64) or \
            cu.dim() != 1 or cu.device.type != "cpu":
        raise TypeError("cu_seqlens must be a 1-D int32 (or int64) CPU tensor of n_docs + 1 "
                        "offsets into the whole packed sequence, got "
                        f"{getattr(cu, 'dtype', type(cu).__name__)} "
                        f"{tuple(getattr(cu, 'shape', ()))}")
    if cu.numel() < 2:
        raise ValueError(f"cu_seqlens holds n_docs + 1 >= 2 offsets, got {cu.numel()}")
    if B != 1:
        raise ValueError(f"cu_seqlens: packed documents are one sequence of B = 1 (as "
                         f"flash_attn_varlen_func packs its batch), got B = {B}")
    offs = [int(x) for x in cu.tolist()]
    if offs[0] != 0:
        raise ValueError(f"cu_seqlens[0] = {offs[0]}: the offsets start at 0")
    for d in range(len(offs) - 1):
        if offs[d + 1] < offs[d]:
            raise ValueError(f"cu_seqlens decreases at document {d}: cu_seqlens[{d}] = "
                             f"{offs[d]} > cu_seqlens[{d + 1}] = {offs[d + 1]} (offsets are "
                             "non-decreasing)")
    if offs[-1] > 2 ** 31 - 1:
        raise ValueError(f"cu_seqlens[-1] = {offs[-1]} does not fit the kernels' int32")
    return offs


def _cu_digest(cu: Optional[List[int]]) -> int:
    """-1 without documents, else the CRC-32 of the offsets (as int64):
    every rank must hold the same."""
    if cu is None:
        return -1
    return zlib.crc32(struct.pack(f"<{len(cu)}q", *cu))


def _sinks_digest(sinks: Optional[Tensor]) -> int:
    """-1 without sinks, else the CRC-32 of their float32 bytes: the ranks
    must hold the same sink logits."""
    if sinks is None:
        return -1
    return zlib.crc32(sinks.detach().contiguous().numpy().tobytes())


def _local_problem(q, k, v, dropout_p) -> Optional[str]:
    """What is wrong with this rank's inputs alone (None: nothing)."""
    if dropout_p:
        return ("dropout is not supported across chunks: the kernels number the dropped "
                "weights by their place in the local (query chunk, key chunk) problem, "
                "so the ranks would not draw the single-process mask")
    if any(not isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k and v must be tensors"
    if any(t.device.type != "cpu" for t in (q, k, v)):
        return f"tilegrad runs on the CPU; got tensors on {q.device}, {k.device}, {v.device}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return (f"q [B, H, L, D], k and v [B, H_kv, L, D] expected; got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}")
    if tuple(k.shape[:3]) == tuple(v.shape[:3]) and k.shape[3] != v.shape[3]:
        return (f"a value head dim of its own (v {tuple(v.shape)}, k {tuple(k.shape)}) is not "
                "supported by ring_attention (tilegrad.torch.attention takes it)")
    if tuple(k.shape) != tuple(v.shape):
        return (f"q [B, H, L, D], k and v [B, H_kv, L, D] expected; got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _ATTN_DTYPES:
        return (f"q, k and v must all be torch.bfloat16 or all torch.float32; got "
                f"{q.dtype}, {k.dtype}, {v.dtype}")
    B, H, L, D = q.shape
    if k.shape[0] != B or k.shape[2] != L or k.shape[3] != D:
        return (f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, chunk "
                "length (q, k and v are this rank's chunk of one sequence) and head dim")
    if k.shape[1] < 1 or H % k.shape[1]:
        return f"query heads H = {H} must be a multiple of kv heads {k.shape[1]} (GQA)"
    if L < 1 or B < 1 or H < 1:
        return f"every rank needs a non-empty chunk; got q {tuple(q.shape)}"
    if D % 8 or not 8 <= D <= 512:
        return f"head dim D = {D}: the kernels take a multiple of 8 up to 512"
    return None


def _f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _describe(meta: Tensor) -> dict:
    """A rank's gathered _META values, readable."""
    d = dict(zip(_META, meta.tolist()))
    d["dtype"] = {v: k for k, v in _capi.DTYPE_NAMES.items()}.get(d["dtype"], d["dtype"])
    d["layout"] = LAYOUTS[d["layout"]]
    d["causal"] = bool(d["causal"])
    for f in ("scale", "softcap"):
        d[f] = struct.unpack("<f", struct.pack("<i", d[f]))[0]
    for f in ("sinks", "cu_seqlens"):
        d[f] = "none" if d[f] == -1 else f"crc32 {d[f]:#010x}"
    return d


def _doc_positions(pos: Tensor, cu: Optional[List[int]]) -> Tensor:
    """Global positions -> the rotary positions of those rows: themselves,
    or with packed documents each one's place in its document."""
    if cu is None:
        return pos
    starts = torch.tensor(cu, dtype=torch.int64)
    return pos - starts[torch.searchsorted(starts, pos, right=True) - 1]


def _positions_digest(position_ids) -> int:
    """-1 without position ids, else the CRC-32 of one row of them (int64;
    a [B, L] tensor's rows must agree)."""
    if position_ids is None:
        return -1
    p = torch.as_tensor(position_ids).detach().to(torch.int64)
    p = p.reshape(-1, p.shape[-1]) if p.dim() else p.reshape(1, 1)
    if p.shape[0] > 1 and not bool((p == p[:1]).all()):
        raise ValueError("position_ids: the rows of the batch differ (one sequence's chunk "
                         "is sharded: every row holds the same positions)")
    return zlib.crc32(p[0].contiguous().numpy().tobytes())


def _plan(q, k, v, causal, scale, softcap, group, layout, dropout_p, threads, deterministic,
          attn_precision, window, sinks, timeout, cu_seqlens=None, positions=None,
          problem=None) -> Tuple[_Plan, Optional[Tensor]]:
    """The call's plan, agreed by one all_gather. positions (the rotary
    position ids a model feeds this rank's rows; tilegrad.transformers
    passes them): checked on every rank against each rank's rows' global
    positions (with cu_seqlens: their places in their documents). problem:
    a caller's reason to refuse this rank's call, raised as
    NotImplementedError here while every other rank raises with it."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring_attention needs torch.distributed: call "
                           "torch.distributed.init_process_group('gloo') first (torchrun "
                           "sets its environment; docs/RING.md)")
    rank, N = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("ring_attention: this process is not a member of `group`")
    wait_for = datetime.timedelta(seconds=DEFAULT_TIMEOUT)   # the all_gather's, until checked
    meta = [1] + [0] * (len(_META) + 2)      # [refused, _META..., chunk length, positions]
    n_meta = len(_META)
    try:    # (the timeout is each rank's own: checked, not compared)
        timeout = wait_for = _timeout_arg(timeout)    # a bad argument on one rank must not leave the others waiting: gathered below
        layout = _layout_arg(layout)
        ap = _attn_precision_arg(attn_precision)
        threads = _threads_arg(threads)
        window = _window_arg(window)
        err = problem or _local_problem(q, k, v, dropout_p)
        cu = None
        if err is None:
            sinks = _sinks_arg(sinks, q.shape[1])
            cu = _cu_seqlens_arg(cu_seqlens, q.shape[0])
            D = q.shape[3]
            scale = float(1.0 / math.sqrt(D) if scale is None else scale)
            softcap = 1.0 if softcap is None else float(softcap)
            if not (math.isfinite(scale) and math.isfinite(softcap) and softcap > 0):
                raise ValueError(f"scale = {scale} must be finite, softcap = {softcap} "
                                 "finite and > 0")
            vals = dict(B=q.shape[0], H=q.shape[1], H_kv=k.shape[1], D=D,
                        dtype=_ATTN_DTYPES[q.dtype], causal=int(bool(causal)),
                        layout=LAYOUTS.index(layout), scale=_f32_bits(scale),
                        softcap=_f32_bits(softcap), attn_precision=ap, window=window,
                        sinks=_sinks_digest(sinks), cu_seqlens=_cu_digest(cu))
            meta = [0] + [vals[n] for n in _META] + [q.shape[2], _positions_digest(positions)]
    except (ValueError, TypeError, OverflowError) as e:   # scale / softcap beyond float32 too
        err = str(e)
    # one all_gather: every rank sees every rank's problem, so all raise together
    mine = torch.tensor(meta, dtype=torch.int64)
    every = [mine]
    if N > 1:
        every = [torch.empty_like(mine) for _ in range(N)]
        work = dist.all_gather(every, mine, group=group, async_op=True)
        _wait(_Plan(group, rank, N, None, False, 0, 1, 0, torch.float32, 0, False, 0, wait_for),
              work, None, "the arguments' all_gather with")
    failed = [r for r in range(N) if every[r][0]]
    if err is not None:
        raise (NotImplementedError if problem else ValueError)(
            f"ring_attention (rank {rank} of {N}): {err}")
    if failed:
        raise RuntimeError(f"ring_attention: rank(s) {failed} of the group refused their "
                           "inputs (their own errors say why)")
    for r in range(N):
        diff = [n for j, n in enumerate(_META) if every[r][1 + j] != every[0][1 + j]]
        if diff:
            raise ValueError(f"ring_attention: rank {r} and rank 0 disagree in {diff} "
                             f"({_describe(every[r][1:1 + n_meta])} against "
                             f"{_describe(every[0][1:1 + n_meta])}); every rank must call with the "
                             "same shapes (but the chunk length) and arguments")
    lengths = [int(e[1 + n_meta]) for e in every]
    segs = _segments(layout, lengths)
    if cu is not None and cu[-1] != sum(lengths):     # the same on every rank: all raise
        raise ValueError(f"ring_attention: cu_seqlens[-1] = {cu[-1]} must be the packed length, "
                         f"the sum of the ranks' chunks {lengths} = {sum(lengths)}")
    wrong = [r for r in range(N) if int(every[r][2 + n_meta]) not in (
        -1, zlib.crc32(_doc_positions(_positions(segs[r]), cu).numpy().tobytes()))]
    if wrong:
        raise ValueError(f"ring_attention: the position_ids of rank(s) {wrong} are not their "
                         f"rows' positions (layout={layout!r}, chunks {lengths}"
                         f"{', within the documents of cu_seqlens' if cu else ''}): shard them "
                         "as the rows (tilegrad.transformers.context_parallel_inputs, or "
                         "ring_positions)")
    return _Plan(group, rank, N, segs, bool(causal), scale, softcap, window, q.dtype, threads,
                 bool(deterministic), ap, timeout, cu), sinks


# ---------------------------------------------------------------------------
# the kernels of one (query segment, key segment) pair

def _fwd_pair(ctx, plan, q, k, v, causal, q_offset, window) -> Tuple[Tensor, Tensor]:
    """q [B,H,ql,D], k/v [B,Hkv,kl,D] (views, unit inner stride) -> O f32
    [B,H,ql,D], L f32 [B,H,ql] (without the sinks)."""
    o = torch.empty(q.shape, dtype=torch.float32)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    p = _attn_params(q, k, v, _bhl_strides(o), plan.scale, plan.softcap, q_offset)
    opt = _capi.AttnOptions(flags=_capi.TG_ATTN_OPT_O_F32, window=window)
    ctx.call("tg_attn_train_fwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse), p,
             None, None, int(causal), opt)
    return o, lse


def _docs_params(q, k, v, o_strides, scale: float, softcap: float) -> "_capi.AttnParams":
    """The params of a packed-documents call on [1, H, rows, D] views (B = 1,
    qL, kL the rows of the call, batch strides 0)."""
    _, H, ql, D = q.shape
    Hkv, kl = k.shape[1], k.shape[2]
    hr = lambda t: (0, t.stride(1), t.stride(2))  # noqa: E731
    return _capi.attn_params(1, H, Hkv, ql, kl, D, float(scale), float(softcap),
                             Q_strides=hr(q), K_strides=hr(k), V_strides=hr(v),
                             O_strides=o_strides)


def _docs(cu_q: Tensor, cu_k: Tensor) -> "_capi.AttnVarlen":
    return _capi.AttnVarlen(cu_q.data_ptr(), cu_k.data_ptr(), cu_q.numel() - 1, 0, None)


def _fwd_docs(ctx, plan, q, k, v, cu_q, cu_k, causal, window) -> Tuple[Tensor, Tensor]:
    """tg_attn_varlen_fwd over the documents cu_q / cu_k of the views q
    [1,H,ql,D], k/v [1,Hkv,kl,D] -> O f32 [1,H,ql,D], L f32 [1,H,ql] (without
    the sinks; kernel rows of the [H, total_q] layout)."""
    o = torch.empty(q.shape, dtype=torch.float32)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    p = _docs_params(q, k, v, (0,) + o.stride()[1:3], plan.scale, plan.softcap)
    opt = _capi.AttnOptions(flags=_capi.TG_ATTN_OPT_O_F32, window=window)
    ctx.call("tg_attn_varlen_fwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(o), _ptr(lse), p,
             _docs(cu_q, cu_k), int(causal), opt)
    return o, lse


def _bwd_docs(ctx, plan, q, k, v, lse, do, delta, dq, dk, dv, cu_q, cu_k, causal,
              window) -> None:
    """tg_attn_varlen_bwd over the documents: dq [ql,H,D] f32 written, dk,
    dv [kl,Hkv,D] f32 accumulate (contiguous, the kernel's packed rows); q,
    do [1,H,ql,D] and k, v [1,Hkv,kl,D] views, lse, delta [1,H,ql]
    contiguous."""
    p = _docs_params(q, k, v, (0,) + do.stride()[1:3], plan.scale, plan.softcap)
    opt = _capi.AttnOptions(window=window) if window else None
    ctx.call("tg_attn_varlen_bwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(lse), _ptr(do),
             _ptr(delta), _ptr(dq), _ptr(dk), _ptr(dv), p, _docs(cu_q, cu_k), int(causal),
             opt)


def _merge(o_acc: Tensor, l_acc: Tensor, o: Tensor, lse: Tensor) -> None:
    """(o_acc, l_acc) <- the logsumexp combine of it and (o, lse), in f32, in
    place (views of the accumulators). Rows with L = -inf (no key yet) get
    weight 0; -inf + -inf stays -inf with O 0."""
    l_new = torch.logaddexp(l_acc, lse)
    ref = l_new.masked_fill(torch.isneginf(l_new), 0.0)
    o_acc.mul_(torch.exp(l_acc - ref).unsqueeze(-1))
    o_acc.add_(o * torch.exp(lse - ref).unsqueeze(-1))
    l_acc.copy_(l_new)


def _merge_sinks(o_acc: Tensor, l_acc: Tensor, sinks: Tensor) -> None:
    """The sink as one more partial, (O = 0, L = s_h), merged once per row
    into the whole sequence's (o_acc, l_acc); a NaN or +inf sink makes its
    head's O and L NaN, as in the kernels."""
    H = sinks.shape[0]
    _merge(o_acc, l_acc, torch.zeros_like(o_acc), sinks.view(1, H, 1).expand(l_acc.shape))
    bad = (torch.isnan(sinks) | torch.isposinf(sinks)).view(1, H, 1)
    l_acc.masked_fill_(bad, math.nan)
    o_acc.masked_fill_(bad.unsqueeze(-1), math.nan)


def _bwd_pair(ctx, plan, q, k, v, lse, do, delta, dq, dk, dv, causal, q_offset,
              window) -> None:
    """dq [B,H,ql,D] f32 written; dk, dv [B,Hkv,kl,D] f32 accumulate (all
    contiguous); lse, delta [B,H,ql] contiguous (the global L, sink
    included, and D_vec)."""
    p = _attn_params(q, k, v, _bhl_strides(do), plan.scale, plan.softcap, q_offset)
    opt = _capi.AttnOptions(window=window) if window else None
    ctx.call("tg_attn_train_bwd", plan.dt, _ptr(q), _ptr(k), _ptr(v), _ptr(lse), _ptr(do),
             _ptr(delta), _ptr(dq), _ptr(dk), _ptr(dv), p, None, None, int(causal), opt)


def _rows(t: Tensor, seg) -> Tensor:
    return t[:, :, seg[0]:seg[0] + seg[1]]


# ---------------------------------------------------------------------------
# the ring

def _isend(plan, t: Tensor, tag: int):
    """-> (work, peer, what) for _wait."""
    global _bytes_sent
    _bytes_sent += t.numel() * t.element_size()
    return _post(plan, dist.isend, t, plan.next, tag, "the send to")


def _irecv(plan, t: Tensor, tag: int):
    return _post(plan, dist.irecv, t, plan.prev, tag, "the receive from")


def _post(plan, op, t: Tensor, peer: int, tag: int, what: str):
    """op (isend / irecv) to or from peer -> (work, peer, what); a pair
    already closed (the peer died) raises at the post."""
    try:
        return op(t, peer, group=plan.group, tag=tag), peer, what
    except RuntimeError as e:
        raise RingPeerError(plan.rank, plan.N, peer, what, str(e).strip()) from e


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor],
                  plan: _Plan) -> Tuple[Tensor, Tensor]:
    """-> O [B,H,L,D] in q's dtype, L f32 [B,H,L] (the global logsumexp,
    the sink included)."""
    B, H, L, D = q.shape
    q = _inner_unit(q)
    o_acc = torch.zeros((B, H, L, D), dtype=torch.float32)
    l_acc = torch.full((B, H, L), -math.inf, dtype=torch.float32)
    kv = torch.stack((k, v))                      # [2, B, Hkv, L_src, D]: one message
    ctx = _context(plan.threads, plan.deterministic, plan.ap)
    for s in range(plan.N):
        src = (plan.rank - s) % plan.N
        works = []
        if s < plan.N - 1:                        # the next chunk comes in meanwhile
            nxt = kv.new_empty((2, B, k.shape[1], plan.rows((src - 1) % plan.N), D))
            works = [_isend(plan, kv, s), _irecv(plan, nxt, s)]
        for qs, ks, cu_q, cu_k, causal, off, win in plan.calls(src):
            qv, kv_, vv = _rows(q, qs), _rows(kv[0], ks), _rows(kv[1], ks)
            if cu_q is None:
                o, lse = _fwd_pair(ctx, plan, qv, kv_, vv, causal, off, win)
            else:
                o, lse = _fwd_docs(ctx, plan, qv, kv_, vv, cu_q, cu_k, causal, win)
            _merge(_rows(o_acc, qs), _rows(l_acc, qs), o, lse)
        for w in works:
            _wait(plan, *w)
        if works:
            kv = nxt
    if sinks is not None:
        _merge_sinks(o_acc, l_acc, sinks)
    return o_acc.to(q.dtype), l_acc


def _grad_views(g: Tensor, segs, B: int, Hkv: int, D: int):
    """A chunk's dK, dV as one message g, f32 [2, B*Hkv*L_chunk*D] with each
    key segment a contiguous [B, Hkv, len, D] block (the kernel accumulates
    into contiguous dK, dV) -> {(local row, length): (dk, dv)} views."""
    views, at = {}, 0
    for s in segs:
        n = B * Hkv * s[1] * D
        views[s[:2]] = tuple(g[j, at:at + n].view(B, Hkv, s[1], D) for j in (0, 1))
        at += n
    return views


def _ring_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                   sinks: Optional[Tensor], plan: _Plan):
    """-> dq, dk, dv of q's dtype (f32 sums rounded once), dsinks f32 [H]
    (this rank's rows' part; None without sinks)."""
    B, H, L, D = q.shape
    Hkv, N, rank = k.shape[1], plan.N, plan.rank
    q, do, o = _inner_unit(q), do.contiguous(), o.contiguous()
    ctx = _context(plan.threads, plan.deterministic, plan.ap)
    delta = torch.empty((B, H, L), dtype=torch.float32)
    ctx.call("tg_attn_train_bwd_compute_d", plan.dt, _ptr(o), _ptr(do), _ptr(delta),
             B, H, L, D)
    mine = plan.segs[rank]
    packed = plan.cu is not None     # dQ and each chunk's dK/dV as [rows, heads, D]
    lse_of, delta_of = {}, {}        # the kernel takes them contiguous, per call's rows
    dq = torch.zeros((L, H, D) if packed else (B, H, L, D), dtype=torch.float32)
    kv = torch.stack((k, v))

    sent, home, home_work = None, None, None    # sent: the last dK/dV send, in flight
    for s in range(N):
        src = (rank - s) % N
        kv_works, g_in_work = [], None
        if s < N - 1:
            kv_nxt = kv.new_empty((2, B, Hkv, plan.rows((src - 1) % N), D))
            kv_works = [_isend(plan, kv, s), _irecv(plan, kv_nxt, s)]
        if s > 0:   # the sum of the ranks before us on chunk src (their step s - 1)
            g_in = torch.empty((2, B * Hkv * plan.rows(src) * D), dtype=torch.float32)
            g_in_work = _irecv(plan, g_in, N + s - 1)
        if s == N - 1 and N > 1:   # our chunk's whole sum, after the previous rank's last step
            home = torch.empty((2, B * Hkv * L * D), dtype=torch.float32)
            home_work = _irecv(plan, home, 2 * N - 1)
        # this rank's part, computed while the previous ranks' sum is in flight
        g = torch.zeros((2, B * Hkv * plan.rows(src) * D), dtype=torch.float32)
        if packed:
            gk = g.view(2, plan.rows(src), Hkv, D)
        else:
            views = _grad_views(g, plan.segs[src], B, Hkv, D)
        for qs, ks, cu_q, cu_k, causal, off, win in plan.calls(src):
            if qs not in lse_of:
                lse_of[qs] = _rows(lse, qs).contiguous()
                delta_of[qs] = _rows(delta, qs).contiguous()
            args = (ctx, plan, _rows(q, qs), _rows(kv[0], ks), _rows(kv[1], ks), lse_of[qs],
                    _rows(do, qs), delta_of[qs])
            if not packed:
                dq_part = torch.empty((B, H, qs[1], D), dtype=torch.float32)
                _bwd_pair(*args, dq_part, *views[ks], causal, off, win)
                _rows(dq, qs).add_(dq_part)
                continue
            dk_rows, dv_rows = (gk[j, ks[0]:ks[0] + ks[1]] for j in (0, 1))
            dq_rows = dq[qs[0]:qs[0] + qs[1]]
            if cu_q is not None:
                dq_part = torch.empty((qs[1], H, D), dtype=torch.float32)
                _bwd_docs(*args, dq_part, dk_rows, dv_rows, cu_q, cu_k, causal, win)
                dq_rows.add_(dq_part)
            else:        # a windowed piece: the dense kernel, [1, heads, rows, D]
                dq_part = torch.empty((1, H, qs[1], D), dtype=torch.float32)
                dkv = torch.zeros((2, 1, Hkv, ks[1], D), dtype=torch.float32)
                _bwd_pair(*args, dq_part, dkv[0], dkv[1], causal, off, win)
                dq_rows.add_(dq_part[0].transpose(0, 1))
                dk_rows.add_(dkv[0, 0].transpose(0, 1))
                dv_rows.add_(dkv[1, 0].transpose(0, 1))
        if g_in_work is not None:
            _wait(plan, *g_in_work)
            g.add_(g_in)
        if N > 1:   # on to the next rank (at s = N-1: home); one step's send in flight
            if sent is not None:
                _wait(plan, *sent)
            sent = _isend(plan, g, N + s)
        for w in kv_works:
            _wait(plan, *w)
        if kv_works:
            kv = kv_nxt
    if home_work is not None:
        _wait(plan, *home_work)
    else:
        home = g                   # one rank: its own sum
    if sent is not None:
        _wait(plan, *sent)
    dsinks = None if sinks is None else _sinks_grad(sinks, lse, delta)
    if packed:        # [rows, heads, D] -> [1, heads, rows, D], rounded once
        dq, dk, dv = (t.transpose(0, 1).unsqueeze(0) for t in (dq, *home.view(2, L, Hkv, D)))
        return tuple(t.to(q.dtype, memory_format=torch.contiguous_format)
                     for t in (dq, dk, dv)) + (dsinks,)
    views = _grad_views(home, mine, B, Hkv, D)
    dk = torch.cat([views[s[:2]][0] for s in mine], 2)
    dv = torch.cat([views[s[:2]][1] for s in mine], 2)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dsinks


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, plan):
        o, lse = _ring_forward(q, k, v, sinks, plan)
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = _ring_backward(do.to(q.dtype), q, k, v, o, lse, sinks, ctx.plan)
        return dq, dk, dv, dsinks, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                   scale: Optional[float] = None, softcap: Optional[float] = None, *,
                   group=None, layout: str = "contiguous", dropout_p: float = 0.0,
                   window: Optional[int] = None, sinks: Optional[Tensor] = None,
                   attn_precision: str = "exact", threads: Optional[int] = None,
                   deterministic: bool = False, timeout: Optional[float] = None,
                   cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """Context-parallel FA-2 attention: this rank's chunk of
    ``softmax(scale q k^T) v`` over the whole sequence, whose chunks the
    ranks of ``group`` (default: the world) hold.

    q ``[B, H, L_r, D]``, k and v ``[B, H_kv, L_r, D]``: this rank's rows of
    one self-attention sequence (H a multiple of H_kv: GQA), bfloat16 or
    float32 CPU tensors, D a multiple of 8 up to 512; ``layout`` says which
    global positions the rows are (module docstring: ``"contiguous"``, any
    chunk lengths; ``"zigzag"``, the balanced causal layout of
    :func:`ring_shard`). Every rank must call it, with the same B, H, H_kv,
    D, dtype and arguments; each gets its own rows of O (q's dtype).
    causal: position p sees keys at positions <= p. window W: position p
    sees keys at positions > p - W (transformers' ``sliding_window``; pairs
    of chunks wholly outside it are skipped). sinks: ``[H]`` sink logits,
    the same on every rank, as :func:`tilegrad.torch.attention`'s (each
    row's denominator gets e^{s_h} once); their gradient on a rank is its
    rows' part, to be summed over the group as any replicated parameter's.
    scale default ``1/sqrt(D)``; softcap, attn_precision, threads and
    deterministic as :func:`tilegrad.torch.attention`. Gradients flow to q,
    k, v and sinks (the backward runs the ring again, so every rank must run
    it).

    Results: O and the gradients are the single-process kernels' up to f32
    rounding (the (O, L) merge and the chunk order of the f32 sums); with one
    rank and the contiguous layout they are those kernels' bits.
    timeout: seconds any one message (of this call's forward and of its
    backward) may wait before :class:`RingPeerError` names the peer it waited
    on (default ``$TILEGRAD_COLLECTIVE_TIMEOUT`` or :data:`DEFAULT_TIMEOUT`);
    a closed connection (a dead peer) raises it at once.
    cu_seqlens: packed documents, as :func:`tilegrad.torch.varlen_attention`
    takes them with cu_seqlens_q = cu_seqlens_k: the int32 (or int64)
    offsets ``[0, ..., S]`` of the documents along the whole sequence of S
    rows (not this rank's chunk), the same tensor on every rank, B = 1;
    position p then sees only keys of its own document (causal: bottom-right
    aligned, which for len_q = len_k is the usual diagonal; window and sinks
    within it as above). Its bad values (not starting at 0, decreasing, a
    last offset other than S, ranks holding different offsets) raise
    ValueError on every rank before any chunk is sent. q, k, v in
    varlen_attention's packed layout ``(rows, heads, D)`` go in as
    ``x.transpose(0, 1).unsqueeze(0)`` and O comes back as
    ``o[0].transpose(0, 1)``.
    Not supported (clear errors): masks, dropout_p != 0, a value head dim
    other than D."""
    plan, sinks = _plan(q, k, v, causal, scale, softcap, group, layout, dropout_p, threads,
                        deterministic, attn_precision, window, sinks, timeout, cu_seqlens)
    return _RingAttention.apply(q, k, v, sinks, plan)
