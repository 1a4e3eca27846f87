"""Summary numbers of a trajectory (what `camrender traj check` prints)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from camrender.trajectory.model import Trajectory


@dataclass
class PathStats:
    num_frames: int
    fps: float
    duration: float  # seconds, (F - 1) / fps
    path_length: float  # world units, sum of frame-to-frame camera centre distances
    fov_h: tuple[float, float]  # (min, max) horizontal field of view, degrees
    fov_v: tuple[float, float]  # (min, max) vertical field of view, degrees
    max_move: float  # largest frame-to-frame translation, world units
    max_move_frame: int  # frame that ends that step
    max_turn: float  # largest frame-to-frame rotation angle, degrees
    max_turn_frame: int


def rotation_angles(c2w: np.ndarray) -> np.ndarray:
    """(F-1,) angle in degrees between consecutive camera rotations of (F, 4, 4) poses."""
    r = np.asarray(c2w)[:, :3, :3]
    relative = np.einsum("fji,fjk->fik", r[:-1], r[1:])  # R_f^T R_{f+1}
    cos = (np.trace(relative, axis1=1, axis2=2) - 1.0) / 2.0
    axis = np.stack(
        [relative[:, 2, 1] - relative[:, 1, 2], relative[:, 0, 2] - relative[:, 2, 0], relative[:, 1, 0] - relative[:, 0, 1]],
        axis=1,
    )
    sin = np.linalg.norm(axis, axis=1) / 2.0
    return np.degrees(np.arctan2(sin, cos))  # atan2: exact near 0, unlike arccos


def fields_of_view(intrinsics, width: float, height: float) -> tuple[np.ndarray, np.ndarray]:
    """Horizontal and vertical field of view in degrees of (F, 4) fx, fy, cx, cy intrinsics on a
    width x height image, each (F,): exact for an off-centre principal point (the angle from the
    optical axis to the left edge plus to the right edge)."""
    k = np.asarray(intrinsics, dtype=float)
    fx, fy, cx, cy = k[:, 0], k[:, 1], k[:, 2], k[:, 3]
    hfov = np.degrees(np.arctan(cx / fx) + np.arctan((width - cx) / fx))
    vfov = np.degrees(np.arctan(cy / fy) + np.arctan((height - cy) / fy))
    return hfov, vfov


def compute(traj: Trajectory) -> PathStats:
    centres = traj.c2w[:, :3, 3]
    steps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
    turns = rotation_angles(traj.c2w)
    fov_h, fov_v = fields_of_view(traj.intrinsics, traj.width, traj.height)
    has_steps = len(steps) > 0
    return PathStats(
        num_frames=traj.num_frames,
        fps=traj.fps,
        duration=traj.duration,
        path_length=float(steps.sum()),
        fov_h=(float(fov_h.min()), float(fov_h.max())),
        fov_v=(float(fov_v.min()), float(fov_v.max())),
        max_move=float(steps.max()) if has_steps else 0.0,
        max_move_frame=int(np.argmax(steps)) + 1 if has_steps else 0,
        max_turn=float(turns.max()) if has_steps else 0.0,
        max_turn_frame=int(np.argmax(turns)) + 1 if has_steps else 0,
    )


def fmt_number(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}" if math.isfinite(x) else str(x)


def fmt_length(x: float, digits: int = 4) -> str:
    """A length in world units, `digits` significant: "1 unit", "2.5 units"."""
    shown = fmt_number(x, digits)
    return f"{shown} unit" if shown == "1" else f"{shown} units"
