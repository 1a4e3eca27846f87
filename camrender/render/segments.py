"""Segment mode: render a camera path segment by segment with cached block state, streaming the video out.

The request's recipe (`camrender.model.stage1.recipes`) picks the chunk layout, softmax window and scale and the
sampler (`SEGMENT_SAMPLERS`). The self-forcing sampler (streaming recipe), for every segment of
latent frames (`camrender.model.stage1.recipes.segment_bounds`: 0, 4, 7, 10, ...; the first absorbs the remainder):

1. denoise it with the flow-match Euler sampler over a short timestep list (default 1000, 960,
   889, 727, as the streaming checkpoint was trained; `--steps N` takes the scheduler's N-step
   list instead), reading the caches of the finished segments; latent frame 0 of the clip is the
   encoded first image, pinned clean (timestep 0); classifier-free guidance is optional;
2. run the model once more at timestep 0 on the clean segment: that pass alone writes the caches;
3. decode the segment with the streaming causal VAE decoder (frames equal a whole-clip causal
   decode) and yield its frames at once (the CLI appends them to the fragmented mp4).

GPU memory stays flat in the path length: caches hold a fixed number of frames and states.
`segment_plan` hands the samplers' segments to the render loop (`camrender.render.loop.render_frames`),
which refines, decodes and yields each one as it finishes.
"""
from __future__ import annotations

import functools
from typing import Iterator, Optional

import torch

from camrender.errors import CamrenderError
from camrender.model.device import to_device
from camrender.model.settings import RenderSettings
from camrender.model.stage1.recipes import STREAMING_TIMESTEPS as DEFAULT_SEGMENT_TIMESTEPS
from camrender.model.stage1.recipes import segment_bounds
from camrender.model.stage1.segments import SegmentCache
from camrender.model.stage1.state import SegmentOptions
from camrender.render.chunk_causal import sample_chunk_causal, teacher_chunk_bounds, teacher_schedule
from camrender.render.decode import CausalStreamDecoder, decode_max_frames
from camrender.render.denoise import Denoiser, pin, pinned_frames
from camrender.render.inputs import RenderInputs, prepare_inputs
from camrender.render.plan import ChunkPlan
from camrender.render.request import latent_shape
from camrender.render.stage_two import has_refiner, stage_two


def segment_timesteps(scheduler, steps: Optional[int], recipe=None) -> list:
    """Timesteps (in [0, 1000], sigma = t / 1000) each segment is denoised through.

    None -> the recipe's timestep list (`DEFAULT_SEGMENT_TIMESTEPS`, the streaming one, when it
    has none); an int -> the scheduler's own `steps`-step list.
    """
    if steps is None:
        return list(getattr(recipe, "timesteps", None) or DEFAULT_SEGMENT_TIMESTEPS)
    if steps < 1:
        raise CamrenderError(f"must be at least 1, got {steps}", field="steps")
    scheduler.set_timesteps(int(steps), device="cpu")
    return [float(t) for t in scheduler.timesteps]


class HeldCacheWrite:
    """Stage 1's cache pass of the segment sampled last, held until `flush()`.

    The cache pass (timestep 0 on the clean segment) only writes the caches the next segment reads, so its
    frames need not wait for it: the render loop flushes it once the segment's refinement and decode are
    queued (`camrender.render.stage_two.refined_frames`). The sampler flushes it itself before the next
    segment and at the end, so the caches are the same whoever flushes."""

    def __init__(self):
        self._write = None

    def hold(self, write) -> None:
        if self._write is not None:  # flushed now it would write the caches after the next segment read them
            raise RuntimeError("the previous segment's cache pass was not flushed before this segment was sampled")
        self._write = write

    def flush(self) -> None:
        write, self._write = self._write, None
        if write is not None:
            write()


