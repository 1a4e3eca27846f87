"""COLMAP images.txt + cameras.txt import (and export) against files built here."""
from __future__ import annotations

import numpy as np
import pytest

from camrender.cli.main import main
from camrender.errors import CamrenderError
from camrender.trajectory.formats import colmap, detect, export_file, import_file
from camrender.trajectory import Trajectory


def quat_to_rot(q):
    """Hamilton unit quaternion (w, x, y, z) -> rotation matrix, written out independently here."""
    w, x, y, z = q
    return np.array([
        [w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z],
    ])


def random_images(n, seed=0):
    rng = np.random.default_rng(seed)
    quats = rng.normal(size=(n, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    return quats, rng.normal(size=(n, 3)) * 3


def write_model(folder, quats, trans, names, camera_ids, cameras, *, points=True):
    """Write images.txt / cameras.txt the way COLMAP does (comments, a points line after every image)."""
    lines = ["# Image list with two lines of data per image:", "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
             "# Number of images: %d" % len(names)]
    for i, (q, t, name, cam) in enumerate(zip(quats, trans, names, camera_ids)):
        lines.append(" ".join([str(100 + i), *map(repr, map(float, q)), *map(repr, map(float, t)), str(cam), name]))
        lines.append("12.5 30.25 -1 40.0 41.5 7" if points and i % 2 else "")
    (folder / "images.txt").write_text("\n".join(lines) + "\n")
    cam_lines = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]"]
    cam_lines += [f"{cid} {text}" for cid, text in cameras.items()]
    (folder / "cameras.txt").write_text("\n".join(cam_lines) + "\n")
    return folder / "images.txt"


def test_round_trip_poses_and_pinhole_intrinsics(tmp_path):
    quats, trans = random_images(6)
    # names out of order in the file, with numbers compared as numbers
    names = ["img10.png", "img2.png", "img1.png", "img33.png", "img3.png", "img20.png"]
    cams = [1, 2, 1, 2, 1, 1]
    path = write_model(tmp_path, quats, trans, names, cams,
                       {1: "PINHOLE 640 360 500.5 498.25 320.5 181.75", 2: "SIMPLE_PINHOLE 640 360 610.0 300.0 170.0"})
    assert detect(path) is colmap
    traj = import_file(path)
    order = sorted(range(6), key=lambda i: int(names[i][3:-4]))
    assert [names[i] for i in order] == ["img1.png", "img2.png", "img3.png", "img10.png", "img20.png", "img33.png"]
    assert (traj.width, traj.height, traj.fps, traj.num_frames) == (640, 360, 16.0, 6)
    for frame, i in enumerate(order):
        w2c = np.eye(4)
        w2c[:3, :3] = quat_to_rot(quats[i])
        w2c[:3, 3] = trans[i]
        assert np.allclose(traj.c2w[frame], np.linalg.inv(w2c), atol=1e-9, rtol=0)
        expected = [500.5, 498.25, 320.5, 181.75] if cams[i] == 1 else [610.0, 610.0, 300.0, 170.0]
        assert np.array_equal(traj.intrinsics[frame], expected)


def test_camera_centre_is_minus_r_transpose_t(tmp_path):
    # a camera at world (1, 2, 3) looking along world +z: R = I, t = -C
    path = write_model(tmp_path, [[1.0, 0, 0, 0]], [[-1.0, -2.0, -3.0]], ["a.jpg"], [1], {1: "PINHOLE 8 6 5 5 4 3"})
    traj = import_file(path)
    assert np.allclose(traj.c2w[0], [[1, 0, 0, 1], [0, 1, 0, 2], [0, 0, 1, 3], [0, 0, 0, 1]])


def test_directory_with_explicit_format(tmp_path):
    quats, trans = random_images(2, seed=4)
    write_model(tmp_path, quats, trans, ["b", "a"], [1, 1], {1: "PINHOLE 64 48 50 50 32 24"})
    traj = import_file(tmp_path, "colmap")
    assert traj.num_frames == 2


@pytest.mark.parametrize("model, params, expected", [
    ("SIMPLE_RADIAL", "400 320 180 0.01", [400, 400, 320, 180]),
    ("RADIAL", "400 320 180 0.01 -0.002", [400, 400, 320, 180]),
    ("OPENCV", "400 410 320 180 0.01 0.0 0.001 0.0", [400, 410, 320, 180]),
    ("FULL_OPENCV", "400 410 320 180 0.01 0 0 0 0 0 0 0", [400, 410, 320, 180]),
])
def test_distortion_is_dropped_with_a_warning(tmp_path, capsys, model, params, expected):
    quats, trans = random_images(1)
    path = write_model(tmp_path, quats, trans, ["x.png"], [7], {7: f"{model} 640 360 {params}"})
    traj = import_file(path)
    assert np.array_equal(traj.intrinsics[0], expected)
    err = capsys.readouterr().err
    assert "warning" in err and "distortion" in err and "7" in err


def test_zero_distortion_gives_no_warning(tmp_path, capsys):
    quats, trans = random_images(1)
    path = write_model(tmp_path, quats, trans, ["x.png"], [1], {1: "OPENCV 640 360 400 410 320 180 0 0 0 0"})
    import_file(path)
    assert capsys.readouterr().err == ""


def test_write_then_read_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    quats, trans = random_images(5, seed=2)
    c2w = np.tile(np.eye(4), (5, 1, 1))
    for f in range(5):
        c2w[f, :3, :3] = quat_to_rot(quats[f]).T
        c2w[f, :3, 3] = -quat_to_rot(quats[f]).T @ trans[f]
    intrinsics = np.column_stack([rng.uniform(300, 600, 5), rng.uniform(300, 600, 5), np.full(5, 320.0), np.full(5, 180.0)])
    traj = Trajectory(c2w, intrinsics, 640, 360, 16.0)
    export_file(traj, tmp_path / "images.txt", "colmap")
    assert (tmp_path / "cameras.txt").exists()
    back = import_file(tmp_path / "images.txt")
    assert np.allclose(back.c2w, c2w, atol=1e-9, rtol=0)
    assert np.array_equal(back.intrinsics, intrinsics)


def one_line_error(tmp_path, capsys, path):
    with pytest.raises(SystemExit) as done:
        main(["traj", "plot", str(path), "-o", str(tmp_path / "plot.png")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "plot.png").exists()
    return err.strip()


GOOD_Q = "0.5 0.5 0.5 0.5"


@pytest.mark.parametrize("image_line, camera_line, needles", [
    (f"1 {GOOD_Q} 0 0 x 1 a.png", "1 PINHOLE 64 48 50 50 32 24", ["images.txt", "line 2", "TZ", "'x'"]),
    (f"1 {GOOD_Q} 0 0 0 9 a.png", "1 PINHOLE 64 48 50 50 32 24", ["images.txt", "line 2", "CAMERA_ID", "camera 9"]),
    ("1 2 0 0 0 0 0 0 1 a.png", "1 PINHOLE 64 48 50 50 32 24", ["images.txt", "line 2", "QW", "unit length"]),
    (f"1 {GOOD_Q} 0 0 0 1", "1 PINHOLE 64 48 50 50 32 24", ["images.txt", "line 2", "9 fields"]),
    (f"1 {GOOD_Q} 0 0 0 1 a.png", "1 OPENCV_FISHEYE 64 48 50 50 32 24 0 0 0 0", ["cameras.txt", "line 1", "MODEL", "image_undistorter"]),
    (f"1 {GOOD_Q} 0 0 0 1 a.png", "1 PINHOLE 64 48 50 50 32", ["cameras.txt", "line 1", "PINHOLE takes 4"]),
    (f"1 {GOOD_Q} 0 0 0 1 a.png", "1 PINHOLE 64 48 -50 50 32 24", ["cameras.txt", "line 1", "fx", "positive"]),
    (f"1 {GOOD_Q} 0 0 0 1 a.png", "1 PINHOLE 64 48 nan 50 32 24", ["cameras.txt", "line 1", "PARAMS[0]", "finite"]),
])
def test_bad_input_names_file_line_and_field(tmp_path, capsys, image_line, camera_line, needles):
    (tmp_path / "images.txt").write_text(f"# Image list with two lines of data per image:\n{image_line}\n\n")
    (tmp_path / "cameras.txt").write_text(camera_line + "\n")
    message = one_line_error(tmp_path, capsys, tmp_path / "images.txt")
    for needle in needles:
        assert needle in message, message


def test_missing_cameras_mixed_sizes_and_duplicate_names(tmp_path, capsys):
    quats, trans = random_images(2)
    path = write_model(tmp_path, quats, trans, ["a", "b"], [1, 2], {1: "PINHOLE 64 48 50 50 32 24", 2: "PINHOLE 32 24 50 50 16 12"})
    message = one_line_error(tmp_path, capsys, path)
    assert "frame 1" in message and "32x24" in message and "64x48" in message
    write_model(tmp_path, quats, trans, ["a", "a"], [1, 1], {1: "PINHOLE 64 48 50 50 32 24"})
    assert "appears twice" in one_line_error(tmp_path, capsys, path)
    (tmp_path / "cameras.txt").unlink()
    assert "cameras.txt: not found" in one_line_error(tmp_path, capsys, path)


def test_realestate10k_text_is_not_taken_for_colmap(tmp_path):
    line = "0 0.5 0.9 0.5 0.5 0 0 1 0 0 0 0 1 0 0 0 0 1 0"
    (tmp_path / "re.txt").write_text("https://youtube.com/x\n" + line + "\n")
    assert detect(tmp_path / "re.txt").NAME == "realestate10k"
    assert not colmap.sniff("https://youtube.com/x\n" + line + "\n")
    assert colmap.sniff(f"1 {GOOD_Q} 0 0 0 1 a.png\n\n")


def test_reader_api_error_type(tmp_path):
    (tmp_path / "images.txt").write_text("# nothing\n")
    (tmp_path / "cameras.txt").write_text("1 PINHOLE 64 48 50 50 32 24\n")
    with pytest.raises(CamrenderError, match="no images found"):
        colmap.read(tmp_path / "images.txt")
