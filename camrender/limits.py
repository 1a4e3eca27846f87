"""Model-free limits, checked where a value enters (no torch import): of a render, before any model loads,
and of a camera path, by every trajectory format and every command alike.

One place for the numbers a request must fit: frame counts per mode, the multiple a frame size
must be of, the largest frame sizes, and a path's frame count, image size and field of view.
Segment-mode rules (e.g. a different frame rule) change `max_frames` / `check_frames` here and nowhere else.
"""
from __future__ import annotations

import math
import numbers

from camrender.errors import CamrenderError
from camrender.vocabulary import TINY

TIME_STRIDE = 8  # the LTX-2 VAE: 8k+1 video frames -> k+1 latent frames
ROPE_LATENT_FRAMES = 1024  # rows of SANA-WM's RoPE table (the released and the tiny transformer)
RELEASE_SPATIAL_MULTIPLE = 32  # LTX-2 VAE spatial stride 32 x transformer patch 1
TINY_SPATIAL_MULTIPLE = 8  # the tiny model's VAE compresses 8x
MAX_VIDEO_SIDE = 4096  # pixels; the released model was trained at 704 x 1280
# Fewest latent pixels a side may have: the VAE's convolutions pad by reflection, which needs two (a
# tiny-model render of 8 x 8 pixels, one latent pixel, failed inside the decoder).
MIN_LATENT_SIDE = 2
MAX_PREVIEW_SIDE = 4096  # pixels, `traj preview` (its frames are drawn on the CPU)
# Most denoising steps a render takes (the released recipes use 4 to 60): more only allocates schedules
# that cannot finish (10**12 steps asked numpy for a 7 TiB timestep array after the model loaded).
MAX_STEPS = 1000
# One seed range for the CLI, the trajectory formats and the side files: torch.Generator.manual_seed
# takes -2**63 .. 2**64-1, the tiny models seed a second generator with seed + 1, and numpy/JSON
# readers elsewhere are happiest with int64, so 0 .. 2**63-1.
MIN_SEED, MAX_SEED = 0, 2**63 - 1
# Frame rates a video (and a trajectory) may have: mp4 players and the encoder's time base go
# strange outside this (1e9 fps wrote a 0.00 s clip).
MIN_FPS, MAX_FPS = 0.1, 240.0
# Largest |camera position| coordinate, world units: beyond it squared distances, plot limits and the
# model's float32 camera rays stop being finite or meaningful (1e300 made `inf units/frame`).
MAX_POSITION = 1e6
# The principal point may lie off the image, but at most one image size beyond each edge.
PRINCIPAL_POINT_MARGIN = 1.0
# Widest field of view a (centred) focal length may give: fx >= width / (2 tan(MAX_FOV_DEG / 2)).
# A focal length of 1e-300 pixels (180 degrees) made NaNs in every ray-based view.
MAX_FOV_DEG = 179.0
# Narrowest: a focal length of 5 million pixels a 1280-pixel image (0.01 degrees); a field of view of 5e-324
# degrees divided by zero, and rays that all coincide say nothing about the camera.
MIN_FOV_DEG = 0.01
# Every camera path, whatever its format or the command that reads it: about 52 minutes at 16 fps (six times
# the longest render, `max_frames`), and a generous image side (a path's intrinsics are in its pixels).
MAX_PATH_FRAMES = 50_000
MAX_IMAGE_SIDE = 1_000_000
# The refiner's KV window and a noise draw are latent frames: more than the RoPE table's rows never fit a clip.
MAX_LATENT_FRAMES = ROPE_LATENT_FRAMES


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
    return TINY_SPATIAL_MULTIPLE if model == TINY else RELEASE_SPATIAL_MULTIPLE


