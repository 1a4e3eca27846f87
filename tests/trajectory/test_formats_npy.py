"""NVlabs' NAME_pose.npy / NAME_intrinsics.npy (camrender.trajectory.formats.npy) on files written here:
every intrinsics shape, fitting in time, the resize-to-cover + crop map against NVlabs' definition,
round trips, and bad files."""
import os

import numpy as np
import PIL.Image
import pytest

from camrender.errors import CamrenderError
from camrender.trajectory import formats, load
from camrender.trajectory.controls import make_scheme, rollout
from camrender.trajectory.crop import crop_intrinsics
from camrender.trajectory.formats import npy

from helpers import run_cli


def poses(frames):
    return rollout(make_scheme(), [{"w", "a"} if i % 50 < 30 else {"i", "l"} for i in range(frames - 1)])


def reference_fit(values, num_frames):
    """NVlabs' load_intrinsics written out: (F', 4) -> (num_frames, 4)."""
    if len(values) >= num_frames:
        return values[:num_frames]
    if len(values) == 1:
        return np.repeat(values, num_frames, axis=0)
    t_old, t_new = np.linspace(0, 1, len(values)), np.linspace(0, 1, num_frames)
    return np.stack([np.interp(t_new, t_old, values[:, i]) for i in range(4)], axis=1)


def reference_crop(k, src, dst):
    """NVlabs' resize_and_center_crop + transform_intrinsics_for_crop written out."""
    (sw, sh), (tw, th) = src, dst
    scale = max(th / sh, tw / sw)
    rw, rh = max(tw, int(round(sw * scale))), max(th, int(round(sh * scale)))
    left, top = (rw - tw) // 2, (rh - th) // 2
    out = np.array(k, dtype=np.float64)
    out[:, 0] *= rw / sw
    out[:, 2] = out[:, 2] * rw / sw - left
    out[:, 1] *= rh / sh
    out[:, 3] = out[:, 3] * rh / sh - top
    return out


def as_matrices(vec4):
    k = np.zeros((len(vec4), 3, 3))
    k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2], k[:, 2, 2] = *vec4.T, 1.0
    return k


@pytest.mark.parametrize("count", [1, 7, 41, 60])
@pytest.mark.parametrize("as_3x3", [False, True])
def test_every_intrinsics_shape_fitted_in_time(tmp_path, count, as_3x3):
    rng = np.random.default_rng(count)
    vec4 = np.column_stack([rng.uniform(500, 900, (count, 2)), rng.uniform(300, 500, (count, 2))])
    np.save(tmp_path / "k.npy", as_matrices(vec4) if as_3x3 else vec4)
    np.save(tmp_path / "walk_pose.npy", poses(41).astype(np.float32))
    traj = npy.read(tmp_path / "walk_pose.npy", intrinsics=tmp_path / "k.npy", image_size=(960, 540))
    np.testing.assert_allclose(traj.intrinsics, reference_fit(vec4, 41), atol=1e-9)  # shorter, equal, longer, 1
    assert (traj.width, traj.height, traj.num_frames) == (960, 540, 41)
    if count == 1:  # the single-frame shapes (4,) and (3, 3)
        np.save(tmp_path / "one.npy", as_matrices(vec4)[0] if as_3x3 else vec4[0])
        single = npy.read(tmp_path / "walk_pose.npy", intrinsics=tmp_path / "one.npy", image_size=(960, 540))
        np.testing.assert_array_equal(single.intrinsics, traj.intrinsics)


def test_pose_files_of_1_and_1000_frames_and_the_file_beside_them(tmp_path):
    for frames in (1, 1000):
        c2w = poses(frames)
        np.save(tmp_path / f"p{frames}_pose.npy", c2w)
        np.save(tmp_path / f"p{frames}_intrinsics.npy", np.array([600.0, 600.0, 320.0, 240.0]))
        traj = load(tmp_path / f"p{frames}_pose.npy")  # the intrinsics come from the file beside it
        assert traj.num_frames == frames and (traj.width, traj.height) == (1280, 704)  # no image: the render size
        np.testing.assert_array_equal(traj.c2w, c2w)
        np.testing.assert_array_equal(traj.intrinsics, np.tile([600.0, 600.0, 320.0, 240.0], (frames, 1)))
    np.save(tmp_path / "bare.npy", poses(9))
    notes = []
    traj = formats.import_file(tmp_path / "bare.npy", notes=notes)
    assert len(notes) == 1 and "60 degree" in notes[0]
    assert traj.intrinsics[0, 0] == pytest.approx(0.5 * 1280 / np.tan(np.radians(30)))


def test_intrinsics_without_an_image_say_the_size_they_assume(tmp_path, capsys):
    """`traj check NAME_pose.npy` with NAME_intrinsics.npy beside it: the size the pixels are taken in is said
    (the field of view depends on it); with --image it is the image's, and nothing is said."""
    np.save(tmp_path / "demo_pose.npy", poses(9))
    np.save(tmp_path / "demo_intrinsics.npy", np.array([600.0, 600.0, 480.0, 270.0]))
    PIL.Image.new("RGB", (960, 540)).save(tmp_path / "first.png")
    code, out, err = run_cli(["traj", "check", tmp_path / "demo_pose.npy"], capsys)
    assert code == 0 and "image size:   1280 x 704" in out
    assert err.count("\n") == 1 and "demo_intrinsics.npy are taken as pixels of a 1280x704 image" in err
    code, out, err = run_cli(["traj", "check", tmp_path / "demo_pose.npy", "--image", tmp_path / "first.png"], capsys)
    assert code == 0 and "image size:   960 x 540" in out and err == ""


