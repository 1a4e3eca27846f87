"""Plain PyTorch references of `kernels.rms_rope`: the LTX-2 self-attention's q/k RMSNorm + RoPE and RoPE
alone, rounded as the stock ops (module docstring of `kernels.rms_rope`).
"""
import torch

from ._validate import check_choice


ROPE_TYPES = ("interleaved", "split")


def rope_rows_ref(x, cos, sin, *, rope_type="interleaved"):
    """RoPE of x (B, N, C) as diffusers' `apply_interleaved_rotary_emb` / `apply_split_rotary_emb`:
    fp32 math, result in x.dtype."""
    check_choice("rope_type", rope_type, ROPE_TYPES)
    if rope_type == "interleaved":
        real, imag = x.unflatten(2, (-1, 2)).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(2)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
    batch, heads, tokens, half = cos.shape
    pairs = x.reshape(batch, tokens, heads, 2, half).transpose(1, 2).float()  # (B, H, N, 2, D/2)
    first, second = pairs[..., 0, :], pairs[..., 1, :]
    out = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-2)
    return out.transpose(1, 2).reshape(x.shape).to(x.dtype)


def rms_rope_qk_ref(q, k, q_weight, k_weight, cos, sin, *, eps, rope_type="interleaved"):
    """(RoPE(RMSNorm(q)), RoPE(RMSNorm(k)), RMSNorm(k)), each (B, N, C) in q.dtype."""
    normed_q = torch.nn.functional.rms_norm(q, (q.shape[-1],), q_weight, eps)
    normed_k = torch.nn.functional.rms_norm(k, (k.shape[-1],), k_weight, eps)
    return (rope_rows_ref(normed_q, cos, sin, rope_type=rope_type),
            rope_rows_ref(normed_k, cos, sin, rope_type=rope_type), normed_k)
