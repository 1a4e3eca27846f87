"""Interpolation (spline, slerp/squad, tan-space focal), preset sign conventions, the 8k+1 rule."""
import math

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.trajectory import interpolate, presets, rotations, to_model_frames
from camrender.trajectory.resample import nearest_model_length
from camrender.trajectory.stats import rotation_angles
from camrender.trajectory.v1 import parse_document


def _preset(name, **params):
    return parse_document(presets.make(name, num_frames=params.pop("num_frames", 33), **params)).validate()


def test_quaternion_round_trip_and_slerp_constant_speed():
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        r = rotations.quat_to_matrix(q)
        np.testing.assert_allclose(rotations.quat_to_matrix(rotations.matrix_to_quat(r)), r, atol=1e-12)
    r0, r1 = np.eye(3), rotations.rot_y(math.radians(120)) @ rotations.rot_x(0.3)
    out = interpolate.interpolate_rotations([0.0, 1.0], [r0, r1], np.linspace(0, 1, 9), "slerp")
    steps = np.degrees(np.arccos(np.clip((np.einsum("fji,fji->f", out[:-1], out[1:]) - 1) / 2, -1, 1)))
    np.testing.assert_allclose(steps, steps[0], atol=1e-9)
    np.testing.assert_allclose(out[-1], r1, atol=1e-12)


def test_squad_passes_through_keys_and_is_smooth():
    times = np.array([0.0, 1.0, 2.0, 3.0])
    keys = [rotations.rot_y(math.radians(a)) @ rotations.rot_x(math.radians(b)) for a, b in [(0, 0), (40, 10), (60, -20), (120, 0)]]
    samples = np.linspace(0, 3, 301)
    out = interpolate.interpolate_rotations(times, keys, samples, "squad")
    for t, key in zip(times, keys):
        np.testing.assert_allclose(out[int(round(t * 100))], key, atol=1e-9)
    speed = rotation_angles(np.pad(out, ((0, 0), (0, 1), (0, 1))))
    # C1: no jump in angular speed across a key (slerp would jump there)
    assert abs(speed[100] - speed[99]) < 0.05 * speed[99]


def test_position_spline_hits_keys_and_two_keys_are_linear():
    times = np.array([0.0, 1.0, 3.0])
    values = np.array([[0.0, 0, 0], [1, 2, 0], [2, 0, 1]])
    out = interpolate.interpolate_vectors(times, values, times)
    np.testing.assert_allclose(out, values, atol=1e-12)
    two = interpolate.interpolate_vectors([0.0, 2.0], values[:2], np.linspace(0, 2, 5))
    np.testing.assert_allclose(two, np.linspace(values[0], values[1], 5), atol=1e-12)


def _forward(c2w):
    return c2w[:3, 2]


