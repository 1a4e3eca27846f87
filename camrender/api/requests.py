"""From a camera path and a few options to a `RenderRequest`: the defaults a render takes when an option is
not given (the recipe's, the model's size), decided here once for the Python API and the CLI.

Nothing here loads a model: a request is checked against the configs on disk only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.limits import check_frames, check_size
from camrender.model.device import check_fp8
from camrender.model.refiner.loading import resolve_refiner, vae_latent_channels
from camrender.model.stage1.loading import DEFAULT_MODEL, model_source
from camrender.model.stage1.recipes import DEFAULT_RECIPE, get_recipe
from camrender.render.inputs import open_image
from camrender.render.request import RenderRequest
from camrender.trajectory.resample import to_model_frames

RELEASE_SIZE = (704, 1280)  # (height, width) the released model was trained at
TINY_SIZE = (64, 112)  # the offline tiny model's default: about the release aspect, small enough for a CPU
# full mode's defaults where a recipe has none: the default recipe's (the recipe table is their one source)
RELEASE_GUIDANCE = get_recipe(DEFAULT_RECIPE).guidance
RELEASE_STEPS = get_recipe(DEFAULT_RECIPE).steps
TINY_STEPS = 10  # full mode with the tiny model (its frames are noise anyway)


def default_steps(steps: Optional[int], mode: str, model: str, recipe):
    """`steps`, else the recipe's: the streaming recipe's timestep list (None), 60 steps otherwise
    (full mode with the tiny model: 10)."""
    if steps is not None:
        return steps
    if mode == "full":
        return TINY_STEPS if model == "tiny" else (recipe.steps or RELEASE_STEPS)
    return recipe.steps if recipe.mode == "segments" else None


def default_guidance(guidance: Optional[float], mode: str, recipe):
    """`guidance`, else the recipe's (bidirectional and chunk-causal 5, streaming off); the
    bidirectional checkpoint forced into segment mode samples without guidance."""
    if guidance is not None:
        return guidance
    if mode != recipe.mode:
        return None if mode == "segments" else RELEASE_GUIDANCE
    return recipe.guidance if recipe.guidance > 1 else None


PRECISIONS = ("bf16", "fp8")  # the blocks' linears: the model's dtype, or e4m3 W8A8 (camrender.model.fp8)
REFINER_OPTIONS = ("refiner_offload", "refiner_precision", "refiner_window")  # RenderRequest fields


def check_refiner_options(refiner, given, spell=str) -> None:
    """A refiner option (`REFINER_OPTIONS`) the user gave (`given`: those names) without a refiner is
    refused rather than ignored. spell(name): the name as the user wrote it (the CLI: "--refiner-window")."""
    if refiner not in (None, "none"):
        return
    for name in REFINER_OPTIONS:
        if name in given:
            raise CamrenderError(f"{spell(name)} applies to the refiner (stage 2): pass {spell('refiner')} too, or "
                                 "drop it", field=spell(name).lstrip("-"))


def stage_precisions(precision: str, stage1_precision: Optional[str], refiner_precision: Optional[str], device,
                     spell=str) -> dict:
    """{"stage1_precision", "refiner_precision"}: each stage's given one, else `precision`; each checked
    ("bf16" or "fp8"; FP8 against `device`, before any model loads), an error naming the option that chose
    it (`spell` as `check_refiner_options`')."""
    given = {"stage1_precision": stage1_precision, "refiner_precision": refiner_precision}
    chosen = {name: value or precision for name, value in given.items()}
    for name, value in chosen.items():
        option = spell(name if given[name] else "precision").lstrip("-")
        if value not in PRECISIONS:
            raise CamrenderError(f"must be one of {', '.join(PRECISIONS)}, got {value!r}", field=option)
        if value == "fp8":
            check_fp8(device, option)
    return chosen


def default_size(height: Optional[int], width: Optional[int], model: str) -> tuple:
    """(height, width) in pixels: the given ones, else the release size (the tiny model: 64 x 112)."""
    default_h, default_w = TINY_SIZE if model == "tiny" else RELEASE_SIZE
    return height or default_h, width or default_w


def checked_refiner(refiner, model: str, vae, frames: int):
    """`refiner` ("none"/None, "tiny", a folder or a hub id) checked against the VAE's latent channels from
    the configs on disk (nothing loads yet) and the frame count; None without one."""
    refiner = resolve_refiner(refiner or "none", vae_latent_channels(model, vae))
    if refiner is not None and frames < 9:  # 8k+1 frames: k latent frames after the image's
        raise CamrenderError(f"the refiner needs at least 9 frames (it refines the latent frames after the "
                             f"image's), got {frames}", field="frames")
    return refiner


def build_request(traj, recipe, *, model: str = DEFAULT_MODEL, mode: Optional[str] = None,
                  frames: Optional[int] = None, image=None, prompt: Optional[str] = None,
                  negative_prompt: Optional[str] = None, seed: Optional[int] = None, fps: Optional[float] = None,
                  height: Optional[int] = None, width: Optional[int] = None, steps: Optional[int] = None,
                  guidance: Optional[float] = None, refiner=None, vae=None, cameras=None, **settings) -> RenderRequest:
    """The request of one render, every default decided.

    traj: a validated `camrender.trajectory.Trajectory` (re-timed here to `frames`, else to the nearest
    frame count of the recipe: `RenderRequest.traj`), or None with `cameras` (an iterable of
    `camrender.render.camera_feed.SegmentCamera`, the path as a stream) and `frames` (8k + 1);
    recipe: the `camrender.model.stage1.recipes.Recipe`; image: path or PIL image (default: the trajectory's;
    only the tiny model renders without one); prompt, negative_prompt, seed, fps: default the
    trajectory's, else "", "", 0, 16; settings: the other `RenderRequest` fields (dtype, device, kernels,
    offload, transformer_weights, cuda_graphs, out, ...), passed through.
    Raises CamrenderError (one line naming the field) for what does not fit.
    """
    mode = mode or recipe.mode
    if frames is not None:
        check_frames(frames, mode)
    if traj is not None:
        traj = to_model_frames(traj, frames, stride=recipe.frame_stride)
        frames = traj.num_frames
    elif cameras is None or frames is None:
        raise CamrenderError("give a trajectory, or a camera stream and its number of frames", field="frames")
    check_frames(frames, mode)
    if image is None and traj is not None:
        image = traj.image
    if image is not None:
        open_image(image)  # missing/unreadable -> CamrenderError now, not after the model loads
        image = str(Path(image).resolve()) if isinstance(image, (str, Path)) else image
    elif model != "tiny":
        raise CamrenderError("SANA-WM needs a first-frame image: pass --image or set \"image\" in the trajectory",
                             field="image")
    height, width = default_size(height, width, model)
    check_size(height, width, model)
    if model != "tiny":
        model_source(model)  # a folder that is not there: now, not after minutes of loading

    def first(*values):
        return next((v for v in values if v is not None), None)

    from_traj = (lambda name: getattr(traj, name)) if traj is not None else (lambda name: None)
    prompt = first(prompt, from_traj("prompt"), "")
    negative = first(negative_prompt, from_traj("negative_prompt"), "")
    seed = first(seed, from_traj("seed"), 0)
    fps = first(fps, from_traj("fps"), 16.0)
    if traj is not None:
        traj = traj.replace(prompt=prompt, negative_prompt=negative, image=image if isinstance(image, str) else None,
                            seed=seed, fps=fps)
    return RenderRequest(traj=traj, prompt=prompt, negative_prompt=negative, image=image,
                         steps=default_steps(steps, mode, model, recipe),
                         guidance=default_guidance(guidance, mode, recipe), seed=seed, num_frames=frames, fps=fps,
                         height=height, width=width, model=model, vae=vae, mode=mode, recipe=recipe.name,
                         refiner=checked_refiner(refiner, model, vae, frames), cameras=cameras, **settings)
