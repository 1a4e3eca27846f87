"""How a loaded pipeline computes, decided once from its `LoadSettings` (`RenderSettings.decide`).

`KernelSettings` is stage 1's part, stored on every patched module (blocks, attentions, FFNs, the
cross-attention processor) by `camrender.model.stage1.patch.patch_transformer`; full mode and segment mode both
read it from there. `RefinerSettings` is the refiner's. Nothing maps the `--kernels` word again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from camrender.kernels._validate import BACKENDS, MATMUL_PRECISIONS, use_triton
from camrender.model.device import resolve_device, resolve_dtype
from camrender.vocabulary import KERNELS, PRECISION, REFINER_WINDOW

LINEAR_PRECISIONS = PRECISION.values  # the blocks' linear layers: the model's dtype, or e4m3 W8A8 (model/fp8.py)

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
        _check_choice("kernels", kernels, KERNELS.values)
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


@dataclasses.dataclass(frozen=True)
class RefinerSettings:
    """How stage 2's blocks compute: `kernels` "fused" (`camrender.model.refiner.block`'s fused path and
    window cache) or "torch" (diffusers' own block code); `backend` the fused path's kernels, as
    `KernelSettings.backend`; `linear_precision` the blocks' linears, "bf16" or "fp8"
    (`--refiner-precision`); `window` the KV window in latent frames, the sink plus `window - 1` recent
    ones (`--refiner-window`, the official `--refiner_kv_max_frames`)."""

    kernels: str = "fused"
    backend: str = "auto"
    linear_precision: str = "bf16"
    window: int = REFINER_WINDOW

    def __post_init__(self):
        _check_choice("refiner kernels", self.kernels, KERNELS.values)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("linear precision", self.linear_precision, LINEAR_PRECISIONS)
        if int(self.window) < 1:
            raise ValueError(f"the refiner window must be at least 1 frame, got {self.window}")


@dataclasses.dataclass(frozen=True)
class RenderSettings:
    """How the renders of one loaded pipeline compute, decided once from its `LoadSettings` (`decide`) and
    passed explicitly to stage 1 (`stage_one`, what `patch_transformer` stores on its modules), the refiner
    (`refiner`) and the samplers (`cuda_graphs`); `dtype` and `device` are the pipeline's, resolved; `ranks`
    the `camrender.parallel.distributed.Ranks` of the video group rendering together (None: one process).
    """

    stage_one: KernelSettings = KernelSettings()
    refiner: RefinerSettings = RefinerSettings()
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    cuda_graphs: bool = False
    ranks: Any = dataclasses.field(default=None, compare=False, hash=False)

    @classmethod
    def decide(cls, load, *, stage_one: Optional[KernelSettings] = None, ranks=None,
               matmul_precision: str = "tf32") -> "RenderSettings":
        """The settings of a `camrender.render.load_settings.LoadSettings`: `kernels`
        ("fused": Triton kernels, PyTorch references on a CPU; "torch": the PyTorch references, and diffusers'
        own refiner blocks), `dtype` ("auto": bfloat16 on CUDA, float32 elsewhere), `device` (None: CUDA when
        available), CUDA graphs (CUDA only, not under offload: the weights move), each stage's precision and
        the refiner's window. stage_one: these kernel settings instead of the load settings' (a transformer
        patched already); matmul_precision: the kernels' ("tf32" or "ieee")."""
        resolved = resolve_device(load.device)
        if stage_one is None:
            stage_one = KernelSettings.from_kernels(load.kernels, matmul_precision, load.stage1_precision)
        # stage 2 follows stage 1's word; on a CPU the fused path runs its PyTorch references, never
        # the Triton interpreter (tests run stage 1 there)
        refiner = RefinerSettings(kernels="fused" if stage_one.fused else "torch",
                                  backend=stage_one.backend if resolved.type == "cuda" else "torch",
                                  linear_precision=load.refiner_precision, window=int(load.refiner_window))
        return cls(stage_one=stage_one, refiner=refiner, dtype=resolve_dtype(load.dtype, resolved), device=resolved,
                   cuda_graphs=bool(load.cuda_graphs) and resolved.type == "cuda" and not load.offload, ranks=ranks)

    @property
    def is_leader(self) -> bool:
        """Whether this process writes what its video group renders (always, on one process)."""
        return self.ranks is None or self.ranks.is_leader

    @property
    def shares_video(self) -> bool:
        """Whether other processes render the same videos with this one."""
        return self.ranks is not None and self.ranks.per_video > 1

    def record(self) -> dict:
        """What ran, as `NAME.render.json` records it beside what was asked."""
        return {"dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "cuda_graphs": self.cuda_graphs, "kernel_backend": self.stage_one.backend,
                "refiner_kernels": self.refiner.kernels, "refiner_backend": self.refiner.backend,
                "gpus_per_video": 1 if self.ranks is None else self.ranks.per_video}
