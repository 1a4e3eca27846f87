"""UCPE encode / decode around the camera SDPA of SANA-WM's softmax blocks.

encode: raw camera projections q, k, v (B, N, C) -> full-C RMSNorm (q, k; no ReLU, no scale),
UCPE 4x4 on the first half of each head (P_T for q, P_inv for k and v), RoPE on the second
half, downscale to the pre-UCPE RMS; written as (B, N, H, DPAD) with zero padding (DPAD = 128
for D = 112), so `.transpose(1, 2)` is an SDPA-ready (B, H, N, DPAD) view; no fp32 copies.
decode: SDPA output (B, H, N, DPAD) (any strides) -> P on the first half, inverse RoPE on the
second -> (B, N, C).
The per-tile UCPE/RoPE device code is the camera branch's (`kernels.ucpe_tiles`).
References: `kernels.main_reference.cam_softmax_encode_ref` / `cam_softmax_decode_ref`.
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from .cam_prep import inv_rms, ray_tables


@triton.jit
def _encode_one(x_ptr, stride_b, stride_n, out_ptr, rms_ptr, w_ptr, mat_ptr, cos_ptr, sin_ptr,
                b, h, n, tok, tok_mask, N, H,
                D: tl.constexpr, DP: tl.constexpr, DPAD: tl.constexpr, BS: tl.constexpr, NGU: tl.constexpr,
                HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr):
    d = tl.arange(0, DP)
    m = tok_mask[:, None] & (d < D)[None, :]
    x = tl.load(x_ptr + b.to(tl.int64) * stride_b + n[:, None] * stride_n + h * D + d[None, :], mask=m,
                other=0.0).to(tl.float32)
    y, _, _ = ucpe_tiles.encode_tile(x, tok, n, tok_mask, rms_ptr, w_ptr + h * D, mat_ptr, cos_ptr, sin_ptr, 1.0,
                                     BS, D, DP, NGU, HAS_NORM, False, HAS_ROPE, DOWNSCALE)
    dst = out_ptr + ((b.to(tl.int64) * N + n) * H + h)[:, None] * DPAD + d[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (d < DPAD)[None, :])


@triton.jit
def _encode_kernel(q_ptr, k_ptr, v_ptr, sqb, sqn, skb, skn, svb, svn,
                   q_rms, k_rms, qw_ptr, kw_ptr, pt_ptr, pinv_ptr, cos_ptr, sin_ptr,
                   q_out, k_out, v_out, N, H,
                   D: tl.constexpr, DP: tl.constexpr, DPAD: tl.constexpr, BS: tl.constexpr, NGU: tl.constexpr,
                   HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, HAS_ROPE: tl.constexpr,
                   DOWNSCALE: tl.constexpr):
    """One program per (block of BS tokens, b * H + h)."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n = (tl.program_id(0) * BS + tl.arange(0, BS)).to(tl.int64)
    tok_mask = n < N
    tok = b.to(tl.int64) * N + n
    _encode_one(q_ptr, sqb, sqn, q_out, q_rms, qw_ptr, pt_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, BS, NGU, HAS_QNORM, HAS_ROPE, DOWNSCALE)
    _encode_one(k_ptr, skb, skn, k_out, k_rms, kw_ptr, pinv_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, BS, NGU, HAS_KNORM, HAS_ROPE, DOWNSCALE)
    _encode_one(v_ptr, svb, svn, v_out, k_rms, kw_ptr, pinv_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, BS, NGU, False, HAS_ROPE, DOWNSCALE)


