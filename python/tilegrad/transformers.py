"""tilegrad's attention as a Hugging Face transformers attention backend.

    import tilegrad.transformers                     # registers "tilegrad"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tilegrad")

Importing this module calls :func:`register` (idempotent), which adds

* ``"tilegrad"`` to ``transformers.AttentionInterface``:
  :func:`attention_forward`, the attention function every model of the
  interface calls as ``f(module, query [B,H,qL,D], key [B,H_kv,kL,D],
  value [B,H_kv,kL,Dv], attention_mask, dropout=, scaling=, sliding_window=,
  softcap=, s_aux=, is_causal=, ...)`` and which returns
  ``(attn_output [B,qL,H,Dv], None)``;
* ``"tilegrad"`` to ``transformers.AttentionMaskInterface``:
  :func:`attention_mask`, which builds the mask the model hands to every
  layer. For the masks tilegrad takes natively it builds no
  ``[B, 1, qL, kL]`` tensor: a causal mask (with or without a sliding
  window) whose query positions are bottom-right aligned with the keys
  becomes ``None`` (no padding) or the 2-D bool padding mask ``[B, kL]``
  (True = attend), as transformers' flash-attention masks do; the causal
  limit and the window then come from the layer (``is_causal``,
  ``sliding_window``). A packed batch (``position_ids`` restarting inside
  a row, which transformers' ``find_packed_sequence_indices`` turns into
  a causal mask within each document) becomes the ``[B, kL]`` int32
  document index of each token, and the attention function runs
  :func:`tilegrad.torch.varlen_attention` over the documents (with a cache
  object, which use_cache=True creates even in training, transformers
  builds a plain causal mask instead: the attention function then finds
  the documents in position_ids, as the flash-attn backends do, under
  torch.compile too). Every other mask (or/and mask functions, a static
  cache, bidirectional patterns, transformers' packed mask under
  torch.compile, whose closures Dynamo cannot read) is built dense by
  transformers' ``sdpa_mask`` and passed to the kernels as a mask.

Packed batches also come in as ``DataCollatorWithFlattening(
return_flash_attn_kwargs=True)``'s keywords ``cu_seq_lens_q``,
``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``, which transformers
forwards to the attention function: they go to ``varlen_attention`` as
they are (the rows of the batch flattened, as flash-attn takes them).
A flex ``BlockMask`` given as the model's ``attention_mask`` (transformers
passes a 4-D one through) is the whole mask, as a 4-D tensor is: it runs on
:func:`tilegrad.torch.flex_attention`, its blocks only (no dropout, no
sinks with it).

What the kernels cannot do is refused with an error naming the reason and
the alternative (``attn_implementation="sdpa"`` or ``"eager"``), never
computed another way: tensors off the CPU, float64, head dims that are not
multiples of 8 in [8, 512], ``output_attentions=True`` (the weights are
never formed), a ``position_bias``, a sliding window on a bidirectional
layer without a mask.

Context parallel: inside ``with context_parallel(group):`` every attention
layer runs :func:`tilegrad.ring.ring_attention` over the group, each rank
holding its chunk of the sequence (:func:`context_parallel_inputs` shards a
batch: input ids, global position ids, labels shifted over the whole
sequence); docs/RING.md has the recipe.

:func:`use_tilegrad_rms_norm` (off unless called) swaps the RMSNorm modules
of the supported families for tilegrad's ``rms_norm`` op;
:func:`use_tilegrad_kernels` (off unless called) puts every step kernel
into one model: RoPE, SwiGLU / GeGLU, RMSNorm, the fused linear
cross-entropy and linear layers that keep no bf16 weight copies.
"""
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import sys
from typing import Dict, Optional, Tuple

import torch
from transformers import AttentionInterface
from transformers import masking_utils as _mu

from . import ring as _ring
from . import torch as tt
from ._torch_paths import _IS_COMPILING

__all__ = ["register", "attention_forward", "attention_mask", "use_tilegrad_rms_norm",
           "use_tilegrad_kernels", "TilegradRMSNorm", "NAME", "context_parallel",
           "context_parallel_inputs"]

#: the name registered with transformers' attention and mask interfaces
NAME = "tilegrad"

# register()'s options, read by attention_forward at each call
_options = {"attn_precision": "exact", "deterministic": False}

_REFUSED = ('use attn_implementation="sdpa" or "eager" for this model')


def _refuse(what: str) -> None:
    raise NotImplementedError(f'attn_implementation="tilegrad": {what}; {_REFUSED}')


