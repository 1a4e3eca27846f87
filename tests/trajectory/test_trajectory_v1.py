"""v1 JSON format: per-frame, keyframes, presets, conventions, metadata, validation errors, save/load."""
import glob
import json
import math
import os

import numpy as np
import pytest

from camrender.errors import CamrenderError
from camrender.trajectory import load, rotations, save
from camrender.trajectory.v1 import parse_document

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pose(yaw_deg=0.0, position=(0.0, 0.0, 0.0)):
    m = np.eye(4)
    m[:3, :3] = rotations.rot_y(math.radians(yaw_deg))
    m[:3, 3] = position
    return m


def _frames_doc(n=3, **extra):
    frames = [
        {"c2w": _pose(10.0 * i, (0.1 * i, 0.0, 0.2 * i)).tolist(), "fx": 500.0 + i, "fy": 510.0, "cx": 320.0, "cy": 240.0}
        for i in range(n)
    ]
    return {"version": 1, "width": 640, "height": 480, "fps": 8, "frames": frames, **extra}


def _write(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_per_frame_document_gives_exact_arrays():
    doc = _frames_doc()
    t = parse_document(doc)
    assert t.num_frames == 3 and t.width == 640 and t.height == 480 and t.fps == 8.0
    np.testing.assert_array_equal(t.c2w[2], np.array(doc["frames"][2]["c2w"]))
    np.testing.assert_array_equal(t.intrinsics[1], [501.0, 510.0, 320.0, 240.0])
    assert t.c2w.dtype == np.float64 and t.intrinsics.shape == (3, 4)


def test_conventions_opengl_and_w2c_give_the_same_opencv_c2w():
    base = parse_document(_frames_doc())
    for axes in ("opencv", "opengl"):
        for pose in ("c2w", "w2c"):
            doc = _frames_doc()
            for frame, cv in zip(doc["frames"], base.c2w):
                m = cv @ rotations.GL_TO_CV if axes == "opengl" else cv
                if pose == "w2c":
                    m = np.linalg.inv(m)
                del frame["c2w"]
                frame[pose] = m.tolist()
            doc["convention"] = {"axes": axes, "pose": pose}
            np.testing.assert_allclose(parse_document(doc).c2w, base.c2w, atol=1e-12)


def test_matrix_key_must_match_the_convention():
    doc = _frames_doc(convention={"pose": "w2c"})
    with pytest.raises(CamrenderError) as e:
        parse_document(doc, path="x.json")
    assert str(e.value).startswith("x.json: frame 0: c2w:") and "w2c" in str(e.value)


def test_keyframes_look_at_interpolate_and_hit_keys():
    doc = {
        "version": 1, "width": 1280, "height": 704, "fps": 16,
        "keyframes": [
            {"t": 0, "position": [0, 0, 0], "look_at": [0, 0, 5], "fov": 60, "fov_axis": "horizontal"},
            {"t": 1, "position": [1, 0, 0], "look_at": [1, 0, 5]},
            {"frame": 32, "position": [2, -1, 0], "look_at": [2, -1, 5], "fx": 900, "fy": 950, "cx": 600, "cy": 350},
        ],
    }
    t = parse_document(doc)
    assert t.num_frames == 33  # last key at frame 32 -> 33 frames
    np.testing.assert_allclose(t.c2w[16, :3, 3], [1, 0, 0], atol=1e-12)
    np.testing.assert_allclose(t.c2w[32, :3, 3], [2, -1, 0], atol=1e-12)
    np.testing.assert_allclose(t.c2w[:, :3, :3], np.broadcast_to(np.eye(3), (33, 3, 3)), atol=1e-12)
    f0 = 640 / math.tan(math.radians(30))
    np.testing.assert_allclose(t.intrinsics[0], [f0, f0, 640, 352])
    np.testing.assert_allclose(t.intrinsics[16], [f0, f0, 640, 352])  # lens carried to the second key
    np.testing.assert_allclose(t.intrinsics[32], [900, 950, 600, 350])
    # focal linear in tan(fov/2): halfway between keys 1 and 2
    tan_mid = 0.5 * (640 / f0 + 640 / 900)
    np.testing.assert_allclose(t.intrinsics[24, 0], 640 / tan_mid)


def test_vertical_fov_axis_and_num_frames_hold_last_pose():
    doc = {
        "version": 1, "width": 1000, "height": 500, "fps": 10, "num_frames": 15,
        "keyframes": [
            {"t": 0, "c2w": np.eye(4).tolist(), "fov": 90, "fov_axis": "vertical"},
            {"t": 1, "c2w": _pose(0, (0, 0, 1)).tolist()},
        ],
    }
    t = parse_document(doc)
    assert t.num_frames == 15
    np.testing.assert_allclose(t.intrinsics[0, :2], [250, 250])
    np.testing.assert_allclose(t.c2w[10:, 2, 3], 1.0)  # after the last key the camera holds


def test_preset_document_expands_like_make():
    from camrender.trajectory import presets

    doc = {"version": 1, "fps": 8, "num_frames": 17, "preset": {"name": "dolly", "distance": 2}}
    t = parse_document(doc)
    expected = parse_document(presets.make("dolly", fps=8, num_frames=17, distance=2))
    np.testing.assert_array_equal(t.c2w, expected.c2w)
    np.testing.assert_allclose(t.c2w[-1, :3, 3], [0, 0, 2])


def test_metadata_and_relative_image(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "first.png").write_bytes(b"\x89PNG")
    path = _write(tmp_path, _frames_doc(prompt="a room", negative_prompt="blur", image="img/first.png", seed=7))
    t = load(path)
    assert (t.prompt, t.negative_prompt, t.seed) == ("a room", "blur", 7)
    assert t.image == str(tmp_path / "img" / "first.png") and os.path.isabs(t.image)
    assert t.source == path


def test_save_then_load_is_exact_and_keeps_metadata(tmp_path):
    (tmp_path / "a.png").write_bytes(b"x")
    from camrender.trajectory import presets

    t = parse_document(presets.make("orbit", num_frames=9, degrees=77))  # irregular floats
    t = t.replace(image=str(tmp_path / "a.png"), prompt="p", seed=3)
    sub = tmp_path / "out"
    sub.mkdir()
    save(t, sub / "render.traj.json")
    back = load(sub / "render.traj.json")
    np.testing.assert_array_equal(back.c2w, t.c2w)
    np.testing.assert_array_equal(back.intrinsics, t.intrinsics)
    assert back.image == t.image and back.prompt == "p" and back.seed == 3 and back.fps == t.fps
    assert json.loads((sub / "render.traj.json").read_text())["image"] == "../a.png"
    assert [p.name for p in sub.iterdir()] == ["render.traj.json"]  # no temp files left
    mask = os.umask(0)
    os.umask(mask)
    assert (sub / "render.traj.json").stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


BAD = [
    ("not json", '{"version": 1,', None, None, "invalid JSON at line 1"),
    ("not an object", "[1, 2]", None, None, "must be an object"),
    ("missing frames", {"version": 1, "width": 4, "height": 4, "fps": 1}, None, None, "exactly one of"),
    ("extra field", _frames_doc(colour="red"), None, "colour", "unknown field"),
    ("missing fx", "del fx", 1, "fx", "missing required field"),
    ("extra frame field", "frame_extra", 1, "zoom", "unknown field"),
    ("wrong shape", "shape", 1, "c2w", "4x4"),
    ("nan", "nan", 1, "c2w", "finite number"),
    ("not orthonormal", "scale", 1, "c2w", "not orthonormal"),
    ("reflection", "mirror", 1, "c2w", "determinant -1"),
    ("bottom row", "bottom", 1, "c2w", "last row"),
    ("zero focal", "fy0", 1, "fy", "positive"),
    ("bool focal", "fxbool", 1, "fx", "must be a number"),
    ("infinite cx", "cxinf", 1, "cx", "finite"),
    ("bad version", _frames_doc(version=2), None, "version", "unsupported version"),
    ("bad fps", _frames_doc(fps=0), None, "fps", "positive"),
    ("bad axes", _frames_doc(convention={"axes": "blender"}), None, "convention.axes", "must be one of"),
    ("missing image", _frames_doc(image="nope.png"), None, "image", "file not found"),
    ("negative seed", _frames_doc(seed=-1), None, "seed", "at least 0"),
]


def _bad_doc(spec):
    if not isinstance(spec, str) or spec.startswith(("{", "[")) or spec == "not json":
        return spec
    doc = _frames_doc()
    f = doc["frames"][1]
    if spec == "del fx":
        del f["fx"]
    elif spec == "frame_extra":
        f["zoom"] = 2
    elif spec == "shape":
        f["c2w"] = f["c2w"][:3]
    elif spec == "nan":
        f["c2w"][0][3] = float("nan")
    elif spec == "scale":
        f["c2w"][0][0] *= 1.1
    elif spec == "mirror":
        f["c2w"] = np.diag([1.0, 1.0, -1.0, 1.0]).tolist()
    elif spec == "bottom":
        f["c2w"][3][0] = 0.5
    elif spec == "fy0":
        f["fy"] = 0
    elif spec == "fxbool":
        f["fx"] = True
    elif spec == "cxinf":
        f["cx"] = float("inf")
    return doc


@pytest.mark.parametrize("name,spec,frame,field,text", BAD, ids=[b[0] for b in BAD])
def test_bad_documents_name_file_frame_field(tmp_path, name, spec, frame, field, text):
    doc = _bad_doc(spec)
    path = _write(tmp_path, doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(CamrenderError) as e:
        load(path)
    error = e.value
    assert error.path == path and error.frame == frame and error.field == field, str(error)
    assert text in str(error) and "\n" not in str(error)


KEY_BAD = [
    ("times not increasing", [{"t": 0, "fov": 60, "fov_axis": "horizontal", "position": [0, 0, 0], "look_at": [0, 0, 1]},
                              {"t": 0, "position": [0, 0, 1], "look_at": [0, 0, 2]}], "keyframes[1].t", "must increase"),
    ("fov without axis", [{"t": 0, "fov": 60, "position": [0, 0, 0], "look_at": [0, 0, 1]}], "keyframes[0].fov_axis",
     "explicit fov_axis"),
    ("no lens", [{"t": 0, "position": [0, 0, 0], "look_at": [0, 0, 1]}], "keyframes[0].fov", "needs a lens"),
    ("look_at = position", [{"t": 0, "fov": 60, "fov_axis": "vertical", "position": [1, 1, 1], "look_at": [1, 1, 1]}],
     "keyframes[0].look_at", "must differ"),
    ("both t and frame", [{"t": 0, "frame": 0, "fov": 60, "fov_axis": "vertical", "c2w": np.eye(4).tolist()}],
     "keyframes[0].t", "exactly one"),
    ("first not at 0", [{"t": 1, "fov": 60, "fov_axis": "vertical", "c2w": np.eye(4).tolist()}], "keyframes[0].t",
     "time 0"),
    ("negative focal", [{"t": 0, "fx": -3, "c2w": np.eye(4).tolist()}], "keyframes[0].fx", "positive"),
]


@pytest.mark.parametrize("name,keys,field,text", KEY_BAD, ids=[b[0] for b in KEY_BAD])
def test_bad_keyframes(name, keys, field, text):
    doc = {"version": 1, "width": 64, "height": 32, "fps": 4, "keyframes": keys}
    with pytest.raises(CamrenderError) as e:
        parse_document(doc, path="k.json")
    assert e.value.field == field and text in str(e.value), str(e.value)


def test_unreadable_and_directory(tmp_path):
    with pytest.raises(CamrenderError, match="file not found"):
        load(tmp_path / "missing.json")
    with pytest.raises(CamrenderError, match="directory"):
        load(tmp_path)
    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe\x00{")
    with pytest.raises(CamrenderError, match="UTF-8"):
        load(bad)


EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "trajectories", "*.json")) + glob.glob(os.path.join(ROOT, "trajectories", "*.actions")))