@pytest.mark.parametrize("src", [(960, 540), (1280, 704), (1024, 1024), (333, 777), (1920, 1081)])
@pytest.mark.parametrize("dst", [(1280, 704), (112, 64), (640, 352), (704, 1280)])
def test_the_crop_map_is_nvlabs_at_any_render_size(src, dst):
    from diffusers.pipelines.sana_wm.cam_utils import resize_and_center_crop, transform_intrinsics_for_crop

    k = np.array([[0.8 * src[0], 0.9 * src[0], 0.5 * src[0] + 3, 0.5 * src[1] - 2]])
    ours = crop_intrinsics(k, src, dst)
    np.testing.assert_allclose(ours, reference_crop(k, src, dst), atol=0.01)
    _, s, resized, offset = resize_and_center_crop(PIL.Image.new("RGB", src), dst[1], dst[0])
    np.testing.assert_allclose(ours, transform_intrinsics_for_crop(k.astype(np.float32), s, resized, offset), atol=0.01)


def test_convert_to_the_render_size_and_to_the_official_pair_and_back(tmp_path, capsys):
    PIL.Image.new("RGB", (960, 540)).save(tmp_path / "first.png")
    k = np.array([[700.0, 0, 470], [0, 710, 275], [0, 0, 1]])
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "demo_pose.npy", poses(17))
    code, _, err = run_cli(["traj", "convert", tmp_path / "demo_pose.npy", "--intrinsics", tmp_path / "k.npy",
                            "--image", tmp_path / "first.png", "-o", tmp_path / "path.json"], capsys)
    assert code == 0, err
    path = load(tmp_path / "path.json")
    assert (path.width, path.height) == (1280, 704) and os.path.basename(path.image) == "first.png"
    expected = reference_crop(np.array([[700.0, 710, 470, 275]]), (960, 540), (1280, 704))
    np.testing.assert_allclose(path.intrinsics, np.repeat(expected, 17, axis=0), atol=0.01)
    np.testing.assert_allclose(path.c2w, poses(17), atol=1e-12)
    # v1 -> the official pair -> v1: exact
    code, _, err = run_cli(["traj", "convert", tmp_path / "path.json", "-o", tmp_path / "out_pose.npy"], capsys)
    assert code == 0, err
    assert np.load(tmp_path / "out_intrinsics.npy").shape == (17, 4)
    back = load(tmp_path / "out_pose.npy")
    np.testing.assert_array_equal(back.c2w, path.c2w)
    np.testing.assert_array_equal(back.intrinsics, path.intrinsics)
    assert (back.width, back.height) == (path.width, path.height)


def _write(tmp_path, name, array, **kwargs):
    np.save(tmp_path / name, array, **kwargs)
    return tmp_path / name


def test_bad_pose_and_intrinsics_files(tmp_path):
    good = _write(tmp_path, "good.npy", poses(5))
    non_rigid = poses(5)
    non_rigid[2, :3, :3] *= 1.5
    nan = poses(5)
    nan[3, 0, 3] = np.inf
    cases = [
        (_write(tmp_path, "flat.npy", np.zeros((5, 16))), "flat.npy: c2w: poses must have shape (F, 4, 4)"),
        (_write(tmp_path, "int.npy", np.zeros((5, 4, 4), dtype=np.int64)), "must hold floating-point numbers"),
        (_write(tmp_path, "rigid.npy", non_rigid), "rigid.npy: frame 2: c2w: rotation is not orthonormal"),
        (_write(tmp_path, "nan.npy", nan), "nan.npy: frame 3: c2w: contains a non-finite number"),
        (_write(tmp_path, "obj.npy", np.array([None, 1], dtype=object), allow_pickle=True), "never loads pickles"),
    ]
    (tmp_path / "text.npy").write_text("w-10")
    cases.append((tmp_path / "text.npy", "not a .npy array file"))
    with open(tmp_path / "huge.npy", "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f8", "fortran_order": False, "shape": (10**8, 4, 4)})
    cases.append((tmp_path / "huge.npy", "declares an array of shape (100000000, 4, 4)"))
    for path, message in cases:
        with pytest.raises(CamrenderError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load(path)
    bad_k = [(np.ones((2, 5)), "intrinsics must have shape"), (np.ones((3, 3, 4)), "intrinsics must have shape"),
             (np.array([[500.0, -1, 10, 10]]), "frame 0: fy: focal length must be positive"),
             (np.array([[500.0, 500, np.nan, 10]]), "frame 0: cx: must be a finite number"),
             (np.zeros((0, 4)), "intrinsics must have shape")]
    for array, message in bad_k:
        with pytest.raises(CamrenderError, match=message):
            formats.import_file(good, intrinsics=_write(tmp_path, "k.npy", array))
    (tmp_path / "k.txt").write_text("500 500 10 10")
    with pytest.raises(CamrenderError, match="k.txt: intrinsics: must be a .npy file"):
        formats.import_file(good, intrinsics=tmp_path / "k.txt")
