"""The table of kernel cases, grouped by op: every public op of kernels/ beside its PyTorch reference, on given sizes.

One table serves `camrender selftest` (camrender/cli/selftest.py prints it op by op) and the kernel tests
(tests/kernels/test_kernel_cases.py parametrizes over it: tiny shapes under the Triton interpreter on the CPU,
compiled and in tf32 matmul precision on a GPU; the "torch" backend of each op against its reference). The public
ops are the names in the `__all__` of each op module (`public_ops`); each has a case at least, and each stateful op
(one taking `initial_state`) a case that carries a state in and compares the final state out. Imports torch and the
kernels only (no diffusers).

A `KernelCase` holds:
    op          the public op the case calls
    variant     what sets the case apart from the op's other cases ("" for its plain call)
    build       build(sizes, device, dtype) -> dict of inputs; activations in `dtype`, weights,
                rays and states in float32; drawn from a seeded CPU generator and moved, so every
                device sees the same values
    call        call(inputs, backend, matmul_precision) -> tensor or tuple of tensors: the op on `backend`
                ("triton" or "torch"), at `matmul_precision` ("ieee" or "tf32"; ops without one ignore it)
    reference   reference(inputs) -> the same structure, the op's `<op>_ref` on fp32 activations
    label       label(sizes) -> the shape text of the selftest table
    sizes       the small `Sizes` the selftest runs (the tests run every one)
    tolerance   pass when max |op - reference| <= tolerance * max(1, max |reference|), at "ieee"
    tf32_tolerance   the same bound at "tf32"; None when the op has no tf32 mode
    state       the case passes an initial state and its outputs end with the final state
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
from pathlib import Path
from typing import Callable

import torch

from . import _camera_cases as _camera
from . import _glue_cases as _glue
from . import _main_cases as _main
from . import _refiner_cases as _refiner


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
    op: str
    variant: str
    build: Callable
    call: Callable
    reference: Callable
    label: Callable
    sizes: tuple
    tolerance: float = 1e-4
    tf32_tolerance: float | None = None
    state: bool = False

    @property
    def name(self) -> str:
        """The op, "+variant" for a variant."""
        return f"{self.op}+{self.variant}" if self.variant else self.op

    def run(self, sizes: Sizes, device, *, dtype=torch.float32, matmul_precision: str = "ieee",
            backend: str = "triton"):
        """(op output on `backend`, reference output) on inputs built for `sizes` on `device`."""
        inputs = self.build(sizes, torch.device(device), dtype)
        return self.call(inputs, backend, matmul_precision), self.reference(inputs)

    def bound(self, matmul_precision: str = "ieee") -> float:
        return self.tf32_tolerance if matmul_precision == "tf32" else self.tolerance


# ----------------------------------------------------------------------------- comparing
def as_tuple(value) -> tuple:
    """The tensors of an output, nested tuples (a final state of several tensors) flattened in order."""
    if isinstance(value, (tuple, list)):
        return tuple(t for item in value for t in as_tuple(item))
    return (value,)


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


def public_ops() -> dict:
    """{op name: function} of every public op: the `__all__` of each op module kernels/<name>.py."""
    ops = {}
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name.startswith("_") or module.name.endswith("_reference") or module.name == "cases":
            continue
        loaded = importlib.import_module(f"{__package__}.{module.name}")
        ops.update({name: getattr(loaded, name) for name in getattr(loaded, "__all__", ())})
    return ops


def stateful(op) -> bool:
    """Whether an op carries a state across segments (takes `initial_state`)."""
    return "initial_state" in inspect.signature(op).parameters


def by_op(cases=None) -> dict:
    """{op: [its cases]} in the table's order."""
    grouped = {}
    for case in CASES if cases is None else cases:
        grouped.setdefault(case.op, []).append(case)
    return grouped


def _gdn_label(s: Sizes) -> str:
    return f"B{s.batch} H{s.heads} T{s.frames} S{s.spatial} D{s.dim}"


