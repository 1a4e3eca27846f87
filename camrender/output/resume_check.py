"""What `--resume` verifies before it trusts an interrupted render's partial folder, before the model loads
(`check_resume`): the folder itself and the checkpoint's settings (`camrender.render.resume.check_partials`),
then the checkpoint (whole, every tensor as its tree recorded, the classes it names, its position) and every
segment file before it (a whole mp4 of the frames and size its segment must hold). A folder that does not
verify is rendered again from the start, with a note saying why.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from camrender.errors import CamrenderError
from camrender.limits import TIME_STRIDE
from camrender.model.stage1.recipes import get_recipe, segment_bounds
from camrender.output.mp4_check import Mp4Error, read_summary
from camrender.output.segment_video import segment_path
from camrender.render.resume import CHECKPOINT_NAME, check_partials, partial_folder, start_over


def check_resume(request, resume: bool, log) -> Optional[dict]:
    """`check_partials`, then (with a checkpoint to resume from) `resume_problem`: the checkpoint info to resume
    from, or None (start from the beginning: nothing to resume, or a folder that did not verify, removed with a
    note to `log`)."""
    info = check_partials(request, resume, log)
    if info is None:
        return None
    folder = partial_folder(request.out)
    problem = resume_problem(folder, folder / CHECKPOINT_NAME, info, request)
    if problem is None:
        return info
    start_over(folder, problem, log)
    return None


def planned_bounds(request) -> list:
    """[[start, stop], ...] latent-frame ranges of `request`'s segments, as the segment loop cuts them."""
    chunk = request.segment_frames or get_recipe(request.recipe).chunk_frames
    latent_frames = (request.num_frames - 1) // TIME_STRIDE + 1
    return [list(bound) for bound in segment_bounds(latent_frames, chunk)]


def resume_problem(folder: Path, checkpoint: Path, info: dict, request) -> Optional[str]:
    """Why the checkpoint `checkpoint` (its metadata `info`) and the segment files in `folder` cannot continue
    `request`, or None when every piece verifies."""
    # lazy: the checks of a checkpoint's tree live with the code that writes it, the frame counts with the
    # decoder that makes them (both import torch)
    from camrender.render.decode import video_frames_for_latents
    from camrender.render.state_io import check_tree, skeleton_value

    try:
        skeleton = check_tree(checkpoint)
        position, bounds = skeleton_value(skeleton, "next_segment"), skeleton_value(skeleton, "bounds")
    except (CamrenderError, KeyError, TypeError, ValueError) as error:
        return getattr(error, "detail", None) or f"{type(error).__name__}: {error}"
    if bounds != planned_bounds(request):
        return "it was made with another segment layout"
    if position != info["next_segment"] or len(bounds) != info["segments"]:
        return "its tree and its metadata disagree on the position"
    if not 0 < position < len(bounds):
        return f"it is at segment {position} of {len(bounds)}"
    frames = 0
    for index in range(position):
        expected = video_frames_for_latents(*bounds[index], TIME_STRIDE)
        problem = _segment_problem(segment_path(folder, index), expected, request)
        if problem:
            return f"segment file {index}: {problem}"
        frames += expected
    if frames != info["frames_written"]:
        return f"its segments hold {frames} frames, its metadata says {info['frames_written']}"
    return None


def _segment_problem(path: Path, frames: int, request) -> Optional[str]:
    """Why the segment file `path` is not a whole mp4 of `frames` frames of the request's size, or None."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return "not a regular file"
        summary = read_summary(path)
    except FileNotFoundError:
        return "missing"
    except (OSError, Mp4Error, CamrenderError) as error:
        return getattr(error, "detail", None) or str(error)
    if summary.fragmented or summary.frames != frames:
        return f"{summary.frames} frames, its segment has {frames}"
    if (summary.height, summary.width) != (request.height, request.width):
        return f"{summary.width}x{summary.height}, the render is {request.width}x{request.height}"
    return None
