"""Plain PyTorch references of `kernels.fp8_quant`: per-row FP8 e4m3 quantization (the same bits), and the same
after a tanh-approximated GELU (rounded to the input's dtype first, as the stock GELU writes it).
"""
import torch
import torch.nn.functional as F


E4M3_MAX = 448.0


TINY = 1e-12


def quantize_rows_ref(x):
    """The PyTorch reference: (q (M, K) e4m3, scale (M, 1) fp32)."""
    wide = x.float()
    scale = wide.abs().amax(dim=-1, keepdim=True).clamp(min=TINY) / E4M3_MAX
    return (wide / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def gelu_quantize_rows_ref(x):
    """`quantize_rows_ref` of the GELU (tanh approximation) of x, the GELU written in x's dtype as stock writes it."""
    return quantize_rows_ref(F.gelu(x, approximate="tanh"))
