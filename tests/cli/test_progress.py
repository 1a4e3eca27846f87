"""Progress a log can read: lines (stage, counts, rate, ETA) when stderr is no terminal, at most one per
LINE_INTERVAL_S for denoising steps and one per segment; --progress and --quiet."""
import io
from pathlib import Path

import pytest

from camrender.cli.progress import LINE_INTERVAL_S, StageProgress, count, duration, make_progress, resolve_style
from helpers import run_cli as run

ORBIT = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"
SMALL = ["--model", "tiny", "--frames", "9", "--height", "32", "--width", "32", "--kernels", "torch"]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def lines_of(stream):
    return stream.getvalue().splitlines()


def test_step_lines_are_throttled_and_name_stage_rate_and_eta():
    clock, stream = Clock(), io.StringIO()
    progress = StageProgress("lines", "step", stream=stream, interval=LINE_INTERVAL_S, clock=clock)
    for step in range(1, 21):  # a step every second
        clock.now += 1.0
        progress(step, 20, stage="stage 1")
    lines = lines_of(stream)
    # the first, then one per 5 s, and the last
    assert [line.split(": ")[2].split(" (")[0] for line in lines] == ["step 1/20", "step 6/20", "step 11/20",
                                                                     "step 16/20", "step 20/20"]
    assert lines[1] == "camrender: stage 1: step 6/20 (30 %), 1.00 steps/s, ETA 14 s"
    assert lines[-1].endswith("done")


def test_delayed_lines_keep_quick_work_silent(tmp_path, capsys):
    """With a delay, work finished sooner writes no line (`traj preview` without a terminal: only its result)."""
    clock, stream = Clock(), io.StringIO()
    progress = StageProgress("lines", "frame", stream=stream, delay=LINE_INTERVAL_S, clock=clock)
    for frame in range(1, 33):  # 32 frames in 4 s
        clock.now += 0.125
        progress(frame, 32, stage="preview")
    assert lines_of(stream) == []
    slow = StageProgress("lines", "frame", stream=stream, delay=LINE_INTERVAL_S, clock=clock)
    for frame in range(1, 73):  # 72 frames in 9 s: a line at 5 s, and the last
        clock.now += 0.125
        slow(frame, 72, stage="preview")
    assert [line.split(": ")[2].split(" (")[0] for line in lines_of(stream)] == ["frame 40/72", "frame 72/72"]
    code, out, err = run(["traj", "preview", ORBIT, "-o", tmp_path / "p.mp4", "--width", "32"], capsys)
    assert code == 0 and err == "" and out.startswith(f"wrote {tmp_path / 'p.mp4'}: 161 frames")


def test_a_new_stage_restarts_counts_and_rate_and_keeps_its_unit():
    clock, stream = Clock(), io.StringIO()
    progress = StageProgress("lines", "step", stream=stream, interval=0.0, clock=clock)
    clock.now += 10
    progress(1, 1, stage="stage 1")
    clock.now += 0.5
    progress(1, 2, stage="stage 2 (refiner)", unit="block")
    clock.now += 0.5
    progress(2, 2, stage="stage 2 (refiner)", unit="block")
    assert lines_of(stream) == ["camrender: stage 1: step 1/1 (100 %), 0.10 steps/s, done",
                                "camrender: stage 2 (refiner): block 1/2 (50 %), 2.00 blocks/s, ETA 0 s",
                                "camrender: stage 2 (refiner): block 2/2 (100 %), 2.00 blocks/s, done"]


def test_segment_lines_one_each_and_a_repeated_count_is_not_repeated():
    clock, stream = Clock(), io.StringIO()
    progress = StageProgress("lines", "segment", stream=stream, interval=0.0, clock=clock)
    for done in (4, 5, 5):  # a resumed render (3 done before) whose refiner hands out the last block twice
        clock.now += 60
        progress(done, 5, "frames", stage="stage 1", unit="segment")
    lines = lines_of(stream)
    assert lines == ["camrender: stage 1: segment 4/5 (80 %), 60.0 s/segment, ETA 1 min 00 s, frames",
                     "camrender: stage 1: segment 5/5 (100 %), 60.0 s/segment, done, frames"]


def test_styles():
    tty, pipe = io.StringIO(), io.StringIO()
    tty.isatty = lambda: True
    assert resolve_style("auto", stream=tty) == "bar" and resolve_style("auto", stream=pipe) == "lines"
    assert resolve_style("bar", quiet=True) == "none" and resolve_style("none") == "none"
    stream = io.StringIO()
    make_progress("none", "step", stream=stream)(1, 2)
    assert stream.getvalue() == ""
    assert (count(1, "frame"), count(2, "frame"), count(0, "job")) == ("1 frame", "2 frames", "0 jobs")
    assert (duration(12.4), duration(125), duration(7300)) == ("12 s", "2 min 05 s", "2 h 01 min")


@pytest.mark.parametrize("extra, stage_lines, other_lines", [
    ([], 2, ["camrender: loading tiny", "camrender: wrote"]),  # no terminal: lines (first and last of 3 steps)
    (["--progress", "none"], 0, ["camrender: loading tiny", "camrender: wrote"]),
    (["--quiet"], 0, []),
])
def test_render_progress_without_a_terminal(tmp_path, capsys, extra, stage_lines, other_lines):
    # an empty prompt cache of its own: a cache hit of an earlier test would add its note to the lines
    code, out, err = run(["--traj", ORBIT, "--out", tmp_path / "v.mp4", *SMALL, "--steps", "3",
                          "--prompt-cache", tmp_path / "cache", *extra], capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "re-timed" not in line]
    stages = [line for line in lines if line.startswith("camrender: stage 1: step ")]
    assert len(stages) == stage_lines, err
    assert all("steps/s" in line or "s/step" in line for line in stages)
    assert [line for line in lines if line not in stages and not line.startswith("camrender: re-timed")] == [
        line for line in lines if any(line.startswith(start) for start in other_lines)]
    assert len(lines) - len(stages) == len(other_lines), err
