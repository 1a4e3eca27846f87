"""The LTX-2 VAE decoder's RMS norm over channels and SiLU in one pass over channels-last activations
(reference: `kernels.rms_silu_reference`).

    rms_silu(x, eps, bias=None, out=None)
        x (B, C, T, H, W) channels-last (N, T, H, W, C in memory) -> silu(x / rms(x over C)), the same shape,
        dtype and layout; bias (C,): added to x first (the convolution before the norm, run without its bias);
        out: written here instead of a new tensor, any view with unit channel stride (e.g. the interior of a
        causal conv's padded input, after the cached frames)

Stock diffusers runs `PerChannelRMSNorm` (x^2, a mean over dim 1, + eps, sqrt, a division) and then SiLU as
six kernels, each a pass over the activation; on channels-last activations a position's channels are one
contiguous row, so one kernel reads each row once and writes the result once. Values are rounded to x's
dtype where the stock ops write a tensor, so the results match stock's up to the sum's order and `exp`.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, channel_rows
from ._rounding import cast_as, round_as
from ._validate import check_tensor, use_triton
from .rms_silu_reference import rms_silu_ref

__all__ = ["rms_silu"]


@triton.jit
def _rms_silu_kernel(x_ptr, bias_ptr, out_ptr, rows, C, T, H, W, out_sb, out_st, out_sh, out_sw, inv_c, eps,
                     HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    # rows < 2**31 (checked at launch): the row's position below is taken apart in int32, a few instructions a
    # division where int64 ones call a software routine; only the addresses are int64
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    channel = tl.arange(0, BLOCK_C)
    mask = (row[:, None] < rows) & (channel[None, :] < C)
    x = tl.load(x_ptr + row.to(tl.int64)[:, None] * C + channel[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:  # stock adds the conv's bias as a tensor of its own: rounded
        bias = tl.load(bias_ptr + channel, mask=channel < C, other=0.0).to(tl.float32)
        x = round_as(x + bias[None, :], DT)
    mean = round_as(tl.sum(round_as(x * x, DT), axis=1) * inv_c, DT)
    rms = round_as(tl.sqrt_rn(round_as(mean + eps, DT)), DT)
    y = round_as(tl.div_rn(x, rms[:, None]), DT)
    # the row's position (b, t, h, w) in out, which may be a strided view (the interior of a padded buffer)
    w = row % W
    image_row = row // W
    h = image_row % H
    frame = image_row // H
    t = frame % T
    b = frame // T
    out_row = (b.to(tl.int64) * out_sb + t.to(tl.int64) * out_st + h.to(tl.int64) * out_sh
               + w.to(tl.int64) * out_sw)
    tl.store(out_ptr + out_row[:, None] + channel[None, :], cast_as(tl.div_rn(y, 1.0 + tl.exp(-y)), DT), mask=mask)


def rms_silu(x, eps=1e-8, *, bias=None, out=None, backend="auto"):
    """silu(x' / sqrt(mean(x'^2 over channels) + eps)), x' = x + bias (rounded to x's dtype) or x, for
    x (B, C, T, H, W) and bias (C,); see the module docstring. The kernel reads channels-last x (an NCDHW x
    is laid out channels-last first: one copy). out: x's shape and dtype, channels unit-strided (any view of a
    channels-last buffer); returned."""
    check_tensor("x", x, (None, None, None, None, None), contiguous=False)
    channels = x.shape[1]
    if bias is not None:
        check_tensor("bias", bias, (channels,))
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device
                            or (out.numel() and out.stride(1) != 1)):
        raise ValueError(f"out must be a {tuple(x.shape)} {x.dtype} tensor on {x.device} with unit channel stride")
    if not use_triton(x, backend):
        result = rms_silu_ref(x, eps, bias=bias)
        return result if out is None else out.copy_(result)
    positions = x.numel() // max(channels, 1)
    if positions >= 2**31:
        raise ValueError(f"x has {positions} positions; the kernel takes fewer than 2**31")
    x = x.contiguous(memory_format=torch.channels_last_3d)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.channels_last_3d)
    rows = x.numel() // channels if channels else 0
    if rows:
        block_r, block_c = channel_rows(channels)
        _, _, frames, height, width = x.shape
        out_sb, _, out_st, out_sh, out_sw = out.stride()
        _rms_silu_kernel[(cdiv(rows, block_r),)](x, x if bias is None else bias, out, rows, channels, frames,
                                                 height, width, out_sb, out_st, out_sh, out_sw, 1.0 / channels, eps,
                                                 HAS_BIAS=bias is not None, BLOCK_R=block_r, BLOCK_C=block_c,
                                                 num_warps=4)
    return out
