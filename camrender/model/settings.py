"""Kernel settings of a patched transformer, resolved once by `camrender.model.stage1.patch.patch_transformer`.

The `--kernels` word ("fused" / "torch") and the kernels' matmul precision become one frozen `KernelSettings`,
stored on every patched module (blocks, attentions, FFNs, the cross-attention processor). Full
mode and segment mode both read it from there; nothing maps the word again.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from camrender.kernels._validate import BACKENDS, MATMUL_PRECISIONS, use_triton
from camrender.model.device import resolve_device, resolve_dtype

KERNEL_CHOICES = ("fused", "torch")
LINEAR_PRECISIONS = ("bf16", "fp8")  # the blocks' linear layers: the model's dtype, or e4m3 W8A8 (model/fp8.py)

# `kernels` word -> the kernels' `backend` argument. "auto" runs Triton on CUDA and under
# TRITON_INTERPRET=1, and the PyTorch references otherwise (the CPU rendering path).
_BACKEND_OF_KERNELS = {"fused": "auto", "torch": "torch"}


def _check_choice(name: str, value, choices) -> None:
    """ValueError naming `name` unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """How the patched modules compute.

    Attributes:
        backend: the kernels' `backend` argument: "auto" (Triton on CUDA and under
            TRITON_INTERPRET=1, the PyTorch references otherwise), "triton", or "torch" (the
            PyTorch references in every mode).
        matmul_precision: matrix-product precision inside the Triton kernels, "tf32" or "ieee" (exact fp32).
        linear_precision: the blocks' linear layers, "bf16" (the model's dtype) or "fp8" (e4m3 weights and
            activations, `camrender.model.fp8`; `--stage1-precision`).
    """

    backend: str = "auto"
    matmul_precision: str = "tf32"
    linear_precision: str = "bf16"

    def __post_init__(self):
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("matmul precision", self.matmul_precision, MATMUL_PRECISIONS)
        _check_choice("linear precision", self.linear_precision, LINEAR_PRECISIONS)

    @classmethod
    def from_kernels(cls, kernels: str = "fused", matmul_precision: str = "tf32",
                     linear_precision: str = "bf16") -> "KernelSettings":
        """The settings of a `--kernels` word ("fused" or "torch"), a matmul precision and a linear precision."""
        if kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
        return cls(backend=_BACKEND_OF_KERNELS[kernels], matmul_precision=matmul_precision,
                   linear_precision=linear_precision)

    @property
    def fused(self) -> bool:
        """Whether the Triton kernels may run (any backend but "torch", which runs their PyTorch references)."""
        return self.backend != "torch"

    def use_triton(self, x: torch.Tensor) -> bool:
        """Whether the Triton kernels run for a tensor on x's device under this backend."""
        return use_triton(x, self.backend)


def model_settings(transformer):
    """The `KernelSettings` a transformer was patched with, or None for an unpatched one."""
    blocks = getattr(transformer, "blocks", None)
    return getattr(blocks[0], "settings", None) if blocks else None


REFINER_PATHS = ("fused", "stock")


@dataclasses.dataclass(frozen=True)
class RefinerSettings:
    """How stage 2's blocks compute: `path` "fused" (`camrender.model.refiner.block`'s fused path and
    window cache) or "stock" (diffusers' block code); `backend` the fused path's kernels, as
    `KernelSettings.backend`; `linear_precision` the blocks' linears, "bf16" or "fp8"
    (`--refiner-precision`); `window` the KV window in latent frames, the sink plus `window - 1` recent
    ones (`--refiner-window`, the official `--refiner_kv_max_frames`)."""

    path: str = "fused"
    backend: str = "auto"
    linear_precision: str = "bf16"
    window: int = 11

    def __post_init__(self):
        _check_choice("refiner path", self.path, REFINER_PATHS)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("linear precision", self.linear_precision, LINEAR_PRECISIONS)
        if int(self.window) < 1:
            raise ValueError(f"the refiner window must be at least 1 frame, got {self.window}")


@dataclasses.dataclass(frozen=True)
class RenderSettings:
    """How one render computes, decided once (`decide`, from the command line or API options) and passed
    explicitly to stage 1 (`stage_one`, what `patch_transformer` stores on its modules), the refiner
    (`refiner`) and the samplers (`cuda_graphs`); `dtype` and `device` are the pipeline's. A field per
    stage carries that stage's choices (`linear_precision`: `--stage1-precision`, `--refiner-precision`).
    """

    stage_one: KernelSettings = KernelSettings()
    refiner: RefinerSettings = RefinerSettings()
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    cuda_graphs: bool = False

    @classmethod
    def decide(cls, *, kernels: str = "fused", matmul_precision: str = "tf32", dtype="auto", device=None,
               offload: bool = False, cuda_graphs: bool = True, stage_one: Optional[KernelSettings] = None,
               stage1_precision: str = "bf16", refiner_precision: str = "bf16",
               refiner_window: int = 11) -> "RenderSettings":
        """The settings of the `--kernels` word ("fused": Triton kernels, PyTorch references on a CPU;
        "torch": the PyTorch references, and diffusers' own refiner blocks), the kernels' matmul precision, `--dtype` ("auto": bfloat16 on CUDA, float32
        elsewhere), `--device` (None: CUDA when available), `--offload` and `--cuda-graphs` (CUDA only,
        not under offload: the weights move), `--stage1-precision` / `--refiner-precision` ("bf16" / "fp8")
        and `--refiner-window`; stage_one: these kernel settings instead of `kernels`, `matmul_precision` and
        `stage1_precision` (a transformer patched already)."""
        resolved = resolve_device(device)
        if stage_one is None:
            stage_one = KernelSettings.from_kernels(kernels, matmul_precision, stage1_precision)
        # stage 2 follows stage 1's word; on a CPU the fused path runs its PyTorch references, never
        # the Triton interpreter (tests run stage 1 there)
        refiner = RefinerSettings(path="fused" if stage_one.fused else "stock",
                                  backend=stage_one.backend if resolved.type == "cuda" else "torch",
                                  linear_precision=refiner_precision, window=int(refiner_window))
        return cls(stage_one=stage_one, refiner=refiner, dtype=resolve_dtype(dtype, resolved), device=resolved,
                   cuda_graphs=bool(cuda_graphs) and resolved.type == "cuda" and not offload)

    @classmethod
    def of_request(cls, request, stage_one: Optional[KernelSettings] = None) -> "RenderSettings":
        """`decide` with a `camrender.render.request.RenderRequest`'s options."""
        return cls.decide(kernels=request.kernels, dtype=request.dtype, device=request.device,
                          offload=request.offload, cuda_graphs=request.cuda_graphs, stage_one=stage_one,
                          stage1_precision=getattr(request, "stage1_precision", "bf16"),
                          refiner_precision=getattr(request, "refiner_precision", "bf16"),
                          refiner_window=getattr(request, "refiner_window", 11))
