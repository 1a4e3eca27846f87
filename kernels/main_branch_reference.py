"""Plain PyTorch reference of `kernels.main_branch.main_branch`, the main GDN branch: the prep as
`main_prep_ref`, then fp32 KV and Z delta scans (initial states in, final states out) and the division.
"""
import torch

from ._reference_parts import apply_rope_ref, rope_tables
from .delta_scan_reference import delta_scan_ref
from .main_prep_reference import main_prep_ref


def _to_scan(x, frames, heads):
    """(B, N, H, D) or (B, N, C) -> (B, H, T, S, D) fp32."""
    batch, tokens = x.shape[:2]
    x = x.reshape(batch, frames, tokens // frames, heads, -1).float()
    return x.permute(0, 3, 1, 2, 4)


def main_branch_ref(q, k, v, beta, decay, rope, *, q_norm_weight, k_norm_weight, norm_eps=1e-5, eps=1e-8,
                    initial_state=None, segment_starts=None, output_final_state=False, q_inv_rms=None,
                    k_inv_rms=None):
    """Main GDN branch: prep, KV (RoPE'd) and Z (un-rotated) bidirectional delta scans, division.

    Args:
        q: (B, N, C) raw query projection; k: (B, N, C) key after the short conv; v: (B, N, C) value
            (any strides; C = H * D).
        beta: (B, H, T, S) write strength; decay: (B, H, T) per-frame decay.
        rope: rotary table, diffusers' complex (1, 1, N, D/2) or a (cos, sin) pair of (N, D/2).
        q_norm_weight, k_norm_weight: (C,) RMSNorm weights; norm_eps their epsilon.
        eps: denominator epsilon (the released block passes 1e-8).
        initial_state: optional (kv (B, H, D, D), z (B, H, D, 1)) fp32 forward states.
        segment_starts: optional bool (T,) or (B, T): the reverse scans restart where t+1 starts a segment.
        output_final_state: return (kv, z), the forward states after the last frame (else None).
        q_inv_rms, k_inv_rms: optional (B, N) 1 / RMS per token of q and k (see `main_prep_ref`).

    Returns:
        (out (B, N, C) in v.dtype, (kv, z) or None).
    """
    heads, frames, spatial = beta.shape[1], beta.shape[2], beta.shape[3]
    batch, tokens, channels = v.shape[0], v.shape[1], q_norm_weight.shape[0]
    head_dim = channels // heads
    q, k = q.float().reshape(batch, tokens, channels), k.float().reshape(batch, tokens, channels)
    k_scale = head_dim ** -0.5 * spatial ** -0.5
    qn = main_prep_ref(q, q_norm_weight, heads, norm_eps=norm_eps, inv_rms=q_inv_rms)
    kn = main_prep_ref(k, k_norm_weight, heads, norm_eps=norm_eps, scale=k_scale, inv_rms=k_inv_rms)
    # the rotated streams rounded as main_prep_ref rounds them, from the prepped values
    cos, sin = rope_tables(rope)
    half = q_norm_weight.dtype if q_norm_weight.dtype in (torch.float16, torch.bfloat16) else torch.float32
    q_rot, k_rot = (apply_rope_ref(x.reshape(batch, tokens, heads, -1), cos, sin).to(half) for x in (qn, kn))
    init_kv = init_z = None
    if initial_state is not None:
        init_kv, init_z = initial_state
    num, kv = delta_scan_ref(_to_scan(q_rot, frames, heads), _to_scan(k_rot, frames, heads),
                             _to_scan(v, frames, heads), beta, decay, initial_state=init_kv,
                             segment_starts=segment_starts, output_final_state=output_final_state)
    q_s, k_s = _to_scan(qn, frames, heads), _to_scan(kn, frames, heads)
    den, z = delta_scan_ref(q_s, k_s, torch.ones_like(k_s[..., :1]), beta, decay, initial_state=init_z,
                            segment_starts=segment_starts, output_final_state=output_final_state)
    out = num / (den + eps)  # (B, H, T, S, D)
    out = out.permute(0, 2, 3, 1, 4).reshape(batch, tokens, channels).to(v.dtype)
    return out, ((kv, z) if output_final_state else None)
