"""Stage 2 in a render: the refiner attached to the pipeline, run on each segment (or the whole clip).

`stage_two(pipe, request, device)` gives a render its `camrender.model.refiner.stream.RefinerStream` (or a
pass-through without `--refiner`); segment mode feeds it through `refined_frames`, which also
decodes and, on CUDA, overlaps a segment's refinement with the next segment's stage 1; full mode
calls `refine_clip`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Optional

import torch

from camrender.errors import CamrenderError
from camrender.model.precision import get_precision
from camrender.model.refiner.loading import load_refiner, place_refiner
from camrender.model.refiner.stream import RefinerStream, RefinerText, encode_refiner_prompt, park_prompt_projections
from camrender.model.settings import RefinerSettings, RenderSettings
from camrender.render.decode import to_uint8_frames_async
from camrender.render.prompt_cache import cached_pair, refiner_key

_ATTRIBUTE = "_camrender_refiner"
_PROMPT_MEMO = "_camrender_prompt"  # (refiner_key, embeds, mask) encoded at load


def attach_refiner(pipe, refiner) -> None:
    """Give a loaded `SanaWMLTX2Refiner` (or None) to the renders of `pipe` (`stage_two` finds it there)."""
    setattr(pipe, _ATTRIBUTE, refiner)


class PassThrough:
    """`RefinerStream`'s interface (`push`, `settle`, `finish`) for a render without stage 2: latents pass
    through unchanged."""

    def __init__(self):
        self.last = None

    def push(self, latents):
        self.last = latents
        return latents

    def settle(self):
        pass

    def finish(self):
        return self.last[:, :, :0]


def has_refiner(pipe) -> bool:
    """Whether a refiner is attached to `pipe` (its renders go through stage 2)."""
    return getattr(pipe, _ATTRIBUTE, None) is not None


def stage_two(pipe, request, device, settings: Optional[RefinerSettings] = None):
    """The refiner stream of one render: a `RefinerStream` when a refiner is attached to `pipe`, else a
    pass-through with the same `push`/`finish`. Encodes the refiner's prompt here, once per render.

    settings: the render's `RenderSettings.refiner` (None: those of the request's `LoadSettings`);
    kernels "torch" runs diffusers' own refiner blocks. Noise of the block endpoints
    comes from a CPU generator seeded with the render's seed (repeatable across devices, like stage 1's).
    """
    refiner = getattr(pipe, _ATTRIBUTE, None)
    if refiner is None:
        return PassThrough()
    settings = RenderSettings.decide(request.settings).refiner if settings is None else settings
    text = refiner_prompt(refiner, request, device)
    return RefinerStream(refiner, text, fps=request.fps, device=device,
                         generator=torch.Generator("cpu").manual_seed(int(request.seed)),
                         kernels=settings.kernels, kernel_backend=settings.backend, kv_max_frames=settings.window)


def refiner_prompt(refiner, request, device) -> RefinerText:
    """The refiner's encoded prompt for `request`: encoded at load (`load_stage_two`), else from the prompt
    cache, else encoded now (and stored in the cache)."""
    key = refiner_key(request)
    memo = getattr(refiner, _PROMPT_MEMO, None)
    if memo is not None and memo[0] == key:
        embeds, mask = memo[1], memo[2]
    else:
        dtype = next(refiner.transformer.parameters()).dtype
        embeds, mask = cached_pair(request, key, lambda: _encoded(refiner, request, device, dtype), device)
    return RefinerText(embeds=embeds.to(device), mask=None if mask is None else mask.to(device))


def _encoded(refiner, request, device, dtype) -> tuple:
    if refiner.text_encoder is None:
        raise CamrenderError("the refiner's prompt is not in the prompt cache any more and its text encoder was not "
                             "loaded: render again", field="prompt-cache")
    text = encode_refiner_prompt(refiner, request.prompt, device, dtype)
    return text.embeds, text.mask


# On CUDA, a segment's refinement runs on its own stream while the next segment's stage 1 runs, and its
# decode on a third. With the refiner this hides 1-3 % of the stages' GPU time on an H200 (the refiner
# keeps every SM busy: bench/results/2026-12-04_refined_segments_stream_traces_h200.json); without it the decode
# runs beside stage 1.
OVERLAP_STAGE_TWO = True

# The streams' price in memory: PyTorch's caching allocator keeps the blocks a stream frees for that stream, so each of
# the three streams holds its own peak of short-lived buffers (at the release shape 3.4 GiB more reserved than on one
# stream with the bf16 refiner, 1.9 with FP8: bench/results/2026-12-04_refined_segments_one_stream_h200.json). With a
# refiner on CUDA the stages get their own streams only where the GPU has this much room at the render's start (its
# memory, under the process's cap, less what is allocated), as on an 80 or 141 GB card; elsewhere they are queued in the
# same order on the render's one stream (`Schedule(streams=False)`), so from one pool, and the host still runs a segment
# ahead (1-2 % slower than the streams on an H200; yielding each segment's frames before the next is queued,
# `overlap=False`, is 6-9 % slower).
OVERLAP_MIN_ROOM_GIB = 32


def room_for_overlap(device) -> bool:
    """Whether `device` has `OVERLAP_MIN_ROOM_GIB` free for the render (always, off CUDA): under the process's cap,
    less what it has allocated, and no more than the card has free (other processes' memory counts against it)
    plus what this process's allocator holds unallocated."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    capped = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # not in every PyTorch release
    usable = total * (capped(index) if capped is not None else 1.0)
    allocated = torch.cuda.memory_allocated(index)
    free_on_card, _ = torch.cuda.mem_get_info(index)
    cached = torch.cuda.memory_reserved(index) - allocated
    return min(usable - allocated, free_on_card + cached) >= OVERLAP_MIN_ROOM_GIB * 2**30


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How `refined_frames` overlaps the stages on CUDA.

    stage_one_first: stage 1 and the decode on high-priority streams, the refiner on a low-priority one
        (the GPU's block scheduler starts their kernels first when both wait); else all streams equal.
    decode_apart: the decode on its own stream (it can overlap the next block's refinement); else on
        the refiner's, after each block.
    streams: False queues every stage, in the same order, on the render's own stream: the GPU runs them one
        after another, from one allocator pool, while the host still queues chunk k+1 before it waits for
        chunk k's frames (what keeps the GPU busy: the streams themselves hide about 1 % on an H200).
    The three schedules with streams render at the same rate within 1 % on an H200 (bench/bench_refiner.py).
    """

    stage_one_first: bool = True
    decode_apart: bool = True
    streams: bool = True


def chosen_schedule(stage, device, overlap: Optional[bool], schedule: Schedule) -> tuple:
    """(overlap, schedule) of `refined_frames` for `stage` on `device`: as given, or with `overlap` None the
    default (`OVERLAP_STAGE_TWO` with a refiner, and on CUDA without one; a refined render without
    `room_for_overlap` keeps the order on one stream)."""
    if overlap is not None:
        return overlap, schedule
    refined = isinstance(stage, RefinerStream)
    overlap = OVERLAP_STAGE_TWO and (refined or torch.device(device).type == "cuda")
    if overlap and refined and schedule.streams and not room_for_overlap(device):
        schedule = dataclasses.replace(schedule, streams=False)
    return overlap, schedule


def refined_frames(stage, latent_chunks, decoder, device, overlap: Optional[bool] = None,
                   schedule: Schedule = Schedule(), hold: Optional[Callable[[int], bool]] = None,
                   settle_chunk: Optional[Callable[[], None]] = None):
    """Segment mode's stage 2 and decode: for each chunk of stage-1 latents (1, C, t, h, w) from the
    iterator `latent_chunks`, yield `(chunks_consumed, frames)`, frames uint8 (F, H, W, 3) (possibly
    empty), refined by `stage` (`stage_two`'s result: a `RefinerStream` or a pass-through) and decoded
    by `decoder` (a `CausalStreamDecoder`); the clip's last block comes with the last chunk's count.

    overlap (default: `OVERLAP_STAGE_TWO` with a refiner, and on CUDA without one): stage 1, the refiner
    and the decode are queued on three CUDA streams as `schedule` says, chunk k's frames yielded after
    chunk k+1's stage 1 (and refinement) have been queued (taking chunk k+1 from `latent_chunks` is what
    queues its stage 1), so the stages of neighbouring chunks overlap on the GPU. By default a refined render
    where the GPU lacks room for the streams' caches (`room_for_overlap`) keeps that order on one stream
    (`Schedule(streams=False)`). Off CUDA the streams are no-ops and the order is the same. False: each chunk's
    frames are yielded before the next chunk's stage 1 is queued (`camrender play`'s low-latency order). The
    frames are the same either way.

    hold(k): asked before taking chunk k+1 while chunk k's frames wait; True yields them first, before
    chunk k+1's stage 1 runs (a checkpoint after chunk k then sees the state after chunk k).
    settle_chunk(): queues stage 1's work for the next chunk that chunk k's frames do not need (its cache
    pass, `ChunkPlan.settle`), called once chunk k's refinement (and, in order, its decode) is queued and
    before its frames are yielded.
    """
    settle_chunk = settle_chunk or (lambda: None)
    overlap, schedule = chosen_schedule(stage, device, overlap, schedule)

    def frames_of(latents):
        """Queue the decode of refined latents; returns a callable giving the numpy frames."""
        if not latents.shape[2]:
            return lambda: []
        host, ready = to_uint8_frames_async(decoder.decode(latents))
        return lambda: (ready.synchronize() if ready is not None else None, host.numpy())[1]

    if not overlap:
        count, beside, chunks = 0, _Beside(device), iter(latent_chunks)
        try:
            while True:
                beside.join()
                latents = next(chunks, None)
                if latents is None:
                    break
                count += 1
                frames = frames_of(stage.push(latents))
                # the refiner's history pass and stage 1's cache pass, queued behind the decode: the frames do
                # not wait for them on the GPU, nor (on CUDA) for the host to queue them
                beside.start(stage.settle, settle_chunk)
                frames = frames()
                if hold is not None and hold(count):
                    beside.join()  # a checkpoint follows chunk k: the state after it, settled
                yield count, frames
        finally:
            beside.join()
        last_block = stage.finish()
        if last_block.shape[2]:
            yield count, frames_of(last_block)()
        return

    streams = _StageStreams(device, schedule)
    chunks = iter(latent_chunks)
    waiting = None  # (count, frames callable) of the chunk whose refinement and decode are queued
    count = 0
    try:
        while True:
            if waiting is not None and hold is not None and hold(waiting[0]):
                yield waiting[0], waiting[1]()
                waiting = None
            with streams.on("stage_one"):
                latents = next(chunks, None)
            if latents is None:
                break
            count += 1
            with streams.on("refiner", latents):
                refined = stage.push(latents)
                stage.settle()  # before the decode waits on this stream, as the schedules were measured
            with streams.on("stage_one"):
                settle_chunk()  # stage 1's cache pass: after the refiner's wait, so the refiner does not wait for it
            with streams.on("decode", refined):
                queued = frames_of(refined)
            if waiting is not None:
                yield waiting[0], waiting[1]()
            waiting = (count, queued)
        with streams.on("refiner"):
            last_block = stage.finish()
        with streams.on("decode", last_block):
            tail = frames_of(last_block)
        if waiting is not None:
            yield waiting[0], waiting[1]()
        if last_block.shape[2]:
            yield count, tail()
    finally:
        streams.join()


class _Beside:
    """Work a chunk's frames do not wait for, queued from a second host thread on CUDA while this one waits for
    the frames; inline elsewhere. The refiner's history pass is about 0.13 s of host-bound launches at the
    release size: queued inline, the frames (decoded on the GPU by then) waited for it on the host.
    The thread queues on the caller's stream and device, without autograd, and must be joined (`join`, which
    re-raises its error) before the stages it touched run again. Stage 1's cache pass may capture its CUDA
    graph there (`camrender.model.graphs` captures in thread-local error mode, so this thread's wait for the
    frames stays legal)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def start(self, *work: Callable[[], None]) -> None:
        if self.device.type != "cuda":
            for step in work:
                step()
            return
        stream = torch.cuda.current_stream(self.device)

        def run():
            try:
                with torch.no_grad(), torch.cuda.device(self.device), torch.cuda.stream(stream):
                    for step in work:
                        step()
            except BaseException as error:  # re-raised by join, in the render's thread
                self._error = error

        self._thread = threading.Thread(target=run, name="camrender-settle", daemon=True)
        self._thread.start()

    def join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error


_STREAMS: dict = {}  # (device, stage, priority) -> the CUDA stream every render queues that stage on


def _stream(device: torch.device, stage: str, priority: int) -> "torch.cuda.Stream":
    """The process's one stream for `stage` on `device`. PyTorch's caching allocator keeps the blocks a stream
    freed for that stream alone, so a second render on fresh streams (PyTorch hands them out round robin) could
    not reuse what the first one's stages left cached, and reserved memory would grow render by render."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), stage, priority)
    if key not in _STREAMS:
        _STREAMS[key] = torch.cuda.Stream(device, priority=priority)
    return _STREAMS[key]


class _StageStreams:
    """The three CUDA streams of `refined_frames`' overlap (no-ops off CUDA and under `Schedule(streams=False)`,
    where work runs in order on the current stream).

    Each stage waits for the one before it on the GPU, never on the host: stage 1 for the work queued
    before the loop, the refiner for stage 1, the decode for the refiner. A tensor made on one stream
    and read on the next is recorded on the reader, so its memory is not reused early.
    """

    def __init__(self, device, schedule: Schedule):
        self.device = torch.device(device)
        self.streams, self.after = {}, {}
        if self.device.type != "cuda" or not schedule.streams:
            return
        low, high = torch.cuda.Stream.priority_range()  # numerically, the highest priority is the lowest
        first = high if schedule.stage_one_first else low
        stage_one = _stream(self.device, "stage_one", first)
        refiner = _stream(self.device, "refiner", low)
        decode = _stream(self.device, "decode", first) if schedule.decode_apart else refiner
        self.outer = torch.cuda.current_stream(self.device)
        self.streams = {"stage_one": stage_one, "refiner": refiner, "decode": decode}
        self.after = {"stage_one": self.outer, "refiner": stage_one, "decode": refiner}

    @contextlib.contextmanager
    def on(self, name: str, *inputs):
        """Queue the enclosed work on stream `name`, after the work queued so far on the stage before it;
        `inputs` were made there and are read here."""
        if not self.streams:
            yield
            return
        stream = self.streams[name]
        stream.wait_stream(self.after[name])
        for tensor in inputs:
            tensor.record_stream(stream)
        with torch.cuda.stream(stream):
            yield

    def join(self) -> None:
        """Make the stream that was current before the loop wait for all three."""
        for stream in self.streams.values():
            self.outer.wait_stream(stream)


def refine_clip(pipe, request, latents, device=None, progress=None, settings: Optional[RefinerSettings] = None):
    """Full mode's stage 2: the whole stage-1 clip (1, C, T, h, w) refined (unchanged without a refiner).

    progress: optional `progress(done, total, info)`, called after each refined block; settings: as
    `stage_two`'s.
    """
    stream = stage_two(pipe, request, device if device is not None else latents.device, settings)
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
            progress(done, len(edges), "", stage="stage 2 (refiner)", unit="block")
    return torch.cat(pieces, dim=2)


def load_stage_two(pipe, load, *, prompt=None, text_encoder: bool = True, place: bool = True,
                   settings: Optional[RefinerSettings] = None) -> None:
    """Load the refiner of `load` (`LoadSettings`) in the pipeline's dtype, its block linears in the refiner's
    precision (`camrender.model.precision`, prepared once here; settings None: those of `load`), place it
    (`load.refiner_offload`) and attach it to `pipe` (`camrender.render.stage_two.stage_two` finds it there).
    prompt: a `RenderRequest` whose refiner prompt is encoded now, before the DiT is on the GPU (the Gemma-3
    encoder, 24 GB in bf16, then visits the GPU beside stage 1 alone), and kept for its render.
    text_encoder=False: no Gemma-3 (the prompt is cached). place=False: the DiT stays in CPU memory,
    unprepared (`camrender encode-prompt`)."""
    latent_channels = pipe.vae.config.latent_channels
    refiner = load_refiner(load.refiner, dtype=pipe.transformer.dtype, latent_channels=latent_channels,
                           text_encoder=text_encoder)
    if refiner.transformer.config.in_channels != latent_channels:  # a hub id is checked only once downloaded
        raise CamrenderError(f"the refiner works on {refiner.transformer.config.in_channels} latent channels but "
                             f"the VAE makes {latent_channels}", path=load.refiner, field="refiner")
    if refiner.text_encoder is not None and prompt is not None:
        text = refiner_prompt(refiner, prompt, pipe._execution_device)
        setattr(refiner, _PROMPT_MEMO, (refiner_key(prompt), text.embeds, text.mask))
    if not place:
        attach_refiner(pipe, refiner)
        return
    settings = RenderSettings.decide(load).refiner if settings is None else settings
    # on the GPU block by block (the bf16 weights of one block at a time), or where they stream from
    device = None if load.refiner_offload == "layers" else pipe._execution_device
    get_precision(settings.linear_precision).prepare_blocks(refiner.transformer.transformer_blocks, device=device)
    place_refiner(refiner, pipe._execution_device, load.refiner_offload)
    park_prompt_projections(refiner.transformer)
    attach_refiner(pipe, refiner)
