"""`camrender selftest`: every kernel op against its reference (Triton interpreter here), table and JSON, op by op."""
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
    ops = [case["op"] for case in report["cases"]]
    assert {"delta_scan", "cam_prep", "cam_decode", "camera_branch", "short_conv", "quantize_rows"} <= set(ops)
    assert list(report["ops"]) == list(dict.fromkeys(ops)) and all(report["ops"].values())
    assert {"state", "no_downscale"} <= {case["variant"] for case in report["cases"]}
    assert any("D112" in case["shape"] for case in report["cases"])  # the release head dim
    for case in report["cases"]:
        assert case["passed"] and case["max_error"] < 1e-3 and case["time_ms"] > 0


def _case(name, actual_offset, variant=""):
    def run(device):
        expected = torch.linspace(-2, 2, 10, device=device)
        return (expected + actual_offset, expected * 2), (expected, expected * 2)

    return selftest.SelftestCase(name, "N10", run, tolerance=1e-4, variant=variant)


def crashing(device):
    raise RuntimeError("kernel exploded")


def test_failures_are_reported_and_exit_nonzero(capsys):
    cases = [_case("good", 0.0), _case("bad", 0.0), _case("bad", 1e-2, "offset"),
             selftest.SelftestCase("broken", "N1", crashing)]
    assert selftest.main(cases=cases) == 1
    lines = capsys.readouterr().out.splitlines()
    rows = lines[3:7]
    assert rows[0].split()[0] == "good" and rows[0].endswith("ok")
    assert rows[1].split()[0] == "bad" and rows[1].endswith("ok")
    assert rows[2].split()[:2] == ["offset", "N10"] and rows[2].endswith("FAIL") and "1.00e-02" in rows[2]
    assert rows[3].split()[0] == "broken" and rows[3].endswith("FAIL")
    assert "broken [N1]: RuntimeError: kernel exploded" in lines
    assert lines[-1] == "1/3 ops passed (2/4 cases)"

    assert selftest.main(as_json=True, cases=[_case("good", 0.0)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["ops"] == {"good": True} and report["cases"][0]["max_error"] == 0.0


def test_tolerance_is_relative_to_the_reference_scale():
    def run(device):
        expected = torch.tensor([1000.0, -500.0])
        return expected + 0.05, expected

    loose = selftest.run_case(selftest.SelftestCase("scaled", "N2", run, tolerance=1e-4), torch.device("cpu"))
    assert loose.passed and loose.max_error == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError, match="shape"):
        selftest.compare(torch.zeros(2), torch.zeros(3))
