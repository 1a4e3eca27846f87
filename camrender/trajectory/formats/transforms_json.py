"""instant-ngp / nerfstudio ``transforms.json``.

A JSON object with a ``frames`` list; each frame has ``transform_matrix``, the 4x4
camera-to-world matrix with OpenGL camera axes (+x right, +y up, +z backward), which is
turned into OpenCV axes (c2w @ diag(1, -1, -1, 1)). Intrinsics in pixels, top level or
per frame (a frame's value wins): ``fl_x``, ``fl_y``, ``cx``, ``cy``, ``w``, ``h``; or
``camera_angle_x`` / ``camera_angle_y`` (full field of view in radians) instead of
``fl_x`` / ``fl_y``. Missing ``fl_y`` = ``fl_x`` (or from ``camera_angle_y``), missing
``cx``/``cy`` = image centre. Without ``w``/``h`` (the NeRF synthetic scenes) the size
is read from the header of the first image found on disk (``file_path`` relative to the
JSON, trying ``.png`` and ``.jpg`` when it has no suffix). All frames must share one
image size.

``camera_model`` PINHOLE, SIMPLE_PINHOLE or OPENCV (or absent) are accepted; distortion
coefficients (``k1 k2 k3 k4 p1 p2``) are dropped with a warning on stderr; fisheye and
equirectangular models are rejected. Other keys (``aabb_scale``, ``scale``, ``offset``,
``applied_transform``, ...) are ignored: poses are used exactly as stored.

Frames are ordered by ``file_path`` (numbers inside names compared as numbers) when every
frame has one, as nerfstudio does; otherwise in file order. The frame rate is ``fps``
when present (camrender writes it), else 16.
"""
from __future__ import annotations

import functools
import math
import os

import numpy as np

from camrender.limits import check_count, check_fov, check_image_side, focal_for_fov
from camrender.trajectory.formats.colmap import _warn, natural_key
from camrender.trajectory.formats.fileio import atomic_write_text, dump_json, read_json
from camrender.trajectory.fields import Where, matrix4, number, string
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory, validate_pose
from camrender.trajectory.rotations import flip_camera_axes

NAME = "transforms_json"
FILENAMES = ("transforms.json",)  # the names this format's files have by convention
SUFFIXES = (".json",)
DESCRIPTION = "instant-ngp / nerfstudio transforms.json (OpenGL c2w per frame)"

_INTRINSIC_KEYS = ("fl_x", "fl_y", "cx", "cy", "w", "h", "camera_angle_x", "camera_angle_y")
_DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")
_ACCEPTED_MODELS = ("PINHOLE", "SIMPLE_PINHOLE", "OPENCV")


def sniff(doc) -> bool:
    """True for an object (without camrender's ``version``) with a ``frames`` list whose first
    entry has a ``transform_matrix``, or with transforms.json camera keys at the top level."""
    if not isinstance(doc, dict) or "version" in doc or "camera_path" in doc:
        return False
    frames = doc.get("frames")
    if not isinstance(frames, list):
        return False
    if frames and isinstance(frames[0], dict) and "transform_matrix" in frames[0]:
        return True
    return any(key in doc for key in _INTRINSIC_KEYS)


def _image_size_from_file(doc_dir: str, file_path, where: Where):
    """(w, h) read from the image header, or None when the image is not there."""
    if not isinstance(file_path, str):
        return None
    candidate = os.path.join(doc_dir, file_path)
    options = [candidate] if os.path.splitext(candidate)[1] else [candidate + ".png", candidate + ".jpg", candidate]
    for option in options:
        if os.path.isfile(option):
            try:
                # lazy: keeps the `traj` commands free of PIL unless a file names its images
                from PIL import Image

                with Image.open(option) as image:
                    return image.size
            except Exception as error:  # unreadable image: say which
                raise where.error(f"cannot read the image size from {option}: {error}") from None
    return None


def _value(frame: dict, doc: dict, key: str, where: Where, frame_where: Where, **checks):
    if key in frame:
        return number(frame[key], frame_where.at(key), **checks)
    if key in doc:
        return number(doc[key], where.at(key), **checks)
    return None


def _side(frame: dict, doc: dict, key: str, where: Where, frame_where: Where):
    """The image width or height `key` ("w", "h") of a frame (its own, else the top level's), or None."""
    value = _value(frame, doc, key, where, frame_where, positive=True)
    if value is not None:
        at = (frame_where if key in frame else where).at(key)
        check_image_side(value, at.field, path=at.path, frame=at.frame)
    return value


