"""What to try when a command runs out of GPU memory: one line naming the card and the settings measured
to fit a card of its size (the README's "Which setting for which GPU", from `bench/bench_refiner.py`)."""
from __future__ import annotations

import sys
from typing import Optional

GIB = 2**30
# (smallest card memory in GiB, what fits it with the refiner at 704x1280), largest first
REFINER_SETTINGS = (
    (44.0, "--refiner-offload 12 (bf16, 38.5 GiB) or --precision fp8 (29.9 GiB)"),
    (20.0, "--precision fp8 --refiner-window 2 --refiner-offload 24 (18.5 GiB)"),
    (0.0, "--precision fp8 --refiner-window 2 --refiner-offload 32 (16.5 GiB), or no --refiner"),
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is PyTorch's out-of-memory error (told by name: this module does not import torch)."""
    return type(error).__name__ == "OutOfMemoryError" and type(error).__module__.split(".")[0] == "torch"


def refiner_setting(total_gib: Optional[float]) -> str:
    """The settings to try with the refiner on a card of `total_gib` (None: not known)."""
    if total_gib is None:
        return REFINER_SETTINGS[-1][1]
    return next(setting for smallest, setting in REFINER_SETTINGS if total_gib >= smallest)


def out_of_memory_line(device_name: Optional[str] = None, total_gib: Optional[float] = None) -> str:
    """The one line a command says when the GPU ran out of memory."""
    card = f" on {device_name} ({total_gib:.1f} GiB)" if device_name and total_gib else ""
    return (f"out of GPU memory{card}: with the refiner try {refiner_setting(total_gib)}; stage 1 alone: "
            "--mode segments (flat in the path length) or --offload (README: Which setting for which GPU)")


def current_card() -> tuple:
    """(name, total GiB) of the current CUDA device, or (None, None) when torch or CUDA is not there."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None, None
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return properties.name, properties.total_memory / GIB
    except Exception:  # noqa: BLE001 - advice only: a failing query leaves the card unnamed
        return None, None
