"""`--shard K/N` (and a Slurm array's default) renders the K-th of N slices of a batch, so the N shards render
each job exactly once; `--executor ray` refuses what it cannot run with one line and exit 2 before any job: Ray not
installed, an address that cannot be reached, --gpus; a Ray option without it, a bad shard: one line too. None of these
start Ray."""
import json
import socket
import sys
import time

import pytest

from helpers import run_cli

FAST = ["--model", "tiny", "--device", "cpu", "--steps", "1", "--height", "32", "--width", "32", "--frames", "9",
        "--kernels", "torch", "--prompt-cache", "off", "--progress", "none"]


def jobs_file(folder, count: int):
    lines = [json.dumps({"trajectory": "w-8", "output": f"out/{index}.mp4", "seed": index}) for index in range(count)]
    (folder / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "jobs.jsonl"


def rendered(summary_path) -> list:
    summary = json.loads(summary_path.read_text())
    return sorted(result["index"] for result in summary["results"] if result["status"] == "done")


def test_three_shards_render_each_job_exactly_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    jobs = jobs_file(tmp_path, 5)
    shards = []
    for index in range(3):
        code, _, err = run_cli(["batch", jobs, *FAST, "--shard", f"{index}/3", "--summary",
                                tmp_path / f"{index}.json"], capsys)
        assert code == 0, err
        assert f"batch (shard {index}/3):" in err
        shards.append(rendered(tmp_path / f"{index}.json"))
    assert shards == [[0], [1, 2], [3, 4]]  # consecutive slices, together every job once
    assert sorted(path.name for path in (tmp_path / "out").glob("*.mp4")) == [f"{index}.mp4" for index in range(5)]


def test_a_slurm_array_task_takes_its_shard_and_a_bad_line_refuses_every_shard(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    jobs = jobs_file(tmp_path, 3)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "12")  # --array=10-14:2: the second of three tasks
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "10")
    monkeypatch.setenv("SLURM_ARRAY_TASK_STEP", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    code, _, err = run_cli(["batch", jobs, *FAST, "--summary", tmp_path / "s.json"], capsys)
    assert code == 0 and "shard 1/3" in err and rendered(tmp_path / "s.json") == [1]
    with jobs.open("a") as out:
        out.write("{not json\n")  # line 4: another shard's, refused in every shard all the same
    code, _, err = run_cli(["batch", jobs, *FAST, "--shard", "0/3"], capsys)
    assert code == 2 and "line 4: invalid JSON" in err and not (tmp_path / "out" / "0.mp4").exists()


@pytest.mark.parametrize("given, environment, message", [
    (["--shard", "3/3"], {}, "shard: --shard 3/3: K must be in 0..2"),
    (["--shard", "1/0"], {}, "N must be at least 1"),
    (["--shard", "two/3"], {}, "'two/3' is not K/N"),
    (["--shard", "-1/3"], {}, "is not K/N"),
    ([], {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"},
     "SLURM_ARRAY_TASK_ID=5 of SLURM_ARRAY_TASK_COUNT=4"),
])
def test_a_bad_shard_is_one_line(tmp_path, capsys, monkeypatch, given, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, *given], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_ray_not_installed_names_the_extra_before_any_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as without the package
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, "--executor", "ray"], capsys)
    assert code == 2 and err.count("\n") == 1 and 'pip install "camrender[ray]"' in err, err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_address_is_one_line_naming_it(tmp_path, capsys):
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, "--executor", "ray", "--address", address], capsys)
    assert code == 2 and f"cannot reach the Ray cluster at {address}" in err and "Traceback" not in err, err
    assert time.monotonic() - started < 30
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, "--executor", "ray", "--address", "nowhere"],
                           capsys)
    assert code == 2 and "'nowhere' is not auto or HOST:PORT" in err, err
    assert not list((tmp_path / "out").glob("*.mp4"))


def test_the_ray_executor_refuses_gpus_and_a_bad_jobs_file_before_starting_ray(tmp_path, capsys):
    ray = pytest.importorskip("ray")
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, "--executor", "ray", "--gpus", "2"], capsys)
    assert code == 2 and "--executor ray starts its own workers" in err
    code, _, err = run_cli(["batch", jobs_file(tmp_path, 2), *FAST, "--address", "auto"], capsys)
    assert code == 2 and err.count("\n") == 1 and "address: --address is for the Ray executor" in err
    (tmp_path / "bad.jsonl").write_text('{"trajectory": "w-8", "output": "out/x.mp4", "colour": 1}\n')
    code, _, err = run_cli(["batch", tmp_path / "bad.jsonl", *FAST, "--executor", "ray"], capsys)
    assert code == 2 and "line 1: colour" in err and "1 of 1 jobs cannot render" in err
    assert not ray.is_initialized()
