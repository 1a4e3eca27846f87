"""Which frames are scored: every `interval`-th frame of the path and of the video, less frame 0 when the
benchmark's skip-first-frame rule says so, and the check that the video and the path have the same length.

The rule (NVlabs' `eval_benchmark_poses.py --skip_first_frame auto`): a refiner rewrites frames 1..T-1 and
leaves frame 0 a copy of the input image, whose pose is trivially right, so with a refiner frame 0 is not
scored. "auto" asks whether the video was refined: camrender's `NAME.render.json` beside the video (its
`settings.refiner`), else the benchmark's `method_info.json` in the folder above the video's (a "refiner"
key). Sampling follows the evaluator: path frames 0, k, 2k, ... (k = interval), the first dropped when
skipping. A video one frame shorter than its path while skipping is taken to have had its frame 0 removed
already (the benchmark's stripped copies): its frame j is the path's frame j + 1. Any other difference in
length is an error.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from camrender.errors import CamrenderError

SKIP_CHOICES = ("auto", "yes", "no")
MIN_POSES = 3  # the alignment fits a rotation, a translation and a scale: fewer poses fit anything
METHOD_INFO = "method_info.json"


@dataclass(frozen=True)
class FramePlan:
    """The scored frames: path_indices[i] of the path is video_indices[i] of the video."""

    path_indices: np.ndarray
    video_indices: np.ndarray
    skip_first_frame: bool
    interval: int

    def __len__(self) -> int:
        return len(self.path_indices)


def render_json_beside(video) -> str:
    """camrender's side file of a rendered `NAME.mp4`: `NAME.render.json`."""
    return os.path.splitext(os.fspath(video))[0] + ".render.json"


def _json_object(path):
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def skips_first_frame(choice: str, video) -> tuple[bool, str]:
    """(skip frame 0?, why) for --skip-first-frame `choice` ("auto", "yes", "no") and the video at `video`."""
    if choice not in SKIP_CHOICES:
        raise CamrenderError(f"must be one of {', '.join(SKIP_CHOICES)}, got {choice!r}", field="skip-first-frame")
    if choice != "auto":
        return choice == "yes", f"--skip-first-frame {choice}"
    render_json = _json_object(render_json_beside(video))
    if render_json is not None and isinstance(render_json.get("settings"), dict):
        refiner = render_json["settings"].get("refiner")
        refined = bool(refiner) and refiner != "none"
        return refined, f"{os.path.basename(render_json_beside(video))}: refiner {refiner!r}"
    method_dir = os.path.dirname(os.path.dirname(os.path.abspath(video)))
    method_info = _json_object(os.path.join(method_dir, METHOD_INFO))
    if method_info is not None:
        refined = bool(method_info.get("refiner"))
        return refined, f"{METHOD_INFO}: {'a' if refined else 'no'} refiner"
    return False, f"no {os.path.basename(render_json_beside(video))} or ../{METHOD_INFO}: not refined"


def frame_plan(video_frames: int, path_frames: int, interval: int, skip_first_frame: bool, *, video=None,
               path=None) -> FramePlan:
    """The scored frames of a video of `video_frames` frames against a path of `path_frames` poses (module
    docstring). CamrenderError, naming `path` (the path's file) or `video`, for fewer than MIN_POSES poses, an
    interval below 1, lengths that differ, or fewer than MIN_POSES frames left to score."""
    if path_frames < MIN_POSES:
        raise CamrenderError(f"has {path_frames} poses; scoring needs at least {MIN_POSES}", path=path, field="c2w")
    if interval < 1:
        raise CamrenderError(f"must be at least 1, got {interval}", field="interval")
    path_indices = np.arange(0, path_frames, interval)
    if skip_first_frame:
        path_indices = path_indices[1:]
    if video_frames == path_frames:
        offset = 0
    elif skip_first_frame and video_frames == path_frames - 1:
        offset = 1  # frame 0 already stripped
    else:
        stripped = " or, its frame 0 removed, one fewer" if skip_first_frame else ""
        named = f" ({os.fspath(path)})" if path else ""
        raise CamrenderError(f"has {video_frames} frames, its path{named} {path_frames}: they must match{stripped} "
                             f"(camrender writes a render's path beside it as NAME.traj.json)", path=video,
                             field="frames")
    if len(path_indices) < MIN_POSES:
        raise CamrenderError(f"{interval} leaves {len(path_indices)} of {path_frames} frames to score; at least "
                             f"{MIN_POSES} are needed", field="interval")
    return FramePlan(path_indices, path_indices - offset, skip_first_frame, interval)
