"""The table of kernel cases: each fused kernel beside its PyTorch reference, on given sizes.

One table serves `camrender selftest` (camrender/cli/selftest.py iterates it) and the kernel tests
(tests/kernels/test_kernel_cases.py parametrizes over it: tiny shapes under the Triton interpreter on the
CPU, compiled and in tf32 precision on a GPU). Imports torch and the kernels only (no diffusers).

A `KernelCase` holds:
    name        the kernel (a row of the selftest table)
    build       build(sizes, device, dtype) -> dict of inputs; activations in `dtype`, weights,
                rays and states in float32; drawn from a seeded CPU generator and moved, so every
                device sees the same values
    fused       fused(inputs, precision) -> tensor or tuple of tensors (precision "ieee" or "tf32";
                kernels without a precision setting ignore it)
    reference   reference(inputs) -> the same structure, PyTorch
    label       label(sizes) -> the shape text of the selftest table
    sizes       the small `Sizes` the selftest runs (the tests run the first one)
    tolerance   pass when max |fused - reference| <= tolerance * max(1, max |reference|), at "ieee"
    tf32_tolerance   the same bound at precision "tf32"; None when the kernel has no tf32 mode
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from . import _refiner_cases as _refiner
from . import cam_decode, cam_decode_ref, cam_prep, cam_prep_ref, camera_branch, delta_scan, delta_scan_ref
from ._random_inputs import Draw as _Draw
from ._random_inputs import middle_segment_start as _middle_segment_start
from .bias_residual import bias_residual
from .bias_residual_reference import bias_residual_ref
from .block_glue import gated_residual, residual_ada_norm, silu_gate
from .block_glue_reference import gated_residual_ref, residual_ada_norm_ref, silu_gate_ref
from .ffn_glu import glu_depthwise
from .ffn_glu_reference import glu_depthwise_ref
from .gdn_gates import gdn_gates
from .gdn_gates_reference import gdn_gates_ref
from .main_branch import main_branch
from .main_branch_reference import main_branch_ref
from .main_prep import main_prep
from .main_prep_reference import main_prep_ref
from .rms_silu import rms_silu
from .rms_silu_reference import rms_silu_ref
from .short_conv import short_conv
from .short_conv_reference import short_conv_ref
from .softmax_cam import cam_softmax_decode, cam_softmax_encode
from .softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Batch B, heads H, latent frames T, tokens per frame S, head dim D (channels C = H * D)."""
    batch: int
    heads: int
    frames: int
    spatial: int
    dim: int

    @property
    def tokens(self) -> int:
        return self.frames * self.spatial

    @property
    def channels(self) -> int:
        return self.heads * self.dim


@dataclasses.dataclass(frozen=True)
class KernelCase:
    name: str
    build: Callable
    fused: Callable
    reference: Callable
    label: Callable
    sizes: tuple
    tolerance: float = 1e-4
    tf32_tolerance: float | None = None

    def run(self, sizes: Sizes, device, *, dtype=torch.float32, precision: str = "ieee"):
        """(fused output, reference output) on inputs built for `sizes` on `device`."""
        inputs = self.build(sizes, torch.device(device), dtype)
        return self.fused(inputs, precision), self.reference(inputs)

    def bound(self, precision: str = "ieee") -> float:
        return self.tf32_tolerance if precision == "tf32" else self.tolerance


# ----------------------------------------------------------------------------- comparing
def as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def compare(actual, expected) -> tuple[float, float]:
    """(max abs error, max |expected|) over all paired tensors; ValueError on a structure mismatch."""
    actual, expected = as_tuple(actual), as_tuple(expected)
    if len(actual) != len(expected):
        raise ValueError(f"kernel returned {len(actual)} outputs, reference {len(expected)}")
    error, scale = 0.0, 0.0
    for a, e in zip(actual, expected):
        if tuple(a.shape) != tuple(e.shape):
            raise ValueError(f"shape {tuple(a.shape)} != reference {tuple(e.shape)}")
        a, e = a.float(), e.float()
        error = max(error, float((a - e).abs().max()) if a.numel() else 0.0)
        scale = max(scale, float(e.abs().max()) if e.numel() else 0.0)
    return error, scale


