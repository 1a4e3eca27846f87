"""Kernel settings of a patched transformer, resolved once by `camrender.model.patch.patch_transformer`.

The `--kernels` word ("fused" / "torch") and `--precision` become one frozen `KernelSettings`,
stored on every patched module (blocks, attentions, FFNs, the cross-attention processor). Full
mode and segment mode both read it from there; nothing maps the word again.
"""
from __future__ import annotations

import dataclasses

import torch

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
