"""Small pieces every bench script shares: the release latent grid's arguments, the JSON output, and
the one timing and memory helper (synced wall or CUDA-event timing with warm-up, median over
repeats, peak GPU memory).

The scripts run as `python3 bench/<name>.py`, which puts this folder first on sys.path, so they
import this module as `common`. Off CUDA (the scripts' --tiny / --cpu-smoke runs) the timers use the
host clock and the memory figures are 0.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable

import torch
import triton.testing

GIB = 2**30


def on_cuda(device=None) -> bool:
    """`device` is a CUDA device (None: CUDA is available)."""
    return torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"


def sync(device=None) -> None:
    """Wait for the GPU's queued work (a no-op off CUDA)."""
    if on_cuda(device):
        torch.cuda.synchronize()


class HostSyncs:
    """Counts the host-device syncs PyTorch makes while open, with PyTorch's sync debug mode (none off CUDA): at a
    sync the host waits for the GPU's queue to drain, and the GPU then waits for the host's next launches.
    `count` is how many so far; `sites()` where they came from."""

    def __init__(self, device=None):
        self.cuda = on_cuda(device)
        self.records = []

    def __enter__(self):
        self._catching = warnings.catch_warnings(record=True)
        self.records = self._catching.__enter__()
        warnings.simplefilter("always")
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        self._catching.__exit__(*exc)

    @property
    def count(self) -> int:
        return len(self._syncs())

    def sites(self) -> dict:
        """{"file:line": syncs} of the Python lines that made them, most first."""
        return dict(Counter(f"{Path(r.filename).name}:{r.lineno}" for r in self._syncs()).most_common())

    def _syncs(self) -> list:
        return [record for record in self.records if "synchroniz" in str(record.message)]


def gib(n_bytes, digits: int = 3):
    """Bytes as GiB rounded to `digits`; None stays None (no figure)."""
    return None if n_bytes is None else round(n_bytes / GIB, digits)


def reset_peak(device=None, *, empty_cache: bool = True) -> None:
    """Start a new peak-memory window (and return cached blocks first, so the peak is this run's)."""
    if on_cuda(device):
        sync(device)
        if empty_cache:
            torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device=None) -> int:
    """Peak bytes allocated since the last `reset_peak` (0 off CUDA)."""
    return torch.cuda.max_memory_allocated() if on_cuda(device) else 0


def allocated_bytes(device=None) -> int:
    """Bytes allocated now (0 off CUDA)."""
    return torch.cuda.memory_allocated() if on_cuda(device) else 0


def peak_of(fn: Callable, device=None, *, above_current: bool = False):
    """(fn(), peak bytes allocated while it ran), synced; `above_current`: minus what was allocated
    before (the inputs and weights). (result, None) off CUDA."""
    if not on_cuda(device):
        return fn(), None
    reset_peak(device)
    base = allocated_bytes(device) if above_current else 0
    result = fn()
    sync(device)
    return result, peak_bytes(device) - base


class Stopwatch:
    """Synced wall-clock seconds of a `with` block: `with Stopwatch(device) as watch: ...; watch.seconds`."""

    def __init__(self, device=None):
        self.device, self.seconds = device, float("nan")

    def __enter__(self):
        sync(self.device)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.seconds = time.perf_counter() - self.started
        return False


class Laps:
    """Synced wall seconds between successive calls, summed per name: `laps = Laps(device)` starts the
    clock, `laps("stage1")` adds the time since the previous lap to `laps.totals["stage1"]`."""

    def __init__(self, device=None):
        self.device = device
        self.totals: dict = {}
        sync(device)
        self.last = time.perf_counter()

    def __call__(self, name: str) -> float:
        """End a lap named `name`; its seconds."""
        sync(self.device)
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        return seconds


class Events:
    """CUDA-event laps on the current stream (host clock off CUDA): `mark(name)` ends a lap."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = [("start", self._event())]

    def _event(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, name: str) -> None:
        self.marks.append((name, self._event()))

    def laps_ms(self) -> list:
        sync()
        laps = []
        for (_, before), (name, after) in zip(self.marks, self.marks[1:]):
            ms = before.elapsed_time(after) if self.cuda else (after - before) * 1e3
            laps.append((name, round(ms, 3)))
        return laps


def time_ms(fn: Callable, *, repeats: int, warmup: int = 3, device=None) -> list:
    """Milliseconds of each of `repeats` calls of fn() after `warmup` untimed ones: CUDA events
    around each call on CUDA, the synced host clock elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if on_cuda(device):
            sync(device)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            with Stopwatch(device) as watch:
                fn()
            times.append(watch.seconds * 1e3)
    return times


