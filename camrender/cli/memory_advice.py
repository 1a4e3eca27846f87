"""What to try when a command runs out of GPU memory: one line naming the card and the settings measured
to fit a card of its size (the README's "Which setting for which GPU", from `bench/bench_refiner.py`)."""
from __future__ import annotations

import sys
from typing import Optional

GIB = 2**30
CACHED = " with the prompt encoded first (camrender encode-prompt)"
# (smallest card memory in GiB, what fits it with the refiner at 704x1280), largest first; FP8 needs compute
# capability 8.9 (Ada, Hopper)
REFINER_SETTINGS = (
    (44.0, "--refiner-offload 12 (bf16, 38.5 GiB) or --precision fp8 (27.7 GiB)"),
    (29.0, "--precision fp8 --refiner-offload 12 (25.4 GiB" + CACHED + ")"),
    (22.0, "--precision fp8 --refiner-offload 36 (20.1 GiB" + CACHED + ")"),
    (0.0, "--precision fp8 --refiner-offload 48 (17.5 GiB" + CACHED + "; --refiner-window 2: 5.8 GiB less, "
          "lower quality), or no --refiner"),
)
REFINER_SETTINGS_BF16 = (
    (44.0, "--refiner-offload 12 (38.5 GiB)"),
    (0.0, "--refiner-offload layers" + CACHED + " (slow), or no --refiner"),
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is PyTorch's out-of-memory error (told by name: this module does not import torch)."""
    return type(error).__name__ == "OutOfMemoryError" and type(error).__module__.split(".")[0] == "torch"


def refiner_setting(total_gib: Optional[float], fp8: bool = True) -> str:
    """The settings to try with the refiner on a card of `total_gib` (None: not known); fp8: whether the card
    has FP8 tensor cores."""
    table = REFINER_SETTINGS if fp8 else REFINER_SETTINGS_BF16
    if total_gib is None:
        return table[-1][1]
    return next(setting for smallest, setting in table if total_gib >= smallest)


def out_of_memory_line(device_name: Optional[str] = None, total_gib: Optional[float] = None, fp8: bool = True) -> str:
    """The one line a command says when the GPU ran out of memory."""
    card = f" on {device_name} ({total_gib:.1f} GiB)" if device_name and total_gib else ""
    return (f"out of GPU memory{card}: with the refiner try {refiner_setting(total_gib, fp8)}; stage 1 alone: "
            "--mode segments (flat in the path length) or --offload (README: Which setting for which GPU)")


def current_card() -> tuple:
    """(name, total GiB, has FP8 tensor cores) of the current CUDA device; (None, None, True) when torch or
    CUDA is not there."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None, None, True
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        return properties.name, properties.total_memory / GIB, (properties.major, properties.minor) >= (8, 9)
    except Exception:  # noqa: BLE001 - advice only: a failing query leaves the card unnamed
        return None, None, True
