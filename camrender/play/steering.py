"""Keys held over time -> the camera path of the next segment, with the official control scheme.

The page sends key presses and releases as they happen (`KeyTimeline.press` / `release`, any
thread). When the segment loop asks for segment k's cameras (`SteeredPath.segments`, pulled by
`camrender.render.camera_feed.CameraFeed` as segment k starts), the time since the previous ask,
the time segment k-1 took to render, is split into as many equal windows as segment k has frames:
frame i gets the keys held at any moment of window i (a tap shorter than a window still counts),
and `camrender.trajectory.controls.Controller` advances the camera one frame per window with the
official velocity model. The first segment is decided at once from the keys held at the start.

Each press carries an id; `SteeredPath.reflected` maps it to the first video frame whose keys hold
it (the frame that reflects it), so the page can time key-to-frame latency.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable, Iterator

import numpy as np

from camrender.render.camera_feed import SegmentCamera, video_frames
from camrender.trajectory.controls import DEMO_KEYS, Controller, ControlScheme

DEFAULT_FOV = 60.0  # degrees, horizontal: a centred pinhole, as action strings use


class Stopped(Exception):
    """The session was stopped: the camera stream ends here (the segment loop stops with it)."""


def pinhole(width: int, height: int, fov: float = DEFAULT_FOV) -> np.ndarray:
    """[fx, fy, cx, cy] in pixels of a width x height image, centred, horizontal field of view `fov` degrees."""
    focal = 0.5 * width / math.tan(math.radians(fov) / 2)
    return np.array([focal, focal, width / 2, height / 2])


def scheme_letter(browser_key: str):
    """The sana-wm scheme letter of a browser `KeyboardEvent.key` (w, a, s, d, arrows), or None."""
    return DEMO_KEYS.get(str(browser_key).lower())


class KeyTimeline:
    """Presses and releases of scheme letters with their times (seconds of `clock`); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._held = {}  # letter -> id of the press that holds it (or None)
        self._events = []  # (time, letter, down, press id) since the last `take`
        self._last = None  # time of the last `take`

    def press(self, letter: str, press_id=None, at=None) -> None:
        with self._lock:
            if letter not in self._held:
                self._held[letter] = press_id
                self._events.append((self.clock() if at is None else at, letter, True, press_id))

    def release(self, letter: str, at=None) -> None:
        with self._lock:
            if letter in self._held:
                del self._held[letter]
                self._events.append((self.clock() if at is None else at, letter, False, None))

    def release_all(self) -> None:
        for letter in list(self._held):
            self.release(letter)

    @property
    def held(self) -> frozenset:
        with self._lock:
            return frozenset(self._held)

    def take(self, frames: int, now=None) -> tuple:
        """(per-frame key sets [frames], {press id: frame offset}) for the time since the last `take`
        split into `frames` equal windows (module docstring); the first call: the keys held now."""
        with self._lock:
            now = self.clock() if now is None else now
            events, self._events = self._events, []
            start, self._last = self._last, now
            if start is None or now <= start or frames < 1:
                held = frozenset(self._held)
                return [held] * frames, {pid: 0 for pid in self._held.values() if pid is not None and frames}
            current = set(self._held)  # undo the interval's events to get the keys held at its start
            for _, letter, down, _ in reversed(events):
                (current.discard if down else current.add)(letter)
            per_frame, reflected, index = [], {}, 0
            width = (now - start) / frames
            for frame in range(frames):
                begin, end = start + frame * width, start + (frame + 1) * width
                keys = None
                # events up to the window's start set its first keys; those inside it add presses
                while index < len(events) and (events[index][0] < end or frame == frames - 1):
                    at, letter, down, press_id = events[index]
                    if keys is None and at > begin:
                        keys = set(current)
                    (current.add if down else current.discard)(letter)
                    if down:
                        if keys is not None:
                            keys.add(letter)
                        if press_id is not None:
                            reflected.setdefault(press_id, frame)
                    index += 1
                per_frame.append(frozenset(current if keys is None else keys))
            return per_frame, reflected


class SteeredPath:
    """The camera path flown so far, one segment at a time from a `KeyTimeline`.

    scheme: the control scheme (`camrender.trajectory.controls.make_scheme`); bounds: the render's
    segment layout in latent frames (`camrender.model.stage1.recipes.segment_bounds`); intrinsics: (4,)
    [fx, fy, cx, cy] in pixels of a `width` x `height` image, the same for every frame.
    `poses` (list of (4, 4) c2w, one per video frame decided so far) starts at the identity.
    """

    def __init__(self, scheme: ControlScheme, timeline: KeyTimeline, bounds, intrinsics, width: int, height: int,
                 stopping: Callable[[], bool] = lambda: False):
        self.controller = Controller(scheme)
        self.timeline = timeline
        self.bounds = list(bounds)
        self.intrinsics = np.asarray(intrinsics, dtype=np.float64)
        self.width, self.height = int(width), int(height)
        self.stopping = stopping
        self.poses = []
        self.keys = []  # frozenset of letters per video frame (the start frame: empty)
        self.reflected = {}  # press id -> video frame that first reflects it
        self.decided_at = []  # timeline clock time each segment's cameras were decided

    def segments(self) -> Iterator[SegmentCamera]:
        """Yield each segment's cameras as the render asks for them; raises `Stopped` once `stopping()`."""
        for start, stop in self.bounds:
            if self.stopping():
                raise Stopped()
            first, last = video_frames(start, stop)
            steps = last - first - (1 if first == 0 else 0)
            per_frame, reflected = self.timeline.take(steps)
            poses = []
            if first == 0:
                poses.append(self.controller.pose)
                self.keys.append(frozenset())
            offset = len(self.poses) + len(poses)
            for keys in per_frame:
                poses.append(self.controller.step(keys))
                self.keys.append(keys)
            for press_id, frame in reflected.items():
                self.reflected.setdefault(press_id, offset + frame)
            self.poses.extend(poses)
            self.decided_at.append(self.timeline.clock())
            yield SegmentCamera(np.stack(poses), np.tile(self.intrinsics, (len(poses), 1)), self.width, self.height)
