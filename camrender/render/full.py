"""The full-clip sampler, and `render_frames`, the one entry the CLI calls.

`render_frames(pipe, request, progress)` yields uint8 video frames (F_chunk, H, W, 3) in order, to be
appended to a `camrender.render.video.VideoWriter`. It dispatches on `request.mode`:

- "full": `render_full` below denoises the whole clip at once and yields all frames.
- "segments": `camrender.render.segments.render_segments(pipe, request, progress)`, which has the
  same contract (a generator of uint8 frame chunks, one per finished segment).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from camrender.errors import CamrenderError
from camrender.model.conditioning import step_constants
from camrender.model.recipes import get_recipe
from camrender.render.decode import decode_latents
from camrender.render.inputs import prepare_inputs
from camrender.render.request import MODES, Progress, RenderRequest, check_request


def render_frames(pipe, request: RenderRequest, progress: Progress = None, checkpoints=None) -> Iterator[np.ndarray]:
    """Yield the video of `request` as uint8 (F_chunk, H, W, 3) chunks, in order (see module docstring).

    checkpoints: segment mode's `camrender.render.resume.Checkpointer` (resume / save), or None."""
    if request.mode == "full":
        yield from render_full(pipe, request, progress)
    elif request.mode == "segments":
        from camrender.render.segments import render_segments

        yield from render_segments(pipe, request, progress, checkpoints=checkpoints)
    else:
        raise CamrenderError(f"must be one of {', '.join(MODES)}, got {request.mode!r}", field="mode")


def render_full(pipe, request: RenderRequest, progress: Progress = None) -> Iterator[np.ndarray]:
    """Full-clip render: denoise all latent frames together, decode, yield every frame at once
    (converted to uint8 where it was decoded: the float video is 4x the bytes of the frames)."""
    from camrender.parallel.distributed import is_video_leader
    from camrender.render.decode import to_uint8_frames
    from camrender.render.stage_two import refine_clip

    latents = sample_latents(pipe, request, progress)
    if is_video_leader():  # the other ranks of a video group hold the same latents (camrender.parallel.cfg)
        latents = refine_clip(pipe, request, latents, progress=progress)  # stage 2 (--refiner); unchanged without one
        yield to_uint8_frames(_decode(pipe, latents))



# ----------------------------------------------------------------------------- sampler
def sample_latents(pipe, request: RenderRequest, progress: Progress = None):
    """Flow-match Euler with classifier-free guidance over the whole clip; returns (1, C, T, h, w).

    Latent frame 0 holds the encoded first image and stays clean (its timestep is 0
    throughout); every other frame starts from noise and follows the scheduler's sigmas.
    The request's recipe sets the model's rules (`set_full_options`) and the scheduler
    (`full_scheduler`); docs/recipes.md compares the sampler with NVlabs' `LTXFlowEuler`.
    On a video group of two ranks each runs one guidance row (`camrender.parallel.cfg`); every
    rank returns the same latents.
    """
    import torch

    from camrender.parallel.cfg import guidance_split

    check_request(pipe, request)
    if request.steps is None:
        raise CamrenderError("full mode needs a number of denoising steps", field="steps")
    recipe = get_recipe(request.recipe)
    transformer, scheduler = pipe.transformer, full_scheduler(pipe, recipe)
    _set_recipe_rules(transformer, recipe)
    device = pipe._execution_device
    guidance = request.guidance is not None and request.guidance > 1.0

    inputs = prepare_inputs(pipe, request, device)
    split = guidance_split(guidance)  # a video group of two ranks: each runs one guidance row
    rows = split.rows if split is not None else (lambda batch_tensor: batch_tensor)
    camera = {"camera_conditions": rows(inputs.camera_conditions), "chunk_plucker": inputs.chunk_plucker}
    image_hw = torch.tensor([[request.height, request.width]], dtype=torch.float, device=device)
    return denoise_clip(transformer, scheduler, inputs.noise.to(device), rows(inputs.text), rows(inputs.text_mask),
                        camera, request.steps, request.guidance if guidance else None, image_hw, split=split,
                        cuda_graphs=request.cuda_graphs, progress=progress)