def _need_supported(query, key, value, attention_mask, kwargs) -> None:
    """Raise for what the kernels cannot compute (plain Python on shapes and
    dtypes: traced by Dynamo without graph breaks)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.device.type != "cpu":
            _refuse(f"tilegrad's kernels run on the CPU, {name} is on {t.device}")
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        _refuse(f"the kernels compute in float32 or bfloat16, the model runs in {query.dtype}")
    D, Dv = query.shape[-1], value.shape[-1]
    for name, d in (("query/key", D), ("value", Dv)):
        if d % 8 or not 8 <= d <= 512:
            _refuse(f"{name} head dim {d}: the kernels take head dims that are multiples "
                    "of 8 from 8 to 512")
    if kwargs.get("output_attentions"):
        _refuse("output_attentions=True: tilegrad never forms the attention weights")
    if kwargs.get("position_bias") is not None:
        _refuse("a position_bias (relative attention bias) is not one of the kernels' "
                "inputs")
    if _is_block_mask(attention_mask):
        if kwargs.get("s_aux") is not None:
            _refuse("sinks (s_aux) with a flex BlockMask: tilegrad's flex_attention has no sinks")
        return
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        _refuse(f"attention_mask of type {type(attention_mask).__name__}: the kernels take no "
                "mask, a 2-D padding mask, a 4-D tensor or a flex BlockMask")
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        _refuse(f"attention_mask of shape {tuple(attention_mask.shape)}: the kernels take a "
                "2-D [B, kL] padding mask or a 4-D mask broadcastable to [B, H, qL, kL]")


def _is_block_mask(mask) -> bool:
    """A torch flex BlockMask (torch >= 2.5), which transformers passes
    through as a 4-D mask when the model is handed one."""
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:
        return False
    return isinstance(mask, BlockMask)


def _cu_seqlens_of(documents: torch.Tensor) -> Tuple[torch.Tensor, Optional[int]]:
    """[B, L] document indices (a document is a run of one value within a
    row; rows never share one) -> (cu_seqlens int32 over the B * L
    flattened rows, the longest document's length). In eager mode
    [n_docs + 1] offsets; under torch.compile (no data-dependent shapes)
    always B * L + 1, the documents' starts then B * L repeated (empty
    documents at the end: the same attention), and no length (None)."""
    B, L = documents.shape
    N = B * L
    if N == 0:
        return torch.zeros(2, dtype=torch.int32), 0
    starts = torch.ones(B, L, dtype=torch.bool, device=documents.device)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    starts = starts.reshape(-1)
    if _IS_COMPILING is not None and _IS_COMPILING():
        doc = starts.to(torch.int64).cumsum(0) - 1           # each row's document
        cu = torch.full((N + 1,), N, dtype=torch.int64).scatter_reduce(
            0, doc, torch.arange(N), reduce="amin")
        return cu.to(torch.int32), None
    first = starts.nonzero().reshape(-1)
    cu = torch.cat([first, first.new_tensor([N])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _documents_of(position_ids, B: int, qL: int, kL: int) -> Optional[torch.Tensor]:
    """[B, L] document indices from position_ids that restart inside a row
    (transformers' find_packed_sequence_indices: a position that is not its
    predecessor's + 1 starts a document), for a causal call with no mask
    whose keys are its queries (no cached keys before them); None when the
    positions do not restart (in eager mode: under torch.compile that test
    is data-dependent, and the indices come back whatever they are, as
    transformers' own function does). transformers only packs the mask
    itself without a cache object, and creates a DynamicCache whenever
    use_cache is on (a training forward too): this is where the flash-attn
    backends find the documents then, from position_ids in the attention
    function, and so does tilegrad."""
    if position_ids is None or qL != kL or qL < 2:
        return None
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or \
            position_ids.shape[1] != qL or position_ids.shape[0] not in (1, B) or \
            position_ids.is_floating_point():
        return None
    return _mu.find_packed_sequence_indices(position_ids.expand(B, qL))


def _packed_forward(module, query, key, value, attention_mask, dropout, scaling, causal,
                    sliding_window, softcap, s_aux, kwargs) -> Tuple[torch.Tensor, None]:
    """attention_forward for a packed batch: the rows flattened to
    (B * L, heads, D) and tilegrad.torch.varlen_attention over the
    documents of the collator's cu_seq_lens_q / cu_seq_lens_k, or of the
    int32 document indices from attention_mask()."""
    B, H, qL, D = query.shape
    Hkv, kL = key.shape[1], key.shape[2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    documents = attention_mask
    if cu_q is None and cu_k is None:
        if qL != kL:
            raise ValueError(f'attn_implementation="tilegrad": document indices for {qL} '
                             f"queries but {kL} keys (a packed batch has no cache)")
        cu_q, longest = _cu_seqlens_of(documents)
        cu_k, max_q, max_k = cu_q, longest, longest    # (None under torch.compile)
        causal = True           # the mask interface takes causal packed masks only
    elif cu_q is None or cu_k is None:
        raise ValueError('attn_implementation="tilegrad": cu_seq_lens_q and cu_seq_lens_k go '
                         "together (DataCollatorWithFlattening(return_flash_attn_kwargs=True) "
                         f"gives both); got only {'cu_seq_lens_q' if cu_k is None else 'cu_seq_lens_k'}")
    elif documents is not None:
        # the collator's offsets and position_ids that restart: one packing, said twice
        mine, _ = _cu_seqlens_of(documents)
        if not (_IS_COMPILING is not None and _IS_COMPILING()) and not (
                torch.equal(mine, cu_q.to(torch.int32)) and torch.equal(mine, cu_k.to(torch.int32))):
            raise ValueError('attn_implementation="tilegrad": cu_seq_lens_q / cu_seq_lens_k '
                             f"({cu_q.tolist()}) and the documents of position_ids "
                             f"({mine.tolist()}) disagree; transformers' eager and sdpa follow "
                             "position_ids, flash-attn the offsets: pass consistent ones")
    window = None
    if sliding_window is not None:
        if not causal:
            _refuse(f"sliding_window={sliding_window} on a bidirectional layer: the kernels' "
                    "window is causal (one-sided)")
        window = int(sliding_window)
    q = query.transpose(1, 2).reshape(B * qL, H, D)
    k = key.transpose(1, 2).reshape(B * kL, Hkv, D)
    v = value.transpose(1, 2).reshape(B * kL, Hkv, value.shape[-1])
    out = tt.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=dropout,
                              softmax_scale=scaling, causal=causal,
                              window_size=(-1, -1) if window is None else (window - 1, 0),
                              softcap=0.0 if softcap is None else softcap,
                              deterministic=_options["deterministic"], sinks=s_aux,
                              attn_precision=_options["attn_precision"])
    return out.view(B, qL, H, out.shape[-1]), None


# ---------------------------------------------------------------------------
# context parallel: the layers' attention through tilegrad.ring

@dataclasses.dataclass(frozen=True)
class _ContextParallel:
    group: object
    layout: str
    cu_seqlens: Optional[torch.Tensor]
    timeout: Optional[float]


# the context_parallel() block in force in this process (None: none). A plain
# global, not a ContextVar: attention_forward reads it under torch.compile too
# (to stay out of the graph there), which Dynamo cannot do with ContextVar.get
_CP = [None]


@contextlib.contextmanager
def context_parallel(group=None, *, layout: str = "contiguous",
                     cu_seqlens: Optional[torch.Tensor] = None,
                     timeout: Optional[float] = None):
    """Context parallelism for models with ``attn_implementation="tilegrad"``:
    inside the block, every attention layer runs
    :func:`tilegrad.ring.ring_attention` over ``group`` (default: the
    world), so each rank's forward sees only its chunk of the sequence and
    its attention still covers the whole of it.

    Every rank of the group runs the same model on its own rows (same
    weights, same calls), with ``position_ids`` the rows' global positions
    (with ``cu_seqlens``: their places in their documents) and, for the
    loss, labels shifted over the whole sequence:
    :func:`context_parallel_inputs` shards a batch so. ``layout`` as
    ring_attention's (``"zigzag"`` balances causal work); ``cu_seqlens``:
    the whole sequence's packed documents (int32 offsets, B = 1, the same
    on every rank), the documents of the local position_ids being those of
    a chunk, not of the sequence; ``timeout`` as ring_attention's. The
    position_ids each layer is given are checked against the layout on
    every call (a model fed local positions 0..L_r-1 raises ValueError on
    every rank). The layers around attention are per token; their
    parameters' gradients on a rank are its tokens' part: sum them over the
    group (``all_reduce``; DDP over the group averages, so scale the loss
    by the group's size there). Refused (NotImplementedError on the rank
    that has it, RuntimeError naming it on the others, all before the ring
    sends anything):
    a padding or 4-D mask, the collator's ``cu_seq_lens_*`` keywords, keys
    from a cache (generation), dropout, a value head dim other than D.
    Under torch.compile the attention calls are not traced: Dynamo breaks
    the graph there and runs them eagerly (``fullgraph=True`` fails).
    Blocks do not nest; the setting is the process's."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("context_parallel needs torch.distributed: call "
                           "torch.distributed.init_process_group('gloo') first")
    _ring._layout_arg(layout)
    if cu_seqlens is not None:
        _ring._cu_seqlens_arg(cu_seqlens, 1)
    if timeout is not None:
        _ring._timeout_arg(timeout)
    if _CP[0] is not None:
        raise RuntimeError("context_parallel blocks do not nest")
    _CP[0] = _ContextParallel(group, layout, cu_seqlens, timeout)
    try:
        yield
    finally:
        _CP[0] = None


