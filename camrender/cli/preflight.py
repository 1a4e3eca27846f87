"""Checks of the render options that need no model: run before anything loads (loading a real
model takes minutes, so every mistake a user can make must be caught here first).

Each check raises `CamrenderError` (one line, exit code 2) naming the option.
"""
from __future__ import annotations

import math
from pathlib import Path

from camrender.errors import CamrenderError
from camrender.files import remove_quietly, temp_beside
from camrender.limits import MAX_STEPS, TIME_STRIDE, check_finite, check_fps, check_latent_frames, check_seed
from camrender.model.device import resolve_device
from camrender.model.stage1.recipes import WEIGHT_SUFFIXES

VIDEO_SUFFIXES = (".mp4",)


def check_suffix(path, suffixes, what: str) -> None:
    """CamrenderError unless `path` ends with one of `suffixes` (lower case, with the dot)."""
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise CamrenderError(f"{what} must end with {' or '.join(suffixes)}, got {suffix or 'no suffix'!r}",
                             path=path)


def check_render_options(options: dict) -> None:
    """Everything about the `render` options that can be checked without the model and the
    trajectory: output suffix, numbers finite and in range, device, weight files (sizes, frame
    counts, the image and the model folder are checked where the request is resolved,
    `camrender.cli.render`)."""
    check_suffix(options["out"], VIDEO_SUFFIXES, "the output video")
    check_finite(options["guidance"], "guidance", minimum=0.0)
    check_finite(options["fps"], "fps")
    check_fps(options["fps"])
    if options["steps"] is not None and options["steps"] > MAX_STEPS:
        raise CamrenderError(f"must be at most {MAX_STEPS}, got {options['steps']}", field="steps")
    check_seed(options["seed"])
    check_device(options["device"], options["offload"], options["dtype"])
    weights = options["transformer_weights"]
    if weights is not None and not Path(weights).is_file():
        problem = ("is a directory, expected a .safetensors or .pt file" if Path(weights).is_dir() else
                   "is not a regular file (a FIFO, device or socket)" if Path(weights).exists() else "file not found")
        raise CamrenderError(problem, path=weights, field="transformer-weights")
    if weights is not None:
        check_suffix(weights, WEIGHT_SUFFIXES, "--transformer-weights (original-format DiT weights)")
    vae = options["vae"]
    if vae is not None and not (Path(vae).expanduser() / "config.json").is_file():
        problem = "folder not found" if not Path(vae).exists() else "not a diffusers VAE folder (no config.json)"
        raise CamrenderError(problem, path=vae, field="vae")


def check_checkpoint_every(seconds: float) -> None:
    """--checkpoint-every: a number of seconds >= 0 (inf: never); NaN is refused (click's range lets it pass)."""
    if math.isnan(seconds):
        raise CamrenderError("must be a number of seconds (0: every segment), got nan", field="checkpoint-every")


def probe_writable(path) -> None:
    """Create and delete a file next to `path`: some folders pass the permission bits and still
    refuse new files (/sys, read-only mounts), which would only show after the model has loaded."""
    remove_quietly(temp_beside(path, ".probe", prefix=f".{Path(path).name}."))  # (a name that fits the folder)


HALF_DTYPES = ("float16", "bfloat16")


def check_device(device, offload: bool, dtype: str = "auto") -> None:
    """The device exists here (a CUDA index below the GPU count); --offload has a GPU and accelerate;
    half precision (--dtype float16/bfloat16) has a GPU (the CPU kernels of the pipeline refuse it)."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise CamrenderError(f"must be cpu, cuda or cuda:N, got {device!r}", field="device")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise CamrenderError(f"there is no GPU {resolved.index} (this machine has {torch.cuda.device_count()})",
                             field="device")
    if dtype in HALF_DTYPES and resolved.type != "cuda":
        raise CamrenderError(f"{dtype} needs a CUDA device; on the CPU use --dtype float32 (or auto)", field="dtype")
    if offload and resolved.type != "cuda":
        raise CamrenderError("--offload moves components to a GPU while they run; it needs a CUDA device",
                             field="offload")
    if offload:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise CamrenderError("--offload needs the accelerate package (pip install accelerate)",
                                 field="offload") from None


def check_noise_frames(drawn, frames: int):
    """--noise-frames (None, or latent frames of the noise draw, which a `camrender play` session's render
    file sets) checked against the `frames` video frames' latent frames; returns it."""
    latent = (frames - 1) // TIME_STRIDE + 1
    if drawn is not None and drawn < latent:
        raise CamrenderError(f"must be at least the clip's {latent} latent frames, got {drawn}", field="noise-frames")
    return check_latent_frames(drawn, "noise-frames")
