"""Fused bidirectional temporal short convolution (depthwise, kernel K over T).

Reads the projection output in place: `x` may be a strided slice of the fused qkv output
(B, N, 3C)[..., C:2C]; only the channel axis must be contiguous. One program computes a
(BLOCK_S tokens x BLOCK_C channels) tile of one frame from the 2K-1 neighbouring frames.
Reference: `kernels.short_conv_reference.short_conv_ref` (same arguments).

In segment mode the causal half reads the raw input of the K - 1 frames before the segment (the left context):
the op's `initial_state`, and with `output_final_state` the one it returns for the next segment.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv
from ._validate import use_triton
from .short_conv_reference import short_conv_ref, short_conv_state

__all__ = ["short_conv"]


@triton.jit
def _short_conv_kernel(
    x_ptr, w_ptr, ctx_ptr, out_ptr,
    stride_xb, stride_xn,
    stride_cb, stride_cn,
    T, S, C, CTX_FRAMES,
    K: tl.constexpr, HAS_CTX: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_ts = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2)
    n_sblocks = tl.cdiv(S, BLOCK_S)
    t = pid_ts // n_sblocks
    s_offs = (pid_ts % n_sblocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    c_offs = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    s_mask = s_offs < S
    c_mask = c_offs < C
    tile_mask = s_mask[:, None] & c_mask[None, :]
    x_base = x_ptr + b.to(tl.int64) * stride_xb + c_offs[None, :]

    w_last = tl.load(w_ptr + c_offs * K + (K - 1), mask=c_mask, other=0.0).to(tl.float32)
    row = (t * S + s_offs).to(tl.int64)
    centre = tl.load(x_base + row[:, None] * stride_xn, mask=tile_mask, other=0.0).to(tl.float32)
    acc = centre * w_last[None, :]
    for j in tl.static_range(K - 1):
        w_j = tl.load(w_ptr + c_offs * K + j, mask=c_mask, other=0.0).to(tl.float32)
        # causal tap: frame t - (K-1) + j; before frame 0 it reads the cached left context
        tc = t - (K - 1) + j
        rows_c = (tc * S + s_offs).to(tl.int64)
        val_c = tl.load(x_base + rows_c[:, None] * stride_xn, mask=tile_mask & (rows_c[:, None] >= 0),
                        other=0.0).to(tl.float32)
        if HAS_CTX:
            tctx = tc + CTX_FRAMES  # index into the context frames
            rows_x = (tctx * S + s_offs).to(tl.int64)
            use_ctx = (rows_c[:, None] < 0) & (rows_x[:, None] >= 0)
            val_x = tl.load(ctx_ptr + b.to(tl.int64) * stride_cb + rows_x[:, None] * stride_cn + c_offs[None, :],
                            mask=tile_mask & use_ctx, other=0.0).to(tl.float32)
            val_c += val_x
        # anti-causal tap: frame t + (K-1) - j, zero past the end
        ta = t + (K - 1) - j
        rows_a = (ta * S + s_offs).to(tl.int64)
        val_a = tl.load(x_base + rows_a[:, None] * stride_xn, mask=tile_mask & (rows_a[:, None] < T * S),
                        other=0.0).to(tl.float32)
        acc += w_j[None, :] * (val_c + val_a)
    out_offs = b.to(tl.int64) * T * S * C + row[:, None] * C + c_offs[None, :]
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=tile_mask)


def short_conv(x, weight, num_frames, *, initial_state=None, output_final_state=False, out=None, backend="auto"):
    """Bidirectional depthwise temporal conv of x; see `kernels.short_conv_reference.short_conv_ref`.

    Args:
        x: (B, N, C), N = num_frames * S; channel stride must be 1 (a slice of the qkv output is fine).
        weight: (C, 1, K) or (C, K).
        num_frames: T.
        initial_state: optional (B, F*S, C), F <= K-1 frames of raw input preceding x (the left context of
            segment mode: the causal half reads them, the anti-causal half stays inside x).
        output_final_state: also return the next segment's left context, the raw input of the last K-1 frames
            of initial_state then x (`short_conv_reference.short_conv_state`).
        out: optional contiguous (B, N, C) output buffer.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `short_conv_ref`), "triton", "torch".

    Returns:
        (out (B, N, C) contiguous in x.dtype, final_state (B, F'*S, C) contiguous or None unless
        output_final_state).
    """
    batch, tokens, channels = x.shape
    spatial = tokens // num_frames
    w = weight.reshape(channels, -1)
    ksize = w.shape[1]
    has_ctx = initial_state is not None and initial_state.shape[1] > 0
    if has_ctx and (initial_state.shape[1] > (ksize - 1) * spatial or initial_state.shape[1] % spatial):
        raise ValueError(f"initial_state must hold at most {ksize - 1} whole frames of {spatial} tokens, "
                         f"got {initial_state.shape[1]} tokens")
    if not use_triton(x, backend):
        y, final = short_conv_ref(x, weight, num_frames, initial_state=initial_state,
                                  output_final_state=output_final_state)
        return (y if out is None else out.copy_(y)), final
    if x.stride(-1) != 1:
        x = x.contiguous()
    w = w.contiguous()  # the module's weight, read in place and widened in the kernel
    if out is None:
        out = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype)
    if has_ctx:
        ctx = initial_state if initial_state.stride(-1) == 1 else initial_state.contiguous()
        ctx_frames, stride_cb, stride_cn = ctx.shape[1] // spatial, ctx.stride(0), ctx.stride(1)
    else:
        ctx, stride_cb, stride_cn, ctx_frames = x, 0, 0, 0
    block_s, block_c = 32, 128
    grid = (num_frames * cdiv(spatial, block_s), cdiv(channels, block_c), batch)
    _short_conv_kernel[grid](
        x, w, ctx, out, x.stride(0), x.stride(1), stride_cb, stride_cn,
        num_frames, spatial, channels, ctx_frames,
        K=ksize, HAS_CTX=has_ctx, BLOCK_S=block_s, BLOCK_C=block_c, num_warps=4,
    )
    return out, (short_conv_state(x, num_frames, initial_state, ksize - 1) if output_final_state else None)
