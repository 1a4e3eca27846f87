"""The one render loop: a sampler's finished latent chunks -> stage 2 -> decode -> uint8 frames.

`render_frames(pipe, request, progress)` yields the video of a request as uint8 (F_chunk, H, W, 3)
chunks in order, to be appended to a writer (`camrender.output`). What differs between the modes is
only the `ChunkPlan` a strategy builds:

- full mode (`camrender.render.full.full_plan`): one chunk, the whole clip from the full-clip sampler,
  refined as a whole (`refine_clip`) and decoded as a whole;
- segment mode (`camrender.render.segments.segment_plan`): one chunk per segment from the self-forcing
  or chunk-flow sampler, refined block by block as they arrive (`RefinerStream`) and decoded by the
  streaming causal decoder, with checkpoints at segment boundaries.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from camrender.errors import CamrenderError
from camrender.model.settings import RenderSettings
from camrender.render.full import full_plan
from camrender.render.pipeline import loaded_with, pipeline_settings
from camrender.render.plan import ChunkPlan
from camrender.render.request import MODES, Progress, RenderRequest, check_request
from camrender.render.segments import segment_plan
from camrender.render.stage_two import refined_frames


def render_frames(pipe, request: RenderRequest, progress: Progress = None, checkpoints=None,
                  settings: Optional[RenderSettings] = None, low_latency: bool = False) -> Iterator[np.ndarray]:
    """Yield the video of `request` as uint8 (F_chunk, H, W, 3) chunks, in order.

    progress: `progress(done, total, info, stage=..., unit=...)` (`camrender.render.request.Progress`: denoising
    steps in full mode, segments in segment mode, refiner blocks of a whole clip);
    checkpoints: segment mode's `camrender.render.resume.Checkpointer` (resume / save), or None;
    settings: the render's `RenderSettings` (None: the pipeline's, `camrender.render.pipeline.pipeline_settings`);
    low_latency: yield each segment's frames as soon as they are decoded, before the next segment's stage 1
        is queued (`camrender play`: a segment sooner on the screen; the stages no longer overlap on the GPU).
    """
    if request.mode not in MODES:
        raise CamrenderError(f"must be one of {', '.join(MODES)}, got {request.mode!r}", field="mode")
    check_request(pipe, request, loaded_with(pipe))
    settings = pipeline_settings(pipe, request) if settings is None else settings
    device = pipe._execution_device
    with torch.no_grad():
        if request.mode == "full":
            plan = full_plan(pipe, request, device, settings, progress)
        else:
            plan = segment_plan(pipe, request, device, settings, checkpoints)
        yield from run_plan(plan, request, device, progress if plan.per_chunk_progress else None,
                            overlap=False if low_latency else None, leader=settings.is_leader)
    if hasattr(pipe, "maybe_free_model_hooks"):
        pipe.maybe_free_model_hooks()


def run_plan(plan: ChunkPlan, request: RenderRequest, device, progress: Optional[Callable] = None,
             overlap: Optional[bool] = None, leader: bool = True) -> Iterator:
    """The loop itself: pull chunks, refine, decode, yield frames; report and checkpoint per chunk.
    The other ranks of a video group (`leader` False) run the sampler along (their collectives) and yield
    nothing. overlap: `refined_frames`' (None: its default)."""
    if not leader:
        for _ in plan.chunks:
            pass
        return
    started, written = time.perf_counter(), plan.frames_before
    gate = _CheckpointGate(plan.checkpoints)
    for count, frames in refined_frames(plan.stage, plan.chunks, plan.decoder, device, overlap=overlap,
                                        hold=gate.hold, settle_chunk=plan.settle):
        done = count + plan.first
        written += len(frames)
        if progress is not None:
            elapsed = max(time.perf_counter() - started, 1e-9)
            # seconds of video as the trajectory counts them ((frames - 1) / fps, what `traj check` says)
            stages = "stage 1" if request.settings.refiner is None else "stages 1+2 (refiner)"
            progress(done, plan.total, f"{written} frame{'' if written == 1 else 's'}, "
                                       f"{max(written - 1, 0) / request.fps:.3f} s of video, "
                                       f"{(written - plan.frames_before) / elapsed:.1f} frames/s",
                     stage=stages, unit="segment")
        if len(frames):
            yield frames
        if gate.held == count:
            gate.held = None
            plan.checkpoints.maybe_save(done, plan.bounds, written, plan.cache, plan.decoder, force=True)


class _CheckpointGate:
    """Decides, while chunk k's frames wait and before chunk k+1's stage 1 runs, whether a checkpoint
    follows chunk k (`Checkpointer.due`); `refined_frames` then yields chunk k first, so the saved
    cache and decoder are those after chunk k. `held`: the chunk count a checkpoint follows, or None."""

    def __init__(self, checkpoints):
        self.checkpoints, self.held = checkpoints, None

    def hold(self, count: int) -> bool:
        if self.checkpoints is None or not self.checkpoints.due():
            return False
        self.held = count
        return True