def denoise_clip(transformer, scheduler, latents, text, text_mask, camera: dict, steps: int, guidance, image_hw, *,
                 split=None, cuda_graphs: bool = False, progress: Progress = None):
    """The Euler loop of full mode (NVlabs' `LTXFlowEuler` rules, docs/recipes.md); returns (1, C, T, h, w).

    Args:
        transformer: the (patched) transformer, its full-mode rules already set.
        scheduler: a flow-match Euler scheduler (`full_scheduler`); `steps` timesteps are set on it.
        latents: (1, C, T, h, w) initial latents, frame 0 the clean image latent (pinned: timestep 0, dt 0).
        text, text_mask: (B, 1, L, Cc), (B, L); with `guidance` B = 2, rows [uncond, cond] (or this
            rank's row under `split`).
        camera: `camera_conditions` (B, T, 20) and `chunk_plucker` (1, 48, T, h, w).
        guidance: CFG scale (pred = uncond + g * (cond - uncond)) or None.
        image_hw: (1, 2) pixel height and width (`data_info["img_hw"]`).
    """
    import torch

    from camrender.model.block import fixed_plucker

    device, dtype = latents.device, transformer.dtype
    local_batch = text.shape[0]
    channels, frames, h, w = latents.shape[1:]
    with torch.no_grad():
        scheduler.set_timesteps(steps, device=device)
        timesteps = scheduler.timesteps

        frame_is_noisy = torch.ones(1, 1, frames, device=device)
        frame_is_noisy[..., 0] = 0.0  # the conditioning frame is pinned clean
        token_is_noisy = frame_is_noisy[:, 0, :, None].expand(1, frames, h * w).reshape(1, -1)

        p_t, p_h, p_w = transformer.config.patch_size
        constants = step_constants(transformer, camera.get("camera_conditions"), (frames // p_t, h // p_h, w // p_w))

        def forward(model_latents, frame_timesteps):
            return transformer(model_latents, frame_timesteps, text, mask=text_mask, data_info={"img_hw": image_hw},
                               return_dict=False, **camera, **constants)[0]

        offloaded = getattr(transformer, "_hf_hook", None) is not None  # weights visit the GPU per call
        if cuda_graphs and device.type == "cuda" and not offloaded:
            from camrender.model.graphs import GraphedForward

            forward = GraphedForward(forward)  # text, mask and camera stay fixed: read in place by the graph
        # the Plucker maps' per-block projections, once (not under offload: it is there to save memory)
        with fixed_plucker(transformer, None if offloaded else camera.get("chunk_plucker")):
            for index, t in enumerate(timesteps):
                frame_timesteps = (t.float() * frame_is_noisy).expand(local_batch, 1, frames)
                prediction = forward(latents.repeat(local_batch, 1, 1, 1, 1), frame_timesteps)
                if split is not None:
                    prediction = split.gather(prediction)
                if guidance is not None:
                    uncond, cond = prediction.chunk(2)
                    prediction = uncond + guidance * (cond - uncond)
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
                    progress(index + 1, len(timesteps), "", stage="stage 1", unit="step")
    return latents



def full_scheduler(pipe, recipe):
    """The scheduler of a full-mode render: NVlabs' (`FlowMatchEulerDiscreteScheduler(shift=recipe.flow_shift)`,
    whatever the checkpoint's scheduler config says), or the pipeline's own (flow_shift None, as diffusers)."""
    if recipe.flow_shift is None:
        return pipe.scheduler
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=recipe.flow_shift)


def _set_recipe_rules(transformer, recipe) -> None:
    """Full mode's model rules of `recipe` on the (patched) transformer; an unpatched one computes
    diffusers' rules only, so any other recipe is refused on it."""
    from camrender.model.patch import set_full_options
    from camrender.model.state import SegmentOptions

    options = SegmentOptions.full_mode(recipe)
    try:
        set_full_options(transformer, options)
    except ValueError:
        if not (options.gdn_camera_downscale and options.softmax_as_diffusers):
            raise CamrenderError(f"the {recipe.name} recipe needs the patched transformer "
                                 f"(camrender.patch_transformer); diffusers' own blocks compute "
                                 f"bidirectional-diffusers only", field="recipe") from None


def sample_video(pipe, request: RenderRequest, progress: Progress = None):
    """Sample and decode the whole clip: (F, H, W, 3) float32 in [0, 1] on the CPU (as the diffusers
    pipeline returns it; renders take uint8 frames from `render_full`)."""
    from camrender.render.stage_two import refine_clip

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

