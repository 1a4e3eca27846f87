"""The chunk-causal teacher's sampler (NVlabs `ChunkFlowEuler`) on segment mode's cached forward.

The released chunk-causal checkpoint (`SANA-WM_chunk_causal`) is sampled with a staggered schedule:
chunk i (`teacher_chunk_bounds`) starts denoising `int(i * interval_k * steps)` global steps after
chunk 0 and runs the same `steps`-step flow-match schedule (shift 9.8), with classifier-free
guidance 5; every global step the official code runs the model once on all started chunks, the
finished ones at timestep 0, with softmax attention over all earlier chunks. Rules with file and
line: docs/chunk-causal.md.

Here the model never sees a finished chunk again: in a chunk-causal model its features no longer
change, so one timestep-0 pass writes them into the `SegmentCache` (GDN states, conv tails, the
softmax keys of every earlier chunk) when it finishes, and each global step runs only the chunks
in flight, as one multi-segment `segment_forward` call that starts from that cache. Memory grows
with the number of chunks in flight (all of them with the default interval_k = 1 / number of
chunks) and with the softmax keys of all earlier chunks (the teacher attends to every one).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from camrender.model.stage1.segments import SegmentCache
from camrender.render.denoise import Denoiser, pinned_frames

DEFAULT_STEPS = 60
DEFAULT_GUIDANCE = 5.0
DEFAULT_FLOW_SHIFT = 9.8  # the chunk-causal YAML's scheduler.inference_flow_shift


def teacher_chunk_bounds(num_frames: int, chunk_frames: int = 3) -> list:
    """The teacher's chunks (`chunk_size` 3, `chunk_split_strategy: first_chunk_plus_one`): the first
    holds the conditioning frame plus `chunk_frames`, later ones `chunk_frames`, and a trailing
    remainder shorter than that joins the LAST chunk (unlike the streaming layout). Up to
    `chunk_frames + 1` frames make one chunk.

    Returns half-open (start, stop) latent-frame ranges, e.g. 21 -> (0,4),(4,7),...,(13,16),(16,21).
    """
    if num_frames < 1 or chunk_frames < 1:
        raise ValueError(f"need num_frames >= 1 and chunk_frames >= 1, got {num_frames}, {chunk_frames}")
    starts = [0] + list(range(chunk_frames + 1, num_frames, chunk_frames))
    if len(starts) > 1 and num_frames - starts[-1] < chunk_frames:
        starts.pop()
    return list(zip(starts, starts[1:] + [num_frames]))


@dataclasses.dataclass(frozen=True)
class TeacherSchedule:
    """The staggered schedule of one render.

    timesteps: the `steps` scheduler timesteps (float32 values, 1000 * sigma); sigmas (steps + 1,)
    float32, ending in 0; starts: global step at which each chunk starts; total: global steps.
    """

    timesteps: tuple
    sigmas: torch.Tensor
    starts: tuple
    total: int

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def timestep(self, chunk: int, step: int) -> float:
        """Chunk `chunk`'s timestep at global step `step`: -1 before it starts, 0 once finished."""
        local = step - self.starts[chunk]
        if local < 0:
            return -1.0
        return self.timesteps[local] if local < self.steps else 0.0


def teacher_schedule(num_chunks: int, steps: int = DEFAULT_STEPS, flow_shift: float = DEFAULT_FLOW_SHIFT,
                     interval_k: Optional[float] = None) -> TeacherSchedule:
    """ChunkFlowEuler's schedule: diffusers' `FlowMatchEulerDiscreteScheduler(shift=flow_shift)` with
    `steps` steps; chunk i starts at global step int(i * interval_k * steps) (interval_k None: 1 / num_chunks,
    `inference_sana_wm.py`'s default)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    interval_k = 1.0 / num_chunks if interval_k is None else float(interval_k)
    if interval_k <= 0:
        raise ValueError(f"interval_k must be positive, got {interval_k}")
    scheduler = FlowMatchEulerDiscreteScheduler(shift=flow_shift)
    scheduler.set_timesteps(steps, device="cpu")
    starts = tuple(int(i * interval_k * steps) for i in range(num_chunks))
    return TeacherSchedule(timesteps=tuple(float(t) for t in scheduler.timesteps.float()),
                           sigmas=scheduler.sigmas.float().cpu(), starts=starts, total=starts[-1] + steps)


def euler_dt(frame_timesteps: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Per-frame Euler step length (the scheduler's per-token rule): sigma = t / 1000 (float32), next =
    the largest schedule sigma below sigma - 1e-6 (0 if none); dt = sigma - next; t = 0 gives 0.
    frame_timesteps (T,) float32; returns (T,) float32 (x <- x - dt * prediction)."""
    sigma = frame_timesteps.float() / 1000.0
    sigmas = sigmas.to(sigma.device)
    below = sigmas[:, None] < sigma[None] - 1e-6
    return sigma - (below * sigmas[:, None]).max(dim=0).values


