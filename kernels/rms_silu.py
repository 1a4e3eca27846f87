"""The LTX-2 VAE decoder's RMS norm over channels and SiLU in one pass over channels-last activations
(reference: `kernels.rms_silu_reference`).

    rms_silu(x, eps)  x (B, C, T, H, W) channels-last (N, T, H, W, C in memory) -> silu(x / rms(x over C)),
                      the same shape, dtype and layout

Stock diffusers runs `PerChannelRMSNorm` (x^2, a mean over dim 1, + eps, sqrt, a division) and then SiLU as
six kernels, each a pass over the activation; on channels-last activations a position's channels are one
contiguous row, so one kernel reads each row once and writes the result once. Values are rounded to x's
dtype where the stock ops write a tensor, so the results match stock's up to the sum's order and `exp`.
"""
import torch
import triton
import triton.language as tl

from ._rounding import cast_as, round_as
from ._validate import check_tensor, use_triton
from .rms_silu_reference import rms_silu_ref


@triton.jit
def _rms_silu_kernel(x_ptr, out_ptr, rows, C, inv_c, eps, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    channel = tl.arange(0, BLOCK_C)
    mask = (row[:, None] < rows) & (channel[None, :] < C)
    offsets = row[:, None] * C + channel[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = round_as(tl.sum(round_as(x * x, DT), axis=1) * inv_c, DT)
    rms = round_as(tl.sqrt_rn(round_as(mean + eps, DT)), DT)
    y = round_as(tl.div_rn(x, rms[:, None]), DT)
    tl.store(out_ptr + offsets, cast_as(tl.div_rn(y, 1.0 + tl.exp(-y)), DT), mask=mask)


_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def rms_silu(x, eps=1e-8, *, backend="auto"):
    """silu(x / sqrt(mean(x^2 over channels) + eps)) for x (B, C, T, H, W); see the module docstring. The
    kernel reads channels-last x (an NCDHW x is laid out channels-last first: one copy)."""
    check_tensor("x", x, (None, None, None, None, None), contiguous=False)
    if not use_triton(x, backend):
        return rms_silu_ref(x, eps)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    out = torch.empty_like(x, memory_format=torch.channels_last_3d)
    channels = x.shape[1]
    rows = x.numel() // channels if channels else 0
    if rows:
        block_c = triton.next_power_of_2(channels)
        block_r = max(1, min(64, 4096 // block_c))
        _rms_silu_kernel[(triton.cdiv(rows, block_r),)](x, out, rows, channels, 1.0 / channels, eps,
                                                       BLOCK_R=block_r, BLOCK_C=block_c, DT=_DTYPES[x.dtype],
                                                       num_warps=4)
    return out
