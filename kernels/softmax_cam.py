"""UCPE encode / decode around the camera SDPA of SANA-WM's softmax blocks.

encode: raw camera projections q, k, v (B, N, C) -> full-C RMSNorm (q, k; no ReLU, no scale),
UCPE 4x4 on the first half of each head (P_T for q, P_inv for k and v: y = M x per group of 4
channels), RoPE on the second half (interleaved pairs), downscale to the pre-UCPE RMS over the
head; written as (B, N, H, DPAD) with zero padding (DPAD = 128 for D = 112), so
`.transpose(1, 2)` is an SDPA-ready (B, H, N, DPAD) view; no fp32 copies.
decode: SDPA output (B, H, N, DPAD) (any strides) -> P on the first half, inverse RoPE on the
second -> (B, N, C).
A program handles BS tokens of one head; the 4x4 products and the pair rotation read their
partner channels as gathered loads from the (cached) row, so no register shuffles are needed.
References: `kernels.main_reference.cam_softmax_encode_ref` / `cam_softmax_decode_ref`.
"""
import torch
import triton
import triton.language as tl

from .main_prep import inv_rms
from .main_reference import rope_tables


@triton.jit
def _load_chan(row, col, mask, rstd, w_ptr, HAS_NORM: tl.constexpr):
    """(BS, DP) fp32 tile of channels `col` (per column) of the rows `row`, RMS-normalised if HAS_NORM."""
    x = tl.load(row + col[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        w = tl.load(w_ptr + col, mask=col >= 0, other=0.0).to(tl.float32)
        x = x * rstd[:, None] * w[None, :]
    return x


@triton.jit
def _ucpe_tile(row, c, m, first, rstd, w_ptr, mat_ptr, tok, cos_ptr, sin_ptr, n,
               D: tl.constexpr, HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, INVERSE: tl.constexpr):
    """UCPE (first half) + RoPE (second half) of one head tile; returns (x, y), both (BS, DP) fp32."""
    x = _load_chan(row, c, m, rstd, w_ptr, HAS_NORM)
    m_first = m & first[None, :]
    group = (c // 4) * 4
    mat_row = mat_ptr + tok[:, None] * 16 + ((c % 4) * 4)[None, :]
    y_ucpe = tl.zeros(x.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        xj = _load_chan(row, group + j, m_first, rstd, w_ptr, HAS_NORM)
        mij = tl.load(mat_row + j, mask=m_first, other=0.0).to(tl.float32)
        y_ucpe += mij * xj
    if HAS_ROPE:
        half: tl.constexpr = D // 2
        m_second = m & (~first)[None, :]
        partner = _load_chan(row, c ^ 1, m_second, rstd, w_ptr, HAS_NORM)
        tab = n[:, None] * (half // 2) + ((c - half) // 2)[None, :]
        cos = tl.load(cos_ptr + tab, mask=m_second, other=0.0)
        sin = tl.load(sin_ptr + tab, mask=m_second, other=0.0)
        if INVERSE:
            sin = -sin
        sign = tl.where((c % 2) == 0, -1.0, 1.0)
        y_rope = x * cos + partner * sin * sign[None, :]
    else:
        y_rope = x
    return x, tl.where(first[None, :], y_ucpe, y_rope)


@triton.jit
def _encode_one(x_ptr, stride_b, stride_n, out_ptr, rms_ptr, w_ptr, mat_ptr, cos_ptr, sin_ptr,
                b, h, n, tok, tok_mask, N, H,
                D: tl.constexpr, DP: tl.constexpr, DPAD: tl.constexpr,
                HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr):
    c = tl.arange(0, DP)
    m = tok_mask[:, None] & (c < D)[None, :]
    first = c < D // 2
    row = x_ptr + b.to(tl.int64) * stride_b + n[:, None] * stride_n + h * D
    rstd = tl.load(rms_ptr + tok, mask=tok_mask, other=0.0)  # a dummy buffer when not HAS_NORM (unused)
    x, y = _ucpe_tile(row, c, m, first, rstd, w_ptr + h * D, mat_ptr, tok, cos_ptr, sin_ptr, n, D, HAS_NORM,
                      HAS_ROPE, False)
    if DOWNSCALE:
        ref_rms = tl.sqrt(tl.sum(x * x, axis=1) / D + 1e-6)
        out_rms = tl.sqrt(tl.sum(y * y, axis=1) / D + 1e-6)
        y = y * tl.minimum(ref_rms / tl.maximum(out_rms, 1e-6), 1.0)[:, None]
    dst = out_ptr + ((b.to(tl.int64) * N + n) * H + h)[:, None] * DPAD + c[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=tok_mask[:, None] & (c < DPAD)[None, :])


@triton.jit
def _encode_kernel(q_ptr, k_ptr, v_ptr, sqb, sqn, skb, skn, svb, svn,
                   q_rms, k_rms, qw_ptr, kw_ptr, pt_ptr, pinv_ptr, cos_ptr, sin_ptr,
                   q_out, k_out, v_out, N, H,
                   D: tl.constexpr, DP: tl.constexpr, DPAD: tl.constexpr, BS: tl.constexpr,
                   HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, HAS_ROPE: tl.constexpr,
                   DOWNSCALE: tl.constexpr):
    """One program per (block of BS tokens, b * H + h): q, k and v of that head."""
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n = (tl.program_id(0) * BS + tl.arange(0, BS)).to(tl.int64)
    tok_mask = n < N
    tok = b.to(tl.int64) * N + n
    _encode_one(q_ptr, sqb, sqn, q_out, q_rms, qw_ptr, pt_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, HAS_QNORM, HAS_ROPE, DOWNSCALE)
    _encode_one(k_ptr, skb, skn, k_out, k_rms, kw_ptr, pinv_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, HAS_KNORM, HAS_ROPE, DOWNSCALE)
    _encode_one(v_ptr, svb, svn, v_out, k_rms, kw_ptr, pinv_ptr, cos_ptr, sin_ptr, b, h, n, tok, tok_mask, N, H,
                D, DP, DPAD, False, HAS_ROPE, DOWNSCALE)


@triton.jit
def _decode_kernel(o_ptr, sob, soh, son, p_ptr, cos_ptr, sin_ptr, out_ptr, N, H,
                   D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr, HAS_ROPE: tl.constexpr):
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n = (tl.program_id(0) * BS + tl.arange(0, BS)).to(tl.int64)
    tok_mask = n < N
    tok = b.to(tl.int64) * N + n
    c = tl.arange(0, DP)
    m = tok_mask[:, None] & (c < D)[None, :]
    row = o_ptr + b.to(tl.int64) * sob + h.to(tl.int64) * soh + n[:, None] * son
    unused = n.to(tl.float32)  # no norm on decode: rstd / weight are not read
    _, y = _ucpe_tile(row, c, m, c < D // 2, unused, p_ptr, p_ptr, tok, cos_ptr, sin_ptr, n, D, False, HAS_ROPE,
                      True)
    tl.store(out_ptr + (tok * H + h)[:, None] * D + c[None, :], y.to(out_ptr.dtype.element_ty), mask=m)


def _pad_dim(dim):
    return 128 if dim <= 128 else 256


def _tables(ray_transforms, which, batch, tokens, dim, device):
    """Per-token matrices ray_transforms[which] as (B*N, 16) fp32 and the camera RoPE (cos, sin) (N, D/4)."""
    if not isinstance(ray_transforms, (tuple, list)) or len(ray_transforms) != 4:
        raise ValueError("ray_transforms must be the tuple (P, P_T, P_inv, rope_cam)")
    mats = ray_transforms[which]
    if mats.shape[-2:] != (4, 4) or mats.shape[-3] != tokens:
        raise ValueError(f"ray matrices must have shape ({batch}, {tokens}, 4, 4), got {tuple(mats.shape)}")
    mats = mats.to(device=device, dtype=torch.float32).expand(batch, tokens, 4, 4).contiguous()
    rope_cam = ray_transforms[3]
    if rope_cam is None:
        return mats, None, None
    cos, sin = rope_tables(rope_cam)
    if cos.shape != (tokens, dim // 4):
        raise ValueError(f"rope_cam must hold ({tokens}, {dim // 4}) angles, got {tuple(cos.shape)}")
    return mats, cos.to(device), sin.to(device)


def cam_softmax_encode(q, k, v, ray_transforms, *, q_norm_weight=None, k_norm_weight=None, norm_eps=1e-5,
                       heads, downscale=True, out_dtype=None):
    """Encode raw camera projections for SDPA.

    Args:
        q, k, v: (B, N, C) raw projections (channel stride 1).
        ray_transforms: diffusers' (P, P_T, P_inv, rope_cam).
        q_norm_weight, k_norm_weight: (C,) RMSNorm weights or None (no norm).
        heads: H (head dim D = C / H, D % 8 == 0). out_dtype: storage dtype (default q.dtype).

    Returns:
        (q_enc, k_enc, v_enc), each (B, N, H, DPAD) contiguous, zero past D.
    """
    batch, tokens, channels = q.shape
    dim = channels // heads
    if dim % 8:
        raise ValueError(f"camera head dim must be a multiple of 8, got {dim}")
    dpad = _pad_dim(dim)
    out_dtype = out_dtype or q.dtype
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    p_t, cos, sin = _tables(ray_transforms, 1, batch, tokens, dim, q.device)
    p_inv, _, _ = _tables(ray_transforms, 2, batch, tokens, dim, q.device)
    dummy = p_t
    q_rms = inv_rms(q, norm_eps) if q_norm_weight is not None else dummy
    k_rms = inv_rms(k, norm_eps) if k_norm_weight is not None else dummy
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
        D=dim, DP=dp, DPAD=dpad, BS=bs, HAS_QNORM=q_norm_weight is not None,
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
    p, cos, sin = _tables(ray_transforms, 0, batch, tokens, dim, o.device)
    out = torch.empty(batch, tokens, heads * dim, device=o.device, dtype=out_dtype or o.dtype)
    dp = max(16, triton.next_power_of_2(dim))
    bs = 32
    grid = (triton.cdiv(tokens, bs), batch * heads)
    _decode_kernel[grid](o, o.stride(0), o.stride(1), o.stride(2), p, cos if cos is not None else p,
                         sin if sin is not None else p, out, tokens, heads,
                         D=dim, DP=dp, BS=bs, HAS_ROPE=cos is not None, num_warps=4)
    return out
