"""Bad input, one case each: limits, non-finite numbers, suffixes, checks that must run before
the model loads, and messages that name the real problem."""
import json
import os
from pathlib import Path

import pytest

from helpers import run_cli as run

REPO = Path(__file__).resolve().parents[2]
ORBIT = REPO / "trajectories" / "orbit.json"


def one_error(argv, capsys, folder):
    """The single error line of a failing command that wrote nothing into `folder` and loaded no model."""
    before = sorted(os.listdir(folder))
    code, out, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("camrender: error: "), err
    assert "Traceback" not in err and "loading" not in err
    assert sorted(os.listdir(folder)) == before
    return lines[0]


RENDER = ["--traj", ORBIT, "--model", "tiny"]


@pytest.mark.parametrize("extra, expected", [
    (["--frames", "8193"], "full mode renders at most 8185 frames, got 8193"),
    (["--frames", "100001"], "at most 8185 frames"),
    (["--frames", "100000"], "at most 8185 frames"),
    (["--mode", "segments", "--frames", "8193"], "segments mode renders at most 8185 frames"),
    (["--frames", "2"], "e.g. 9"),
    (["--guidance", "nan"], "guidance: must be a finite number"),
    (["--guidance", "inf"], "guidance: must be a finite number"),
    (["--fps", "inf"], "fps: must be a finite number"),
    (["--height", "66"], "height: must be a multiple of 8 for this model, got 66 (e.g. 64 or 72)"),
    (["--width", "8192"], "width: must be at most 4096"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--device", "cuda:99"], "device"),
    (["--seed", str(2**70)], "seed: must be an integer from 0 to"),
    (["--device", "cpu", "--offload"], "offload: --offload moves components to a GPU"),
    (["--vae", "{tmp}/no_vae"], "vae: folder not found"),
    (["--transformer-weights", "{tmp}/none.pt"], "transformer-weights: file not found"),
    (["--model", "{tmp}/no_model", "--image", "{tmp}/first.png"], "model folder not found"),
])
def test_render_checks_before_loading(tmp_path, capsys, extra, expected):
    import PIL.Image

    PIL.Image.new("RGB", (1280, 704)).save(tmp_path / "first.png")
    extra = [item.format(tmp=tmp_path) for item in extra]
    line = one_error(RENDER + ["--out", tmp_path / "v.mp4"] + extra, capsys, tmp_path)
    assert expected in line


def test_cuda_without_a_gpu_fails_before_loading(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, also on one with
    assert "no GPU is available" in one_error(RENDER + ["--out", tmp_path / "v.mp4", "--device", "cuda"], capsys,
                                              tmp_path)


def test_output_suffix_and_unwritable_folder(tmp_path, capsys, monkeypatch):
    assert "must end with .mp4, got '.txt'" in one_error(RENDER + ["--out", tmp_path / "a.txt"], capsys, tmp_path)
    # a folder whose permission bits allow writing but which refuses new files (/sys, read-only mounts)
    real = os.open

    def refuse(path, flags, *args, **kwargs):
        if os.path.dirname(os.path.abspath(path)) == str(tmp_path) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    assert "cannot create a file in" in one_error(RENDER + ["--out", tmp_path / "a.mp4"], capsys, tmp_path)


def test_traj_outputs_follow_their_suffix(tmp_path, capsys):
    code, _, err = run(["traj", "plot", ORBIT, "-o", tmp_path / "p.jpg"], capsys)
    assert code == 0, err
    assert (tmp_path / "p.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not a PNG under a .jpg name
    assert "written as .png, .jpg" in one_error(["traj", "plot", ORBIT, "-o", tmp_path / "p.gif"], capsys, tmp_path)
    assert "must end with .mp4" in one_error(["traj", "preview", ORBIT, "-o", tmp_path / "v.png"], capsys, tmp_path)
    code, _, err = run(["traj", "new", "orbit", "-o", tmp_path / "x.txt"], capsys)
    assert code == 0, err
    code, out, err = run(["traj", "check", tmp_path / "x.txt"], capsys)  # RealEstate10K, as its suffix says
    assert code == 0 and "161 at 16 fps" in out, err
    assert "cannot tell the format" in one_error(["traj", "new", "orbit", "-o", tmp_path / "x.foo"], capsys, tmp_path)


def test_preview_size_limit_names_the_largest_value(tmp_path, capsys):
    line = one_error(["traj", "preview", ORBIT, "-o", tmp_path / "v.mp4", "--width", "100000"], capsys, tmp_path)
    assert "at most 4096 pixels" in line


def test_two_frame_paths_are_retimed_to_nine(tmp_path, capsys):
    code, out, err = run(["traj", "new", "orbit", "--frames", "2", "-o", tmp_path / "two.json"], capsys)
    assert code == 0 and "re-time it to 9 frames" in out, err


@pytest.mark.parametrize("name, content, expected, unexpected", [
    ("transforms.json", json.dumps({"frames": []}), "frames", "version"),
    ("images.txt", "1 1 0 0 0 0 0 x a.png\n\n", "images.txt: line 1", "19 numbers"),
])
def test_messages_fit_the_file(tmp_path, capsys, name, content, expected, unexpected):
    (tmp_path / "cameras.txt").write_text("1 PINHOLE 64 32 50 50 32 16\n")
    (tmp_path / name).write_text(content)
    line = one_error(["traj", "check", tmp_path / name], capsys, tmp_path)
    assert expected in line and unexpected not in line


def test_directory_actions_and_format_names(tmp_path, capsys):
    assert "is a directory" in one_error(["traj", "check", tmp_path], capsys, tmp_path)
    line = one_error(["traj", "check", "w--5"], capsys, tmp_path)
    assert "frame count must be a positive integer, got '-5'" in line
    code, out, err = run(["traj", "check", "w-80,jw-40"], capsys)
    assert code == 0 and "121 at" in out, err
    code, out, _ = run(["traj", "convert", "--help"], capsys)
    assert "realestate10k (or re10k)" in " ".join(out.split()) and "colmap" in out  # (help lines wrap anywhere)
    code, _, err = run(["traj", "convert", ORBIT, "-o", tmp_path / "o.txt", "--to", "re10k"], capsys)
    assert code == 0, err
    # render reads action strings too (the bad one proves it parsed it, with no model loaded)
    line = one_error(["--traj", "w--5", "--out", tmp_path / "v.mp4", "--model", "tiny"], capsys, tmp_path)
    assert "frame count must be a positive integer" in line


def test_usage_errors_are_one_line(tmp_path, capsys):
    line = one_error(["render", "--traj", ORBIT, "--out", tmp_path / "v.mp4", "--bogus"], capsys, tmp_path)
    assert "No such option" in line and "--help" in line
