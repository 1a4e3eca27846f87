"""A batch's progress as a cluster user reads it in a log: one line per finished job (`JobLines`), naming the job,
the worker that rendered it, how it went, how many jobs are left and when the batch should end.

    job 3/6 out/a.mp4 on w1: done in 3.2 s (17 frames); 3 left, ETA 0:00:12
"""
from __future__ import annotations

import time
from typing import Callable


def outcome(result: dict) -> str:
    """A job's result in words: "done in 3.2 s (17 frames)" or "failed: ..."."""
    if result["status"] == "done":
        frames = result["frames"]
        return f"done in {result['seconds']:.1f} s ({frames} frame{'' if frames == 1 else 's'})"
    return f"failed: {result['reason'].split(': ', 1)[-1]}"


def clock_time(seconds: float) -> str:
    """12.3 -> "0:00:12", 7300 -> "2:01:40" (hours grow past 24: a log is read against its start)."""
    minutes, rest = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{rest:02d}"


class JobLines:
    """`lines(result)` logs one line per finished job (`JobRunner.render`'s result, with the "worker" that rendered
    it where there are several) of `total`. The ETA divides the jobs left by the batch's rate so far (finished jobs
    per second of wall clock since `JobLines` was made, every worker together)."""

    def __init__(self, total: int, log: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.total, self.log, self.clock = total, log, clock
        self.started = clock()
        self.finished = 0

    def __call__(self, result: dict) -> None:
        self.finished += 1
        left = self.total - self.finished
        elapsed = self.clock() - self.started
        worker = f" on {result['worker']}" if result.get("worker") else ""
        tail = "" if left == 0 else f"; {left} left, ETA {clock_time(left * elapsed / self.finished)}"
        self.log(f"job {self.finished}/{self.total} {result['out']}{worker}: {outcome(result)}{tail}")
