"""Keys over time -> per-frame keys -> the segment's cameras (`camrender.play.steering`), no model."""
import math

import numpy as np
import pytest

from camrender.model.stage1.recipes import segment_bounds
from camrender.play.steering import KeyTimeline, SteeredPath, Stopped, pinhole, scheme_letter
from camrender.render.camera_feed import video_frames
from camrender.trajectory.controls import make_scheme, rollout


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_browser_keys_map_to_the_official_demo_letters():
    assert [scheme_letter(k) for k in ("w", "S", "a", "d", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight")] == \
        ["w", "s", "a", "d", "i", "k", "j", "l"]
    assert scheme_letter("q") is None and scheme_letter("Enter") is None


def test_every_frame_takes_the_keys_held_when_the_segment_is_decided_and_taps_the_first_frames():
    clock = Clock()
    keys = KeyTimeline(clock)
    keys.press("w", press_id=1)
    frames, reflected = keys.take(4)  # the first segment: decided at once
    assert frames == [frozenset("w")] * 4 and reflected == {1: 0}
    # the next segment, decided at t = 2 (a frame: 2 s / 4 = 0.5 s)
    keys.release("w", at=0.7)
    keys.press("d", press_id=2, at=1.2)
    keys.press("a", press_id=3, at=1.3)
    keys.release("a", at=1.9)  # a tap of 0.6 s: the first frame
    keys.press("s", press_id=4, at=1.0)
    keys.release("s", at=1.1)  # a tap shorter than a frame still counts
    keys.press("j", press_id=5, at=0.1)
    keys.release("j", at=1.1)  # a tap of 1 s: two frames
    clock.now = 2.0
    frames, reflected = keys.take(4)
    assert frames == [frozenset("dasj"), frozenset("dj"), frozenset("d"), frozenset("d")]
    assert reflected == {2: 0, 3: 0, 4: 0, 5: 0}
    clock.now = 3.0
    frames, reflected = keys.take(2)  # nothing happened: the keys still held, no press to reflect
    assert frames == [frozenset("d")] * 2 and reflected == {}


def test_a_key_pressed_twice_is_one_press_until_released():
    clock = Clock()
    keys = KeyTimeline(clock)
    keys.take(1)
    keys.press("w", press_id=1, at=0.1)
    keys.press("w", press_id=2, at=0.2)  # auto-repeat: ignored
    clock.now = 1.0
    assert keys.take(2) == ([frozenset("w")] * 2, {1: 0})


def test_steered_path_follows_the_official_scheme_segment_by_segment():
    """W held for the first segments, then D: the poses are the scheme's rollout of the per-frame keys,
    forward along +z first, then yawing right (the forward axis turns toward +x)."""
    clock = Clock()
    keys = KeyTimeline(clock)
    scheme = make_scheme("sana-wm")
    bounds = segment_bounds(10, 3)  # (0, 4), (4, 7), (7, 10): 25, 24, 24 video frames
    path = SteeredPath(scheme, keys, bounds, pinhole(112, 64), 112, 64)
    cameras = path.segments()
    keys.press("w", press_id=1)
    first = next(cameras)
    assert first.c2w.shape == (25, 4, 4) and first.width == 112
    np.testing.assert_allclose(first.intrinsics[0], [0.5 * 112 / math.tan(math.radians(30)), 0.5 * 112 / math.tan(
        math.radians(30)), 56, 32])
    clock.now = 1.0
    second = next(cameras)
    keys.release("w", at=1.5)
    keys.press("d", press_id=2, at=1.5)
    clock.now = 2.0
    third = next(cameras)
    assert [len(c.c2w) for c in (first, second, third)] == [b - a for a, b in (video_frames(*x) for x in bounds)]
    poses = np.concatenate([first.c2w, second.c2w, third.c2w])
    np.testing.assert_allclose(poses, rollout(scheme, path.keys[1:]), atol=1e-12)
    # the third segment was decided at t = 2, D held since 1.5: all its 24 frames; W released (not a tap)
    assert path.keys[1:49] == [frozenset("w")] * 48 and path.keys[49:] == [frozenset("d")] * 24
    assert path.reflected == {1: 1, 2: 49}
    assert poses[48, 2, 3] > 1.0 and abs(poses[48, 0, 3]) < 1e-9  # straight ahead
    assert math.degrees(math.atan2(poses[-1, 0, 2], poses[-1, 2, 2])) > 5  # then turned right
    with pytest.raises(StopIteration):
        next(cameras)


def test_steered_path_stops_when_asked():
    stop = []
    path = SteeredPath(make_scheme(), KeyTimeline(Clock()), segment_bounds(10, 3), pinhole(64, 64), 64, 64,
                       stopping=lambda: bool(stop))
    cameras = path.segments()
    next(cameras)
    stop.append(True)
    with pytest.raises(Stopped):
        next(cameras)
