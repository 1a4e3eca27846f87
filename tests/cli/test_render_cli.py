"""`camrender [render] --traj ... --out ...` end to end on the tiny offline model; bad input; Ctrl-C."""
import json
import os
import sys
from pathlib import Path

import imageio
import numpy as np
import PIL.Image
import pytest

from camrender import trajectory
from camrender.trajectory import Trajectory
from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"


def read_video(path):
    reader = imageio.get_reader(str(path), "ffmpeg")
    try:
        return np.stack([frame for frame in reader]), reader.get_meta_data()
    finally:
        reader.close()


def small_trajectory(tmp_path, **metadata):
    """A 17-frame path saved as v1 JSON (intrinsics for a 240x130 image)."""
    c2w = np.tile(np.eye(4), (17, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 0.4, 17)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([200.0, 200.0, 120.0, 65.0], (17, 1)), width=240, height=130,
                      fps=12, **metadata)
    path = tmp_path / "path.json"
    trajectory.save(traj, path)
    return path


def test_readme_demo_command(tmp_path, capsys, monkeypatch):
    # as on a user's CPU: no Triton interpreter, so kernels="fused" runs the PyTorch references
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "x.mp4"
    code, _, err = run_cli(["--traj", ORBIT, "--out", out, "--model", "tiny"], capsys)
    assert code == 0, err
    frames, meta = read_video(out)
    expected = trajectory.to_model_frames(trajectory.load(ORBIT))
    assert frames.shape == (expected.num_frames, 64, 112, 3)  # the tiny model's default size
    assert meta["fps"] == pytest.approx(expected.fps)
    resolved = trajectory.load(tmp_path / "x.traj.json")
    assert resolved.num_frames == expected.num_frames
    np.testing.assert_allclose(resolved.c2w, expected.c2w, atol=1e-6)
    assert resolved.prompt == expected.prompt and resolved.seed == 0
    assert (tmp_path / "x.path.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mp4", "x.path.png", "x.render.json", "x.traj.json"]
    assert "Traceback" not in err


def test_render_word_options_and_trajectory_metadata(tmp_path, capsys):
    image = tmp_path / "first.png"
    PIL.Image.new("RGB", (240, 130), (200, 40, 40)).save(image)
    path = small_trajectory(tmp_path, prompt="from the file", image=str(image), seed=9)
    out = tmp_path / "renders" / "clip.mp4"
    out.parent.mkdir()
    code, _, err = run_cli(["render", "--traj", path, "--out", out, "--model", "tiny", "--prompt", "from the cli",
                            "--steps", "1", "--height", "32", "--width", "48", "--fps", "10", "--kernels", "torch"],
                           capsys)
    assert code == 0, err
    frames, meta = read_video(out)
    assert frames.shape == (17, 32, 48, 3) and meta["fps"] == pytest.approx(10)
    resolved = json.loads((out.parent / "clip.traj.json").read_text())
    assert resolved["prompt"] == "from the cli"  # the CLI wins
    assert resolved["seed"] == 9  # the rest comes from the file
    assert (out.parent / resolved["image"]).resolve() == image.resolve()
    assert resolved["fps"] == 10


@pytest.mark.parametrize("case", ["missing image", "unreadable image", "out is a directory", "no out dir",
                                  "unwritable out dir", "missing model", "odd size"])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, monkeypatch, case):
    path = small_trajectory(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    out = work / "video.mp4"
    extra = ["--model", "tiny"]
    if case == "missing image":
        extra += ["--image", work / "nope.png"]
    elif case == "unreadable image":
        (work / "broken.png").write_bytes(b"not an image")
        extra += ["--image", work / "broken.png"]
    elif case == "out is a directory":
        out = work
    elif case == "no out dir":
        out = work / "missing" / "video.mp4"
    elif case == "unwritable out dir":
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == str(work) else real_access(p, m))
    elif case == "missing model":
        import PIL.Image

        PIL.Image.new("RGB", (240, 130)).save(tmp_path / "first.png")
        extra = ["--model", tmp_path / "no_model_here", "--image", tmp_path / "first.png"]
    elif case == "odd size":
        extra += ["--height", "33"]
    before = sorted(work.iterdir())
    code, _, err = run_cli(["--traj", path, "--out", out] + extra, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("camrender: loading")]
    assert len(lines) == 1 and lines[0].startswith("camrender: error: "), err
    assert "Traceback" not in err
    assert sorted(work.iterdir()) == before
    if case == "missing model":
        assert "--model PATH" in lines[0] and "--model tiny" in lines[0]


def test_release_model_without_image_fails_before_loading(tmp_path, capsys):
    out = tmp_path / "work" / "x.mp4"
    out.parent.mkdir()
    model = tmp_path / "model"  # a pipeline folder as far as the checks go: loading it would fail otherwise
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    code, _, err = run_cli(["--traj", ORBIT, "--out", out, "--model", model], capsys)
    assert code == 2
    assert "first-frame image" in err and err.count("\n") == 1 and "Traceback" not in err
    assert list(out.parent.iterdir()) == []
