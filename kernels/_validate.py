"""Argument checks shared by the kernel entry points: each failure is a ValueError naming the
argument and the expected shape."""
import functools
import os

import torch

# An op's `backend`: "triton" its kernels, "torch" its PyTorch reference (`<op>_ref`), "auto" the kernels on CUDA
# and under TRITON_INTERPRET=1, the reference elsewhere (`use_triton`).
BACKENDS = ("auto", "triton", "torch")
# An op's `matmul_precision`, its kernels' `tl.dot` input precision: "tf32" (operands rounded to a 10-bit mantissa, the
# tensor cores' fast path) or "ieee" (exact fp32 products). Not the linear layers' "bf16" / "fp8" precision.
MATMUL_PRECISIONS = ("tf32", "ieee")


def check_tensor(name, x, shape, *, floating=True, contiguous=True, last_dim_contiguous=False):
    """Check x is a tensor of `shape` (ints; None = any) and a float dtype; raise ValueError."""
    want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of shape {want}, got {type(x).__name__}")
    if x.dim() != len(shape) or any(s is not None and s != got for s, got in zip(shape, x.shape)):
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    if floating and not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor of shape {want}, got dtype {x.dtype}")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous, shape {want} (got strides {tuple(x.stride())} for shape "
                         f"{tuple(x.shape)}; call .contiguous())")
    if last_dim_contiguous and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, shape {want} (got strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)})")


def multiprocessors(device) -> int:
    """The streaming multiprocessors of `device`'s GPU; 0 off CUDA (the Triton interpreter). Read once per GPU:
    the launch heuristics ask on every kernel call."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return _multiprocessor_count(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def segment_starts_tensor(segment_starts, batch, frames, device):
    """bool (T,) or (B, T) -> int32 (B, T) contiguous on device, or None."""
    if segment_starts is None:
        return None
    if not isinstance(segment_starts, torch.Tensor):
        segment_starts = torch.as_tensor(segment_starts)
    if segment_starts.shape not in ((frames,), (batch, frames), (1, frames)):
        raise ValueError(f"segment_starts must have shape ({frames},) or ({batch}, {frames}), "
                         f"got {tuple(segment_starts.shape)}")
    starts = segment_starts.to(device=device, dtype=torch.bool).reshape(-1, frames)
    return starts.expand(batch, frames).to(torch.int32).contiguous()


def triton_interpreted() -> bool:
    """Whether Triton kernels run in its interpreter (TRITON_INTERPRET=1): on the CPU, one program after another."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(x, backend="auto"):
    """Whether to run the Triton kernels on tensor x: backend "triton", or "auto" on CUDA or under
    TRITON_INTERPRET=1 ("torch": the PyTorch references)."""
    check_choice("backend", backend, BACKENDS)
    if backend == "auto":
        return x.is_cuda or triton_interpreted()
    return backend == "triton"


def check_inv_rms(name, inv_rms, batch, tokens, device):
    """A per-token inverse RMS (B, N) (or (1, N), broadcast) as the kernels read it: fp32,
    contiguous (B, N) on `device`; raise ValueError on another shape."""
    if not isinstance(inv_rms, torch.Tensor) or inv_rms.shape not in ((batch, tokens), (1, tokens)):
        got = tuple(inv_rms.shape) if isinstance(inv_rms, torch.Tensor) else type(inv_rms).__name__
        raise ValueError(f"{name} must have shape ({batch}, {tokens}), got {got}")
    return inv_rms.to(device=device, dtype=torch.float32).expand(batch, tokens).contiguous()
