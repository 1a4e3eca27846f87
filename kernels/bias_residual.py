"""The end of an LTX-2 decoder resnet in one pass over channels-last activations (reference:
`kernels.bias_residual_reference`).

    bias_residual(x, bias, residual)  x, residual (B, C, T, H, W) channels-last, bias (C,)
                                      -> (x + bias) + residual, in x (returned)

Stock runs the second conv's bias as a pass of its own (cuDNN's conv leaves it to an `add_`) and the residual
as another: five activation-sized reads and writes. x is the conv's output, run without its bias; here one
kernel reads x and the residual and writes x, rounding to x's dtype after each sum as stock does.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, channel_rows
from ._rounding import cast_as, round_as
from ._validate import check_tensor, use_triton
from .bias_residual_reference import bias_residual_ref

__all__ = ["bias_residual"]


@triton.jit
def _bias_residual_kernel(x_ptr, bias_ptr, residual_ptr, rows, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    channel = tl.arange(0, BLOCK_C)
    mask = (row[:, None] < rows) & (channel[None, :] < C)
    offsets = row[:, None] * C + channel[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + channel, mask=channel < C, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + offsets, cast_as(round_as(x + bias[None, :], DT) + residual, DT), mask=mask)


def bias_residual(x, bias, residual, *, backend="auto"):
    """(x + bias) + residual for x, residual (B, C, T, H, W) and bias (C,), written into x (channels-last
    contiguous, batch 1 or whole) and returned; see the module docstring."""
    check_tensor("x", x, (None, None, None, None, None), contiguous=False)
    channels = x.shape[1]
    check_tensor("bias", bias, (channels,))
    check_tensor("residual", residual, tuple(x.shape), contiguous=False)
    if not use_triton(x, backend):
        return x.copy_(bias_residual_ref(x, bias, residual))
    if not x.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError("x must be channels-last contiguous (it is written in place)")
    residual = residual.contiguous(memory_format=torch.channels_last_3d)
    rows = x.numel() // channels if channels else 0
    if rows:
        block_r, block_c = channel_rows(channels)
        _bias_residual_kernel[(cdiv(rows, block_r),)](x, bias, residual, rows, channels, BLOCK_R=block_r,
                                                      BLOCK_C=block_c, num_warps=4)
    return x