def context_parallel_inputs(input_ids: torch.Tensor, labels: Optional[torch.Tensor] = None, *,
                            group=None, layout: str = "contiguous",
                            cu_seqlens: Optional[torch.Tensor] = None,
                            ignore_index: int = -100) -> Dict[str, torch.Tensor]:
    """This rank's keyword arguments of a causal LM's forward under
    :func:`context_parallel`, from the whole batch ``input_ids [B, S]`` (and
    ``labels [B, S]``, the model's usual labels: unshifted): ``input_ids``
    and ``position_ids`` of the rank's rows (:func:`tilegrad.ring.ring_shard`
    by ``layout``; positions global, or with ``cu_seqlens`` within each
    document) and, with labels, ``labels`` and ``shift_labels`` (the labels
    shifted over the whole sequence, then sharded: a chunk's last row
    predicts the next rank's first token) and ``num_items_in_batch`` (the
    whole batch's count of labelled tokens, so each rank's loss is its part
    of the global mean: the ranks' losses sum to it). With packed
    documents, set the first label of every document to ``ignore_index``
    (as transformers' DataCollatorWithFlattening does) so no document
    predicts the next one."""
    import torch.distributed as dist
    rank, N = dist.get_rank(group), dist.get_world_size(group)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids [B, S] expected, got {tuple(input_ids.shape)}")
    cu = _ring._cu_seqlens_arg(cu_seqlens, input_ids.shape[0])
    S = input_ids.shape[1]
    if cu is not None and cu[-1] != S:
        raise ValueError(f"cu_seqlens[-1] = {cu[-1]} must be the sequence length {S}")
    pos = _ring.ring_positions(S, N, rank, layout)
    out = {"input_ids": input_ids[:, pos],
           "position_ids": _ring._doc_positions(pos, cu).unsqueeze(0).to(input_ids.device)}
    if labels is not None:
        if tuple(labels.shape) != tuple(input_ids.shape):
            raise ValueError(f"labels {tuple(labels.shape)} must have input_ids' shape "
                             f"{tuple(input_ids.shape)}")
        shift = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index)
        out["labels"] = out["shift_labels"] = shift[:, pos]
        out["num_items_in_batch"] = (shift != ignore_index).sum()
    return out


