"""A job's progress as its render reports it (`camrender.render.request.Progress` calls) turned into its row in the
store: status percent 0-100, the stage, segments done of all, seconds left; and the one place a render learns
that it should stop (its job cancelled, or the server stopping).

Percent: segment mode counts segments (stages 1 and 2 together); full mode counts stage 1's denoising steps, then
the refiner's blocks when there is one (stage 1 up to 70 %, the refiner up to 99 %). A job reads 100 only once
its video is written. The store is written at most every `interval` seconds, and at every segment, a stage's
first and last report.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

FULL_STAGE1_SHARE = 0.7  # full mode with a refiner: the percent stage 1 ends at (the refiner takes the rest)
WRITE_INTERVAL_S = 0.5


class JobStopped(Exception):
    """Raised inside a render to stop it: `reason` "cancelled" (the job was) or "stopping" (the server is)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class JobProgress:
    """The progress callable and the stop check of one job's render.

    write(**fields) stores progress, stage, segments_done, segments_total, eta_s; stop_reason() -> None or why
    the render should stop (checked at every call, so a cancel lands within one step or segment)."""

    def __init__(self, write: Callable[..., None], stop_reason: Callable[[], Optional[str]], refiner: bool,
                 clock: Callable[[], float] = time.monotonic, interval: float = WRITE_INTERVAL_S):
        self.write, self.stop_reason, self.refiner = write, stop_reason, refiner
        self.clock, self.interval = clock, interval
        self.stage: Optional[str] = None
        self.stage_started = self.last_call = self.last_write = clock()
        self.done_before = 0  # units the stage had done when it started (a resumed render's segments)
        self.percent = 0

    def check(self) -> None:
        """Raise JobStopped when the job should stop (the writer calls it before each chunk)."""
        reason = self.stop_reason()
        if reason is not None:
            raise JobStopped(reason)

    def __call__(self, done: int, total: int, info: str = "", stage: str = "stage 1", unit: str = "") -> None:
        self.check()
        now = self.clock()
        new_stage = stage != self.stage
        if new_stage:  # the first unit of a stage took from the last call (or the start) to now
            self.stage, self.stage_started, self.done_before = stage, self.last_call, done - 1
        self.last_call = now
        fields = {"stage": stage, "progress": self._percent(done, total, stage, unit)}
        rate = (done - self.done_before) / max(now - self.stage_started, 1e-9)
        fields["eta_s"] = round((total - done) / rate, 1) if rate > 0 else None
        if unit == "segment":
            fields.update(segments_done=done, segments_total=total)
        if new_stage or unit == "segment" or done >= total or now - self.last_write >= self.interval:
            self.last_write = now
            self.write(**fields)

    def _percent(self, done: int, total: int, stage: str, unit: str) -> int:
        """0-99 (never back: a stage's counts restart at 0)."""
        share = done / total if total else 1.0
        if unit != "segment" and self.refiner:
            share = share * FULL_STAGE1_SHARE if stage == "stage 1" else FULL_STAGE1_SHARE + share * (
                1 - FULL_STAGE1_SHARE)
        self.percent = max(self.percent, min(99, int(99 * share)))
        return self.percent
