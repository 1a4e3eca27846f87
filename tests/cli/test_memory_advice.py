"""Running out of GPU memory mid-render: one line naming the card and the settings measured to fit a card of
its size, exit 2, no traceback and no partial video."""
from pathlib import Path

import numpy as np
import pytest
import torch

import camrender.api.output as output
from camrender.cli import memory_advice
from camrender.cli.memory_advice import is_out_of_memory, out_of_memory_line, refiner_setting
from helpers import run_cli

TRAJ = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"


def test_out_of_memory_mid_render_is_one_line_with_what_fits(tmp_path, capsys, monkeypatch):
    def frames_then_out_of_memory(pipe, request, progress=None, **options):
        yield np.zeros((9, request.height, request.width, 3), np.uint8)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 110.00 MiB.")

    monkeypatch.setattr(output, "render_frames", frames_then_out_of_memory)
    monkeypatch.setattr(memory_advice, "current_card", lambda: ("NVIDIA GeForce RTX 4090", 23.6, True))
    code, _, err = run_cli(["--traj", TRAJ, "--out", tmp_path / "v.mp4", "--model", "tiny", "--frames", "17",
                            "--mode", "segments"], capsys)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("camrender: loading")]
    assert code == 2 and "Traceback" not in err, err
    assert lines[-1] == ("camrender: error: out of GPU memory on NVIDIA GeForce RTX 4090 (23.6 GiB): with the refiner "
                         "try --precision fp8 --refiner-offload 36 (20.1 GiB with the prompt encoded first "
                         "(camrender encode-prompt)); stage 1 alone: "
                         "--mode segments (flat in the path length) or --offload (README: Which setting for which GPU)")
    assert not list(tmp_path.iterdir())  # the video was being written to a temporary file: removed


def test_the_advice_follows_the_card_size():
    assert refiner_setting(139.8).startswith("--refiner-offload 12") and refiner_setting(44.4).startswith("--refiner")
    # a 32 GB card (an RTX 5090: 31.4 GiB), a 24 GB one, a 20 GB one and a 16 GB one: the default window throughout
    assert refiner_setting(31.4).startswith("--precision fp8 --refiner-offload 12 ")
    assert refiner_setting(23.6).startswith("--precision fp8 --refiner-offload 36 ")
    for total_gib in (19.7, 14.6):
        assert refiner_setting(total_gib).startswith("--precision fp8 --refiner-offload 48 ")
    assert "--refiner-offload 48" in refiner_setting(None)
    # no FP8 tensor cores (an A100, an RTX 3090): bf16 settings only
    assert refiner_setting(79.2, fp8=False) == "--refiner-offload 12 (38.5 GiB)"
    assert "fp8" not in refiner_setting(23.6, fp8=False) and "layers" in refiner_setting(23.6, fp8=False)
    assert out_of_memory_line().startswith("out of GPU memory: with the refiner try")
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and not is_out_of_memory(RuntimeError("out of memory"))


def test_another_runtime_error_still_raises(monkeypatch):
    """Only running out of memory becomes a line: a bug keeps its traceback."""
    import camrender.cli.main as cli_main

    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_main.cli, "main", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli_main.main(["selftest"])
