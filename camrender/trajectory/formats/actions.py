"""Action strings, as NVlabs' SANA-WM CLI and diffusers' pipeline take them: ``"w-100,dw-60"``.

Grammar (the same in both): whitespace is ignored and a full-width comma counts as a comma;
comma-separated segments ``<keys>-<frames>``; keys are any of ``wasdijkl`` (case-insensitive,
held together), ``none`` or nothing; frames a positive integer. N action frames give N+1
poses (the first is the identity), OpenCV axes.

What the keys do depends on the control scheme (`camrender.trajectory.controls`): the default
"sana-wm" (NVlabs' current one: a/d yaw, j/l strafe, 0.025 units and 0.6 deg per frame, smoothed)
or "diffusers" (diffusers 0.42.1's: a/d strafe, j/l yaw, 0.05 units and 1.2 deg, not smoothed).
"""
from __future__ import annotations

import math
import os

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import read_text
from camrender.trajectory.controls import ControlScheme, make_scheme, rollout
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory

NAME = "actions"
SUFFIXES = (".actions", ".txt")
DESCRIPTION = "action string like 'w-100,dw-60' (SANA-WM keys wasd/ijkl; --action-scheme sana-wm or diffusers)"

KEYS = frozenset("wasdijkl")
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


def actions_to_c2w(action: str, path=None, scheme: ControlScheme | None = None) -> np.ndarray:
    """Roll out (N+1, 4, 4) float64 OpenCV c2w poses from an action string (`scheme`: default "sana-wm")."""
    return rollout(scheme if scheme is not None else make_scheme(), parse_actions(action, path))


def from_string(action: str, *, width=None, height=None, fps=None, fov=None, path=None, scheme=None) -> Trajectory:
    """A Trajectory from an action string; the lens is a centred pinhole with horizontal ``fov`` degrees.
    fps: the scheme's (16) unless given."""
    width = width or DEFAULTS["width"]
    height = height or DEFAULTS["height"]
    fov = fov or DEFAULTS["fov"]
    scheme = scheme if scheme is not None else make_scheme()
    c2w = actions_to_c2w(action, path, scheme)
    focal = 0.5 * width / math.tan(math.radians(fov) / 2)
    intrinsics = np.tile([focal, focal, width / 2, height / 2], (len(c2w), 1))
    source = None if path is None else str(path)
    return Trajectory(c2w, intrinsics, width, height, fps or scheme.fps, source=source).validate()


def read(path, **options) -> Trajectory:
    """Read a file whose text is an action string (lines starting with # are comments)."""
    text = read_text(path)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return from_string(body, path=os.fspath(path), **options)
