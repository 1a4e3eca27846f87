"""Plain PyTorch references for the main-branch kernels (short conv, prep, main branch): fp32
math, with the prep rounded where diffusers' code rounds (see `main_prep_ref`).

Same signatures as the fast kernels in `kernels.short_conv`, `kernels.main_prep` and
`kernels.main_branch`. Layouts: B batch, N = T*S tokens (frame-major), C = H*D channels.
"""
import torch

from .reference import (cam_decode_ref, delta_scan_ref, downscale_ref, rms_norm_ref, rope_tables, rotate_pairs_ref,
                        ucpe_transform_ref)

__all__ = ["rope_tables", "apply_rope_ref", "short_conv_ref", "main_prep_ref", "main_branch_ref",
           "cam_softmax_encode_ref", "cam_softmax_decode_ref"]  # rope_tables lives in kernels.reference


def apply_rope_ref(x, cos, sin, inverse=False):
    """Rotate interleaved pairs of x (B, N, H, D) by angles given by cos/sin (N, D/2); fp32 out."""
    return rotate_pairs_ref(x.float(), cos[None, :, None, :], sin[None, :, None, :], inverse=inverse)


def short_conv_ref(x, weight, num_frames, *, left_context=None):
    """Bidirectional depthwise temporal convolution (kernel K over T, spatial axis in the batch).

    y[t] = sum_j w_j x[t-K+1+j] + sum_j w_j x[t+K-1-j] - w_{K-1} x[t], zero outside the clip,
    which equals diffusers' `SanaWMTemporalShortConvolution`.

    Args:
        x: (B, N, C) with N = num_frames * S (any strides).
        weight: (C, 1, K) or (C, K) conv weight.
        num_frames: T.
        left_context: optional (B, F*S, C), F <= K-1, raw input of the F frames just before x
            (oldest first). The causal half reads it instead of zeros (segment mode); the
            anti-causal half stays inside x. None gives the plain bidirectional form.

    Returns:
        (B, N, C) in x.dtype.
    """
    batch, tokens, channels = x.shape
    frames = num_frames
    spatial = tokens // frames
    w = weight.reshape(channels, -1).float()
    ksize = w.shape[1]
    xf = x.float().reshape(batch, frames, spatial, channels)
    left = xf.new_zeros(batch, ksize - 1, spatial, channels)
    if left_context is not None and left_context.shape[1] > 0:
        ctx = left_context.float().reshape(batch, -1, spatial, channels)
        left[:, ksize - 1 - ctx.shape[1]:] = ctx
    right = xf.new_zeros(batch, ksize - 1, spatial, channels)
    padded = torch.cat([left, xf, right], dim=1)  # frame t of x sits at t + K - 1
    out = -w[:, ksize - 1] * xf
    for j in range(ksize):
        causal = padded[:, j:j + frames]
        anti = padded[:, 2 * (ksize - 1) - j:2 * (ksize - 1) - j + frames]
        out = out + w[:, j] * (causal + anti)
    return out.reshape(batch, tokens, channels).to(x.dtype)


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


def _to_scan(x, frames, heads):
    """(B, N, H, D) or (B, N, C) -> (B, H, T, S, D) fp32."""
    batch, tokens = x.shape[:2]
    x = x.reshape(batch, frames, tokens // frames, heads, -1).float()
    return x.permute(0, 3, 1, 2, 4)


def main_branch_ref(q, k, v, beta, decay, rope, *, q_norm_weight, k_norm_weight, norm_eps=1e-5, eps=1e-8,
                    initial_state=None, segment_starts=None, precision="ieee", backend="torch",
                    output_final_state=False, q_inv_rms=None, k_inv_rms=None):
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
        precision, backend: accepted for signature parity; the reference is PyTorch, fp32 after the prep.
        output_final_state: return (kv, z), the forward states after the last frame (else None).
        q_inv_rms, k_inv_rms: optional (B, N) 1 / RMS per token of q and k (see `main_prep_ref`).

    Returns:
        (out (B, N, C) in v.dtype, (kv, z) or None).
    """
    del precision, backend
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
                             segment_starts=segment_starts)
    q_s, k_s = _to_scan(qn, frames, heads), _to_scan(kn, frames, heads)
    den, z = delta_scan_ref(q_s, k_s, torch.ones_like(k_s[..., :1]), beta, decay, initial_state=init_z,
                            segment_starts=segment_starts)
    out = num / (den + eps)  # (B, H, T, S, D)
    out = out.permute(0, 2, 3, 1, 4).reshape(batch, tokens, channels).to(v.dtype)
    return out, ((kv, z) if output_final_state else None)


def _ucpe_ref(x, mats, rope_cam, inverse_rope=False):
    """kernels.reference.ucpe_transform_ref on x (B, N, H, D) fp32; mats (B, N, 4, 4); rope_cam a
    complex table or a (cos, sin) pair (see rope_tables), or None."""
    tables = None if rope_cam is None else rope_tables(rope_cam)
    return ucpe_transform_ref(x.transpose(1, 2), mats, tables, inverse_rope=inverse_rope).transpose(1, 2)


def cam_softmax_encode_ref(q, k, v, ray_transforms, *, q_norm_weight=None, k_norm_weight=None, norm_eps=1e-5,
                           heads, downscale=True, out_dtype=None, q_inv_rms=None, k_inv_rms=None):
    """Reference for `kernels.softmax_cam.cam_softmax_encode`: (q, k, v) each (B, N, H, DPAD), zero padded."""
    batch, tokens, channels = q.shape
    dim = channels // heads
    dpad = 128 if dim <= 128 else 256
    _, p_t, p_inv, rope_cam = ray_transforms
    outs = []
    for x, w, mats, inv_rms in ((q, q_norm_weight, p_t, q_inv_rms), (k, k_norm_weight, p_inv, k_inv_rms),
                                (v, None, p_inv, None)):
        x = x.float()
        if w is not None:
            x = rms_norm_ref(x, w, norm_eps, inv_rms)
        x = x.reshape(batch, tokens, heads, dim)
        y = _ucpe_ref(x, mats.expand(batch, tokens, 4, 4), rope_cam)
        if downscale:
            y = downscale_ref(x, y)
        outs.append(torch.nn.functional.pad(y, (0, dpad - dim)).to(out_dtype or q.dtype))
    return tuple(outs)


def cam_softmax_decode_ref(o, ray_transforms, *, dim, out_dtype=None):
    """Reference for `kernels.softmax_cam.cam_softmax_decode`: (B, H, N, DPAD) -> (B, N, H * dim)."""
    batch, _, tokens, _ = o.shape
    p, _, _, rope_cam = ray_transforms
    return cam_decode_ref(o[..., :dim], p.expand(batch, tokens, 4, 4), rope_cam).to(out_dtype or o.dtype)