def sample_segment(denoiser: Denoiser, start: int, stop: int, cache, timesteps,
                   held: Optional[HeldCacheWrite] = None):
    """Denoise latent frames [start, stop) and write their caches; returns the clean (1, C, t, h, w) float32.

    Euler on the flow prediction v (x_next = x + (sigma_next - sigma) v, sigma = t / 1000, the last
    step lands on 0); frame 0 of the clip stays pinned to the image latent at timestep 0. The
    denoising passes replay as CUDA graphs when the denoiser has them, and so does the cache-writing pass once
    it writes the cache in place (`Denoiser._cache_pass`). held: the cache pass is left in it, not run.
    """
    inputs, device = denoiser.inputs, denoiser.device
    # The latents stay float32 between steps, as in the official sampler (the model casts its input).
    latents = to_device(inputs.noise[:, :, start:stop], device, torch.float32).clone()
    pinned = pinned_frames(inputs, start, stop, device)
    if start == 0 and inputs.first_latent is not None:  # pinned[0], known without waiting for the GPU
        latents[:, :, :1] = inputs.first_latent.to(device=device, dtype=torch.float32)
    conditioning = denoiser.condition(start, stop)  # pulls the segment's cameras from a stream
    sigmas = [t / 1000.0 for t in timesteps] + [0.0]
    for index, t in enumerate(timesteps):
        velocity = denoiser.predict(latents, pin(pinned, t), conditioning, cache=cache)
        stepped = latents + (sigmas[index + 1] - sigmas[index]) * velocity
        latents = torch.where(pinned[None, None, :, None, None], latents, stepped)
    clean = torch.zeros(stop - start, device=device)
    write = functools.partial(denoiser.predict, latents, clean, conditioning, cache=cache, write=True)
    if held is None:
        write()
    else:
        held.hold(write)
    return latents


def sample_segments(model, inputs: RenderInputs, bounds, timesteps, options, device, *,
                    cuda_graphs: bool = False, cache=None, first_segment: int = 0,
                    held: Optional[HeldCacheWrite] = None) -> Iterator:
    """The self-forcing sampler: yield `(index, start, stop, latents)` for each segment in order,
    carrying one `SegmentCache`.

    cache, first_segment: continue from a restored cache at segment `first_segment` (resume);
    default an empty cache at segment 0.

    cuda_graphs: replay the denoising passes, and the cache passes that write the cache in place, as CUDA
    graphs (`camrender.model.graphs`); off under model CPU offload (the weights move between segments).
    Off CUDA the same replay path runs on static copies without graphs (for tests).
    held: each segment's cache pass waits in it until flushed (by the caller, or here before the next
    segment and at the end); None: it runs before the segment is yielded.
    """
    cache = SegmentCache.empty(model) if cache is None else cache
    denoiser = Denoiser(model, inputs, options, device, cuda_graphs=cuda_graphs)
    for index, (start, stop) in enumerate(bounds):
        if index < first_segment:
            continue
        if held is not None:
            held.flush()
        yield index, start, stop, sample_segment(denoiser, start, stop, cache, timesteps, held)
    if held is not None:
        held.flush()


def sample_chunk_flow(model, inputs: RenderInputs, bounds, timesteps, options, device, *,
                      cuda_graphs: bool = False) -> Iterator:
    """The chunk-causal teacher's ChunkFlowEuler sampler (`camrender.render.chunk_causal`); same contract as
    `sample_segments`, with `timesteps` its `TeacherSchedule` (`chunk_causal.teacher_schedule`). No
    CUDA-graph replay: the in-flight window changes shape from step to step."""
    yield from sample_chunk_causal(model, inputs, bounds, timesteps, options, device)


# Segment-mode sampler of each recipe's `sampler` word: (model, inputs, bounds, timesteps, options,
# device, cuda_graphs=...) -> iterator of (index, start, stop, clean latents (1, C, t, h, w)).
SEGMENT_SAMPLERS = {
    "self-forcing": sample_segments,
    "euler": sample_segments,  # the bidirectional checkpoint forced into segment mode
    "chunk-flow-euler": sample_chunk_flow,
}


