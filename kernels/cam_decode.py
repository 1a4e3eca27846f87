"""Camera-branch decode: inverse UCPE (P on the first half, conjugate RoPE on the second).

The fused camera branch decodes inside the scan's output kernel (kernels.delta_scan); this
light standalone kernel serves callers holding a ray-space tensor (tests, a camera SDPA).
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from ._validate import check_tensor
from .cam_prep import ray_tables
from .delta_scan import padded


@triton.jit
def _cam_decode_kernel(x_ptr, out_ptr, p_ptr, cos_ptr, sin_ptr, H, N,
                       D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr, NGU: tl.constexpr,
                       HAS_ROPE: tl.constexpr):
    """One program per (b, h, block of BS tokens): x (B, H, N, D) -> out (B, N, H*D)."""
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    n = tl.program_id(1) * BS + tl.arange(0, BS)
    nmask = n < N
    x0, x1, x2, x3 = ucpe_tiles.load_quads(x_ptr + bh * N * D, n * D, nmask, D // 4, G)
    y0, y1, y2, y3 = ucpe_tiles.ucpe_rope_quads(x0, x1, x2, x3, p_ptr, b * N + n, cos_ptr, sin_ptr, n, nmask,
                                                G, NGU, HAS_ROPE, True)
    ucpe_tiles.store_quads(out_ptr + (b * N * H + h) * D, n * (H * D), nmask, y0, y1, y2, y3, D // 4, G)


def cam_decode(x, p, rope_cam, *, out_dtype=None):
    """Triton decode with cam_decode_ref's contract.

    x: (B, H, N, D) or (B, H, T, S, D) contiguous ray-space output; p: (B, N, 4, 4);
    rope_cam: complex (1, 1, N, D/4) or None. Returns (B, N, H*D) in out_dtype (default x's).
    """
    if isinstance(x, torch.Tensor) and x.dim() == 5:
        x = x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1]) if x.is_contiguous() else x
    check_tensor("x", x, (None, None, None, None))
    batch, heads, tokens, dim = x.shape
    if dim % 8 != 0:
        raise ValueError(f"head dim D must have D/2 divisible by 4 (x of shape (B, H, N, D)), got D={dim}")
    p_flat, _, _, cos, sin = ray_tables((p, p, p, rope_cam), batch, tokens, dim, x.device)
    out = torch.empty(batch, tokens, heads * dim, device=x.device, dtype=out_dtype or x.dtype)
    bs = 32
    _cam_decode_kernel[(batch * heads, triton.cdiv(tokens, bs))](
        x, out, p_flat, cos if cos is not None else p_flat, sin if sin is not None else p_flat,
        heads, tokens, D=dim, G=padded(dim // 4), BS=bs, NGU=dim // 8, HAS_ROPE=cos is not None, num_warps=4)
    return out
