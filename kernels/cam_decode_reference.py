"""Plain PyTorch (fp32) reference of `kernels.cam_decode.cam_decode`: inverse UCPE of the scan output.
"""
from ._reference_parts import rope_tables, ucpe_transform_ref


def cam_decode_ref(x, p, rope_cam):
    """Inverse UCPE of the scan output: P on the first half, conjugate RoPE on the second.

    x: (B, H, N, D) (or (B, H, T, S, D)); p: (B, N, 4, 4); rope_cam complex (..., N, D/4) or None.
    Returns (B, N, H*D) fp32.
    """
    batch, heads = x.shape[:2]
    dim = x.shape[-1]
    x = x.float().reshape(batch, heads, -1, dim)
    tokens = x.shape[2]
    y = ucpe_transform_ref(x, p, None if rope_cam is None else rope_tables(rope_cam), inverse_rope=True)
    return y.permute(0, 2, 1, 3).reshape(batch, tokens, heads * dim)
