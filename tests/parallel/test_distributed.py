"""Several processes on the CPU (gloo, tiny model): CFG-parallel full mode, `render --gpus`, `batch`, failures.

Runs that need two processes go through torchrun (`python -m torch.distributed.run`) in a
subprocess with a timeout, so a hang fails the test instead of blocking CI.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from camrender.batch.executors import JobRunner, TorchrunExecutor
from camrender.batch.jobs import read_jobs
from camrender.batch.pipelines import PipelineCache
from camrender.batch.plan import plan_jobs
from camrender.cli.batch import job_keys, resolver
from camrender.render.load_settings import LoadSettings
from camrender.parallel.cfg import check_split
from camrender.cli.launch import options_to_argv
from camrender.cli.render import render
from camrender.errors import CamrenderError
from test_render_cli import read_video, run_cli, small_trajectory

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "parallel" / "dist_worker.py"
TIMEOUT_S = 240


def run_processes(args, cwd, timeout=TIMEOUT_S, interpret=False):
    """(exit code, stderr, seconds) of `python ARGS` with the repository importable and fast CPU settings
    (the Triton kernels through the interpreter with `interpret`, else the PyTorch references);
    the whole process group is killed when it outlives `timeout`."""
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.terminate()  # torchrun's agent stops its workers (they run in sessions of their own)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"{' '.join(map(str, args))} did not finish in {timeout} s")
    return process.returncode, err, time.monotonic() - started


def torchrun(args, cwd, nproc=2):
    return run_processes(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args], cwd)


def max_rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def assert_ranks_agree(results, tolerances: dict, ranks: int = 2) -> None:
    """A worker's latents: for each dtype key of `tolerances`, every rank stepped the same latents, and
    they lie within the tolerance (max relative) of the one-process render's."""
    for dtype, tolerance in tolerances.items():
        stepped, alone = results[dtype]["ranks"], results[dtype]["alone"]
        assert len(stepped) == ranks and all(torch.equal(stepped[0], other) for other in stepped[1:]), dtype
        assert max_rel(stepped[0], alone) <= tolerance, (dtype, max_rel(stepped[0], alone))


def assert_one_video_written(out, err) -> None:
    """The 17-frame tiny render of `small_trajectory` at `out`, its side files only, reported once."""
    frames, _ = read_video(out)
    assert frames.shape == (17, 64, 112, 3)
    assert sorted(p.name for p in out.parent.iterdir()) == ["v.mp4", "v.path.png", "v.render.json", "v.traj.json"]
    assert err.count("camrender: wrote") == 1


# ----------------------------------------------------------------------------- two processes
def test_cfg_parallel_equals_one_process_and_rank_0_writes_the_video(tmp_path):
    path = small_trajectory(tmp_path)
    out = tmp_path / "work" / "v.mp4"
    out.parent.mkdir()
    code, err, _ = torchrun([WORKER, "latents", tmp_path / "latents.pt", "float32,float64", "render", "--traj", path,
                             "--out", out, "--model", "tiny", "--steps", "2", "--device", "cpu"], tmp_path)
    assert code == 0, err[-3000:]
    results = torch.load(tmp_path / "latents.pt")
    assert all(results[dtype]["ranks"][0].dtype == getattr(torch, dtype) for dtype in ("float64", "float32"))
    # float32 on the GDN-only tiny model (dist_worker.precision_model says why), float64 on both kinds of block
    assert_ranks_agree(results, {"float64": 1e-12, "float32": 1e-5})
    # the CLI render on the same two processes: one video, written by rank 0, which alone reports
    assert_one_video_written(out, err)
    assert err.count("camrender: loading tiny") == 1


