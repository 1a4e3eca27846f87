"""A render written to disk: the mp4 (one file written to a temporary name and renamed, or one file per segment with
checkpoints in segment mode) and its side files (`write_video`), as `camrender.api.requests.prepare_output`
decided before the model loaded."""
from __future__ import annotations

import itertools
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional

from camrender import trajectory
from camrender.api.requests import PreparedOutput, resume_refusal
from camrender.files import remove_quietly, temporaries_of
from camrender.render.loop import render_frames
from camrender.render.pipeline import loaded_with, pipeline_settings
from camrender.render.request import check_request
from camrender.render.resume import CHECKPOINT_NAME, OWNER_NAME, Checkpointer, partial_folder
from camrender.output.segment_video import SegmentVideoWriter
from camrender.render.settings_file import checkpoint_settings, write_render_json
from camrender.output.video import VideoWriter

SIDE_FILE_SUFFIXES = (".traj.json", ".render.json", ".path.png")  # VIDEO.traj.json, ... (`write_companions`)


def companion_path(video: Path, suffix: str) -> Path:
    """`out/orbit.mp4` -> `out/orbit<suffix>` (e.g. ".traj.json", ".path.png")."""
    return video.with_name(video.stem + suffix) if video.suffix else video.with_name(video.name + suffix)


def clear_killed_render(request) -> bool:
    """Remove what a render of `request` whose process was killed left (no render may still be writing them): the
    temporary files of its video and side files and, in segment mode, its partial folder, unless that holds a
    checkpoint `request` can resume from (`resume_refusal`): then only the dead owner's mark goes. Returns whether
    the checkpoint is kept (the render continues from it with `resume`)."""
    out = Path(request.out)
    for target in (out, *(companion_path(out, suffix) for suffix in SIDE_FILE_SUFFIXES)):
        for path in temporaries_of(target):
            remove_quietly(path)
    folder = partial_folder(out)
    if (folder / CHECKPOINT_NAME).is_file() and request.mode == "segments" and resume_refusal(request) is None:
        remove_quietly(folder / OWNER_NAME)
        return True
    shutil.rmtree(folder, ignore_errors=True)
    return False


def write_companions(request, ran: Optional[dict] = None) -> list:
    """`VIDEO.traj.json` (the resolved trajectory), `VIDEO.render.json` (every setting plus the path:
    `--from-render` renders the same video; `ran`: what ran, `RenderSettings.record()`) and `VIDEO.path.png` (a
    plot that fails is a warning on stderr, not a failed render); returns the paths written."""
    traj_json, render_json, plot = (companion_path(request.out, suffix) for suffix in SIDE_FILE_SUFFIXES)
    written = [traj_json, render_json]
    trajectory.save(request.traj, written[0])
    write_render_json(request, written[1], ran)
    try:  # lazy: matplotlib is optional, and the plot module imports it at its top
        from camrender.views.plot import plot_trajectory
    except ImportError:
        return written
    try:  # the video is finished: a plot that cannot be drawn is a warning, never a failed render
        plot_trajectory(request.traj, plot)
    except Exception as error:  # noqa: BLE001 - matplotlib can fail in many ways
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        print(f"camrender: warning: no {plot.name}: {reason}", file=sys.stderr)
        return written
    return written + [plot]


def write_video(pipe, request, prepared: PreparedOutput, progress=None, *, log=None, side_files: bool = True,
                check: Optional[Callable[[], None]] = None) -> tuple:
    """Render `request` with `pipe` into `request.out` and its side files: (frames written, side files).

    Segment mode writes checkpoints every `prepared.checkpoint_every` seconds and continues from
    `prepared.resume_info`. The other ranks of a video group render along and write nothing: (0, []).
    side_files: write them (needs `request.traj`); check: called before each chunk is written (the CLI raises
    there on Ctrl-C / SIGTERM).
    """
    settings = pipeline_settings(pipe, request)
    check_request(pipe, request, loaded_with(pipe))
    if not settings.is_leader:
        for _ in render_frames(pipe, request, progress):
            pass
        return 0, []
    video, checkpoints = video_output(request, prepared.resume_info, prepared.checkpoint_every)
    chunks = render_frames(pipe, request, progress, checkpoints=checkpoints)
    if settings.shares_video:
        # The temporary video appears with the first frames: by then the ranks of a split render
        # have finished their collectives, so a rank that fails before leaves no file behind.
        first = next(chunks, None)
        chunks = itertools.chain([] if first is None else [first], chunks)
    completed = False
    try:
        with video:
            for frames in chunks:
                if check is not None:
                    check()
                video.append(frames)
        completed = True
    finally:
        if checkpoints is not None:
            checkpoints.finish(completed)
            if not completed and checkpoints.saved and log is not None:
                log(f"the render can continue from its checkpoint: rerun the same command with --resume "
                    f"(or remove {checkpoints.folder})")
    return video.frames_written, write_companions(request, settings.record()) if side_files else []


def video_output(request, resume_info, checkpoint_every: float):
    """(video writer, checkpointer or None): full mode writes one mp4 atomically; segment mode
    one file per segment in the partial folder, with checkpoints (`camrender.render.resume`)."""
    if request.mode != "segments":
        return VideoWriter(request.out, fps=request.fps), None
    checkpoints = Checkpointer(partial_folder(request.out), checkpoint_settings(request), every=checkpoint_every,
                               resume_info=resume_info)
    video = SegmentVideoWriter(request.out, request.fps, checkpoints.folder, first_segment=checkpoints.first_segment,
                               frames_before=checkpoints.frames_before)
    return video, checkpoints