@triton.jit
def _decode_kernel(o_ptr, sob, soh, son, p_ptr, cos_ptr, sin_ptr, out_ptr, N, H,
                   D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr, NGU: tl.constexpr, HAS_ROPE: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n = (tl.program_id(0) * BS + tl.arange(0, BS)).to(tl.int64)
    tok_mask = n < N
    tok = b.to(tl.int64) * N + n
    d = tl.arange(0, DP)
    m = tok_mask[:, None] & (d < D)[None, :]
    x = tl.load(o_ptr + b.to(tl.int64) * sob + h * soh + n[:, None] * son + d[None, :], mask=m,
                other=0.0).to(tl.float32)
    y = ucpe_tiles.ucpe_rope(x, p_ptr, tok, cos_ptr, sin_ptr, n, tok_mask, BS, DP, NGU, HAS_ROPE, True)
    tl.store(out_ptr + (tok * H + h)[:, None] * D + d[None, :], y.to(out_ptr.dtype.element_ty), mask=m)


def _pad_dim(dim):
    return 128 if dim <= 128 else 256


def cam_softmax_encode(q, k, v, ray_transforms, *, q_norm_weight=None, k_norm_weight=None, norm_eps=1e-5,
                       heads, downscale=True, out_dtype=None):
    """Encode raw camera projections for SDPA.

    Args:
        q, k, v: (B, N, C) raw projections (channel stride 1).
        ray_transforms: diffusers' (P, P_T, P_inv, rope_cam).
        q_norm_weight, k_norm_weight: (C,) RMSNorm weights or None (no norm).
        heads: H. out_dtype: storage dtype (default q.dtype).

    Returns:
        (q_enc, k_enc, v_enc), each (B, N, H, DPAD) contiguous, zero past D.
    """
    batch, tokens, channels = q.shape
    dim = channels // heads
    dpad = _pad_dim(dim)
    out_dtype = out_dtype or q.dtype
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    _, p_t, p_inv, cos, sin = ray_tables(ray_transforms, batch, tokens, dim, q.device)
    dummy = p_t
    q_rms = inv_rms(q.contiguous(), norm_eps) if q_norm_weight is not None else dummy
    k_rms = inv_rms(k.contiguous(), norm_eps) if k_norm_weight is not None else dummy
    dp = max(16, triton.next_power_of_2(dim))
    alloc = torch.zeros if dp < dpad else torch.empty  # the kernel writes DP channels, the rest stays zero
    outs = [alloc(batch, tokens, heads, dpad, device=q.device, dtype=out_dtype) for _ in range(3)]
    bs = 32
    grid = (triton.cdiv(tokens, bs), batch * heads)
    _encode_kernel[grid](
        q, k, v, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_rms, k_rms, q_norm_weight if q_norm_weight is not None else dummy,
        k_norm_weight if k_norm_weight is not None else dummy, p_t, p_inv,
        cos if cos is not None else dummy, sin if sin is not None else dummy,
        outs[0], outs[1], outs[2], tokens, heads,
        D=dim, DP=dp, DPAD=dpad, BS=bs, NGU=dim // 8, HAS_QNORM=q_norm_weight is not None,
        HAS_KNORM=k_norm_weight is not None, HAS_ROPE=cos is not None, DOWNSCALE=bool(downscale), num_warps=4)
    return tuple(outs)


def cam_softmax_decode(o, ray_transforms, *, dim, out_dtype=None):
    """Decode the camera SDPA output back to world space.

    Args:
        o: (B, H, N, DPAD) SDPA output (any strides, channel stride 1); the first `dim` channels are used.
        ray_transforms: diffusers' (P, P_T, P_inv, rope_cam).

    Returns:
        (B, N, H * dim) contiguous in out_dtype (default o.dtype).
    """
    batch, heads, tokens, _ = o.shape
    if o.stride(-1) != 1:
        o = o.contiguous()
    p, _, _, cos, sin = ray_tables(ray_transforms, batch, tokens, dim, o.device)
    out = torch.empty(batch, tokens, heads * dim, device=o.device, dtype=out_dtype or o.dtype)
    dp = max(16, triton.next_power_of_2(dim))
    bs = 32
    grid = (triton.cdiv(tokens, bs), batch * heads)
    _decode_kernel[grid](o, o.stride(0), o.stride(1), o.stride(2), p, cos if cos is not None else p,
                         sin if sin is not None else p, out, tokens, heads,
                         D=dim, DP=dp, BS=bs, NGU=dim // 8, HAS_ROPE=cos is not None, num_warps=4)
    return out
