"""Importers/exporters: round trips (import -> export -> import within 1e-9), detection, errors, actions parity."""
import json
import math

import numpy as np
import pytest

from camrender.trajectory import formats
from camrender.errors import CamrenderError
from camrender.trajectory.formats import actions, nerfstudio, realestate10k
from camrender.trajectory import Trajectory, load, rotations, save


def _random_traj(n=7, seed=0, width=640, height=360):
    rng = np.random.default_rng(seed)
    c2w = np.tile(np.eye(4), (n, 1, 1))
    for i in range(n):
        q = rng.normal(size=4)
        c2w[i, :3, :3] = rotations.quat_to_matrix(q / np.linalg.norm(q))
        c2w[i, :3, 3] = rng.normal(size=3) * 3
    focal = rng.uniform(300, 900, size=n)
    intr = np.stack([focal, focal, np.full(n, width / 2), np.full(n, height / 2)], axis=1)
    return Trajectory(c2w, intr, width, height, 16.0)


def _re10k_text(traj, url="https://www.youtube.com/watch?v=abc"):
    w2c = np.linalg.inv(traj.c2w)
    lines = [url]
    for i in range(traj.num_frames):
        fx, fy, cx, cy = traj.intrinsics[i] / [traj.width, traj.height, traj.width, traj.height]
        row = [f"{int(i * 1e6 / 30)}", f"{fx:.9f}", f"{fy:.9f}", f"{cx:.9f}", f"{cy:.9f}", "0", "0"]
        row += [f"{v:.9f}" for v in w2c[i, :3, :4].reshape(-1)]
        lines.append(" ".join(row))
    return "\n".join(lines) + "\n"


def test_realestate10k_reads_a_camera_file(tmp_path):
    src = _random_traj(width=1280, height=720)
    path = tmp_path / "clip.txt"
    path.write_text(_re10k_text(src))
    t = load(path)
    assert (t.width, t.height) == (1280, 720) and t.num_frames == 7
    assert abs(t.fps - 30) < 1e-3
    np.testing.assert_allclose(t.c2w, src.c2w, atol=1e-7)
    np.testing.assert_allclose(t.intrinsics, src.intrinsics, atol=1e-5)


@pytest.mark.parametrize("suffix,fmt", [(".txt", "realestate10k"), ("_camera_path.json", "nerfstudio"), (".json", "v1")])
def test_import_export_import_round_trip_within_1e_9(tmp_path, suffix, fmt):
    src = _random_traj(seed=3)
    first = tmp_path / f"first{suffix}"
    formats.export_file(src, first, fmt)
    a = formats.import_file(first)  # detected by suffix/content
    second = tmp_path / f"second{suffix}"
    formats.export_file(a, second, fmt)
    b = formats.import_file(second)
    assert formats.detect(first).NAME == fmt
    np.testing.assert_allclose(b.c2w, a.c2w, atol=1e-9, rtol=0)
    np.testing.assert_allclose(b.intrinsics, a.intrinsics, atol=1e-9, rtol=0)
    np.testing.assert_allclose(a.c2w, src.c2w, atol=1e-9, rtol=0)  # and the export kept the poses
    assert (b.width, b.height) == (src.width, src.height) and abs(b.fps - src.fps) < 1e-6


def test_nerfstudio_axes_and_fov(tmp_path):
    src = _random_traj(n=3, width=800, height=600)
    path = tmp_path / "camera_path.json"
    nerfstudio.write(src, path)
    doc = json.loads(path.read_text())
    gl = np.array(doc["camera_path"][1]["camera_to_world"]).reshape(4, 4)
    np.testing.assert_allclose(gl[:3, 1], -src.c2w[1, :3, 1])  # OpenGL y = -OpenCV y
    np.testing.assert_allclose(gl[:3, 2], -src.c2w[1, :3, 2])
    fov = doc["camera_path"][1]["fov"]
    np.testing.assert_allclose(300 / math.tan(math.radians(fov) / 2), src.intrinsics[1, 1])


def test_cross_format_conversion_keeps_poses(tmp_path):
    src = _random_traj(seed=5)
    save(src, tmp_path / "a.json")
    formats.export_file(load(tmp_path / "a.json"), tmp_path / "b.txt")
    formats.export_file(load(tmp_path / "b.txt"), tmp_path / "c.json", "nerfstudio")
    np.testing.assert_allclose(load(tmp_path / "c.json").c2w, src.c2w, atol=1e-9)


