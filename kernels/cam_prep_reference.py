"""Plain PyTorch (fp32) reference of `kernels.cam_prep.cam_prep`, the camera branch's prep (RMSNorm, ReLU,
k-scale, UCPE encode, RMS downscale); same arguments.
"""
import torch

from ._reference_parts import downscale_ref, rms_normalize_heads, rope_tables, ucpe_transform_ref


def cam_prep_ref(q, k, v, ray_transforms, *, num_frames, q_norm_weight=None, k_norm_weight=None,
                 norm_eps=1e-5, downscale=True, q_inv_rms=None, k_inv_rms=None):
    """Camera-branch prep of raw projections, fp32.

    q, k, v: (B, N, H, D) raw camera projections (k after conv_k_cam). RMSNorm over C = H*D
    (when a weight is given) and ReLU on q and k, k *= D^-0.5 * S^-0.5 (S = N / num_frames),
    UCPE (P_T on q, P_inv on k and v) + RoPE, then (downscale=True, diffusers' behaviour) each
    token's head vector is scaled down to its pre-UCPE RMS over D (eps 1e-6). q_inv_rms,
    k_inv_rms: optional (B, N) 1 / RMS per token replacing the one over these H heads (head split).

    Returns (q_enc, k_enc, v_enc, inflation_sq): encodings (B, H, T, S, D) fp32 and the
    per-token key inflation (|k_after| / |k_before|)^2, norms clamped at 1e-6, (B, H, T, S).
    """
    _, p_t, p_inv, rope_cam = ray_transforms
    batch, tokens, heads, dim = q.shape
    frames = num_frames
    spatial = tokens // frames
    q, k, v = q.float(), k.float(), v.float()
    if q_norm_weight is not None:
        q = rms_normalize_heads(q, q_norm_weight, norm_eps, q_inv_rms)
    if k_norm_weight is not None:
        k = rms_normalize_heads(k, k_norm_weight, norm_eps, k_inv_rms)
    q = torch.relu(q)
    k = torch.relu(k) * (dim ** -0.5 * spatial ** -0.5)
    tables = None if rope_cam is None else rope_tables(rope_cam)

    def encode(x, matrix):
        x = x.permute(0, 2, 1, 3)  # (B, H, N, D)
        y = ucpe_transform_ref(x, matrix, tables)
        return x, downscale_ref(x, y) if downscale else y

    _, q_enc = encode(q, p_t)
    k_pre, k_enc = encode(k, p_inv)
    _, v_enc = encode(v, p_inv)
    inflation = (k_enc.norm(dim=-1).clamp_min(1e-6) / k_pre.norm(dim=-1).clamp_min(1e-6)).square()

    def frames_view(x):
        return x.reshape(batch, heads, frames, spatial, *x.shape[3:])

    return frames_view(q_enc), frames_view(k_enc), frames_view(v_enc), frames_view(inflation)
