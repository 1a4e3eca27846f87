"""Camera-branch prep: one pass over raw q, k, v doing the full-channel RMSNorm (per token,
across heads, computed inside), ReLU, k-scale, UCPE + RoPE, RMS downscale and key inflation,
writing the scan layout (B, H, N, D) = (B, H, T, S, D).

kernels.camera_branch stores the encodings in fp16 (tf32 mode: the same 10-bit mantissa the
tf32 matrix products keep) or fp32 (ieee mode), beta-folded; `cam_prep` writes plain fp32.
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from ._validate import check_tensor


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


@triton.jit
def _cam_stage_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, sb_b, sb_h, sb_t, sb_s,
                      qw_ptr, kw_ptr, pt_ptr, pinv_ptr, cos_ptr, sin_ptr,
                      q_out, k_out, v_out, infl_out,
                      N, S, norm_eps, k_scale,
                      H: tl.constexpr, D: tl.constexpr, G: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr,
                      NGU: tl.constexpr, HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr,
                      HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr, FOLD_BETA: tl.constexpr):
    """One program per (block of BS tokens, b), looping over all H heads.

    Raw (B, N, H, D) -> encoded (B, H, N, D) (the scan layout (B, H, T, S, D)) in the output
    pointers' dtype, plus the per-token key inflation (B, H, N) fp32. The full-channel RMS of
    q and k is computed first, over the token rows (C = H*D contiguous values each). With
    FOLD_BETA the stored key is sqrt(beta) * k / k_scale and the value sqrt(beta) * v, so the
    scan's Gram products need no beta and the k-scale is applied to the fp32 accumulators.
    """
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BS + tl.arange(0, BS)
    nmask = n < N
    C: tl.constexpr = H * D
    row = n[:, None] * C  # int32 offsets inside this batch row
    q_base = q_ptr + b * N * C
    k_base = k_ptr + b * N * C
    v_base = v_ptr + b * N * C
    q_rms = tl.zeros((BS,), dtype=tl.float32)
    k_rms = tl.zeros((BS,), dtype=tl.float32)
    if HAS_QNORM or HAS_KNORM:
        acc_q = tl.zeros((BS, BC), dtype=tl.float32)
        acc_k = tl.zeros((BS, BC), dtype=tl.float32)
        for c0 in range(0, C, BC):
            c = c0 + tl.arange(0, BC)
            m2 = nmask[:, None] & (c[None, :] < C)
            if HAS_QNORM:
                xq = tl.load(q_base + row + c[None, :], mask=m2, other=0.0).to(tl.float32)
                acc_q += xq * xq
            if HAS_KNORM:
                xk = tl.load(k_base + row + c[None, :], mask=m2, other=0.0).to(tl.float32)
                acc_k += xk * xk
        q_rms = 1.0 / tl.sqrt(tl.sum(acc_q, axis=1) / C + norm_eps)
        k_rms = 1.0 / tl.sqrt(tl.sum(acc_k, axis=1) / C + norm_eps)
    NQ: tl.constexpr = D // 4
    tok = b * N + n
    if FOLD_BETA:
        t = n // S
        sb_off = t * sb_t + (n - t * S) * sb_s
    for h in range(H):
        src = n * C + h * D
        dst = (b * H + h) * N * D
        dst_row = n * D
        x0, x1, x2, x3 = ucpe_tiles.load_quads(q_base, src, nmask, NQ, G)
        y0, y1, y2, y3, _, _ = ucpe_tiles.encode_quads(x0, x1, x2, x3, tok, n, nmask, q_rms, qw_ptr + h * D,
                                                       pt_ptr, cos_ptr, sin_ptr, 1.0, D, G, NGU, HAS_QNORM,
                                                       True, HAS_ROPE, DOWNSCALE)
        ucpe_tiles.store_quads(q_out + dst, dst_row, nmask, y0, y1, y2, y3, NQ, G)
        x0, x1, x2, x3 = ucpe_tiles.load_quads(k_base, src, nmask, NQ, G)
        y0, y1, y2, y3, pre, post = ucpe_tiles.encode_quads(x0, x1, x2, x3, tok, n, nmask, k_rms, kw_ptr + h * D,
                                                            pinv_ptr, cos_ptr, sin_ptr, k_scale, D, G, NGU,
                                                            HAS_KNORM, True, HAS_ROPE, DOWNSCALE)
        tl.store(infl_out + (b * H + h) * N + n, ucpe_tiles.inflation_sq(pre, post, nmask), mask=nmask)
        if FOLD_BETA:
            root = tl.sqrt(tl.load(beta_ptr + b * sb_b + h * sb_h + sb_off, mask=nmask, other=0.0).to(tl.float32))
            f = (root / k_scale)[:, None]
            y0, y1, y2, y3 = y0 * f, y1 * f, y2 * f, y3 * f
        ucpe_tiles.store_quads(k_out + dst, dst_row, nmask, y0, y1, y2, y3, NQ, G)
        x0, x1, x2, x3 = ucpe_tiles.load_quads(v_base, src, nmask, NQ, G)
        y0, y1, y2, y3, _, _ = ucpe_tiles.encode_quads(x0, x1, x2, x3, tok, n, nmask, q_rms, qw_ptr, pinv_ptr,
                                                       cos_ptr, sin_ptr, 1.0, D, G, NGU, False, False, HAS_ROPE,
                                                       DOWNSCALE)
        if FOLD_BETA:
            f = root[:, None]
            y0, y1, y2, y3 = y0 * f, y1 * f, y2 * f, y3 * f
        ucpe_tiles.store_quads(v_out + dst, dst_row, nmask, y0, y1, y2, y3, NQ, G)


def quad_groups(dim):
    """Groups of four per head vector, padded to a power of two (>= 16 for tl.dot)."""
    return max(16, triton.next_power_of_2(dim // 4))


def cam_stage(q, k, v, tables, *, num_frames, q_norm_weight, k_norm_weight, norm_eps, downscale,
              beta=None, out_dtype=torch.float32, block_s=16, num_warps=4):
    """Launch the stage kernel. tables = ray_tables(...). Returns (q', k', v', inflation_sq)
    with encodings (B, H, N, D) in out_dtype and inflation (B, H, N) fp32. With `beta` the
    key/value are stored beta-folded (see _cam_stage_kernel)."""
    batch, tokens, heads, dim = q.shape
    spatial = tokens // num_frames
    _, p_t, p_inv, cos, sin = tables
    outs = [torch.empty(batch, heads, tokens, dim, device=q.device, dtype=out_dtype) for _ in range(3)]
    infl = torch.empty(batch, heads, tokens, device=q.device, dtype=torch.float32)
    dummy = p_t
    beta_args = (beta, *beta.stride()) if beta is not None else (dummy, 0, 0, 0, 0)
    _cam_stage_kernel[(triton.cdiv(tokens, block_s), batch)](
        q, k, v, *beta_args,
        q_norm_weight if q_norm_weight is not None else dummy,
        k_norm_weight if k_norm_weight is not None else dummy,
        p_t, p_inv, cos if cos is not None else dummy, sin if sin is not None else dummy,
        outs[0], outs[1], outs[2], infl, tokens, spatial, float(norm_eps), float(dim ** -0.5 * spatial ** -0.5),
        H=heads, D=dim, G=quad_groups(dim), BS=block_s, BC=256, NGU=dim // 8,
        HAS_QNORM=q_norm_weight is not None, HAS_KNORM=k_norm_weight is not None, HAS_ROPE=cos is not None,
        DOWNSCALE=bool(downscale), FOLD_BETA=beta is not None, num_warps=num_warps)
    return outs[0], outs[1], outs[2], infl


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
    tables = ray_tables(ray_transforms, batch, tokens, dim, q.device)
    q_enc, k_enc, v_enc, infl = cam_stage(q, k, v, tables, num_frames=frames, q_norm_weight=q_norm_weight,
                                          k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale)
    shape = (batch, heads, frames, spatial, dim)
    return q_enc.view(shape), k_enc.view(shape), v_enc.view(shape), infl.view(shape[:4])
