"""Segment mode: render a camera path segment by segment with cached block state, streaming the video out.

The request's recipe (`camrender.model.recipes`) picks the chunk layout, softmax window and scale and the
sampler (`SEGMENT_SAMPLERS`). The self-forcing sampler (streaming recipe), for every segment of
latent frames (`camrender.model.recipes.segment_bounds`: 0, 4, 7, 10, ...; the first absorbs the remainder):

1. denoise it with the flow-match Euler sampler over a short timestep list (default 1000, 960,
   889, 727, as the streaming checkpoint was trained; `--steps N` takes the scheduler's N-step
   list instead), reading the caches of the finished segments; latent frame 0 of the clip is the
   encoded first image, pinned clean (timestep 0); classifier-free guidance is optional;
2. run the model once more at timestep 0 on the clean segment: that pass alone writes the caches;
3. decode the segment with the streaming causal VAE decoder (frames equal a whole-clip causal
   decode) and yield its frames at once (the CLI appends them to the fragmented mp4).

GPU memory stays flat in the path length: caches hold a fixed number of frames and states.
`render_segments(pipe, request, progress)` has `camrender.render.full.render_frames`' contract.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

import numpy as np

from camrender.errors import CamrenderError
from camrender.model.recipes import STREAMING_TIMESTEPS as DEFAULT_SEGMENT_TIMESTEPS
from camrender.model.recipes import get_recipe
from camrender.render.inputs import RenderInputs, prepare_inputs


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


def sample_segment(model, inputs: RenderInputs, start: int, stop: int, cache, timesteps, options, device,
                   graphs=None):
    """Denoise latent frames [start, stop) and write their caches; returns the clean (1, C, t, h, w) float32.

    Euler on the flow prediction v (x_next = x + (sigma_next - sigma) v, sigma = t / 1000, the last
    step lands on 0); frame 0 of the clip stays pinned to the image latent at timestep 0.
    graphs: a `camrender.model.graphs.GraphedForward` over `segment_forward` that replays the
    denoising passes (the cache-writing pass always runs eagerly), or None.
    """
    import torch

    from camrender.model.segments import prepare_conditioning, segment_forward

    batch = inputs.text.shape[0]
    frames = stop - start
    # The latents stay float32 between steps, as in the official sampler (the model casts its input).
    latents = inputs.noise[:, :, start:stop].to(device=device, dtype=torch.float32).clone()
    pinned = torch.zeros(frames, dtype=torch.bool, device=device)
    if start == 0 and inputs.first_latent is not None:
        latents[:, :, :1] = inputs.first_latent.to(device=device, dtype=torch.float32)
        pinned[0] = True

    camera, plucker = inputs.camera(start, stop)  # pulls the segment's cameras from a stream
    p_t, p_h, p_w = model.patch_size
    conditioning = prepare_conditioning(
        model, (frames // p_t, latents.shape[3] // p_h, latents.shape[4] // p_w), inputs.text, inputs.text_mask,
        camera_conditions=camera, chunk_plucker=plucker, frame_start=start,
    )

    def forward(x, timestep, write=False):
        x, timestep = x.expand(batch, -1, -1, -1, -1), timestep.expand(batch, 1, frames)
        if graphs is not None and not write:
            return graphs(x, timestep, conditioning, cache)
        return segment_forward(model, x, timestep, frame_start=start, cache=cache, write_cache=write,
                               options=options, conditioning=conditioning)

    sigmas = [t / 1000.0 for t in timesteps] + [0.0]
    for index, t in enumerate(timesteps):
        # torch.where, not boolean indexing: indexing would wait for the GPU at every step.
        frame_timesteps = torch.where(pinned, 0.0, float(t)).view(1, 1, frames)
        velocity = forward(latents, frame_timesteps).float()
        if batch == 2:
            uncond, cond = velocity.chunk(2)
            velocity = uncond + inputs.guidance * (cond - uncond)
        stepped = latents + (sigmas[index + 1] - sigmas[index]) * velocity
        latents = torch.where(pinned[None, None, :, None, None], latents, stepped)
    forward(latents, torch.zeros(1, 1, frames, device=device), write=True)
    return latents


def sample_segments(model, inputs: RenderInputs, bounds, timesteps, options, device, *,
                    cuda_graphs: bool = False, cache=None, first_segment: int = 0) -> Iterator:
    """Yield `(index, start, stop, latents)` for each segment in order, carrying one `SegmentCache`
    (an offloaded transformer is brought back to the GPU before each segment).

    cache, first_segment: continue from a restored cache at segment `first_segment` (resume);
    default an empty cache at segment 0.

    cuda_graphs: replay the denoising passes as CUDA graphs (`camrender.model.graphs`); off
    under model CPU offload (the weights move between segments). Off CUDA the same replay path
    runs on static copies without graphs (for tests).
    """
    import torch

    from camrender.model.graphs import GraphedForward
    from camrender.model.segments import SegmentCache, segment_forward

    cache = SegmentCache.empty(model) if cache is None else cache
    graphs = None
    if cuda_graphs and getattr(model, "_hf_hook", None) is None:
        def forward(x, timestep, conditioning, segment_cache):
            return segment_forward(model, x, timestep, frame_start=conditioning.frame_start, cache=segment_cache,
                                   options=options, conditioning=conditioning)

        graphs = GraphedForward(forward, capture=torch.device(device).type == "cuda")
    for index, (start, stop) in enumerate(bounds):
        if index < first_segment:
            continue
        _bring_to_device(model)
        yield index, start, stop, sample_segment(model, inputs, start, stop, cache, timesteps, options, device,
                                                 graphs=graphs)


def sample_chunk_flow(model, inputs: RenderInputs, bounds, timesteps, options, device, *,
                      cuda_graphs: bool = False) -> Iterator:
    """The chunk-causal teacher's ChunkFlowEuler sampler (`camrender.render.chunk_causal`); same contract as
    `sample_segments`, with `timesteps` its `TeacherSchedule` (`chunk_causal.teacher_schedule`). No
    CUDA-graph replay: the in-flight window changes shape from step to step."""
    from camrender.render.chunk_causal import sample_chunk_causal

    yield from sample_chunk_causal(model, inputs, bounds, timesteps, options, device, before_call=_bring_to_device)


# Segment-mode sampler of each recipe's `sampler` word: (model, inputs, bounds, timesteps, options,
# device, cuda_graphs=...) -> iterator of (index, start, stop, clean latents (1, C, t, h, w)).
SEGMENT_SAMPLERS = {
    "self-forcing": sample_segments,
    "euler": sample_segments,  # the bidirectional checkpoint forced into segment mode
    "chunk-flow-euler": sample_chunk_flow,
}


def _bring_to_device(module) -> None:
    """With model CPU offload, run the module's offload hook (as its forward would) so it sits on the GPU."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(module)


