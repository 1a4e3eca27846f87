"""FP8 (e4m3) W8A8 linear layers for the transformer blocks: `--precision fp8`.

Each chosen `nn.Linear` of a block (and stage 1's 1x1 FFN convs, which camrender's FFN runs as
linears) is replaced once at load by an `Fp8Linear`: the weight (N, K) quantized to e4m3 with one
fp32 scale per output channel (row-wise, the default) or one for the whole tensor (per-tensor,
the usual default elsewhere, kept for the quality comparison of bench/bench_fp8.py); at every call
the activations (M, K) are quantized per token (row-wise: one Triton pass, `kernels/fp8_quant.py`, the
same bits as `quantize`) or per tensor, and
`torch._scaled_mm` multiplies the two e4m3 operands with fp32 accumulation and applies both
scales and the bias, writing the activation's dtype.

What stays in bf16, as NVlabs' FP8 recipe scopes it: the camera branch (`*_cam`, `plucker_proj`),
the conditioning outside the blocks (timestep, caption, patch embeddings), norms, attention itself
(SDPA / GDN), and projections whose shapes `_scaled_mm` cannot take (K or N not a multiple of 16:
stage 1's per-head `beta_proj` / `gate_proj`).

Where the kernel that writes an activation can quantize it as well (the refiner block's adaLN glue, its
attentions' head merge: `camrender.model.refiner.block`; stage 1's adaLN glue, gated residual, output gate and
head merge: `camrender.model.stage1.block`), it hands the linear a `QuantizedRows` instead of the bf16 tensor, the
same bits as quantizing that tensor; `takes_quantized` says when every reader of an activation would accept one.

`torch._scaled_mm` contract used here (torch 2.11 on CUDA and 2.13 on CPU): mat1 (M, K) row-major
e4m3, mat2 (K, N) column-major e4m3 (the transposed view of the (N, K) weight), scale_a (M, 1) and
scale_b (1, N) fp32 for row-wise scaling or 0-dim fp32 scalars for per-tensor scaling; on CUDA
row-wise needs compute capability 8.9+ (Ada, Hopper) and a bf16 output.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import torch
import torch.nn.functional as F

from camrender.kernels.fp8_quant import gelu_quantize_rows, quantize_rows
from camrender.kernels.fp8_quant_reference import quantize_by_amax

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
SCALINGS = ("row", "tensor")
PRECISIONS = ("bf16", "fp8")
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9) and Hopper (9.0) on
# names (any dotted part) of the modules that stay in bf16: the camera branch
KEEP_BF16 = ("plucker_proj", "q_proj_cam", "k_proj_cam", "v_proj_cam", "out_proj_cam")
_TINY = 1e-12  # floor of an amax, so an all-zero row quantizes to zeros (not NaN)


def quantize(x: torch.Tensor, scaling: str = "row") -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) e4m3, scale fp32) with x ~= q * scale.

    scaling "row": one scale per row, shape (M, 1) (amax of the row / 448); "tensor": one 0-dim scale. x is
    multiplied by 448 / amax, as `kernels.fp8_quant` does (row-wise: the same bits).
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    wide = x.float()
    amax = wide.abs().amax(dim=-1, keepdim=True) if scaling == "row" else wide.abs().amax()
    return quantize_by_amax(wide, amax.clamp(min=_TINY))


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


@dataclasses.dataclass(frozen=True)
class QuantizedRows:
    """An activation (*lead, K) in `dtype`, already quantized row-wise for an `Fp8Linear`: q (M, K) e4m3 and
    scale (M, 1) fp32, M = prod(lead): the bits `quantize_rows` would give on the activation."""

    q: torch.Tensor
    scale: torch.Tensor
    lead: tuple
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.lead, self.q.shape[-1]))


class Fp8Linear(torch.nn.Module):
    """`nn.Linear` (or a 1x1 conv's (N, K, 1, 1) weight) as e4m3 weight + scales; the forward takes
    x (..., K) and returns (..., N) in x's dtype.

    Buffers: weight_fp8 (N, K) e4m3, weight_scale (1, N) fp32 (row) or 0-dim (tensor), bias (N,) in
    the original dtype or None. The original weight is not kept.
    """

    def __init__(self, weight: torch.Tensor, bias, scaling: str = "row"):
        super().__init__()
        weight = weight.detach()
        if weight.dim() == 4:  # a 1x1 conv
            weight = weight[:, :, 0, 0]
        self.out_features, self.in_features = weight.shape
        self.scaling = scaling
        q, scale = quantize(weight, scaling)
        self.register_buffer("weight_fp8", q.contiguous())
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous() if scaling == "row" else scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, scaling: str = "row", device=None) -> "Fp8Linear":
        """Quantize `linear` on `device` (default: where its weight is)."""
        weight = linear.weight.to(device) if device is not None else linear.weight
        bias = None if linear.bias is None else linear.bias.to(weight.device)
        return cls(weight, bias, scaling)

    @property
    def dtype(self):
        return torch.float32 if self.bias is None else self.bias.dtype

    backend = "auto"  # the activations' row-wise quantization: kernels.fp8_quant (Triton on CUDA) or "torch"
    # Hopper's FP8 tensor cores accumulate in reduced precision unless the GEMM promotes to fp32 every few
    # K steps; fast accumulation skips the promotion (Transformer Engine's forward-pass default, as NVlabs' FP8
    # recipe runs). bench/bench_fp8.py measures the error with it.
    fast_accum = True

    def forward(self, x) -> torch.Tensor:
        """x (..., K) in its dtype, or a `QuantizedRows` of one (a row-scaled layer only)."""
        if isinstance(x, QuantizedRows):
            if self.scaling != "row":
                raise ValueError("a per-tensor-scaled FP8 linear cannot take row-quantized input")
            return self.matmul(x.q, x.scale, x.lead, x.dtype)
        rows = x.reshape(-1, self.in_features)
        if self.scaling == "row":
            q, scale = quantize_rows(rows, backend=self.backend)
        else:
            q, scale = quantize(rows, self.scaling)
        return self.matmul(q, scale, x.shape[:-1], x.dtype)

    def matmul(self, q: torch.Tensor, scale: torch.Tensor, lead: tuple, dtype: torch.dtype) -> torch.Tensor:
        """The GEMM on an already quantized input: q (M, K) e4m3 with its scale -> (*lead, N) in `dtype`."""
        out = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=scale, scale_b=self.weight_scale,
                               bias=None if self.bias is None else self.bias.to(dtype), out_dtype=dtype,
                               use_fast_accum=self.fast_accum)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scaling={self.scaling}"


def takes_quantized(linears) -> bool:
    """Whether every layer of `linears` is a row-scaled `Fp8Linear` of one backend that a call runs as its own
    forward (no hooks, no wrapper): then one `QuantizedRows` of their common input serves them all, the same
    bits as each quantizing it. A layer with forward hooks (bench/bench_fp8.py's per-layer probes) or a wrapped
    forward must see its bf16 input."""
    linears = list(linears)
    return bool(linears) and all(isinstance(linear, Fp8Linear) and linear.scaling == "row"
                                 and linear.backend == linears[0].backend and not has_hooks(linear)
                                 for linear in linears)


def shared_input(x, linears):
    """What `linears`, which all read x, are to be called on: x quantized once, a `QuantizedRows` with the bits each
    of them would make, when there are two or more and `takes_quantized(linears)`; else x itself (also when x is a
    `QuantizedRows` already)."""
    linears = list(linears)
    if isinstance(x, QuantizedRows) or len(linears) < 2 or not takes_quantized(linears):
        return x
    q, scale = quantize_rows(x.reshape(-1, x.shape[-1]), backend=linears[0].backend)
    return QuantizedRows(q, scale, tuple(x.shape[:-1]), x.dtype)


def one_input_linears(x, linears) -> list:
    """[linear(x) for linear in linears], the same bits, with x quantized once (`shared_input`: a self-attention's
    q, k, v and gate projections read one input). x: a tensor, or a `QuantizedRows` when
    `takes_quantized(linears)`."""
    linears = list(linears)
    x = shared_input(x, linears)
    return [linear(x) for linear in linears]


def feed_forward(ff: torch.nn.Module, x) -> torch.Tensor:
    """diffusers' `FeedForward` `ff(x)` (GELU(proj) -> dropout -> linear [-> dropout]). Where its output linear is a
    row-scaled `Fp8Linear`, the GELU is not written: it runs inside that linear's row-wise quantization
    (`kernels.fp8_quant.gelu_quantize_rows`; the GELU rounded to x's dtype as stock rounds it, its fp32 math
    within rounding of PyTorch's). Modules with hooks, training-mode dropout or another activation: `ff(x)`.
    x: a tensor, or a `QuantizedRows` when `takes_quantized([ff_input_linear(ff)])` (which has checked the module:
    not again here, on the block's hot path)."""
    if not isinstance(x, QuantizedRows) and not _gelu_fusable(ff):
        return ff(x)
    h = ff.net[0].proj(x)
    out = ff.net[2]
    q, scale = gelu_quantize_rows(h.reshape(-1, h.shape[-1]), backend=out.backend)
    return out.matmul(q, scale, h.shape[:-1], h.dtype)


def ff_input_linear(ff: torch.nn.Module):
    """The linear that reads a `FeedForward`'s input when `feed_forward` runs it unwrapped, else None."""
    return ff.net[0].proj if _gelu_fusable(ff) else None


def _gelu_fusable(ff: torch.nn.Module) -> bool:
    net = list(getattr(ff, "net", ()))
    act, out = (net[0], net[2]) if len(net) in (3, 4) else (None, None)
    return (type(act).__name__ == "GELU" and getattr(act, "approximate", None) == "tanh"
            and isinstance(out, Fp8Linear) and out.scaling == "row"
            and all(isinstance(m, torch.nn.Dropout) and (m.p == 0 or not m.training) for m in net[1::2])
            and not any(has_hooks(m) for m in (ff, act, out)))


def has_hooks(module: torch.nn.Module) -> bool:
    """Whether calling the module runs more than its forward: hooks, or a forward set on the instance (offloading
    wrappers)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module)
                or torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)


def fits_scaled_mm(out_features: int, in_features: int) -> bool:
    """Whether `_scaled_mm` takes a weight of this shape (both sides multiples of 16)."""
    return out_features % 16 == 0 and in_features % 16 == 0


def _chosen(name: str, module) -> bool:
    parts = name.split(".")
    if any(part in KEEP_BF16 or part.startswith("audio") for part in parts):
        return False
    if isinstance(module, torch.nn.Linear):
        return fits_scaled_mm(module.out_features, module.in_features)
    return False


def quantize_blocks(blocks: Iterable[torch.nn.Module], scaling: str = "row", device=None) -> int:
    """Replace, in place, the linear layers of every block in `blocks` by `Fp8Linear`s (see the module
    docstring for which stay bf16), quantizing each on `device` (default: where it is). Stage 1's 1x1
    FFN convs get an `fp8` attribute that `camrender.model.stage1.ffn` uses instead of their weight.
    Returns the number of layers quantized."""
    count = 0
    for block in blocks:
        for name, module in list(block.named_modules()):
            for child_name, child in list(module.named_children()):
                full = f"{name}.{child_name}" if name else child_name
                if _chosen(full, child):
                    setattr(module, child_name, Fp8Linear.from_linear(child, scaling, device))
                    count += 1
        count += _quantize_ffn_convs(block, scaling, device)
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return count


def _quantize_ffn_convs(block, scaling, device) -> int:
    """Stage 1's GLUMBConv: the 1x1 inverted and point convs, which the fused FFN runs as linears (only when it
    does: `PatchedGLUMBConvTemp.runs_convs_as_linears`; the stock path reads the conv weights)."""
    mlp = getattr(block, "mlp", None)
    count = 0
    if mlp is None or not getattr(mlp, "runs_convs_as_linears", lambda: False)():
        return count
    for part in ("inverted_conv", "point_conv"):
        conv = getattr(getattr(mlp, part, None), "conv", None)
        if conv is None or conv.kernel_size != (1, 1) or conv.groups != 1:
            continue
        if not fits_scaled_mm(conv.out_channels, conv.in_channels):
            continue
        weight = conv.weight.to(device) if device is not None else conv.weight
        conv.fp8 = Fp8Linear(weight, None if conv.bias is None else conv.bias.to(weight.device), scaling)
        # the bf16 weight is no longer read by the fused FFN: keep a 1-element placeholder of its dtype
        conv.weight = torch.nn.Parameter(torch.empty(0, device=weight.device, dtype=weight.dtype),
                                         requires_grad=False)
        count += 1
    return count


def conv_linear(x: torch.Tensor, conv, bias: bool = True) -> torch.Tensor:
    """A 1x1 conv applied token-major as a linear: x (..., K) -> (..., N), through its `fp8` layer when
    `quantize_blocks` gave it one. bias=False leaves the bias out (the head split adds it once)."""
    fp8 = getattr(conv, "fp8", None)
    if fp8 is None:
        return F.linear(x, conv.weight[:, :, 0, 0], conv.bias if bias else None)
    if not bias and fp8.bias is not None:
        raise ValueError("an FP8 conv without its bias (the head split) is not supported")
    return fp8(x)


def is_quantized(module: torch.nn.Module) -> bool:
    return any(isinstance(m, Fp8Linear) or getattr(m, "fp8", None) is not None for m in module.modules())