def median_ms(fn: Callable, *, repeats: int, warmup: int = 3, device=None) -> float:
    """Median of `time_ms` (the figure the scripts report)."""
    return statistics.median(time_ms(fn, repeats=repeats, warmup=warmup, device=device))


def kernel_ms(fn: Callable, *, warmup: int = 25, rep: int = 100) -> float:
    """Median ms of a short kernel call by `triton.testing.do_bench` (L2 flushed between calls; its
    warmup and rep are milliseconds of calls); one synced host-clock call off CUDA (smoke runs)."""
    if not on_cuda():
        with Stopwatch() as watch:
            fn()
        return watch.seconds * 1e3

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def add_latent_args(parser, *, batch=2, frames=21, height=22, width=40):
    """--batch/--frames/--height/--width of the latent grid (default: the release step, B=2 guidance
    rows, T=21 latent frames of 22x40 tokens = 161 video frames at 704x1280)."""
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--frames", type=int, default=frames, help="latent frames")
    parser.add_argument("--height", type=int, default=height, help="latent rows")
    parser.add_argument("--width", type=int, default=width, help="latent columns")


def measure(errors: dict, name: str, fn: Callable):
    """One measurement of a script that keeps going when one fails: fn()'s result (a dict gets its
    wall seconds as "wall_s"), printed as a JSON line. On an exception: the error and the line that
    raised it go into `errors[name]`, the peak-memory window is reset, and the result is None."""
    began = time.perf_counter()
    try:
        value = fn()
    except Exception as error:  # one failed measurement must not lose the others
        reset_peak()
        errors[name] = (f"{type(error).__name__}: {str(error)[:300]} | "
                        + traceback.format_exc().strip().splitlines()[-3][:200])
        print(json.dumps({name: "error", "detail": errors[name]}), flush=True)
        return None
    if isinstance(value, dict):
        value["wall_s"] = round(time.perf_counter() - began, 1)
    print(json.dumps({name: value}), flush=True)
    return value


def emit(result: dict, out=None, *, indent: int = 1, **dumps) -> str:
    """Print `result` as JSON on stdout (the scripts' output) and write the same text to `out`."""
    text = json.dumps(result, indent=indent, **dumps)
    print(text, flush=True)
    if out:
        Path(out).write_text(text + "\n")
    return text


# The steady rate of a segment-mode render is read from the gap after this segment's frames on: stage 1's CUDA
# graphs are captured by then (the denoising passes' in segments 0-2, the cache pass's in segment 3:
# `camrender.model.graphs`) and the refiner's window is full (sink + 10 frames from segment 4). Earlier gaps hold
# captures and a growing window.
STEADY_FROM = 5


def steady_rates(arrivals) -> dict:
    """From (time, frames so far) at each yield of a segment-mode render: the time between two segments' frames
    (the last yield, the clip's last block, left out: its work was queued before the host waited for the frames
    before it) and the video fps of their median over the steady segments, from `STEADY_FROM` on, or over all of
    them (`video_fps_median_all_gaps`) where the path is too short; beside it, the frames from the second segment's
    to the last's over their time (`video_fps_from_second_segment`, what bench_segments once called steady: it holds the
    warm-up's later segments). {} for fewer than 4 yields."""
    if len(arrivals) < 4:
        return {}
    gaps = [b[0] - a[0] for a, b in zip(arrivals[:-2], arrivals[1:-1])]
    frames = arrivals[2][1] - arrivals[1][1]  # 24 video frames for 3 latent frames
    steady = gaps[STEADY_FROM:] if len(gaps) >= STEADY_FROM + 2 else gaps
    gap, all_gaps = (sorted(chosen)[len(chosen) // 2] for chosen in (steady, gaps))  # the medians
    (t1, f1), (t_last, f_last) = arrivals[1], arrivals[-1]
    return dict(segment_gaps_s=[round(g, 3) for g in gaps], video_fps_median_all_gaps=round(frames / all_gaps, 2),
                s_per_segment_steady=round(gap, 3), video_fps_steady=round(frames / gap, 2), steady_gaps=len(steady),
                video_fps_from_second_segment=round((f_last - f1) / (t_last - t1), 2))


if __name__ == "__main__":
    sys.exit("bench/common.py holds helpers of the bench scripts; run one of them")
