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
from ._grid import cdiv, next_power_of_2
from ._validate import check_inv_rms, check_tensor, use_triton
from .cam_prep_reference import cam_prep_ref

__all__ = ["cam_prep"]


def ray_views(ray_transforms, batch, tokens, dim, device):
    """Validate diffusers' (P, P_T, P_inv, rope_cam) and expose them to the kernels without copies
    where possible (diffusers' P_T is a transposed view, its RoPE table complex).

    Returns (p, p_t, p_inv, rope): matrices as (B, N, 4, 4) fp32 tensors of any strides (a
    batch of one is expanded with stride 0), rope as (N, D/4, 2) fp32 contiguous (cos, sin)
    pairs, or None when rope_cam is None. Raises ValueError on bad shapes.
    """
    if not isinstance(ray_transforms, (tuple, list)) or len(ray_transforms) != 4:
        raise ValueError("ray_transforms must be the tuple (P, P_T, P_inv, rope_cam)")
    mats = []
    for name, m in zip(("P", "P_T", "P_inv"), ray_transforms[:3]):
        if not isinstance(m, torch.Tensor) or m.shape not in ((batch, tokens, 4, 4), (1, tokens, 4, 4)):
            got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"ray_transforms {name} must have shape ({batch}, {tokens}, 4, 4), got {got}")
        mats.append(m.to(device=device, dtype=torch.float32).expand(batch, tokens, 4, 4))
    rope = ray_transforms[3]
    if rope is None:
        return (*mats, None)
    if not isinstance(rope, torch.Tensor) or not rope.is_complex() or rope.numel() != tokens * (dim // 4) \
            or rope.shape[-2:] != (tokens, dim // 4):
        got = tuple(rope.shape) if isinstance(rope, torch.Tensor) else type(rope).__name__
        raise ValueError(f"ray_transforms rope_cam must be complex of shape (1, 1, {tokens}, {dim // 4}), got {got}")
    rope = rope.reshape(tokens, dim // 4).to(device=device, dtype=torch.complex64)
    return (*mats, torch.view_as_real(rope).contiguous())


@triton.jit
def inverse_rms(q_rows, k_rows, nmask, norm_eps, C: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr,
                 HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, q_given, k_given, given_offs,
                 GIVEN: tl.constexpr):
    """1 / RMS over all C channels of BS token rows of q and k (the block's full-C RMSNorm);
    (BS,) each, zeros for a tensor without a norm. `q_rows`, `k_rows`: (BS, 1) row pointers.
    GIVEN: read them from q_given / k_given (fp32 (B, N), at offsets given_offs (BS,)) instead:
    computed outside when the norm spans heads this call does not hold (head split)."""
    q_rms = tl.zeros((BS,), dtype=tl.float32)
    k_rms = tl.zeros((BS,), dtype=tl.float32)
    if GIVEN:
        if HAS_QNORM:
            q_rms = tl.load(q_given + given_offs, mask=nmask, other=0.0)
        if HAS_KNORM:
            k_rms = tl.load(k_given + given_offs, mask=nmask, other=0.0)
    elif HAS_QNORM or HAS_KNORM:
        acc_q = tl.zeros((BS, BC), dtype=tl.float32)
        acc_k = tl.zeros((BS, BC), dtype=tl.float32)
        for c0 in range(0, C, BC):
            c = c0 + tl.arange(0, BC)
            m2 = nmask[:, None] & (c[None, :] < C)
            if HAS_QNORM:
                xq = tl.load(q_rows + c[None, :], mask=m2, other=0.0).to(tl.float32)
                acc_q += xq * xq
            if HAS_KNORM:
                xk = tl.load(k_rows + c[None, :], mask=m2, other=0.0).to(tl.float32)
                acc_k += xk * xk
        q_rms = 1.0 / tl.sqrt(tl.sum(acc_q, axis=1) / C + norm_eps)
        k_rms = 1.0 / tl.sqrt(tl.sum(acc_k, axis=1) / C + norm_eps)
    return q_rms, k_rms


@triton.jit
def encode_halves(xa, xb, wa, wb, inv_rms, m, c0, s0, c1, s1, scale, out_scale, BS: tl.constexpr, GU: tl.constexpr,
                   D: tl.constexpr, HAS_NORM: tl.constexpr, RELU: tl.constexpr, HAS_ROPE: tl.constexpr,
                   DOWNSCALE: tl.constexpr):
    """Encode head vectors held as two contiguous (BS, 4GU) fp32 tiles (padding columns zero):
    xa = channels [0, D/2) (UCPE: y = M x per group of four), xb = channels [D/2, D) (RoPE).

    m: the token matrices as 16 (BS, 1) entries; c*/s*: (BS, GU) RoPE tables of the two pairs of
    each group; out_scale: (BS,) factor applied to the outputs only (not to post_sq).
    Returns (ya, yb, pre_sq (BS,), post_sq (BS,)): one row reduction per squared norm over both
    halves, the RoPE half's norm taken before the rotation (which keeps it).
    """
    row_scale = scale
    if HAS_NORM:
        row_scale = inv_rms[:, None] * scale
        xa = xa * wa[None, :]
        xb = xb * wb[None, :]
    xa = xa * row_scale
    xb = xb * row_scale
    if RELU:
        xa = tl.maximum(xa, 0.0)
        xb = tl.maximum(xb, 0.0)
    xb_sq = xb * xb
    pre_sq = tl.sum(xa * xa + xb_sq, axis=1)
    x0, x1, x2, x3 = ucpe_tiles.split_quads(xa, BS, GU)
    (a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33) = m
    ya = ucpe_tiles.join_quads(a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3, a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3,
                               a20 * x0 + a21 * x1 + a22 * x2 + a23 * x3, a30 * x0 + a31 * x1 + a32 * x2 + a33 * x3,
                               BS, GU)
    yb = xb
    if HAS_ROPE:
        x0, x1, x2, x3 = ucpe_tiles.split_quads(xb, BS, GU)
        yb = ucpe_tiles.join_quads(c0 * x0 - s0 * x1, s0 * x0 + c0 * x1, c1 * x2 - s1 * x3, s1 * x2 + c1 * x3, BS, GU)
    post_sq = tl.sum(ya * ya + xb_sq, axis=1)
    if DOWNSCALE:
        ref_rms = tl.sqrt(pre_sq / D + 1e-6)
        out_rms = tl.sqrt(post_sq / D + 1e-6)
        factor = tl.minimum(ref_rms / tl.maximum(out_rms, 1e-6), 1.0)
        post_sq = post_sq * factor * factor
        out_scale = out_scale * factor
    ya = ya * out_scale[:, None]
    yb = yb * out_scale[:, None]
    return ya, yb, pre_sq, post_sq


@triton.jit
def _cam_encode_kernel(q_ptr, k_ptr, v_ptr, beta_ptr, sb_b, sb_h, sb_t, sb_s,
                       qw_ptr, kw_ptr, qr_ptr, kr_ptr, pt_ptr, spt_b, spt_n, spt_i, spt_j,
                       pinv_ptr, spi_b, spi_n, spi_i, spi_j, rope_ptr,
                       q_out, k_out, v_out, infl_out,
                       N, S, norm_eps, k_scale,
                       H: tl.constexpr, D: tl.constexpr, GU: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr,
                       HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr, GIVEN_RMS: tl.constexpr,
                       HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr, FOLD_BETA: tl.constexpr):
    """One program per (block of BS tokens, b), looping over all H heads.

    Raw (B, N, H, D) -> encoded (B, H, N, D) (the scan layout (B, H, T, S, D)) in the output
    pointers' dtype, plus the per-token key inflation (B, H, N) fp32. The full-channel RMS of
    q and k is computed first, over the token rows (C = H*D contiguous values each). With
    FOLD_BETA the stored key is sqrt(beta) * k / k_scale and the value sqrt(beta) * v, so the
    scan's Gram products need no beta and the k-scale is applied to the fp32 accumulators.

    Each head vector is loaded and stored as two contiguous rows (the UCPE half and the RoPE
    half, 16-byte accesses) and split into quads in registers; the per-token matrices (any
    strides: diffusers' P_T is a transposed view) and the interleaved RoPE table (see
    ucpe_tiles.rope_pairs) are loaded once per program, before the loop over heads.
    """
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BS + tl.arange(0, BS)
    nmask = n < N
    C: tl.constexpr = H * D
    HALF: tl.constexpr = D // 2
    NGU: tl.constexpr = D // 8
    q_base = q_ptr + b * N * C
    k_base = k_ptr + b * N * C
    v_base = v_ptr + b * N * C
    row = n[:, None] * C
    q_rms, k_rms = inverse_rms(q_base + row, k_base + row, nmask, norm_eps, C, BS, BC, HAS_QNORM, HAS_KNORM,
                               qr_ptr, kr_ptr, b * N + n, GIVEN_RMS)
    m_q = ucpe_tiles.token_matrix(pt_ptr, b * spt_b + n * spt_n, spt_i, spt_j, nmask)
    m_k = ucpe_tiles.token_matrix(pinv_ptr, b * spi_b + n * spi_n, spi_i, spi_j, nmask)
    c0, s0, c1, s1 = ucpe_tiles.rope_tiles(rope_ptr, n, nmask, BS, GU, NGU, HAS_ROPE, False)
    if FOLD_BETA:
        t = n // S
        sb_off = t * sb_t + (n - t * S) * sb_s
    ch = tl.arange(0, 4 * GU)
    cmask = ch < HALF
    tmask = nmask[:, None] & cmask[None, :]
    src_a = row + ch[None, :]
    dst_a = n[:, None] * D + ch[None, :]
    for h in range(H):
        src = src_a + h * D
        xqa = tl.load(q_base + src, mask=tmask, other=0.0)
        xqb = tl.load(q_base + src + HALF, mask=tmask, other=0.0)
        xka = tl.load(k_base + src, mask=tmask, other=0.0)
        xkb = tl.load(k_base + src + HALF, mask=tmask, other=0.0)
        xva = tl.load(v_base + src, mask=tmask, other=0.0)
        xvb = tl.load(v_base + src + HALF, mask=tmask, other=0.0)
        dst = (b * H + h) * N * D + dst_a
        wqa = tl.zeros((4 * GU,), dtype=tl.float32)
        wqb = wqa
        wka = wqa
        wkb = wqa
        if HAS_QNORM:
            wqa = tl.load(qw_ptr + h * D + ch, mask=cmask, other=0.0).to(tl.float32)
            wqb = tl.load(qw_ptr + h * D + HALF + ch, mask=cmask, other=0.0).to(tl.float32)
        if HAS_KNORM:
            wka = tl.load(kw_ptr + h * D + ch, mask=cmask, other=0.0).to(tl.float32)
            wkb = tl.load(kw_ptr + h * D + HALF + ch, mask=cmask, other=0.0).to(tl.float32)
        one = tl.full((BS,), 1.0, tl.float32)
        root = one
        if FOLD_BETA:
            root = tl.sqrt(tl.load(beta_ptr + b * sb_b + h * sb_h + sb_off, mask=nmask, other=0.0).to(tl.float32))
        ya, yb, _, _ = encode_halves(xqa.to(tl.float32), xqb.to(tl.float32), wqa, wqb, q_rms, m_q, c0, s0, c1, s1,
                                      1.0, one, BS, GU, D, HAS_QNORM, True, HAS_ROPE, DOWNSCALE)
        tl.store(q_out + dst, ya.to(q_out.dtype.element_ty), mask=tmask)
        tl.store(q_out + dst + HALF, yb.to(q_out.dtype.element_ty), mask=tmask)
        k_fold = one
        if FOLD_BETA:
            k_fold = root / k_scale
        ya, yb, pre, post = encode_halves(xka.to(tl.float32), xkb.to(tl.float32), wka, wkb, k_rms, m_k, c0, s0, c1,
                                           s1, k_scale, k_fold, BS, GU, D, HAS_KNORM, True, HAS_ROPE, DOWNSCALE)
        tl.store(infl_out + (b * H + h) * N + n, ucpe_tiles.inflation_sq(pre, post, nmask), mask=nmask)
        tl.store(k_out + dst, ya.to(k_out.dtype.element_ty), mask=tmask)
        tl.store(k_out + dst + HALF, yb.to(k_out.dtype.element_ty), mask=tmask)
        ya, yb, _, _ = encode_halves(xva.to(tl.float32), xvb.to(tl.float32), wqa, wqb, q_rms, m_k, c0, s0, c1, s1,
                                      1.0, root, BS, GU, D, False, False, HAS_ROPE, DOWNSCALE)
        tl.store(v_out + dst, ya.to(v_out.dtype.element_ty), mask=tmask)
        tl.store(v_out + dst + HALF, yb.to(v_out.dtype.element_ty), mask=tmask)


def cam_stage(q, k, v, views, *, num_frames, q_norm_weight, k_norm_weight, norm_eps, downscale,
              beta=None, out_dtype=torch.float32, block_s=16, num_warps=4, maxnreg=None, q_inv_rms=None,
              k_inv_rms=None):
    """Launch _cam_encode_kernel on validated inputs: the launch step of `cam_prep` and of
    `kernels.camera_branch`, no op of its own (its launch knobs for benchmarks: bench/tune_cam_branch.py).
    views = ray_views(...) (read in place). Returns (q', k', v',
    inflation_sq) with encodings (B, H, N, D) in out_dtype and inflation (B, H, N) fp32. With
    `beta` the key/value are stored beta-folded (see _cam_encode_kernel). maxnreg: register cap
    per thread (None: the compiler's choice). q_inv_rms, k_inv_rms: see `given_inv_rms`."""
    batch, tokens, heads, dim = q.shape
    spatial = tokens // num_frames
    outs = [torch.empty(batch, heads, tokens, dim, device=q.device, dtype=out_dtype) for _ in range(3)]
    infl = torch.empty(batch, heads, tokens, device=q.device, dtype=torch.float32)
    dummy = infl
    beta_args = (beta, *beta.stride()) if beta is not None else (dummy, 0, 0, 0, 0)
    _, p_t, p_inv, rope = views
    given = given_inv_rms(q_inv_rms, k_inv_rms, q_norm_weight, k_norm_weight, batch, tokens, q.device)
    _cam_encode_kernel[(cdiv(tokens, block_s), batch)](
        q, k, v, *beta_args,
        q_norm_weight if q_norm_weight is not None else dummy,
        k_norm_weight if k_norm_weight is not None else dummy,
        *(given or (dummy, dummy)),
        p_t, *p_t.stride(), p_inv, *p_inv.stride(), rope if rope is not None else dummy,
        outs[0], outs[1], outs[2], infl, tokens, spatial, float(norm_eps), float(dim ** -0.5 * spatial ** -0.5),
        H=heads, D=dim, GU=next_power_of_2(dim // 8), BS=block_s, BC=256,
        HAS_QNORM=q_norm_weight is not None, HAS_KNORM=k_norm_weight is not None, GIVEN_RMS=given is not None,
        HAS_ROPE=rope is not None, DOWNSCALE=bool(downscale), FOLD_BETA=beta is not None, num_warps=num_warps,
        **(dict(maxnreg=maxnreg) if maxnreg else {}))
    return outs[0], outs[1], outs[2], infl


def given_inv_rms(q_inv_rms, k_inv_rms, q_norm_weight, k_norm_weight, batch, tokens, device):
    """The (q, k) per-token inverse RMS computed outside (each (B, N) fp32 contiguous; a tensor
    without a norm gets a placeholder), or None when neither is given (computed inside).

    Given for one normed tensor, it must be given for the other normed one (one rule per call)."""
    if q_inv_rms is None and k_inv_rms is None:
        return None
    out = []
    for name, inv_rms, weight in (("q_inv_rms", q_inv_rms, q_norm_weight), ("k_inv_rms", k_inv_rms, k_norm_weight)):
        if weight is None:
            out.append(None)
        elif inv_rms is None:
            raise ValueError(f"{name} must be given with the other inverse RMS (both normed tensors)")
        else:
            out.append(check_inv_rms(name, inv_rms, batch, tokens, device))
    placeholder = next(t for t in out if t is not None) if any(t is not None for t in out) else None
    if placeholder is None:
        return None
    return tuple(placeholder if t is None else t for t in out)


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
             norm_eps=1e-5, downscale=True, q_inv_rms=None, k_inv_rms=None, backend="auto"):
    """Triton camera prep with cam_prep_ref's contract.

    q, k, v: (B, N, H, D) raw camera projections, contiguous, any float dtype.
    backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `cam_prep_ref`), "triton", "torch".
    Returns (q_enc, k_enc, v_enc, inflation_sq): (B, H, T, S, D) fp32 x3 and (B, H, T, S) fp32.
    """
    batch, tokens, heads, dim = check_projections(q, k, v)
    if num_frames <= 0 or tokens % num_frames:
        raise ValueError(f"num_frames must divide N={tokens}, got {num_frames}")
    frames, spatial = num_frames, tokens // num_frames
    check_norm_weight("q_norm_weight", q_norm_weight, heads * dim)
    check_norm_weight("k_norm_weight", k_norm_weight, heads * dim)
    views = ray_views(ray_transforms, batch, tokens, dim, q.device)
    if not use_triton(q, backend):
        return cam_prep_ref(q, k, v, ray_transforms, num_frames=num_frames, q_norm_weight=q_norm_weight,
                            k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale, q_inv_rms=q_inv_rms,
                            k_inv_rms=k_inv_rms)
    q_enc, k_enc, v_enc, infl = cam_stage(q, k, v, views, num_frames=frames, q_norm_weight=q_norm_weight,
                                          k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale,
                                          q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms)
    shape = (batch, heads, frames, spatial, dim)
    return q_enc.view(shape), k_enc.view(shape), v_enc.view(shape), infl.view(shape[:4])