def render_segments(pipe, request, progress: Optional[Callable[..., None]] = None,
                    checkpoints=None) -> Iterator[np.ndarray]:
    """Yield the video of `request` as uint8 (F_segment, H, W, 3) chunks, one per finished segment.

    `progress(done, total, info)` is called after each segment (done/total in segments; info:
    frames written, seconds of video, video frames per second of wall time).
    checkpoints: a `camrender.render.resume.Checkpointer` (or None): the render starts from its
    checkpoint, if it has one, and saves one at segment boundaries, after the consumer has
    taken the previous segment's frames (so they are written before the checkpoint refers to them).
    """
    import torch

    from camrender.render.request import check_request, latent_shape
    from camrender.model.patch import patch_transformer
    from camrender.model.settings import model_settings
    from camrender.render.decode import CausalStreamDecoder
    from camrender.model.segments import SegmentCache, SegmentOptions, segment_bounds
    from camrender.parallel.distributed import is_video_leader
    from camrender.render.stage_two import refined_frames, stage_two

    check_request(pipe, request)  # steps None: the segment step list
    recipe = get_recipe(request.recipe)
    segment_frames = recipe.chunk_frames if request.segment_frames is None else request.segment_frames
    cached_segments = recipe.recent_chunks if request.cached_segments is None else request.cached_segments
    if segment_frames < 1:
        raise CamrenderError(f"must be at least 1, got {segment_frames}", field="segment-frames")
    if cached_segments is not None and cached_segments < 0:
        raise CamrenderError(f"must be 0 or more, got {cached_segments}", field="cached-segments")
    device = pipe._execution_device
    model = pipe.transformer
    latent_frames = latent_shape(pipe, request)[0]
    if model.use_pe and latent_frames > model.rope.max_seq_len:
        longest = (model.rope.max_seq_len - 1) * pipe.vae_temporal_compression_ratio + 1
        raise CamrenderError(f"segment mode renders at most {longest} frames with this model, got {request.num_frames}",
                             field="frames")
    if model_settings(model) is None:  # the CLI patches with the request's --kernels; a bare pipeline here
        patch_transformer(model, kernels=request.kernels)
    options = SegmentOptions.for_recipe(recipe, cached_segments=cached_segments)
    inputs = prepare_inputs(pipe, request, device)
    if recipe.sampler == "chunk-flow-euler":  # the teacher's own layout and staggered schedule
        from camrender.render.chunk_causal import teacher_chunk_bounds, teacher_schedule

        bounds = teacher_chunk_bounds(inputs.noise.shape[2], segment_frames)
        timesteps = teacher_schedule(len(bounds), steps=request.steps or recipe.steps)
    else:
        bounds = segment_bounds(inputs.noise.shape[2], segment_frames)
        timesteps = segment_timesteps(pipe.scheduler, request.steps, recipe)
    sampler = SEGMENT_SAMPLERS[recipe.sampler]
    decoder = CausalStreamDecoder(pipe.vae, device=device)
    cache, first = SegmentCache.empty(model), 0
    written = 0
    if recipe.sampler == "chunk-flow-euler":
        checkpoints = None  # several chunks are in flight at every boundary: nothing to resume from
    if checkpoints is not None:
        cache, first = checkpoints.restore(cache, decoder, device, bounds)
        written = checkpoints.frames_before

    started, resumed_at = time.perf_counter(), written
    with torch.no_grad():
        # the self-forcing sampler continues from a restored cache; the teacher's chunks in flight are not checkpointed
        resumable = {} if recipe.sampler == "chunk-flow-euler" else {"cache": cache, "first_segment": first}
        segments = (latents for *_, latents in sampler(
            model, inputs, bounds, timesteps, options, device, cuda_graphs=request.cuda_graphs and device.type == "cuda",
            **resumable))
        if not is_video_leader():  # a head split's other ranks: the forwards only, the leader decodes
            for _ in segments:
                pass
            return
        # stage 2 (--refiner; a pass-through without one) and the streaming decode, segment by segment
        for done, frames in refined_frames(stage_two(pipe, request, device), segments, decoder, device):
            done += first
            written += len(frames)
            if progress is not None:
                elapsed = max(time.perf_counter() - started, 1e-9)
                progress(done, len(bounds), f"{written} frames, {written / request.fps:.1f} s of video, "
                                            f"{(written - resumed_at) / elapsed:.1f} frames/s")
            if len(frames):
                yield frames
            if checkpoints is not None:
                checkpoints.maybe_save(done, bounds, written, cache, decoder)
    if hasattr(pipe, "maybe_free_model_hooks"):
        pipe.maybe_free_model_hooks()