def within(error: float, scale: float, tolerance: float) -> bool:
    """The pass rule: a finite error within `tolerance` of the reference's scale (at least 1)."""
    return math.isfinite(error) and error <= tolerance * max(1.0, scale)


def _gdn_label(s: Sizes) -> str:
    return f"B{s.batch} H{s.heads} T{s.frames} S{s.spatial} D{s.dim}"


def _token_label(s: Sizes) -> str:
    return f"B{s.batch} H{s.heads} N{s.tokens} D{s.dim}"


def _glue_label(s: Sizes) -> str:
    return f"B{s.batch} T{s.frames} S{s.spatial} C{s.channels}"


# ----------------------------------------------------------------------------- camera branch
def _scan_inputs(s, device, dtype):
    d = _Draw(1, device, dtype)
    shape = (s.batch, s.heads, s.frames, s.spatial, s.dim)
    return dict(q=d.randn(shape, 0.3), k=d.randn(shape, 0.3), v=d.randn(shape),
                beta=d.rand(shape[:-1]), decay=d.rand(shape[:3], 0.5, 1.0, activation=False),
                initial_state=d.randn((s.batch, s.heads, s.dim, s.dim), 0.1, activation=False),
                segment_starts=_middle_segment_start(s.frames, device))


def _scan_fused(x, precision):
    return delta_scan(**x, precision=precision)


def _scan_reference(x):
    return delta_scan_ref(**{k: v.float() if v.is_floating_point() else v for k, v in x.items()})


def _camera_inputs(s, device, dtype):
    d = _Draw(2, device, dtype)
    shape = (s.batch, s.tokens, s.heads, s.dim)
    return dict(q=d.randn(shape), k=d.randn(shape), v=d.randn(shape),
                beta=d.rand((s.batch, s.heads, s.frames, s.spatial)),
                decay=d.rand((s.batch, s.heads, s.frames), 0.5, 1.0, activation=False),
                rays=d.rays(s.batch, s.tokens, s.dim),
                q_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                k_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                initial_state=d.randn((s.batch, s.heads, s.dim, s.dim), 0.1, activation=False),
                num_frames=s.frames)


