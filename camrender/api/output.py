"""A render written to disk: the mp4 (one file written to a temporary name and renamed, or one file per segment with
checkpoints in segment mode) and its side files (`write_video`), as `camrender.api.requests.prepare_output`
decided before the model loaded."""
from __future__ import annotations

import itertools
import sys
from typing import Callable, Optional

from camrender import trajectory
from camrender.api.requests import PreparedOutput
from camrender.errors import CamrenderError
from camrender.render.loop import render_frames
from camrender.render.pipeline import loaded_with, pipeline_settings
from camrender.render.request import check_request
from camrender.render.resume import Checkpointer, partial_folder
from camrender.output.segment_video import SegmentVideoWriter
from camrender.output.targets import claim_output, companion_path
from camrender.render.settings_file import checkpoint_settings, write_render_json
from camrender.output.video import VideoWriter


def write_companions(request, ran: Optional[dict] = None) -> list:
    """`VIDEO.traj.json` (the resolved trajectory), `VIDEO.render.json` (every setting plus the path:
    `--from-render` renders the same video; `ran`: what ran, `RenderSettings.record()`) and `VIDEO.path.png` (a
    plot that fails is a warning on stderr, not a failed render); returns the paths written."""
    written = [companion_path(request.out, ".traj.json"), companion_path(request.out, ".render.json")]
    try:
        trajectory.save(request.traj, written[0])
        write_render_json(request, written[1], ran)
    except CamrenderError as error:  # (a full disk) the video is whole: say so, and what is missing
        raise CamrenderError(f"wrote the video, but not its side files: {error}", path=request.out) from None
    try:  # lazy: matplotlib is optional, and the plot module imports it at its top
        from camrender.views.plot import plot_trajectory
    except ImportError:
        return written
    plot = companion_path(request.out, ".path.png")
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
    with claim_output(request.out):  # (nests in `prepared`'s claim: held since before the model loaded)
        return _write_as_leader(pipe, request, prepared, settings, progress, log, side_files, check)


def _write_as_leader(pipe, request, prepared, settings, progress, log, side_files, check) -> tuple:
    """`write_video`'s work on the rank that writes the files."""
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
