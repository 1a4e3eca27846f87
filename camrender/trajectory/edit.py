"""Whole-path edits: join two paths end to start (`concat`) and resample one in time (`retime`).

Both return new `Trajectory` objects and leave their inputs untouched.
"""
from __future__ import annotations

import math

import numpy as np

from camrender.errors import CamrenderError
from camrender.limits import check_fps
from camrender.trajectory import Trajectory
from camrender.trajectory.model import MAX_FRAMES
from camrender.trajectory.resample import resample_frames
from camrender.trajectory.rotations import invert_rigid

_ASPECT_TOL = 1e-3


def concat(first: Trajectory, second: Trajectory) -> Trajectory:
    """`second` continued from the end pose of `first`.

    Every pose of `second` is moved by the same rigid transform, ``first.c2w[-1] @
    inv(second.c2w[0])``, so its first pose lands exactly on `first`'s last pose; that
    shared frame is kept once (F1 + F2 - 1 frames). World units are not rescaled.
    `second`'s intrinsics are rescaled to `first`'s image size when the aspect ratios match.
    The frame rates must be equal (retime one of them first). Prompt, negative prompt,
    image and seed come from `first` (each falls back to `second`'s when `first` has none).
    """
    where = dict(path=second.source)
    if abs(first.fps - second.fps) > 1e-9 * max(first.fps, second.fps):
        raise CamrenderError(
            f"has {second.fps:g} fps but the first path has {first.fps:g} fps; "
            f"run `camrender traj retime --fps {first.fps:g}` on it first",
            field="fps", **where,
        )
    intrinsics = np.array(second.intrinsics, dtype=np.float64)
    if (second.width, second.height) != (first.width, first.height):
        aspect_first, aspect_second = first.width / first.height, second.width / second.height
        if abs(aspect_first / aspect_second - 1) > _ASPECT_TOL:
            raise CamrenderError(
                f"image size {second.width}x{second.height} has another aspect ratio than the first path's "
                f"{first.width}x{first.height}",
                field="width", **where,
            )
        intrinsics[:, [0, 2]] *= first.width / second.width
        intrinsics[:, [1, 3]] *= first.height / second.height
    rebase = first.c2w[-1] @ invert_rigid(second.c2w[0])
    moved = rebase @ second.c2w[1:]
    moved[:, 3] = [0.0, 0.0, 0.0, 1.0]
    c2w = np.concatenate([first.c2w, moved])
    merged = np.concatenate([first.intrinsics, intrinsics[1:]])
    if len(c2w) > MAX_FRAMES:
        raise CamrenderError(f"the joined path would have {len(c2w)} frames (at most {MAX_FRAMES})", **where)

    def pick(name):
        value = getattr(first, name)
        return value if value is not None else getattr(second, name)

    return Trajectory(
        c2w, merged, first.width, first.height, first.fps,
        prompt=pick("prompt"), negative_prompt=pick("negative_prompt"), image=pick("image"), seed=pick("seed"),
        source=None,
    )


def retime(traj: Trajectory, *, fps: float | None = None, seconds: float | None = None,
           position: str = "spline") -> Trajectory:
    """Resample `traj` in time.

    fps: new frame rate (default: unchanged). seconds: new duration (default: unchanged).
    The result has M = round(seconds * fps) + 1 frames at `fps`; its frames are spread
    evenly over the whole original path, so the first and last poses are kept exactly and
    the duration is `seconds` within half a frame (M is an integer). Positions follow a C1
    Hermite spline through the original frames ("spline") or straight segments
    ("linear"); rotations slerp; focal lengths interpolate in tan(fov/2).
    """
    new_fps = traj.fps if fps is None else fps
    if not (isinstance(new_fps, (int, float)) and math.isfinite(new_fps) and new_fps > 0):
        raise CamrenderError(f"must be a positive number, got {new_fps}", path=traj.source, field="fps")
    check_fps(new_fps, path=traj.source)
    if seconds is None:
        seconds = traj.duration
    elif not (math.isfinite(seconds) and seconds > 0):
        raise CamrenderError(f"must be a positive number, got {seconds}", path=traj.source, field="seconds")
    span = seconds * new_fps  # frame steps; checked as a float first (1e308 s is no frame count)
    if not span + 1 <= MAX_FRAMES:
        raise CamrenderError(f"{seconds:g} s at {new_fps:g} fps is {span + 1:.4g} frames (at most {MAX_FRAMES})",
                             path=traj.source, field="seconds")
    count = int(round(span)) + 1
    if count < 2 and seconds > 0:  # a duration asked for must keep at least one frame step
        raise CamrenderError(f"{seconds:g} s at {new_fps:g} fps is less than one frame step (at least "
                             f"{0.5 / new_fps:.3g} s)", path=traj.source, field="seconds")
    return resample_frames(traj, count, position).replace(fps=float(new_fps), source=None)
