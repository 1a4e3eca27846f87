"""Camera-branch decode: inverse UCPE (P on the first half, conjugate RoPE on the second).

The fused camera branch decodes inside the scan's output kernel (kernels.delta_scan); this
standalone entry point serves callers holding a ray-space tensor (tests, selftest). It is the
softmax blocks' decode kernel (`kernels.softmax_cam`) with P as the decode matrices.
"""
from ._validate import use_triton
from .cam_decode_reference import cam_decode_ref
from .softmax_cam import cam_softmax_decode

__all__ = ["cam_decode"]


def cam_decode(x, p, rope_cam, *, out_dtype=None, backend="auto"):
    """Triton decode with cam_decode_ref's contract.

    x: (B, H, N, D) or (B, H, T, S, D) ray-space output (channel stride 1); p: (B, N, 4, 4);
    rope_cam: complex (1, 1, N, D/4) or None. backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1,
    else `cam_decode_ref`), "triton", "torch". Returns (B, N, H*D) in out_dtype (default x's).
    """
    if not use_triton(x, backend):
        return cam_decode_ref(x, p, rope_cam).to(out_dtype or x.dtype)
    if x.dim() == 5:
        x = x.flatten(2, 3)
    return cam_softmax_decode(x, (p, p, p, rope_cam), dim=x.shape[-1], out_dtype=out_dtype, backend="triton")
