"""Named camera moves that expand to v1 keyframe documents.

World frame = the first camera's OpenCV frame: +x right, +y down, +z forward, so
"up" is -y. Every preset starts at the origin looking down +z and moves at constant
speed. Sign conventions (positive values):

- dolly: forward (+z);           truck: to the right (+x);     pedestal: up (-y)
- pan: turn right (yaw);         tilt: look up (pitch);       roll: clockwise as seen
  from behind the camera (its right side dips; the image content turns counter-clockwise)
- orbit: the camera circles the target on its optical axis, moving to its right
- zoom: factor > 1 zooms in (focal length multiplied by factor at the end)
- dolly_zoom: moves forward while widening the lens so a subject at subject_distance keeps its size
- spiral: the camera circles in its image plane, first right then up (counter-clockwise as
  seen from behind), while moving forward
"""
from __future__ import annotations

import math

import numpy as np

from camrender.limits import check_fov, focal_for_fov
from camrender.trajectory import rotations
from camrender.trajectory.fields import Where, integer, number
from camrender.trajectory.model import DEFAULT_FPS, MAX_FRAMES, MAX_IMAGE_SIDE

COMMON = {
    "num_frames": (161, "video frames (the model needs 8k+1: 81, 161, ...)"),
    "fps": (DEFAULT_FPS, "frames per second"),
    "width": (1280, "image width in pixels"),
    "height": (704, "image height in pixels"),
    "fov": (60.0, "horizontal field of view at the start, degrees"),
}

PRESETS = {
    "static": ("camera does not move", {}),
    "dolly": ("translate along the view axis", {"distance": (1.0, "world units; positive = forward (+z)")}),
    "truck": ("translate sideways", {"distance": (1.0, "world units; positive = right (+x)")}),
    "pedestal": ("translate vertically", {"distance": (0.5, "world units; positive = up (-y)")}),
    "pan": ("rotate about the vertical axis (yaw)", {"degrees": (30.0, "positive = turn right")}),
    "tilt": ("rotate about the horizontal axis (pitch)", {"degrees": (15.0, "positive = look up")}),
    "roll": ("rotate about the view axis", {"degrees": (15.0, "positive = clockwise seen from behind the camera")}),
    "zoom": ("change the focal length only", {"factor": (2.0, "end focal / start focal; > 1 zooms in")}),
    "dolly_zoom": (
        "move forward while widening the lens (vertigo effect)",
        {
            "distance": (1.0, "world units; positive = forward"),
            "subject_distance": (3.0, "distance to the subject whose size stays fixed; > distance"),
        },
    ),
    "orbit": (
        "circle a target on the first view axis, always looking at it",
        {
            "radius": (2.0, "distance from the camera to the target"),
            "degrees": (90.0, "angle travelled; positive = camera moves to its right"),
        },
    ),
    "spiral": (
        "circle in the image plane while moving forward",
        {
            "radius": (0.3, "circle radius, world units"),
            "turns": (1.0, "number of turns; positive = right then up"),
            "distance": (1.0, "forward travel, world units"),
        },
    ),
}

# Largest angle between consecutive keyframes of curved moves (keeps slerp on the intended
# arc and the position spline close to a circle).
MAX_KEY_STEP_DEG = 15.0
# Most turns a preset makes (`degrees` / 360, or `turns`): 2400 keyframes at most, expanded at once (1e7 degrees
# took 16 s and 630 MB before the path was refused for its length).
MAX_TURNS = 100


def describe() -> list[tuple[str, str, dict]]:
    """(name, summary, {param: (default, help)}) for every preset, common parameters excluded."""
    return [(name, summary, dict(params)) for name, (summary, params) in PRESETS.items()]


def make(name: str, **params) -> dict:
    """Expand preset ``name`` to a v1 keyframe document (dict).

    Parameters: the common ones (num_frames, fps, width, height, fov) and the preset's own
    (see PRESETS); unknown names or bad values raise CamrenderError.
    """
    return expand(name, params)


