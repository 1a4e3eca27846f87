"""What one render is: `RenderRequest` (the camera path and what the render asks for, beside the settings of
the pipeline it runs on) and the checks of a request against a loaded model.

`progress` callables (`Progress`) are None or `progress(done, total, info="", stage="stage 1", unit="")`:
`done` of `total` units (denoising steps, segments, refiner blocks) finished; `info` is a short free-text
status; `stage` names the pass ("stage 1", "stage 2 (refiner)"); `unit` what is counted when the caller's
default does not fit (a stage-2 pass counts "block"s).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.model.stage1.recipes import Recipe, get_recipe
from camrender.vocabulary import DEFAULT_RECIPE, MODE, RELEASE_SIZE

DEFAULT_NEGATIVE_PROMPT = ""


@dataclasses.dataclass
class RenderRequest:
    """One render: a camera path and what this render asks for. How the pipeline computes is its `settings`
    (`camrender.render.load_settings.LoadSettings`), the ones it was planned for: a pipeline renders only the
    requests of its own settings (`check_request`).

    Attributes:
        traj: the resolved `camrender.trajectory.Trajectory` (c2w (F, 4, 4) OpenCV, intrinsics
            (F, 4) pixels of `traj.width` x `traj.height`), or None when `cameras` streams the path.
        cameras: None (the cameras of `traj`) or an iterable of `camrender.render.camera_feed.SegmentCamera`
            holding the path's `num_frames` cameras in order, pulled as the render needs them (segment
            mode: segment k's when segment k starts; `camrender.render.camera_feed`).
        prompt, negative_prompt: text conditioning (negative only used with guidance > 1).
        image: first-frame image path (str/Path) or a PIL image; None is accepted only by the tiny
            model (a mid-gray frame stands in).
        steps: denoising steps (None: the mode's default schedule; full mode needs a number).
        guidance: classifier-free guidance scale (None or <= 1 disables CFG).
        seed: noise seed (CPU generator, so renders repeat across devices).
        num_frames: video frames F = 8k + 1; fps: output frame rate.
        height, width: output size in pixels (multiples of the VAE's spatial stride).
        mode: `camrender.vocabulary.MODE`: "full" (whole clip at once) | "segments" (chunk-causal, state-cached).
        recipe: the `camrender.model.stage1.recipes.Recipe` the render samples with (the checkpoint's, with this
            render's overrides such as its flow shift).
        segment_frames: latent frames per segment after the first (segment mode; None: the recipe's).
        cached_segments: recent segments besides the first that softmax blocks attend to (segment
            mode; None: the recipe's).
        prompt_cache: folder of encoded prompts (`camrender.render.prompt_cache`), None: no cache.
        controls: the action scheme that rolled out an action-string path
            (`camrender.trajectory.controls.ControlScheme.to_dict()`: name, speeds, pitch limit, smoothing,
            fps), recorded in NAME.render.json; None for other paths.
        out: output video path.
        noise_frames: latent frames of the noise draw (None: the clip's); the clip takes its first ones.
            A live session (`camrender play`) draws its longest clip's noise up front and may stop
            earlier: its `NAME.render.json` records the draw so the shorter offline render gets the same noise.
        settings: the `LoadSettings` of the pipeline this render runs on.
    """

    traj: Any
    prompt: str = ""
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
    image: Any = None
    steps: Optional[int] = get_recipe(DEFAULT_RECIPE).steps  # the recipe table's: one source of defaults
    guidance: Optional[float] = get_recipe(DEFAULT_RECIPE).guidance
    seed: int = 0
    num_frames: int = 161
    fps: float = 16.0
    height: int = RELEASE_SIZE[0]
    width: int = RELEASE_SIZE[1]
    mode: str = get_recipe(DEFAULT_RECIPE).mode
    recipe: Recipe = get_recipe(DEFAULT_RECIPE)
    segment_frames: Optional[int] = None
    cached_segments: Optional[int] = None
    prompt_cache: Optional[str] = None
    controls: Optional[dict] = None
    out: Optional[Path] = None
    cameras: Any = None
    noise_frames: Optional[int] = None
    settings: LoadSettings = LoadSettings()

    def __post_init__(self):
        if isinstance(self.recipe, str):  # a name given in code: its Recipe, looked up here once
            self.recipe = get_recipe(self.recipe)


MODES = MODE.values

MAX_SEQUENCE_LENGTH = 300  # prompt tokens, as the released pipeline

Progress = Optional[Callable[..., None]]



def latent_shape(pipe, request: RenderRequest) -> tuple:
    """(T, h, w) latent frames, height and width of the request's video (before patching)."""
    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    return (request.num_frames - 1) // t_stride + 1, request.height // s_stride, request.width // s_stride



def check_request(pipe, request: RenderRequest, settings=None) -> None:
    """Raise CamrenderError when the request does not fit the model's strides, or was planned for a pipeline of
    other `LoadSettings` than `settings` (the pipeline's; None: not checked)."""
    if settings is not None and request.settings != settings:
        changed = [name for name in LoadSettings.__dataclass_fields__
                   if getattr(request.settings, name) != getattr(settings, name)]
        raise CamrenderError(f"this request was planned for a pipeline loaded with other settings ({', '.join(changed)}"
                             "): plan it with this pipeline's request()", field=changed[0])
    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    patch = pipe.transformer.config.patch_size
    frames = request.traj.num_frames if request.traj is not None else request.num_frames
    if frames != request.num_frames:
        raise CamrenderError(f"trajectory has {frames} frames but {request.num_frames} were requested", field="frames")
    if (frames - 1) % t_stride:
        raise CamrenderError(f"the model renders {t_stride}k+1 frames, got {frames}", field="frames")
    for name, size, step in (("height", request.height, s_stride * patch[1]), ("width", request.width, s_stride * patch[2])):
        if size <= 0 or size % step:
            raise CamrenderError(f"must be a positive multiple of {step} for this model, got {size}", field=name)
    if request.steps is not None and request.steps < 1:
        raise CamrenderError(f"must be at least 1, got {request.steps}", field="steps")

