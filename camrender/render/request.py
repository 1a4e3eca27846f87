"""What one render is: `RenderRequest` (the camera path plus sampling and model settings) and the checks
of a request against a loaded model's strides.

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
from camrender.model.stage1.loading import DEFAULT_MODEL
from camrender.model.stage1.recipes import DEFAULT_RECIPE, get_recipe

DEFAULT_NEGATIVE_PROMPT = ""


@dataclasses.dataclass
class RenderRequest:
    """One render: a camera path plus the sampling and model settings.

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
        model: hub id, local diffusers folder, or "tiny".
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU) | "bfloat16" | "float16" | "float32".
        device: "cuda", "cuda:1", "cpu", ... or None for auto (CUDA when available).
        offload: model CPU offload (components move to the device only while they run).
        transformer_weights: optional original-format DiT file loaded over the transformer.
        vae: optional diffusers VAE folder replacing the pipeline's (the streaming causal VAE).
        kernels: "fused" (the Triton kernels of every patched block; PyTorch references on CPU) |
            "torch" (stage 1 on the kernels' PyTorch references, the refiner on diffusers' own block code).
        mode: "full" (whole clip at once) | "segments" (chunk-causal, state-cached).
        recipe: the checkpoint's recipe (`camrender.model.stage1.recipes`): "bidirectional" (or
            "bidirectional-nvlabs-latest", "bidirectional-diffusers") | "streaming" | "chunk-causal".
        allow_missing_weights: render even when `transformer_weights` leaves transformer weights unloaded.
        segment_frames: latent frames per segment after the first (segment mode; None: the recipe's).
        cached_segments: recent segments besides the first that softmax blocks attend to (segment
            mode; None: the recipe's).
        cuda_graphs: replay the denoising passes as CUDA graphs (`camrender.model.graphs`; on CUDA, without
            model CPU offload).
        refiner: stage 2 (`camrender.model.refiner.loading.resolve_refiner`'s result: None, "tiny", a checked
            folder or a hub id); loaded next to the pipeline and attached to it
            (`camrender.render.stage_two.attach_refiner`).
        refiner_offload: "none" (the refiner's DiT lives on the GPU) | "layers" (its blocks visit the GPU
            one at a time) | a number N as a string (N blocks stream from CPU memory, the rest resident).
        stage1_precision, refiner_precision: "bf16" (the model's dtype) | "fp8" (e4m3 W8A8 linears of the
            transformer blocks, `camrender.model.fp8`; CUDA, compute capability 8.9+).
        refiner_window: the refiner's KV window in latent frames (sink + N-1 recent; official
            `--refiner_kv_max_frames`, 11).
        prompt_cache: folder of encoded prompts (`camrender.render.prompt_cache`), None: no cache.
        controls: the action scheme that rolled out an action-string path
            (`camrender.trajectory.controls.ControlScheme.to_dict()`: name, speeds, pitch limit, smoothing,
            fps), recorded in NAME.render.json; None for other paths.
        out: output video path.
        noise_frames: latent frames of the noise draw (None: the clip's); the clip takes its first ones.
            A live session (`camrender play`) draws its longest clip's noise up front and may stop
            earlier: its `NAME.render.json` records the draw so the shorter offline render gets the same noise.
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
    height: int = 704
    width: int = 1280
    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    device: Optional[str] = None
    offload: bool = False
    transformer_weights: Optional[str] = None
    vae: Optional[str] = None
    kernels: str = "fused"
    mode: str = get_recipe(DEFAULT_RECIPE).mode
    recipe: str = DEFAULT_RECIPE
    allow_missing_weights: bool = False
    segment_frames: Optional[int] = None
    cached_segments: Optional[int] = None
    cuda_graphs: bool = True
    refiner: Optional[str] = None
    refiner_offload: str = "none"
    stage1_precision: str = "bf16"
    refiner_precision: str = "bf16"
    refiner_window: int = 11
    prompt_cache: Optional[str] = None
    controls: Optional[dict] = None
    out: Optional[Path] = None
    cameras: Any = None
    noise_frames: Optional[int] = None



MODES = ("full", "segments")

MAX_SEQUENCE_LENGTH = 300  # prompt tokens, as the released pipeline

Progress = Optional[Callable[..., None]]



def latent_shape(pipe, request: RenderRequest) -> tuple:
    """(T, h, w) latent frames, height and width of the request's video (before patching)."""
    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    return (request.num_frames - 1) // t_stride + 1, request.height // s_stride, request.width // s_stride



def check_request(pipe, request: RenderRequest) -> None:
    """Raise CamrenderError when the request does not fit the model's strides."""
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

