"""Helpers shared by the test files (importable as `helpers`: pytest puts tests/ on sys.path)."""


def rel(a, b) -> float:
    """Relative error ||a - b|| / ||b|| in float64 (Frobenius norms over all elements)."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_cli(argv, capsys):
    """(exit code, stdout, stderr) of an in-process `camrender` run."""
    import pytest

    from camrender.cli.main import main

    with pytest.raises(SystemExit) as done:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err