def _cam_prep_fused(x, precision):
    return cam_prep(x["q"], x["k"], x["v"], x["rays"], num_frames=x["num_frames"],
                    q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def _cam_prep_reference(x):
    return cam_prep_ref(x["q"].float(), x["k"].float(), x["v"].float(), x["rays"], num_frames=x["num_frames"],
                        q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def _camera_branch(x, backend, precision="ieee", downscale=True):
    floats = {name: x[name].float() for name in ("q", "k", "v", "beta")} if backend == "torch" else x
    return camera_branch(floats["q"], floats["k"], floats["v"], floats["beta"], x["decay"], x["rays"],
                         q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"],
                         initial_state=x["initial_state"], output_final_state=True,
                         precision=precision, backend=backend, downscale=downscale)


def _cam_decode_inputs(s, device, dtype):
    d = _Draw(3, device, dtype)
    p, _, _, rope = d.rays(s.batch, s.tokens, s.dim)
    return dict(x=d.randn((s.batch, s.heads, s.tokens, s.dim)), p=p, rope_cam=rope)


def _cam_decode_fused(x, precision):
    return cam_decode(x["x"], x["p"], x["rope_cam"])


def _cam_decode_reference(x):
    return cam_decode_ref(x["x"].float(), x["p"], x["rope_cam"])


# ----------------------------------------------------------------------------- main branch
def _main_inputs(s, device, dtype):
    d = _Draw(4, device, dtype)
    shape = (s.batch, s.tokens, s.channels)
    x = dict(x=d.randn(shape), weight=d.randn((s.channels, 1, 4), 0.5, activation=False),
             norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False), rope=d.rope(s.tokens, s.dim // 2),
             frames=s.frames, heads=s.heads, dim=s.dim)
    # the branch's k, v, beta, decay and the cached frames of segment mode's short conv
    x.update(k=d.randn(shape), v=d.randn(shape), beta=d.rand((s.batch, s.heads, s.frames, s.spatial)),
             decay=d.rand((s.batch, s.heads, s.frames), 0.5, 1.0, activation=False),
             context=d.randn((s.batch, 3 * s.spatial, s.channels)))
    return x


def _short_conv_fused(x, precision, context=False):
    return short_conv(x["x"], x["weight"], x["frames"], left_context=x["context"] if context else None,
                      backend="triton")


def _short_conv_reference(x, context=False):
    return short_conv_ref(x["x"].float(), x["weight"], x["frames"],
                          left_context=x["context"].float() if context else None)


def _main_prep_fused(x, precision):
    return main_prep(x["x"], x["norm_weight"], x["heads"], scale=x["dim"] ** -0.5, rope=x["rope"])


def _main_prep_reference(x):
    return main_prep_ref(x["x"].float(), x["norm_weight"], x["heads"], scale=x["dim"] ** -0.5, rope=x["rope"])


def _main_branch_fused(x, precision):
    out, _ = main_branch(x["x"], x["k"], x["v"], x["beta"], x["decay"], x["rope"], q_norm_weight=x["norm_weight"],
                         k_norm_weight=x["norm_weight"], precision=precision, backend="triton")
    return out


def _main_branch_reference(x):
    q, k, v, beta = (x[name].float() for name in ("x", "k", "v", "beta"))
    out, _ = main_branch_ref(q, k, v, beta, x["decay"], x["rope"], q_norm_weight=x["norm_weight"],
                             k_norm_weight=x["norm_weight"])
    return out


# ----------------------------------------------------------------------------- softmax blocks' camera SDPA
def _softmax_encode_inputs(s, device, dtype):
    d = _Draw(5, device, dtype)
    shape = (s.batch, s.tokens, s.channels)
    return dict(q=d.randn(shape), k=d.randn(shape), v=d.randn(shape), rays=d.rays(s.batch, s.tokens, s.dim),
                q_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                k_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False), heads=s.heads)


def _softmax_encode_fused(x, precision):
    return cam_softmax_encode(x["q"], x["k"], x["v"], x["rays"], heads=x["heads"],
                              q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def _softmax_encode_reference(x):
    return cam_softmax_encode_ref(x["q"].float(), x["k"].float(), x["v"].float(), x["rays"], heads=x["heads"],
                                  q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def _softmax_decode_inputs(s, device, dtype):
    d = _Draw(6, device, dtype)
    return dict(o=d.randn((s.batch, s.heads, s.tokens, 128)), rays=d.rays(s.batch, s.tokens, s.dim), dim=s.dim)


def _softmax_decode_fused(x, precision):
    return cam_softmax_decode(x["o"], x["rays"], dim=x["dim"])


def _softmax_decode_reference(x):
    return cam_softmax_decode_ref(x["o"].float(), x["rays"], dim=x["dim"])


# ----------------------------------------------------------------------------- block glue and FFN
def _glue_inputs(s, device, dtype):
    d = _Draw(7, device, dtype)
    tokens, frames = (s.batch, s.tokens, s.channels), (s.batch, s.frames, s.channels)
    return dict(x=d.randn(tokens), y=d.randn(tokens), z=d.randn(tokens), shift=d.randn(frames),
                scale=d.randn(frames), gate=d.randn(frames), gate_tokens=d.randn(tokens))


def _floats(x, *names):
    return [x[name].float() for name in names]


def _residual_ada_norm_fused(x, precision):
    return residual_ada_norm(x["x"], x["y"], x["shift"], x["scale"], backend="triton")


def _residual_ada_norm_reference(x):
    return residual_ada_norm_ref(*_floats(x, "x", "y", "shift", "scale"))


def _gated_residual_fused(x, precision):
    return gated_residual(x["x"], x["y"], x["gate"], y2=x["z"], backend="triton")


def _gated_residual_reference(x):
    return gated_residual_ref(*_floats(x, "x", "y", "gate", "z"))


def _silu_gate_fused(x, precision):
    return silu_gate(x["x"], x["gate_tokens"], b=x["y"], backend="triton")


def _silu_gate_reference(x):
    return silu_gate_ref(*_floats(x, "x", "gate_tokens", "y"))


def _glu_shape(s: Sizes):
    """(rows, columns) of the frame the GLU's 3x3 depthwise conv runs on: 3 rows of S / 3 tokens."""
    return 3, s.spatial // 3


def _glu_inputs(s, device, dtype):
    d = _Draw(8, device, dtype)
    height, width = _glu_shape(s)
    return dict(h=d.randn((s.batch * s.frames, height * width, 2 * s.channels)),
                weight=d.randn((2 * s.channels, 1, 3, 3), 0.3, activation=False),
                bias=d.randn((2 * s.channels,), 0.1, activation=False), height=height, width=width)


def _glu_fused(x, precision):
    return glu_depthwise(x["h"], x["weight"], x["bias"], x["height"], x["width"], backend="triton")


def _glu_reference(x):
    return glu_depthwise_ref(x["h"].float(), x["weight"], x["bias"], x["height"], x["width"])


def _glu_label(s: Sizes) -> str:
    height, width = _glu_shape(s)
    return f"F{s.batch * s.frames} {height}x{width} C{2 * s.channels}"


def _rms_silu_inputs(s, device, dtype):
    """Channels-last decoder activations (B, C, T, 3, S / 3)."""
    x = _Draw(9, device, dtype).randn((s.batch, s.channels, s.frames, 3, s.spatial // 3), 3.0)
    return dict(x=x.contiguous(memory_format=torch.channels_last_3d))


def _decoder_resnet_inputs(s, device, dtype):
    """A conv's output without its bias (channels-last), the bias (C,) and a residual, as the decoder's resnets."""
    d = _Draw(10, device, dtype)
    shape = (s.batch, s.channels, s.frames, 3, s.spatial // 3)
    return dict(x=d.randn(shape, 3.0).contiguous(memory_format=torch.channels_last_3d),
                bias=d.randn((s.channels,), 0.5, activation=False), residual=d.randn(shape))


def _gates_inputs(s, device, dtype):
    """A GDN block's input (B, N, C), its per-head projections (H, C) and the decay's constants (H,), in the order of
    `gdn_gates`' arguments after x and the frame count."""
    d = _Draw(9, device, dtype)
    per_head, weight = (s.heads,), (s.heads, s.channels)
    gates = (d.randn(weight, s.channels ** -0.5, activation=False), d.randn(per_head, activation=False),
             d.randn(weight, 4 * s.channels ** -0.5, activation=False), d.randn(per_head, activation=False),
             -d.rand(per_head, 0.1, 3.0, activation=False), d.randn(per_head, activation=False))
    return dict(x=d.randn((s.batch, s.tokens, s.channels)), frames=s.frames, gates=gates)


def _rms_silu_label(s: Sizes) -> str:
    return f"B{s.batch} C{s.channels} T{s.frames} 3x{s.spatial // 3}"


# ----------------------------------------------------------------------------- the table
# Small shapes: head dims 16 and 112 (the release), odd frame and token counts.
CAMERA_SIZES = (Sizes(1, 2, 3, 6, 16), Sizes(2, 1, 2, 5, 112))
MAIN_SIZES = (Sizes(1, 2, 3, 6, 16),)
GLUE_SIZES = (Sizes(2, 2, 3, 6, 20),)  # C = 40: not a multiple of the channel tile

CASES = (
    KernelCase("delta_scan", _scan_inputs, _scan_fused, _scan_reference, _gdn_label, CAMERA_SIZES,
               tf32_tolerance=2e-2),
    KernelCase("cam_prep", _camera_inputs, _cam_prep_fused, _cam_prep_reference, _gdn_label, CAMERA_SIZES),
    KernelCase("cam_decode", _cam_decode_inputs, _cam_decode_fused, _cam_decode_reference, _token_label,
               CAMERA_SIZES),
    KernelCase("camera_branch", _camera_inputs,
               lambda x, precision: _camera_branch(x, "triton", precision),
               lambda x: _camera_branch(x, "torch"), _gdn_label, CAMERA_SIZES, tf32_tolerance=2e-2),
    # the GDN blocks of the default recipe (NVlabs' arithmetic): no RMS rescale of the camera q/k/v
    KernelCase("camera_branch_no_downscale", _camera_inputs,
               lambda x, precision: _camera_branch(x, "triton", precision, downscale=False),
               lambda x: _camera_branch(x, "torch", downscale=False), _gdn_label, CAMERA_SIZES, tf32_tolerance=2e-2),
    KernelCase("short_conv", _main_inputs, _short_conv_fused, _short_conv_reference, _gdn_label, MAIN_SIZES),
    KernelCase("short_conv+context", _main_inputs,
               lambda x, precision: _short_conv_fused(x, precision, context=True),
               lambda x: _short_conv_reference(x, context=True), _gdn_label, MAIN_SIZES),
    KernelCase("main_prep", _main_inputs, _main_prep_fused, _main_prep_reference, _gdn_label, MAIN_SIZES),
    KernelCase("main_branch", _main_inputs, _main_branch_fused, _main_branch_reference, _gdn_label, MAIN_SIZES,
               tf32_tolerance=2e-2),
    KernelCase("cam_softmax_encode", _softmax_encode_inputs, _softmax_encode_fused, _softmax_encode_reference,
               _token_label, MAIN_SIZES),
    KernelCase("cam_softmax_decode", _softmax_decode_inputs, _softmax_decode_fused, _softmax_decode_reference,
               _token_label, MAIN_SIZES),
    KernelCase("residual_ada_norm", _glue_inputs, _residual_ada_norm_fused, _residual_ada_norm_reference,
               _glue_label, GLUE_SIZES),
    KernelCase("gated_residual", _glue_inputs, _gated_residual_fused, _gated_residual_reference, _glue_label,
               GLUE_SIZES),
    KernelCase("silu_gate", _glue_inputs, _silu_gate_fused, _silu_gate_reference, _glue_label, GLUE_SIZES),
    KernelCase("rms_rope_qk", _refiner.rms_rope_inputs, _refiner.rms_rope_fused, _refiner.rms_rope_reference,
               _glue_label, GLUE_SIZES),
    KernelCase("rms_rope_qk+split", lambda s, device, dtype: _refiner.rms_rope_inputs(s, device, dtype, "split"),
               _refiner.rms_rope_fused, _refiner.rms_rope_reference, _glue_label, GLUE_SIZES),
    KernelCase("residual_ada_norm+rms", _glue_inputs, _refiner.rms_ada_norm_fused, _refiner.rms_ada_norm_reference,
               _glue_label, GLUE_SIZES),
    KernelCase("rms_silu", _rms_silu_inputs, lambda x, precision: rms_silu(x["x"], backend="triton"),
               lambda x: rms_silu_ref(x["x"].float()), _rms_silu_label, GLUE_SIZES),
    KernelCase("rms_silu+bias", _decoder_resnet_inputs,
               lambda x, precision: rms_silu(x["x"], bias=x["bias"], backend="triton"),
               lambda x: rms_silu_ref(x["x"].float(), bias=x["bias"].float()), _rms_silu_label, GLUE_SIZES),
    KernelCase("bias_residual", _decoder_resnet_inputs,
               lambda x, precision: bias_residual(x["x"].clone(memory_format=torch.channels_last_3d), x["bias"],
                                                  x["residual"], backend="triton"),
               lambda x: bias_residual_ref(x["x"].float(), x["bias"].float(), x["residual"].float()),
               _rms_silu_label, GLUE_SIZES),
    KernelCase("gdn_gates", _gates_inputs,
               lambda x, precision: gdn_gates(x["x"], x["frames"], *x["gates"], backend="triton", precision=precision),
               lambda x: gdn_gates_ref(x["x"].float(), x["frames"], *x["gates"]), _glue_label, GLUE_SIZES,
               tf32_tolerance=1e-2),
    # on CUDA the GLU's silu runs on the hardware's approximate tanh (inline asm, relative error ~2^-11)
    KernelCase("glu_depthwise", _glu_inputs, _glu_fused, _glu_reference, _glu_label, GLUE_SIZES),
)
