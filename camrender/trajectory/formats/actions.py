"""Action strings as in diffusers' SANA-WM pipeline: ``"w-80,jw-40"``.

Grammar (same as ``diffusers.pipelines.sana_wm.cam_utils``): whitespace is ignored and a
full-width comma counts as a comma; comma-separated segments ``<keys>-<frames>``; keys
are any of ``wasdijkl`` (case-insensitive, held together), ``none`` or nothing; frames a positive
integer. Each frame applies, in order: pitch (i up, k down, 1.2 deg/frame, pitch kept
within +-85 deg: a step that would leave the range is dropped), yaw (l right, j left,
about the world vertical axis), then a move of 0.05 units on the world horizontal
(x-z) plane along the new view direction (w forward, s back, d right, a left).
N action frames give N+1 poses (the first is the identity). OpenCV axes.
"""
from __future__ import annotations

import math
import os

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import read_text
from camrender.trajectory import rotations
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory

NAME = "actions"
SUFFIXES = (".actions", ".txt")
DESCRIPTION = "action string like 'w-80,jw-40' (diffusers SANA-WM keys wasd/ijkl)"

KEYS = frozenset("wasdijkl")
TRANSLATION_SPEED = 0.05
ROTATION_SPEED_DEG = 1.2
PITCH_LIMIT_DEG = 85.0
DEFAULTS = {"width": 1280, "height": 704, "fps": DEFAULT_FPS, "fov": 60.0}


def sniff(text) -> bool:
    """True when the text parses as an action string."""
    if not isinstance(text, str) or not text.strip():
        return False
    try:
        parse_actions(text)
    except CamrenderError:
        return False
    return True


def parse_actions(action: str, path=None) -> list[frozenset]:
    """The held keys for every action frame; CamrenderError naming the bad segment."""
    cleaned = "".join(action.replace("\uff0c", ",").split())
    if not cleaned:
        raise CamrenderError("action string is empty", path=path, field="actions")
    frames: list[frozenset] = []
    for index, segment in enumerate(cleaned.split(",")):
        shown = segment if len(segment) <= 24 else segment[:21] + "..."
        field = f"segment {index + 1} ({shown!r})"
        if "-" not in segment:
            raise CamrenderError("expected '<keys>-<frames>', e.g. 'w-80'", path=path, field=field)
        keys, count = segment.split("-", 1)  # keys never hold "-": "w--5" is a bad count, not key "-"
        if not (count.isascii() and count.isdigit()) or len(count) > 9 or int(count) <= 0:
            shown_count = count if len(count) <= 12 else count[:9] + "..."
            raise CamrenderError(f"frame count must be a positive integer, got {shown_count!r}", path=path, field=field)
        if len(frames) + int(count) > MAX_FRAMES:
            raise CamrenderError(f"more than {MAX_FRAMES} frames", path=path, field=field)
        keys = keys.lower()
        if keys == "none":
            held = frozenset()
        else:
            bad = sorted(set(keys) - KEYS)
            if bad:
                raise CamrenderError(
                    f"unknown keys {''.join(bad)}; use any of wasdijkl or 'none'", path=path, field=field
                )
            held = frozenset(keys)
        frames.extend([held] * int(count))
    return frames


def actions_to_c2w(action: str, path=None) -> np.ndarray:
    """Roll out (N+1, 4, 4) float64 OpenCV c2w poses from an action string."""
    step = math.radians(ROTATION_SPEED_DEG)
    limit = math.radians(PITCH_LIMIT_DEG)
    pose = np.eye(4)
    poses = [pose.copy()]
    pitch = 0.0
    for held in parse_actions(action, path):
        pitch_delta = (step if "i" in held else 0.0) - (step if "k" in held else 0.0)
        if -limit <= pitch + pitch_delta <= limit:
            pitch += pitch_delta
        else:
            pitch_delta = 0.0
        yaw_delta = (step if "l" in held else 0.0) - (step if "j" in held else 0.0)
        # yaw about the world vertical axis (left multiply), pitch about the camera x axis (right multiply)
        rotation = rotations.rot_y(yaw_delta) @ pose[:3, :3] @ rotations.rot_x(pitch_delta)
        move = np.zeros(3)
        for axis_column, plus, minus in ((2, "w", "s"), (0, "d", "a")):
            direction = rotation[:, axis_column].copy()
            direction[1] = 0.0
            norm = np.linalg.norm(direction)
            if norm > 0:
                direction /= norm
            move += direction * TRANSLATION_SPEED * ((plus in held) - (minus in held))
        new = np.eye(4)
        new[:3, :3] = rotation
        new[:3, 3] = pose[:3, 3] + move
        pose = new
        poses.append(pose.copy())
    return np.stack(poses)


def from_string(action: str, *, width=None, height=None, fps=None, fov=None, path=None) -> Trajectory:
    """A Trajectory from an action string; the lens is a centred pinhole with horizontal ``fov`` degrees."""
    width = width or DEFAULTS["width"]
    height = height or DEFAULTS["height"]
    fov = fov or DEFAULTS["fov"]
    c2w = actions_to_c2w(action, path)
    focal = 0.5 * width / math.tan(math.radians(fov) / 2)
    intrinsics = np.tile([focal, focal, width / 2, height / 2], (len(c2w), 1))
    source = None if path is None else str(path)
    return Trajectory(c2w, intrinsics, width, height, fps or DEFAULTS["fps"], source=source).validate()


def read(path, **options) -> Trajectory:
    """Read a file whose text is an action string (lines starting with # are comments)."""
    text = read_text(path)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return from_string(body, path=os.fspath(path), **options)
