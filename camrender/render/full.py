"""Full mode: the full-clip sampler (`sample_latents`) and its plan for the render loop (`full_plan`).

The whole clip is one chunk of `camrender.render.loop`: denoised at once, refined as a whole
(`refine_clip`, with `--refiner`), decoded as a whole, every frame yielded at once.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from camrender.errors import CamrenderError
from camrender.model.settings import RefinerSettings, RenderSettings
from camrender.model.stage1.patch import set_full_options
from camrender.model.stage1.state import FULL_MODE, SegmentOptions
from camrender.parallel.cfg import guidance_split
from camrender.render.decode import decode_latents
from camrender.render.denoise import Denoiser, pin, pinned_frames
from camrender.render.inputs import RenderInputs, prepare_inputs
from camrender.render.pipeline import pipeline_settings
from camrender.render.plan import ChunkPlan
from camrender.render.request import Progress, RenderRequest, check_request
from camrender.render.stage_two import refine_clip


class ClipStage:
    """Stage 2 of the whole clip, with the `push` / `settle` / `finish` of a `RefinerStream`: `push` refines
    the clip at once (`refine_clip`; unchanged without a refiner), `settle` and `finish` have nothing left."""

    def __init__(self, pipe, request: RenderRequest, settings: RefinerSettings, progress: Progress = None):
        self.pipe, self.request, self.settings, self.progress = pipe, request, settings, progress

    def push(self, latents):
        self.last = refine_clip(self.pipe, self.request, latents, progress=self.progress, settings=self.settings)
        return self.last

    def settle(self):
        pass

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
    The request's recipe sets the model's rules (`set_full_options`) and the scheduler
    (`full_scheduler`); docs/recipes.md compares the sampler with NVlabs' `LTXFlowEuler`.
    On a video group of two ranks each runs one guidance row (`camrender.parallel.cfg`); every
    rank returns the same latents. settings: the render's (None: `pipeline_settings`).
    """
    check_request(pipe, request)
    settings = pipeline_settings(pipe, request) if settings is None else settings
    if request.steps is None:
        raise CamrenderError("full mode needs a number of denoising steps", field="steps")
    recipe = request.recipe
    transformer = pipe.transformer
    set_full_options(transformer, SegmentOptions.full_mode(recipe))  # the recipe's rules, on the patched blocks
    device = pipe._execution_device
    inputs = prepare_inputs(pipe, request, device)
    camera = {"camera_conditions": inputs.camera_conditions, "chunk_plucker": inputs.chunk_plucker}
    guidance = request.guidance if inputs.text.shape[0] == 2 else None
    return denoise_clip(transformer, full_scheduler(pipe, recipe), inputs.noise.to(device), inputs.text,
                        inputs.text_mask, camera, request.steps, guidance, split=guidance_split(settings.ranks, guidance is not None),
                        cuda_graphs=settings.cuda_graphs, progress=progress)


def denoise_clip(transformer, scheduler, latents, text, text_mask, camera: dict, steps: int, guidance,
                 image_hw=None, *, split=None, cuda_graphs: bool = False, progress: Progress = None,
                 options: Optional[SegmentOptions] = None):
    """The Euler loop of full mode (NVlabs' `LTXFlowEuler` rules, docs/recipes.md); returns (1, C, T, h, w).

    Each step is the library's `Denoiser.predict` (camrender's forward over the whole clip, the
    conditioning built once, CUDA-graph replay, the guidance rows and mix); the scheduler steps the
    noisy frames per token.

    Args:
        transformer: the patched transformer.
        scheduler: a flow-match Euler scheduler (`full_scheduler`); `steps` timesteps are set on it.
        latents: (1, C, T, h, w) initial latents, frame 0 the clean image latent (pinned: timestep 0, dt 0).
        text, text_mask: (B, 1, L, Cc), (B, L); with `guidance` B = 2, rows [uncond, cond] (`split`, a
            `camrender.parallel.cfg.CfgSplit`, runs one of them on this rank and gathers).
        camera: `camera_conditions` (B, T, 20) and `chunk_plucker` (1, 48, T, h, w), or None values.
        guidance: CFG scale (pred = uncond + g * (cond - uncond)) or None.
        image_hw: unused (SANA-WM's forward does not read `data_info["img_hw"]`); kept for callers.
        options: the rules the forward computes with; default the ones the attentions hold
            (`camrender.model.stage1.patch.set_full_options`).
    """
    device, dtype = latents.device, transformer.dtype
    if options is None:
        options = getattr(transformer.blocks[0].attn, "full_options", FULL_MODE)
    options = dataclasses.replace(options, plucker_once=True)  # the clip's Plucker projections, once per block
    inputs = RenderInputs(text=text, text_mask=text_mask, camera_conditions=camera.get("camera_conditions"),
                          chunk_plucker=camera.get("chunk_plucker"), first_latent=latents[:, :, :1], noise=latents,
                          guidance=float(guidance or 1.0))
    denoiser = Denoiser(transformer, inputs, options, device, split=split, upcast=False, cuda_graphs=cuda_graphs)
    channels, frames, h, w = latents.shape[1:]
    with torch.no_grad():
        scheduler.set_timesteps(steps, device=device)
        timesteps = scheduler.timesteps
        pinned = pinned_frames(inputs, 0, frames, device)  # the conditioning frame is pinned clean
        token_is_noisy = (~pinned)[:, None].expand(frames, h * w).reshape(1, -1).float()
        # the RoPE rows, ray tables, text and Plucker embeddings of the whole clip, and (`plucker_once`) the
        # Plucker maps' projection for every block, once
        conditioning = denoiser.condition(0, frames)
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
                progress(index + 1, len(timesteps), "", stage="stage 1", unit="step")
    return latents


def full_scheduler(pipe, recipe):
    """The scheduler of a full-mode render: NVlabs' (`FlowMatchEulerDiscreteScheduler(shift=recipe.flow_shift)`,
    whatever the checkpoint's scheduler config says), or the pipeline's own (flow_shift None, as diffusers)."""
    if recipe.flow_shift is None:
        return pipe.scheduler
    return FlowMatchEulerDiscreteScheduler(shift=recipe.flow_shift)


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
