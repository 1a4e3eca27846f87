"""Keys held over time -> the camera path of the next segment, with the official control scheme.

The page sends key presses and releases as they happen (`KeyTimeline.press` / `release`, any
thread). When the segment loop asks for segment k's cameras (`SteeredPath.segments`, pulled by
`camrender.render.camera_feed.CameraFeed` as segment k starts), every frame of segment k takes the keys
held at that moment, as a game samples its input as late as it can: a press shows from the first frame
of the next segment decided, not from its place in time within the interval (that would add its offset
in the interval, 0 to 1 segment period, to its key-to-frame latency). A tap (pressed and released since
the last ask) holds its key on the first frames of segment k, as many as it was held for (a frame
counting as the time since the last ask over segment k's frames), at least one. So the flown path keeps
the keys at segment granularity: a key still held when a segment is decided holds for all its frames,
however short the press (a 0.2 s press across a decision moves the camera for a whole segment).
`camrender.trajectory.controls.Controller` advances the camera one frame at a time with the official
velocity model.

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
        """(per-frame key sets [frames], {press id: frame offset}) of the segment decided now: the keys
        held now on every frame, each tap since the last `take` on the first frames (module docstring).
        A press is reflected at frame 0 if it happened since the last `take` (or it is the first)."""
        if frames < 1:
            return [], {}  # nothing to decide: the events wait for the next take
        with self._lock:
            now = self.clock() if now is None else now
            events, self._events = self._events, []
            start, self._last = self._last, now
            window = (now - start) / frames if start is not None and now > start else None
            per_frame = [set(self._held) for _ in range(frames)]
            reflected = {}
            if start is None:  # the first segment: every key held counts as pressed now
                reflected = {pid: 0 for pid in self._held.values() if pid is not None}
            pressed = {}  # letter -> (time, press id) of a press since the last take
            tapped = {}  # letter -> seconds held by taps since the last take
            for at, letter, down, press_id in events:
                if down:
                    pressed[letter] = (at, press_id)
                    if press_id is not None:
                        reflected.setdefault(press_id, 0)
                elif letter in pressed:
                    tapped[letter] = tapped.get(letter, 0.0) + at - pressed.pop(letter)[0]
            for letter, seconds in tapped.items():
                count = 1 if window is None else max(1, round(seconds / window))
                for keys in per_frame[:count]:
                    keys.add(letter)
            return [frozenset(keys) for keys in per_frame], reflected


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
