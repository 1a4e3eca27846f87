"""Plain PyTorch references of `kernels.fp8_quant`: per-row FP8 e4m3 quantization (the same bits), the same
after a tanh-approximated GELU (rounded to the input's dtype first, as the stock GELU writes it), and of an
attention output's merged heads after LTX-2's optional output gate (the stock processor's ops).
"""
import torch
import torch.nn.functional as F


E4M3_MAX = 448.0


TINY = 1e-12


def quantize_by_amax(wide, amax):
    """fp32 values and their amax (already floored at `TINY`, broadcastable: per row or one for all) -> (q e4m3,
    scale = amax / 448 fp32): the values multiplied by 448 / amax (the kernels' reciprocal), clamped, rounded."""
    limit = torch.full_like(amax, E4M3_MAX)  # tensor / tensor: PyTorch turns a division by a scalar into a product
    return (wide * (limit / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), amax / limit


def quantize_rows_ref(x):
    """The PyTorch reference: (q (M, K) e4m3, scale (M, 1) fp32), `quantize_by_amax` of each row."""
    wide = x.float()
    return quantize_by_amax(wide, wide.abs().amax(dim=-1, keepdim=True).clamp(min=TINY))


def gelu_quantize_rows_ref(x):
    """`quantize_rows_ref` of the GELU (tanh approximation) of x, the GELU written in x's dtype as stock writes it."""
    return quantize_rows_ref(F.gelu(x, approximate="tanh"))


def merge_heads_quantize_rows_ref(o, gate_logits=None):
    """o (B, N, H, D) [* 2 sigmoid(gate_logits (B, N, H)) per head, in o's dtype] as rows (B * N, H * D),
    quantized: (q, scale (B * N, 1))."""
    if gate_logits is not None:
        o = o * (2.0 * torch.sigmoid(gate_logits.to(o.dtype))).unsqueeze(-1)
    return quantize_rows_ref(o.reshape(-1, o.shape[-2] * o.shape[-1]))