# Sign conventions documented in presets.py and docs/trajectory-format.md
def test_translation_presets_signs():
    np.testing.assert_allclose(_preset("dolly", distance=2).c2w[-1, :3, 3], [0, 0, 2], atol=1e-12)
    np.testing.assert_allclose(_preset("truck", distance=1).c2w[-1, :3, 3], [1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(_preset("pedestal", distance=1).c2w[-1, :3, 3], [0, -1, 0], atol=1e-12)
    # constant speed
    steps = np.linalg.norm(np.diff(_preset("dolly", distance=2).c2w[:, :3, 3], axis=0), axis=1)
    np.testing.assert_allclose(steps, 2 / 32, atol=1e-12)


def test_rotation_presets_signs():
    pan = _preset("pan", degrees=30).c2w[-1]
    assert _forward(pan)[0] > 0.4 and abs(_forward(pan)[1]) < 1e-12  # turns right
    tilt = _preset("tilt", degrees=20).c2w[-1]
    assert _forward(tilt)[1] < -0.3  # looks up (-y)
    roll = _preset("roll", degrees=20).c2w[-1]
    assert roll[1, 0] > 0.3  # camera right axis dips (+y is down): clockwise from behind
    big = _preset("pan", degrees=270)
    np.testing.assert_allclose(rotation_angles(big.c2w), 270 / 32, atol=1e-9)  # goes the long way, evenly


def test_orbit_keeps_target_centred_and_moves_right():
    t = _preset("orbit", radius=2, degrees=90, num_frames=41)
    target = np.array([0, 0, 2.0, 1.0])
    for pose, (fx, fy, cx, cy) in zip(t.c2w, t.intrinsics):
        p = np.linalg.inv(pose) @ target
        np.testing.assert_allclose([fx * p[0] / p[2] + cx, fy * p[1] / p[2] + cy], [cx, cy], atol=1e-9)
        assert abs(np.linalg.norm(pose[:3, 3] - target[:3]) - 2) < 2e-3  # spline stays on the circle
    assert t.c2w[1, 0, 3] > 0
    np.testing.assert_allclose(t.c2w[-1, :3, 3], [2, 0, 2], atol=1e-12)


def test_zoom_and_dolly_zoom():
    z = _preset("zoom", factor=2)
    np.testing.assert_allclose(z.intrinsics[-1, 0] / z.intrinsics[0, 0], 2)
    np.testing.assert_allclose(z.c2w, np.broadcast_to(np.eye(4), z.c2w.shape))
    d = _preset("dolly_zoom", distance=1, subject_distance=3, num_frames=17)
    # subject size ~ f / (d0 - z) stays constant at the keys
    size = d.intrinsics[:, 0] / (3 - d.c2w[:, 2, 3])
    np.testing.assert_allclose(size, size[0], rtol=2e-3)
    assert d.intrinsics[-1, 0] < d.intrinsics[0, 0]


def test_spiral_goes_right_then_up_and_forward():
    t = _preset("spiral", radius=0.5, turns=1, distance=1, num_frames=65)
    quarter = t.c2w[16, :3, 3]
    assert quarter[0] > 0.4 and quarter[1] < -0.4 and 0.2 < quarter[2] < 0.3
    np.testing.assert_allclose(t.c2w[-1, :3, 3], [0, 0, 1], atol=1e-9)


def test_preset_parameter_errors():
    with pytest.raises(CamrenderError, match="unknown parameter"):
        presets.make("pan", radius=3)
    with pytest.raises(CamrenderError, match="unknown preset"):
        presets.make("crane")
    with pytest.raises(CamrenderError, match="smaller than subject_distance"):
        presets.make("dolly_zoom", distance=4, subject_distance=3)
    with pytest.raises(CamrenderError) as e:
        presets.make("orbit", radius=-1)
    assert e.value.field == "preset.radius"


def test_every_preset_expands_and_validates():
    for name in presets.PRESETS:
        t = _preset(name, num_frames=17)
        assert t.num_frames == 17
        np.testing.assert_allclose(t.c2w[0], np.eye(4), atol=1e-12)


# The 8k+1 rule
def test_nearest_model_length():
    assert [nearest_model_length(n) for n in (1, 2, 5, 9, 12, 13, 14, 150, 161)] == [1, 9, 9, 9, 9, 17, 17, 153, 161]


def test_to_model_frames_resamples_without_truncating():
    t = _preset("dolly", distance=3, num_frames=150)
    m = to_model_frames(t)
    assert m.num_frames == 153 and m.fps == t.fps
    np.testing.assert_allclose(m.c2w[-1], t.c2w[-1])  # the end of the path is kept
    np.testing.assert_allclose(np.diff(m.c2w[:, 2, 3]), 3 / 152, atol=1e-12)
    same = to_model_frames(_preset("pan", num_frames=17))
    assert same.num_frames == 17
    down = to_model_frames(t, num_frames=81)
    assert down.num_frames == 81
    np.testing.assert_allclose(down.c2w[-1], t.c2w[-1])
    with pytest.raises(CamrenderError, match="not 8k\\+1"):
        to_model_frames(t, num_frames=100)


def test_to_model_frames_interpolates_rotation_and_focal():
    z = _preset("zoom", factor=3, num_frames=12)
    m = to_model_frames(z)  # 12 -> 9
    tan = 640 / m.intrinsics[:, 0]
    np.testing.assert_allclose(np.diff(tan), np.diff(tan)[0], rtol=1e-9)  # still linear in tan(fov/2)
    p = to_model_frames(_preset("pan", degrees=40, num_frames=30))  # 30 -> 33
    np.testing.assert_allclose(rotation_angles(p.c2w), 40 / 32, atol=1e-9)