def _token_label(s: Sizes) -> str:
    return f"B{s.batch} H{s.heads} N{s.tokens} D{s.dim}"


def _glue_label(s: Sizes) -> str:
    return f"B{s.batch} T{s.frames} S{s.spatial} C{s.channels}"


def _glu_label(s: Sizes) -> str:
    height, width = _glue.glu_shape(s)
    return f"F{s.batch * s.frames} {height}x{width} C{2 * s.channels}"


def _decoder_label(s: Sizes) -> str:
    return f"B{s.batch} C{s.channels} T{s.frames} 3x{s.spatial // 3}"


# ----------------------------------------------------------------------------- the table
# Small shapes: head dims 16 and 112 (the release), odd frame and token counts.
CAMERA_SIZES = (Sizes(1, 2, 3, 6, 16), Sizes(2, 1, 2, 5, 112))
MAIN_SIZES = (Sizes(1, 2, 3, 6, 16),)
GLUE_SIZES = (Sizes(2, 2, 3, 6, 20),)  # C = 40: not a multiple of the channel tile


def _case(op, build, call, reference, label, sizes, variant="", **kwargs) -> KernelCase:
    return KernelCase(op, variant, build, call, reference, label, sizes, **kwargs)


def _split_rope(s, device, dtype):
    return _refiner.rms_rope_inputs(s, device, dtype, "split")