def expand(name: str, params: dict, where: Where | None = None) -> dict:
    """`make` with the parameters as a dict (any key, even one named like an argument, is a parameter);
    errors name `where` (default: the field "preset")."""
    where = where or Where(field="preset")
    if name not in PRESETS:
        raise where.at("name").error(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    own = PRESETS[name][1]
    values = {}
    for key, value in params.items():
        if key not in COMMON and key not in own:
            allowed = ", ".join(sorted([*COMMON, *own]))
            raise where.at(key).error(f"unknown parameter for preset {name} (allowed: {allowed})")
    for key, (default, _) in {**COMMON, **own}.items():
        value = params.get(key, default)
        at = where.at(key)
        if key in ("num_frames", "width", "height"):
            values[key] = integer(value, at, minimum=1 if key != "num_frames" else 2,
                                  maximum=MAX_FRAMES if key == "num_frames" else MAX_IMAGE_SIDE)
        elif key in ("fps", "radius", "subject_distance", "factor"):
            values[key] = number(value, at, positive=True)
        else:
            values[key] = number(value, at)
        turns = {"degrees": 360.0, "turns": 1.0}.get(key)
        if turns is not None and abs(values[key]) > MAX_TURNS * turns:
            raise at.error(f"must be within +-{MAX_TURNS * turns:g} ({MAX_TURNS} turns), got {values[key]:g}")
    check_fov(values["fov"], where.at("fov").field, path=where.path)
    if name == "dolly_zoom" and values["distance"] >= values["subject_distance"]:
        raise where.at("distance").error("must be smaller than subject_distance (the camera would pass the subject)")
    return _BUILDERS[name](values)


def _document(v: dict, keys: list[dict], name: str, position="spline", rotation="slerp") -> dict:
    return {
        "version": 1,
        "comment": f"preset {name}: " + ", ".join(f"{k}={v[k]:g}" for k in PRESETS[name][1]),
        "width": v["width"],
        "height": v["height"],
        "fps": v["fps"],
        "num_frames": v["num_frames"],
        "interpolation": {"position": position, "rotation": rotation},
        "keyframes": keys,
    }


def _focal(v: dict) -> float:
    return focal_for_fov(v["width"], v["fov"])


def _key(v: dict, fraction: float, rotation=None, position=(0.0, 0.0, 0.0), lens=None, first=False) -> dict:
    """A keyframe at ``fraction`` of the path, pose as an OpenCV c2w matrix."""
    pose = np.eye(4)
    pose[:3, :3] = np.eye(3) if rotation is None else rotation
    pose[:3, 3] = position
    key = {"t": _time(v, fraction), "c2w": [[_clean(x) for x in row] for row in pose]}
    if lens is not None:
        key["fx"] = _clean(lens)
    elif first:
        key.update({"fov": v["fov"], "fov_axis": "horizontal"})
    return key


def _time(v: dict, fraction: float) -> float:
    """Seconds at ``fraction`` of the path."""
    return _clean(fraction * (v["num_frames"] - 1) / v["fps"])


def _clean(x: float) -> float:
    x = round(float(x), 12)
    return 0.0 if x == 0 else x


def _steps(total_degrees: float) -> int:
    return max(1, math.ceil(abs(total_degrees) / MAX_KEY_STEP_DEG))


def _translation(name, direction):
    def build(v):
        end = np.asarray(direction, dtype=np.float64) * v["distance"]
        return _document(v, [_key(v, 0.0, first=True), _key(v, 1.0, position=end)], name, "linear")

    return build


def _rotation(name, axis_rotation):
    """Constant-rate rotation by +degrees about one camera axis, keyed every <= MAX_KEY_STEP_DEG."""

    def build(v):
        n = _steps(v["degrees"])
        keys = [
            _key(v, i / n, rotation=axis_rotation(math.radians(v["degrees"]) * i / n), first=i == 0)
            for i in range(n + 1)
        ]
        return _document(v, keys, name)

    return build


def _static(v):
    return _document(v, [_key(v, 0.0, first=True), _key(v, 1.0)], "static", "linear")


def _zoom(v):
    f0 = _focal(v)
    return _document(v, [_key(v, 0.0, lens=f0), _key(v, 1.0, lens=f0 * v["factor"])], "zoom", "linear")


def _dolly_zoom(v):
    f0, d0 = _focal(v), v["subject_distance"]
    n = 16  # focal ~ 1/(d0 - z) is not linear in tan(fov/2): use several keys
    keys = []
    for i in range(n + 1):
        z = v["distance"] * i / n
        keys.append(_key(v, i / n, position=(0.0, 0.0, z), lens=f0 * (d0 - z) / d0))
    return _document(v, keys, "dolly_zoom", "linear")


def _orbit(v):
    r, total = v["radius"], math.radians(v["degrees"])
    n = _steps(v["degrees"])
    target = [0.0, 0.0, r]
    keys = []
    for i in range(n + 1):
        phi = total * i / n
        position = [r * math.sin(phi), 0.0, r - r * math.cos(phi)]
        key = {
            "t": _time(v, i / n),
            "position": [_clean(x) for x in position],
            "look_at": target,
            "up": [0.0, -1.0, 0.0],
        }
        if i == 0:
            key.update({"fov": v["fov"], "fov_axis": "horizontal"})
        keys.append(key)
    return _document(v, keys, "orbit", rotation="look_at")


def _spiral(v):
    r, turns = v["radius"], v["turns"]
    n = _steps(360.0 * turns)
    keys = []
    for i in range(n + 1):
        theta = 2 * math.pi * turns * i / n
        position = (r * math.sin(theta), -r * (1 - math.cos(theta)), v["distance"] * i / n)
        keys.append(_key(v, i / n, position=position, first=i == 0))
    return _document(v, keys, "spiral")


_BUILDERS = {
    "static": _static,
    "dolly": _translation("dolly", (0.0, 0.0, 1.0)),
    "truck": _translation("truck", (1.0, 0.0, 0.0)),
    "pedestal": _translation("pedestal", (0.0, -1.0, 0.0)),
    # pan right: the view direction (+z) turns toward +x, a rotation about +y by +angle.
    "pan": _rotation("pan", rotations.rot_y),
    # tilt up: +z turns toward -y, a rotation about +x by +angle.
    "tilt": _rotation("tilt", rotations.rot_x),
    # clockwise roll: the right axis +x turns toward +y (down), a rotation about +z by +angle.
    "roll": _rotation("roll", rotations.rot_z),
    "zoom": _zoom,
    "dolly_zoom": _dolly_zoom,
    "orbit": _orbit,
    "spiral": _spiral,
}
