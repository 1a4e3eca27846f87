"""Camera-branch prep: full-channel RMSNorm statistics and the fused UCPE encode kernel.

The fused camera branch (kernels.camera_branch) does not materialise the prepped tensors: its
scan kernels call the same device code (kernels.ucpe_tiles.encode_tile) on raw tiles. The
standalone `cam_prep` here writes the encodings out, for tests and for callers that need the
encoded q, k, v themselves (e.g. a camera SDPA).
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from ._validate import check_tensor


@triton.jit
def _inv_rms_kernel(x_ptr, out_ptr, rows, cols, eps, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[r] = 1 / sqrt(mean_c x[r, c]^2 + eps) for a (rows, cols) row-major x, fp32."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < rows
    base = r.to(tl.int64)[:, None] * cols
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(x_ptr + base + c[None, :], mask=rmask[:, None] & (c[None, :] < cols), other=0.0)
        x = x.to(tl.float32)
        acc += x * x
    tl.store(out_ptr + r, 1.0 / tl.sqrt(tl.sum(acc, axis=1) / cols + eps), mask=rmask)


def inv_rms(x, eps):
    """Per-token 1/RMS over all channels: x (B, N, H, D) contiguous -> (B*N,) fp32."""
    rows = x.shape[0] * x.shape[1]
    cols = x.numel() // max(rows, 1)
    out = torch.empty(rows, device=x.device, dtype=torch.float32)
    block_r = 4
    _inv_rms_kernel[(triton.cdiv(rows, block_r),)](x, out, rows, cols, float(eps),
                                                    BLOCK_R=block_r, BLOCK_C=512, num_warps=4)
    return out


def ray_tables(ray_transforms, batch, tokens, dim, device):
    """Flatten diffusers' (P, P_T, P_inv, rope_cam) for the kernels.

    Returns (p, p_t, p_inv, cos, sin): matrices (B*N, 4, 4) fp32 contiguous, RoPE tables
    (N, D/4) fp32 (None when rope_cam is None). Raises ValueError on bad shapes.
    """
    if not isinstance(ray_transforms, (tuple, list)) or len(ray_transforms) != 4:
        raise ValueError("ray_transforms must be the tuple (P, P_T, P_inv, rope_cam)")
    mats = []
    for name, m in zip(("P", "P_T", "P_inv"), ray_transforms[:3]):
        if not isinstance(m, torch.Tensor) or m.shape not in ((batch, tokens, 4, 4), (1, tokens, 4, 4)):
            got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"ray_transforms {name} must have shape ({batch}, {tokens}, 4, 4), got {got}")
        mats.append(m.to(device=device, dtype=torch.float32).expand(batch, tokens, 4, 4).contiguous())
    rope = ray_transforms[3]
    if rope is None:
        return (*mats, None, None)
    if not isinstance(rope, torch.Tensor) or not rope.is_complex() or rope.numel() != tokens * (dim // 4) \
            or rope.shape[-2:] != (tokens, dim // 4):
        got = tuple(rope.shape) if isinstance(rope, torch.Tensor) else type(rope).__name__
        raise ValueError(f"ray_transforms rope_cam must be complex of shape (1, 1, {tokens}, {dim // 4}), got {got}")
    rope = rope.reshape(tokens, dim // 4).to(device)
    return (*mats, rope.real.float().contiguous(), rope.imag.float().contiguous())


def tile_config(spatial, dim):
    """Padded head dim and token block for a frame of `spatial` tokens."""
    dp = max(16, triton.next_power_of_2(dim))
    bs = max(16, min(32, triton.next_power_of_2(spatial)))
    return dp, bs


@triton.jit
def _cam_prep_kernel(q_ptr, k_ptr, v_ptr, q_rms_ptr, k_rms_ptr, qw_ptr, kw_ptr,
                     pt_ptr, pinv_ptr, cos_ptr, sin_ptr,
                     q_out, k_out, v_out, infl_out,
                     H, T, S, k_scale,
                     D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr, NGU: tl.constexpr,
                     HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, HAS_ROPE: tl.constexpr,
                     DOWNSCALE: tl.constexpr):
    """One program per (b, h, t, block of BS tokens): raw (B, N, H, D) -> encoded (B, H, T, S, D)."""
    pid = tl.program_id(0)
    s = tl.program_id(1) * BS + tl.arange(0, BS)
    t = pid % T
    bh = pid // T
    b = bh // H
    h = bh % H
    d = tl.arange(0, DP)
    smask = s < S
    n = (t * S + s).to(tl.int64)
    tok = b.to(tl.int64) * T * S + n
    raw = (tok * H + h)[:, None] * D + d[None, :]
    m2 = smask[:, None] & (d[None, :] < D)
    enc = ((bh.to(tl.int64) * T + t) * S + s)[:, None] * D + d[None, :]

    x = tl.load(q_ptr + raw, mask=m2, other=0.0).to(tl.float32)
    y, _, _ = ucpe_tiles.encode_tile(x, tok, n, smask, q_rms_ptr, qw_ptr + h * D, pt_ptr, cos_ptr, sin_ptr,
                                     1.0, BS, D, DP, NGU, HAS_QNORM, True, HAS_ROPE, DOWNSCALE)
    tl.store(q_out + enc, y, mask=m2)
    x = tl.load(k_ptr + raw, mask=m2, other=0.0).to(tl.float32)
    y, pre, post = ucpe_tiles.encode_tile(x, tok, n, smask, k_rms_ptr, kw_ptr + h * D, pinv_ptr, cos_ptr,
                                          sin_ptr, k_scale, BS, D, DP, NGU, HAS_KNORM, True, HAS_ROPE, DOWNSCALE)
    tl.store(k_out + enc, y, mask=m2)
    tl.store(infl_out + (bh.to(tl.int64) * T + t) * S + s, ucpe_tiles.inflation_sq(pre, post, smask), mask=smask)
    x = tl.load(v_ptr + raw, mask=m2, other=0.0).to(tl.float32)
    y, _, _ = ucpe_tiles.encode_tile(x, tok, n, smask, k_rms_ptr, kw_ptr, pinv_ptr, cos_ptr, sin_ptr,
                                     1.0, BS, D, DP, NGU, False, False, HAS_ROPE, DOWNSCALE)
    tl.store(v_out + enc, y, mask=m2)


def check_projections(q, k, v):
    """Validate raw camera projections (B, N, H, D); returns (B, N, H, D)."""
    check_tensor("q", q, (None, None, None, None))
    shape = tuple(q.shape)
    check_tensor("k", k, shape)
    check_tensor("v", v, shape)
    dim = shape[-1]
    if dim % 8 != 0:
        raise ValueError(f"head dim D must have D/2 divisible by 4 (q of shape (B, N, H, D) with D % 8 == 0), got D={dim}")
    return shape


def check_norm_weight(name, w, channels):
    if w is not None:
        check_tensor(name, w, (channels,))


def cam_prep(q, k, v, ray_transforms, *, num_frames, q_norm_weight=None, k_norm_weight=None,
             norm_eps=1e-5, downscale=True):
    """Triton camera prep with cam_prep_ref's contract.

    q, k, v: (B, N, H, D) raw camera projections, contiguous, any float dtype.
    Returns (q_enc, k_enc, v_enc, inflation_sq): (B, H, T, S, D) fp32 x3 and (B, H, T, S) fp32.
    """
    batch, tokens, heads, dim = check_projections(q, k, v)
    if num_frames <= 0 or tokens % num_frames:
        raise ValueError(f"num_frames must divide N={tokens}, got {num_frames}")
    frames, spatial = num_frames, tokens // num_frames
    check_norm_weight("q_norm_weight", q_norm_weight, heads * dim)
    check_norm_weight("k_norm_weight", k_norm_weight, heads * dim)
    _, p_t, p_inv, cos, sin = ray_tables(ray_transforms, batch, tokens, dim, q.device)
    dummy = p_t
    q_rms = inv_rms(q, norm_eps) if q_norm_weight is not None else dummy
    k_rms = inv_rms(k, norm_eps) if k_norm_weight is not None else dummy
    out = [torch.empty(batch, heads, frames, spatial, dim, device=q.device, dtype=torch.float32) for _ in range(3)]
    infl = torch.empty(batch, heads, frames, spatial, device=q.device, dtype=torch.float32)
    dp, bs = tile_config(spatial, dim)
    grid = (batch * heads * frames, triton.cdiv(spatial, bs))
    _cam_prep_kernel[grid](
        q, k, v, q_rms, k_rms,
        q_norm_weight if q_norm_weight is not None else dummy,
        k_norm_weight if k_norm_weight is not None else dummy,
        p_t, p_inv, cos if cos is not None else dummy, sin if sin is not None else dummy,
        out[0], out[1], out[2], infl, heads, frames, spatial, float(dim ** -0.5 * spatial ** -0.5),
        D=dim, DP=dp, BS=bs, NGU=dim // 8, HAS_QNORM=q_norm_weight is not None,
        HAS_KNORM=k_norm_weight is not None, HAS_ROPE=cos is not None, DOWNSCALE=bool(downscale),
        num_warps=4)
    return out[0], out[1], out[2], infl
