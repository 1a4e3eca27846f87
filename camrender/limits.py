"""Model-free limits of a render, checked before any model loads (no torch import).

One place for the numbers a request must fit: frame counts per mode, the multiple a frame size
must be of, the largest frame sizes. Segment-mode rules (e.g. a different frame rule) change
`max_frames` / `check_frames` here and nowhere else.
"""
from __future__ import annotations

import math

from camrender.errors import CamrenderError

TIME_STRIDE = 8  # the LTX-2 VAE: 8k+1 video frames -> k+1 latent frames
ROPE_LATENT_FRAMES = 1024  # rows of SANA-WM's RoPE table (the released and the tiny transformer)
RELEASE_SPATIAL_MULTIPLE = 32  # LTX-2 VAE spatial stride 32 x transformer patch 1
TINY_SPATIAL_MULTIPLE = 8  # the tiny model's VAE compresses 8x
MAX_VIDEO_SIDE = 4096  # pixels; the released model was trained at 704 x 1280
MAX_PREVIEW_SIDE = 4096  # pixels, `traj preview` (its frames are drawn on the CPU)
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range (non-negative part)


def max_frames(mode: str) -> int:
    """Most video frames a render in `mode` ("full" | "segments") can have: the RoPE table has one
    row per latent frame, and latent frame j covers video frames 8(j-1)+1 .. 8j."""
    return (ROPE_LATENT_FRAMES - 1) * TIME_STRIDE + 1


def check_frames(num_frames: int, mode: str, field: str = "frames") -> None:
    """CamrenderError unless `num_frames` video frames fit a `mode` render (the 8k+1 rule is the
    trajectory's, `camrender.trajectory.to_model_frames`)."""
    longest = max_frames(mode)
    if num_frames > longest:
        raise CamrenderError(f"{mode} mode renders at most {longest} frames, got {num_frames}", field=field)


def spatial_multiple(model: str) -> int:
    """The multiple of pixels a frame side must be for `model` ("tiny", a hub id or a folder)."""
    return TINY_SPATIAL_MULTIPLE if model == "tiny" else RELEASE_SPATIAL_MULTIPLE


def check_size(height: int, width: int, model: str) -> None:
    """CamrenderError unless height x width is a size `model` renders (even, a multiple of its
    spatial stride, at most MAX_VIDEO_SIDE)."""
    step = spatial_multiple(model)
    for name, size in (("height", height), ("width", width)):
        if size > MAX_VIDEO_SIDE:
            raise CamrenderError(f"must be at most {MAX_VIDEO_SIDE}, got {size}", field=name)
        if size % step:
            lower, upper = max(step, size - size % step), size - size % step + step
            raise CamrenderError(f"must be a multiple of {step} for this model, got {size} "
                                 f"(e.g. {lower} or {upper})", field=name)


def check_finite(value, field: str, *, minimum: float | None = None) -> None:
    """CamrenderError unless `value` (None: not given) is a finite number >= minimum."""
    if value is None:
        return
    if not math.isfinite(value):
        raise CamrenderError(f"must be a finite number, got {value}", field=field)
    if minimum is not None and value < minimum:
        raise CamrenderError(f"must be at least {minimum:g}, got {value:g}", field=field)
