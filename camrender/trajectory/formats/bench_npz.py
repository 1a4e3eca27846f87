"""SANA-WM-Bench's per-scene camera file: `<scene_id>.npz` with "c2w" (F, 4, 4) OpenCV camera-to-world and
"intrinsics" (F, 3, 3) (or (3, 3)) in pixels of the scene's first-frame image as given, plus "fps" and "num_frames"
(`camrender.trajectory.formats.sana_wm_bench.read_camera` reads and checks it).

The image size the intrinsics refer to is the first-frame image's (`image_size`: renders and `--image` give it),
else the release render size with a note, as a pose `.npy`'s.

    camrender --traj SANA-WM-Bench/<split>/sanawm_export_v2/<scene_id>.npz --image SANA-WM-Bench/images/<scene_id>.png
"""
from __future__ import annotations

import os

from camrender.trajectory.formats.npy import DEFAULT_SIZE
from camrender.trajectory.formats.sana_wm_bench import read_camera
from camrender.trajectory.model import Trajectory

NAME = "sana-wm-bench"
SUFFIXES = (".npz",)
DESCRIPTION = "SANA-WM-Bench's <scene_id>.npz (c2w (F,4,4) OpenCV, intrinsics (F,3,3) in the image's pixels)"


def read(path, *, image_size=None, notes=None) -> Trajectory:
    """A Trajectory from a benchmark camera `.npz`; `image_size` (width, height): the image its intrinsics are in
    pixels of (None: the release size, with a note in `notes`)."""
    shown = os.fspath(path)
    c2w, intrinsics, fps = read_camera(shown)
    width, height = image_size or DEFAULT_SIZE
    if image_size is None and notes is not None:
        notes.append(f"{shown}: its intrinsics are taken as pixels of a {width}x{height} image (no first-frame "
                     "image gives the size: pass --image)")
    return Trajectory(c2w, intrinsics, width, height, fps, source=shown).validate()
