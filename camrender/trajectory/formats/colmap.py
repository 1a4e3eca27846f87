"""COLMAP text models: ``images.txt`` + ``cameras.txt`` (the pair `colmap model_converter
--output_type TXT` writes).

images.txt, per image, one line ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` -- the
world-to-camera rotation as a unit quaternion (Hamilton, scalar first) and translation,
OpenCV camera axes -- followed by one line of 2-D points (ignored; may be empty). Lines
starting with ``#`` are comments. cameras.txt, per camera: ``CAMERA_ID MODEL WIDTH HEIGHT
PARAMS...``; it is read from the folder of images.txt.

Frames are ordered by image name, numbers inside names compared as numbers
(``frame2.png`` before ``frame10.png``). COLMAP stores no time: the frame rate is 16 fps
(change it with `camrender traj retime --fps`).

Camera models: SIMPLE_PINHOLE (f cx cy) and PINHOLE (fx fy cx cy) are read exactly. The
perspective models with lens distortion -- SIMPLE_RADIAL, RADIAL, OPENCV, FULL_OPENCV --
are read as their pinhole part and the distortion coefficients are dropped with a
warning on stderr (the video model only knows pinhole cameras; a poorly undistorted lens
shows as slightly wrong framing near the borders). Fisheye and other models are
rejected: run `colmap image_undistorter`, which writes PINHOLE cameras. All images must
share one image size.

`write` produces images.txt at the given path and cameras.txt beside it (one PINHOLE
camera per distinct set of intrinsics, images named ``frame_00000.png``...).
"""
from __future__ import annotations

import os
import re

import click
import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory.formats.fileio import MAX_COLMAP_BYTES, atomic_output, read_text
from camrender.trajectory import rotations
from camrender.limits import check_count, check_image_side
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, Trajectory

NAME = "colmap"
FILENAMES = ("images.txt",)  # the names this format's files have by convention
SUFFIXES = (".txt",)
DESCRIPTION = "COLMAP text model: images.txt (+ cameras.txt beside it), pinhole cameras"

QUATERNION_NORM_TOL = 1e-2

# model name -> (number of parameters, function params -> (fx, fy, cx, cy, distortion coefficients))
_PERSPECTIVE_MODELS = {
    "SIMPLE_PINHOLE": (3, lambda p: (p[0], p[0], p[1], p[2], [])),
    "PINHOLE": (4, lambda p: (p[0], p[1], p[2], p[3], [])),
    "SIMPLE_RADIAL": (4, lambda p: (p[0], p[0], p[1], p[2], p[3:])),
    "RADIAL": (5, lambda p: (p[0], p[0], p[1], p[2], p[3:])),
    "OPENCV": (8, lambda p: (p[0], p[1], p[2], p[3], p[4:])),
    "FULL_OPENCV": (12, lambda p: (p[0], p[1], p[2], p[3], p[4:])),
}
_REJECTED_MODELS = {
    "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE", "OPENCV_FISHEYE", "FOV", "THIN_PRISM_FISHEYE", "RAD_TAN_THIN_PRISM_FISHEYE",
}


def natural_key(name: str):
    """Sort key comparing runs of digits as numbers: frame2 < frame10."""
    return [(0, int(part), part) if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _warn(message: str) -> None:
    click.echo(f"camrender: warning: {message}", err=True)


def _is_int(token: str) -> bool:
    return re.fullmatch(r"[+-]?\d+", token) is not None


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def sniff(text) -> bool:
    """True when the first data line looks like an images.txt image line
    (integer id, 7 numbers, integer camera id, a name)."""
    if not isinstance(text, str):
        return False
    for line in text.splitlines()[:50]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            if "image list" in stripped.lower() or "image_id, qw" in stripped.lower():
                return True
            continue
        tokens = stripped.split()
        return (
            len(tokens) >= 10
            and _is_int(tokens[0])
            and all(_is_float(t) for t in tokens[1:8])
            and _is_int(tokens[8])
            and not _is_float(tokens[9])
        )
    return False


def _paths(path) -> tuple[str, str]:
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "images.txt")
    return path, os.path.join(os.path.dirname(os.path.abspath(path)), "cameras.txt")


def _float(token: str, path, line: int, field: str) -> float:
    try:
        value = float(token)
    except ValueError:
        shown = token if len(token) <= 24 else token[:21] + "..."
        raise CamrenderError(f"expected a number, got {shown!r}", path=path, field=f"line {line}: {field}") from None
    if not np.isfinite(value):
        shown = token if len(token) <= 24 else token[:21] + "..."
        raise CamrenderError(f"must be a finite number, got {shown}", path=path, field=f"line {line}: {field}")
    return value


MAX_ID_DIGITS = 18  # ids and sizes fit an int64; a 5000-digit id is not one (Python's int() refuses past 4300)


def _int(token: str, path, line: int, field: str) -> int:
    shown = token if len(token) <= 24 else token[:21] + "..."
    if not _is_int(token):
        raise CamrenderError(f"expected an integer, got {shown!r}", path=path, field=f"line {line}: {field}")
    if len(token.lstrip("+-")) > MAX_ID_DIGITS:
        raise CamrenderError(f"integer of {len(token.lstrip('+-'))} digits, at most {MAX_ID_DIGITS}: {shown!r}",
                             path=path, field=f"line {line}: {field}")
    return int(token)


def read_cameras(path) -> dict[int, tuple[str, int, int, np.ndarray, int]]:
    """cameras.txt -> {camera_id: (model, width, height, [fx, fy, cx, cy], line)}; warns about dropped distortion."""
    if not os.path.exists(path):
        raise CamrenderError("not found (COLMAP intrinsics are read from cameras.txt beside images.txt)", path=path)
    cameras = {}
    distorted = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        tokens = line.split()
        if not tokens or tokens[0].startswith("#"):
            continue
        if len(tokens) < 4:
            raise CamrenderError(
                f"expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS..., got {len(tokens)} fields", path=path, field=f"line {number}"
            )
        camera_id = _int(tokens[0], path, number, "CAMERA_ID")
        model = tokens[1].upper()
        if model in _REJECTED_MODELS or model not in _PERSPECTIVE_MODELS:
            what = "a fisheye/non-pinhole model" if model in _REJECTED_MODELS else "an unknown model"
            raise CamrenderError(
                f"{tokens[1]} is {what}; undistort first (colmap image_undistorter writes PINHOLE cameras); "
                f"supported: {', '.join(_PERSPECTIVE_MODELS)}",
                path=path, field=f"line {number}: MODEL",
            )
        width = check_image_side(_int(tokens[2], path, number, "WIDTH"), f"line {number}: WIDTH", path=path)
        height = check_image_side(_int(tokens[3], path, number, "HEIGHT"), f"line {number}: HEIGHT", path=path)
        count, unpack = _PERSPECTIVE_MODELS[model]
        params = [_float(t, path, number, f"PARAMS[{i}]") for i, t in enumerate(tokens[4:])]
        if len(params) != count:
            raise CamrenderError(f"{model} takes {count} parameters, got {len(params)}", path=path, field=f"line {number}: PARAMS")
        fx, fy, cx, cy, distortion = unpack(params)
        for name, value in (("fx", fx), ("fy", fy)):
            if value <= 0:
                raise CamrenderError(f"focal length must be positive, got {value:g}", path=path, field=f"line {number}: {name}")
        if camera_id in cameras:
            raise CamrenderError(f"camera {camera_id} is defined twice (also on line {cameras[camera_id][4]})",
                                 path=path, field=f"line {number}: CAMERA_ID")
        if any(abs(k) > 0 for k in distortion):
            distorted.append(camera_id)
        cameras[camera_id] = (model, width, height, np.array([fx, fy, cx, cy]), number)
        if len(cameras) > MAX_FRAMES:  # (one camera per image at most is of use)
            check_count(len(cameras), MAX_FRAMES, "cameras", path=path, field=f"line {number}")
    if not cameras:
        raise CamrenderError("no cameras found", path=path)
    if distorted:
        _warn(f"{path}: lens distortion of camera(s) {', '.join(map(str, distorted))} ignored (read as pinhole)")
    return cameras


def read_images(path) -> list[tuple[str, np.ndarray, int, int]]:
    """images.txt -> [(name, w2c (4, 4), camera_id, line)] in file order."""
    lines = read_text(path, MAX_COLMAP_BYTES).splitlines()
    images = []
    index = 0
    while index < len(lines):
        number, stripped = index + 1, lines[index].strip()
        index += 1
        if not stripped or stripped.startswith("#"):
            continue
        tokens = stripped.split()
        if len(tokens) < 10:
            raise CamrenderError(
                f"expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME, got {len(tokens)} fields",
                path=path, field=f"line {number}",
            )
        _int(tokens[0], path, number, "IMAGE_ID")
        q = np.array([_float(t, path, number, name) for t, name in zip(tokens[1:5], ("QW", "QX", "QY", "QZ"))])
        t = np.array([_float(v, path, number, name) for v, name in zip(tokens[5:8], ("TX", "TY", "TZ"))])
        camera_id = _int(tokens[8], path, number, "CAMERA_ID")
        norm = float(np.linalg.norm(q))
        if abs(norm - 1) > QUATERNION_NORM_TOL:
            raise CamrenderError(f"quaternion (QW QX QY QZ) must have unit length, got length {norm:.4g}",
                                 path=path, field=f"line {number}: QW")
        w2c = np.eye(4)
        w2c[:3, :3] = rotations.quat_to_matrix(q / norm)
        w2c[:3, 3] = t
        images.append((" ".join(tokens[9:]), w2c, camera_id, number))
        if len(images) > MAX_FRAMES:
            check_count(len(images), MAX_FRAMES, "images", path=path, field=f"line {number}")
        index += 1  # the 2-D points line that follows every image line (possibly empty)
    if not images:
        raise CamrenderError("no images found", path=path)
    return images


def read(path) -> Trajectory:
    images_path, cameras_path = _paths(path)
    cameras = read_cameras(cameras_path)
    images = read_images(images_path)
    seen = {}
    for name, _, _, number in images:
        if name in seen:
            raise CamrenderError(f"image name {name!r} appears twice (also on line {seen[name]})",
                                 path=images_path, field=f"line {number}: NAME")
        seen[name] = number
    images.sort(key=lambda item: natural_key(item[0]))
    size = None
    c2w = np.empty((len(images), 4, 4))
    intrinsics = np.empty((len(images), 4))
    for frame, (name, w2c, camera_id, number) in enumerate(images):
        if camera_id not in cameras:
            raise CamrenderError(f"camera {camera_id} is not in cameras.txt", path=images_path, frame=frame,
                                 field=f"line {number}: CAMERA_ID")
        _, width, height, values, _ = cameras[camera_id]
        if size is None:
            size = (width, height)
        elif (width, height) != size:
            raise CamrenderError(
                f"camera {camera_id} is {width}x{height} but earlier frames are {size[0]}x{size[1]} "
                "(all frames must share one image size)",
                path=images_path, frame=frame, field=f"line {number}: CAMERA_ID",
            )
        c2w[frame] = rotations.invert_rigid(w2c)
        intrinsics[frame] = values
    return Trajectory(c2w, intrinsics, size[0], size[1], DEFAULT_FPS, source=images_path).validate()


def write(traj: Trajectory, path) -> list:
    """images.txt at `path`, cameras.txt beside it (PINHOLE cameras, one per distinct intrinsics);
    returns both paths."""
    images_path, cameras_path = _paths(path)
    camera_ids: dict[tuple, int] = {}
    camera_lines = ["# Camera list with one line of data per camera:",
                    "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]", "# written by camrender"]
    image_lines = ["# Image list with two lines of data per image:",
                   "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
                   "#   POINTS2D[] as (X, Y, POINT3D_ID)", "# written by camrender"]
    w2c = rotations.invert_rigid(traj.c2w)
    for frame in range(traj.num_frames):
        key = tuple(float(v) for v in traj.intrinsics[frame])
        if key not in camera_ids:
            camera_ids[key] = len(camera_ids) + 1
            camera_lines.append(f"{camera_ids[key]} PINHOLE {traj.width} {traj.height} " + " ".join(map(repr, key)))
        q = rotations.matrix_to_quat(w2c[frame, :3, :3])
        values = [*q, *w2c[frame, :3, 3]]
        image_lines.append(f"{frame + 1} " + " ".join(repr(float(v)) for v in values)
                           + f" {camera_ids[key]} frame_{frame:05d}.png")
        image_lines.append("")
    # both from temporary files, renamed once both are written: a full disk leaves neither, not half a model
    with atomic_output(images_path) as images, atomic_output(cameras_path) as cameras:
        cameras.write("\n".join(camera_lines) + "\n")
        images.write("\n".join(image_lines) + "\n")
    return [images_path, cameras_path]
