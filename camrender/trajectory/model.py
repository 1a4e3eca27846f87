"""The in-memory trajectory: per-frame OpenCV camera-to-world poses and pinhole intrinsics.

Every importer produces a `Trajectory`; every consumer (camera conditioning, plots,
renders) reads one. Units: poses in world units (whatever the source used), intrinsics
in pixels of ``width`` x ``height``, time in frames at ``fps`` frames per second.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from camrender.errors import CamrenderError
from camrender.limits import MAX_IMAGE_SIDE  # noqa: F401 (the format modules import it from here)
from camrender.limits import (MAX_FOV_DEG, MAX_PATH_FRAMES, MAX_POSITION, MIN_FOV_DEG, PRINCIPAL_POINT_MARGIN,
                              check_count, check_fps, check_image_side, check_seed)

# Tolerances for accepting a 4x4 pose matrix (values typed by hand or stored as float32).
ORTHONORMAL_TOL = 1e-3
BOTTOM_ROW_TOL = 1e-6
MAX_FRAMES = MAX_PATH_FRAMES  # every format's longest path (`camrender.limits`, the one place of the numbers)
DEFAULT_FPS = 16.0  # frame rate assumed when a file stores none


@dataclass(eq=False)  # arrays make field-wise == ambiguous; compare c2w/intrinsics explicitly
class Trajectory:
    """A camera path, one entry per video frame.

    Attributes:
        c2w: (F, 4, 4) float64 camera-to-world poses, OpenCV camera axes (+x right, +y down, +z forward).
        intrinsics: (F, 4) float64 ``[fx, fy, cx, cy]`` in pixels of ``width`` x ``height``.
        width, height: image size (pixels) the intrinsics refer to.
        fps: frames per second (float).
        prompt, negative_prompt: optional text for the render.
        image: absolute path of the first-frame image, or None.
        seed: optional integer seed for the render.
        source: path of the file this trajectory was read from, or None.
    """

    c2w: np.ndarray
    intrinsics: np.ndarray
    width: int
    height: int
    fps: float
    prompt: str | None = None
    negative_prompt: str | None = None
    image: str | None = None
    seed: int | None = None
    source: str | None = field(default=None, compare=False)

    def __post_init__(self):
        self.c2w = np.ascontiguousarray(np.asarray(self.c2w, dtype=np.float64))
        self.intrinsics = np.ascontiguousarray(np.asarray(self.intrinsics, dtype=np.float64))
        self.fps = float(self.fps)
        self.width = int(self.width)
        self.height = int(self.height)

    @property
    def num_frames(self) -> int:
        """Number of video frames F."""
        return int(self.c2w.shape[0])

    @property
    def duration(self) -> float:
        """Seconds from the first to the last frame: (F - 1) / fps."""
        return (self.num_frames - 1) / self.fps

    def validate(self) -> "Trajectory":
        """Check shapes, finiteness, rotations and focal lengths; raise CamrenderError naming the frame."""
        validate_arrays(self.c2w, self.intrinsics, path=self.source)
        where = dict(path=self.source)
        if self.width <= 0 or self.height <= 0:
            raise CamrenderError(f"image size must be positive, got {self.width}x{self.height}", field="width", **where)
        check_image_side(self.width, "width", path=self.source)
        check_image_side(self.height, "height", path=self.source)
        if not np.isfinite(self.fps) or self.fps <= 0:
            raise CamrenderError(f"must be a positive number, got {self.fps}", field="fps", **where)
        check_fps(self.fps, path=self.source)
        check_seed(self.seed, path=self.source)
        check_principal_points(self.intrinsics, self.width, self.height, path=self.source)
        return self

    def replace(self, **changes) -> "Trajectory":
        """A copy with some fields changed (arrays that are not replaced are copied)."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        for name in ("c2w", "intrinsics"):
            if name not in changes:
                values[name] = values[name].copy()
        return Trajectory(**values)