def segment_options(recipe, cached_segments: Optional[int], *, refined: bool = False,
                    teacher: bool = False) -> SegmentOptions:
    """The `SegmentOptions` a segment-mode render runs `recipe` with (cached_segments: the window, None for all).
    The softmax blocks' slot for a call's keys and the Plucker maps projected once per segment cost memory
    (0.24 GiB each at the release size): not beside the refiner, where memory is short, nor for the teacher (its
    calls hold several chunks, which never read through the slot, and its in-flight window changes every step)."""
    roomy = not (refined or teacher)
    return SegmentOptions.for_recipe(recipe, cached_segments=cached_segments, key_slot=roomy, plucker_once=roomy)


def segment_plan(pipe, request, device, settings: RenderSettings, checkpoints=None) -> ChunkPlan:
    """Segment mode's `camrender.render.loop.ChunkPlan`: one chunk per segment from the recipe's sampler
    (sampled as the loop pulls it), refined block by block (`stage_two`) and decoded by the streaming
    causal decoder.

    settings: the render's `RenderSettings` (CUDA graphs, the refiner's path);
    checkpoints: a `camrender.render.resume.Checkpointer` (or None): the render starts from its
    checkpoint, if it has one, and saves one at segment boundaries, after the consumer has
    taken the previous segment's frames (so they are written before the checkpoint refers to them).
    """
    recipe = request.recipe
    segment_frames = recipe.chunk_frames if request.segment_frames is None else request.segment_frames
    cached_segments = recipe.recent_chunks if request.cached_segments is None else request.cached_segments
    if segment_frames < 1:
        raise CamrenderError(f"must be at least 1, got {segment_frames}", field="segment-frames")
    if cached_segments is not None and cached_segments < 0:
        raise CamrenderError(f"must be 0 or more, got {cached_segments}", field="cached-segments")
    model = pipe.transformer
    latent_frames = latent_shape(pipe, request)[0]
    if model.use_pe and latent_frames > model.rope.max_seq_len:
        longest = (model.rope.max_seq_len - 1) * pipe.vae_temporal_compression_ratio + 1
        raise CamrenderError(f"segment mode renders at most {longest} frames with this model, got {request.num_frames}",
                             field="frames")
    refined = has_refiner(pipe)
    teacher = recipe.sampler == "chunk-flow-euler"
    options = segment_options(recipe, cached_segments, refined=refined, teacher=teacher)
    inputs = prepare_inputs(pipe, request, device)
    if teacher:  # the teacher's own layout and staggered schedule
        bounds = teacher_chunk_bounds(inputs.noise.shape[2], segment_frames)
        timesteps = teacher_schedule(len(bounds), steps=request.steps or recipe.steps)
        checkpoints = None  # several chunks are in flight at every boundary: nothing to resume from
    else:
        bounds = segment_bounds(inputs.noise.shape[2], segment_frames)
        timesteps = segment_timesteps(pipe.scheduler, request.steps, recipe)
    stage = stage_two(pipe, request, device, settings.refiner)
    decoder = CausalStreamDecoder(pipe.vae, device=device, max_frames=decode_max_frames(refined=refined))
    cache, first, written = SegmentCache.empty(model), 0, 0
    if checkpoints is not None:
        cache, first = checkpoints.restore(cache, decoder, device, bounds)
        written = checkpoints.frames_before
    # the self-forcing sampler continues from a restored cache, and leaves each cache pass to the loop; the
    # teacher's chunks in flight are not checkpointed
    held = None if teacher else HeldCacheWrite()
    resumable = {} if teacher else {"cache": cache, "first_segment": first, "held": held}
    sampled = SEGMENT_SAMPLERS[recipe.sampler](
        model, inputs, bounds, timesteps, options, device, cuda_graphs=settings.cuda_graphs,
        **resumable)
    return ChunkPlan(chunks=(latents for *_, latents in sampled), stage=stage,
                     decoder=decoder, total=len(bounds), first=first, frames_before=written, per_chunk_progress=True,
                     checkpoints=checkpoints, cache=cache, bounds=bounds,
                     settle=held.flush if held is not None else None)
