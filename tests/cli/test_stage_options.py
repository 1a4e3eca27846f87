"""The per-stage render options: --precision fp8 refused before any model loads where there are no FP8 tensor
cores; --refiner-window reaches the refiner's stream."""
from pathlib import Path

import numpy as np
import pytest
import torch

import camrender.model.stage1.loading as loading
from camrender.model.device import check_fp8
from camrender.errors import CamrenderError
from camrender.model.refiner.tiny import build_tiny_refiner
from camrender.render.stage_two import attach_refiner, stage_two
from camrender.trajectory import Trajectory
from helpers import render_request, run_cli

TRAJ = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"


@pytest.mark.parametrize("option", [["--precision", "fp8"], ["--refiner-precision", "fp8", "--refiner", "tiny"],
                                    ["--stage1-precision", "fp8", "--precision", "bf16"]])
def test_fp8_on_a_cpu_is_one_line_exit_2_before_loading(tmp_path, capsys, monkeypatch, option):
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "v.mp4"
    code, _, err = run_cli(["--traj", TRAJ, "--out", out, "--model", "tiny", "--device", "cpu", *option], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    name = option[0].lstrip("-")
    assert lines[0].startswith(f"camrender: error: {name}: fp8 needs") and "CPU" in lines[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option", [["--refiner-offload", "layers"], ["--refiner-offload", "12"],
                                    ["--refiner-window", "2"], ["--refiner-precision", "bf16"]])
def test_a_refiner_option_without_the_refiner_is_refused(tmp_path, capsys, monkeypatch, option):
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "v.mp4"
    code, _, err = run_cli(["--traj", TRAJ, "--out", out, "--model", "tiny", *option], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    name = option[0].lstrip("-")
    assert lines[0] == f"camrender: error: {name}: --{name} applies to the refiner (stage 2): pass --refiner too, or drop it"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [[], ["play"]])
@pytest.mark.parametrize("value", ["half", "2", "-3"])
def test_a_bad_refiner_offload_is_one_line_before_loading(tmp_path, capsys, monkeypatch, command, value):
    import camrender.api.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_patched_pipeline", lambda *a, **k: pytest.fail("a model loaded"))
    where = ["--out", tmp_path / "flight"] if command else ["--traj", TRAJ, "--out", tmp_path / "v.mp4"]
    code, _, err = run_cli([*command, "--model", "tiny", "--refiner", "tiny", *where, "--refiner-offload", value],
                           capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--refiner-offload" in lines[0] and f"must be none, layers or a number of blocks (3 or more: the two staging slots hold two blocks), got '{value}'" \
        in lines[0]
    assert not list(tmp_path.iterdir())


def test_fp8_on_an_old_gpu_names_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(CamrenderError) as caught:
        check_fp8("cuda", "refiner-precision")
    assert "NVIDIA A100-SXM4-80GB is 8.0" in str(caught.value) and "refiner-precision" in str(caught.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8("cuda", "precision")  # Hopper: accepted


@pytest.mark.parametrize("window", [2, 11])
def test_refiner_window_reaches_the_stream(window):
    pipe = type("Pipe", (), {})()
    pipe.transformer = None
    attach_refiner(pipe, build_tiny_refiner(seed=0))
    frames = 17
    traj = Trajectory(c2w=np.tile(np.eye(4), (frames, 1, 1)), intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (frames, 1)),
                      width=32, height=32, fps=16)
    request = render_request(traj=traj, prompt="x", refiner="tiny", refiner_window=window, kernels="torch",
                             model="tiny", num_frames=frames)
    stream = stage_two(pipe, request, torch.device("cpu"))
    assert stream.max_history == window - 1


@pytest.mark.parametrize("option", [["--refiner-offload", "layers"], ["--refiner-window", "2"],
                                    ["--refiner-precision", "bf16"]])
def test_play_refuses_a_refiner_option_without_the_refiner(tmp_path, capsys, monkeypatch, option):
    import camrender.api.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_patched_pipeline", lambda *a, **k: pytest.fail("a model loaded"))
    code, _, err = run_cli(["play", "--model", "tiny", "--out", tmp_path / "flight", *option], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    name = option[0].lstrip("-")
    assert code == 2 and lines == [f"camrender: error: {name}: --{name} applies to the refiner (stage 2): "
                                   "pass --refiner too, or drop it"], err
    assert not list(tmp_path.iterdir())


def test_play_takes_the_stage_options_into_every_flight(tmp_path, capsys, monkeypatch):
    """`camrender play --refiner ... --refiner-window 2` (and fp8 refused on a CPU, as render does): the
    flights' template request carries them, so the saved render file renders with the same settings."""
    import camrender.api.pipeline as pipeline

    seen = {}

    def loaded(settings, log=None, *, ranks=None, prepare=None):
        seen["template"] = prepare
        raise SystemExit(3)

    monkeypatch.setattr(pipeline, "load_patched_pipeline", loaded)
    code, _, err = run_cli(["play", "--model", "tiny", "--refiner", "tiny", "--refiner-window", "2",
                            "--prompt-cache", "off", "--out", tmp_path / "flight"], capsys)
    template = seen["template"]
    assert code == 3 and template.settings.refiner == "tiny" and template.settings.refiner_window == 2, err
    assert template.settings.stage1_precision == template.settings.refiner_precision == "bf16"
    assert template.prompt_cache is None
    code, _, err = run_cli(["play", "--model", "tiny", "--device", "cpu", "--precision", "fp8",
                            "--out", tmp_path / "flight"], capsys)
    assert code == 2 and "precision: fp8 needs" in err and "Traceback" not in err
