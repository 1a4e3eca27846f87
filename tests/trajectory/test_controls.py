"""The control schemes (camrender.trajectory.controls) against references written here from their
definitions: NVlabs' current scheme (camera_control.py + action_string_to_c2w) and diffusers 0.42.1's
cam_utils (also compared with diffusers itself), pose for pose within 1e-6."""
import ast
import importlib.util
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.trajectory import controls
from camrender.trajectory.formats import actions
from camrender.trajectory.controls import Controller, make_scheme, rollout


def reference_sana_wm(frames, speed=0.025, turn_deg=0.6, limit_deg=60.0, smooth=True, fps=16.0):
    """NVlabs' definition, written out: velocity (tx, sx, yaw, pitch) eased per axis, integrator clamps pitch."""
    mapping = {"w": ("tx", 1), "s": ("tx", -1), "a": ("yaw", -1), "d": ("yaw", 1),
               "j": ("sx", -1), "l": ("sx", 1), "i": ("pitch", 1), "k": ("pitch", -1)}
    turn, limit, dt = math.radians(turn_deg), math.radians(limit_deg), 1.0 / fps
    vel = {"tx": 0.0, "sx": 0.0, "yaw": 0.0, "pitch": 0.0}
    pose, pitch, last = np.eye(4), 0.0, set()
    out = [pose.copy()]
    for keys in frames:
        keys = set(keys)
        target = dict.fromkeys(vel, 0.0)
        for key in keys:
            axis, sign = mapping[key]
            target[axis] += sign * (speed if axis in ("tx", "sx") else turn)
        if not smooth or keys - last:
            vel = dict(target)
        else:
            for axis in vel:
                tau = 0.45 if abs(target[axis]) > 1e-12 else 1.0
                vel[axis] += (1 - math.exp(-dt / tau)) * (target[axis] - vel[axis])
        last = keys
        new_pitch = min(limit, max(-limit, pitch + vel["pitch"]))
        dp, pitch = new_pitch - pitch, new_pitch
        cy, sy, cx, sx = math.cos(vel["yaw"]), math.sin(vel["yaw"]), math.cos(dp), math.sin(dp)
        r = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]]) @ pose[:3, :3] @ np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
        fwd, rgt = r[:, 2] * [1, 0, 1], r[:, 0] * [1, 0, 1]
        fwd = fwd / (np.linalg.norm(fwd) + 1e-6) if np.linalg.norm(fwd) > 0 else fwd
        rgt = rgt / (np.linalg.norm(rgt) + 1e-6) if np.linalg.norm(rgt) > 0 else rgt
        new = np.eye(4)
        new[:3, :3], new[:3, 3] = r, pose[:3, 3] + fwd * vel["tx"] + rgt * vel["sx"]
        pose = new
        out.append(pose.copy())
    return np.stack(out)


def reference_diffusers(frames, speed=0.05, turn_deg=1.2, limit_deg=85.0):
    """diffusers 0.42.1 cam_utils, written out: pitch step dropped past the limit, a/d strafe, j/l yaw."""
    turn, limit = math.radians(turn_deg), math.radians(limit_deg)
    pose, pitch = np.eye(4), 0.0
    out = [pose.copy()]
    for keys in frames:
        dp = turn * (("i" in keys) - ("k" in keys))
        if -limit <= pitch + dp <= limit:
            pitch += dp
        else:
            dp = 0.0
        yaw = turn * (("l" in keys) - ("j" in keys))
        cy, sy, cx, sx = math.cos(yaw), math.sin(yaw), math.cos(dp), math.sin(dp)
        r = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]]) @ pose[:3, :3] @ np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
        fwd, rgt = r[:, 2] * [1, 0, 1], r[:, 0] * [1, 0, 1]
        fwd, rgt = fwd / np.linalg.norm(fwd), rgt / np.linalg.norm(rgt)
        move = speed * (fwd * (("w" in keys) - ("s" in keys)) + rgt * (("d" in keys) - ("a" in keys)))
        new = np.eye(4)
        new[:3, :3], new[:3, 3] = r, pose[:3, 3] + move
        pose = new
        out.append(pose.copy())
    return np.stack(out)


def random_frames(rng, segments=12):
    frames = []
    for _ in range(segments):
        keys = set(rng.choice(list("wasdijkl"), size=rng.integers(0, 4)))
        frames += [keys] * int(rng.integers(1, 40))
    return frames