def _context_parallel_forward(cp, module, query, key, value, attention_mask, dropout, scaling,
                              causal, sliding_window, softcap, s_aux, kwargs):
    """attention_forward inside a context_parallel() block: ring_attention
    over the block's group on this rank's rows."""
    if _IS_COMPILING is not None and _IS_COMPILING():
        # not traced: Dynamo breaks the graph at this raise and runs the call
        # eagerly, where it takes the ring (fullgraph=True reports it)
        _refuse("context_parallel under torch.compile (the ring's messages are Python "
                "around the kernels)")
    why = None
    if _is_block_mask(attention_mask) or attention_mask is not None and not (
            attention_mask.dim() == 2 and attention_mask.dtype == torch.int32):
        # int32 document indices are the chunk's, found in its position_ids
        why = ("a padding or 4-D attention mask (the ring takes causal, a sliding window "
               "and context_parallel(cu_seqlens=)'s documents)")
    elif kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        why = ("the collator's cu_seq_lens_q / cu_seq_lens_k (a chunk's offsets): give the "
               "whole sequence's as context_parallel(cu_seqlens=)")
    elif query.shape[2] != key.shape[2]:
        why = (f"{key.shape[2]} keys for {query.shape[2]} queries (keys from a cache: "
               "generation is not context parallel)")
    elif sliding_window is not None and not causal:
        why = f"sliding_window={sliding_window} on a bidirectional layer"
    dtype = query.dtype
    q, k, v = query, key, value
    if dtype == torch.float16:          # widened, as tilegrad.torch.attention does
        q, k, v = q.float(), k.float(), v.float()
    plan, sinks = _ring._plan(q, k, v, causal, scaling, softcap, cp.group, cp.layout, dropout,
                              None, _options["deterministic"], _options["attn_precision"],
                              sliding_window, s_aux, cp.timeout, cp.cu_seqlens,
                              kwargs.get("position_ids"),
                              None if why is None else f'attn_implementation="tilegrad": '
                              f"context_parallel: {why}; {_REFUSED}")
    out = _ring._RingAttention.apply(q, k, v, sinks, plan)
    return out.to(dtype).transpose(1, 2).contiguous(), None


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                      **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention function on :func:`tilegrad.torch.attention`.

    query ``[B, H, qL, D]``, key ``[B, H_kv, kL, D]``, value
    ``[B, H_kv, kL, Dv]`` (strided views are read in place; GQA and
    Dv != D natively, K/V never repeated). attention_mask:

    * ``None``: causal (``is_causal``, else ``module.is_causal``) with the
      layer's ``sliding_window`` W (key k seen by query i iff
      ``i - W < k <= i``, positions bottom-right aligned), or no mask for a
      bidirectional layer;
    * 2-D bool ``[B, kL]`` (True = attend, from :func:`attention_mask`): the
      same plus this padding, as a ``[B, 1, 1, kL]`` broadcast mask;
    * 2-D int32 ``[B, kL]`` (from :func:`attention_mask` for a packed
      batch): each token's document; the documents, causal, run through
      :func:`tilegrad.torch.varlen_attention` (the rows flattened);
    * 4-D ``[B or 1, 1 or H, qL, kL]`` bool or additive: the whole mask
      (causal limit and window included, as for ``"sdpa"``).

    With no mask, ``position_ids`` that restart inside a row (a packed
    batch run with a cache object, where transformers builds no packed
    mask: see :func:`_documents_of`) give the documents as the indices do.
    ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (``DataCollatorWithFlattening(
    return_flash_attn_kwargs=True)``'s, with ``max_length_q`` /
    ``max_length_k``) also take the varlen path, the causal flag and window
    from the layer, as flash-attn's backends do; with document indices
    beside them the two must agree, with a padding mask they are refused,
    and a 4-D mask (what transformers builds from restarting position_ids
    under torch.compile) is used in their place, as eager and sdpa do.

    ``dropout`` (non-zero in training mode only; the models pass 0.0 in
    eval) drops attention weights in the kernels, ``scaling`` (default
    ``D**-0.5``), ``softcap`` (``c*tanh(s/c)``) and gpt-oss's ``s_aux``
    sinks (``[H]``, with gradient) go to the kernels' arguments. Returns
    ``(attn_output [B, qL, H, Dv] contiguous, None)``."""
    _need_supported(query, key, value, attention_mask, dict(kwargs, s_aux=s_aux))
    if _CP[0] is not None:              # context_parallel(): the ring over the block's group
        return _context_parallel_forward(
            _CP[0], module, query, key, value, attention_mask, dropout, scaling,
            bool(getattr(module, "is_causal", True) if is_causal is None else is_causal),
            sliding_window, softcap, s_aux, kwargs)
    if _is_block_mask(attention_mask):  # the whole mask, as a 4-D one is: its blocks only
        if dropout:
            _refuse(f"dropout {dropout} with a flex BlockMask: tilegrad's flex_attention has "
                    "no dropout (train with attention_dropout 0 or a tensor mask)")
        out = tt.flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                                enable_gqa=True, softcap=softcap,
                                attn_precision=_options["attn_precision"],
                                deterministic=_options["deterministic"])
        return out.transpose(1, 2).contiguous(), None
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    B, kL = key.shape[0], key.shape[2]
    offsets = kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None
    documents = attention_mask is not None and attention_mask.dim() == 2 and \
        attention_mask.dtype == torch.int32
    if offsets and attention_mask is not None and attention_mask.dim() == 2 and not documents:
        _refuse("cu_seq_lens_q / cu_seq_lens_k together with a padding mask: a packed batch "
                "has no padding (pass the collator's keywords without an attention_mask)")
    if not documents and not offsets and attention_mask is None:
        found = _documents_of(kwargs.get("position_ids"), B, query.shape[2], kL)
        if found is not None:
            attention_mask, documents = found.to(torch.int32), True
    if documents or (offsets and attention_mask is None):
        return _packed_forward(module, query, key, value, attention_mask if documents else None,
                               dropout, scaling, causal, sliding_window, softcap, s_aux, kwargs)
    mask, window = attention_mask, None
    if attention_mask is None or attention_mask.dim() == 2:
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, kL) or attention_mask.dtype != torch.bool:
                raise ValueError(
                    f'attn_implementation="tilegrad": a 2-D attention_mask is the bool [B, kL] '
                    f"= {(B, kL)} padding mask (or the int32 document indices) of the tilegrad "
                    f"mask interface; got {attention_mask.dtype} "
                    f"{tuple(attention_mask.shape)}")
            mask = attention_mask.view(B, 1, 1, kL)
        if sliding_window is not None:
            if not causal:
                _refuse(f"sliding_window={sliding_window} on a bidirectional layer with no "
                        "mask: the kernels' window is causal (one-sided)")
            window = int(sliding_window)
    else:
        causal = False          # a 4-D mask holds the causal limit and the window
    out = tt.attention(query, key, value, mask=mask, causal=causal, scale=scaling,
                       softcap=softcap, dropout_p=dropout, window=window, sinks=s_aux,
                       attn_precision=_options["attn_precision"],
                       deterministic=_options["deterministic"])
    return out.transpose(1, 2).contiguous(), None


def _native_window(local_size: Optional[int], config) -> Optional[int]:
    """The sliding window W when a mask request with ``local_size`` comes from
    ``create_sliding_window_causal_mask`` (the config's ``sliding_window``,
    not a chunked-attention ``attention_chunk_size``); None otherwise."""
    if config is None or getattr(config, "sliding_window", None) != local_size:
        return None
    if getattr(config, "attention_chunk_size", None) is not None:
        return None
    return local_size


def _closure(fn) -> Dict[str, object]:
    """{free variable: value} of a closure (empty for anything else)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells)))


