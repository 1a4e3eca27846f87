"""RealEstate10K / CameraCtrl camera files (.txt).

Line 1: the source video URL (any text). Then one line per frame with 19 numbers:
``timestamp_us fx fy cx cy 0 0 r00 r01 r02 t0 r10 r11 r12 t1 r20 r21 r22 t2`` --
intrinsics normalised by the image width (fx, cx) and height (fy, cy), then the
3x4 world-to-camera matrix, row-major, OpenCV axes.

The files do not store the image size. We assume 1280x720 (the 16:9 of the source
videos) unless line 1 is ``camrender:WIDTHxHEIGHT`` (what `write` puts there), so
pixel intrinsics keep the source's field of view. fps comes from the timestamps.
"""
from __future__ import annotations

import os
import re

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import atomic_write_text, read_text
from camrender.trajectory import rotations
from camrender.limits import check_count, check_image_side
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory, validate_pose

NAME = "realestate10k"
SUFFIXES = (".txt",)
DESCRIPTION = "RealEstate10K / CameraCtrl .txt (normalised intrinsics, w2c 3x4 per line)"

DEFAULT_SIZE = (1280, 720)
_HEADER = re.compile(r"^camrender:(\d{1,7})x(\d{1,7})$")


def _numbers(line: str):
    try:
        return [float(x) for x in line.split()]
    except ValueError:
        return None


def sniff(text) -> bool:
    """True when some line holds 19 numbers."""
    return isinstance(text, str) and any(
        (values := _numbers(line)) is not None and len(values) == 19 for line in text.splitlines()[:3]
    )


def read(path, width: int | None = None, height: int | None = None) -> Trajectory:
    path = os.fspath(path)
    lines = read_text(path).splitlines()
    size = DEFAULT_SIZE
    rows, line_numbers = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        values = _numbers(line)
        if number == 1 and (values is None or len(values) != 19):
            match = _HEADER.match(line.strip())
            if match:
                size = tuple(check_image_side(int(match.group(i)), f"line 1: {name}", path=path)
                             for i, name in ((1, "width"), (2, "height")))
            continue  # the URL line
        field = f"line {number}"
        if values is None or len(values) != 19:
            got = "text" if values is None else f"{len(values)} numbers"
            raise CamrenderError(f"expected 19 numbers (timestamp, fx fy cx cy, 0 0, 3x4 w2c), got {got}",
                                 path=path, frame=len(rows), field=field)
        if not np.all(np.isfinite(values)):
            raise CamrenderError("contains a non-finite number", path=path, frame=len(rows), field=field)
        rows.append(values)
        line_numbers.append(number)
        if len(rows) > MAX_FRAMES:
            check_count(len(rows), MAX_FRAMES, "camera lines", path=path, field=field)
    if not rows:
        raise CamrenderError("no camera lines found", path=path)
    width, height = width or size[0], height or size[1]
    data = np.array(rows, dtype=np.float64)
    times = data[:, 0]
    for i in range(1, len(times)):
        if times[i] <= times[i - 1]:
            raise CamrenderError(f"timestamps must increase ({times[i]:.0f} after {times[i - 1]:.0f})",
                                 path=path, frame=i, field=f"line {line_numbers[i]}: timestamp")
    fps = DEFAULT_FPS if len(times) < 2 else round(1e6 * (len(times) - 1) / (times[-1] - times[0]), 3)
    if not np.isfinite(fps) or fps <= 0:
        raise CamrenderError("timestamps give no usable frame rate", path=path, field="timestamp")
    intrinsics = data[:, 1:5] * [width, height, width, height]
    w2c = np.tile(np.eye(4), (len(rows), 1, 1))
    w2c[:, :3, :4] = data[:, 7:19].reshape(-1, 3, 4)
    for i in range(len(rows)):
        validate_pose(w2c[i], path=path, frame=i, field=f"line {line_numbers[i]}: w2c")
        for j, name in enumerate(("fx", "fy")):
            if intrinsics[i, j] <= 0:
                raise CamrenderError(f"focal length must be positive, got {data[i, 1 + j]:g}",
                                     path=path, frame=i, field=f"line {line_numbers[i]}: {name}")
    c2w = rotations.invert_rigid(w2c)
    return Trajectory(c2w, intrinsics, width, height, fps, source=path).validate()


def write(traj: Trajectory, path) -> None:
    """Write the RealEstate10K text; line 1 records the image size for `read`."""
    w2c = rotations.invert_rigid(traj.c2w)
    scale = np.array([traj.width, traj.height, traj.width, traj.height], dtype=np.float64)
    lines = [f"camrender:{traj.width}x{traj.height}"]
    for i in range(traj.num_frames):
        timestamp = int(round(i * 1e6 / traj.fps))
        values = [*(traj.intrinsics[i] / scale), 0.0, 0.0, *w2c[i, :3, :4].reshape(-1)]
        lines.append(" ".join([str(timestamp), *(repr(float(v)) for v in values)]))
    atomic_write_text(path, "\n".join(lines) + "\n")
