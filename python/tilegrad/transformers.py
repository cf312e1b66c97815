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
  ``sliding_window``). Every other mask (packed sequences, or/and mask
  functions, a static cache, bidirectional patterns) is built dense by
  transformers' ``sdpa_mask`` and passed to the kernels as a mask.

What the kernels cannot do is refused with an error naming the reason and
the alternative (``attn_implementation="sdpa"`` or ``"eager"``), never
computed another way: tensors off the CPU, float64, head dims that are not
multiples of 8 in [8, 512], ``output_attentions=True`` (the weights are
never formed), a ``position_bias``, a flex ``BlockMask``, a sliding window
on a bidirectional layer without a mask.

:func:`use_tilegrad_rms_norm` (off unless called) swaps the RMSNorm modules
of the supported families for tilegrad's ``rms_norm`` op.
"""
from typing import Optional, Tuple

import torch
from transformers import AttentionInterface
from transformers import masking_utils as _mu

from . import torch as tt

__all__ = ["register", "attention_forward", "attention_mask", "use_tilegrad_rms_norm",
           "TilegradRMSNorm", "NAME"]

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
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        _refuse(f"attention_mask of type {type(attention_mask).__name__} (a flex "
                "BlockMask?): the kernels take no mask, a 2-D padding mask or a 4-D tensor")
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        _refuse(f"attention_mask of shape {tuple(attention_mask.shape)}: the kernels take a "
                "2-D [B, kL] padding mask or a 4-D mask broadcastable to [B, H, qL, kL]")


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
    * 4-D ``[B or 1, 1 or H, qL, kL]`` bool or additive: the whole mask
      (causal limit and window included, as for ``"sdpa"``).

    ``dropout`` (non-zero in training mode only; the models pass 0.0 in
    eval) drops attention weights in the kernels, ``scaling`` (default
    ``D**-0.5``), ``softcap`` (``c*tanh(s/c)``) and gpt-oss's ``s_aux``
    sinks (``[H]``, with gradient) go to the kernels' arguments. Returns
    ``(attn_output [B, qL, H, Dv] contiguous, None)``."""
    _need_supported(query, key, value, attention_mask, kwargs)
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    B, kL = key.shape[0], key.shape[2]
    mask, window = attention_mask, None
    if attention_mask is None or attention_mask.dim() == 2:
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, kL) or attention_mask.dtype != torch.bool:
                raise ValueError(
                    f'attn_implementation="tilegrad": a 2-D attention_mask is the bool [B, kL] '
                    f"= {(B, kL)} padding mask of the tilegrad mask interface; got "
                    f"{attention_mask.dtype} {tuple(attention_mask.shape)}")
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


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                   mask_function=None, attention_mask: Optional[torch.Tensor] = None,
                   local_size: Optional[int] = None, allow_is_causal_skip: bool = True,
                   config=None, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask interface for ``"tilegrad"``: ``None`` or a 2-D bool
    ``[B, kL]`` padding mask (True = attend) for a plain causal or
    sliding-window causal mask whose queries are bottom-right aligned with
    the keys (``q_offset - kv_offset == kv_length - q_length``: no cache, a
    dynamic cache, a dynamic sliding-window cache); else the dense
    ``[B, 1, qL, kL]`` bool mask of transformers' ``sdpa_mask``."""
    if mask_function is None:
        mask_function = _mu.causal_mask_function
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