def _made_by(fn, factory: str) -> bool:
    """Is fn the inner function of masking_utils' ``factory``?"""
    return getattr(fn, "__module__", None) == _mu.__name__ and \
        getattr(fn, "__qualname__", "").startswith(factory + ".<locals>.")


def _two_masks(fn) -> Optional[tuple]:
    """The two mask functions of ``and_masks(a, b)``, else None."""
    if not _made_by(fn, "and_masks"):
        return None
    parts = _closure(fn).get("mask_functions")
    return parts if isinstance(parts, tuple) and len(parts) == 2 else None


def _packed_documents(mask_function, local_size: Optional[int], config) -> Optional[torch.Tensor]:
    """The ``[B, L]`` document indices of transformers' packed-sequence mask
    -- ``and_masks(causal_mask_function, packed_sequence_mask_function(ids))``
    or, with the config's sliding window W, ``and_masks(and_masks(
    sliding_window_overlay(W), causal_mask_function), packed...(ids))``, as
    create_causal_mask / create_sliding_window_causal_mask build it from
    position_ids (find_packed_sequence_indices) -- else None. Read from the
    functions' closures (eager only: Dynamo cannot trace them)."""
    parts = _two_masks(mask_function)
    if parts is None or not _made_by(parts[1], "packed_sequence_mask_function"):
        return None
    base, ids = parts[0], _closure(parts[1]).get("packed_sequence_mask")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    if local_size is None:
        return ids if base is _mu.causal_mask_function else None
    window = _two_masks(base)
    if _native_window(local_size, config) is None or window is None or \
            window[1] is not _mu.causal_mask_function or \
            not _made_by(window[0], "sliding_window_overlay") or \
            _closure(window[0]).get("sliding_window") != local_size:
        return None
    return ids


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                   mask_function=None, attention_mask: Optional[torch.Tensor] = None,
                   local_size: Optional[int] = None, allow_is_causal_skip: bool = True,
                   config=None, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask interface for ``"tilegrad"``: ``None`` or a 2-D bool
    ``[B, kL]`` padding mask (True = attend) for a plain causal or
    sliding-window causal mask whose queries are bottom-right aligned with
    the keys (``q_offset - kv_offset == kv_length - q_length``: no cache, a
    dynamic cache, a dynamic sliding-window cache); the 2-D int32 ``[B, L]``
    document index of each token for a packed batch's causal (or
    sliding-window causal) mask, in eager mode; else the dense
    ``[B, 1, qL, kL]`` bool mask of transformers' ``sdpa_mask``."""
    if mask_function is None:
        mask_function = _mu.causal_mask_function
    if (attention_mask is None and isinstance(q_offset, int) and isinstance(kv_offset, int)
            and q_offset == kv_offset == 0 and q_length == kv_length
            and not (_IS_COMPILING is not None and _IS_COMPILING())):
        documents = _packed_documents(mask_function, local_size, config)
        if documents is not None and tuple(documents.shape) == (batch_size, q_length):
            return documents.to(torch.int32)
    native = (allow_is_causal_skip and isinstance(q_offset, int)
              and isinstance(kv_offset, int)
              and q_offset - kv_offset == kv_length - q_length
              and (mask_function is _mu.causal_mask_function if local_size is None
                   else _native_window(local_size, config) is not None))
    if not native:
        kwargs.pop("allow_is_bidirectional_skip", None)
        return _mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                             q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                             attention_mask=attention_mask, local_size=local_size,
                             allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                             **kwargs)
    if attention_mask is None:
        return None
    # attention_mask: bool [B, >= kv_offset + kv_length] over absolute key
    # positions (right-padded with False when shorter, as sdpa_mask does)
    padding = _mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
    padding = padding[:, kv_offset:kv_offset + kv_length]
    if not _mu.is_tracing(padding) and bool(padding.all()):
        return None             # no padding: skip the mask (eager only; compile keeps it)
    return padding


