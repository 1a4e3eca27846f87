"""Inputs, op call and reference of the cases in kernels/cases.py around the attentions: a block's adaLN glue, the
FP8 linears' row quantization, the FFN's GLU depthwise stage, and the decoder's RMS norm + SiLU and bias + residual
(`_camera_cases` says how a call and a reference are made)."""
import torch

from ._camera_cases import floats
from ._random_inputs import Draw
from .bias_residual import bias_residual
from .bias_residual_reference import bias_residual_ref
from .block_glue import ada_norm, gated_residual, merge_heads, residual_ada_norm, silu_gate
from .block_glue_reference import (ada_norm_ref, gated_residual_ref, merge_heads_ref, residual_ada_norm_ref,
                                   silu_gate_ref)
from .ffn_glu import glu_depthwise
from .ffn_glu_reference import glu_depthwise_ref
from .fp8_quant import gelu_quantize_rows, merge_heads_quantize_rows, quantize_rows
from .fp8_quant_reference import gelu_quantize_rows_ref, merge_heads_quantize_rows_ref, quantize_rows_ref
from .rms_silu import rms_silu
from .rms_silu_reference import rms_silu_ref


# ----------------------------------------------------------------------------- adaLN glue
def glue_inputs(s, device, dtype):
    """Activations (B, N, C) and per-frame modulation rows (B, T, C); an attention output (B, N, H, D) laid out as
    SDPA's transposed result, and its per-head gate logits (B, N, H)."""
    d = Draw(7, device, dtype)
    tokens, frames = (s.batch, s.tokens, s.channels), (s.batch, s.frames, s.channels)
    x = dict(x=d.randn(tokens), y=d.randn(tokens), z=d.randn(tokens), shift=d.randn(frames),
             scale=d.randn(frames), gate=d.randn(frames), gate_tokens=d.randn(tokens))
    x.update(heads_out=d.randn((s.batch, s.heads, s.tokens, s.dim)).transpose(1, 2),
             head_gates=d.randn((s.batch, s.tokens, s.heads)))
    return x


def ada_norm_call(x, backend, matmul_precision):
    return ada_norm(x["x"], x["shift"], x["scale"], backend=backend)


def ada_norm_reference(x):
    x = floats(x, "x", "shift", "scale")
    return ada_norm_ref(x["x"], x["shift"], x["scale"])


def residual_ada_norm_call(x, backend, matmul_precision, norm="layer"):
    return residual_ada_norm(x["x"], x["y"], x["shift"], x["scale"], norm=norm, backend=backend)


def residual_ada_norm_reference(x, norm="layer"):
    x = floats(x, "x", "y", "shift", "scale")
    return residual_ada_norm_ref(x["x"], x["y"], x["shift"], x["scale"], norm=norm)


def gated_residual_call(x, backend, matmul_precision):
    return gated_residual(x["x"], x["y"], x["gate"], y2=x["z"], backend=backend)


def gated_residual_reference(x):
    x = floats(x, "x", "y", "gate", "z")
    return gated_residual_ref(x["x"], x["y"], x["gate"], y2=x["z"])


def silu_gate_call(x, backend, matmul_precision):
    return silu_gate(x["x"], x["gate_tokens"], b=x["y"], backend=backend)


def silu_gate_reference(x):
    x = floats(x, "x", "gate_tokens", "y")
    return silu_gate_ref(x["x"], x["gate_tokens"], b=x["y"])


def merge_heads_call(x, backend, matmul_precision):
    return merge_heads(x["heads_out"], backend=backend)


def merge_heads_reference(x):
    return merge_heads_ref(x["heads_out"].float())


# ----------------------------------------------------------------------------- FP8 rows
def quantize_rows_call(x, backend, matmul_precision):
    return quantize_rows(x["x"].flatten(0, 1), backend=backend)


def quantize_rows_reference(x):
    return quantize_rows_ref(x["x"].float().flatten(0, 1))


def gelu_quantize_rows_call(x, backend, matmul_precision):
    return gelu_quantize_rows(x["x"].flatten(0, 1), backend=backend)


def gelu_quantize_rows_reference(x):
    return gelu_quantize_rows_ref(x["x"].float().flatten(0, 1))


def merge_heads_quantize_rows_call(x, backend, matmul_precision):
    return merge_heads_quantize_rows(x["heads_out"], x["head_gates"], backend=backend)


def merge_heads_quantize_rows_reference(x):
    x = floats(x, "heads_out", "head_gates")
    return merge_heads_quantize_rows_ref(x["heads_out"], x["head_gates"])


# ----------------------------------------------------------------------------- FFN
def glu_shape(s):
    """(rows, columns) of the frame the GLU's 3x3 depthwise conv runs on: 3 rows of S / 3 tokens."""
    return 3, s.spatial // 3


def glu_inputs(s, device, dtype):
    d = Draw(8, device, dtype)
    height, width = glu_shape(s)
    return dict(h=d.randn((s.batch * s.frames, height * width, 2 * s.channels)),
                weight=d.randn((2 * s.channels, 1, 3, 3), 0.3, activation=False),
                bias=d.randn((2 * s.channels,), 0.1, activation=False), height=height, width=width)


def glu_call(x, backend, matmul_precision):
    return glu_depthwise(x["h"], x["weight"], x["bias"], x["height"], x["width"], backend=backend)


def glu_reference(x):
    return glu_depthwise_ref(x["h"].float(), x["weight"], x["bias"], x["height"], x["width"])


# ----------------------------------------------------------------------------- decoder
def rms_silu_inputs(s, device, dtype):
    """Channels-last decoder activations (B, C, T, 3, S / 3)."""
    x = Draw(9, device, dtype).randn((s.batch, s.channels, s.frames, 3, s.spatial // 3), 3.0)
    return dict(x=x.contiguous(memory_format=torch.channels_last_3d))


def decoder_resnet_inputs(s, device, dtype):
    """A conv's output without its bias (channels-last), the bias (C,) and a residual, as the decoder's resnets."""
    d = Draw(10, device, dtype)
    shape = (s.batch, s.channels, s.frames, 3, s.spatial // 3)
    return dict(x=d.randn(shape, 3.0).contiguous(memory_format=torch.channels_last_3d),
                bias=d.randn((s.channels,), 0.5, activation=False), residual=d.randn(shape))


def rms_silu_call(x, backend, matmul_precision, bias=False):
    return rms_silu(x["x"], bias=x["bias"] if bias else None, backend=backend)


def rms_silu_reference(x, bias=False):
    return rms_silu_ref(x["x"].float(), bias=x["bias"].float() if bias else None)


def bias_residual_call(x, backend, matmul_precision):
    # the op writes into x: a copy, so the reference reads the inputs as built
    return bias_residual(x["x"].clone(memory_format=torch.channels_last_3d), x["bias"], x["residual"], backend=backend)


def bias_residual_reference(x):
    x = floats(x, "x", "bias", "residual")
    return bias_residual_ref(x["x"], x["bias"], x["residual"])
