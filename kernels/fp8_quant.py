"""Per-row (per-token) FP8 e4m3 quantization of activations in one kernel (reference: `kernels.fp8_quant_reference`).

    quantize_rows(x)       x (M, K) bf16/fp16/fp32 -> (q (M, K) float8_e4m3fn, scale (M, 1) fp32)
                           amax = max(amax(|x_row|), 1e-12), scale = amax / 448,
                           q = clamp(x * (448 / amax), -448, 448) rounded to nearest even
    gelu_quantize_rows(x)  the same of gelu(x) (tanh approximation), the GELU rounded to x's dtype first: the
                           FFN's GELU and the next linear's quantization in one kernel (no GELU tensor written;
                           the GELU agrees with PyTorch's to fp32 rounding, see `_gelu_tanh`)
    merge_heads_quantize_rows(o, gate_logits=None)
                           an attention output o (B, N, H, D) (any strides, D contiguous, e.g. SDPA's transposed
                           result) -> the rows (B * N, H * D) quantized, after the optional per-head output gate
                           o * 2 sigmoid(gate_logits (B, N, H)) in o's dtype (LTX-2's gated attention): the
                           attention's head merge and its output projection's quantization in one kernel

`row_scales` and `to_e4m3` are the two steps as Triton functions, for kernels that quantize the rows they
compute (`kernels.block_glue.ada_norm(..., quantize=True)`).

The PyTorch sequence (`quantize_rows_ref`: an fp32 copy, |x|, the row max, the reciprocal, the product, the
clamp, the cast) makes about six passes over the activation in fp32; the kernel reads x once in its own dtype
(rows up to `ONE_PASS_MAX` wide, held in registers; wider ones twice: the row max, then the quantization) and
writes the e4m3 bytes once. Both give the same bits: fp32 math, IEEE divisions (`div_rn`) for the row's two
numbers, round to nearest even into e4m3 (finite values only: |x * 448 / amax| <= 448). Each value is multiplied
by the row's reciprocal, not divided by its scale: a division per value made the kernel compute-bound (2640 x
2240 bf16 rows on the H200: 25 us dividing, 11 us multiplying; 2-4 e4m3 values in 10^4 differ, by one step).
This is what `camrender.model.fp8.Fp8Linear` runs before `torch._scaled_mm` on CUDA.
"""
import torch
import triton
import triton.language as tl

from ._grid import next_power_of_2
from ._rounding import _INTERPRETED, round_as
from ._validate import check_tensor, use_triton
from .fp8_quant_reference import (E4M3_MAX, TINY, gelu_quantize_rows_ref, merge_heads_quantize_rows_ref,
                                  quantize_rows_ref)

__all__ = ["quantize_rows", "gelu_quantize_rows", "merge_heads_quantize_rows"]

ONE_PASS_MAX = 16384  # the widest row `quantize_rows` reads once (held in registers)
# the same two numbers as the kernels see them: compiled Triton reads only constexpr globals
_E4M3_MAX_K = tl.constexpr(E4M3_MAX)
_TINY_K = tl.constexpr(TINY)


