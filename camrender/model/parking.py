"""Weights a render calls only for its prompt, parked in page-locked CPU memory between their calls.

A render computes its prompt's keys and values once (stage 1: `stage1.block.prepared_text`; the refiner: its
prompt memo, `refiner.stream._TextMemo`) and then never runs the projections that made them again, so on the
GPU their weights only take room. At the release size that is 3.0 GiB of the bf16 refiner's 24.3 GiB (each
block's prompt key and value projections, and the caption projection) and 0.37 GiB of stage 1's 5.0 GiB
(each block's text `kv_linear`); half of that in FP8.

`park(module)` moves the module's parameters and buffers from its CUDA device to page-locked CPU memory and
wraps its forward. A call copies them to the device, runs the module's own forward and points the module
back at the CPU copies. The device copies are freed once the call's kernels have run: the copies and the
kernels share a stream, so the caching allocator reuses that memory only after them. A new prompt costs one
copy of the parked weights and gives the same values: 3 GiB over PCIe, about 0.06 s at the 55 GB/s that
`bench/bench_refiner.py` measures for page-locked copies on an H200.

A module that is not wholly on one CUDA device (streamed or offloaded blocks, a CPU model) is left as it is.
`state_dict()` and `load_state_dict()` see the real weights; `.to(device)` brings them back for good. A call
runs where its input lies: the wrapper copies only what is elsewhere.
"""
from __future__ import annotations

import functools

import torch

# Where parking pays: a CPU model has nowhere to park to. Tests add "cpu" to check the logic on a CPU.
PARKED_DEVICE_TYPES = ("cuda",)
_PARKED = "_camrender_parked_on"  # the device a parked module runs on


def _tensors(module) -> list:
    """Every parameter and buffer under `module` (each shared one once)."""
    return [*module.parameters(), *module.buffers()]


def is_parked(module) -> bool:
    """Whether `park` has wrapped `module` (its weights may since have been brought back by `.to()`)."""
    return getattr(module, _PARKED, None) is not None


def park(module) -> bool:
    """Park `module` (module docstring) if all its parameters and buffers lie on one device of a type in
    `PARKED_DEVICE_TYPES`; True if it is parked now. Parking a parked module again parks what `.to()` brought
    back since."""
    tensors = _tensors(module)
    devices = {tensor.device for tensor in tensors}
    if len(devices) != 1:  # nothing to park, or split across devices (a streamer's or offloader's business)
        return False
    device = devices.pop()
    if device.type not in PARKED_DEVICE_TYPES:
        return False
    pin = device.type == "cuda"
    for tensor in tensors:
        home = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        home.copy_(tensor.detach())
        tensor.data = home
    if not is_parked(module):
        module.forward = functools.partial(_visit, module, module.forward)
    setattr(module, _PARKED, device)
    return True


def park_all(modules) -> None:
    """`park` each of `modules`, then hand the GPU memory they held back to the driver: PyTorch's allocator
    caches freed blocks per CUDA stream, and the render's other streams could not use them otherwise."""
    if any([park(module) for module in modules]) and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _visit(module, forward, *args, **kwargs):
    """The module's forward with its tensors copied for the call to where its input lies (else to the device it
    was parked from)."""
    inputs = [value for value in list(args) + list(kwargs.values()) if isinstance(value, torch.Tensor)]
    device = inputs[0].device if inputs else getattr(module, _PARKED)
    visiting = [(tensor, tensor.data) for tensor in _tensors(module) if tensor.device != device]
    for tensor, home in visiting:
        tensor.data = home.to(device, non_blocking=True)
    try:
        return forward(*args, **kwargs)
    finally:
        for tensor, home in visiting:
            tensor.data = home