def test_the_shipped_examples_exist():
    names = {os.path.basename(p) for p in EXAMPLES}
    assert {"orbit.json", "dolly.json", "pan.json", "spiral.json", "keyframed.json", "long_60s.json"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_files_load(path):
    t = load(path)
    assert t.num_frames > 1 and (t.num_frames - 1) % 8 == 0
    assert np.isfinite(t.c2w).all() and (t.intrinsics[:, :2] > 0).all()


def test_orbit_example_is_the_release_shape():
    t = load(os.path.join(ROOT, "trajectories", "orbit.json"))
    assert (t.num_frames, t.fps, t.width, t.height) == (161, 16.0, 1280, 704)


def test_long_example_is_about_a_minute():
    t = load(os.path.join(ROOT, "trajectories", "long_60s.json"))
    assert 55 <= t.duration <= 65


def test_docs_json_examples_parse(tmp_path):
    """Every ```json block in docs/trajectory-format.md is a valid v1 document (or a fragment marked as such)."""
    import re

    text = open(os.path.join(ROOT, "docs", "trajectory-format.md"), encoding="utf-8").read()
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    for block in blocks:
        doc = json.loads(block)
        if "image" in doc:  # docs reference an image next to the file
            (tmp_path / doc["image"]).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / doc["image"]).write_bytes(b"x")
        t = parse_document(doc, path=str(tmp_path / "doc.json")).validate()
        assert t.num_frames >= 1


def test_extreme_numbers_are_reported_not_crashed():
    eye = np.eye(4).tolist()
    far = np.eye(4)
    far[0, 3] = 1e308
    cases = [
        ({"fps": 1e300, "keyframes": [{"t": 0, "c2w": eye, "fx": 50}, {"t": 1e10, "c2w": eye}]}, "more than"),
        ({"fps": 16, "num_frames": 20,
          "keyframes": [{"t": 0, "c2w": eye, "fx": 50}, {"t": 5e-324, "c2w": far.tolist(), "fx": 1e-300}]},
         "beyond 1e\\+06 units"),  # refused before anything can overflow
        ({"fps": 16, "num_frames": 10**7, "keyframes": [{"t": 0, "c2w": eye, "fx": 50}]}, "at most"),
    ]
    for extra, text in cases:
        doc = {"version": 1, "width": 64, "height": 64, **extra}
        with pytest.raises(CamrenderError, match=text):
            parse_document(doc, "x.json")


def test_preset_rejects_a_non_default_convention():
    doc = {"version": 1, "convention": {"axes": "opengl"}, "preset": {"name": "pan"}}
    with pytest.raises(CamrenderError, match="presets are defined in OpenCV c2w"):
        parse_document(doc, "x.json")
