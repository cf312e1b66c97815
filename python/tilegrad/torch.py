"""PyTorch autograd wrappers and nn.Module drop-ins (CPU tensors).

* :func:`attention` -- FA-2 attention: forward ``tg_flash_attn_train_fwd_bf16``
  (O and the logsumexp L), backward ``compute_d`` + ``tg_flash_attn_train_bwd_bf16``
  + ``tg_f32_to_bf16_cast``. bf16 math; inputs of another float dtype are
  cast to bf16 (and the output back) through autograd. GQA, causal
  (bottom-right aligned), additive / boolean mask, scale, softcap.
* :func:`scaled_dot_product_attention` -- the same kernels behind the
  signature and semantics of ``torch.nn.functional.scaled_dot_product_attention``
  (causal top-left aligned, ``enable_gqa``, no dropout).
* :func:`rms_norm` -- RMSNorm: forward ``tg_rms_norm_forward_f32`` (keeps r),
  backward ``tg_rms_norm_backward_dx_f32`` / ``_dw_f32`` with that r. f32 math.
* Modules: :class:`RMSNorm`, :class:`Attention`, :class:`MultiHeadAttention`.

Works with PyTorch 1.13 (Debian's python3-torch) and 2.x. Every function takes
``ctx=`` (a :class:`tilegrad.Context`; default: the calling thread's
default context, also for the backward pass). Kernel errors raise
:class:`tilegrad.TilegradError` subclasses.

Differences from PyTorch worth knowing: a query row that sees no key (fully
masked) gives output 0 and zero gradients, where PyTorch gives NaN; the mask
receives no gradient; double backward is not supported.
"""
import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import kernels as _k
from .capi import default_context

__all__ = ["attention", "scaled_dot_product_attention", "rms_norm", "RMSNorm", "Attention",
           "MultiHeadAttention", "FlashAttentionFunction", "RMSNormFunction"]


# ---------------------------------------------------------------------------
# tensor <-> numpy (no copies)

def _bits(t):
    """bf16 CPU tensor -> numpy uint16 view sharing memory (strides kept)."""
    return t.detach().view(torch.int16).numpy().view(np.uint16)


def _from_bits(a):
    """numpy uint16 bf16 bits -> bf16 tensor sharing memory."""
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


def _f32(t):
    """f32 CPU tensor -> C-contiguous float32 numpy array (view when possible)."""
    return t.detach().to(torch.float32).contiguous().numpy()


def _check_cpu(*ts):
    for t in ts:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"tilegrad runs on the CPU; got a tensor on {t.device}")