def check_size(height: int, width: int, model: str) -> None:
    """CamrenderError unless height x width is a size `model` renders (even, a multiple of its
    spatial stride, from MIN_LATENT_SIDE strides to MAX_VIDEO_SIDE)."""
    step = spatial_multiple(model)
    for name, size in (("height", height), ("width", width)):
        if size > MAX_VIDEO_SIDE:
            raise CamrenderError(f"must be at most {MAX_VIDEO_SIDE}, got {size}", field=name)
        if size < MIN_LATENT_SIDE * step:
            raise CamrenderError(f"must be at least {MIN_LATENT_SIDE * step} for this model ({MIN_LATENT_SIDE} latent "
                                 f"pixels), got {size}", field=name)
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


def check_seed(seed, field: str = "seed", path=None) -> int:
    """CamrenderError unless `seed` (None: not given) is an integer in MIN_SEED..MAX_SEED."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not MIN_SEED <= seed <= MAX_SEED:
        raise CamrenderError(f"must be an integer from {MIN_SEED} to {MAX_SEED}, got {seed!r}", path=path, field=field)
    return int(seed)


def check_fps(fps, field: str = "fps", path=None) -> None:
    """CamrenderError unless `fps` (None: not given) is a finite frame rate in MIN_FPS..MAX_FPS."""
    if fps is None:
        return
    if not math.isfinite(fps) or not MIN_FPS <= fps <= MAX_FPS:
        raise CamrenderError(f"must be a frame rate from {MIN_FPS:g} to {MAX_FPS:g}, got {fps:g}", path=path, field=field)


def check_count(count: int, most: int, what: str, path=None, field=None, frame=None) -> None:
    """CamrenderError unless 1 <= `count` (of `what`, e.g. "frames") <= `most`: for readers to call before
    they parse items one by one."""
    if count < 1:
        raise CamrenderError(f"has no {what}", path=path, field=field, frame=frame)
    if count > most:
        raise CamrenderError(f"too many {what} ({count} > {most})", path=path, field=field, frame=frame)


def check_image_side(value, field: str, path=None, frame=None) -> int:
    """CamrenderError unless `value` is a whole number of pixels from 1 to MAX_IMAGE_SIDE; returns it as int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value != int(value) or not 1 <= value <= MAX_IMAGE_SIDE:
        raise CamrenderError(f"must be a whole number of pixels from 1 to {MAX_IMAGE_SIDE}, got {value!r}",
                             path=path, frame=frame, field=field)
    return int(value)


def check_fov(degrees, field: str = "fov", path=None, frame=None, unit: str = "degrees") -> float:
    """CamrenderError unless `degrees` is a field of view from MIN_FOV_DEG to MAX_FOV_DEG; returns it as float.
    unit: "radians" when the value is given in radians (it is compared in degrees, shown as given)."""
    if isinstance(degrees, bool) or not isinstance(degrees, numbers.Real) or not math.isfinite(degrees):
        raise CamrenderError(f"must be a finite number, got {degrees!r}", path=path, frame=frame, field=field)
    value = math.degrees(degrees) if unit == "radians" else float(degrees)
    if not MIN_FOV_DEG <= value <= MAX_FOV_DEG:
        low, high = (math.radians(MIN_FOV_DEG), math.radians(MAX_FOV_DEG)) if unit == "radians" else \
            (MIN_FOV_DEG, MAX_FOV_DEG)
        raise CamrenderError(f"a field of view must be from {low:.4g} to {high:.4g} {unit}, got {degrees:g}",
                             path=path, frame=frame, field=field)
    return float(degrees)


def focal_for_fov(size: float, degrees: float) -> float:
    """The focal length (pixels) that gives a `size`-pixel side a field of view of `degrees` (checked first:
    `check_fov`)."""
    return 0.5 * size / math.tan(math.radians(degrees) / 2)


def check_latent_frames(value, field: str, *, minimum: int = 1) -> int:
    """CamrenderError unless `value` (None: not given) is a whole number of latent frames from `minimum` to
    MAX_LATENT_FRAMES (the refiner's window, a noise draw); returns it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not minimum <= value <= MAX_LATENT_FRAMES:
        raise CamrenderError(f"must be a whole number of latent frames from {minimum} to {MAX_LATENT_FRAMES}, "
                             f"got {value!r}", field=field)
    return int(value)
