"""Where a live segment's time goes: host and GPU marks around each stage of the segment loop.

`recording()` wraps `camrender.render.loop.refined_frames` (the loop `camrender play` renders through) so
that, for every chunk, it notes on the host (time.monotonic, the clock `camrender.play.steering` decides
segments by) when stage 1 was asked for the chunk and returned it, when the refiner's push, the decode and
the refiner's history pass (`settle`) were queued, and when the frames were handed on; and on the GPU (a
CUDA event after each of those stages, read once the flight is over) when each finished. `summary(marks,
decided)` turns them into per-segment seconds from the decision: the GPU's finish of each stage and the host's
return from each call, so host-bound stretches (the GPU finishing right after the host returns) show.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

import camrender.render.loop as loop_module

STAGES = ("stage1", "refine", "decode", "settle")


class _Marks:
    def __init__(self):
        self.rows = []  # one dict per chunk: host times, GPU events
        self.cuda = torch.cuda.is_available()
        self.base_event = None
        self.base_host = None

    def start(self):
        if self.cuda and self.base_event is None:
            torch.cuda.synchronize()
            self.base_event = torch.cuda.Event(enable_timing=True)
            self.base_event.record()
            self.base_host = time.monotonic()

    def mark(self, row: dict, name: str) -> None:
        row[f"host_{name}"] = time.monotonic()
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            row[f"gpu_{name}"] = event

    def resolved(self) -> list:
        """The rows with each GPU event as a host-clock time (base + elapsed)."""
        if self.cuda:
            torch.cuda.synchronize()
        out = []
        for row in self.rows:
            plain = {}
            for key, value in row.items():
                if isinstance(value, torch.cuda.Event):
                    plain[key] = self.base_host + self.base_event.elapsed_time(value) / 1000.0
                else:
                    plain[key] = value
            out.append(plain)
        return out


class _Marked:
    """`target` with the methods named in `marks_of` ({method: mark name}) marking the current chunk's row after
    they return; everything else passes through."""

    def __init__(self, target, marks: _Marks, **marks_of):
        self._target, self._marks, self._marks_of = target, marks, marks_of

    def __getattr__(self, name):
        method = getattr(self._target, name)
        if name not in self._marks_of:
            return method

        def marked(*args, **kwargs):
            out = method(*args, **kwargs)
            if self._marks.rows:
                self._marks.mark(self._marks.rows[-1], self._marks_of[name])
            return out
        return marked


def _timed_chunks(chunks, marks: _Marks):
    iterator = iter(chunks)
    while True:
        row = {}
        marks.rows.append(row)
        row["host_ask"] = time.monotonic()
        try:
            latents = next(iterator)
        except StopIteration:
            marks.rows.pop()
            return
        marks.mark(row, "stage1")
        yield latents


@contextlib.contextmanager
def recording():
    """Within: every render through `camrender.render.loop` is marked; yields the `_Marks` (`.resolved()`)."""
    marks = _Marks()
    original = loop_module.refined_frames

    def timed(stage, latent_chunks, decoder, device, **options):
        marks.start()
        for count, frames in original(_Marked(stage, marks, push="refine", settle="settle"),
                                      _timed_chunks(latent_chunks, marks), _Marked(decoder, marks, decode="decode"),
                                      device, **options):
            if marks.rows:
                marks.rows[min(count, len(marks.rows)) - 1]["host_frames"] = time.monotonic()
            yield count, frames

    loop_module.refined_frames = timed
    try:
        yield marks
    finally:
        loop_module.refined_frames = original


def summary(rows: list, decided: list, skip: int = 2) -> dict:
    """Median seconds from a segment's decision (`decided[k]`, the steering clock) to each mark, over the
    segments after the first `skip`; plus the GPU's busy share between the decision and the frames."""
    table = {}
    for k, row in enumerate(rows):
        if k < skip or k >= len(decided) or "host_frames" not in row:
            continue
        for key, value in row.items():
            table.setdefault(key, []).append(value - decided[k])
    medians = {key: statistics.median(values) for key, values in table.items()}
    return {key: round(value, 4) for key, value in sorted(medians.items(), key=lambda kv: kv[1])}