def test_actions_match_diffusers_in_the_diffusers_scheme():
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    from camrender.trajectory.controls import make_scheme, rollout

    for text in ["w-80,jw-40", "W-3, ikl-100 , none-2，sd-5", "i-90,k-200,j-10", "-4,a-3"]:
        ours = actions.actions_to_c2w(text, scheme=make_scheme("diffusers"))
        ref = action_string_to_c2w(text)
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, atol=1e-5)
        # the default is NVlabs' current scheme, fed the same per-frame keys
        np.testing.assert_array_equal(actions.actions_to_c2w(text),
                                      rollout(make_scheme("sana-wm"), actions.parse_actions(text)))
    assert actions.from_string("w-8", scheme=make_scheme("diffusers", fps=30)).fps == 30


def test_actions_file_and_errors(tmp_path):
    path = tmp_path / "walk.actions"
    path.write_text("# forward then turn\nw-8,\n jw-8\n")
    t = load(path)
    assert t.num_frames == 17 and t.width == 1280 and t.fps == 16.0
    for bad, text in [("w-0", "positive"), ("x-3", "unknown keys x"), ("w3", "<keys>-<frames>"), ("", "empty")]:
        with pytest.raises(CamrenderError, match=text):
            actions.from_string(bad)


def test_detection_by_content_for_shared_suffixes(tmp_path):
    (tmp_path / "moves.txt").write_text("w-4,l-4\n")
    assert formats.detect(tmp_path / "moves.txt").NAME == "actions"
    src = _random_traj(n=2)
    realestate10k.write(src, tmp_path / "cams.txt")
    assert formats.detect(tmp_path / "cams.txt").NAME == "realestate10k"
    with pytest.raises(CamrenderError, match="cannot tell the format"):
        formats.detect(tmp_path / "x.yaml")
    with pytest.raises(CamrenderError, match="can be read but not written"):
        formats.export_file(src, tmp_path / "x.actions")
    with pytest.raises(CamrenderError, match="unknown format"):
        formats.get("blender")


def test_registry_shape():
    for module in formats.FORMAT_MODULES:
        assert isinstance(module.NAME, str) and module.SUFFIXES and callable(module.read)
    assert set(formats.names(exportable=True)) >= {"v1", "realestate10k", "nerfstudio"}


RE10K_BAD = [
    ("123 0.5 0.5 0.5\n", "expected 19 numbers"),
    ("{ts} 0.5 0.9 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 nan\n", "non-finite"),
    ("{ts} 0.5 0.9 0.5 0.5 0 0 2 0 0 0 0 1 0 0 0 0 1 0\n", "not orthonormal"),
    ("{ts} -0.5 0.9 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 0\n", "focal length must be positive"),
    ("0 0.5 0.9 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 0\n", "timestamps must increase"),
]


@pytest.mark.parametrize("line,text", RE10K_BAD)
def test_realestate10k_errors_name_frame_and_line(tmp_path, line, text):
    good = "0 0.5 0.9 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 0\n"
    path = tmp_path / "bad.txt"
    path.write_text("url\n" + good + line.format(ts=1000))
    with pytest.raises(CamrenderError) as e:
        realestate10k.read(path)
    assert text in str(e.value) and e.value.frame == 1 and "line 3" in str(e.value), str(e.value)


NERF_BAD = [
    ({"render_width": 4, "render_height": 4, "fps": 1}, "camera_path", "missing"),
    ({"render_width": 4, "render_height": 4, "fps": 1, "camera_path": [{"camera_to_world": [1] * 15, "fov": 50}]},
     "camera_to_world", "16 numbers"),
    ({"render_width": 4, "render_height": 4, "fps": 1,
      "camera_path": [{"camera_to_world": np.eye(4).reshape(-1).tolist(), "fov": 0}]}, "fov", "positive"),
    ({"render_width": 4, "render_height": 4, "fps": 1, "camera_type": "fisheye",
      "camera_path": [{"camera_to_world": np.eye(4).reshape(-1).tolist(), "fov": 50}]}, "camera_type", "perspective"),
]


@pytest.mark.parametrize("doc,field,text", NERF_BAD)
def test_nerfstudio_errors(tmp_path, doc, field, text):
    path = tmp_path / "camera_path.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CamrenderError) as e:
        nerfstudio.read(path)
    assert e.value.field == field and text in str(e.value), str(e.value)


def test_failed_export_leaves_no_file(tmp_path):
    src = _random_traj(n=2)
    with pytest.raises(CamrenderError, match="output folder does not exist"):
        save(src, tmp_path / "nope" / "x.json")
    bad = src.replace()
    bad.c2w[1, 0, 0] = np.nan  # json refuses NaN: the write fails before the rename
    with pytest.raises(ValueError):
        save(bad, tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []


def test_actions_huge_counts_are_rejected_with_a_short_message():
    with pytest.raises(CamrenderError) as e:
        actions.from_string("w-" + "9" * 5000)
    assert len(str(e.value)) < 200 and "positive integer" in str(e.value)