def test_a_rank_that_raises_stops_the_run_and_leaves_no_video(tmp_path):
    path = small_trajectory(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    code, err, seconds = torchrun([WORKER, "fail-rank-1", "render", "--traj", path, "--out", work / "v.mp4",
                                   "--model", "tiny", "--steps", "30", "--device", "cpu"], tmp_path)
    assert code != 0
    assert "rank 1 fails on purpose" in err
    assert list(work.iterdir()) == []  # no video, no temporary file, no side files
    assert seconds < 120


def test_bad_input_under_torchrun_is_one_line_from_rank_0(tmp_path):
    path = small_trajectory(tmp_path)
    code, err, _ = torchrun(["-m", "camrender", "render", "--traj", path, "--out", tmp_path / "v.mp4", "--model",
                             "tiny", "--image", tmp_path / "nope.png", "--device", "cpu"], tmp_path)
    assert code != 0
    assert err.count("camrender: error:") == 1 and "first-frame image not found" in err
    assert not (tmp_path / "v.mp4").exists()


def test_batch_spreads_skips_and_reports(tmp_path, capsys, monkeypatch):
    small_trajectory(tmp_path)  # path.json
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "c.mp4").write_bytes(b"rendered before")
    lines = [
        {"trajectory": "path.json", "output": "out/a.mp4"},
        {"trajectory": "path.json", "output": "out/b.mp4", "prompt": "a hall", "options": {"seed": 4}},
        {"trajectory": "path.json", "output": "out/c.mp4"},
        {"trajectory": "path.json", "output": "out/d.mp4", "image": "missing.png"},
        {"trajectory": "path.json", "output": "out/e.mp4", "height": 36},  # fails when planned: not a multiple of 8
        {"trajectory": "path.json", "output": "out/f.mp4", "options": {"steps": 2}},
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    code, err, _ = run_processes(["-m", "camrender", "batch", "jobs.jsonl", "--model", "tiny", "--steps", "1",
                                  "--device", "cpu", "--gpus", "2", "--summary", "summary.json", "--skip-bad-jobs"],
                                 tmp_path)
    assert code == 3, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["done"], summary["skipped"], summary["failed"], summary["jobs"]) == (3, 1, 2, 6)
    assert summary["ranks"] == 2 and summary["model_loads_per_rank"] == [1, 1]
    done = {Path(r["out"]).name: r["rank"] for r in summary["results"] if r["status"] == "done"}
    assert done == {"a.mp4": 0, "b.mp4": 1, "f.mp4": 0}  # pending jobs a, b, f dealt to ranks 0, 1, 0
    assert summary["seconds_per_video"] > 0 and summary["videos_per_minute"] > 0
    reasons = " ".join(failure["reason"] for failure in summary["failures"])
    assert "jobs.jsonl line 4" in reasons and "first-frame image not found" in reasons
    assert "jobs.jsonl line 5" in reasons and "multiple of 8" in reasons
    assert (tmp_path / "out" / "c.mp4").read_bytes() == b"rendered before"
    for name in ("a", "b", "f"):
        frames, _ = read_video(tmp_path / "out" / f"{name}.mp4")
        assert frames.shape == (17, 64, 112, 3)
        assert (tmp_path / "out" / f"{name}.traj.json").exists()
    assert json.loads((tmp_path / "out" / "b.traj.json").read_text())["seed"] == 4
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".mp4") == ["a.mp4", "b.mp4", "c.mp4",
                                                                                            "f.mp4"]
    assert "batch: 3 done, 1 skipped (output exists), 2 failed of 6 jobs" in err
    # f.mp4 was rank 0's second job, on the pipeline its first job loaded: the same video as a render alone
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    code, _, err = run_cli(["--traj", tmp_path / "path.json", "--out", tmp_path / "alone.mp4", "--model", "tiny",
                            "--steps", "2", "--device", "cpu"], capsys)
    assert code == 0, err
    assert (read_video(tmp_path / "alone.mp4")[0] == read_video(tmp_path / "out" / "f.mp4")[0]).all()


