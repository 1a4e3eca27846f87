"""UCPE encode / decode around the camera SDPA of SANA-WM's softmax blocks.

encode: raw camera projections q, k, v (B, N, C) -> full-C RMSNorm (q, k; no ReLU, no scale),
UCPE 4x4 on the first half of each head (P_T for q, P_inv for k and v: y = M x per group of 4
channels), RoPE on the second half (interleaved pairs), downscale to the pre-UCPE RMS over the
head; written as (B, N, H, DPAD) with zero padding (DPAD = 128 for D = 112), so
`.transpose(1, 2)` is an SDPA-ready (B, H, N, DPAD) view; no fp32 copies.
decode: SDPA output (B, H, N, DPAD) (any strides) -> P on the first half, inverse RoPE on the
second -> (B, N, C).

Both kernels follow kernels.cam_prep._cam_encode_kernel: one program per (BS tokens, batch
row) loops over the heads; each head vector moves as two contiguous half rows (16-byte
accesses), split into channel-phase quads in registers (kernels.ucpe_tiles); the token
matrices (read in place through their strides: diffusers' P_T is a transposed view), the
RoPE table and, for encode, the full-C inverse RMS of q and k are computed once per program.
References: `kernels.softmax_cam_reference.cam_softmax_encode_ref` / `cam_softmax_decode_ref`.
"""
import torch
import triton
import triton.language as tl

from . import ucpe_tiles
from ._grid import cdiv, filling_tile, next_power_of_2
from ._validate import multiprocessors, use_triton
from .cam_prep import encode_halves, given_inv_rms, inverse_rms, ray_views
from .softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref

__all__ = ["cam_softmax_encode", "cam_softmax_decode"]

# Launch parameters from the H200 sweep at the release shape (bench/bench_softmax_cam.py,
# bench/results/2026-11-29_softmax_camera_h200.json); neighbouring settings differ by about 0.01 ms. The encode's 16
# tokens a program are halved on a segment's few tokens, as far as the GPU needs to be filled (`_grid.filling_tile`):
# 1.15 ms a segment against 1.33 on an H200. The decode's are not: halved, it took 0.51 ms against 0.37.
ENCODE_LAUNCH = dict(block_s=16, num_warps=4)
DECODE_LAUNCH = dict(block_s=16, num_warps=2)