def sample_chunk_causal(model, inputs, bounds, schedule: TeacherSchedule, options, device, *,
                        on_step: Optional[Callable] = None) -> Iterator:
    """Yield `(index, start, stop, latents)` for each chunk of `bounds` as it finishes (latents clean,
    (1, C, t, h, w) in the model's dtype), like `render_segments.sample_segments`.

    inputs: `camrender.render.inputs.RenderInputs` (text batch 2 = [negative, prompt] under guidance);
    options: `SegmentOptions` (the teacher's: cached_segments None, softmax_scale "head").
    on_step(step, start, stop, frame_timesteps, prediction): called after each model call with the
    in-flight frames [start, stop), their (T,) model timesteps and the guided prediction (1, C, T, h, w).
    """
    if len(bounds) != len(schedule.starts):
        raise ValueError(f"{len(bounds)} chunks but a schedule for {len(schedule.starts)}")
    dtype = model.dtype
    denoiser = Denoiser(model, inputs, options, device)
    latents = inputs.noise.to(device=device, dtype=dtype).clone()
    pinned = pinned_frames(inputs, 0, latents.shape[2], "cpu")
    if pinned.any():
        latents[:, :, :1] = inputs.first_latent.to(device=device, dtype=dtype)
    cache = SegmentCache.empty(model)
    conditioning = {}

    def condition(start, stop):
        if (start, stop) not in conditioning:
            conditioning.clear()  # the in-flight window only moves forward
            conditioning[(start, stop)] = denoiser.condition(start, stop)  # pulls a camera stream as chunks start
        return conditioning[(start, stop)]

    def predict(start, stop, frame_timesteps, segments, write=False):
        return denoiser.predict(latents[:, :, start:stop], frame_timesteps, condition(start, stop), cache=cache,
                                segments=segments, write=write)

    cached = 0  # chunks [0, cached) are in the cache
    for step in range(schedule.total):
        while cached < len(bounds) and step >= schedule.starts[cached] + schedule.steps:
            start, stop = bounds[cached]  # finished at the previous step: cache it, hand it out
            predict(start, stop, torch.zeros(stop - start), None, write=True)
            yield cached, start, stop, latents[:, :, start:stop]
            cached += 1
        flying = [i for i in range(cached, len(bounds)) if schedule.timestep(i, step) >= 0]
        if not flying:
            continue
        start, stop = bounds[flying[0]][0], bounds[flying[-1]][1]
        frame_t = torch.cat([torch.full((bounds[i][1] - bounds[i][0],), schedule.timestep(i, step),
                                        dtype=torch.float32) for i in flying])
        frame_t = torch.where(pinned[start:stop], 0.0, frame_t)
        segments = [(bounds[i][0] - start, bounds[i][1] - start) for i in flying]
        prediction = predict(start, stop, frame_t, segments)
        dt = euler_dt(frame_t, schedule.sigmas).to(device).view(1, 1, -1, 1, 1)
        latents[:, :, start:stop] = (latents[:, :, start:stop].float() - dt * prediction).to(dtype)
        if on_step is not None:
            on_step(step, start, stop, frame_t, prediction)
    for index in range(cached, len(bounds)):
        start, stop = bounds[index]
        yield index, start, stop, latents[:, :, start:stop]
