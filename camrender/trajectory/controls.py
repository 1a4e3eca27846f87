"""Keyboard camera control: a named control scheme and a per-frame controller.

One implementation serves both the action-string rollout (`camrender.trajectory.formats.actions`)
and a live controller (a key set per frame). Poses are OpenCV camera-to-world (+x right, +y down,
+z forward), float64 (4, 4); the world "up" is -y and every move stays on the horizontal x-z plane.

Schemes (`ControlScheme.name`):

- ``"sana-wm"`` (default): NVlabs' current scheme, shared by their inference CLI and interactive
  demo. w/s forward/back, a/d yaw left/right, j/l strafe left/right, i/k pitch up/down; 0.025
  units and 0.6 deg per frame; pitch clamped to +-60 deg; smoothed: per axis the velocity eases
  toward its target with 1 - exp(-dt/tau) per frame (tau 0.45 s while the axis has a target,
  1.0 s coasting to rest), and a frame that presses a key not held the frame before snaps every
  axis to its target at once; dt = 1/fps, 16 fps.
- ``"diffusers"``: the older scheme of diffusers 0.42.1's ``cam_utils`` (and NVlabs' first
  release): a/d strafe, j/l yaw, 0.05 units and 1.2 deg per frame, pitch within +-85 deg (a
  pitch step that would leave the range is dropped), no smoothing.

Per frame, with velocity (forward, strafe right, yaw right, pitch up) in units and radians:
pitch changes by the pitch velocity (within the limit), R <- rot_y(yaw) @ R @ rot_x(pitch step),
then the position moves along the new forward and right axes projected on the x-z plane
(normalised; the sana-wm scheme divides by norm + 1e-6 as NVlabs' code does).
Old action strings of the diffusers scheme keep their motion in the sana-wm scheme's keys by
swapping a/d with j/l (the speeds and the smoothing still differ).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from camrender.errors import CamrenderError
from camrender.limits import MAX_POSITION
from camrender.trajectory.rotations import rot_x, rot_y

SCHEME_NAMES = ("sana-wm", "diffusers")
CONTROLS = ("forward", "back", "strafe_left", "strafe_right", "yaw_left", "yaw_right", "pitch_up", "pitch_down")

# key letter -> control, per scheme
KEYMAPS = {
    "sana-wm": {"w": "forward", "s": "back", "a": "yaw_left", "d": "yaw_right",
                "j": "strafe_left", "l": "strafe_right", "i": "pitch_up", "k": "pitch_down"},
    "diffusers": {"w": "forward", "s": "back", "a": "strafe_left", "d": "strafe_right",
                  "j": "yaw_left", "l": "yaw_right", "i": "pitch_up", "k": "pitch_down"},
}
# (translation units/frame, rotation deg/frame, pitch limit deg, smoothing) per scheme
DEFAULTS = {"sana-wm": (0.025, 0.6, 60.0, True), "diffusers": (0.05, 1.2, 85.0, False)}
DEFAULT_FPS = 16.0
TAU_PRESS, TAU_COAST = 0.45, 1.0  # seconds: easing toward a held target, coasting to rest
# NVlabs' live demo keys (browser KeyboardEvent.key, lower case) -> the sana-wm scheme's letters
DEMO_KEYS = {"w": "w", "s": "s", "a": "a", "d": "d",
             "arrowup": "i", "arrowdown": "k", "arrowleft": "j", "arrowright": "l"}


@dataclasses.dataclass(frozen=True)
class ControlScheme:
    """A control scheme with its speeds (build one with `make_scheme`, which fills in and checks values).

    Attributes:
        name: "sana-wm" or "diffusers" (key mapping and pitch-limit rule).
        translation_speed: world units per frame while a move key is held.
        rotation_speed: degrees per frame while a turn key is held.
        pitch_limit: degrees; pitch stays within +-pitch_limit.
        smooth: the exponential velocity model (else the velocity is the target at once).
        fps: frames per second of the velocity model's time step.
    """

    name: str = "sana-wm"
    translation_speed: float = 0.025
    rotation_speed: float = 0.6
    pitch_limit: float = 60.0
    smooth: bool = True
    fps: float = DEFAULT_FPS

    @property
    def keymap(self) -> dict:
        """{key letter: control name} of this scheme."""
        return KEYMAPS[self.name]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_scheme(name: str | None = "sana-wm", *, translation_speed=None, rotation_speed=None, pitch_limit=None,
                smooth=None, fps=None) -> ControlScheme:
    """The scheme `name` (None: "sana-wm") with its defaults for the values not given; CamrenderError
    (field "action-scheme", "translation-speed", ...) for an unknown name or a bad value."""
    name = "sana-wm" if name is None else str(name).lower()
    if name not in SCHEME_NAMES:
        raise CamrenderError(f"unknown action scheme {name!r} (known: {', '.join(SCHEME_NAMES)})",
                             field="action-scheme")
    speed, turn, limit, smoothing = DEFAULTS[name]
    values = {"translation-speed": speed if translation_speed is None else translation_speed,
              "rotation-speed": turn if rotation_speed is None else rotation_speed,
              "pitch-limit": limit if pitch_limit is None else pitch_limit,
              "fps": DEFAULT_FPS if fps is None else fps}
    for field, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CamrenderError(f"must be a finite number, got {value!r}", field=field)
    if values["translation-speed"] < 0 or values["rotation-speed"] < 0:
        raise CamrenderError("speeds must not be negative", field="translation-speed"
                             if values["translation-speed"] < 0 else "rotation-speed")
    for field, most, unit in (("translation-speed", MAX_POSITION, "units"), ("rotation-speed", 180.0, "degrees")):
        if values[field] > most:  # (more than half a turn a frame is no motion a video shows)
            raise CamrenderError(f"must be at most {most:g} {unit} per frame, got {values[field]:g}", field=field)
    if not 0 <= values["pitch-limit"] <= 90:
        raise CamrenderError(f"must be within 0-90 degrees, got {values['pitch-limit']:g}", field="pitch-limit")
    if values["fps"] <= 0:
        raise CamrenderError(f"must be positive, got {values['fps']:g}", field="fps")
    return ControlScheme(name, float(values["translation-speed"]), float(values["rotation-speed"]),
                         float(values["pitch-limit"]), smoothing if smooth is None else bool(smooth),
                         float(values["fps"]))


def scheme_from_dict(values: dict, where=None) -> ControlScheme:
    """A scheme from `ControlScheme.to_dict`'s record (e.g. in NAME.render.json); CamrenderError otherwise."""
    if not isinstance(values, dict) or set(values) - {f.name for f in dataclasses.fields(ControlScheme)}:
        raise CamrenderError("must be an object with the fields of an action scheme", path=where,
                             field="action_scheme")
    values = dict(values)
    return make_scheme(values.pop("name", None), **values)


