"""instant-ngp / nerfstudio transforms.json import (and export) against files built here."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from camrender.cli.main import main
from camrender.trajectory.formats import detect, export_file, import_file, transforms_json
from camrender.trajectory import Trajectory
from camrender.trajectory.rotations import rot_x, rot_y, rot_z

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def gl_poses(n, seed=0):
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (n, 1, 1))
    for i in range(n):
        poses[i, :3, :3] = rot_z(rng.uniform(-3, 3)) @ rot_x(rng.uniform(-1.5, 1.5)) @ rot_y(rng.uniform(-3, 3))
        poses[i, :3, 3] = rng.normal(size=3)
    return poses


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_nerfstudio_style_round_trip_with_per_frame_overrides(tmp_path):
    poses = gl_poses(4)
    names = ["images/frame_10.png", "images/frame_2.png", "images/frame_1.png", "images/frame_3.png"]
    frames = [{"file_path": name, "transform_matrix": pose.tolist()} for name, pose in zip(names, poses)]
    frames[1]["fl_x"] = 700.0  # per-frame override of the shared focal length
    frames[1]["cy"] = 250.5
    doc = {"camera_model": "OPENCV", "fl_x": 600.0, "fl_y": 610.0, "cx": 319.5, "cy": 239.5, "w": 640, "h": 480,
           "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0, "aabb_scale": 16, "frames": frames}
    path = write(tmp_path / "transforms.json", doc)
    assert detect(path) is transforms_json
    traj = import_file(path)
    order = [2, 1, 3, 0]  # frame_1, frame_2, frame_3, frame_10
    assert (traj.width, traj.height, traj.fps) == (640, 480, 16.0)
    for frame, i in enumerate(order):
        assert np.allclose(traj.c2w[frame], poses[i] @ GL_TO_CV, atol=1e-12)
    assert np.array_equal(traj.intrinsics[1], [700.0, 610.0, 319.5, 250.5])
    assert np.array_equal(traj.intrinsics[0], [600.0, 610.0, 319.5, 239.5])


def test_opengl_axes_become_opencv(tmp_path):
    # an OpenGL camera at the origin looks along world -z with +y up: in OpenCV terms its
    # forward axis (+z camera) is world -z and its down axis (+y camera) is world -y
    doc = {"w": 8, "h": 6, "fl_x": 5.0, "frames": [{"transform_matrix": np.eye(4).tolist()}]}
    traj = import_file(write(tmp_path / "t.json", doc), "transforms_json")
    assert np.allclose(traj.c2w[0][:3, 2], [0, 0, -1]) and np.allclose(traj.c2w[0][:3, 1], [0, -1, 0])
    assert np.array_equal(traj.intrinsics[0], [5.0, 5.0, 4.0, 3.0])  # fl_y = fl_x, centre by default


def test_camera_angle_and_size_from_the_image_file(tmp_path):
    import imageio.v3 as iio

    (tmp_path / "train").mkdir()
    iio.imwrite(tmp_path / "train" / "r_0.png", np.zeros((30, 40, 3), np.uint8))
    angle = 0.6911112070083618  # the NeRF synthetic scenes' camera_angle_x
    doc = {"camera_angle_x": angle, "frames": [
        {"file_path": "./train/r_1", "rotation": 0.0, "transform_matrix": gl_poses(2, 1)[1].tolist()},
        {"file_path": "./train/r_0", "rotation": 0.0, "transform_matrix": gl_poses(2, 1)[0].tolist()},
    ]}
    traj = import_file(write(tmp_path / "transforms_train.json", doc))
    assert (traj.width, traj.height) == (40, 30)
    focal = 0.5 * 40 / math.tan(0.5 * angle)
    assert np.allclose(traj.intrinsics, [[focal, focal, 20.0, 15.0]] * 2)
    assert np.allclose(traj.c2w[0], gl_poses(2, 1)[0] @ GL_TO_CV)


def test_camera_angle_y_gives_fy(tmp_path):
    doc = {"w": 100, "h": 50, "camera_angle_x": math.radians(90), "camera_angle_y": math.radians(60),
           "frames": [{"transform_matrix": np.eye(4).tolist()}]}
    traj = import_file(write(tmp_path / "t.json", doc), "transforms_json")
    assert np.allclose(traj.intrinsics[0], [50.0, 25.0 / math.tan(math.radians(30)), 50.0, 25.0])


def test_write_then_read_round_trip(tmp_path):
    poses = gl_poses(5, 3) @ GL_TO_CV
    intrinsics = np.tile([500.0, 505.0, 320.0, 180.0], (5, 1))
    intrinsics[3, 0] = 550.0
    traj = Trajectory(poses, intrinsics, 640, 360, 24.0)
    export_file(traj, tmp_path / "transforms.json", "transforms_json")
    back = import_file(tmp_path / "transforms.json")
    assert back.fps == 24.0 and (back.width, back.height) == (640, 360)
    assert np.allclose(back.c2w, poses, atol=1e-12)
    assert np.array_equal(back.intrinsics, intrinsics)


def test_distortion_warns(tmp_path, capsys):
    doc = {"w": 64, "h": 48, "fl_x": 50.0, "k1": 0.1, "frames": [{"transform_matrix": np.eye(4).tolist()}]}
    import_file(write(tmp_path / "t.json", doc), "transforms_json")
    assert "distortion" in capsys.readouterr().err


def error_line(tmp_path, capsys, doc, name="transforms.json"):
    path = write(tmp_path / name, doc)
    with pytest.raises(SystemExit) as done:
        main(["traj", "preview", str(path), "-o", str(tmp_path / "p.mp4"), "--width", "32"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "p.mp4").exists()
    return err


EYE = np.eye(4).tolist()
BASE = {"w": 64, "h": 48, "fl_x": 50.0}


@pytest.mark.parametrize("doc, needles", [
    ({**BASE, "frames": [{"transform_matrix": EYE}, {"file_path": "b"}]}, ["frame 1", "frames[1].transform_matrix", "missing"]),
    ({**BASE, "frames": [{"transform_matrix": EYE}, {"transform_matrix": [[1, 0, 0], [0, 1, 0]]}]},
     ["frame 1", "frames[1].transform_matrix", "4x4"]),
    ({**BASE, "frames": [{"transform_matrix": (np.eye(4) * 2).tolist()}]}, ["frame 0", "transform_matrix", "last row"]),
    ({**BASE, "frames": [{"transform_matrix": np.diag([1.0, 1.0, -1.0, 1.0]).tolist()}]}, ["frame 0", "determinant"]),
    ({**BASE, "camera_model": "OPENCV_FISHEYE", "frames": [{"transform_matrix": EYE}]}, ["camera_model", "OPENCV_FISHEYE"]),
    ({"fl_x": 50.0, "frames": [{"transform_matrix": EYE, "file_path": "nothere.png"}]}, ["frame 0", "frames[0].w", "image size"]),
    ({"w": 64, "h": 48, "frames": [{"transform_matrix": EYE}]}, ["frames[0].fl_x", "camera_angle_x"]),
    ({**BASE, "frames": [{"transform_matrix": EYE}, {"transform_matrix": EYE, "fl_x": -3}]}, ["frame 1", "frames[1].fl_x", "positive"]),
    ({**BASE, "frames": [{"transform_matrix": EYE}, {"transform_matrix": EYE, "w": 32}]}, ["frame 1", "differs"]),
    ({"w": 64, "h": 48, "camera_angle_x": 60, "frames": [{"transform_matrix": EYE}]}, ["camera_angle_x", "degrees"]),
    ({**BASE, "frames": []}, ["frames", "empty"]),
])
def test_bad_input_names_file_frame_and_field(tmp_path, capsys, doc, needles):
    message = error_line(tmp_path, capsys, doc)
    assert "transforms.json" in message
    for needle in needles:
        assert needle in message, message


def test_sniff_leaves_other_json_formats_alone(tmp_path):
    assert transforms_json.sniff({"frames": [{"transform_matrix": EYE}]})
    assert not transforms_json.sniff({"version": 1, "frames": [{"c2w": EYE}]})
    assert not transforms_json.sniff({"camera_path": [], "frames": []})
    assert not transforms_json.sniff([1, 2])
