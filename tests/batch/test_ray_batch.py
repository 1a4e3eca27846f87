"""`camrender batch --executor ray` on a real local Ray started once for this module (127.0.0.1, two worker processes of
one CPU each) with the tiny model: every video is the one the same render gives alone, byte for byte; a worker whose
process is SIGKILLed in the middle of a job costs a retry of that job only (resumed from its checkpoint), with
nothing partial left; a job whose worker keeps dying fails after its retries while the others render; a worker lost
while it starts is replaced, a few times in a row; the pool works from Python without the CLI; a cancelled job's
worker is killed (its output let go and cleared before `cancel` returns) and replaced; a driver started apart joins
this Ray by its address and hands its job to a worker without importing torch or diffusers itself; a batch that
starts a Ray of its own gives it a logical CPU per worker it can use and neither the autoscaler nor the dashboard,
and stops all of it, also when Ctrl-C cuts its start short."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import assert_process_ends, run_cli

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one local Ray for the module: its tests stay on one xdist worker

BASE = ["--model", "tiny", "--device", "cpu", "--height", "32", "--width", "32", "--prompt-cache", "off"]
GROUPS = ({}, {"kernels": "torch"})  # two load settings: each worker keeps a pipeline per group


@pytest.fixture(scope="module")
def cluster():
    from camrender.batch.ray_executor import ray_cluster

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "0")  # the workers render on the PyTorch references, as a user's CPU does
        with ray_cluster(num_cpus=2) as started:
            yield started
    assert not ray.is_initialized()


def test_the_local_ray_listens_on_loopback_only(cluster):
    [node] = ray.nodes()
    assert node["NodeManagerAddress"] == "127.0.0.1" and node["Resources"]["CPU"] == 2
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def options_argv(options: dict) -> list:
    return [part for name, value in options.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def write_jobs(folder: Path, jobs: list, extra_lines=()) -> Path:
    lines = [json.dumps({"trajectory": traj, "output": f"out/{name}.mp4", "options": options})
             for name, traj, options in jobs]
    (folder / "jobs.jsonl").write_text("\n".join([*lines, *extra_lines]) + "\n")
    return folder / "jobs.jsonl"


def assert_same_as_alone(tmp_path, capsys, jobs):
    """Each job rendered alone by `camrender render` in this process gives the batch's video, byte for byte."""
    (tmp_path / "alone").mkdir()
    for name, traj, options in jobs:
        code, _, err = run_cli(["--traj", traj, "--out", tmp_path / "alone" / f"{name}.mp4", *BASE,
                                *options_argv(options), "--progress", "none"], capsys)
        assert code == 0, err[-2000:]
        together, alone = (tmp_path / folder / f"{name}.mp4" for folder in ("out", "alone"))
        assert together.read_bytes() == alone.read_bytes(), name


def assert_nothing_partial(folder: Path, names):
    """Only finished videos and their side files: no temporary file, no partial folder."""
    expected = {f"{name}{suffix}" for name in names for suffix in (".mp4", ".traj.json", ".render.json", ".path.png")}
    assert {path.name for path in folder.iterdir()} == expected


