"""Plain PyTorch references of `kernels.block_glue`, the adaLN glue of a block: the stock block's own op
sequence, rounded to x's dtype where the stock code writes a tensor. Shapes as `kernels.block_glue`.
"""
import torch

from .fp8_quant_reference import quantize_rows_ref


def _per_frame(t, frames):
    """(B, N, C) -> (B, T, S, C) view."""
    return t.reshape(t.shape[0], frames, -1, t.shape[-1])


def _norm_ref(x, eps, norm):
    """LayerNorm without affine (SANA-WM) or diffusers' weightless RMSNorm (LTX-2: fp32 math, rounded once)."""
    if norm == "layer":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=eps)
    squares = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(squares + eps)).to(x.dtype)


def ada_norm_ref(x, shift, scale, *, eps=1e-6, residual=None, norm="layer", quantize=False, keep=False):
    """norm(x) * (1 + scale) + shift per frame, in x.dtype op by op as the stock block; (B, N, C).
    shift and scale None: norm(x) alone. residual: `residual_ada_norm_ref` (the pair (x + residual, normed)).
    quantize: the normed rows (B * N, C) quantized for an FP8 linear, (q, scale) as `quantize_rows_ref`; with
    keep, (normed, (q, scale))."""
    if residual is not None:
        return residual_ada_norm_ref(x, residual, shift, scale, eps=eps, norm=norm, quantize=quantize, keep=keep)
    if shift is None:
        out = _norm_ref(x, eps, norm)
    else:
        frames = shift.shape[1]
        normed = _norm_ref(_per_frame(x, frames), eps, norm)
        out = (normed * (1 + scale.to(x.dtype)[:, :, None]) + shift.to(x.dtype)[:, :, None]).reshape(x.shape)
    return _with_rows(out, quantize, keep)


def _with_rows(out, quantize, keep):
    """out, or its rows quantized (q, scale), or both (out, (q, scale))."""
    if not quantize:
        return out
    rows = quantize_rows_ref(out.reshape(-1, out.shape[-1]))
    return (out, rows) if keep else rows


def residual_ada_norm_ref(x, residual, shift, scale, *, eps=1e-6, norm="layer", quantize=False, keep=False):
    """(x + residual in x.dtype, ada_norm of it)."""
    updated = x + residual.to(x.dtype)
    return updated, ada_norm_ref(updated, shift, scale, eps=eps, norm=norm, quantize=quantize, keep=keep)


def gated_residual_ref(x, y, gate, y2=None, extra=None, extra_bias=None, quantize=False):
    """x + gate * (y + y2) + (extra + extra_bias) per frame, in x.dtype op by op as the stock block; with
    quantize, (that, its rows quantized (q, scale))."""
    frames = gate.shape[1]
    update = y.to(x.dtype) if y2 is None else y.to(x.dtype) + y2.to(x.dtype)
    out = x + (gate.to(x.dtype)[:, :, None] * _per_frame(update, frames)).reshape(x.shape)
    if extra is not None:
        extra = extra.to(x.dtype)
        out = out + (extra if extra_bias is None else extra + extra_bias.to(x.dtype))
    return _with_rows(out, quantize, keep=True)


def silu_gate_ref(a, gate, b=None, quantize=False):
    """(a + b) * silu(gate) as the stock attentions: sum in a.dtype, gate and product in fp32, result in a.dtype;
    with quantize, its rows quantized (q, scale) instead."""
    total = a if b is None else a + b.to(a.dtype)
    return _with_rows((total * torch.nn.functional.silu(gate.float())).to(a.dtype), quantize, keep=False)


def merge_heads_ref(o):
    """(B, N, H, D) attention output -> (B, N, H * D) (a view when o's layout allows, else a copy)."""
    batch, tokens, heads, dim = o.shape
    return o.reshape(batch, tokens, heads * dim)
