"""Plain PyTorch (fp32) references of `kernels.softmax_cam`: the softmax blocks' camera encode and decode.
"""
import torch

from ._reference_parts import downscale_ref, rms_norm_ref, rope_tables, ucpe_transform_ref
from .cam_decode_reference import cam_decode_ref


def _ucpe_ref(x, mats, rope_cam, inverse_rope=False):
    """kernels._reference_parts.ucpe_transform_ref on x (B, N, H, D) fp32; mats (B, N, 4, 4); rope_cam a
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
