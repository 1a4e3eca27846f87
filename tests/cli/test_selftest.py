"""`camrender selftest`: every kernel against its reference (Triton interpreter here), table and JSON."""
import json

import pytest
import torch

from camrender.cli import selftest
from camrender.cli.main import main


@pytest.mark.interpreter  # the report names the interpreter: the kernels run through it
def test_selftest_command_runs_every_kernel(capsys):
    with pytest.raises(SystemExit) as done:
        main(["selftest", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert done.value.code == 0, report
    assert report["passed"] is True and "interpreter" in report["device"]
    names = {case["kernel"] for case in report["cases"]}
    assert {"delta_scan", "cam_prep", "cam_decode", "camera_branch"} <= names
    assert any("D112" in case["shape"] for case in report["cases"])  # the release head dim
    for case in report["cases"]:
        assert case["passed"] and case["max_error"] < 1e-3 and case["time_ms"] > 0


def _case(name, actual_offset):
    def run(device):
        expected = torch.linspace(-2, 2, 10, device=device)
        return (expected + actual_offset, expected * 2), (expected, expected * 2)

    return selftest.SelftestCase(name, "N10", run, tolerance=1e-4)


def crashing(device):
    raise RuntimeError("kernel exploded")


def test_failures_are_reported_and_exit_nonzero(capsys):
    cases = [_case("good", 0.0), _case("bad", 1e-2), selftest.SelftestCase("broken", "N1", crashing)]
    assert selftest.main(cases=cases) == 1
    table = capsys.readouterr().out
    rows = {line.split()[0]: line for line in table.splitlines()[3:6]}
    assert rows["good"].endswith("ok")
    assert rows["bad"].endswith("FAIL") and "1.00e-02" in rows["bad"]
    assert rows["broken"].endswith("FAIL")
    assert "RuntimeError: kernel exploded" in table and "1/3 passed" in table

    assert selftest.main(as_json=True, cases=[_case("good", 0.0)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["cases"][0]["max_error"] == 0.0


def test_tolerance_is_relative_to_the_reference_scale():
    def run(device):
        expected = torch.tensor([1000.0, -500.0])
        return expected + 0.05, expected

    loose = selftest.run_case(selftest.SelftestCase("scaled", "N2", run, tolerance=1e-4), torch.device("cpu"))
    assert loose.passed and loose.max_error == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError, match="shape"):
        selftest.compare(torch.zeros(2), torch.zeros(3))