# the official demo paths' kind of moves, and random ones (long pitch holds reach the limits)
FIXED = [[{"w"}] * 100 + [{"d", "w"}] * 60 + [{"w"}] * 100 + [{"a", "w"}] * 60,
         [{"i"}] * 150 + [set()] * 30 + [{"k", "j"}] * 200 + [{"w", "s"}] * 10 + [{"l", "w", "d"}] * 40]


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_sana_wm_scheme_matches_the_official_definition(seed, smooth):
    rng = np.random.default_rng(seed)
    frames = FIXED[seed] if seed < len(FIXED) else random_frames(rng)
    ours = rollout(make_scheme("sana-wm", smooth=smooth), frames)
    assert ours.shape == (len(frames) + 1, 4, 4)
    np.testing.assert_allclose(ours, reference_sana_wm(frames, smooth=smooth), atol=1e-6, rtol=0)
    # other speeds, limit and fps go through the same definition
    scheme = make_scheme("sana-wm", translation_speed=0.1, rotation_speed=2.0, pitch_limit=20, smooth=smooth, fps=30)
    np.testing.assert_allclose(rollout(scheme, frames),
                               reference_sana_wm(frames, 0.1, 2.0, 20.0, smooth, 30.0), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(3))
def test_diffusers_scheme_matches_diffusers(seed):
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    rng = np.random.default_rng(10 + seed)
    frames = FIXED[seed] if seed < len(FIXED) else random_frames(rng)
    ours = rollout(make_scheme("diffusers"), frames)
    np.testing.assert_allclose(ours, reference_diffusers(frames), atol=1e-9, rtol=0)
    text = ",".join(f"{''.join(sorted(k)) or 'none'}-1" for k in frames)
    np.testing.assert_allclose(ours, action_string_to_c2w(text), atol=1e-5, rtol=0)  # diffusers returns float32


def test_smoothing_snaps_on_press_eases_when_held_and_coasts_on_release():
    c = Controller(make_scheme("sana-wm"))
    c.step({"w"})
    assert c.velocity[0] == pytest.approx(0.025)  # a fresh press snaps to the target
    c.step(set())
    alpha = 1 - math.exp(-1 / 16 / 1.0)
    assert c.velocity[0] == pytest.approx(0.025 * (1 - alpha))  # released: coasts with tau 1 s
    c.step({"w"})  # held again: a fresh press (w was not held the frame before) snaps
    assert c.velocity[0] == pytest.approx(0.025)
    c.step({"w", "a"})  # a joins: snaps every axis
    assert c.velocity[2] == pytest.approx(-math.radians(0.6))
    c.step({"a"})  # w released, a held: forward coasts, no fresh press
    assert 0 < c.velocity[0] < 0.025 and c.frame == 5


def forward_steps(action: str) -> np.ndarray:
    """Distance moved per frame along the path of an action string (sana-wm scheme)."""
    return np.linalg.norm(np.diff(actions.actions_to_c2w(action)[:, :3, 3], axis=0), axis=1)


def test_a_new_press_ends_the_coast_of_a_released_key():
    """NVlabs' rule (`action_string_to_c2w`: `if controls - last_controls: velocity.snap_to(target)`): a
    frame pressing a key not held before snaps every axis, so `d` stops the forward coast of a released `w`
    at once, while releasing into `none` coasts."""
    turned, coasted = forward_steps("w-20,d-20"), forward_steps("w-20,none-20")
    np.testing.assert_allclose(turned[:20], 0.025, rtol=1e-5)  # NVlabs normalise by norm + 1e-6
    np.testing.assert_allclose(turned[20:], 0.0, atol=1e-12)
    decay = math.exp(-1 / 16 / 1.0)  # tau 1 s at 16 fps
    np.testing.assert_allclose(coasted[20:], 0.025 * decay ** np.arange(1, 21), rtol=1e-5)


def nvlabs_action_rollout():
    """NVlabs' own `action_string_to_c2w`, compiled from the unmodified kit file (its module imports the whole
    model stack; this function needs only `camera_control`, numpy and math), or None without the kit."""
    folder = Path(os.environ.get("SANA_WM_KIT", "/work/shared/reference/nvlabs-sana-wm")) / "src" / \
        "inference_video_scripts" / "wm"
    if not (folder / "camera_control.py").is_file() or not (folder / "inference_sana_wm.py").is_file():
        return None
    spec = importlib.util.spec_from_file_location("nvlabs_camera_control", folder / "camera_control.py")
    camera_control = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = camera_control  # its dataclass looks its module up while the class is made
    try:
        spec.loader.exec_module(camera_control)
    finally:
        del sys.modules[spec.name]
    names = dict(vars(camera_control), math=math, np=np, logging=logging, _ACTION_MAPPING_NOTICE_SHOWN=True,
                 _CAM_FPS=camera_control.FPS)
    tree = ast.parse((folder / "inference_sana_wm.py").read_text())
    wanted = [node for node in tree.body
              if (isinstance(node, ast.FunctionDef) and node.name in ("_parse_action_string", "action_string_to_c2w"))
              or (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "ALLOWED_ACTION_KEYS")]
    exec(compile(ast.Module(wanted, type_ignores=[]), str(folder / "inference_sana_wm.py"), "exec"), names)
    return names["action_string_to_c2w"]


