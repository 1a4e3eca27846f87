"""Stage 2 in a render: the refiner attached to the pipeline, run on each segment (or the whole clip).

`stage_two(pipe, request, device)` gives a render its `camrender.model.refiner.RefinerStream` (or a
pass-through without `--refiner`); segment mode feeds it through `refined_frames`, which also
decodes and, on CUDA, overlaps a segment's refinement with the next segment's stage 1; full mode
calls `refine_clip`.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from camrender.errors import CamrenderError
from camrender.model.refiner import RefinerStream, encode_refiner_prompt
from camrender.model.settings import KernelSettings, model_settings

_ATTRIBUTE = "_camrender_refiner"


def attach_refiner(pipe, refiner) -> None:
    """Give a loaded `SanaWMLTX2Refiner` (or None) to the renders of `pipe` (`stage_two` finds it there)."""
    setattr(pipe, _ATTRIBUTE, refiner)


class PassThrough:
    """`RefinerStream`'s interface for a render without stage 2: latents pass through unchanged."""

    def __init__(self):
        self.last = None

    def push(self, latents):
        self.last = latents
        return latents

    def finish(self):
        return self.last[:, :, :0]


def stage_two(pipe, request, device):
    """The refiner stream of one render: a `RefinerStream` when a refiner is attached to `pipe`, else a
    pass-through with the same `push`/`finish`. Encodes the refiner's prompt here, once per render.

    Noise of the block endpoints comes from a CPU generator seeded with the render's seed (repeatable
    across devices, like stage 1's). `--no-cuda-graphs` (request.cuda_graphs False) keeps the refiner eager too;
    `--kernels torch` runs diffusers' stock refiner blocks.
    """
    refiner = getattr(pipe, _ATTRIBUTE, None)
    if refiner is None:
        return PassThrough()
    dtype = next(refiner.transformer.parameters()).dtype
    text = encode_refiner_prompt(refiner, request.prompt, device, dtype)
    # the settings stage 1 was patched with: fused blocks, or diffusers' own ones (--kernels torch)
    settings = model_settings(pipe.transformer) or KernelSettings.from_kernels(request.kernels)
    # on a CPU the fused path's PyTorch references, never the Triton interpreter (tests run stage 1 there)
    backend = settings.backend if torch.device(device).type == "cuda" else "torch"
    return RefinerStream(refiner, text, fps=request.fps, device=device,
                         generator=torch.Generator("cpu").manual_seed(int(request.seed)),
                         cuda_graphs=None if getattr(request, "cuda_graphs", True) else False,
                         kernels="fused" if settings.fused else "stock", kernel_backend=backend)


# On CUDA, a segment's refinement and decode run on a side stream while the next segment's stage 1
# runs on the main one (stage 1 is latency-bound and leaves the GPU's tensor cores idle much of the time).
OVERLAP_STAGE_TWO = True


def refined_frames(stage, latent_chunks, decoder, device, overlap: Optional[bool] = None):
    """Segment mode's stage 2 and decode: for each chunk of stage-1 latents (1, C, t, h, w) from the
    iterator `latent_chunks`, yield `(chunks_consumed, frames)`, frames uint8 (F, H, W, 3) (possibly
    empty), refined by `stage` (`stage_two`'s result: a `RefinerStream` or a pass-through) and decoded
    by `decoder` (a `CausalStreamDecoder`); the clip's last block comes with the last chunk's count.

    overlap (default `OVERLAP_STAGE_TWO`; CUDA with a refiner only): chunk k's refinement and decode
    are queued on a side stream and its frames are yielded after chunk k+1's stage 1 has been queued
    (taking chunk k+1 from `latent_chunks` is what queues it), so the two overlap on the GPU. The
    frames are the same either way.
    """
    from camrender.render.decode import to_uint8_frames_async

    overlap = OVERLAP_STAGE_TWO if overlap is None else overlap
    side = _SideStream(device) if overlap and isinstance(stage, RefinerStream) else None

    def frames_of(latents):
        """Queue the decode of refined latents; returns a callable giving the numpy frames."""
        if not latents.shape[2]:
            return lambda: []
        host, ready = to_uint8_frames_async(decoder.decode(latents))
        return lambda: (ready.synchronize() if ready is not None else None, host.numpy())[1]

    waiting = None  # (count, frames callable) of the chunk queued on the side stream
    count = 0
    for count, latents in enumerate(latent_chunks, start=1):
        if side is None:
            yield count, frames_of(stage.push(latents))()
            continue
        with side.after(latents):
            queued = frames_of(stage.push(latents))
        if waiting is not None:
            yield waiting[0], waiting[1]()
        waiting = (count, queued)
    with side.after() if side is not None else contextlib.nullcontext():
        last_block = stage.finish()
        tail = frames_of(last_block)
    if waiting is not None:
        yield waiting[0], waiting[1]()
    if last_block.shape[2]:
        yield count, tail()


class _SideStream:
    """A CUDA stream that runs after everything queued so far on the current one (a no-op off CUDA,
    where work runs in order anyway)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    @contextlib.contextmanager
    def after(self, *inputs):
        """Queue the block's work on the side stream, after the current stream's work; `inputs` were
        made on the current stream and are read on the side one (their memory is kept until then)."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        for tensor in inputs:
            tensor.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            yield


def refine_clip(pipe, request, latents, device=None, progress=None):
    """Full mode's stage 2: the whole stage-1 clip (1, C, T, h, w) refined (unchanged without a refiner).

    progress: optional `progress(done, total, info)`, called after each refined block.
    """
    stream = stage_two(pipe, request, device if device is not None else latents.device)
    if isinstance(stream, PassThrough):
        return latents
    frames = latents.shape[2]
    # the sink and then one block per push: each push refines exactly one block
    edges = list(range(stream.sink_frames + stream.block_frames, frames, stream.block_frames)) + [frames]
    pieces, start = [], 0
    for done, stop in enumerate(edges, start=1):
        pieces.append(stream.push(latents[:, :, start:stop]))
        start = stop
        if stop == frames:
            pieces.append(stream.finish())
        if progress is not None:
            progress(done, len(edges), f"refining: block {done}/{len(edges)}")
    return torch.cat(pieces, dim=2)


def load_stage_two(pipe, request) -> None:
    """Load `request.refiner` in the pipeline's dtype, place it (`request.refiner_offload`) and attach it
    to `pipe` for the render (`camrender.render.stage_two.stage_two`)."""
    from camrender.model.refiner_loading import load_refiner, place_refiner

    latent_channels = pipe.vae.config.latent_channels
    refiner = load_refiner(request.refiner, dtype=pipe.transformer.dtype, latent_channels=latent_channels)
    if refiner.transformer.config.in_channels != latent_channels:  # a hub id is checked only once downloaded
        raise CamrenderError(f"the refiner works on {refiner.transformer.config.in_channels} latent channels but "
                             f"the VAE makes {latent_channels}", path=request.refiner, field="refiner")
    place_refiner(refiner, pipe._execution_device, request.refiner_offload)
    attach_refiner(pipe, refiner)