@triton.jit
def _round_to_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32: the cast after it is
    exact. Only the Triton interpreter needs it (its cast truncates); compiled, the cast rounds to nearest even
    itself."""
    bits = v.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1  # e4m3 keeps 3 of fp32's 23 mantissa bits
    normal = ((bits + 0x7FFFF + lsb) & -0x100000).to(tl.float32, bitcast=True)
    # below 2^-6 e4m3 steps by 2^-9, the ulp of 1.5 * 2^14 in fp32; the magnitude rounded, the sign put back
    magnitude = ((tl.abs(v) + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
    subnormal = (magnitude | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def row_scales(values, axis: tl.constexpr):
    """(scale, inverse) of fp32 rows (padding lanes 0) along `axis`: amax = max(amax(|values|), 1e-12),
    scale = amax / 448 (what the GEMM multiplies back), inverse = 448 / amax (what `to_e4m3` multiplies by)."""
    amax = tl.maximum(tl.max(tl.abs(values), axis=axis), _TINY_K)
    return tl.div_rn(amax, _E4M3_MAX_K), tl.div_rn(_E4M3_MAX_K, amax)


@triton.jit
def to_e4m3(values, inverse):
    """fp32 values * inverse, clamped to +-448, rounded to nearest even, as e4m3."""
    scaled = tl.minimum(tl.maximum(values * inverse, -_E4M3_MAX_K), _E4M3_MAX_K)
    if _INTERPRETED:
        scaled = _round_to_e4m3(scaled)
    return scaled.to(tl.float8e4nv)


@triton.jit
def _gelu_tanh(x, DT: tl.constexpr):
    """The tanh-approximated GELU 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), in fp32 as
    x / (1 + exp(-2 u)) (the same function; Triton's interpreter has no tanh), rounded to DT. Against PyTorch's
    tanhf form it differs by fp32 rounding: now and then one ulp of DT. The division is the GPU's fast one
    (within 2 fp32 ulps, below DT's rounding): the IEEE one made the FFN's GELU-quantize compute-bound."""
    inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
    return round_as(tl.fdiv(x, 1.0 + tl.exp(-2.0 * inner), ieee_rounding=False), DT)


@triton.jit
def _load_row(x_row, offsets, mask, GELU: tl.constexpr):
    values = tl.load(x_row + offsets, mask=mask, other=0.0)
    wide = values.to(tl.float32)
    if GELU:
        wide = _gelu_tanh(wide, values.dtype)
    return wide


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr,
                          GELU: tl.constexpr = False):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    q_row = q_ptr + row.to(tl.int64) * stride_q
    if BLOCK >= K:  # the row in registers: read once
        offsets = tl.arange(0, BLOCK)
        mask = offsets < K
        values = _load_row(x_row, offsets, mask, GELU)
        scale, inverse = row_scales(values, 0)
        tl.store(scale_ptr + row, scale)
        tl.store(q_row + offsets, to_e4m3(values, inverse), mask=mask)
    else:  # the row's max, then the quantization, reading it twice
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            values = _load_row(x_row, offsets, offsets < K, GELU)
            amax = tl.maximum(amax, tl.abs(values))
        scale, inverse = row_scales(amax, 0)
        tl.store(scale_ptr + row, scale)
        for start in range(0, K, BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < K
            values = _load_row(x_row, offsets, mask, GELU)
            tl.store(q_row + offsets, to_e4m3(values, inverse), mask=mask)


@triton.jit
def _merge_heads_quantize_kernel(o_ptr, gate_ptr, q_ptr, scale_ptr, tokens, stride_ob, stride_on, stride_oh,
                                 stride_gb, stride_gn, HEADS: tl.constexpr, D: tl.constexpr, HP: tl.constexpr,
                                 DP: tl.constexpr, HAS_GATE: tl.constexpr):
    row = tl.program_id(0)  # one token row of B * N
    b = (row // tokens).to(tl.int64)
    n = (row % tokens).to(tl.int64)
    h = tl.arange(0, HP)[:, None]
    d = tl.arange(0, DP)[None, :]
    mask = (h < HEADS) & (d < D)
    o = tl.load(o_ptr + b * stride_ob + n * stride_on + h * stride_oh + d, mask=mask, other=0.0)
    DT: tl.constexpr = o.dtype
    values = o.to(tl.float32)
    if HAS_GATE:  # stock: sigmoid(logits) -> tensor; 2 * it (exact) -> tensor; o * gates -> tensor
        logits = tl.load(gate_ptr + b * stride_gb + n * stride_gn + h, mask=h < HEADS, other=0.0).to(tl.float32)
        gates = 2.0 * round_as(1.0 / (1.0 + tl.exp(-logits)), DT)
        values = round_as(values * gates, DT)
    scale, inverse = row_scales(tl.max(tl.abs(values), axis=1), 0)  # the max over heads of each head's
    tl.store(scale_ptr + row, scale)
    tl.store(q_ptr + row.to(tl.int64) * (HEADS * D) + h * D + d, to_e4m3(values, inverse), mask=mask)


def quantize_rows(x, *, backend="auto"):
    """Per-row e4m3 quantization of x (M, K) (last dimension contiguous); see the module docstring."""
    return _quantize(x, backend, gelu=False)


def gelu_quantize_rows(x, *, backend="auto"):
    """Per-row e4m3 quantization of gelu(x) (tanh approximation) for x (M, K); see the module docstring."""
    return _quantize(x, backend, gelu=True)


def merge_heads_quantize_rows(o, gate_logits=None, *, backend="auto", num_warps=8):
    """Per-row e4m3 quantization of the attention output o (B, N, H, D) merged to rows (B * N, H * D), after the
    optional output gate o * 2 sigmoid(gate_logits (B, N, H)); see the module docstring. num_warps: launch
    override."""
    check_tensor("o", o, (None, None, None, None), contiguous=False, last_dim_contiguous=True)
    batch, tokens, heads, dim = o.shape
    if gate_logits is not None:
        check_tensor("gate_logits", gate_logits, (batch, tokens, heads), contiguous=False, last_dim_contiguous=True)
    if not use_triton(o, backend):
        return merge_heads_quantize_rows_ref(o, gate_logits)
    q = torch.empty(batch * tokens, heads * dim, device=o.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty(batch * tokens, 1, device=o.device, dtype=torch.float32)
    gate = gate_logits if gate_logits is not None else o
    if batch * tokens:
        _merge_heads_quantize_kernel[(batch * tokens,)](
            o, gate, q, scale, tokens, o.stride(0), o.stride(1), o.stride(2), gate.stride(0), gate.stride(1),
            HEADS=heads, D=dim, HP=next_power_of_2(heads), DP=next_power_of_2(dim),
            HAS_GATE=gate_logits is not None, num_warps=num_warps)
    return q, scale


def _quantize(x, backend, gelu: bool):
    check_tensor("x", x, (None, None), contiguous=False, last_dim_contiguous=True)
    if not use_triton(x, backend):
        return gelu_quantize_rows_ref(x) if gelu else quantize_rows_ref(x)
    rows, width = x.shape
    q = torch.empty(rows, width, device=x.device, dtype=torch.float8_e4m3fn)
    scale = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    if rows:
        # up to ONE_PASS_MAX wide (the refiner FFN's 16384) the row is read once, 16 values per thread at most
        # (32 warps: 126 us against 135 at 16 and 139 read twice, bench/bench_glue.py on the H200); wider rows
        # in 2048-wide chunks, twice
        block = next_power_of_2(max(width, 16))
        block = block if block <= ONE_PASS_MAX else 2048
        warps = max(4, min(32, block // 512))
        _quantize_rows_kernel[(rows,)](x, q, scale, width, x.stride(0), q.stride(0), BLOCK=block, GELU=gelu,
                                       num_warps=warps)
    return q, scale