def _mask_np(mask):
    """torch mask -> numpy (bool kept; bf16 as raw bits; floats as float32)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        return np.asarray(mask)
    _check_cpu(mask)
    m = mask.detach()
    if m.dtype == torch.bool:
        return m.numpy()
    if m.dtype == torch.bfloat16:
        return _bits(m)
    if m.is_floating_point():
        return m.to(torch.float32).numpy()
    raise TypeError(f"attention mask must be bool or floating point, got {m.dtype}")


def _inner_contig(t):
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


# ---------------------------------------------------------------------------
# attention

class FlashAttentionFunction(torch.autograd.Function):
    """``apply(q, k, v, mask_np, causal, scale, softcap, q_offset, ctx)`` on
    bf16 CPU tensors ``[B, H, qL, D]`` / ``[B, H_kv, kL, D]``; returns O bf16.
    ``mask_np`` is a numpy mask as :func:`tilegrad.flash_attn_train_fwd`
    takes it (constant; no gradient). Prefer :func:`attention`."""

    @staticmethod
    def forward(fctx, q, k, v, mask_np, causal, scale, softcap, q_offset, tg_ctx):
        kw = dict(mask=mask_np, causal=causal, scale=scale, softcap=softcap,
                  q_offset=q_offset, ctx=tg_ctx)
        o, lse = _k.flash_attn_train_fwd(_bits(q), _bits(k), _bits(v), **kw)
        O = _from_bits(o)
        fctx.save_for_backward(q, k, v, O, torch.from_numpy(lse))
        fctx.kw = kw
        return O

    @staticmethod
    @once_differentiable
    def backward(fctx, dO):
        q, k, v, O, L = fctx.saved_tensors
        if dO.dtype != torch.bfloat16:
            dO = dO.to(torch.bfloat16)
        dO = _inner_contig(dO)
        kw = dict(fctx.kw)
        if kw["ctx"] is None:
            kw["ctx"] = default_context()
        dq, dk, dv = _k.flash_attn_backward(_bits(q), _bits(k), _bits(v), _bits(O), L.numpy(),
                                            _bits(dO), **kw)
        c = kw["ctx"]
        need = fctx.needs_input_grad
        g = [_from_bits(_k.f32_to_bf16_cast(a, ctx=c)) if need[i] else None
             for i, a in enumerate((dq, dk, dv))]
        return g[0], g[1], g[2], None, None, None, None, None, None


def attention(q, k, v, mask=None, causal=False, scale=None, softcap=None, q_offset=None,
              ctx=None):
    """FA-2 attention on the CPU: ``softmax(S) @ v`` with
    ``S = scale * q @ k^T`` (``softcap`` c: ``c*tanh(S/c)``), then the causal
    limit and the additive mask.

    q ``[B, H, qL, D]``; k, v ``[B, H_kv, kL, D]`` with H a multiple of H_kv
    (GQA); D a multiple of 8 up to 512. Any strides with a unit innermost
    stride are used as they are (e.g. ``x.view(B, L, H, D).transpose(1, 2)``).
    mask: bool (True = attend) or additive float/bf16, broadcastable to
    ``[B, H, qL, kL]``. causal: key k visible to query i iff
    ``k <= i + q_offset``, default ``q_offset = kL - qL`` (bottom-right, as
    for a query block at the end of the keys). scale default ``1/sqrt(D)``.

    Computes in bf16 (f32 accumulation); q, k, v of another float dtype are
    cast to bf16 and the output cast back, both through autograd.
    """
    _check_cpu(q, k, v)
    dtype = q.dtype
    if not dtype.is_floating_point:
        raise TypeError(f"attention needs floating point tensors, got {dtype}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("attention takes 4-D [B, heads, L, D] tensors; got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q, k, v = (_inner_contig(t.to(torch.bfloat16)) for t in (q, k, v))
    o = FlashAttentionFunction.apply(q, k, v, _mask_np(mask), bool(causal), scale, softcap,
                                     q_offset, ctx)
    return o if dtype == torch.bfloat16 else o.to(dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, ctx=None):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on
    the tilegrad kernels: same arguments and semantics (``is_causal`` is
    top-left aligned, ``attn_mask`` bool = attend / float = additive,
    ``enable_gqa``), for 3-D ``[N, L, E]`` or 4-D ``[N, H, L, E]`` CPU tensors.
    ``dropout_p`` must be 0. Fully masked rows give 0, not NaN."""
    if dropout_p:
        raise NotImplementedError("tilegrad attention has no dropout (dropout_p must be 0)")
    if is_causal and attn_mask is not None:
        raise ValueError("give either attn_mask or is_causal, not both (as PyTorch)")
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
    if query.dim() != 4:
        raise ValueError(f"expected 3-D or 4-D tensors, got {tuple(query.shape)}")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads, key {key.shape[1]}: "
                         "pass enable_gqa=True for grouped-query attention")
    out = attention(query, key, value, mask=attn_mask, causal=is_causal, scale=scale,
                    q_offset=0 if is_causal else None, ctx=ctx)
    return out.squeeze(1) if squeeze else out


# ---------------------------------------------------------------------------
# RMSNorm

class RMSNormFunction(torch.autograd.Function):
    """``apply(x, weight, eps, ctx)`` on float32 CPU tensors, x ``[..., dim]``,
    weight ``[dim]``. Prefer :func:`rms_norm`."""

    @staticmethod
    def forward(fctx, x, weight, eps, tg_ctx):
        y, r = _k.rms_norm_forward(_f32(x), _f32(weight), eps, return_rms_inv=True,
                                   ctx=tg_ctx)
        # the inputs themselves are saved, so autograd's version check catches
        # an in-place change before the backward
        fctx.save_for_backward(x, weight, torch.from_numpy(r))
        fctx.tg_ctx = tg_ctx
        return torch.from_numpy(y)

    @staticmethod
    @once_differentiable
    def backward(fctx, dy):
        x, w, r = fctx.saved_tensors
        c = fctx.tg_ctx if fctx.tg_ctx is not None else default_context()
        dyn = _f32(dy)
        xn, rn = _f32(x), r.numpy()
        dx = dw = None
        if fctx.needs_input_grad[0]:
            dx = torch.from_numpy(_k.rms_norm_backward_dx(xn, _f32(w), dyn, rn, ctx=c))
        if fctx.needs_input_grad[1]:
            dw = torch.from_numpy(_k.rms_norm_backward_dw(xn, dyn, rn, ctx=c))
        return dx, dw, None, None