# ---------------------------------------------------------------------------
# RMSNorm

#: RMSNorm classes of the supported families -> (their weight's form, eps attribute):
#: "w": y = w * x / rms(x); "1+w" (Gemma): y = (1 + w) * x / rms(x)
_RMS_NORMS = {
    "LlamaRMSNorm": ("w", "variance_epsilon"),
    "MistralRMSNorm": ("w", "variance_epsilon"),
    "Qwen2RMSNorm": ("w", "variance_epsilon"),
    "Qwen3RMSNorm": ("w", "variance_epsilon"),
    "DeepseekV3RMSNorm": ("w", "variance_epsilon"),
    "GptOssRMSNorm": ("w", "variance_epsilon"),
    "Gemma2RMSNorm": ("1+w", "eps"),
    "Gemma3RMSNorm": ("1+w", "eps"),
}


class TilegradRMSNorm(torch.nn.Module):
    """A transformers RMSNorm on :func:`tilegrad.torch.rms_norm`, holding the
    original module's weight Parameter (same state-dict key): the scale is
    ``weight`` or, for Gemma's ``"1+w"`` form, ``1 + weight`` (computed in
    float32 and differentiated through autograd). The whole norm runs in
    float32 and is rounded once to the output dtype (the input's, or the
    promotion of input and weight for the ``"w"`` form, as the originals)."""

    def __init__(self, weight: torch.nn.Parameter, eps: float, form: str):
        super().__init__()
        if form not in ("w", "1+w"):
            raise ValueError(f'form must be "w" or "1+w", got {form!r}')
        self.weight, self.eps, self.form = weight, float(eps), form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float()
        if self.form == "1+w":
            w = 1.0 + w
            out_dtype = x.dtype
        else:
            out_dtype = torch.promote_types(x.dtype, self.weight.dtype)
        return tt.rms_norm(x.float(), w, self.eps).to(out_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, form={self.form!r}"


def use_tilegrad_rms_norm(model: torch.nn.Module) -> int:
    """Replace every RMSNorm module of the supported families in ``model``
    (Llama, Mistral, Qwen2, Qwen3, DeepSeek-V3, gpt-oss: ``w * x/rms(x)``;
    Gemma 2/3: ``(1 + w) * x/rms(x)``) by a :class:`TilegradRMSNorm` with the
    same weight and eps -> the number replaced. Other norm classes are left
    as they are. The math is the same; in bfloat16 the result is rounded
    once (from float32) where Llama-style norms round twice."""
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            spec = _RMS_NORMS.get(type(child).__name__)
            if spec is not None:
                form, eps_attr = spec
                swaps.append((parent, name, TilegradRMSNorm(child.weight,
                                                            getattr(child, eps_attr), form)))
    for parent, name, new in swaps:
        setattr(parent, name, new)
    return len(swaps)


# ---------------------------------------------------------------------------
# the step's other kernels in one call

#: model_type -> the kernels use_tilegrad_kernels can put into that family.
#: "rope": its modeling module's apply_rotary_pos_emb is the rotate-half one
#: over the first cos.shape[-1] features (Phi slices q and k before it, Phi-3
#: inside it); "swiglu"/"geglu": MLPs act(gate_proj(x)) * up_proj(x) (Phi-3:
#: one gate_up_proj, gate first); "fused_linear_cross_entropy": the causal LM
#: head is lm_head(hidden) (+ Gemma's final_logit_softcapping) and its loss
#: transformers' ForCausalLMLoss. Granite (logits_scaling) and Cohere
#: (logit_scale) scale their logits in the forward and are not listed.
_STEP_FAMILIES = {
    "llama": {"rope", "swiglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "mistral": {"rope", "swiglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "qwen2": {"rope", "swiglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "qwen3": {"rope", "swiglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "olmo2": {"rope", "swiglu", "fused_linear_cross_entropy", "linear"},
    "gemma2": {"rope", "geglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "gemma3_text": {"rope", "geglu", "rms_norm", "fused_linear_cross_entropy", "linear"},
    "phi": {"rope", "fused_linear_cross_entropy", "linear"},
    "phi3": {"rope", "swiglu", "fused_linear_cross_entropy", "linear"},
    # encoders: LayerNorm, an ungated erf GELU, absolute positions, a small
    # classification head: only the linear layers (attention: attn_implementation)
    "bert": {"linear"},
    "roberta": {"linear"},
}

#: the linear layers use_tilegrad_kernels(linear=True) turns into tt.Linear
_PLAIN_LINEARS = (torch.nn.Linear, tt.Linear)

#: MLP activations by class name -> the gated unit they make
_GLU_ACTS = {"SiLUActivation": "swiglu", "SiLU": "swiglu", "GELUTanh": "geglu",
             "PytorchGELUTanh": "geglu"}

# the kernels in force inside a patched model's forward: the rotary step is
# a module-level function of each modeling file, so it is patched there once
# and reads this at every call (models of the same family that were not
# patched, in the same process, keep transformers' own)
_STEP_KERNELS = contextvars.ContextVar("tilegrad_step_kernels", default=frozenset())
_ROPE_ORIGINALS: Dict[str, object] = {}


def _rope_dispatcher(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        # under torch.compile transformers' own (Dynamo cannot trace
        # ContextVar.get, and an unpatched model of the family must compile)
        if (_IS_COMPILING is not None and _IS_COMPILING()) or "rope" not in _STEP_KERNELS.get():
            return original(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        return tt.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    apply_rotary_pos_emb.__tilegrad_original__ = original
    return apply_rotary_pos_emb


def _use_rope(model: torch.nn.Module) -> int:
    """Patch the rotary function of every modeling module that ``model``'s
    attention layers come from -> the number of attention layers it serves."""
    n = 0
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        f = getattr(mod, "apply_rotary_pos_emb", None)
        if f is None or not type(m).__name__.endswith("Attention"):
            continue
        if not hasattr(f, "__tilegrad_original__"):
            _ROPE_ORIGINALS[mod.__name__] = f
            mod.apply_rotary_pos_emb = _rope_dispatcher(f)
        n += 1
    return n


def _glu_forward(kind: str, fused: bool):
    """The gated MLP's forward on the fused unit. A plain nn.Linear
    down_proj runs with it as tt.glu_linear (the product formed again in
    the backward, not kept); any other module there (an adapter, a
    quantized layer, hooks) is called as it is, on tt.swiglu / tt.geglu."""
    glu = tt.swiglu if kind == "swiglu" else tt.geglu
    act = "silu" if kind == "swiglu" else "gelu_tanh"

    def down(self, gate, up):
        d = self.down_proj
        if type(d) in _PLAIN_LINEARS and not (d._forward_hooks or d._forward_pre_hooks):
            return tt.glu_linear(gate, up, d.weight, d.bias, act=act)
        return d(glu(gate, up))
    if fused:   # Phi-3: gate_up_proj(x) = [gate | up]
        def forward(self, hidden_states):
            gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
            return down(self, gate, up)
    else:
        def forward(self, x):
            return down(self, self.gate_proj(x), self.up_proj(x))
    return forward


def _use_glu(model: torch.nn.Module, kinds) -> Dict[str, int]:
    """Give every gated MLP whose activation makes one of ``kinds`` a forward
    on tilegrad's fused unit (the module, its weights and its state-dict
    keys stay) -> {kind: count}."""
    counts = {k: 0 for k in kinds}
    for m in model.modules():
        fused = hasattr(m, "gate_up_proj")
        if not (hasattr(m, "down_proj") and (fused or hasattr(m, "gate_proj"))):
            continue
        act = getattr(m, "act_fn", getattr(m, "activation_fn", None))
        kind = _GLU_ACTS.get(type(act).__name__)
        if kind in counts:
            m.forward = _glu_forward(kind, fused).__get__(m)
            counts[kind] += 1
    return counts


def _use_linear(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` (the type itself, not a
    subclass: a quantized or adapted layer keeps its own) a
    :class:`tilegrad.torch.Linear`, in place -> the number made."""
    n = 0
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            m.__class__ = tt.Linear
            n += 1
    return n


def _output_without_logits(out, loss):
    """``out`` (a ModelOutput dataclass) with ``loss`` and no logits."""
    fields = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    fields.update(loss=loss, logits=None)
    return type(out)(**fields)


def _step_forward(model: torch.nn.Module, original, kernels: frozenset):
    """model.forward with ``kernels`` in force; with labels and the fused
    loss, the base model's last hidden state goes to
    :func:`tilegrad.torch.causal_lm_loss` and no logits are formed
    (``logits_to_keep`` asks lm_head for none)."""
    sig = inspect.signature(original)
    var_kw = next((n for n, p in sig.parameters.items() if p.kind is p.VAR_KEYWORD), None)
    fused_loss = "fused_linear_cross_entropy" in kernels
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        token = _STEP_KERNELS.set(kernels)
        try:
            bound = sig.bind(*args, **kwargs)
            labels = bound.arguments.get("labels")
            if not fused_loss or labels is None:
                return original(*args, **kwargs)
            extra = dict(bound.arguments.get(var_kw, {})) if var_kw else {}
            bound.arguments["labels"] = None
            bound.arguments["logits_to_keep"] = slice(0, 0)
            hidden = []
            hook = base.register_forward_hook(lambda _m, _i, o: hidden.append(
                o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0]))
            try:
                out = original(*bound.args, **bound.kwargs)
            finally:
                hook.remove()
            head = model.get_output_embeddings()
            loss = tt.causal_lm_loss(
                hidden[-1], head.weight, labels, bias=head.bias,
                num_items_in_batch=extra.get("num_items_in_batch"),
                ignore_index=extra.get("ignore_index", -100),
                shift_labels=extra.get("shift_labels"),
                softcap=getattr(model.config, "final_logit_softcapping", None))
            return _output_without_logits(out, loss)
        finally:
            _STEP_KERNELS.reset(token)
    forward.__tilegrad_original__ = original
    return forward


def use_tilegrad_kernels(model: torch.nn.Module, *, rope: bool = True,
                         cross_entropy: bool = False,
                         fused_linear_cross_entropy: bool = True, rms_norm: bool = True,
                         swiglu: bool = True, geglu: bool = True,
                         linear: bool = True) -> Dict[str, int]:
    """Put tilegrad's step kernels into ``model`` (a transformers model of a
    family in ``_STEP_FAMILIES``), the way Liger's
    ``apply_liger_kernel_to_llama(rope, cross_entropy,
    fused_linear_cross_entropy, rms_norm, swiglu, model)`` does on GPUs ->
    ``{kernel: places replaced}``, only the kernels asked for and present.

    * ``rope``: :func:`tilegrad.torch.apply_rotary_pos_emb` in every
      attention layer (rotate-half; partial rotary where cos is narrower
      than the head, as Phi and Phi-3);
    * ``swiglu`` / ``geglu``: the gated MLPs on :func:`tilegrad.torch.swiglu`
      / :func:`~tilegrad.torch.geglu` (one pass, rounded once);
    * ``rms_norm``: :func:`use_tilegrad_rms_norm`;
    * ``fused_linear_cross_entropy``: ``model(..., labels=...)`` computes
      the LM head and transformers' causal-LM loss in chunks of tokens
      (:func:`tilegrad.torch.causal_lm_loss`: the label shift,
      ``ignore_index``, ``num_items_in_batch``, Gemma's final softcap, tied
      embeddings, a bias) and returns ``logits=None``; without labels the
      forward is transformers' own;
    * ``linear``: every plain ``nn.Linear`` becomes a
      :class:`tilegrad.torch.Linear` (no bf16 weight copies kept for the
      backward under autocast, one input cast shared by q, k and v and by
      gate and up: the same bits). Not one of Liger's arguments: its
      kernels keep bf16 weights on the GPU.

    Modules and weights stay (same state dict); the rotary and loss kernels
    are in force inside this model's own ``forward`` only, so other models
    in the process are unaffected (a submodule called on its own, or a
    checkpoint recomputed in the backward, or any model under torch.compile,
    runs transformers' rotary step: the same math). ``cross_entropy=True`` (a loss over logits that exist
    whole) is refused: the fused loss is the one that saves their memory.
    A family not listed is refused by name; a kernel asked for that the
    family has no place for (``swiglu`` in Gemma, whose MLP is GeGLU; any
    of them in BERT) is left out of the result, and an MLP whose activation
    is neither SiLU nor tanh-GELU keeps its own forward."""
    if cross_entropy:
        raise NotImplementedError(
            "use_tilegrad_kernels: cross_entropy=True (a loss over whole [T, V] logits) is "
            "not offered; fused_linear_cross_entropy=True computes the same loss without them")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    fits = _STEP_FAMILIES.get(model_type)
    if fits is None:
        raise NotImplementedError(
            f"use_tilegrad_kernels: model_type {model_type!r} ({type(model).__name__}) is not "
            f"one of the families it knows: {sorted(_STEP_FAMILIES)}")
    asked = {k for k, on in (("rope", rope), ("swiglu", swiglu), ("geglu", geglu),
                             ("rms_norm", rms_norm), ("linear", linear),
                             ("fused_linear_cross_entropy", fused_linear_cross_entropy)) if on}
    todo = asked & fits
    if getattr(model, "_tilegrad_kernels", None) is not None:
        raise RuntimeError("use_tilegrad_kernels: this model has them already "
                           f"({sorted(model._tilegrad_kernels)})")
    if "fused_linear_cross_entropy" in todo and (
            "logits_to_keep" not in inspect.signature(model.forward).parameters
            or model.get_output_embeddings() is None):
        raise NotImplementedError(
            f"use_tilegrad_kernels: {type(model).__name__} is not a causal LM with an "
            "lm_head and logits_to_keep; pass fused_linear_cross_entropy=False")
    done = {}
    if "rope" in todo:
        done["rope"] = _use_rope(model)
    glu = {k for k in ("swiglu", "geglu") if k in todo}
    if glu:
        done.update(_use_glu(model, glu))
    if "rms_norm" in todo:
        done["rms_norm"] = use_tilegrad_rms_norm(model)
    if "linear" in todo:
        done["linear"] = _use_linear(model)
    kernels = frozenset(k for k in todo if k in ("rope", "fused_linear_cross_entropy"))
    if kernels:
        model.forward = _step_forward(model, model.forward, kernels)
        if "fused_linear_cross_entropy" in kernels:
            done["fused_linear_cross_entropy"] = 1
    model._tilegrad_kernels = frozenset(done)
    return done


# ---------------------------------------------------------------------------

def register(*, attn_precision: str = "exact", deterministic: bool = False) -> None:
    """Register ``"tilegrad"`` with ``transformers.AttentionInterface`` and
    ``transformers.AttentionMaskInterface`` (again: the same functions, the
    options updated). ``attn_precision`` ("exact", "split", "bf16": how the
    bf16 kernels multiply by P and dS) and ``deterministic`` apply to every
    later call of :func:`attention_forward`."""
    tt._attn_precision_arg(attn_precision)
    _options.update(attn_precision=attn_precision, deterministic=bool(deterministic))
    AttentionInterface.register(NAME, attention_forward)
    _mu.AttentionMaskInterface.register(NAME, attention_mask)


register()
