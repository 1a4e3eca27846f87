"""Where a render's GPU time goes across its CUDA streams, and what the host did while the GPU idled.

`Trace` records CUDA activity only (kernels, copies and the CUDA runtime calls of every host thread, no
PyTorch operator events: those would slow a host-bound render) between `start()` and `stop()`, then
`summary()` reads the exported Chrome trace:

- `span_ms`: first to last GPU activity; `busy_ms`: the union of all streams' kernels and copies;
  `idle_ms` = span - busy, and the idle gaps over 0.1 ms (count, ms, the largest with the host calls
  in flight during them);
- `streams`: per stream, busy ms and launches;
- `host`: per host thread, ms in the CUDA runtime by call (launches, synchronizations, copies): a host
  that waits in a synchronization while the GPU idles, or launches while it idles, shows here.
"""
from __future__ import annotations

import collections
import json
import os
import tempfile

from torch.profiler import ProfilerActivity, profile

GAP_MS = 0.1
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


class Trace:
    def __init__(self):
        self._profiler = None
        self.events = []

    def start(self) -> None:
        self._profiler = profile(activities=[ProfilerActivity.CUDA])
        self._profiler.__enter__()

    def stop(self) -> None:
        self._profiler.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            self._profiler.export_chrome_trace(path)
            with open(path) as handle:
                self.events = json.load(handle).get("traceEvents", [])
        self._profiler = None

    def summary(self, top: int = 8) -> dict:
        gpu = sorted((e["ts"], e["ts"] + e.get("dur", 0), e) for e in self.events
                     if e.get("cat") in GPU_CATEGORIES and "ts" in e)
        runtime = [e for e in self.events if e.get("cat") == "cuda_runtime" and "ts" in e]
        if not gpu:
            return dict(span_ms=0)
        streams = collections.defaultdict(list)
        for start, end, event in gpu:
            streams[event.get("args", {}).get("stream", "?")].append((start, end))
        busy, gaps = _merged((start, end) for start, end, _ in gpu)
        span = max(end for _, end, _ in gpu) - gpu[0][0]
        largest = sorted(gaps, key=lambda g: g[0] - g[1])[:top]
        host = collections.defaultdict(collections.Counter)
        for event in runtime:
            host[event.get("tid")][event["name"]] += event.get("dur", 0) / 1e3
        return dict(
            span_ms=round(span / 1e3, 3), busy_ms=round(busy / 1e3, 3), idle_ms=round((span - busy) / 1e3, 3),
            gaps=dict(count=sum(1 for a, b in gaps if (b - a) / 1e3 > GAP_MS),
                      ms=round(sum(b - a for a, b in gaps if (b - a) / 1e3 > GAP_MS) / 1e3, 3),
                      largest=[dict(at_ms=round((a - gpu[0][0]) / 1e3, 3), ms=round((b - a) / 1e3, 3),
                                    host=_in_flight(runtime, a, b)) for a, b in largest]),
            streams={str(stream): dict(busy_ms=round(_merged(spans)[0] / 1e3, 3), launches=len(spans))
                     for stream, spans in streams.items()},
            host={str(tid): {name: round(ms, 3) for name, ms in calls.most_common(6)}
                  for tid, calls in host.items()})


def _merged(intervals):
    """(total length of the union of `intervals`, the gaps between them), intervals as (start, end)."""
    total, gaps, current = 0.0, [], None
    for start, end in sorted(intervals):
        if current is None:
            current = [start, end]
        elif start > current[1]:
            total += current[1] - current[0]
            gaps.append((current[1], start))
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        total += current[1] - current[0]
    return total, gaps


def _in_flight(runtime, start, end) -> list:
    """The runtime calls overlapping [start, end] with the most overlap: (name, thread, overlap ms)."""
    overlaps = []
    for event in runtime:
        lap = min(end, event["ts"] + event.get("dur", 0)) - max(start, event["ts"])
        if lap > 0:
            overlaps.append((lap, event["name"], event.get("tid")))
    return [dict(call=name, thread=tid, ms=round(lap / 1e3, 3)) for lap, name, tid in sorted(overlaps)[::-1][:3]]
