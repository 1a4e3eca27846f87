"""`camrender traj plot|preview|concat|retime` through the real CLI entry point."""
from __future__ import annotations

import os

import numpy as np
import pytest

from camrender.cli.main import main
from camrender.errors import CamrenderError
from camrender.trajectory.edit import concat, retime
from camrender.trajectory import Trajectory, load, save
from camrender.trajectory.rotations import rot_x, rot_y, rot_z


def run(argv, capsys):
    """(exit code, stdout, stderr) of `camrender ARGV`."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("camrender: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def make_path(frames=9, *, start=None, step=(0.0, 0.0, 0.25), yaw_step=0.05, width=128, height=72, fps=16.0, focal=100.0):
    """A path moving by `step` (camera frame) and turning `yaw_step` radians per frame from `start`."""
    start = np.eye(4) if start is None else start
    c2w = np.empty((frames, 4, 4))
    pose = start.copy()
    for f in range(frames):
        c2w[f] = pose
        move = np.eye(4)
        move[:3, :3] = rot_y(yaw_step)
        move[:3, 3] = step
        pose = pose @ move
    intrinsics = np.tile([focal, focal, width / 2, height / 2], (frames, 1))
    intrinsics[:, 0] += np.arange(frames)  # a slow zoom, so intrinsics order is checked too
    return Trajectory(c2w, intrinsics, width, height, fps)


def random_pose(seed):
    rng = np.random.default_rng(seed)
    pose = np.eye(4)
    pose[:3, :3] = rot_z(rng.uniform(-3, 3)) @ rot_x(rng.uniform(-1, 1)) @ rot_y(rng.uniform(-3, 3))
    pose[:3, 3] = rng.normal(size=3) * 5
    return pose


def test_concat_continues_second_path_from_end_of_first(tmp_path, capsys):
    first = make_path(7)
    second = make_path(5, start=random_pose(1), step=(0.1, -0.05, 0.0), yaw_step=-0.1, focal=80.0)
    save(first, tmp_path / "a.json")
    save(second, tmp_path / "b.json")
    code, out, err = run(["traj", "concat", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "c.json")], capsys)
    assert code == 0, err
    joined = load(tmp_path / "c.json")
    assert joined.num_frames == 7 + 5 - 1
    assert np.allclose(joined.c2w[:7], first.c2w, atol=1e-12)
    # the joint: second's frame 1 relative to its frame 0, now relative to first's last frame
    for i in range(5):
        for j in range(5):
            rel_before = np.linalg.inv(second.c2w[i]) @ second.c2w[j]
            rel_after = np.linalg.inv(joined.c2w[6 + i]) @ joined.c2w[6 + j]
            assert np.allclose(rel_before, rel_after, atol=1e-9)
    assert np.allclose(joined.intrinsics[7:], second.intrinsics[1:])
    assert "11 frames" in out


def test_concat_rescales_intrinsics_of_same_aspect_and_rejects_other_aspect(tmp_path, capsys):
    first = make_path(3, width=128, height=72)
    half = make_path(3, width=64, height=36, focal=50.0)
    joined = concat(first, half)
    assert np.allclose(joined.intrinsics[3:], half.intrinsics[1:] * 2)
    square = make_path(3, width=64, height=64)
    save(first, tmp_path / "a.json")
    save(square, tmp_path / "sq.json")
    out_file = tmp_path / "c.json"
    code, _, err = run(["traj", "concat", str(tmp_path / "a.json"), str(tmp_path / "sq.json"), "-o", str(out_file)], capsys)
    assert_one_line_error(code, err, "sq.json", "aspect ratio")
    assert not out_file.exists()


def test_concat_rejects_different_fps(tmp_path, capsys):
    save(make_path(3), tmp_path / "a.json")
    save(make_path(3, fps=24.0), tmp_path / "b.json")
    code, _, err = run(["traj", "concat", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "c.json")], capsys)
    assert_one_line_error(code, err, "b.json", "fps", "retime")
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json"]


def test_retime_doubling_fps_keeps_original_frames_and_duration(tmp_path, capsys):
    traj = make_path(9)
    save(traj, tmp_path / "in.json")
    code, _, err = run(["traj", "retime", str(tmp_path / "in.json"), "--fps", "32", "-o", str(tmp_path / "out.json")], capsys)
    assert code == 0, err
    out = load(tmp_path / "out.json")
    assert out.fps == 32.0 and out.num_frames == 17 and out.duration == pytest.approx(traj.duration)
    assert np.allclose(out.c2w[::2], traj.c2w, atol=1e-9)
    assert np.allclose(out.intrinsics[::2], traj.intrinsics, atol=1e-9)
    # the in-between frames turn half a step: yaw steps of 0.025 rad
    yaw = np.unwrap(np.arctan2(out.c2w[:, 0, 2], out.c2w[:, 2, 2]))
    assert np.allclose(np.diff(yaw), 0.025, atol=1e-9)


@pytest.mark.parametrize("interp", ["spline", "linear"])
def test_retime_seconds_slows_a_straight_path_evenly(tmp_path, capsys, interp):
    traj = make_path(5, step=(0.0, 0.0, 0.4), yaw_step=0.0)  # 1.6 units in 0.25 s
    save(traj, tmp_path / "in.json")
    code, _, err = run(["traj", "retime", str(tmp_path / "in.json"), "--seconds", "1", "--interp", interp,
                        "-o", str(tmp_path / "out.json")], capsys)
    assert code == 0, err
    out = load(tmp_path / "out.json")
    assert out.num_frames == 17 and out.fps == 16.0
    assert np.allclose(out.c2w[:, :3, 3], np.outer(np.linspace(0, 1.6, 17), [0, 0, 1]), atol=1e-9)
    assert np.allclose(out.c2w[:, :3, :3], np.eye(3), atol=1e-12)


def test_retime_both_options_and_no_single_frame():
    traj = make_path(9)
    out = retime(traj, fps=10.0, seconds=2.0)
    assert out.num_frames == 21 and out.fps == 10.0
    assert np.allclose(out.c2w[[0, -1]], traj.c2w[[0, -1]])
    for seconds in (0.0, 0.01):  # a duration asked for keeps at least one frame step (was: a 1-frame path)
        with pytest.raises(CamrenderError, match="seconds"):
            retime(traj, seconds=seconds)


def test_retime_writes_the_format_its_suffix_names(tmp_path, capsys):
    traj = make_path(5)
    save(traj, tmp_path / "in.json")
    code, _, err = run(["traj", "retime", str(tmp_path / "in.json"), "--fps", "8", "-o", str(tmp_path / "out.txt")], capsys)
    assert code == 0, err
    out = load(tmp_path / "out.txt")  # RealEstate10K text
    assert out.num_frames == 3 and out.fps == pytest.approx(8.0)
    assert np.allclose(out.c2w, traj.c2w[::2], atol=1e-9)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--fps", "0"], ["fps", "positive"]),
        (["--seconds", "-1"], ["seconds"]),
        (["--seconds", "0"], ["seconds", "positive"]),
        (["--seconds", "0.01"], ["seconds", "one frame step"]),
        (["--fps", "1e9"], ["fps", "240"]),
        ([], ["--fps", "--seconds"]),
        (["--fps", "nan"], ["fps"]),
    ],
)
def test_retime_bad_options_give_one_line(tmp_path, capsys, args, needles):
    save(make_path(3), tmp_path / "in.json")
    code, _, err = run(["traj", "retime", str(tmp_path / "in.json"), *args, "-o", str(tmp_path / "out.json")], capsys)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("command", ["plot", "preview"])
def test_missing_input_and_bad_output_folder(tmp_path, capsys, command):
    out_name = "x.png" if command == "plot" else "x.mp4"
    code, _, err = run(["traj", command, str(tmp_path / "nope.json"), "-o", str(tmp_path / out_name)], capsys)
    assert_one_line_error(code, err, "nope.json", "not found")
    save(make_path(3), tmp_path / "in.json")
    target = tmp_path / "missing" / out_name
    code, _, err = run(["traj", command, str(tmp_path / "in.json"), "-o", str(target)], capsys)
    assert_one_line_error(code, err, "missing")
    assert sorted(os.listdir(tmp_path)) == ["in.json"]


def test_bad_input_file_names_file_frame_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "width": 64, "height": 36, "fps": 16, "frames": ['
                   '{"c2w": [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]], "fx": 50, "fy": 50, "cx": 32, "cy": 18},'
                   '{"c2w": [[2,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]], "fx": 50, "fy": 50, "cx": 32, "cy": 18}]}')
    code, _, err = run(["traj", "preview", str(bad), "-o", str(tmp_path / "p.mp4")], capsys)
    assert_one_line_error(code, err, "bad.json", "frame 1")
    assert not (tmp_path / "p.mp4").exists()


def test_preview_and_plot_write_requested_files(tmp_path, capsys):
    import imageio.v3 as iio

    save(make_path(6), tmp_path / "in.json")
    code, out, err = run(["traj", "preview", str(tmp_path / "in.json"), "-o", str(tmp_path / "p.mp4"),
                          "--height", "36", "--overlay"], capsys)
    assert code == 0, err
    assert "6 frames 64x36" in out
    video = iio.imread(tmp_path / "p.mp4", index=None)
    assert video.shape == (6, 36, 64, 3)
    code, out, err = run(["traj", "plot", str(tmp_path / "in.json"), "-o", str(tmp_path / "p.png"), "--every", "2"], capsys)
    assert code == 0, err
    assert iio.imread(tmp_path / "p.png").shape[:2] == (800, 1200)