@pytest.mark.parametrize("action", ["w-20,d-20", "w-20,none-20", "wl-10,l-10,ia-30,jd-5,none-40,k-90"])
def test_action_strings_match_nvlabs_own_function(action):
    official = nvlabs_action_rollout()
    if official is None:
        pytest.skip("NVlabs' SANA-WM sources are not here ($SANA_WM_KIT)")
    np.testing.assert_allclose(actions.actions_to_c2w(action), official(action), atol=1e-6, rtol=0)  # theirs: float32


def test_pitch_limits_and_the_start_pose():
    sana = rollout(make_scheme("sana-wm", smooth=False), [{"i"}] * 200)
    pitch = np.degrees(np.arcsin(-sana[:, 1, 2]))  # camera z's y part is -sin(pitch up)
    assert pitch.max() == pytest.approx(60.0)
    diff = rollout(make_scheme("diffusers"), [{"i"}] * 100)
    assert np.degrees(np.arcsin(-diff[-1, 1, 2])) == pytest.approx(84.0)  # 70 steps of 1.2; the 71st would pass 85
    start = np.eye(4)
    start[:3, 3] = [1.0, 2.0, 3.0]
    moved = rollout(make_scheme("sana-wm"), [{"w"}] * 10, start_c2w=start)
    np.testing.assert_allclose(moved[:, :3, 3] - [1, 2, 3], rollout(make_scheme("sana-wm"), [{"w"}] * 10)[:, :3, 3])


def test_the_two_schemes_differ_and_swapping_keys_converts_the_motion():
    old = rollout(make_scheme("diffusers"), [{"a"}] * 20)  # diffusers: a strafes left
    new = rollout(make_scheme("sana-wm", translation_speed=0.05, rotation_speed=1.2, pitch_limit=85, smooth=False),
                  [{"j"}] * 20)  # sana-wm: j strafes left
    np.testing.assert_allclose(old, new, atol=1e-5)
    assert not np.allclose(old, rollout(make_scheme("sana-wm"), [{"a"}] * 20), atol=1e-3)


def test_bad_schemes_and_keys():
    with pytest.raises(CamrenderError, match="unknown action scheme 'wasd'"):
        make_scheme("wasd")
    for kwargs, field in (({"translation_speed": float("nan")}, "translation-speed"),
                          ({"rotation_speed": -1.0}, "rotation-speed"), ({"pitch_limit": 95}, "pitch-limit"),
                          ({"fps": 0}, "fps")):
        with pytest.raises(CamrenderError, match=field):
            make_scheme("sana-wm", **kwargs)
    with pytest.raises(CamrenderError, match="unknown key 'q'"):
        Controller().step({"q"})
    scheme = make_scheme("diffusers", translation_speed=0.2)
    assert controls.scheme_from_dict(scheme.to_dict()) == scheme
    assert make_scheme(None) == controls.ControlScheme()
    with pytest.raises(CamrenderError, match="action_scheme"):
        controls.scheme_from_dict({"name": "sana-wm", "speed": 1})


def test_the_live_demo_keys_drive_the_same_controls():
    # NVlabs' demo: w/s forward/back, a/d yaw, ArrowUp/Down pitch, ArrowLeft/Right strafe
    demo = {"w": "forward", "s": "back", "a": "yaw_left", "d": "yaw_right", "arrowup": "pitch_up",
            "arrowdown": "pitch_down", "arrowleft": "strafe_left", "arrowright": "strafe_right"}
    keymap = make_scheme("sana-wm").keymap
    assert {key: keymap[letter] for key, letter in controls.DEMO_KEYS.items()} == demo
    live, letters = Controller(), Controller()
    for held in [{"arrowup", "w"}] * 5 + [set()] * 3 + [{"arrowleft"}] * 4:
        np.testing.assert_array_equal(live.step_controls({demo[k] for k in held}),
                                      letters.step({controls.DEMO_KEYS[k] for k in held}))