@triton.jit
def _encode_head(src, dst, tmask, pad_dst, pad_mask, w_ptr, inv_rms, m, c0, s0, c1, s1, one, ch, cmask,
                 BS: tl.constexpr, GU: tl.constexpr, D: tl.constexpr, DPAD: tl.constexpr,
                 HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr):
    """Encode one head of BS tokens: src/dst (BS, 4GU) pointers to the first-half channels of
    the input rows and of the (BS, DPAD) output rows; channels [D, DPAD) are written as zeros."""
    HALF: tl.constexpr = D // 2
    xa = tl.load(src, mask=tmask, other=0.0).to(tl.float32)
    xb = tl.load(src + HALF, mask=tmask, other=0.0).to(tl.float32)
    wa = tl.zeros((4 * GU,), dtype=tl.float32)
    wb = wa
    if HAS_NORM:
        wa = tl.load(w_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
        wb = tl.load(w_ptr + HALF + ch, mask=cmask, other=0.0).to(tl.float32)
    ya, yb, _, _ = encode_halves(xa, xb, wa, wb, inv_rms, m, c0, s0, c1, s1, 1.0, one, BS, GU, D, HAS_NORM,
                                  False, HAS_ROPE, DOWNSCALE)
    dtype = dst.dtype.element_ty
    tl.store(dst, ya.to(dtype), mask=tmask)
    tl.store(dst + HALF, yb.to(dtype), mask=tmask)
    if DPAD > D:
        tl.store(pad_dst, tl.zeros(pad_dst.shape, dtype=dtype), mask=pad_mask)


@triton.jit
def _encode_kernel(q_ptr, k_ptr, v_ptr, sqb, sqn, skb, skn, svb, svn, qw_ptr, kw_ptr, qr_ptr, kr_ptr,
                   pt_ptr, spt_b, spt_n, spt_i, spt_j, pinv_ptr, spi_b, spi_n, spi_i, spi_j, rope_ptr,
                   q_out, k_out, v_out, sob, son, soh, skvb, skvn, skvh, N, norm_eps,
                   H: tl.constexpr, D: tl.constexpr, DPAD: tl.constexpr, GU: tl.constexpr, PADW: tl.constexpr,
                   BS: tl.constexpr, BC: tl.constexpr, HAS_QNORM: tl.constexpr, HAS_KNORM: tl.constexpr,
                   GIVEN_RMS: tl.constexpr, HAS_ROPE: tl.constexpr, DOWNSCALE: tl.constexpr):
    """One program per (block of BS tokens, b): q, k and v of every head of those tokens.

    Inputs (B, N, H*D) with channel stride 1 (row strides s*b, s*n); outputs (B, N, H, DPAD) with channel
    stride 1, q's (batch, token, head) strides so*, k's and v's skv*. The full-C inverse RMS of q and k comes from
    a first pass over the rows.
    """
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BS + tl.arange(0, BS)
    nmask = n < N
    C: tl.constexpr = H * D
    q_rows = q_ptr + b * sqb + n[:, None].to(tl.int64) * sqn
    k_rows = k_ptr + b * skb + n[:, None].to(tl.int64) * skn
    v_rows = v_ptr + b * svb + n[:, None].to(tl.int64) * svn
    q_rms, k_rms = inverse_rms(q_rows, k_rows, nmask, norm_eps, C, BS, BC, HAS_QNORM, HAS_KNORM,
                               qr_ptr, kr_ptr, b * N + n, GIVEN_RMS)
    m_q = ucpe_tiles.token_matrix(pt_ptr, b * spt_b + n * spt_n, spt_i, spt_j, nmask)
    m_k = ucpe_tiles.token_matrix(pinv_ptr, b * spi_b + n * spi_n, spi_i, spi_j, nmask)
    c0, s0, c1, s1 = ucpe_tiles.rope_tiles(rope_ptr, n, nmask, BS, GU, D // 8, HAS_ROPE, False)
    one = tl.full((BS,), 1.0, tl.float32)
    ch = tl.arange(0, 4 * GU)
    cmask = ch < D // 2
    tmask = nmask[:, None] & cmask[None, :]
    pad = D + tl.arange(0, PADW)
    pad_mask = nmask[:, None] & (pad < DPAD)[None, :]
    q_rows_out = (b * sob + n.to(tl.int64) * son)[:, None]
    kv_rows_out = (b * skvb + n.to(tl.int64) * skvn)[:, None]
    for h in range(H):
        src = h * D + ch[None, :]
        q_dst = q_out + q_rows_out + h * soh
        kv_dst = kv_rows_out + h * skvh
        _encode_head(q_rows + src, q_dst + ch[None, :], tmask, q_dst + pad[None, :], pad_mask, qw_ptr + h * D,
                     q_rms, m_q, c0, s0, c1, s1, one, ch, cmask, BS, GU, D, DPAD, HAS_QNORM, HAS_ROPE, DOWNSCALE)
        _encode_head(k_rows + src, k_out + kv_dst + ch[None, :], tmask, k_out + kv_dst + pad[None, :], pad_mask,
                     kw_ptr + h * D, k_rms, m_k, c0, s0, c1, s1, one, ch, cmask, BS, GU, D, DPAD, HAS_KNORM,
                     HAS_ROPE, DOWNSCALE)
        _encode_head(v_rows + src, v_out + kv_dst + ch[None, :], tmask, v_out + kv_dst + pad[None, :], pad_mask,
                     kw_ptr, k_rms, m_k, c0, s0, c1, s1, one, ch, cmask, BS, GU, D, DPAD, False, HAS_ROPE, DOWNSCALE)


@triton.jit
def _decode_kernel(o_ptr, sob, soh, son, p_ptr, sp_b, sp_n, sp_i, sp_j, rope_ptr, out_ptr, N,
                   H: tl.constexpr, D: tl.constexpr, GU: tl.constexpr, BS: tl.constexpr, HAS_ROPE: tl.constexpr):
    """One program per (block of BS tokens, b): o (B, H, N, >= D) (channel stride 1) ->
    out (B, N, H*D) contiguous, y = P x on the first half of each head, inverse RoPE on the second."""
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(0) * BS + tl.arange(0, BS)
    nmask = n < N
    HALF: tl.constexpr = D // 2
    m = ucpe_tiles.token_matrix(p_ptr, b * sp_b + n * sp_n, sp_i, sp_j, nmask)
    c0, s0, c1, s1 = ucpe_tiles.rope_tiles(rope_ptr, n, nmask, BS, GU, D // 8, HAS_ROPE, True)
    one = tl.full((BS,), 1.0, tl.float32)
    ch = tl.arange(0, 4 * GU)
    tmask = nmask[:, None] & (ch < HALF)[None, :]
    unused_w = tl.zeros((4 * GU,), dtype=tl.float32)
    src_rows = o_ptr + b * sob + n[:, None].to(tl.int64) * son + ch[None, :]
    dst_rows = out_ptr + (b * N + n)[:, None] * (H * D) + ch[None, :]
    dtype = out_ptr.dtype.element_ty
    for h in range(H):
        src = src_rows + h * soh
        xa = tl.load(src, mask=tmask, other=0.0).to(tl.float32)
        xb = tl.load(src + HALF, mask=tmask, other=0.0).to(tl.float32)
        ya, yb, _, _ = encode_halves(xa, xb, unused_w, unused_w, one, m, c0, s0, c1, s1, 1.0, one, BS, GU, D,
                                      False, False, HAS_ROPE, False)
        tl.store(dst_rows + h * D, ya.to(dtype), mask=tmask)
        tl.store(dst_rows + h * D + HALF, yb.to(dtype), mask=tmask)


def _pad_dim(dim):
    return 128 if dim <= 128 else 256


def _filled(launch: dict, tokens: int, batch: int, like) -> dict:
    """`launch` with its block of tokens cut for a grid that fills the GPU (`_grid.filling_tile`)."""
    return dict(launch, block_s=filling_tile(tokens, batch, launch["block_s"], multiprocessors(like.device)))


def _half_groups(dim):
    """GU: groups of four per half head vector (D/8), padded to a power of two."""
    return next_power_of_2(dim // 8)


def ray_inputs(ray_transforms, batch, tokens, dim, device):
    """cam_prep.ray_views of (P, P_T, P_inv, rope_cam), also accepting (N, 4, 4) matrices and a
    (cos, sin) RoPE pair of (N, D/4) each."""
    if not isinstance(ray_transforms, (tuple, list)) or len(ray_transforms) != 4:
        raise ValueError("ray_transforms must be the tuple (P, P_T, P_inv, rope_cam)")
    mats = [m[None] if isinstance(m, torch.Tensor) and m.dim() == 3 else m for m in ray_transforms[:3]]
    rope = ray_transforms[3]
    if isinstance(rope, (tuple, list)):
        cos, sin = rope
        rope = torch.complex(cos.float(), sin.float())
    return ray_views((*mats, rope), batch, tokens, dim, device)


def _check_dim(dim):
    if dim <= 0 or dim % 8:
        raise ValueError(f"camera head dim must be a positive multiple of 8, got {dim}")


def _kv_slots(kv_out, shape, dtype) -> list:
    """Checked (k, v) output views of cam_softmax_encode's `kv_out`: shape (B, N, H, DPAD), `dtype`, unit channel
    stride and one layout for both (the kernel takes one set of strides for the two)."""
    k_out, v_out = kv_out
    for name, t in (("k", k_out), ("v", v_out)):
        if tuple(t.shape) != shape or t.dtype != dtype or t.stride(-1) != 1:
            raise ValueError(f"{name} out must be a {shape} {dtype} view with unit channel stride, got "
                             f"{tuple(t.shape)} {t.dtype} strides {t.stride()}")
    if k_out.stride() != v_out.stride():
        raise ValueError(f"k and v outs must share their strides, got {k_out.stride()} and {v_out.stride()}")
    return [k_out, v_out]


def encode_launch(q, k, v, views, *, q_norm_weight, k_norm_weight, norm_eps, heads, downscale, out_dtype,
                  block_s, num_warps, q_inv_rms=None, k_inv_rms=None, kv_out=None):
    """Launch _encode_kernel on validated inputs (views = ray_inputs(...)); see cam_softmax_encode."""
    batch, tokens, channels = q.shape
    dim = channels // heads
    dpad = _pad_dim(dim)
    shape = (batch, tokens, heads, dpad)
    outs = [torch.empty(shape, device=q.device, dtype=out_dtype)]
    if kv_out is None:
        outs += [torch.empty(shape, device=q.device, dtype=out_dtype) for _ in range(2)]
    else:
        outs += _kv_slots(kv_out, shape, out_dtype)
    _, p_t, p_inv, rope = views
    dummy = outs[0]
    given = given_inv_rms(q_inv_rms, k_inv_rms, q_norm_weight, k_norm_weight, batch, tokens, q.device)
    grid = (cdiv(tokens, block_s), batch)
    _encode_kernel[grid](
        q, k, v, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_norm_weight if q_norm_weight is not None else dummy, k_norm_weight if k_norm_weight is not None else dummy,
        *(given or (dummy, dummy)),
        p_t, *p_t.stride(), p_inv, *p_inv.stride(), rope if rope is not None else dummy,
        outs[0], outs[1], outs[2], *outs[0].stride()[:3], *outs[1].stride()[:3], tokens, float(norm_eps),
        H=heads, D=dim, DPAD=dpad, GU=_half_groups(dim), PADW=next_power_of_2(max(dpad - dim, 1)),
        BS=block_s, BC=min(256, next_power_of_2(channels)), HAS_QNORM=q_norm_weight is not None,
        HAS_KNORM=k_norm_weight is not None, GIVEN_RMS=given is not None, HAS_ROPE=rope is not None, DOWNSCALE=bool(downscale),
        num_warps=num_warps)
    return tuple(outs)


def decode_launch(o, views, *, dim, out_dtype, block_s, num_warps):
    """Launch _decode_kernel on validated inputs (views = ray_inputs(...)); see cam_softmax_decode."""
    batch, heads, tokens, _ = o.shape
    p, _, _, rope = views
    out = torch.empty(batch, tokens, heads * dim, device=o.device, dtype=out_dtype)
    _decode_kernel[(cdiv(tokens, block_s), batch)](
        o, o.stride(0), o.stride(1), o.stride(2), p, *p.stride(), rope if rope is not None else out, out,
        tokens, H=heads, D=dim, GU=_half_groups(dim), BS=block_s, HAS_ROPE=rope is not None, num_warps=num_warps)
    return out


def cam_softmax_encode(q, k, v, ray_transforms, *, q_norm_weight=None, k_norm_weight=None, norm_eps=1e-5,
                       heads, downscale=True, out_dtype=None, q_inv_rms=None, k_inv_rms=None, kv_out=None,
                       backend="auto"):
    """Encode raw camera projections for SDPA.

    Args:
        q, k, v: (B, N, C) raw projections (any row strides; made channel-contiguous if needed).
        ray_transforms: diffusers' (P, P_T, P_inv, rope_cam): matrices (B or 1, N, 4, 4) (any
            strides), rope_cam complex (1, 1, N, D/4) or None.
        q_norm_weight, k_norm_weight: (C,) RMSNorm weights or None (no norm).
        heads: H (head dim D = C / H, D % 8 == 0). out_dtype: storage dtype (default q.dtype).
        q_inv_rms, k_inv_rms: optional (B, N) fp32 1 / RMS per token of q and k, used instead of the
            one over these C channels (head split); both or neither.
        kv_out: optional (k_out, v_out) views to write k_enc and v_enc into, (B, N, H, DPAD) in out_dtype with unit
            channel stride and one layout (a softmax window's slots, (B, H, n, DPAD) transposed).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `cam_softmax_encode_ref`), "triton",
            "torch".

    Returns:
        (q_enc, k_enc, v_enc), each (B, N, H, DPAD), zero past D: q_enc contiguous, k_enc and v_enc contiguous or
        `kv_out`'s views.
    """
    batch, tokens, channels = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one shape (B, N, C), got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if channels % heads:
        raise ValueError(f"C={channels} is not divisible by heads={heads}")
    dim = channels // heads
    _check_dim(dim)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    views = ray_inputs(ray_transforms, batch, tokens, dim, q.device)
    out_dtype = out_dtype or q.dtype
    if not use_triton(q, backend):
        encoded = cam_softmax_encode_ref(
            q, k, v, ray_transforms, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, norm_eps=norm_eps,
            heads=heads, downscale=downscale, out_dtype=out_dtype, q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms)
        if kv_out is None:
            return encoded
        k_out, v_out = _kv_slots(kv_out, encoded[1].shape, out_dtype)
        return encoded[0], k_out.copy_(encoded[1]), v_out.copy_(encoded[2])
    return encode_launch(q, k, v, views, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                         norm_eps=norm_eps, heads=heads, downscale=downscale, out_dtype=out_dtype,
                         q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms, kv_out=kv_out,
                         **_filled(ENCODE_LAUNCH, tokens, batch, q))


def cam_softmax_decode(o, ray_transforms, *, dim, out_dtype=None, backend="auto"):
    """Decode the camera SDPA output back to world space.

    Args:
        o: (B, H, N, DPAD) SDPA output (any strides, channel stride 1); the first `dim` channels are used.
        ray_transforms: diffusers' (P, P_T, P_inv, rope_cam).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `cam_softmax_decode_ref`), "triton",
            "torch".

    Returns:
        (B, N, H * dim) contiguous in out_dtype (default o.dtype).
    """
    batch, heads, tokens, width = o.shape
    _check_dim(dim)
    if width < dim:
        raise ValueError(f"o must hold at least dim={dim} channels per head, got shape {tuple(o.shape)}")
    if o.stride(-1) != 1:
        o = o.contiguous()
    views = ray_inputs(ray_transforms, batch, tokens, dim, o.device)
    if not use_triton(o, backend):
        return cam_softmax_decode_ref(o, ray_transforms, dim=dim, out_dtype=out_dtype)
    return decode_launch(o, views, dim=dim, out_dtype=out_dtype or o.dtype, **DECODE_LAUNCH)