def rms_norm(x, weight=None, eps=1e-6, ctx=None):
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` over the last dim, in f32
    on the tilegrad kernels (other float dtypes are cast through autograd).
    ``weight=None``: no scale (no weight gradient)."""
    _check_cpu(x, weight)
    dtype = x.dtype
    if not dtype.is_floating_point:
        raise TypeError(f"rms_norm needs a floating point tensor, got {dtype}")
    x32 = x.to(torch.float32)
    if weight is None:
        weight = torch.ones(x.shape[-1], dtype=torch.float32)
    w32 = weight.to(torch.float32)
    if w32.shape != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    y = RMSNormFunction.apply(x32, w32, float(eps), ctx)
    return y if dtype == torch.float32 else y.to(dtype)


# ---------------------------------------------------------------------------
# modules

class RMSNorm(torch.nn.Module):
    """Drop-in for ``torch.nn.RMSNorm`` (PyTorch >= 2.4; the same arguments)
    running on tilegrad. ``eps=None`` uses ``torch.finfo(x.dtype).eps`` as
    PyTorch does. A multi-dim ``normalized_shape`` normalises over the
    trailing dims together."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None, ctx=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.ctx = ctx
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        n = len(self.normalized_shape)
        if tuple(x.shape[-n:]) != self.normalized_shape:
            raise ValueError(f"input trailing shape {tuple(x.shape[-n:])} != "
                             f"normalized_shape {self.normalized_shape}")
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        lead = x.shape[:x.dim() - n]
        xf = x.reshape(*lead, -1)
        w = self.weight.reshape(-1) if self.weight is not None else None
        return rms_norm(xf, w, eps, ctx=self.ctx).reshape(x.shape)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Attention(torch.nn.Module):
    """Parameter-free module around :func:`attention`:
    ``Attention(causal=True)(q, k, v, mask=None)``."""

    def __init__(self, causal=False, scale=None, softcap=None, ctx=None):
        super().__init__()
        self.causal, self.scale, self.softcap, self.ctx = causal, scale, softcap, ctx

    def forward(self, q, k, v, mask=None):
        return attention(q, k, v, mask=mask, causal=self.causal, scale=self.scale,
                         softcap=self.softcap, ctx=self.ctx)

    def extra_repr(self):
        return f"causal={self.causal}, scale={self.scale}, softcap={self.softcap}"


class MultiHeadAttention(torch.nn.Module):
    """Self-attention block (q/k/v/out projections, GQA) whose core is
    :func:`attention`: ``x [B, L, embed_dim] -> [B, L, embed_dim]``.
    ``num_kv_heads`` (default num_heads) must divide num_heads; the head dim
    ``embed_dim // num_heads`` must be a multiple of 8."""

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, causal=True, bias=False,
                 softcap=None, ctx=None):
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError("embed_dim must be a multiple of num_heads, num_heads of "
                             "num_kv_heads")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = torch.nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias)
        self.k_proj = torch.nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = torch.nn.Linear(embed_dim, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = torch.nn.Linear(num_heads * self.head_dim, embed_dim, bias=bias)
        self.attn = Attention(causal=causal, softcap=softcap, ctx=ctx)

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        D = self.head_dim
        # [B, L, heads*D] -> strided [B, heads, L, D] views: no copies
        q = self.q_proj(x).view(B, L, self.num_heads, D).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.num_kv_heads, D).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.num_kv_heads, D).transpose(1, 2)
        o = self.attn(q, k, v, mask=mask)
        return self.out_proj(o.transpose(1, 2).reshape(B, L, self.num_heads * D))
