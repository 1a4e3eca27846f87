"""Plain PyTorch (fp32) building blocks of the references: RMSNorm, the rotation of interleaved pairs,
the per-token UCPE transform, the RMS downscale and the camera branch's beta discount (steps that
run inside other kernels, no op of their own); and `rope_tables` / `rope_pairs`, the conversions of a
rotary table to (cos, sin) that the references and the kernels read.

Layouts: B batch, H heads, N tokens, D head dim, C = H * D channels.
"""
import torch


def rms_norm_ref(x, weight, eps, inv_rms=None):
    """RMSNorm over the last dim (C channels) with weight (C,), no bias; fp32. inv_rms: optional
    (B, N) 1 / RMS per token used instead of the one over x's channels (head split)."""
    x = x.float()
    if inv_rms is None:
        inv_rms = torch.rsqrt(x.square().mean(dim=-1) + eps)
    return x * inv_rms.float()[..., None] * weight.float()


def rms_normalize_heads(x, weight, eps, inv_rms=None):
    """Full-channel RMSNorm of (B, N, H, D) over C = H*D per token, fp32; weight (C,)."""
    batch, tokens, heads, dim = x.shape
    return rms_norm_ref(x.reshape(batch, tokens, heads * dim), weight, eps, inv_rms).reshape(batch, tokens, heads, dim)


def rope_tables(rope):
    """Return fp32 (cos, sin), each (N, P), from a rotary table of P complex pairs per token.

    `rope` is either diffusers' complex table (1, 1, N, P) / (N, P), or a (cos, sin) pair.
    """
    if isinstance(rope, (tuple, list)):
        cos, sin = rope
        return cos.float().reshape(-1, cos.shape[-1]).contiguous(), sin.float().reshape(-1, sin.shape[-1]).contiguous()
    rope = rope.reshape(-1, rope.shape[-1])
    return rope.real.float().contiguous(), rope.imag.float().contiguous()


def rope_pairs(rope, device=None):
    """The rotary table as the kernels read it: fp32 (N, P, 2) contiguous, [..., 0] cos and [..., 1] sin.

    `rope`: diffusers' complex table (1, 1, N, P) / (N, P), a (cos, sin) pair of (N, P), or such an (N, P, 2)
    table already (returned as it is). A complex64 table is read where it lies (`torch.view_as_real`, no copy:
    a render's calls pass one table to every block and pass); other inputs are converted.
    """
    if isinstance(rope, (tuple, list)):
        pairs = torch.stack(rope_tables(rope), dim=-1)
    elif rope.is_complex():
        rope = rope.reshape(-1, rope.shape[-1])
        pairs = torch.view_as_real(rope if rope.dtype == torch.complex64 else rope.to(torch.complex64))
    elif rope.dim() == 3 and rope.shape[-1] == 2:
        pairs = rope
    else:
        raise ValueError(f"a rotary table must be complex, a (cos, sin) pair or (N, P, 2), got {tuple(rope.shape)}")
    return pairs.to(device=device if device is not None else pairs.device, dtype=torch.float32).contiguous()


def downscale_ref(x, y):
    """Scale each vector of y (last dim) down to the RMS of the matching vector of x, never up
    (eps 1e-6), as diffusers' UCPE encode does."""
    ref_rms = (x.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    out_rms = (y.square().mean(-1, keepdim=True) + 1e-6).sqrt()
    return y * (ref_rms / out_rms.clamp_min(1e-6)).clamp(max=1.0)


def rotate_pairs_ref(x, cos, sin, *, inverse=False):
    """Rotate the interleaved pairs (2i, 2i+1) = (real, imag) of x's last dim by the angles whose
    (cos, sin) broadcast against x[..., 0::2] (conjugate angles if inverse); fp32."""
    if inverse:
        sin = -sin
    re, im = x[..., 0::2], x[..., 1::2]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2)


def apply_rope_ref(x, cos, sin, inverse=False):
    """Rotate interleaved pairs of x (B, N, H, D) by angles given by cos/sin (N, D/2); fp32 out."""
    return rotate_pairs_ref(x.float(), cos[None, :, None, :], sin[None, :, None, :], inverse=inverse)


def ucpe_transform_ref(x, matrix, rope_tables, *, inverse_rope=False):
    """Per-token UCPE: x' = M x on each group of 4 of the first D/2 dims, RoPE on the rest.

    Args:
        x: (B, H, N, D) fp32.
        matrix: (B, N, 4, 4) per-token matrix M.
        rope_tables: (cos, sin) each (N, D/4), or None (second half unchanged). Pair i is
            dims (D/2 + 2i, D/2 + 2i + 1) as (real, imag).
        inverse_rope: rotate by the conjugate angle (decode).
    Returns (B, H, N, D) fp32.
    """
    batch, heads, tokens, dim = x.shape
    half = dim // 2
    groups = x[..., :half].reshape(batch, heads, tokens, half // 4, 4)
    mixed = (matrix.float()[:, None, :, None, :, :] * groups[..., None, :]).sum(-1)
    rotated = x[..., half:]
    if rope_tables is not None:
        rotated = rotate_pairs_ref(rotated, *rope_tables, inverse=inverse_rope)
    return torch.cat((mixed.reshape(batch, heads, tokens, half), rotated), dim=-1)


def discount_beta_ref(beta, inflation_sq):
    """Dynamic beta discounting: beta / max(1, mean over the frame's S tokens of inflation).

    beta (B, H, T, S), inflation_sq (B, H, T, S) -> (B, H, T, S) fp32.
    """
    frame = inflation_sq.float().mean(dim=-1, keepdim=True)
    return beta.float() / frame.clamp_min(1.0)
