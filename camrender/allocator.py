"""PyTorch's CUDA allocator setting for camrender's processes: expandable segments, unless the user chose one.

A render allocates and frees blocks of many sizes (stage 1's graph pools, the refiner's window, the decode's
workspace). PyTorch's default allocator reserves memory in separate segments, and free blocks of different
segments never merge into one larger block, so what is reserved grows beyond what is allocated (5.45 GiB of
"allocator slack" at the bf16 peak on an H200, bench/results/2026-12-01_refined_segments_bf16_first_diet_h200.json).
With expandable segments the allocator grows one mapping per stream instead, and freed pages can serve a later
request of any size.

PyTorch reads the setting when CUDA's allocator starts (the first CUDA allocation), so the entry points (the
CLI's `main`, the Python API's import, the GPU benchmarks) call `use_expandable_segments` before any model
loads. A setting of the user's own (PYTORCH_CUDA_ALLOC_CONF, or PYTORCH_ALLOC_CONF, the newer name) is kept.
No torch import here: the CLI's checks run before torch is imported.
"""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
USER_NAMES = (ALLOC_CONF, "PYTORCH_ALLOC_CONF")  # either one set by the user: theirs is kept
EXPANDABLE = "expandable_segments:True"


def use_expandable_segments(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in `environ` (default `os.environ`: this process
    and the processes it starts) when the user has set no allocator configuration. Returns whether it set it."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in USER_NAMES):
        return False
    environ[ALLOC_CONF] = EXPANDABLE
    return True
