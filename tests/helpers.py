"""Helpers shared by the test files (importable as `helpers`: pytest puts tests/ on sys.path)."""


def rel(a, b) -> float:
    """Relative error ||a - b|| / ||b|| in float64 (Frobenius norms over all elements)."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def temporal_conv_exact(weight, y, left):
    """The (3, 1) temporal conv of a one-segment call in float64: weight (C_out, C_in, 3, 1), y (B, T, S, C_in), the
    cached left frame (B, 1, S, C_in); zero after the last frame. -> (B, T, S, C_out)."""
    import torch

    taps = weight.double()[:, :, :, 0]
    frames = torch.cat([left, y, torch.zeros_like(left)], dim=1).double()
    count = y.shape[1]
    return sum(frames[:, k:k + count] @ taps[:, :, k].T for k in range(3))


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of an in-process `camrender` run."""
    import pytest

    from camrender.cli.main import main

    with pytest.raises(SystemExit) as done:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def render_request(**fields):
    """A `RenderRequest` from flat fields, as a test writes them: those of `LoadSettings` (model, kernels, device,
    refiner, ...) become its pipeline's settings (the recipe is both: the request samples with it, the settings
    name it)."""
    from camrender.render.load_settings import FIELDS, LoadSettings
    from camrender.render.request import RenderRequest

    load = {name: fields.pop(name) for name in list(fields) if name in FIELDS and name != "recipe"}
    if "recipe" in fields:
        load["recipe"] = getattr(fields["recipe"], "name", fields["recipe"])
    return RenderRequest(**fields, settings=LoadSettings(**load))


def assert_process_ends(pid: int, timeout: float = 10.0) -> None:
    """The process `pid` ends (or is a zombie waiting to be reaped) within `timeout` seconds (Linux: /proc)."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + timeout
    status = Path(f"/proc/{pid}/status")
    while status.exists():
        try:
            if "State:\tZ" in status.read_text():
                return
        except OSError:  # gone meanwhile
            return
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.05)
