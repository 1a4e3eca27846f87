"""The `--device` and `--dtype` words as torch objects, whether a device runs FP8 (`check_fp8`), and a host
tensor's copy to the GPU that does not wait for the GPU (`to_device`).

torch is imported inside the functions: `camrender.model.stage1.loading` imports this module, and the
CLI imports that one at its top for `DEFAULT_MODEL`, so `camrender --help` stays free of torch.
"""
from __future__ import annotations

from camrender.errors import CamrenderError
from camrender.vocabulary import HALF_DTYPES


def resolve_device(device=None):
    """`torch.device` for a name ("cuda", "cuda:1", "cpu") or None = CUDA when available, else CPU."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise CamrenderError(f"unknown device {device!r}", field="device") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise CamrenderError("CUDA was requested but no GPU is available; use --device cpu", field="device")
    return resolved


def check_device(device, offload: bool = False, dtype: str = "auto") -> None:
    """The device exists here (a CUDA index below the GPU count); offload has a GPU and accelerate; half
    precision (dtype float16/bfloat16) has a GPU (the CPU kernels of the pipeline refuse it). "cpu" is checked
    without importing torch (a driver that only plans, as the Ray executor's, never needs it)."""
    kind = "cpu" if device == "cpu" else _existing_device_type(device)
    if dtype in HALF_DTYPES and kind != "cuda":
        raise CamrenderError(f"{dtype} needs a CUDA device; on the CPU use --dtype float32 (or auto)", field="dtype")
    if offload and kind != "cuda":
        raise CamrenderError("--offload moves components to a GPU while they run; it needs a CUDA device",
                             field="offload")
    if offload:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise CamrenderError("--offload needs the accelerate package (pip install accelerate)",
                                 field="offload") from None


def _existing_device_type(device) -> str:
    """The type of `device` ("cpu" or "cuda"), a device this machine has; CamrenderError otherwise."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise CamrenderError(f"must be cpu, cuda or cuda:N, got {device!r}", field="device")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise CamrenderError(f"there is no GPU {resolved.index} (this machine has {torch.cuda.device_count()})",
                             field="device")
    return resolved.type


def resolve_dtype(dtype, device):
    """`torch.dtype` for "auto" (bfloat16 on CUDA, float32 elsewhere), "bfloat16", "float16" or "float32"."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "fp32": torch.float32}
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in names:
        raise CamrenderError(f"must be auto, bfloat16, float16 or float32, got {dtype!r}", field="dtype")
    return names[dtype]


def check_fp8(device, option: str = "precision") -> None:
    """FP8 needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+)."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    from camrender.model.fp8 import MIN_CAPABILITY

    resolved = resolve_device(device)
    if resolved.type != "cuda" or not torch.cuda.is_available():
        where = "the CPU" if resolved.type != "cuda" else "no CUDA GPU (none is visible)"
        raise CamrenderError(f"fp8 needs a GPU with FP8 tensor cores (compute capability 8.9+: Ada, Hopper); "
                             f"this render runs on {where}", field=option)
    capability = torch.cuda.get_device_capability(resolved)
    if tuple(capability) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(resolved)
        raise CamrenderError(f"fp8 needs compute capability 8.9+ (Ada, Hopper); {name} is "
                             f"{capability[0]}.{capability[1]}: use bf16", field=option)


def to_device(tensor, device, dtype=None):
    """`tensor.to(device, dtype)`, the same values, without making the host wait for the GPU.

    A plain copy from pageable host memory to a CUDA device synchronizes the stream. In segment mode the host
    would then wait, at every segment's start, for the previous segment's queued passes, and the GPU would sit
    idle while the host prepared the next segment's conditioning. A CPU tensor bound for CUDA therefore goes
    through page-locked memory and is copied asynchronously on the current stream. PyTorch keeps the
    page-locked block until the copy has run. Any dtype conversion happens on the GPU, with the same rounding
    as on the CPU. Other moves are plain `.to`. The copy reads a page-locked copy of the tensor, which the caller
    may then change, except a tensor already contiguous in page-locked memory: that one is read where it is, so
    it must not be written until the copy has run.
    """
    # lazy: keeps `camrender --help` free of torch
    import torch

    device = torch.device(device)
    if tensor.device.type != "cpu" or device.type != "cuda":
        return tensor.to(device=device, dtype=dtype)
    return tensor.contiguous().pin_memory().to(device=device, dtype=dtype, non_blocking=True)