def read(path) -> Trajectory:
    path = os.fspath(path)
    doc = read_json(path)
    where = Where(path)
    if not isinstance(doc, dict):
        raise where.error("must be a JSON object with a 'frames' list")
    frames = doc.get("frames")
    if not isinstance(frames, list) or not frames:
        raise where.at("frames").error("missing or empty: expected a list of frames with 'transform_matrix'")
    check_count(len(frames), MAX_FRAMES, "frames", path=path, field="frames")
    model = doc.get("camera_model")
    if model is not None:
        string(model, where.at("camera_model"))
        if model.upper() not in _ACCEPTED_MODELS:
            raise where.at("camera_model").error(
                f"{model} is not a pinhole camera (accepted: {', '.join(_ACCEPTED_MODELS)}); undistort the images first"
            )
    fps = number(doc["fps"], where.at("fps"), positive=True) if "fps" in doc else DEFAULT_FPS

    entries = []
    for index, frame in enumerate(frames):
        frame_where = Where(path, index, f"frames[{index}]")
        if not isinstance(frame, dict):
            raise frame_where.error("must be an object with a 'transform_matrix'")
        if "transform_matrix" not in frame:
            raise frame_where.at("transform_matrix").error("missing required field")
        entries.append((index, frame, frame_where))
    if all(isinstance(frame.get("file_path"), str) for _, frame, _ in entries):
        entries.sort(key=lambda entry: natural_key(entry[1]["file_path"]))

    doc_dir = os.path.dirname(os.path.abspath(path))

    @functools.cache
    def file_size():
        """(w, h) of the first frame whose image file is present (or None); read at most once."""
        for _, frame, frame_where in entries:
            found = _image_size_from_file(doc_dir, frame.get("file_path"), frame_where.at("file_path"))
            if found is not None:
                return found
        return None

    size = None
    distorted = False
    c2w = np.empty((len(entries), 4, 4))
    intrinsics = np.empty((len(entries), 4))
    for out, (index, frame, frame_where) in enumerate(entries):
        w = _side(frame, doc, "w", where, frame_where)
        h = _side(frame, doc, "h", where, frame_where)
        if w is None or h is None:
            found = file_size()
            if found is None:
                raise frame_where.at("w" if w is None else "h").error(
                    "image size missing: give 'w' and 'h' (pixels), or keep the frame's image at its file_path"
                )
            w, h = w or found[0], h or found[1]
        if size is None:
            size = (w, h)
        elif (w, h) != size:
            raise frame_where.at("w").error(
                f"image size {w:g}x{h:g} differs from the first frame's {size[0]:g}x{size[1]:g}"
            )
        fx = _value(frame, doc, "fl_x", where, frame_where, positive=True)
        fy = _value(frame, doc, "fl_y", where, frame_where, positive=True)
        for key, extent, current in (("camera_angle_x", w, fx), ("camera_angle_y", h, fy)):
            if current is None:
                angle = _value(frame, doc, key, where, frame_where, positive=True)
                if angle is not None:
                    at = (frame_where if key in frame else where).at(key)
                    if angle >= math.pi:
                        raise at.error(f"field of view must be below pi radians, got {angle:g} (is it in degrees?)")
                    check_fov(angle, at.field, path=at.path, frame=at.frame, unit="radians")
                    value = focal_for_fov(extent, math.degrees(angle))
                    fx, fy = (value, fy) if key == "camera_angle_x" else (fx, value)
        if fx is None and fy is None:
            raise frame_where.at("fl_x").error("focal length missing: give 'fl_x' (pixels) or 'camera_angle_x' (radians)")
        fx = fx if fx is not None else fy
        fy = fy if fy is not None else fx
        cx = _value(frame, doc, "cx", where, frame_where)
        cy = _value(frame, doc, "cy", where, frame_where)
        intrinsics[out] = [fx, fy, w / 2 if cx is None else cx, h / 2 if cy is None else cy]
        for key in _DISTORTION_KEYS:
            value = _value(frame, doc, key, where, frame_where)
            distorted |= value is not None and value != 0
        matrix_where = frame_where.at("transform_matrix")
        gl = matrix4(frame["transform_matrix"], matrix_where)
        validate_pose(gl, path=path, frame=index, field=f"frames[{index}].transform_matrix")
        c2w[out] = flip_camera_axes(gl)
    if distorted:
        _warn(f"{path}: lens distortion coefficients ignored (read as pinhole)")
    width, height = size
    if not (float(width).is_integer() and float(height).is_integer()):
        raise where.at("w").error(f"image size must be whole pixels, got {width:g}x{height:g}")
    return Trajectory(c2w, intrinsics, int(width), int(height), fps, source=path).validate()


def write(traj: Trajectory, path) -> None:
    """transforms.json with OpenGL c2w per frame; shared intrinsics at top level when constant."""
    gl = flip_camera_axes(traj.c2w)
    constant = bool(np.all(traj.intrinsics == traj.intrinsics[0]))
    doc = {"camera_model": "PINHOLE", "w": traj.width, "h": traj.height, "fps": traj.fps}
    if constant:
        doc.update(zip(("fl_x", "fl_y", "cx", "cy"), (float(v) for v in traj.intrinsics[0])))
    frames = []
    for index in range(traj.num_frames):
        frame = {"file_path": f"images/frame_{index:05d}.png"}
        if not constant:
            frame.update(zip(("fl_x", "fl_y", "cx", "cy"), (float(v) for v in traj.intrinsics[index])))
        frame["transform_matrix"] = [[float(v) for v in row] for row in gl[index]]
        frames.append(frame)
    doc["frames"] = frames
    atomic_write_text(path, dump_json(doc))
