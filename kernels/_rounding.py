"""Rounding fp32 register values the way diffusers' PyTorch code rounds its intermediate tensors.

A fused kernel keeps values in fp32 registers across steps that the stock model runs as separate
PyTorch ops, each writing a tensor in the model's dtype (bf16 LayerNorm output, bf16 `gate * y`,
...). Rounding at the same points keeps the fused result bit-compatible with the stock model, so
patched and stock outputs differ only where the arithmetic itself differs (sum order, scans).

On the GPU the round trip is the hardware's round-to-nearest-even convert. The Triton interpreter's
fp32 -> bf16 cast truncates instead, so there (the CPU tests compare these kernels bit for bit with
PyTorch) bf16 is rounded on the bits, PyTorch's rule; that takes ~7 integer ops per value, which
measurably slows the memory-bound kernels on the GPU.
"""
import os

import triton
import triton.language as tl

_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def round_as(x, DT: tl.constexpr):
    """fp32 x rounded to dtype DT (bf16, fp16 or fp32; fp32 is a no-op), returned as fp32."""
    if DT == tl.bfloat16 and _INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
    elif DT == tl.bfloat16 or DT == tl.float16:
        return x.to(DT).to(tl.float32)
    else:
        return x


@triton.jit
def cast_as(x, DT: tl.constexpr):
    """fp32 x rounded to DT and cast to it (what a store in DT should hold)."""
    return round_as(x, DT).to(DT)
