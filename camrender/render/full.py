"""Full mode: the full-clip sampler (`sample_latents`) and its plan for the render loop (`full_plan`).

The whole clip is one chunk of `camrender.render.loop`: denoised at once, refined as a whole
(`refine_clip`, with `--refiner`), decoded as a whole, every frame yielded at once.
"""
from __future__ import annotations

from typing import Optional

import torch

from camrender.errors import CamrenderError
from camrender.model.block import fixed_plucker
from camrender.model.settings import RefinerSettings, RenderSettings
from camrender.model.state import FULL_MODE
from camrender.parallel.cfg import guidance_split
from camrender.render.decode import decode_latents
from camrender.render.denoise import Denoiser, pin, pinned_frames
from camrender.render.inputs import prepare_inputs
from camrender.render.pipeline import pipeline_settings
from camrender.render.plan import ChunkPlan
from camrender.render.request import Progress, RenderRequest, check_request
from camrender.render.stage_two import refine_clip


class ClipStage:
    """Stage 2 of the whole clip, with the `push` / `finish` of a `RefinerStream`: `push` refines the
    clip at once (`refine_clip`; unchanged without a refiner), `finish` has nothing left."""

    def __init__(self, pipe, request: RenderRequest, settings: RefinerSettings, progress: Progress = None):
        self.pipe, self.request, self.settings, self.progress = pipe, request, settings, progress

    def push(self, latents):
        self.last = refine_clip(self.pipe, self.request, latents, progress=self.progress, settings=self.settings)
        return self.last

    def finish(self):
        return self.last[:, :, :0]


class ClipDecoder:
    """The VAE decode of the whole clip: `decode(latents)` -> (1, 3, F, H, W) in [-1, 1]."""

    def __init__(self, vae):
        self.vae = vae

    def decode(self, latents):
        return decode_latents(self.vae, latents)


def full_plan(pipe, request: RenderRequest, device, settings: RenderSettings, progress: Progress = None):
    """Full mode's `camrender.render.loop.ChunkPlan`: one chunk, sampled when the loop pulls it."""
    def chunks():
        yield sample_latents(pipe, request, progress, settings)

    return ChunkPlan(chunks=chunks(), stage=ClipStage(pipe, request, settings.refiner, progress),
                     decoder=ClipDecoder(pipe.vae), total=1)


# ----------------------------------------------------------------------------- sampler
def sample_latents(pipe, request: RenderRequest, progress: Progress = None, settings: Optional[RenderSettings] = None):
    """Flow-match Euler with classifier-free guidance over the whole clip; returns (1, C, T, h, w).

    Latent frame 0 holds the encoded first image and stays clean (its timestep is 0
    throughout); every other frame starts from noise and follows the scheduler's sigmas.
    On a video group of two ranks each runs one guidance row (`camrender.parallel.cfg`); every
    rank returns the same latents. settings: the render's (None: `pipeline_settings`).
    """
    check_request(pipe, request)
    settings = pipeline_settings(pipe, request) if settings is None else settings
    if request.steps is None:
        raise CamrenderError("full mode needs a number of denoising steps", field="steps")
    transformer, scheduler = pipe.transformer, pipe.scheduler
    device = pipe._execution_device
    dtype = transformer.dtype

    inputs = prepare_inputs(pipe, request, device)
    split = guidance_split(inputs.text.shape[0] == 2)  # a video group of two ranks: each runs one guidance row
    denoiser = Denoiser(transformer, inputs, FULL_MODE, device, split=split, upcast=False,
                        cuda_graphs=settings.cuda_graphs)
    latents = inputs.noise.to(device)
    channels, frames, h, w = latents.shape[1:]
    with torch.no_grad():
        scheduler.set_timesteps(request.steps, device=device)
        timesteps = scheduler.timesteps
        pinned = pinned_frames(inputs, 0, frames, device)  # the conditioning frame is pinned clean
        token_is_noisy = (~pinned)[:, None].expand(frames, h * w).reshape(1, -1).float()
        # the RoPE rows, ray tables, text and Plucker embeddings of the whole clip, once
        conditioning = denoiser.condition(0, frames)
        # the Plucker maps' per-block projections, once (not under offload: it is there to save memory)
        with fixed_plucker(transformer, None if denoiser.offloaded else inputs.chunk_plucker):
            for index, t in enumerate(timesteps):
                prediction = denoiser.predict(latents, pin(pinned, t.float()), conditioning)
                stepped = scheduler.step(
                    -prediction.reshape(1, channels, -1).transpose(1, 2),
                    t,
                    latents.reshape(1, channels, -1).transpose(1, 2),
                    per_token_timesteps=t.float() * token_is_noisy,
                    return_dict=False,
                )[0]
                stepped = stepped.transpose(1, 2).reshape(latents.shape)
                latents = torch.where(pinned[None, None, :, None, None], latents, stepped).to(dtype)
                if progress is not None:
                    progress(index + 1, len(timesteps), f"step {index + 1}/{len(timesteps)}")
    return latents



def sample_video(pipe, request: RenderRequest, progress: Progress = None):
    """Sample and decode the whole clip: (F, H, W, 3) float32 in [0, 1] on the CPU (as the diffusers
    pipeline returns it; renders take uint8 frames from `camrender.render.loop.render_frames`)."""
    settings = pipeline_settings(pipe, request)
    latents = refine_clip(pipe, request, sample_latents(pipe, request, progress, settings), progress=progress,
                          settings=settings.refiner)
    with torch.no_grad():
        video = decode_latents(pipe.vae, latents)
    if hasattr(pipe, "maybe_free_model_hooks"):
        pipe.maybe_free_model_hooks()
    return (video[0].float() / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).cpu()