CASES = (
    # the GDN blocks' camera branch and the scan inside it (kernels/delta_scan.py, cam_prep.py, camera_branch.py,
    # cam_decode.py)
    _case("delta_scan", _camera.scan_inputs, _camera.scan_call, _camera.scan_reference, _gdn_label, CAMERA_SIZES,
          tf32_tolerance=2e-2, state=True),
    _case("cam_prep", _camera.camera_inputs, _camera.cam_prep_call, _camera.cam_prep_reference, _gdn_label,
          CAMERA_SIZES),
    _case("camera_branch", _camera.camera_inputs, _camera.camera_branch_call, _camera.camera_branch_reference,
          _gdn_label, CAMERA_SIZES, tf32_tolerance=2e-2, state=True),
    # the GDN blocks of the default recipe (NVlabs' arithmetic): no RMS rescale of the camera q/k/v
    _case("camera_branch", _camera.camera_inputs,
          lambda x, backend, matmul_precision: _camera.camera_branch_call(x, backend, matmul_precision, False),
          lambda x: _camera.camera_branch_reference(x, False), _gdn_label, CAMERA_SIZES, "no_downscale",
          tf32_tolerance=2e-2, state=True),
    _case("cam_decode", _camera.cam_decode_inputs, _camera.cam_decode_call, _camera.cam_decode_reference,
          _token_label, CAMERA_SIZES),
    # the GDN blocks' main branch (gdn_gates.py, short_conv.py, main_prep.py, main_branch.py)
    _case("gdn_gates", _main.gates_inputs, _main.gates_call, _main.gates_reference, _glue_label, GLUE_SIZES,
          tf32_tolerance=1e-2),
    _case("short_conv", _main.main_inputs, _main.short_conv_call, _main.short_conv_reference, _gdn_label,
          MAIN_SIZES),
    # segment mode: the causal half reads the frames before the segment; the frames after it come out
    _case("short_conv", _main.main_inputs,
          lambda x, backend, matmul_precision: _main.short_conv_call(x, backend, matmul_precision, state=True),
          lambda x: _main.short_conv_reference(x, state=True), _gdn_label, MAIN_SIZES, "state", state=True),
    _case("main_prep", _main.main_inputs, _main.main_prep_call, _main.main_prep_reference, _gdn_label, MAIN_SIZES),
    _case("main_branch", _main.main_inputs, _main.main_branch_call, _main.main_branch_reference, _gdn_label,
          MAIN_SIZES, tf32_tolerance=2e-2, state=True),
    # the softmax blocks' camera SDPA (softmax_cam.py)
    _case("cam_softmax_encode", _camera.softmax_encode_inputs, _camera.softmax_encode_call,
          _camera.softmax_encode_reference, _token_label, MAIN_SIZES),
    _case("cam_softmax_decode", _camera.softmax_decode_inputs, _camera.softmax_decode_call,
          _camera.softmax_decode_reference, _token_label, MAIN_SIZES),
    # a block's adaLN glue (block_glue.py), stage 1's and the refiner's (norm "rms")
    _case("ada_norm", _glue.glue_inputs, _glue.ada_norm_call, _glue.ada_norm_reference, _glue_label, GLUE_SIZES),
    _case("residual_ada_norm", _glue.glue_inputs, _glue.residual_ada_norm_call, _glue.residual_ada_norm_reference,
          _glue_label, GLUE_SIZES),
    _case("residual_ada_norm", _glue.glue_inputs,
          lambda x, backend, matmul_precision: _glue.residual_ada_norm_call(x, backend, matmul_precision, "rms"),
          lambda x: _glue.residual_ada_norm_reference(x, "rms"), _glue_label, GLUE_SIZES, "rms"),
    _case("gated_residual", _glue.glue_inputs, _glue.gated_residual_call, _glue.gated_residual_reference,
          _glue_label, GLUE_SIZES),
    _case("silu_gate", _glue.glue_inputs, _glue.silu_gate_call, _glue.silu_gate_reference, _glue_label, GLUE_SIZES),
    _case("merge_heads", _glue.glue_inputs, _glue.merge_heads_call, _glue.merge_heads_reference, _token_label,
          GLUE_SIZES),
    # the FP8 linears' input rows (fp8_quant.py)
    _case("quantize_rows", _glue.glue_inputs, _glue.quantize_rows_call, _glue.quantize_rows_reference, _glue_label,
          GLUE_SIZES),
    _case("gelu_quantize_rows", _glue.glue_inputs, _glue.gelu_quantize_rows_call, _glue.gelu_quantize_rows_reference,
          _glue_label, GLUE_SIZES),
    _case("merge_heads_quantize_rows", _glue.glue_inputs, _glue.merge_heads_quantize_rows_call,
          _glue.merge_heads_quantize_rows_reference, _token_label, GLUE_SIZES),
    # the FFN (ffn_glu.py); on CUDA its silu runs on the hardware's approximate tanh (inline asm, relative error
    # ~2^-11)
    _case("glu_depthwise", _glue.glu_inputs, _glue.glu_call, _glue.glu_reference, _glu_label, GLUE_SIZES),
    # the refiner's attention (rms_rope.py)
    _case("rms_rope_qk", _refiner.rms_rope_inputs, _refiner.rms_rope_call, _refiner.rms_rope_reference, _glue_label,
          GLUE_SIZES),
    _case("rms_rope_qk", _split_rope, _refiner.rms_rope_call, _refiner.rms_rope_reference, _glue_label, GLUE_SIZES,
          "split"),
    _case("rope_rows", _refiner.rms_rope_inputs, _refiner.rope_rows_call, _refiner.rope_rows_reference,
          _glue_label, GLUE_SIZES),
    # the decoder's resnets (rms_silu.py, bias_residual.py)
    _case("rms_silu", _glue.rms_silu_inputs, _glue.rms_silu_call, _glue.rms_silu_reference, _decoder_label,
          GLUE_SIZES),
    _case("rms_silu", _glue.decoder_resnet_inputs,
          lambda x, backend, matmul_precision: _glue.rms_silu_call(x, backend, matmul_precision, bias=True),
          lambda x: _glue.rms_silu_reference(x, bias=True), _decoder_label, GLUE_SIZES, "bias"),
    _case("bias_residual", _glue.decoder_resnet_inputs, _glue.bias_residual_call, _glue.bias_residual_reference,
          _decoder_label, GLUE_SIZES),
)
