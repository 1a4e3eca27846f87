"""Progress of a render as users of batch schedulers, `nohup` and terminals expect it.

`make_progress(style, unit)` returns a `Progress` callable, `progress(done, total, info="", stage="stage 1",
unit="")` (`camrender.render.request`):

- "bar": a click progress bar per stage on stderr (a terminal);
- "lines": plain lines on stderr, one per segment, and per denoising step at most one every
  `LINE_INTERVAL_S` seconds (plus a stage's first and last), each with the stage, the counts, the rate
  and the ETA, e.g. `camrender: stage 1: step 3/10 (30 %), 0.52 steps/s, ETA 13 s`;
- "auto": "bar" when stderr is a terminal, else "lines";
- "none" (or --quiet): nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

import click

from camrender.cli.signals import raise_if_signalled

STYLES = ("auto", "bar", "lines", "none")
LINE_INTERVAL_S = 5.0  # at most one line per this many seconds for denoising steps


def count(number: int, noun: str) -> str:
    """`count(1, "frame")` -> "1 frame", `count(3, "frame")` -> "3 frames"."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def duration(seconds: float) -> str:
    """12.3 -> "12 s", 125 -> "2 min 05 s", 7300 -> "2 h 01 min"."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def resolve_style(style: str, quiet: bool = False, stream=None) -> str:
    """"bar", "lines" or "none" for --progress `style` and --quiet (auto: bar on a terminal)."""
    if quiet or style == "none":
        return "none"
    if style == "auto":
        stream = sys.stderr if stream is None else stream
        return "bar" if getattr(stream, "isatty", lambda: False)() else "lines"
    return style


class _Stage:
    """Counts of one stage (a stage name and a total): when it started and what was done before."""

    def __init__(self, name: str, total: int, started: float, done_before: int, unit: str):
        self.name, self.total, self.started, self.done_before, self.unit = name, total, started, done_before, unit

    def rate(self, done: int, now: float) -> Optional[float]:
        elapsed = now - self.started
        return (done - self.done_before) / elapsed if elapsed > 0 and done > self.done_before else None


class StageProgress:
    """`progress(done, total, info="", stage="stage 1", unit="")` drawing bars or writing lines on `stream`
    ("none": only the signal check every progress call makes, `camrender.cli.signals`).

    unit: what `done` counts ("step", "segment", "job"; a call's own `unit` wins). interval: seconds between lines (0: every
    call). delay: no lines before this many seconds from the start (work done sooner says nothing). A new stage
    (name or total changes) starts a new bar and resets the rate; a resumed render's first call (done > 1) counts
    only what this run did in the rate.
    """

    def __init__(self, style: str, unit: str, *, stream=None, interval: float = LINE_INTERVAL_S, delay: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.style, self.unit, self.interval, self.clock = style, unit, interval, clock
        self.quiet_until = clock() + delay
        self.stream = sys.stderr if stream is None else stream
        self.stage = None
        self.bar = None
        self.bar_done = 0
        self.info = ""
        self.last_line = self.last_done = None
        self.last_call = clock()

    def __call__(self, done: int, total: int, info: str = "", stage: str = "stage 1", unit: str = "") -> None:
        raise_if_signalled()
        if self.style == "none":
            return
        now = self.clock()
        if self.stage is None or (self.stage.name, self.stage.total) != (stage, total):
            self._close_bar()
            # the stage began when the previous one last reported (or this reporter was made)
            self.stage = _Stage(stage, total, self.last_call, max(0, done - 1) if self.stage is None else 0,
                                unit or self.unit)
            self.last_line, self.last_done = None, None
        self.last_call = now
        if self.style == "bar":
            self._bar(done, total, info)
        elif self.style == "lines":
            # a repeated count (segment mode's refiner hands out the clip's last block with the last
            # segment's count) says nothing new
            repeated = done == self.last_done
            due = self.last_line is None or done >= total or now - self.last_line >= self.interval
            if due and not repeated and now >= self.quiet_until:
                self.last_line, self.last_done = now, done
                click.echo(self.line(done, total, info, now), file=self.stream)
                self.stream.flush()

    def line(self, done: int, total: int, info: str, now: float) -> str:
        """`camrender: stage 1: step 3/10 (30 %), 0.52 steps/s, ETA 13 s[, info]`."""
        unit = self.stage.unit
        parts = [f"{unit} {done}/{total} ({100 * done // max(total, 1)} %)"]
        rate = self.stage.rate(done, now)
        if rate is not None:
            per = f"{rate:.2f} {unit}s/s" if rate >= 0.1 else f"{1 / rate:.1f} s/{unit}"
            parts.append(per)
            parts.append("done" if done >= total else f"ETA {duration((total - done) / rate)}")
        if info:
            parts.append(info)
        return f"camrender: {self.stage.name}: " + ", ".join(parts)

    def _bar(self, done: int, total: int, info: str) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=f"{self.stage.name}: {self.stage.unit}s", file=self.stream,
                                         show_pos=True, item_show_func=lambda _: self.info or None)
            self.bar.__enter__()
            self.bar_done = 0
        self.info = info
        self.bar.update(max(0, done - self.bar_done))
        self.bar_done = done

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def close(self) -> None:
        self._close_bar()


def make_progress(style: str, unit: str, *, quiet: bool = False, stream=None) -> StageProgress:
    """A `StageProgress` for --progress `style` / --quiet counting `unit`s.
    Segments and jobs get a line each; denoising steps one per LINE_INTERVAL_S."""
    resolved = resolve_style(style, quiet, stream)
    return StageProgress(resolved, unit, stream=stream, interval=LINE_INTERVAL_S if unit == "step" else 0.0)