def validate_pose(matrix: np.ndarray, *, path=None, frame=None, field="c2w") -> None:
    """Raise CamrenderError unless ``matrix`` is a finite 4x4 rigid transform (rotation det +1)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4):
        raise CamrenderError(f"must be a 4x4 matrix, got shape {m.shape}", path=path, frame=frame, field=field)
    if not np.all(np.isfinite(m)):
        raise CamrenderError("contains a non-finite number", path=path, frame=frame, field=field)
    if np.max(np.abs(m[:3, 3])) > MAX_POSITION:
        raise CamrenderError(f"camera position {m[:3, 3].tolist()} is beyond {MAX_POSITION:g} units from the "
                             f"origin (rescale the path)", path=path, frame=frame, field=field)
    if np.max(np.abs(m[3] - [0.0, 0.0, 0.0, 1.0])) > BOTTOM_ROW_TOL:
        raise CamrenderError(f"last row must be [0, 0, 0, 1], got {m[3].tolist()}", path=path, frame=frame, field=field)
    r = m[:3, :3]
    error = float(np.max(np.abs(r.T @ r - np.eye(3))))
    if error > ORTHONORMAL_TOL:
        raise CamrenderError(
            f"rotation is not orthonormal (max |R^T R - I| = {error:.2g})", path=path, frame=frame, field=field
        )
    if np.linalg.det(r) < 0:
        raise CamrenderError("rotation has determinant -1 (a reflection)", path=path, frame=frame, field=field)


def validate_intrinsics(values: np.ndarray, *, path=None, frame=None) -> None:
    """Raise CamrenderError unless ``values`` = [fx, fy, cx, cy] are finite with fx, fy > 0."""
    for name, value in zip(("fx", "fy", "cx", "cy"), np.asarray(values, dtype=np.float64)):
        if not np.isfinite(value):
            raise CamrenderError(f"must be a finite number, got {value}", path=path, frame=frame, field=name)
        if name in ("fx", "fy") and value <= 0:
            raise CamrenderError(f"focal length must be positive, got {value:g}", path=path, frame=frame, field=name)


def check_principal_points(intrinsics: np.ndarray, width: int, height: int, *, path=None) -> None:
    """Raise CamrenderError (naming the frame) unless every (cx, cy) of (F, 4) `intrinsics` lies within
    PRINCIPAL_POINT_MARGIN image sizes of a `width` x `height` image and every focal length gives a
    field of view from MIN_FOV_DEG to MAX_FOV_DEG."""
    k = np.asarray(intrinsics, dtype=np.float64)
    for name, column, size in (("fx", 0, width), ("fy", 1, height)):
        shortest = size / (2 * math.tan(math.radians(MAX_FOV_DEG) / 2))
        longest = size / (2 * math.tan(math.radians(MIN_FOV_DEG) / 2))
        short = np.flatnonzero(k[:, column] < shortest)
        if len(short):
            frame = int(short[0])
            raise CamrenderError(f"focal length {k[frame, column]:g} gives a field of view over {MAX_FOV_DEG:g} "
                                 f"degrees on {size} pixels (at least {shortest:.3g})", path=path, frame=frame,
                                 field=name)
        long = np.flatnonzero(k[:, column] > longest)
        if len(long):
            frame = int(long[0])
            raise CamrenderError(f"focal length {k[frame, column]:g} gives a field of view under {MIN_FOV_DEG:g} "
                                 f"degrees on {size} pixels (at most {longest:.3g})", path=path, frame=frame,
                                 field=name)
    for name, column, size in (("cx", 2, width), ("cy", 3, height)):
        low, high = -PRINCIPAL_POINT_MARGIN * size, (1 + PRINCIPAL_POINT_MARGIN) * size
        outside = np.flatnonzero((k[:, column] < low) | (k[:, column] > high))
        if len(outside):
            frame = int(outside[0])
            raise CamrenderError(f"principal point {k[frame, column]:g} is far outside the {width}x{height} image "
                                 f"(allowed {low:g} to {high:g})", path=path, frame=frame, field=name)


def validate_arrays(c2w: np.ndarray, intrinsics: np.ndarray, *, path=None) -> None:
    """Validate (F, 4, 4) poses and (F, 4) intrinsics frame by frame."""
    c2w = np.asarray(c2w)
    intrinsics = np.asarray(intrinsics)
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4):
        raise CamrenderError(f"poses must have shape (F, 4, 4), got {c2w.shape}", path=path, field="c2w")
    if intrinsics.shape != (c2w.shape[0], 4):
        raise CamrenderError(
            f"intrinsics must have shape ({c2w.shape[0]}, 4), got {intrinsics.shape}", path=path, field="intrinsics"
        )
    if c2w.shape[0] == 0:
        raise CamrenderError("trajectory has no frames", path=path, field="frames")
    check_count(c2w.shape[0], MAX_PATH_FRAMES, "frames", path=path, field="frames")
    for index in range(c2w.shape[0]):
        validate_pose(c2w[index], path=path, frame=index)
        validate_intrinsics(intrinsics[index], path=path, frame=index)


def trajectory_digest(traj) -> str:
    """sha256 of the path a render follows (and a score is measured against): poses, intrinsics, image size, fps."""
    digest = hashlib.sha256()
    for array in (traj.c2w, traj.intrinsics):
        digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    digest.update(json.dumps([traj.width, traj.height, float(traj.fps)]).encode())
    return digest.hexdigest()
