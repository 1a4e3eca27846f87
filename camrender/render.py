"""Render requests and the full-clip sampler.

`RenderRequest` holds everything one render needs (what to render and with which model).
`render_frames(pipe, request, progress)` is the one entry the CLI calls: it yields uint8
video frames (F_chunk, H, W, 3) in order, to be appended to a `camrender.video.VideoWriter`.
It dispatches on `request.mode`:

- "full": `render_full` below denoises the whole clip at once and yields all frames.
- "segments": `camrender.render_segments.render_segments(pipe, request, progress)`, which must
  have the same contract (a generator of uint8 frame chunks, one per finished segment).

`progress` is None or a callable `progress(done, total, info="")`: `done` of `total` units
(denoising steps here, segments there) finished; `info` is a short free-text status.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from camrender.errors import CamrenderError
from camrender.loading import DEFAULT_MODEL

DEFAULT_NEGATIVE_PROMPT = ""


@dataclasses.dataclass
class RenderRequest:
    """One render: a camera path plus the sampling and model settings.

    Attributes:
        traj: the resolved `camrender.trajectory.Trajectory` (c2w (F, 4, 4) OpenCV, intrinsics
            (F, 4) pixels of `traj.width` x `traj.height`).
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
            "torch" (diffusers' own code, with the PyTorch reference of the GDN camera branch).
        mode: "full" (whole clip at once) | "segments" (chunk-causal, state-cached).
        recipe: the checkpoint's recipe (`camrender.recipes`): "bidirectional" | "streaming" | "chunk-causal".
        allow_missing_weights: render even when `transformer_weights` leaves transformer weights unloaded.
        segment_frames: latent frames per segment after the first (segment mode; None: the recipe's).
        cached_segments: recent segments besides the first that softmax blocks attend to (segment
            mode; None: the recipe's).
        cuda_graphs: replay the denoising passes as CUDA graphs (`camrender.graphs`; on CUDA, without
            model CPU offload).
        refiner: stage 2 (`camrender.refiner_loading.resolve_refiner`'s result: None, "tiny", a checked
            folder or a hub id); loaded next to the pipeline and attached to it
            (`camrender.stage_two.attach_refiner`).
        refiner_offload: "none" (the refiner's DiT lives on the GPU) | "layers" (its blocks visit the GPU
            one at a time).
        out: output video path.
    """

    traj: Any
    prompt: str = ""
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
    image: Any = None
    steps: Optional[int] = 60
    guidance: Optional[float] = 5.0
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
    mode: str = "full"
    recipe: str = "bidirectional"
    allow_missing_weights: bool = False
    segment_frames: Optional[int] = None
    cached_segments: Optional[int] = None
    cuda_graphs: bool = True
    refiner: Optional[str] = None
    refiner_offload: str = "none"
    out: Optional[Path] = None


MODES = ("full", "segments")
MAX_SEQUENCE_LENGTH = 300  # prompt tokens, as the released pipeline
Progress = Optional[Callable[..., None]]


# ----------------------------------------------------------------------------- entry point
def render_frames(pipe, request: RenderRequest, progress: Progress = None, checkpoints=None) -> Iterator[np.ndarray]:
    """Yield the video of `request` as uint8 (F_chunk, H, W, 3) chunks, in order (see module docstring).

    checkpoints: segment mode's `camrender.resume.Checkpointer` (resume / save), or None."""
    if request.mode == "full":
        yield from render_full(pipe, request, progress)
    elif request.mode == "segments":
        from camrender.render_segments import render_segments

        yield from render_segments(pipe, request, progress, checkpoints=checkpoints)
    else:
        raise CamrenderError(f"must be one of {', '.join(MODES)}, got {request.mode!r}", field="mode")


def render_full(pipe, request: RenderRequest, progress: Progress = None) -> Iterator[np.ndarray]:
    """Full-clip render: denoise all latent frames together, decode, yield every frame at once
    (converted to uint8 where it was decoded: the float video is 4x the bytes of the frames)."""
    from camrender.distributed import is_video_leader
    from camrender.segment_decode import to_uint8_frames
    from camrender.stage_two import refine_clip

    latents = sample_latents(pipe, request, progress)
    if is_video_leader():  # the other ranks of a video group hold the same latents (camrender.cfg_parallel)
        latents = refine_clip(pipe, request, latents, progress=progress)  # stage 2 (--refiner); unchanged without one
        yield to_uint8_frames(_decode(pipe, latents))


# ----------------------------------------------------------------------------- inputs
def open_image(image):
    """The first-frame image as an RGB PIL image; `image` is a path or a PIL image.

    Raises CamrenderError (naming the file, field "image") when it is missing or unreadable.
    """
    import PIL.Image

    if isinstance(image, PIL.Image.Image):
        return image.convert("RGB")
    path = Path(image)
    if not path.exists():
        raise CamrenderError("first-frame image not found", path=path, field="image")
    if path.is_dir():
        raise CamrenderError("first-frame image is a directory", path=path, field="image")
    try:
        with PIL.Image.open(path) as handle:
            handle.load()
            return handle.convert("RGB")
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as error:
        raise CamrenderError(f"cannot read the image ({error})", path=path, field="image") from None


def first_frame_pixels(image, height: int, width: int):
    """Resize (aspect kept, cover) and center-crop to height x width; (1, 3, H, W) float32 in [-1, 1].

    The same resize+crop rule maps the trajectory's intrinsics (`camrender.camera`).
    """
    import torch
    from diffusers.pipelines.sana_wm.cam_utils import resize_and_center_crop

    cropped = resize_and_center_crop(open_image(image), height, width)[0]
    pixels = torch.from_numpy(np.asarray(cropped, dtype=np.float32) / 255.0)
    return (pixels.permute(2, 0, 1)[None] * 2.0 - 1.0).contiguous()


def neutral_first_frame(height: int, width: int):
    """Mid-gray (1, 3, H, W) frame: the stand-in first frame of the tiny offline model."""
    import torch

    return torch.zeros(1, 3, height, width)


def request_first_frame(request: RenderRequest):
    """The request's first frame as (1, 3, H, W) float32 in [-1, 1]: its image, or (tiny model only)
    a mid-gray frame. Raises CamrenderError when a real model has no image."""
    if request.image is not None:
        return first_frame_pixels(request.image, request.height, request.width)
    if request.model == "tiny":
        return neutral_first_frame(request.height, request.width)
    raise CamrenderError("SANA-WM needs a first-frame image: pass --image or set \"image\" in the trajectory",
                         field="image")


def latent_shape(pipe, request: RenderRequest) -> tuple:
    """(T, h, w) latent frames, height and width of the request's video (before patching)."""
    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    return (request.num_frames - 1) // t_stride + 1, request.height // s_stride, request.width // s_stride


def check_request(pipe, request: RenderRequest) -> None:
    """Raise CamrenderError when the request does not fit the model's strides."""
    t_stride, s_stride = pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio
    patch = pipe.transformer.config.patch_size
    frames = request.traj.num_frames
    if frames != request.num_frames:
        raise CamrenderError(f"trajectory has {frames} frames but {request.num_frames} were requested", field="frames")
    if (frames - 1) % t_stride:
        raise CamrenderError(f"the model renders {t_stride}k+1 frames, got {frames}", field="frames")
    for name, size, step in (("height", request.height, s_stride * patch[1]), ("width", request.width, s_stride * patch[2])):
        if size <= 0 or size % step:
            raise CamrenderError(f"must be a positive multiple of {step} for this model, got {size}", field=name)
    if request.steps is not None and request.steps < 1:
        raise CamrenderError(f"must be at least 1, got {request.steps}", field="steps")


# ----------------------------------------------------------------------------- model pieces
def encode_text(pipe, request: RenderRequest, device, guidance: bool):
    """Gemma-2 prompt embeddings as the released pipeline builds them (chi prefix, right padding),
    without the padding columns no row attends to (`drop_text_padding`).

    Returns (embeds (B, 1, L, D), mask (B, L)) with B = 2 ([negative, prompt]) under guidance, else 1.
    """
    import torch
    from diffusers.pipelines.sana_wm.pipeline_sana_wm import DEFAULT_CHI_PROMPT

    cond, cond_mask, neg, neg_mask = pipe.encode_prompt(
        request.prompt or "",
        request.negative_prompt or "",
        device=device,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        chi_prompt=DEFAULT_CHI_PROMPT,
    )
    if not guidance:
        return drop_text_padding(cond, cond_mask)
    return drop_text_padding(torch.cat([neg, cond]), torch.cat([neg_mask, cond_mask]))


def drop_text_padding(embeds, mask):
    """Drop the trailing token columns that every row masks out: embeds (B, 1, L, D) and mask (B, L)
    -> (B, 1, L', D), (B, L'), L' = 1 + the last column any row attends to (at least 1).

    The pipeline pads prompts to 300 tokens; text tokens reach the transformer only as the keys and
    values of its cross-attention (after per-token projections), where masked keys get zero weight,
    so the dropped columns change nothing but the time spent on them.
    """
    used = mask.bool().any(dim=0).nonzero()
    length = int(used.max()) + 1 if used.numel() else 1
    return embeds[:, :, :length].contiguous(), mask[:, :length].contiguous()


def encode_first_frame(vae, pixels, device, dtype):
    """VAE posterior mode of the first frame, normalised: (1, C_lat, 1, h, w) in `dtype`."""
    z = vae.encode(pixels[:, :, None].to(device, dtype=vae.dtype)).latent_dist.mode()
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(z)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(z)
    return ((z - mean) * vae.config.scaling_factor / std).to(dtype)


def denormalize_latents(vae, latents):
    """Undo `encode_first_frame`'s normalisation: DiT-space latents -> the VAE's latent space."""
    mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents)
    std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents)
    return latents / vae.config.scaling_factor * std + mean


def decode_latents(vae, latents):
    """Latents (1, C_lat, T, h, w) -> decoded video (1, 3, F, H, W) in [-1, 1], on the VAE's device."""
    return vae.decode(denormalize_latents(vae, latents.to(dtype=vae.dtype)), return_dict=False)[0]


def camera_tensors(pipe, request: RenderRequest, device, dtype, batch: int) -> dict:
    """Camera conditioning from our trajectory (per-frame poses and intrinsics) for the transformer.

    Returns camera_conditions (B, T, 20) and chunk_plucker (1, 48, T, h, w) in `dtype`: the Plucker
    maps are the same for every batch row (guidance only changes the text), and the transformer
    broadcasts them, so its Plucker projections run once instead of once per row.
    """
    from camrender.camera import build_camera_inputs

    s_stride = pipe.vae_spatial_compression_ratio
    camera = build_camera_inputs(
        request.traj,
        height=request.height,
        width=request.width,
        vae_stride=(pipe.vae_temporal_compression_ratio, s_stride, s_stride),
        patch_size=tuple(pipe.transformer.config.patch_size),
    )
    return {
        "camera_conditions": camera["camera_conditions"][None].to(device, dtype).repeat(batch, 1, 1),
        "chunk_plucker": camera["chunk_plucker"][None].to(device, dtype),
    }


def ray_transforms(transformer, camera_conditions, grid, rope):
    """The transformer's UCPE ray transforms `(P, P_T, P_inv, rope_cam)` (P* (B, N, 4, 4)) and absolute
    ray map (B, T, h, w, 3) for camera_conditions (B, T, 20) on grid (T, h, w) after patching;
    rope: the complex RoPE table of those tokens, or None. Ray matrices are per frame, so a slice
    of a trajectory gives the rows of the whole trajectory's matrices."""
    from diffusers.models.transformers.transformer_sana_wm import (
        _prepare_ucpe_ray_transforms,
        _process_camera_conditions_ucpe,
    )

    raymats, absmap = _process_camera_conditions_ucpe(camera_conditions, camera_conditions.shape[0], grid,
                                                      transformer.patch_size)
    transforms = _prepare_ucpe_ray_transforms(
        head_dim=transformer.linear_head_dim, camera_conditions=camera_conditions, HW=grid,
        patch_size=transformer.patch_size, rotary_emb=rope, raymats=raymats)
    return transforms, absmap


def step_constants(transformer, camera_conditions, grid) -> dict:
    """Transformer inputs that stay fixed over a render's denoising steps, computed once.

    Without them the transformer rebuilds, every step, its RoPE table (copied from the CPU) and the
    camera's ray matrices (a few hundred small kernels, some fed from the CPU), which also keeps a
    step out of a CUDA graph. grid: (T, h, w) latent frames after patching; camera_conditions
    (B, T, 20) or None. Returns the `pos_embeds` and `cam_pos_embeds` keyword arguments (empty
    for layouts they do not cover: packed latents, no camera).
    """
    if camera_conditions is None or getattr(transformer, "pack_latents", False):
        return {}
    pos_embeds = transformer.rope(grid, device=camera_conditions.device) if transformer.use_pe else None
    (P, _, P_inv, rope_cam), absmap = ray_transforms(transformer, camera_conditions, grid, pos_embeds)
    absmap = absmap.permute(0, 4, 1, 2, 3).to(transformer.dtype)  # as the transformer lays it out itself
    return {"pos_embeds": pos_embeds,
            "cam_pos_embeds": {"absmap": absmap, "P": P, "P_inv": P_inv, "pos_embeds_cam": rope_cam}}


def initial_latents(first_latent, num_latent_frames: int, height: int, width: int, seed: int, device, dtype):
    """Gaussian noise (1, C, T, h, w) drawn on the CPU from `seed` (repeatable across devices), frame 0 = image latent."""
    import torch

    generator = torch.Generator("cpu").manual_seed(int(seed))
    shape = (1, first_latent.shape[1], num_latent_frames, height, width)
    latents = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    latents[:, :, :1] = first_latent
    return latents


@dataclasses.dataclass
class RenderInputs:
    """Conditioning and noise of one render, whole trajectory (segment mode slices it per segment).

    text (B, 1, L, D) and text_mask (B, L) with B = 2 ([negative, prompt]) under guidance, else 1;
    camera_conditions (B, T, 20) and chunk_plucker (1, 48, T, h, w) or None; first_latent
    (1, C, 1, h, w) normalised image latent or None; noise (1, C, T, h, w) on the CPU, frame 0 = first_latent
    (float32 in segment mode, the transformer's dtype in full mode).
    """

    text: Any
    text_mask: Any
    camera_conditions: Any
    chunk_plucker: Any
    first_latent: Any
    noise: Any
    guidance: float = 1.0


def prepare_inputs(pipe, request: RenderRequest, device) -> RenderInputs:
    """Text, first-image latent, whole-trajectory camera tensors and noise of `request`, for both modes."""
    import torch

    dtype = pipe.transformer.dtype
    guidance = request.guidance is not None and request.guidance > 1.0
    pixels = request_first_frame(request)
    with torch.no_grad():
        text, text_mask = encode_text(pipe, request, device, guidance)
        first = encode_first_frame(pipe.vae, pixels, device, dtype)
        camera = camera_tensors(pipe, request, device, dtype, 2 if guidance else 1)
    frames, h, w = latent_shape(pipe, request)
    # segment mode draws and keeps its latents in float32, as the official streaming sampler does
    noise_dtype = torch.float32 if request.mode == "segments" else dtype
    noise = initial_latents(first.cpu(), frames, h, w, request.seed, "cpu", noise_dtype)
    return RenderInputs(text=text, text_mask=text_mask, camera_conditions=camera["camera_conditions"],
                        chunk_plucker=camera["chunk_plucker"], first_latent=first, noise=noise,
                        guidance=float(request.guidance or 1.0))


# ----------------------------------------------------------------------------- sampler
def sample_latents(pipe, request: RenderRequest, progress: Progress = None):
    """Flow-match Euler with classifier-free guidance over the whole clip; returns (1, C, T, h, w).

    Latent frame 0 holds the encoded first image and stays clean (its timestep is 0
    throughout); every other frame starts from noise and follows the scheduler's sigmas.
    On a video group of two ranks each runs one guidance row (`camrender.cfg_parallel`); every
    rank returns the same latents.
    """
    import torch

    from camrender.cfg_parallel import guidance_split
    from camrender.patch_block import fixed_plucker

    check_request(pipe, request)
    if request.steps is None:
        raise CamrenderError("full mode needs a number of denoising steps", field="steps")
    transformer, scheduler = pipe.transformer, pipe.scheduler
    device = pipe._execution_device
    dtype = transformer.dtype
    guidance = request.guidance is not None and request.guidance > 1.0

    inputs = prepare_inputs(pipe, request, device)
    split = guidance_split(guidance)  # a video group of two ranks: each runs one guidance row
    rows = split.rows if split is not None else (lambda batch_tensor: batch_tensor)
    text, text_mask = rows(inputs.text), rows(inputs.text_mask)
    camera = {"camera_conditions": rows(inputs.camera_conditions), "chunk_plucker": inputs.chunk_plucker}
    local_batch = text.shape[0]
    latents = inputs.noise.to(device)
    channels, frames, h, w = latents.shape[1:]
    with torch.no_grad():
        scheduler.set_timesteps(request.steps, device=device)
        timesteps = scheduler.timesteps

        frame_is_noisy = torch.ones(1, 1, frames, device=device)
        frame_is_noisy[..., 0] = 0.0  # the conditioning frame is pinned clean
        token_is_noisy = frame_is_noisy[:, 0, :, None].expand(1, frames, h * w).reshape(1, -1)
        image_hw = torch.tensor([[request.height, request.width]], dtype=torch.float, device=device)

        p_t, p_h, p_w = transformer.config.patch_size
        constants = step_constants(transformer, camera.get("camera_conditions"), (frames // p_t, h // p_h, w // p_w))

        def forward(model_latents, frame_timesteps):
            return transformer(model_latents, frame_timesteps, text, mask=text_mask, data_info={"img_hw": image_hw},
                               return_dict=False, **camera, **constants)[0]

        offloaded = getattr(transformer, "_hf_hook", None) is not None  # weights visit the GPU per call
        if request.cuda_graphs and device.type == "cuda" and not offloaded:
            from camrender.graphs import GraphedForward

            forward = GraphedForward(forward)  # text, mask and camera stay fixed: read in place by the graph
        # the Plucker maps' per-block projections, once (not under offload: it is there to save memory)
        with fixed_plucker(transformer, None if offloaded else camera.get("chunk_plucker")):
            for index, t in enumerate(timesteps):
                frame_timesteps = (t.float() * frame_is_noisy).expand(local_batch, 1, frames)
                prediction = forward(latents.repeat(local_batch, 1, 1, 1, 1), frame_timesteps)
                if split is not None:
                    prediction = split.gather(prediction)
                if guidance:
                    uncond, cond = prediction.chunk(2)
                    prediction = uncond + request.guidance * (cond - uncond)
                stepped = scheduler.step(
                    -prediction.reshape(1, channels, -1).transpose(1, 2),
                    t,
                    latents.reshape(1, channels, -1).transpose(1, 2),
                    per_token_timesteps=t.float() * token_is_noisy,
                    return_dict=False,
                )[0]
                stepped = stepped.transpose(1, 2).reshape(latents.shape)
                latents = torch.where(frame_is_noisy[:, :, :, None, None].bool(), stepped, latents).to(dtype)
                if progress is not None:
                    progress(index + 1, len(timesteps), f"step {index + 1}/{len(timesteps)}")
    return latents


def sample_video(pipe, request: RenderRequest, progress: Progress = None):
    """Sample and decode the whole clip: (F, H, W, 3) float32 in [0, 1] on the CPU (as the diffusers
    pipeline returns it; renders take uint8 frames from `render_full`)."""
    from camrender.stage_two import refine_clip

    latents = refine_clip(pipe, request, sample_latents(pipe, request, progress), progress=progress)
    video = _decode(pipe, latents)
    return (video[0].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()


def _decode(pipe, latents):
    """`decode_latents` with the pipeline's VAE, then its offload hooks released: (1, 3, F, H, W) in
    [-1, 1] on the VAE's device. `latents` are stage 2's output when there is a refiner."""
    import torch

    with torch.no_grad():
        video = decode_latents(pipe.vae, latents)
    if hasattr(pipe, "maybe_free_model_hooks"):
        pipe.maybe_free_model_hooks()
    return video