# ----------------------------------------------------------------------------- one process
@pytest.mark.parametrize("args, message", [
    (["--gpus", "2", "--image", "nope.png"], "first-frame image not found"),
    (["--gpus", "3"], "3 GPUs per video do not halve"),
    (["--gpus", "2", "--device", "cuda"], "2 GPUs were asked for"),
])
def test_render_gpus_refuses_before_starting_workers(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    one_gpu = "cuda" in args  # a machine with one GPU: the launcher, not the device check, refuses
    monkeypatch.setattr(torch.cuda, "is_available", lambda: one_gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(one_gpu))
    path = small_trajectory(tmp_path)
    device = [] if "--device" in args else ["--device", "cpu"]
    code, _, err = run_cli(["--traj", path, "--out", tmp_path / "v.mp4", "--model", "tiny", *device, *args], capsys)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["path.json"]


def test_check_split_accepts_cfg_on_two():
    check_split("full", 5.0, 2)
    check_split("segments", None, 1)
    with pytest.raises(CamrenderError):
        check_split("full", 5.0, 3)


def test_options_to_argv_parses_back():
    values = {"traj": "a.json", "out": "a.mp4", "steps": 7, "cuda_graphs": False, "offload": True, "seed": 0,
              "prompt": "a b"}
    params = render.make_context("render", options_to_argv(render, values)).params
    assert {name: params[name] for name in values} == {**values, "traj": Path("a.json"), "out": Path("a.mp4")}


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: invalid JSON"),
    ("[1, 2]", "line 2: a job is a JSON object"),
    ('{"trajectory": "a.json", "output": "b.mp4", "colour": 1}', "line 2: colour: unknown key"),
    ('{"trajectory": "a.json", "output": "b.mp4", "gpus": 2}', "line 2: gpus: unknown key"),
])
def test_bad_jobs_file_names_the_line(tmp_path, line, message):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"trajectory": "a.json", "output": "a.mp4"}\n' + line + "\n")
    good, bad = read_jobs(jobs, job_keys())  # a bad line is reported at planning, with the others
    assert not good.error and message in bad.error
    planned = plan_jobs([bad], lambda job: None)
    assert planned[0].status == "failed" and message in planned[0].reason


def test_folder_jobs_and_plan(tmp_path):
    small_trajectory(tmp_path)  # path.json
    (tmp_path / "path.json").rename(tmp_path / "b.json")
    (tmp_path / "a.traj.json").write_text("{}")  # a side file of an earlier render: not a job
    (tmp_path / "notes.md").write_text("not a path")
    jobs = read_jobs(tmp_path, job_keys(), tmp_path / "renders")
    assert [Path(job.values["out"]).name for job in jobs] == ["b.mp4"]
    planned = plan_jobs(jobs + jobs, resolver({"model": "tiny"}))
    assert [job.status for job in planned] == ["render", "failed"]  # the second has the same output
    assert "same output as" in planned[1].reason
    assert (tmp_path / "renders").is_dir()


def test_pipelines_are_loaded_once_per_load_settings():
    loads = []
    pipelines = PipelineCache(lambda settings: loads.append(settings.model) or object())
    settings = [LoadSettings(model="x"), LoadSettings(model="x"), LoadSettings(model="x", refiner_window=2)]
    first = pipelines.get(settings[0])
    assert pipelines.get(settings[1]) is first
    assert pipelines.get(settings[2]) is not first and loads == ["x", "x"] and pipelines.loads == 2


