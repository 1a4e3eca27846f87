"""Plain PyTorch reference of `kernels.main_prep.main_prep`: fp32 math, rounded where diffusers' code rounds.
Layouts: B batch, N = T*S tokens (frame-major), C = H*D channels.
"""
import torch

from ._reference_parts import apply_rope_ref, rope_tables


def main_prep_ref(x, weight, heads, *, norm_eps=1e-5, scale=1.0, relu=True, rope=None, inv_rms=None):
    """Full-C RMSNorm per token (across heads), optional ReLU, scale, optional RoPE, rounded as
    diffusers' code rounds: RMSNorm's normalised input and its weighted output, the scaled result and
    the rotated pairs are tensors in the weight's dtype (fp32 math throughout for an fp32 weight).

    Args:
        x: (B, N, C) raw projection (any strides).
        weight: (C,) RMSNorm weight.
        heads: H (C = H * D).
        scale: multiplies the result (D^-0.5 * S^-0.5 for the GDN key, 1 otherwise).
        rope: optional rotary table (see `rope_tables`) applied per head after the scale.
        inv_rms: optional (B, N) fp32 1 / RMS per token used instead of the one over x's C channels
            (head split: the norm spans heads x does not hold).

    Returns:
        (B, N, C) in x.dtype.
    """
    batch, tokens, channels = x.shape
    dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.float32
    xf = x.float()
    if inv_rms is None:
        y = (xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + norm_eps)).to(dtype) * weight.to(dtype)
    else:
        y = (xf * inv_rms.float()[..., None]).to(dtype) * weight.to(dtype)
    if relu:
        y = torch.relu(y)
    y = y * scale
    if rope is not None:
        cos, sin = rope_tables(rope)
        y = apply_rope_ref(y.reshape(batch, tokens, heads, -1), cos, sin).reshape(batch, tokens, channels).to(dtype)
    return y.to(x.dtype)