def _horizontal(axis: np.ndarray, eps: float) -> np.ndarray:
    """`axis` with its y part removed, normalised (divided by norm + eps); zero stays zero."""
    out = axis.copy()
    out[1] = 0.0
    norm = float(np.linalg.norm(out))
    return out / (norm + eps) if norm > 0 else out


class Controller:
    """The camera of one scheme, advanced one frame at a time by the keys held during that frame.

        controller = Controller(make_scheme("sana-wm"))
        pose = controller.step({"w", "a"})     # (4, 4) c2w after one frame of forward + yaw left

    `pose` is the current c2w (the start pose before any step); `velocity` is
    (forward units, strafe-right units, yaw-right rad, pitch-up rad) per frame.
    """

    def __init__(self, scheme: ControlScheme | None = None, start_c2w=None):
        self.scheme = scheme if scheme is not None else make_scheme()
        start = np.eye(4) if start_c2w is None else np.array(start_c2w, dtype=np.float64)
        if start.shape != (4, 4):
            raise CamrenderError(f"must be a 4x4 matrix, got shape {start.shape}", field="start_c2w")
        self._pose = start
        self.pitch = 0.0  # radians above the start pose's pitch
        self.velocity = (0.0, 0.0, 0.0, 0.0)
        self.frame = 0
        self._held = frozenset()  # controls held the frame before

    @property
    def pose(self) -> np.ndarray:
        return self._pose.copy()

    def controls_of(self, keys) -> frozenset:
        """The control names of key letters (case-insensitive); CamrenderError for a key of no control."""
        keymap = self.scheme.keymap
        controls = set()
        for key in keys:
            control = keymap.get(str(key).lower())
            if control is None:
                raise CamrenderError(f"unknown key {key!r} (keys: {''.join(sorted(keymap))})", field="keys")
            controls.add(control)
        return frozenset(controls)

    def step(self, held_keys) -> np.ndarray:
        """Advance one frame with `held_keys` (key letters) held; returns the new (4, 4) c2w."""
        return self.step_controls(self.controls_of(held_keys))

    def step_controls(self, controls) -> np.ndarray:
        """Advance one frame with the control names `controls` held; returns the new (4, 4) c2w."""
        controls = frozenset(controls)
        unknown = controls - set(CONTROLS)
        if unknown:
            raise CamrenderError(f"unknown controls {sorted(unknown)}", field="controls")
        self.velocity = self._next_velocity(controls)
        self._held = controls
        self._integrate(*self.velocity)
        self.frame += 1
        return self.pose

    def _target(self, controls) -> tuple:
        s = self.scheme
        turn = math.radians(s.rotation_speed)

        def axis(plus, minus):
            return (plus in controls) - (minus in controls)

        return (axis("forward", "back") * s.translation_speed, axis("strafe_right", "strafe_left") * s.translation_speed,
                axis("yaw_right", "yaw_left") * turn, axis("pitch_up", "pitch_down") * turn)

    def _next_velocity(self, controls) -> tuple:
        target = self._target(controls)
        if not self.scheme.smooth or controls - self._held:  # no smoothing, or a fresh press: snap
            return target
        dt = 1.0 / self.scheme.fps
        eased = []
        for current, goal in zip(self.velocity, target):
            tau = TAU_PRESS if abs(goal) > 1e-12 else TAU_COAST
            eased.append(current + (1.0 - math.exp(-dt / tau)) * (goal - current))
        return tuple(eased)

    def _integrate(self, forward: float, strafe: float, yaw: float, pitch: float) -> None:
        limit = math.radians(self.scheme.pitch_limit)
        wanted = self.pitch + pitch
        if self.scheme.name == "diffusers":  # a step that would pass the limit is dropped
            pitch_step = pitch if -limit <= wanted <= limit else 0.0
            self.pitch = wanted if pitch_step else self.pitch
        else:  # sana-wm: clamped at the limit
            clamped = max(-limit, min(limit, wanted))
            pitch_step, self.pitch = clamped - self.pitch, clamped
        rotation = rot_y(yaw) @ self._pose[:3, :3] @ rot_x(pitch_step)
        eps = 0.0 if self.scheme.name == "diffusers" else 1e-6
        ahead, right = _horizontal(rotation[:, 2], eps), _horizontal(rotation[:, 0], eps)
        pose = np.eye(4)
        pose[:3, :3] = rotation
        pose[:3, 3] = self._pose[:3, 3] + ahead * forward + right * strafe
        self._pose = pose


def rollout(scheme: ControlScheme, held_per_frame, start_c2w=None) -> np.ndarray:
    """(N+1, 4, 4) float64 c2w: the start pose, then one pose per entry of `held_per_frame` (key sets)."""
    controller = Controller(scheme, start_c2w)
    poses = [controller.pose]
    poses.extend(controller.step(keys) for keys in held_per_frame)
    return np.stack(poses)
