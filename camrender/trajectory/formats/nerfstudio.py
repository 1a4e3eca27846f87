"""nerfstudio camera paths (``camera_path.json``, as written by the nerfstudio viewer).

Fields used: ``render_width``, ``render_height``, ``fps`` (or ``seconds``), ``camera_type``
(only "perspective"), and ``camera_path``: a list of ``{"camera_to_world": 16 numbers
(4x4 row-major, OpenGL camera axes: +x right, +y up, +z backward), "fov": vertical
field of view in degrees, "aspect": ...}``. Other fields are ignored on read.

nerfstudio stores a single vertical fov per frame and a centred principal point: on
export fy sets the fov, and fx, cx, cy are not kept.
"""
from __future__ import annotations

import math
import os

import numpy as np

from camrender.limits import check_count, check_fov, focal_for_fov
from camrender.trajectory.formats.fileio import atomic_write_text, dump_json, read_json
from camrender.trajectory import rotations
from camrender.trajectory.fields import Where, integer, number, require_object, string, type_name
from camrender.trajectory.model import MAX_FRAMES, MAX_IMAGE_SIDE, Trajectory, validate_pose

NAME = "nerfstudio"
SUFFIXES = (".json",)
DESCRIPTION = "nerfstudio camera_path.json (OpenGL c2w, vertical fov)"


# Top-level keys only nerfstudio's viewer writes: a file with them but no camera_path is a broken
# nerfstudio file (its reader names the missing field), not a v1 file without a version.
NERFSTUDIO_KEYS = ("render_width", "render_height", "camera_type", "smoothness_value", "is_cycle")


def sniff(doc) -> bool:
    return isinstance(doc, dict) and ("camera_path" in doc
                                      or ("version" not in doc and any(key in doc for key in NERFSTUDIO_KEYS)))


def _matrix(value, where: Where) -> np.ndarray:
    if isinstance(value, list) and len(value) == 4 and all(isinstance(r, list) and len(r) == 4 for r in value):
        value = [x for row in value for x in row]
    if not isinstance(value, list) or len(value) != 16:
        got = f"{len(value)} numbers" if isinstance(value, list) else type_name(value)
        raise where.error(f"must be 16 numbers (4x4 row-major), got {got}")
    return np.array([number(x, where) for x in value], dtype=np.float64).reshape(4, 4)


def read(path) -> Trajectory:
    path = os.fspath(path)
    where = Where(path)
    doc = require_object(read_json(path), where)
    for key in ("camera_path", "render_width", "render_height"):
        if key not in doc:
            raise where.at(key).error("missing required field")
    width = integer(doc["render_width"], where.at("render_width"), minimum=1, maximum=MAX_IMAGE_SIDE)
    height = integer(doc["render_height"], where.at("render_height"), minimum=1, maximum=MAX_IMAGE_SIDE)
    camera_type = doc.get("camera_type", "perspective")
    if string(camera_type, where.at("camera_type")) != "perspective":
        raise where.at("camera_type").error(f"only 'perspective' cameras are supported, got {camera_type!r}")
    frames = doc["camera_path"]
    if not isinstance(frames, list) or not frames:
        raise where.at("camera_path").error("must be a non-empty list of cameras")
    check_count(len(frames), MAX_FRAMES, "cameras", path=path, field="camera_path")
    if "fps" in doc:
        fps = number(doc["fps"], where.at("fps"), positive=True)
    elif "seconds" in doc:
        fps = len(frames) / number(doc["seconds"], where.at("seconds"), positive=True)
    else:
        raise where.at("fps").error("missing required field (or 'seconds')")
    c2w = np.empty((len(frames), 4, 4))
    intrinsics = np.empty((len(frames), 4))
    for i, camera in enumerate(frames):
        at = Where(path, i)
        camera = require_object(camera, at)
        for key in ("camera_to_world", "fov"):
            if key not in camera:
                raise at.at(key).error("missing required field")
        gl = _matrix(camera["camera_to_world"], at.at("camera_to_world"))
        validate_pose(gl, path=path, frame=i, field="camera_to_world")
        c2w[i] = rotations.flip_camera_axes(gl)
        fov = check_fov(number(camera["fov"], at.at("fov"), positive=True), "fov", path=path, frame=i)
        focal = focal_for_fov(height, fov)
        intrinsics[i] = [focal, focal, width / 2, height / 2]
    return Trajectory(c2w, intrinsics, width, height, fps, source=path).validate()


def write(traj: Trajectory, path) -> None:
    gl = rotations.flip_camera_axes(traj.c2w)
    cameras = [
        {
            "camera_to_world": [float(v) for v in gl[i].reshape(-1)],
            "fov": math.degrees(2 * math.atan(0.5 * traj.height / traj.intrinsics[i, 1])),
            "aspect": traj.width / traj.height,
        }
        for i in range(traj.num_frames)
    ]
    doc = {
        "camera_type": "perspective",
        "render_width": traj.width,
        "render_height": traj.height,
        "fps": traj.fps,
        "seconds": traj.num_frames / traj.fps,
        "smoothness_value": 0.0,
        "is_cycle": False,
        "crop": None,
        "keyframes": [],
        "camera_path": cameras,
    }
    atomic_write_text(path, dump_json(doc))
