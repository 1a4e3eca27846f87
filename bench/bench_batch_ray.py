"""Batch throughput on a local Ray against the in-process executor: the tiny model on the CPU, every worker on one
thread. Prints one JSON document, side by side:

- in_process: one `JobRunner` in this process (what `camrender batch` runs without --executor);
- ray_1, ray_2: `camrender.batch.ray_workers.RayWorkers` with 1 and 2 workers on a Ray started here (127.0.0.1).

Each executor is started and warmed first (its workers started, a model loaded by each), then the same batch of
`--jobs` jobs runs on each in turn, `--rounds` times: other work on a shared machine slows some rounds, so the best
round of each gives `jobs_per_hour_best` (the median round `jobs_per_hour_median`). `overhead_one_job_warm_s`: what
one job costs on the warm 1-worker pool beyond the same job in this process (medians of `--repeats`).
`two_processes_without_ray`: the same batch split over two plain processes (no Ray), each on one thread: what two
workers can do on this machine at the time (its other load included). `cold_one_job`: `camrender batch` with one job
from the command line in a fresh process: in-process and --executor ray starting its own Ray (started and stopped,
its worker started, the model loaded) in turn, then --executor ray joining a Ray head started beforehand (`ray start
--head`, as a cluster user has one: connecting, the worker started, the model loaded): the best of `--repeats` each;
`ray_start_s` / `ray_stop_s`: Ray alone started and stopped as --executor ray does it, each in a fresh process.
With `--old TREE` (a folder holding another tree's camrender/, kernels/ and pyproject.toml: `git archive REV camrender
kernels pyproject.toml | tar -x -C TREE`) that tree's in-process and --executor ray runs take turns with this tree's
(`cold_one_job` "old_tree"); `--cold-only` measures `cold_one_job` alone.

    python3 bench/bench_batch_ray.py --out bench/results/DATE_batch_ray_cpu.json
    python3 bench/bench_batch_ray.py --cold-only --old /tmp/before --out bench/results/DATE_batch_ray_cold_trees.json
    python3 bench/bench_batch_ray.py --jobs 2 --rounds 1 --repeats 1 --steps 1      # checks the script
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this tree
sys.path.insert(0, ROOT)

from common import emit  # noqa: E402

OPTIONS = {"model": "tiny", "device": "cpu", "prompt_cache": "off"}
RUNNER = None  # this process's runner: the in-process executor's


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12, help="jobs of the timed batch")
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per executor, in turn")
    parser.add_argument("--repeats", type=int, default=3, help="one-job timings (warm and cold overhead)")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=112)
    parser.add_argument("--cold-only", action="store_true", help="only `camrender batch` of one job, cold")
    parser.add_argument("--old", default=None, help="another tree, its cold runs in turn with this one's")
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args(argv)


def planned_jobs(args, folder: Path, count: int, first: int = 0) -> list:
    """`count` planned jobs (the same shape, seeds first, first + 1, ...) writing into `folder`."""
    from camrender.api.requests import plan_request
    from camrender.batch.plan import Planned
    from camrender.render.load_settings import LoadSettings

    settings = LoadSettings.create(OPTIONS["model"], device=OPTIONS["device"])
    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for seed in range(first, first + count):
        out = folder / f"{seed}.mp4"
        request = plan_request(settings, "w-40,dw-40", frames=args.frames, steps=args.steps, height=args.height,
                               width=args.width, seed=seed, out=out, prompt_cache=None)
        jobs.append(Planned(seed, f"job {seed}", str(out), "render", request=request))
    return jobs


def make_runner(ranks):
    """A `JobRunner` on one thread, in whichever process calls it (pickled by value to Ray's workers)."""
    import torch

    from camrender.api.pipeline import CamrenderPipeline
    from camrender.batch.executors import JobRunner

    torch.set_num_threads(1)
    return JobRunner(lambda settings: CamrenderPipeline.from_pretrained(settings=settings),
                     lambda pipe, job: pipe.write(job.request).frames)


def batch_on(pool, jobs: list) -> tuple:
    """Render `jobs` on `pool` (a `RayWorkers`; None: this process's `RUNNER`): (seconds, each job's render
    seconds)."""
    started = time.perf_counter()
    if pool is None:
        seconds = [RUNNER.render(job)["seconds"] for job in jobs]
    else:
        for job in jobs:
            pool.submit(job)
        seconds = [result["seconds"] for result in pool.results()]
    assert len(seconds) == len(jobs)
    return time.perf_counter() - started, seconds


def compare(args, folder: Path) -> dict:
    """The rounds of the same batch on each executor in turn, then one job at a time on in_process and ray_1."""
    global RUNNER
    from camrender.batch.ray_workers import RayWorkers

    RUNNER = make_runner(None)
    figures = {"in_process": {}, "ray_1": {}, "ray_2": {}}
    with RayWorkers(make_runner, 1) as ray_1, RayWorkers(make_runner, 2) as ray_2:
        pools = {"in_process": None, "ray_1": ray_1, "ray_2": ray_2}
        for name, pool in pools.items():  # started and warm: every worker has loaded its model
            started = time.perf_counter()
            count = 1 if pool is None else pool.wait_started()
            batch_on(pool, planned_jobs(args, folder / name, 2 * count, first=10_000))
            figures[name]["start_and_warm_up_s"] = round(time.perf_counter() - started, 2)
        walls, renders = {name: [] for name in pools}, {name: [] for name in pools}
        for round_ in range(args.rounds):
            for name, pool in pools.items():
                seconds, each = batch_on(pool, planned_jobs(args, folder / name / str(round_), args.jobs))
                walls[name].append(round(seconds, 2))
                renders[name] += each
        for name in pools:
            figures[name].update(
                batch_s=walls[name], jobs_per_hour_best=round(3600 * args.jobs / min(walls[name]), 1),
                jobs_per_hour_median=round(3600 * args.jobs / statistics.median(walls[name]), 1),
                render_s_median=round(statistics.median(renders[name]), 3))
        for name in ("in_process", "ray_1"):
            one = []
            for job in planned_jobs(args, folder / f"one_{name}", args.repeats, first=20_000):
                one.append(round(batch_on(pools[name], [job])[0], 3))
            figures[name]["one_job_s"] = one
        figures["ray_1"]["model_loads"], figures["ray_2"]["model_loads"] = dict(ray_1.loads), dict(ray_2.loads)
    figures["overhead_one_job_warm_s"] = round(statistics.median(figures["ray_1"]["one_job_s"])
                                               - statistics.median(figures["in_process"]["one_job_s"]), 3)
    for measure in ("best", "median"):
        per_hour = {name: figures[name][f"jobs_per_hour_{measure}"] for name in pools}
        figures[f"ray_2_over_ray_1_{measure}"] = round(per_hour["ray_2"] / per_hour["ray_1"], 2)
        figures[f"ray_2_over_in_process_{measure}"] = round(per_hour["ray_2"] / per_hour["in_process"], 2)
    return figures


def _process_share(args, folder: Path, seeds: range, ready, results) -> None:
    """One of `two_processes`' processes: warm up, wait for the other, then render its seeds; its seconds."""
    global RUNNER
    os.environ["TRITON_INTERPRET"] = "0"
    RUNNER = make_runner(None)
    batch_on(None, planned_jobs(args, folder / f"warm_{seeds.start}", 1, first=10_000 + seeds.start))
    ready.wait()
    results.put(batch_on(None, planned_jobs(args, folder / str(seeds.start), len(seeds), first=seeds.start))[0])


def two_processes(args, folder: Path) -> dict:
    """The ceiling of two workers on this machine now: two plain processes (no Ray), each on one thread with its
    model loaded, rendering half of the batch each at the same time: the batch's seconds, `--rounds` times."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    walls = []
    for round_ in range(args.rounds):
        ready, results = context.Barrier(2), context.Queue()
        half = args.jobs // 2
        shares = [range(0, half), range(half, args.jobs)]
        processes = [context.Process(target=_process_share, args=(args, folder / f"two_{round_}", share, ready,
                                                                    results)) for share in shares]
        for process in processes:
            process.start()
        walls.append(round(max(results.get() for _ in processes), 2))
        for process in processes:
            process.join()
    return {"batch_s": walls, "jobs_per_hour_best": round(3600 * args.jobs / min(walls), 1),
            "jobs_per_hour_median": round(3600 * args.jobs / statistics.median(walls), 1)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def ray_head(env: dict):
    """A Ray head on this machine, as `ray start --head` makes one (on free ports, its own temporary folder), stopped
    at the end (SIGTERM to its `--block`ing process, which stops the others): its address, HOST:PORT."""
    port, temp = _free_port(), Path(tempfile.mkdtemp(prefix="bench-ray-head-"))
    log = temp / "start.log"
    with log.open("w") as output:
        head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                                 "--node-ip-address", "127.0.0.1", "--num-cpus", str(os.cpu_count()), "--port",
                                 str(port), "--ray-client-server-port", str(_free_port()), "--include-dashboard",
                                 "false", "--disable-usage-stats", "--temp-dir", str(temp)],
                                env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        while "block forever" not in log.read_text():
            if head.poll() is not None:
                raise RuntimeError(f"ray start --head failed:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)
        head.wait(60)
        shutil.rmtree(temp, ignore_errors=True)


# Ray started and stopped alone, as `camrender batch --executor ray` starts and stops it, in a fresh process
START_STOP = """import json, time
from camrender.batch.ray_executor import ray_cluster
started = time.perf_counter()
with ray_cluster():
    up = time.perf_counter()
print(json.dumps([up - started, time.perf_counter() - up]))
"""


def cold_one_job(args, folder: Path) -> dict:
    """`camrender batch` with one job, each run in a fresh process: in-process and --executor ray starting its own
    Ray, in turn (and the same of the `--old` tree); then --executor ray --address HOST:PORT joining the Ray head
    `ray_head` started, both with Ray's token authentication (RAY_AUTH_MODE=token unless set otherwise: Ray asks it of
    a client that names an address; the local Rays started before made the token). The head runs only for the latter,
    so that the Ray --executor ray starts is the machine's only one. Every run imports camrender from its tree only
    (PYTHONPATH, run in `folder`)."""
    line = {"trajectory": "w-40,dw-40", "frames": args.frames, "steps": args.steps, "height": args.height,
            "width": args.width}
    env = {**os.environ, "TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    options = [part for name, value in OPTIONS.items() for part in (f"--{name.replace('_', '-')}", value)]
    trees = {"": ROOT, **({"old_": os.path.abspath(args.old)} if args.old else {})}
    walls = {f"{prefix}{name}": [] for prefix in trees for name in ("local", "ray")}
    walls["ray_address"] = []

    def run(name: str, repeat: int, extra=(), run_env=env) -> None:
        jobs = folder / f"cold_{name}_{repeat}.jsonl"
        jobs.write_text(json.dumps({**line, "output": str(folder / f"cold_{name}_{repeat}.mp4")}) + "\n")
        command = [sys.executable, "-m", "camrender", "batch", str(jobs), "--executor",
                   "local" if name.endswith("local") else "ray", "--progress", "none", *options, *extra]
        started = time.perf_counter()
        subprocess.run(command, env=run_env, cwd=folder, check=True, capture_output=True)
        walls[name].append(round(time.perf_counter() - started, 2))

    start_stop = []
    for repeat in range(args.repeats):
        for prefix, tree in trees.items():
            for name in ("local", "ray"):
                run(prefix + name, repeat, run_env={**env, "PYTHONPATH": tree})
        probe = subprocess.run([sys.executable, "-c", START_STOP], env=env, cwd=folder, check=True,
                               capture_output=True, text=True)
        start_stop.append([round(seconds, 2) for seconds in json.loads(probe.stdout)])
    cluster_env = {**env, "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "token")}
    with ray_head(cluster_env) as address:
        for repeat in range(args.repeats):
            run("ray_address", repeat, ["--address", address], cluster_env)
    figures = {"in_process_s": walls["local"], "ray_s": walls["ray"], "ray_address_s": walls["ray_address"],
               "ray_start_s": [start for start, _ in start_stop], "ray_stop_s": [stop for _, stop in start_stop],
               "overhead_best_s": round(min(walls["ray"]) - min(walls["local"]), 2),
               "overhead_median_s": round(statistics.median(walls["ray"]) - statistics.median(walls["local"]), 2),
               "overhead_address_best_s": round(min(walls["ray_address"]) - min(walls["local"]), 2)}
    if args.old:
        figures["old_tree"] = {
            "tree": os.path.abspath(args.old), "in_process_s": walls["old_local"], "ray_s": walls["old_ray"],
            "overhead_best_s": round(min(walls["old_ray"]) - min(walls["old_local"]), 2),
            "overhead_median_s": round(statistics.median(walls["old_ray"]) - statistics.median(walls["old_local"]), 2)}
    return figures


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "0"  # the kernels' PyTorch references, as on a user's CPU
    from camrender.batch.ray_executor import ray_cluster

    folder = Path(tempfile.mkdtemp(prefix="bench-batch-ray-"))
    result = {"command": "python3 bench/bench_batch_ray.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "date": time.strftime("%Y-%m-%d"),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average_before": [round(load, 2) for load in os.getloadavg()]},
              "job": {"model": "tiny", "device": "cpu", "frames": args.frames, "steps": args.steps,
                      "height": args.height, "width": args.width, "threads_per_worker": 1, "jobs": args.jobs}}
    try:
        if not args.cold_only:
            with ray_cluster(num_cpus=3):  # logical CPUs: the 1- and 2-worker pools both placed, one of them idle
                result.update(compare(args, folder))
            result["two_processes_without_ray"] = two_processes(args, folder)
            for measure in ("best", "median"):
                per_hour = [result[name][f"jobs_per_hour_{measure}"] for name in ("ray_2",
                                                                                     "two_processes_without_ray")]
                result[f"ray_2_over_two_processes_{measure}"] = round(per_hour[0] / per_hour[1], 2)
        result["cold_one_job"] = cold_one_job(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["machine"]["load_average_after"] = [round(load, 2) for load in os.getloadavg()]
    return result


if __name__ == "__main__":
    emit(main(), parse_args().out)
