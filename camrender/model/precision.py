"""The precisions of the transformer blocks' linear layers, as strategies: `PRECISIONS[name]`.

Each entry knows what a stage needs from the machine (`check_device`), what it rules out (`check_setup`), how
it turns a list of loaded blocks into its form (`prepare_blocks`), and what the blocks' kernels then read
(`kernel_input`). Stage 1 (`camrender.render.pipeline`) and the refiner (`camrender.render.stage_two`) call
the entry of their stage's setting; nothing else asks which precision it is.

Adding a precision is one module with its entry plus one line in `PRECISIONS` (and its word in
`camrender.vocabulary.PRECISION`); docs/architecture.md walks through it.
"""
from __future__ import annotations

from typing import Iterable, Optional

from camrender.errors import CamrenderError


class Bf16:
    """The model's own dtype (bfloat16 on a GPU): the blocks stay as loaded."""

    name = "bf16"
    kernel_input = "the model's dtype"

    def check_device(self, device, option: str) -> None:
        """Any device runs it."""

    def check_setup(self, *, kernels: str, offload: bool, head_split: int, option: str) -> None:
        """Every setup runs it."""

    def prepare_blocks(self, blocks: Iterable, device=None) -> int:
        """Nothing to do; returns the number of layers changed (0)."""
        return 0


class Fp8:
    """e4m3 weights and activations for the blocks' linear layers (`camrender.model.fp8`: W8A8 through
    `torch._scaled_mm`, row-wise scales), on GPUs with FP8 tensor cores."""

    name = "fp8"
    kernel_input = "e4m3 rows with per-row scales (`camrender.model.fp8.QuantizedRows`), written by the glue kernels"

    def check_device(self, device, option: str) -> None:
        """A CUDA GPU of compute capability 8.9+ (Ada, Hopper); CamrenderError naming `option` otherwise."""
        from camrender.model.device import check_fp8

        check_fp8(device, option)

    def check_setup(self, *, kernels: str, offload: bool, head_split: int, option: str) -> None:
        """The FP8 linears live on one GPU inside the fused blocks: not with the reference kernels, model CPU
        offload or a head split over several GPUs."""
        if kernels != "fused" or offload or head_split > 1:
            raise CamrenderError(f"{option.replace('_', '-')} fp8 needs --kernels fused, one GPU per video and no "
                                 "--offload", field=option.replace("_", "-"))

    def prepare_blocks(self, blocks: Iterable, device=None) -> int:
        """Quantize every block's chosen linear layers in place, on `device` (default: where they are); returns
        how many."""
        from camrender.model.fp8 import quantize_blocks

        return quantize_blocks(blocks, device=device)


PRECISIONS = {entry.name: entry for entry in (Bf16(), Fp8())}


def get_precision(name: str, field: Optional[str] = None):
    """The entry of a precision word; CamrenderError naming `field` for an unknown one."""
    if name not in PRECISIONS:
        raise CamrenderError(f"must be one of {', '.join(PRECISIONS)}, got {name!r}", field=field or "precision")
    return PRECISIONS[name]
