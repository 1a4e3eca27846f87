"""Kernel settings of a patched transformer, resolved once by `camrender.model.patch.patch_transformer`.

The `--kernels` word ("fused" / "torch") and `--precision` become one frozen `KernelSettings`,
stored on every patched module (blocks, attentions, FFNs, the cross-attention processor). Full
mode and segment mode both read it from there; nothing maps the word again.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from camrender.model.loading import resolve_device, resolve_dtype

KERNEL_CHOICES = ("fused", "torch")
PRECISION_CHOICES = ("tf32", "ieee")
BACKENDS = ("auto", "triton", "torch")

# `kernels` word -> the kernels' `backend` argument. "auto" runs Triton on CUDA and under
# TRITON_INTERPRET=1, and the PyTorch references otherwise (the CPU rendering path).
_BACKEND_OF_KERNELS = {"fused": "auto", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """How the patched modules compute.

    Attributes:
        backend: the kernels' `backend` argument: "auto" (Triton on CUDA and under
            TRITON_INTERPRET=1, the PyTorch references otherwise), "triton", or "torch". With
            "torch", full mode runs diffusers' own block code and segment mode the references.
        precision: matrix-product precision inside the Triton kernels, "tf32" or "ieee" (exact fp32).
    """

    backend: str = "auto"
    precision: str = "tf32"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.precision not in PRECISION_CHOICES:
            raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {self.precision!r}")

    @classmethod
    def from_kernels(cls, kernels: str = "fused", precision: str = "tf32") -> "KernelSettings":
        """The settings of a `--kernels` word ("fused" or "torch") and a precision."""
        if kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {kernels!r}")
        return cls(backend=_BACKEND_OF_KERNELS[kernels], precision=precision)

    @property
    def fused(self) -> bool:
        """Whether full mode runs the fused structure (else diffusers' stock block code)."""
        return self.backend != "torch"

    def use_triton(self, x: torch.Tensor) -> bool:
        """Whether the Triton kernels run for a tensor on x's device under this backend."""
        from camrender.kernels._validate import use_triton

        return use_triton(x, self.backend)


def model_settings(transformer):
    """The `KernelSettings` a transformer was patched with, or None for an unpatched one."""
    blocks = getattr(transformer, "blocks", None)
    return getattr(blocks[0], "settings", None) if blocks else None


REFINER_PATHS = ("fused", "stock")


@dataclasses.dataclass(frozen=True)
class RefinerSettings:
    """How stage 2's blocks compute: `path` "fused" (`camrender.model.refiner_block`'s fused path and
    window cache) or "stock" (diffusers' block code); `backend` the fused path's kernels, as
    `KernelSettings.backend`."""

    path: str = "fused"
    backend: str = "auto"

    def __post_init__(self):
        if self.path not in REFINER_PATHS:
            raise ValueError(f"refiner path must be one of {REFINER_PATHS}, got {self.path!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


@dataclasses.dataclass(frozen=True)
class RenderSettings:
    """How one render computes, decided once (`decide`, from the command line or API options) and passed
    explicitly to stage 1 (`stage_one`, what `patch_transformer` stores on its modules), the refiner
    (`refiner`) and the samplers (`cuda_graphs`); `dtype` and `device` are the pipeline's. A field per
    stage leaves room for per-stage choices (a precision per stage).
    """

    stage_one: KernelSettings = KernelSettings()
    refiner: RefinerSettings = RefinerSettings()
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    cuda_graphs: bool = False

    @classmethod
    def decide(cls, *, kernels: str = "fused", precision: str = "tf32", dtype="auto", device=None,
               offload: bool = False, cuda_graphs: bool = True,
               stage_one: Optional[KernelSettings] = None) -> "RenderSettings":
        """The settings of the `--kernels` word ("fused": Triton kernels, PyTorch references on a CPU;
        "torch": diffusers' own code), `--precision`, `--dtype` ("auto": bfloat16 on CUDA, float32
        elsewhere), `--device` (None: CUDA when available), `--offload` and `--cuda-graphs` (CUDA only,
        not under offload: the weights move); stage_one: these kernel settings instead of `kernels` and
        `precision` (a transformer patched already)."""
        resolved = resolve_device(device)
        stage_one = KernelSettings.from_kernels(kernels, precision) if stage_one is None else stage_one
        # stage 2 follows stage 1's word; on a CPU the fused path runs its PyTorch references, never
        # the Triton interpreter (tests run stage 1 there)
        refiner = RefinerSettings(path="fused" if stage_one.fused else "stock",
                                  backend=stage_one.backend if resolved.type == "cuda" else "torch")
        return cls(stage_one=stage_one, refiner=refiner, dtype=resolve_dtype(dtype, resolved), device=resolved,
                   cuda_graphs=bool(cuda_graphs) and resolved.type == "cuda" and not offload)

    @classmethod
    def of_request(cls, request, stage_one: Optional[KernelSettings] = None) -> "RenderSettings":
        """`decide` with a `camrender.render.request.RenderRequest`'s options."""
        return cls.decide(kernels=request.kernels, dtype=request.dtype, device=request.device,
                          offload=request.offload, cuda_graphs=request.cuda_graphs, stage_one=stage_one)
