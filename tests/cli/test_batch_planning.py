"""`camrender batch` checks every job before the first renders: a jobs file with errors is refused whole
(every error listed with its line, exit 2, nothing rendered or created); --skip-bad-jobs renders the good
ones; a --summary that cannot be written is refused before any job."""
import json
import shutil
from pathlib import Path

import helpers

REPO = Path(__file__).resolve().parents[2]
FAST = ["--model", "tiny", "--steps", "1", "--height", "32", "--width", "32", "--kernels", "torch", "--frames", "9"]


def jobs_file(folder: Path, lines: list) -> Path:
    shutil.copy(REPO / "trajectories" / "orbit.json", folder / "a.json")
    path = folder / "jobs.jsonl"
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) for line in lines for line in
                            (line, "\n")))
    return path


BAD_LINES = [
    {"trajectory": "a.json", "output": "out/a.mp4"},
    "{not json",
    {"trajectory": "a.json", "output": "out/a.mp4"},  # the same output as line 1
    {"trajectory": "missing.json", "output": "out/c.mp4"},
    {"trajectory": "a.json", "output": "out/d.mp4", "colour": 2},
    {"trajectory": "a.json", "output": "out/e.mp4", "seed": -1},
    {"trajectory": "a.json", "output": "a.json/f.mp4"},  # its folder is a file
]


def test_a_jobs_file_with_errors_is_refused_whole(tmp_path, capsys):
    jobs = jobs_file(tmp_path, BAD_LINES)
    code, _, err = helpers.run_cli(["batch", jobs, *FAST, "--progress", "none"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("camrender: error:")]
    assert code == 2 and "Traceback" not in err
    for number, needle in ((2, "invalid JSON"), (3, "same output as"), (4, "file not found"), (5, "colour"),
                           (6, "seed"), (7, "cannot make the output's folder")):
        assert sum(f"line {number}:" in line and needle in line for line in errors) == 1, (number, err)
    assert "6 of 7 jobs cannot render" in errors[-1] and "--skip-bad-jobs" in errors[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "jobs.jsonl"]  # no out/, no video


def test_skip_bad_jobs_renders_the_good_ones_and_reports_the_rest(tmp_path, capsys):
    jobs = jobs_file(tmp_path, BAD_LINES[:3])
    summary = tmp_path / "summary.json"
    code, _, err = helpers.run_cli(["batch", jobs, *FAST, "--skip-bad-jobs", "--summary", summary,
                                    "--progress", "none"], capsys)
    assert code == 3, err  # failed jobs: exit 3, with the summary written
    assert (tmp_path / "out" / "a.mp4").is_file()
    written = json.loads(summary.read_text())
    assert written["done"] == 1 and written["failed"] == 2
    assert [f["where"].rsplit(" ", 1)[-1] for f in written["failures"]] == ["2", "3"]
    assert "1 job to render" not in err and "1 group of 1 CPU" in err  # a CPU machine: no GPU named


def test_a_summary_that_cannot_be_written_is_refused_before_any_job(tmp_path, capsys):
    jobs = jobs_file(tmp_path, BAD_LINES[:1])
    code, _, err = helpers.run_cli(["batch", jobs, *FAST, "--summary", tmp_path / "no" / "s.json"], capsys)
    assert code == 2 and err.count("\n") == 1 and "s.json" in err
    assert not (tmp_path / "out").exists()


def test_a_trajectory_given_as_the_jobs_file_is_one_error(tmp_path, capsys):
    shutil.copy(REPO / "trajectories" / "orbit.json", tmp_path / "orbit.json")
    code, _, err = helpers.run_cli(["batch", tmp_path / "orbit.json", *FAST], capsys)
    assert code == 2 and err.count("\n") == 1 and "one JSON document over several lines" in err


def test_a_bad_jobs_file_is_refused_before_workers_start(tmp_path, capsys, monkeypatch):
    from camrender.parallel import distributed

    started = []
    monkeypatch.setattr(distributed, "launch", lambda *args, **kwargs: started.append(args) or 0)
    jobs = jobs_file(tmp_path, BAD_LINES)
    code, _, err = helpers.run_cli(["batch", jobs, *FAST, "--gpus", "2", "--device", "cpu"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("camrender: error:")]
    assert code == 2 and started == [] and len(errors) == len(BAD_LINES) and "re-timed" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "jobs.jsonl"]