def test_every_video_is_the_render_alone_and_bad_lines_are_reported(cluster, tmp_path, capsys):
    jobs = [(f"{group}{index}", "w-16,dw-16", {"seed": index, "frames": (9, 17)[index % 2],
                                                 "steps": (1, 2)[index // 2], **options})
            for group, options in zip("ab", GROUPS) for index in range(3)]
    jobs_file = write_jobs(tmp_path, jobs, ['{"trajectory": "w-16", "output": "out/bad.mp4", "seed": -1}'])
    code, _, err = run_cli(["batch", jobs_file, *BASE, "--executor", "ray", "--skip-bad-jobs", "--progress", "lines",
                            "--summary", tmp_path / "summary.json"], capsys)
    assert code == 3, err[-3000:]  # the bad line failed, the others rendered on the cluster
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["done"], summary["failed"], summary["retries"]) == (6, 1, [])
    assert "jobs.jsonl line 7" in summary["failures"][0]["reason"] and "seed" in summary["failures"][0]["reason"]
    assert {result["worker"] for result in summary["results"] if result["status"] == "done"} == {"w1", "w2"}
    assert 2 <= sum(summary["model_loads_per_rank"]) <= 4 and summary["ranks"] == 2  # a pipeline kept per group
    finished = [line for line in err.splitlines() if line.startswith("camrender: job ")]
    assert len(finished) == 6 and "; 5 left, ETA " in finished[0] and " on w" in finished[0], err[-3000:]
    assert_nothing_partial(tmp_path / "out", [name for name, _, _ in jobs])
    assert_same_as_alone(tmp_path, capsys, jobs)


def test_a_driver_joining_by_address_imports_neither_torch_nor_diffusers(cluster, tmp_path):
    # a fresh process joins this module's Ray at its address (inheriting the token auth the local Ray turned on);
    # Ray's single-machine mode there too, else Ray swaps the loopback address this Ray listens on for a public one
    code = ("import sys\nfrom camrender.cli.main import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as done:\n    assert done.code == 0, done.code\n"
            "print(sorted(name for name in ('torch', 'diffusers', 'transformers') if name in sys.modules))\n")
    jobs_file = write_jobs(tmp_path, [("a", "w-8", {"frames": 9, "steps": 1})])
    address = ray.get_runtime_context().gcs_address
    result = subprocess.run([sys.executable, "-c", code, "batch", str(jobs_file), *BASE, "--executor", "ray",
                             "--address", address, "--progress", "none", "--summary", str(tmp_path / "summary.json")],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout  # the driver planned and handed out; a worker rendered
    assert json.loads((tmp_path / "summary.json").read_text())["done"] == 1
    assert_nothing_partial(tmp_path / "out", ["a"])


# the processes under `root` (children, theirs, ...) with their command lines (Linux /proc), in a driver's source
DESCENDANTS = """import json, os, sys
from pathlib import Path

def descendants(root):
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError):
            pass
    found, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        for pid in frontier:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
    return found
"""

# a driver that records, once its own Ray has started, Ray's logical CPUs and the processes under it
WATCHED_DRIVER = DESCENDANTS + """
import camrender.cli.batch as batch
from camrender.cli.main import main

seen = {}
made = batch.RayExecutor.__init__
def watched(self, *args, **kwargs):
    import ray
    seen.update(cpus=ray.cluster_resources()["CPU"], processes=descendants(os.getpid()))
    made(self, *args, **kwargs)
batch.RayExecutor.__init__ = watched
try:
    main(sys.argv[1:])
except SystemExit as done:
    assert done.code == 0, done.code
print(json.dumps(seen))
"""


def test_a_batch_starting_its_own_ray_starts_only_what_it_uses_and_stops_it(tmp_path):
    jobs_file = write_jobs(tmp_path, [("a", "w-8", {"frames": 9, "steps": 1})])
    result = subprocess.run([sys.executable, "-c", WATCHED_DRIVER, "batch", str(jobs_file), *BASE, "--executor", "ray",
                             "--progress", "none"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["cpus"] == 1  # one job: one logical CPU, so Ray starts one Python worker, not one per core
    commands = list(seen["processes"].values())
    assert any("gcs_server" in command for command in commands) and any("raylet" in command for command in commands)
    assert not [command for command in commands if "autoscaler" in command or "dashboard/dashboard.py" in command]
    for pid in seen["processes"]:  # Ray stopped whole with the batch
        assert_process_ends(int(pid))
    assert_nothing_partial(tmp_path / "out", ["a"])


# a driver whose Ray start is cut short by Ctrl-C once Ray's raylet and the rest have started; it prints the processes
# it had then and those still under it afterwards
INTERRUPTED_DRIVER = DESCENDANTS + """
import time
from ray._private.node import Node
from camrender.batch.ray_executor import ray_cluster

started = Node.start_ray_processes
seen = {}
def cut_short(node):
    started(node)
    time.sleep(1.0)  # the raylet's agents starting
    seen["started"] = descendants(os.getpid())
    raise KeyboardInterrupt
Node.start_ray_processes = cut_short
try:
    with ray_cluster(num_cpus=1):
        pass
except KeyboardInterrupt:
    seen["left"] = descendants(os.getpid())
print(json.dumps(seen))
"""


def test_ctrl_c_while_ray_starts_stops_what_it_started(tmp_path):
    result = subprocess.run([sys.executable, "-c", INTERRUPTED_DRIVER], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    commands = list(seen["started"].values())
    assert any("raylet" in command for command in commands) and any("gcs_server" in command for command in commands)
    assert seen["left"] == {}
    for pid in seen["started"]:  # its agents too, which the raylet started and which outlive it
        assert_process_ends(int(pid))


def kill_at_first_checkpoint(folder: Path, killed: list, stop: threading.Event) -> None:
    """SIGKILL the process rendering the first segment-mode job that writes a checkpoint (its owner.json)."""
    while not stop.is_set():
        for checkpoint in folder.glob(".*.mp4.partial/checkpoint.safetensors"):
            try:
                owner = json.loads((checkpoint.parent / "owner.json").read_text())
            except (OSError, ValueError):
                continue
            assert owner["pid"] != os.getpid()  # a Ray worker's process, never this one
            os.kill(owner["pid"], signal.SIGKILL)
            killed.append((checkpoint.parent.name[1:-len(".partial")], owner["pid"]))
            return
        time.sleep(0.02)


def test_a_worker_killed_in_the_middle_of_a_job_costs_one_retry(cluster, tmp_path, capsys):
    segments = {"mode": "segments", "frames": 41, "segment_frames": 1, "checkpoint_every": 0, "steps": 2}
    jobs = [(f"{group}{index}", "w-40,dw-40", {"seed": index, **segments, **options})
            for group, options in zip("ab", GROUPS) for index in range(2)]
    jobs_file = write_jobs(tmp_path, jobs)
    (tmp_path / "out").mkdir()
    killed, stop = [], threading.Event()
    killer = threading.Thread(target=kill_at_first_checkpoint, args=(tmp_path / "out", killed, stop), daemon=True)
    killer.start()
    try:
        code, _, err = run_cli(["batch", jobs_file, *BASE, "--executor", "ray", "--progress", "none",
                                "--summary", tmp_path / "summary.json"], capsys)
    finally:
        stop.set()
        killer.join()
    assert code == 0 and len(killed) == 1, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["done"] == 4 and summary["failed"] == 0
    [retry] = summary["retries"]
    assert Path(retry["out"]).name == killed[0][0] and "ActorDiedError" in retry["reason"]
    assert f"retried: {retry['where']}" in err and "rendering it again (retry 1 of 2)" in err
    retried = next(result for result in summary["results"] if result["out"] == retry["out"])
    assert retried["worker"] != retry["worker"]
    assert [{**attempt, "where": retry["where"], "out": retry["out"]} for attempt in retried["retries"]] == [retry]
    assert_nothing_partial(tmp_path / "out", [name for name, _, _ in jobs])
    assert_same_as_alone(tmp_path, capsys, jobs)  # resumed from the checkpoint: the same bytes


def test_a_video_group_of_two_workers_renders_each_video_as_one_process(cluster, tmp_path, capsys):
    from test_render_cli import read_video

    jobs = [(f"g{index}", "w-16,dw-16", {"seed": index, "frames": 9, "steps": 1, "guidance": 5.0})
            for index in range(2)]
    code, _, err = run_cli(["batch", write_jobs(tmp_path, jobs), *BASE, "--executor", "ray", "--gpus-per-video", "2",
                            "--progress", "none", "--summary", tmp_path / "summary.json"], capsys)
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["done"], summary["ranks"], summary["gpus_per_video"]) == (2, 2, 2)
    assert summary["model_loads_per_rank"] == [1]
    assert "2 to render on 1 group of 2 CPUs" in err
    assert_nothing_partial(tmp_path / "out", ["g0", "g1"])
    (tmp_path / "alone").mkdir()
    for name, traj, options in jobs:  # the guidance branches on two processes (gloo): the same frames within fp32
        code, _, err = run_cli(["--traj", traj, "--out", tmp_path / "alone" / f"{name}.mp4", *BASE,
                                *options_argv(options), "--progress", "none"], capsys)
        assert code == 0, err[-2000:]
        together, alone = (read_video(tmp_path / folder / f"{name}.mp4")[0].astype(float)
                           for folder in ("out", "alone"))
        assert together.shape == alone.shape and abs(together - alone).mean() < 1.0, name


def planned(folder: Path, index: int):
    """Job `index` planned for the pool (a tiny render into folder/INDEX.mp4)."""
    from camrender.api.requests import plan_request
    from camrender.batch.plan import Planned
    from camrender.render.load_settings import LoadSettings

    request = plan_request(LoadSettings(model="tiny", device="cpu"), "w-8", out=folder / f"{index}.mp4")
    return Planned(index, f"job {index}", str(folder / f"{index}.mp4"), "render", request=request)


def test_a_job_whose_worker_keeps_dying_fails_after_its_retries(cluster, tmp_path):
    from camrender.batch.ray_workers import RayWorkers

    def make_dying_runner(ranks):  # pickled by value to the workers: no model; job 1's process dies (SIGKILL)
        from camrender.batch.executors import JobRunner

        def write(pipe, job):
            if job.index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return 7

        return JobRunner(lambda settings: "pipeline", write)

    with RayWorkers(make_dying_runner, workers=2, retries=1, log=lambda line: None) as pool:
        assert pool.next_result(timeout=0.1) is None and pool.pending == 0  # nothing submitted
        for index in range(3):
            pool.submit(planned(tmp_path, index))
        assert pool.pending == 3
        results = {result["index"]: result for result in pool.results()}
        assert pool.pending == 0
    assert [results[index]["status"] for index in range(3)] == ["done", "failed", "done"]
    assert [result["frames"] for result in (results[0], results[2])] == [7, 7]
    assert "its worker was lost 2 times" in results[1]["reason"] and len(results[1]["retries"]) == 2
    assert len({attempt["worker"] for attempt in results[1]["retries"]}) == 2  # each time on another worker


def make_runner_dying_at_start(marker: Path, times: int):
    """A runner maker (pickled by value to the workers) whose first `times` calls kill their own process (SIGKILL),
    as a worker lost while it starts; later ones make a runner without a model that returns 7 frames."""

    def make(ranks):
        from camrender.batch.executors import JobRunner

        deaths = int(marker.read_text()) if marker.exists() else 0
        if deaths < times:
            marker.write_text(str(deaths + 1))
            os.kill(os.getpid(), signal.SIGKILL)
        return JobRunner(lambda settings: "pipeline", lambda pipe, job: 7)

    return make


def test_a_worker_lost_while_starting_is_replaced_a_few_times_in_a_row(cluster, tmp_path):
    from camrender.batch.ray_workers import RayWorkers

    lines = []
    with RayWorkers(make_runner_dying_at_start(tmp_path / "deaths", 2), workers=1, retries=2, log=lines.append) as pool:
        for index in range(2):
            pool.submit(planned(tmp_path, index))
        results = list(pool.results())
    assert [(result["status"], result["worker"]) for result in results] == [("done", "w3"), ("done", "w3")]
    assert [line.split(":")[0] for line in lines] == ["w1 lost", "w2 lost"] and "starting another" in lines[1]

    lines.clear()  # a worker that can never start: replaced `retries` times, then the queue fails, nothing loops
    with RayWorkers(make_runner_dying_at_start(tmp_path / "always", 99), workers=1, retries=1,
                    log=lines.append) as pool:
        pool.submit(planned(tmp_path, 2))
        [result] = list(pool.results())
    assert result["status"] == "failed" and "no worker left to render it (w2 lost" in result["reason"]
    assert len(lines) == 2 and "starting another" in lines[0] and "starting another" not in lines[1]


def test_a_cancelled_job_stops_on_its_worker_which_is_replaced(cluster, tmp_path):
    from camrender.batch.ray_workers import RayWorkers
    from camrender.output.targets import claim_output, lock_path

    def make_slow_runner(ranks):  # pickled by value: no model; job 0 holds its output until its process is killed
        from camrender.batch.executors import JobRunner

        def write(pipe, job):
            if job.index == 0:
                with claim_output(job.out):  # as a render writing it
                    Path(f"{job.out}.pid").write_text(str(os.getpid()))
                    time.sleep(120)
            return 7

        return JobRunner(lambda settings: "pipeline", write)

    with RayWorkers(make_slow_runner, workers=1) as pool:
        for index in range(3):
            pool.submit(planned(tmp_path, index))
        started = tmp_path / "0.mp4.pid"
        while not started.exists():
            assert pool.next_result(timeout=0.1) is None  # hands job 0 to the worker; nothing finishes
        assert pool.cancel(2) == "queued" and pool.pending == 2
        assert pool.cancel(0) == "rendering" and pool.pending == 1
        assert not Path(lock_path(tmp_path / "0.mp4")).exists()  # its claim was let go and cleared: no writer left
        assert_process_ends(int(started.read_text()))
        assert [(result["index"], result["worker"]) for result in pool.results()] == [(1, "w2")]  # the new worker
        assert pool.cancel(1) is None and pool.cancel(0) is None

