"""Where PyTorch's CUDA caching allocator keeps its reserved memory: per CUDA stream and memory pool, what is
allocated, what is cached free, and (with `record_history`) which code last allocated the biggest free blocks.

The allocator keeps a freed block for the stream that allocated it: another stream's request never takes it,
and the expandable segments' retry after an out-of-memory returns only whole free pages. So a render whose
stages run on several streams reserves, per stream, that stream's own peak of short-lived buffers. `pools`
shows it; `name_streams` labels the streams of `camrender.render.stage_two.refined_frames`.
"""
from __future__ import annotations

import collections
import contextlib

import torch

from common import gib

_NAMES: dict = {}  # cuda stream handle -> a readable name


def name_stream(stream, name: str) -> None:
    _NAMES[int(stream.cuda_stream)] = name


@contextlib.contextmanager
def name_streams():
    """Within: each `_StageStreams` that `refined_frames` makes names its streams here (stage_one, refiner,
    decode; the render's own is "outer"); the default stream is "default"."""
    from camrender.render import stage_two

    original = stage_two._StageStreams.__init__

    def named(self, device, schedule):
        original(self, device, schedule)
        if self.streams:
            name_stream(self.outer, "outer")
            for label, stream in self.streams.items():  # the decode's may be the refiner's (one name for both)
                name_stream(stream, label if stream is not self.streams["refiner"] else "refiner")

    stage_two._StageStreams.__init__ = named
    try:
        yield
    finally:
        stage_two._StageStreams.__init__ = original


def _label(stream: int) -> str:
    return "default" if stream == 0 else _NAMES.get(stream, f"stream {stream:#x}")


def record_history(max_entries: int = 200_000) -> None:
    """Keep the allocator's recent alloc/free events with their Python stacks (for `pools(top=...)`)."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")


def _camrender_frame(frames) -> str:
    """The innermost frame of camrender's or the bench's own code in a recorded stack."""
    for frame in frames or ():
        name = frame.get("filename", "")
        if "/camrender/" in name or "/bench/" in name:
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{frame.get('line')} {frame.get('name')}"
    return "?"


def pools(top: int = 4) -> list:
    """One row per (stream, pool): reserved, allocated and free GiB, the largest free block; with history
    recorded, for the `top` largest free blocks: size and the code that last allocated memory there."""
    snapshot = torch.cuda.memory._snapshot()
    rows = collections.OrderedDict()
    free_blocks = collections.defaultdict(list)
    for segment in snapshot["segments"]:
        pool = tuple(segment.get("segment_pool_id", (0, 0)))
        key = (_label(segment["stream"]), "graph pool" if pool != (0, 0) else "caching")
        row = rows.setdefault(key, dict(reserved=0, allocated=0, free=0, largest_free=0))
        address = segment["address"]
        for block in segment["blocks"]:
            size = block["size"]
            if block["state"] == "active_allocated":
                row["allocated"] += size
            elif block["state"] == "inactive":
                row["free"] += size
                row["largest_free"] = max(row["largest_free"], size)
                free_blocks[key].append((size, address))
            address += size
        row["reserved"] += segment["total_size"]
    traces = snapshot.get("device_traces") or [[]]
    allocs = [event for event in traces[0] if event.get("action") == "alloc"]
    out = []
    for (stream, kind), row in rows.items():
        entry = dict(stream=stream, pool=kind, **{k: gib(v) for k, v in row.items()})
        if allocs:
            entry["largest_free_blocks"] = []
            for size, address in sorted(free_blocks[(stream, kind)], reverse=True)[:top]:
                last = next((e for e in reversed(allocs) if address <= e["addr"] < address + size), None)
                entry["largest_free_blocks"].append(dict(
                    gib=gib(size), last_alloc_there=None if last is None else
                    dict(gib=gib(last["size"]), at=_camrender_frame(last.get("frames")))))
        out.append(entry)
    return out
