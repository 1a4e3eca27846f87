"""SANA-WM's FFN (`GLUMBConvTemp`) in the token-major layout, on the fused GLU depthwise kernel.

The stock forward permutes (B, N, C) to channels-first images for its 1x1 / depthwise convs and
back, and runs the temporal conv on non-contiguous views. Here everything stays (B, T, S, C):

    h = x @ W_inv^T + b_inv                          (B*T, S, 2Hd)   cuBLAS
    g = kernels.ffn_glu.glu_depthwise(h, ...)        (B*T, S, Hd)    silu, 3x3 depthwise, GLU
    y = point_act(g @ W_point^T (+ b_point))         (B, T, S, C)    cuBLAS
    z = temporal conv of y over frames (kernel 3)    (B, T, S, C)    cuDNN, channels-last in place; on a
                                                                     segment-mode call, cuBLAS GEMMs per tap
    out = y + z

`ffn_parts` returns y and z separately (the block's fused residual computes x + gate * (y + z)) and
takes the segment-mode rule: `segments` (frame ranges) cut the temporal conv on the right of each
range, and `left` is the cached last frame of y before the call. `PatchedGLUMBConvTemp` adopts a
stock module (same parameters, no copies); settings backend "torch" runs the stock forward.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import GLUMBConvTemp

from camrender.kernels.ffn_glu import glu_depthwise
from camrender.model.adopt import adopt_module
from camrender.model.fp8 import conv_linear
from camrender.model.settings import KernelSettings

# PyTorch's conv kernels index with 32 bits; keep one temporal conv call under this many elements.
_CONV_ELEMENTS_LIMIT = 1 << 30

# Calls of at most this many frames (in bf16 or fp16 on a GPU; any dtype on a CPU) run the temporal conv as one GEMM
# per tap (`_temporal_gemms`). Only 3 frames are measured (`bench/bench_ffn.py`'s segment call). A convolution
# also multiplies the zero padding: 2 of its 3 T tap-frames hold no data, 22 % of the work at a segment's 3 frames
# (8 % at 8), and segment mode's cached left frame is one more GEMM on top. Longer calls (full mode) keep cuDNN.
TEMPORAL_GEMM_MAX_FRAMES = 8


def _fusable(mlp) -> bool:
    """Whether the fused spatial path computes this module's function (the released layout:
    1x1 inverted conv + silu, 3x3 depthwise conv without activation, silu GLU, 1x1 point conv)."""
    inverted, depth, point = mlp.inverted_conv.conv, mlp.depth_conv.conv, mlp.point_conv.conv
    return (
        isinstance(mlp.inverted_conv.act, torch.nn.SiLU)
        and isinstance(mlp.glu_act, torch.nn.SiLU)
        and mlp.depth_conv.act is None
        and inverted.kernel_size == (1, 1) and point.kernel_size == (1, 1)
        and depth.kernel_size == (3, 3) and depth.padding == (1, 1) and depth.groups == depth.in_channels
    )


def ffn_input_linear(mlp):
    """The `Fp8Linear` that reads the FFN's input when the fused spatial path runs it (`ffn_parts`; the inverted
    conv quantized by `camrender.model.fp8.quantize_blocks`), else None: `ffn_parts` then takes that input as a
    `QuantizedRows`."""
    if not isinstance(mlp, GLUMBConvTemp) or not _fusable(mlp):
        return None
    return getattr(mlp.inverted_conv.conv, "fp8", None)


def _spatial_fused(mlp, x, frames, height, width, backend):
    """Inverted conv -> GLU depthwise -> point conv, token-major. x (B, N, C) -> y (B, T, S, C_out)."""
    batch, tokens, channels = x.shape
    inverted, depth, point = mlp.inverted_conv.conv, mlp.depth_conv.conv, mlp.point_conv.conv
    hidden = conv_linear(x, inverted)  # (B, N, 2Hd)
    gated = glu_depthwise(hidden.view(batch * frames, height * width, -1), depth.weight, depth.bias,
                          height, width, backend=backend)
    del hidden
    reduce_partial = getattr(point, "reduce_partial", None)  # head split: sum the ranks' partial products
    if reduce_partial is None:
        y = conv_linear(gated, point)
    else:
        y = reduce_partial(conv_linear(gated, point, bias=False))
    if mlp.point_conv.act is not None:
        y = mlp.point_conv.act(y)
    return y.view(batch, frames, height * width, -1)


def _spatial_stock(mlp, x, frames, height, width):
    """The stock spatial convs (any activation layout), returned token-major (B, T, S, C_out)."""
    batch, _, channels = x.shape
    images = x.reshape(batch * frames, height, width, channels).permute(0, 3, 1, 2)
    hidden = mlp.depth_conv(mlp.inverted_conv(images))
    value, gate = torch.chunk(hidden, 2, dim=1)
    y = mlp.point_conv(value * mlp.glu_act(gate))
    return y.permute(0, 2, 3, 1).reshape(batch, frames, height * width, -1)


def _conv_frames(y, weight, bias):
    """Temporal conv (kernel (k, 1), zero padding k//2) of y (B, T, S, C) over T -> (B, T, S, C).

    y's memory is the channels-last (NHWC) layout of the (B, C, T, S) image y.permute(0, 3, 1, 2),
    so cuDNN reads it in place and writes a channels-last result (checked, else copied).
    """
    batch = y.shape[0]
    if batch > 1 and y.numel() > _CONV_ELEMENTS_LIMIT:
        return torch.cat([_conv_frames(y[i:i + 1], weight, bias) for i in range(batch)])
    out = F.conv2d(y.permute(0, 3, 1, 2), weight, bias, padding=(weight.shape[2] // 2, 0))
    out = out.permute(0, 2, 3, 1)
    return out if out.is_contiguous() else out.contiguous()


def channels_last_kernel(mlp) -> None:
    """Lay the temporal conv's weight out channels-last, in place (the same parameter and values), as cuDNN reads
    it: otherwise every call copies the kernel (30 MB at the release size, 100 times per segment).

    `state_dict()` then holds that weight channels-last: `save_pretrained` and `torch.save` take it as it is,
    `safetensors.torch.save_file` on a raw state dict needs `.contiguous()` tensors."""
    weight = mlp.t_conv.weight
    if weight.dim() == 4 and not weight.is_contiguous(memory_format=torch.channels_last):
        weight.data = weight.data.contiguous(memory_format=torch.channels_last)


def _temporal(mlp, y, left, segments):
    """z = t_conv(y) over frames with the chunk-causal rule; y (B, T, S, C) contiguous.

    Each (start, stop) range sees zero after `stop`; the first range sees `left` (B, 1, S, C) (or
    zero) before frame 0; later ranges see the previous frame of the call. A call of a few frames runs as GEMMs
    per tap (`_temporal_gemms`, see TEMPORAL_GEMM_MAX_FRAMES), a longer one as cuDNN convolutions.
    """
    t_conv = mlp.t_conv
    # float32 on a GPU keeps cuDNN: its convolutions run in TF32 by default (as stock's), cuBLAS's GEMMs do not
    if t_conv.weight.shape[2] == 3 and t_conv.bias is None and y.shape[1] <= TEMPORAL_GEMM_MAX_FRAMES \
            and not (y.is_cuda and y.dtype == torch.float32):
        return _temporal_gemms(t_conv.weight, y, left, segments)
    # a no-op on a kernel laid out channels-last at adoption (`channels_last_kernel`)
    weight = t_conv.weight.to(y.dtype).contiguous(memory_format=torch.channels_last)  # (C, C, k, 1)
    bias = None if t_conv.bias is None else t_conv.bias.to(y.dtype)
    if left is None and len(segments) == 1:
        return _conv_frames(y, weight, bias)
    if weight.shape[2] != 3:
        raise NotImplementedError("segment mode supports the temporal kernel 3 of the released models")
    if len(segments) == 1:
        z = _conv_frames(y, weight, bias)
    else:
        z = torch.empty_like(y)
        for start, stop in segments:
            # frames [start - 1, stop): the extra frame is the left context, its own output dropped
            first = max(start - 1, 0)
            part = _conv_frames(y[:, first:stop], weight, bias)
            z[:, start:stop] = part[:, start - first:]
    if left is not None:
        _add_left_tap(z, _tap(t_conv.weight, 0, y.dtype), left)
    return z


def _tap(weight, k: int, dtype) -> torch.Tensor:
    """Tap k of the (C_out, C_in, 3, 1) temporal kernel as the (C_in, C_out) right operand of a token-row GEMM.
    On the channels-last kernel (`channels_last_kernel`) it is a column-major view with a leading dimension of
    3 C_in, which cuBLAS reads in place (a contiguous copy cost 3.8 ms a segment at the release size)."""
    return weight[:, :, k, 0].t().to(dtype)


def _add_left_tap(z, tap0, left) -> None:
    """Frame 0's left tap, z[:, 0] += left[:, 0] @ tap0, in place (cuBLAS accumulates in fp32)."""
    left = left.to(z.dtype)
    for b in range(z.shape[0]):
        z[b, 0].addmm_(left[b, 0], tap0)


def _temporal_gemms(weight, y, left, segments):
    """`_temporal` of a kernel-3 conv without bias as GEMMs on token rows: z (B, T, S, C) of y (B, T, S, C).

    z[t] = y[t - 1] @ tap0 + y[t] @ tap1 + y[t + 1] @ tap2 (`_tap`). Frames are S contiguous token rows, so a tap
    is a GEMM on a contiguous run of rows, accumulated into z in place: the same-frame tap over every frame (one
    GEMM); per batch row, the previous-frame tap over frames 1.. (segments see the previous frame of the call) and
    `left` at frame 0, and the next-frame tap within each segment, up to its last frame. cuBLAS sums each product
    in fp32 and rounds z to y's dtype after each one."""
    batch, frames, spatial, channels = y.shape
    rows = y.view(batch, frames * spatial, channels)
    z = torch.mm(rows.view(-1, channels), _tap(weight, 1, y.dtype)).view(batch, frames * spatial, -1)
    tap0, tap2 = _tap(weight, 0, y.dtype), _tap(weight, 2, y.dtype)
    for b in range(batch):
        if frames > 1:
            z[b, spatial:].addmm_(rows[b, :-spatial], tap0)
        for start, stop in segments:
            if stop - start > 1:
                z[b, start * spatial:(stop - 1) * spatial].addmm_(rows[b, (start + 1) * spatial:stop * spatial], tap2)
    z = z.view(batch, frames, spatial, -1)
    if left is not None:
        _add_left_tap(z, tap0, left)
    return z


def ffn_parts(mlp, x: torch.Tensor, frames: int, height: int, width: int, *, left: Optional[torch.Tensor] = None,
              segments: Optional[Sequence[tuple]] = None, backend: Optional[str] = None):
    """The two terms of `GLUMBConvTemp`'s output, token-major: out = y + z.

    Args:
        mlp: a `GLUMBConvTemp` (stock or patched); its parameters are read, never copied.
        x: (B, N, C) input, N = frames * height * width (frame-major tokens); a `QuantizedRows` of it where
            `ffn_input_linear(mlp)` reads it.
        left: (B, 1, S, C) last frame of y before this call (segment mode) or None (zero).
        segments: (start, stop) frame ranges tiling [0, frames); the temporal conv sees zero after
            each range's end. None = one range, the whole call.
        backend: GLU depthwise backend ("auto", "triton", "torch"); None = the patched module's
            `settings.backend` ("auto", Triton on CUDA or under TRITON_INTERPRET=1, for a stock one).

    Returns:
        y: (B, N, C_out) spatial part (point conv output); z: (B, N, C_out) temporal conv of y.
    """
    batch, tokens, _ = x.shape
    if tokens != frames * height * width:
        raise ValueError(f"x holds {tokens} tokens, frames * height * width = {frames * height * width}")
    segments = [tuple(s) for s in (segments or [(0, frames)])]
    if segments[0][0] != 0 or segments[-1][1] != frames or any(a[1] != b[0] for a, b in zip(segments, segments[1:])) \
            or any(start >= stop for start, stop in segments):
        raise ValueError(f"segments {segments} must tile the {frames} frames of the call")
    if backend is None:
        backend = getattr(mlp, "settings", KernelSettings()).backend
    if _fusable(mlp):
        y = _spatial_fused(mlp, x, frames, height, width, backend)
    else:
        y = _spatial_stock(mlp, x, frames, height, width)
    if left is not None and tuple(left.shape) != (batch, 1, height * width, y.shape[-1]):
        raise ValueError(f"left must have shape ({batch}, 1, {height * width}, {y.shape[-1]}), "
                         f"got {tuple(left.shape)}")
    z = _temporal(mlp, y, left, segments)
    return y.view(batch, tokens, -1), z.view(batch, tokens, -1)


class PatchedGLUMBConvTemp(GLUMBConvTemp):
    """`GLUMBConvTemp` on the fused token-major path; x (B, N, C) -> (B, N, C), HW = (T, H, W).

    Built only by `adopt(stock, settings)`: it takes over the stock module's parameters and
    sub-modules (no copies), so `state_dict()` is unchanged. Settings backend "torch" runs the stock
    forward. (Patched blocks call `ffn_parts` directly, with their segment-mode inputs.)
    """

    settings: KernelSettings = KernelSettings()

    def runs_convs_as_linears(self) -> bool:
        """Whether every call runs the 1x1 convs through `conv_linear` (fused settings and the released
        layout): `camrender.model.fp8.quantize_blocks` may then replace their weights."""
        return self.settings.fused and _fusable(self)

    @classmethod
    def adopt(cls, stock: GLUMBConvTemp, settings: KernelSettings = KernelSettings()) -> "PatchedGLUMBConvTemp":
        patched = adopt_module(cls, stock, settings=settings)
        channels_last_kernel(patched)
        return patched

    def forward(self, hidden_states: torch.Tensor, HW=None) -> torch.Tensor:
        if not self.settings.fused:
            return super().forward(hidden_states, HW)
        frames, height, width = HW
        y, z = ffn_parts(self, hidden_states, frames, height, width)
        return z.add_(y)  # z is a fresh tensor of this call: add in place, no third buffer


def patch_ffn(mlp, settings: KernelSettings = KernelSettings()):
    """Return the patched FFN for `mlp` (a `GLUMBConvTemp`; its settings updated in place if already patched)."""
    if isinstance(mlp, PatchedGLUMBConvTemp):
        mlp.settings = settings
        return mlp
    if not isinstance(mlp, GLUMBConvTemp):
        raise TypeError(f"expected a GLUMBConvTemp FFN, got {type(mlp).__name__}")
    return PatchedGLUMBConvTemp.adopt(mlp, settings)