@pytest.mark.parametrize("first_code, expected, message", [
    (1, 1, "camrender: error: rank 1 exited with code 1; the other ranks were stopped"),
    (-9, 1, "camrender: error: rank 1 was killed by signal 9; the other ranks were stopped"),
    (2, 2, ""),  # bad input: rank 0 has said why
    (3, 3, ""),  # a batch with failed jobs: its summary says which
])
def test_launch_reports_the_rank_that_failed_first(monkeypatch, capsys, first_code, expected, message):
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from camrender.parallel import distributed

    for name in (*distributed.NCCL_ENV, "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))  # launch sets them for its workers
    launched = []

    def failing_torchrun(args):
        launched.append(args)
        failures = {1: ProcessFailure(local_rank=1, pid=11, exitcode=first_code, error_file=""),
                    0: ProcessFailure(local_rank=0, pid=10, exitcode=-15, error_file="")}
        failures[0].timestamp = failures[1].timestamp + 1  # stopped after rank 1 failed
        raise ChildFailedError("camrender", failures)

    monkeypatch.setattr(torchrun, "main", failing_torchrun)
    assert distributed.launch(2, ["render", "--traj", "a.json"]) == expected
    assert launched[0][-4:] == ["camrender", "render", "--traj", "a.json"] and "--nproc-per-node=2" in launched[0]
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert capsys.readouterr().err.strip() == message


def test_the_torchrun_executor_deals_to_video_groups_and_only_leaders_report(monkeypatch):
    from types import SimpleNamespace

    from camrender.api.requests import plan_request
    from camrender.batch.plan import Planned
    from camrender.parallel import distributed

    monkeypatch.setattr(distributed, "gather_objects", lambda value, ranks: [value] if ranks.rank == 0 else None)

    def planned(count):
        return [Planned(i, f"line {i}", f"{i}.mp4", "render", request=plan_request(
            LoadSettings(model="tiny", kernels="fused"), "w-16", mode="full", guidance=5.0)) for i in range(count)]

    written = []

    def runner(write, strict):
        return lambda: JobRunner(lambda settings: "pipe", write, strict=strict)

    write = lambda pipe, job: written.append(job.request) or 17  # noqa: E731
    # rank 3 of 4: video group 1 of 2, second rank of its group (not the leader)
    partner = SimpleNamespace(num_videos=2, video_index=1, per_video=2, is_leader=False, rank=3, device="cuda:1")
    jobs = planned(5)
    assert TorchrunExecutor(partner, print).run(jobs, runner(write, True)) is None  # renders along, reports nothing
    assert written == [jobs[1].request, jobs[3].request] and jobs[1].request.settings.device == "cuda:1"
    leader = SimpleNamespace(num_videos=2, video_index=0, per_video=2, is_leader=True, rank=0, device="cuda:0")
    results, loads = TorchrunExecutor(leader, lambda line: None).run(planned(3), runner(write, True))
    assert [(r["index"], r["status"], r["frames"]) for r in results] == [(0, "done", 17), (2, "done", 17)]
    assert loads == [1]

    def failing(pipe, job):
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError):  # a partner may be inside a collective: stop the run
        TorchrunExecutor(leader, lambda line: None).run(planned(1), runner(failing, True))
    alone = SimpleNamespace(num_videos=1, video_index=0, per_video=1, is_leader=True, rank=0, device="cpu")
    results, _ = TorchrunExecutor(alone, lambda line: None).run(planned(2), runner(failing, False))
    assert [r["status"] for r in results] == ["failed", "failed"] and "device lost" in results[0]["reason"]
    odd = SimpleNamespace(num_videos=1, video_index=0, per_video=3, is_leader=True, rank=0, device="cuda:0")
    results, _ = TorchrunExecutor(odd, lambda line: None).run(planned(1), runner(write, True))
    assert results[0]["status"] == "failed" and "3 GPUs per video do not halve" in results[0]["reason"]


def test_plan_refuses_a_job_whose_interrupted_render_is_left(tmp_path):
    small_trajectory(tmp_path)  # path.json
    jobs = read_jobs(tmp_path, job_keys(), tmp_path / "renders")
    (tmp_path / "renders" / ".path.mp4.partial").mkdir(parents=True)  # a killed segment-mode render's checkpoint
    planned = plan_jobs(jobs, resolver({"model": "tiny"}))
    assert [job.status for job in planned] == ["failed"]
    assert "--resume" in planned[0].reason and ".path.mp4.partial" in planned[0].reason
    assert (tmp_path / "renders" / ".path.mp4.partial").is_dir()
