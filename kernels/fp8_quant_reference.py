"""Plain PyTorch reference of `kernels.fp8_quant.quantize_rows`, per-row FP8 e4m3 quantization (the same bits).
"""
import torch


E4M3_MAX = 448.0


TINY = 1e-12


def quantize_rows_ref(x):
    """The PyTorch reference: (q (M, K) e4m3, scale (M, 1) fp32)."""
    wide = x.float()
    scale = wide.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / E4M3_MAX
    return (wide / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale
