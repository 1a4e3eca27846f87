"""camrender trajectory format v1 (JSON): parse a document into a Trajectory, and write one back.

A document holds exactly one of ``frames`` (one pose + intrinsics per video frame),
``keyframes`` (interpolated to frames at ``fps``) or ``preset`` (expanded to keyframes by
`camrender.trajectory.presets`). See docs/trajectory-format.md for the full description.
"""
from __future__ import annotations

import math
import os

import numpy as np

from camrender.trajectory import interpolate, rotations
from camrender.trajectory.fields import (
    Where,
    check_keys,
    integer,
    matrix4,
    number,
    require_object,
    string,
    vector,
)
from camrender.limits import MAX_SEED, MIN_SEED, check_fov, focal_for_fov
from camrender.trajectory import presets
from camrender.trajectory.model import MAX_FRAMES, MAX_IMAGE_SIDE, Trajectory, validate_intrinsics, validate_pose

VERSION = 1
AXES = ("opencv", "opengl")
POSES = ("c2w", "w2c")
FOV_AXES = ("horizontal", "vertical")
DEFAULT_UP = {"opencv": [0.0, -1.0, 0.0], "opengl": [0.0, 1.0, 0.0]}

COMMON_KEYS = {"version", "width", "height", "fps", "convention", "prompt", "negative_prompt", "image", "seed", "comment"}
BODY_KEYS = ("frames", "keyframes", "preset")


class Convention:
    """How matrices in the document are written: camera axes and pose direction."""

    def __init__(self, axes="opencv", pose="c2w"):
        self.axes, self.pose = axes, pose

    def to_opencv_c2w(self, matrix: np.ndarray) -> np.ndarray:
        m = rotations.invert_rigid(matrix) if self.pose == "w2c" else matrix
        return rotations.flip_camera_axes(m) if self.axes == "opengl" else m


def _convention(doc: dict, where: Where) -> Convention:
    if "convention" not in doc:
        return Convention()
    block = require_object(doc["convention"], where.at("convention"))
    check_keys(block, where.at("convention"), {"axes", "pose"})
    axes = string(block.get("axes", "opencv"), where.at("convention.axes"), choices=AXES)
    pose = string(block.get("pose", "c2w"), where.at("convention.pose"), choices=POSES)
    return Convention(axes, pose)


def _pose_matrix(entry: dict, convention: Convention, where: Where) -> np.ndarray:
    """Read the pose matrix (key named after the convention) and return it as OpenCV c2w."""
    key = convention.pose
    other = "w2c" if key == "c2w" else "c2w"
    if other in entry:
        raise where.at(other).error(f"the convention block says pose={key}: name this field {key!r}")
    if key not in entry:
        raise where.at(key).error("missing required field")
    raw = matrix4(entry[key], where.at(key))
    validate_pose(raw, path=where.path, frame=where.frame, field=where.at(key).field)
    return convention.to_opencv_c2w(raw)


def _metadata(doc: dict, where: Where) -> dict:
    """prompt, negative_prompt, image (absolute), seed."""
    out = {}
    for key in ("prompt", "negative_prompt"):
        if key in doc:
            out[key] = string(doc[key], where.at(key))
    if "image" in doc:
        image = string(doc["image"], where.at("image"))
        if not image:
            raise where.at("image").error("must be a file path, got an empty string")
        base = os.path.dirname(os.path.abspath(str(where.path))) if where.path is not None else os.getcwd()
        try:
            image = os.path.abspath(os.path.join(base, image))
        except ValueError as error:  # e.g. an embedded NUL byte
            raise where.at("image").error(f"invalid path: {error}") from None
        if not os.path.isfile(image):
            problem = "not a regular file" if os.path.exists(image) else "file not found"
            raise where.at("image").error(f"{problem}: {image}")
        out["image"] = image
    if "seed" in doc:
        out["seed"] = integer(doc["seed"], where.at("seed"), minimum=MIN_SEED, maximum=MAX_SEED)
    if "comment" in doc:
        string(doc["comment"], where.at("comment"))
    return out


def _image_size(doc: dict, where: Where) -> tuple[int, int, float]:
    """The required width, height (pixels) and fps of a frames/keyframes document."""
    for key in ("width", "height", "fps"):
        if key not in doc:
            raise where.at(key).error("missing required field")
    width = integer(doc["width"], where.at("width"), minimum=1, maximum=MAX_IMAGE_SIDE)
    height = integer(doc["height"], where.at("height"), minimum=1, maximum=MAX_IMAGE_SIDE)
    return width, height, number(doc["fps"], where.at("fps"), positive=True)


def parse_document(doc, path=None) -> Trajectory:
    """Turn a parsed v1 JSON document into a validated Trajectory; CamrenderError on any problem."""
    where = Where(path)
    doc = require_object(doc, where)
    present = [key for key in BODY_KEYS if key in doc]
    if len(present) != 1:
        raise where.error(
            "a trajectory needs exactly one of 'frames', 'keyframes' or 'preset'"
            + (f", got {' and '.join(present)}" if present else "")
        )
    body = present[0]
    if "version" not in doc:
        raise where.at("version").error("missing required field (use \"version\": 1)")
    if integer(doc["version"], where.at("version")) != VERSION:
        raise where.at("version").error(f"unsupported version {doc['version']} (this camrender reads version {VERSION})")
    parse = {"frames": _parse_frames, "keyframes": _parse_keyframes, "preset": _parse_preset}[body]
    return parse(doc, where).validate()


def _parse_frames(doc: dict, where: Where) -> Trajectory:
    check_keys(doc, where, COMMON_KEYS | {"frames"})
    width, height, fps = _image_size(doc, where)
    convention = _convention(doc, where)
    frames = doc["frames"]
    if not isinstance(frames, list) or not frames:
        raise where.at("frames").error("must be a non-empty list of frames")
    if len(frames) > MAX_FRAMES:
        raise where.at("frames").error(f"too many frames ({len(frames)} > {MAX_FRAMES})")
    c2w = np.empty((len(frames), 4, 4))
    intrinsics = np.empty((len(frames), 4))
    keys = ("fx", "fy", "cx", "cy")
    allowed = {"c2w", "w2c", *keys}
    for index, entry in enumerate(frames):
        at = Where(where.path, index)
        entry = require_object(entry, at)
        check_keys(entry, at, allowed)
        c2w[index] = _pose_matrix(entry, convention, at)  # pose errors are reported before missing intrinsics
        check_keys(entry, at, allowed, required=keys)
        intrinsics[index] = [number(entry[k], at.at(k), positive=k in ("fx", "fy")) for k in keys]
    return Trajectory(c2w, intrinsics, width, height, fps, source=_source(where), **_metadata(doc, where))


def _source(where: Where):
    return None if where.path is None else str(where.path)


KEYFRAME_KEYS = {"t", "frame", "c2w", "w2c", "position", "look_at", "up", "fov", "fov_axis", "fx", "fy", "cx", "cy"}


def _key_time(entry: dict, at: Where, fps: float) -> float:
    if ("t" in entry) == ("frame" in entry):
        raise at.at("t").error("give the key time as exactly one of 't' (seconds) or 'frame' (frame index)")
    if "t" in entry:
        return number(entry["t"], at.at("t"), minimum=0.0)
    return integer(entry["frame"], at.at("frame"), minimum=0, maximum=MAX_FRAMES) / fps


def _key_pose(entry: dict, at: Where, convention: Convention):
    """(OpenCV c2w (4, 4), (look_at, up) or None when the pose was given as a matrix)."""
    has_matrix = "c2w" in entry or "w2c" in entry
    has_look = "position" in entry or "look_at" in entry or "up" in entry
    if has_matrix and has_look:
        raise at.error("give the pose either as a matrix or as position + look_at (+ up), not both")
    if has_matrix:
        return _pose_matrix(entry, convention, at), None
    if not has_look:
        raise at.at("position").error("missing pose: give 'position' + 'look_at' (+ 'up') or a 4x4 matrix")
    for key in ("position", "look_at"):
        if key not in entry:
            raise at.at(key).error("missing required field (position and look_at go together)")
    position = vector(entry["position"], at.at("position"), 3)
    target = vector(entry["look_at"], at.at("look_at"), 3)
    up = vector(entry["up"], at.at("up"), 3) if "up" in entry else np.array(DEFAULT_UP[convention.axes])
    rotation = rotations.look_at_rotation(position, target, up)
    if rotation is None:
        raise at.at("look_at").error("look_at must differ from position and the view direction must not be parallel to up")
    pose = np.eye(4)
    pose[:3, :3] = rotation
    pose[:3, 3] = position
    return pose, (target, up)


def _key_lens(entry: dict, at: Where, width: int, height: int) -> np.ndarray | None:
    """[fx, fy, cx, cy] from fov + fov_axis or fx (+fy) (+cx, cy); None when the key has no lens fields."""
    has_fov = "fov" in entry or "fov_axis" in entry
    has_focal = "fx" in entry or "fy" in entry
    if not has_fov and not has_focal:
        if "cx" in entry or "cy" in entry:
            raise at.at("fx").error("cx/cy need a focal length (fx) or a field of view (fov + fov_axis) on the same key")
        return None
    if has_fov and has_focal:
        raise at.at("fov").error("give either fov + fov_axis or fx/fy, not both")
    if has_fov:
        for key in ("fov", "fov_axis"):
            if key not in entry:
                raise at.at(key).error("missing required field (fov needs an explicit fov_axis: horizontal or vertical)")
        degrees = number(entry["fov"], at.at("fov"), positive=True)
        check_fov(degrees, at.at("fov").field, path=at.path, frame=at.frame)
        axis = string(entry["fov_axis"], at.at("fov_axis"), choices=FOV_AXES)
        size = width if axis == "horizontal" else height
        fx = fy = focal_for_fov(size, degrees)
    else:
        if "fx" not in entry:
            raise at.at("fx").error("missing required field (fy alone is not enough)")
        fx = number(entry["fx"], at.at("fx"), positive=True)
        fy = number(entry["fy"], at.at("fy"), positive=True) if "fy" in entry else fx
    cx = number(entry["cx"], at.at("cx")) if "cx" in entry else width / 2
    cy = number(entry["cy"], at.at("cy")) if "cy" in entry else height / 2
    lens = np.array([fx, fy, cx, cy])
    validate_intrinsics(lens, path=at.path, frame=at.frame)
    return lens


def _interpolation(doc: dict, where: Where) -> tuple[str, str | None]:
    """(position method, rotation method or None = default: look_at when every key is a look-at pose, else slerp)."""
    if "interpolation" not in doc:
        return "spline", None
    at = where.at("interpolation")
    block = require_object(doc["interpolation"], at)
    check_keys(block, at, {"position", "rotation"})
    position = string(block.get("position", "spline"), at.at("position"), choices=interpolate.POSITION_METHODS)
    rotation = block.get("rotation")
    if rotation is not None:
        rotation = string(rotation, at.at("rotation"), choices=(*interpolate.ROTATION_METHODS, "look_at"))
    return position, rotation


def _parse_keyframes(doc: dict, where: Where) -> Trajectory:
    check_keys(doc, where, COMMON_KEYS | {"keyframes", "num_frames", "interpolation"})
    width, height, fps = _image_size(doc, where)
    convention = _convention(doc, where)
    position_method, rotation_method = _interpolation(doc, where)
    keys = doc["keyframes"]
    if not isinstance(keys, list) or not keys:
        raise where.at("keyframes").error("must be a non-empty list of keyframes")
    if len(keys) > MAX_FRAMES:
        raise where.at("keyframes").error(f"too many keyframes ({len(keys)} > {MAX_FRAMES})")
    times, poses, lenses, aims = [], [], [], []
    lens = None
    for index, entry in enumerate(keys):
        at = Where(where.path, None, f"keyframes[{index}]")
        entry = require_object(entry, at)
        check_keys(entry, at, KEYFRAME_KEYS)
        t = _key_time(entry, at, fps)
        if times and t <= times[-1]:
            raise at.at("t").error(f"key times must increase: {t:g} s is not after {times[-1]:g} s")
        times.append(t)
        pose, aim = _key_pose(entry, at, convention)
        poses.append(pose)
        aims.append(aim)
        key_lens = _key_lens(entry, at, width, height)
        lens = lens if key_lens is None else key_lens  # a key without lens fields keeps the last lens
        if lens is None:
            raise at.at("fov").error("the first keyframe needs a lens: fov + fov_axis, or fx (+ fy)")
        lenses.append(lens)
    if times[0] != 0.0:
        raise Where(where.path, None, "keyframes[0]").at("t").error(f"the first keyframe must be at time 0, got {times[0]:g}")
    if "num_frames" in doc:
        num_frames = integer(doc["num_frames"], where.at("num_frames"), minimum=1, maximum=MAX_FRAMES)
    else:
        span = times[-1] * fps
        if not math.isfinite(span) or span + 1 > MAX_FRAMES:
            raise where.at("keyframes").error(f"the path would have more than {MAX_FRAMES} frames")
        num_frames = int(round(span)) + 1
    samples = np.arange(num_frames) / fps
    all_aimed = all(aim is not None for aim in aims)
    if rotation_method == "look_at" and not all_aimed:
        raise where.at("interpolation.rotation").error("'look_at' needs every keyframe to have position + look_at")
    if rotation_method is None:
        rotation_method = "look_at" if all_aimed else "slerp"
    with np.errstate(all="ignore"):
        c2w, intrinsics = interpolate.sample_path(
            np.array(times), np.stack(poses), np.stack(lenses), samples, width, height, position_method,
            "slerp" if rotation_method == "look_at" else rotation_method,
        )
        if rotation_method == "look_at":
            c2w = _aim(c2w, np.array(times), aims, samples, position_method, where)
    if not (np.isfinite(c2w).all() and np.isfinite(intrinsics).all()):
        raise where.at("keyframes").error("interpolation overflowed: key times too close together or values too large")
    return Trajectory(c2w, intrinsics, width, height, fps, source=_source(where), **_metadata(doc, where))


def _aim(c2w, times, aims, samples, method, where: Where) -> np.ndarray:
    """Re-aim every frame at the interpolated look_at point (up interpolated too), keeping the interpolated position."""
    targets = interpolate.interpolate_vectors(times, np.stack([a[0] for a in aims]), samples, method)
    ups = interpolate.interpolate_vectors(times, np.stack([a[1] / np.linalg.norm(a[1]) for a in aims]), samples, "linear")
    out = c2w.copy()
    for index in range(len(samples)):
        rotation = rotations.look_at_rotation(c2w[index, :3, 3], targets[index], ups[index])
        if rotation is None:
            raise where.at("keyframes").error(
                f"at frame {index} the interpolated camera sits on its look_at point or looks along up; add a keyframe"
            )
        out[index, :3, :3] = rotation
    return out


def _parse_preset(doc: dict, where: Where) -> Trajectory:
    check_keys(doc, where, COMMON_KEYS | {"preset", "num_frames"})
    at = where.at("preset")
    block = require_object(doc["preset"], at)
    if "name" not in block:
        raise at.at("name").error("missing required field")
    name = string(block["name"], at.at("name"), choices=tuple(presets.PRESETS))
    params = {key: value for key, value in block.items() if key != "name"}
    for key in ("width", "height", "fps", "num_frames"):
        if key in doc:
            if key in params:
                raise at.at(key).error(f"'{key}' is given both at the top level and in the preset block")
            params[key] = doc[key]
    convention = _convention(doc, where)
    if (convention.axes, convention.pose) != ("opencv", "c2w"):
        raise where.at("convention").error("presets are defined in OpenCV c2w; remove the convention block")
    expanded = presets.expand(name, params, at)
    for key in ("prompt", "negative_prompt", "image", "seed", "comment"):
        if key in doc:
            expanded[key] = doc[key]
    return _parse_keyframes(expanded, where)


def to_document(traj: Trajectory, path=None) -> dict:
    """A per-frame v1 document (OpenCV c2w); ``image`` is written relative to ``path``'s folder."""
    doc = {
        "version": VERSION,
        "width": traj.width,
        "height": traj.height,
        "fps": _plain_number(traj.fps),
        "convention": {"axes": "opencv", "pose": "c2w"},
    }
    if traj.prompt is not None:
        doc["prompt"] = traj.prompt
    if traj.negative_prompt is not None:
        doc["negative_prompt"] = traj.negative_prompt
    if traj.image is not None:
        base = os.path.dirname(os.path.abspath(str(path))) if path is not None else os.getcwd()
        try:
            doc["image"] = os.path.relpath(traj.image, base)
        except ValueError:  # different drive on Windows
            doc["image"] = os.path.abspath(traj.image)
    if traj.seed is not None:
        doc["seed"] = int(traj.seed)
    doc["frames"] = [
        {
            "c2w": [[_plain_number(v) for v in row] for row in traj.c2w[i]],
            "fx": _plain_number(traj.intrinsics[i, 0]),
            "fy": _plain_number(traj.intrinsics[i, 1]),
            "cx": _plain_number(traj.intrinsics[i, 2]),
            "cy": _plain_number(traj.intrinsics[i, 3]),
        }
        for i in range(traj.num_frames)
    ]
    return doc


def _plain_number(value):
    """Python float (repr round-trips exactly); integral values as int to keep files short."""
    value = float(value)
    if value == 0.0:
        return 0  # also folds -0.0
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value
