"""Benchmark of `camrender serve`: the HTTP API's status polls per second, the submit-to-start latency of a job
with an idle worker, and job throughput against `camrender batch` rendering the same jobs.

`camrender serve --model M --device D` runs as a subprocess on 127.0.0.1 (a free port) over a store in a temporary
folder; the clients (aiohttp) run here. After one warm-up job:

- polls: `--clients` clients each GET one job's status in a loop for `--poll-seconds`: requests per second the
  server answers (with its latency median and p99); the worker is idle meanwhile;
- submit_to_start: `--latency-jobs` jobs submitted one at a time, each after the one before completed (the worker
  idle): the server's own figure per job, from the request's arrival to the renderer being handed the job
  (`wait_seconds` of the job object), median, p95 and max; beside it the client's POST round trip;
- throughput: `--jobs` jobs submitted at once, each by a client that waits for its video (`POST /v1/videos/sync`), the
  wall time from the first submission to the last video, per job (`serve`); the same with clients that submit (`POST
  /v1/videos`) and poll each job's status every 20 ms (`serve_polled`: 50 requests a second per job in flight, which
  the server answers in the process that renders); and `camrender batch` on a JSON-lines file of a warm-up job and the
  same jobs (after the server stopped: one model in memory at a time), the time from the warm-up job's end to the last
  job's end (each job's line timed as the batch prints it), per job. `serve_vs_batch_percent` = how much longer a job
  takes through the server (target: within 3 % on one GPU). Beside it, each side's render seconds per job (the job's
  `inference_time_s`; the batch summary's `seconds`) and what the wall time adds to them per job
  (`overhead_s_per_job`: hand-offs, planning, the store), which stays comparable where the render times themselves
  wander (a CPU shared with other work).

    python3 bench/bench_serve.py --model tiny --device cpu                                  # this machine's CPU
    python3 bench/bench_serve.py --model tiny --device cuda --jobs 8 --frames 81 --size 640x352 --steps 8
    python3 bench/bench_serve.py --model PIPELINE --device cuda --image first.png --out $OUT/bench_serve.json

Prints JSON (and writes it to --out).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import ClientSession

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import emit  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: camrender's)")
    parser.add_argument("--image", default=None, help="first-frame image (needed by every model but tiny)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT (default: the model's)")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompt", default="a quiet street at dusk")
    parser.add_argument("--jobs", type=int, default=6, help="jobs of the throughput comparison")
    parser.add_argument("--latency-jobs", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("serve_args", nargs="*", help="more `camrender serve` options, after --")
    args = parser.parse_args(argv)
    if args.jobs < 2:
        parser.error("--jobs must be at least 2 (the batch's figure is the wall of --jobs jobs less one job's)")
    return args


def load_args(args) -> list:
    return ["--model", args.model] + ([] if args.device is None else ["--device", args.device])


def job_body(args, seed: int) -> dict:
    """The request of throughput job `seed` (the batch renders the same)."""
    body = {"prompt": args.prompt, "trajectory": f"w-{args.frames - 1}", "num_frames": args.frames,
            "num_inference_steps": args.steps, "seed": seed}
    if args.size:
        body["size"] = args.size
    if args.image:
        data = base64.b64encode(Path(args.image).read_bytes()).decode()
        body["input_reference"] = f"data:image/{Path(args.image).suffix.lstrip('.').lower()};base64,{data}"
    return body


def batch_job(args, seed: int, out: Path) -> dict:
    options = {"frames": args.frames, "steps": args.steps, "seed": seed}
    if args.size:
        options["width"], options["height"] = (int(side) for side in args.size.lower().split("x"))
    job = {"trajectory": f"w-{args.frames - 1}", "prompt": args.prompt, "output": str(out), "options": options}
    if args.image:
        job["image"] = str(Path(args.image).resolve())
    return job


class Server:
    def __init__(self, store: Path, args):
        command = [sys.executable, "-m", "camrender", "serve", *load_args(args), "--port", "0", "--store", str(store),
                   "--max-queue", "1000", *args.serve_args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.process.kill()
            raise SystemExit(f"camrender serve did not start: {self.url!r}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(120)


async def submit(client, url: str, body: dict) -> dict:
    async with client.post(f"{url}/v1/videos", json=body) as answer:
        job = await answer.json()
        if answer.status != 202:
            raise SystemExit(f"submission refused: {job}")
        return job


async def finished(client, url: str, job_id: str, every: float = 0.01) -> dict:
    while True:
        async with client.get(f"{url}/v1/videos/{job_id}") as answer:
            job = await answer.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            if job["status"] != "completed":
                raise SystemExit(f"job {job_id} {job['status']}: {job['error']}")
            return job
        await asyncio.sleep(every)


async def synced(client, url: str, body: dict) -> dict:
    """Submit `body` through /v1/videos/sync (waits for the video, no status polls): the finished job object."""
    async with client.post(f"{url}/v1/videos/sync", json=body) as answer:
        await answer.read()
        if answer.status != 200:
            raise SystemExit(f"sync submission answered {answer.status}")
        video_id = answer.headers["X-Video-Id"]
    async with client.get(f"{url}/v1/videos/{video_id}") as answer:
        return await answer.json()


def throughput(wall: float, done: list, jobs: int) -> dict:
    render = statistics.mean(job["inference_time_s"] for job in done)
    return {"wall_s": round(wall, 3), "seconds_per_job": round(wall / jobs, 3), "render_s_per_job": round(render, 3),
            "overhead_s_per_job": round(wall / jobs - render, 3)}


def percentile(values, share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


async def measure_server(url: str, args) -> dict:
    async with ClientSession() as client:
        warm = await submit(client, url, job_body(args, 0))
        await finished(client, url, warm["id"])

        latencies, stop = [], time.perf_counter() + args.poll_seconds

        async def poll():
            while time.perf_counter() < stop:
                started = time.perf_counter()
                async with client.get(f"{url}/v1/videos/{warm['id']}") as answer:
                    await answer.read()
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(poll() for _ in range(args.clients)))
        polled = time.perf_counter() - began
        polls = {"clients": args.clients, "seconds": round(polled, 3), "requests": len(latencies),
                 "per_second": round(len(latencies) / polled, 1),
                 "latency_ms_median": round(1e3 * statistics.median(latencies), 2),
                 "latency_ms_p99": round(1e3 * percentile(latencies, 0.99), 2)}

        waits, round_trips = [], []
        for seed in range(args.latency_jobs):
            sent = time.perf_counter()
            job = await submit(client, url, job_body(args, 100 + seed))
            round_trips.append(time.perf_counter() - sent)
            waits.append((await finished(client, url, job["id"]))["wait_seconds"])
        start = {"jobs": args.latency_jobs, "median_ms": round(1e3 * statistics.median(waits), 1),
                 "p95_ms": round(1e3 * percentile(waits, 0.95), 1), "max_ms": round(1e3 * max(waits), 1),
                 "post_round_trip_ms_median": round(1e3 * statistics.median(round_trips), 1)}

        began = time.perf_counter()
        done = await asyncio.gather(*(synced(client, url, job_body(args, 1000 + seed)) for seed in range(args.jobs)))
        serve = throughput(time.perf_counter() - began, done, args.jobs)

        began = time.perf_counter()
        jobs = [await submit(client, url, job_body(args, 2000 + seed)) for seed in range(args.jobs)]
        done = await asyncio.gather(*(finished(client, url, job["id"], every=0.02) for job in jobs))
        polled = throughput(time.perf_counter() - began, done, args.jobs)
    return {"polls": polls, "submit_to_start": start, "serve": serve, "serve_polled": polled}


def run_batch(args, folder: Path) -> dict:
    """`camrender batch` on a warm-up job and the `--jobs` throughput jobs: the seconds from the end of the warm-up
    job to the end of the last one (the batch's line for each job, timed as it is printed), per job, and the jobs'
    render seconds (the summary's)."""
    count = args.jobs + 1
    jobs, summary = folder / "jobs.jsonl", folder / "summary.json"
    jobs.write_text("".join(json.dumps(batch_job(args, 1000 + seed, folder / f"b{seed}.mp4")) + "\n"
                            for seed in range(count)))
    process = subprocess.Popen([sys.executable, "-m", "camrender", "batch", str(jobs), *load_args(args), "--progress",
                                "none", "--summary", str(summary)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    ended = [time.perf_counter() for line in process.stderr if line.startswith("camrender: job ")]
    if process.wait() != 0 or len(ended) != count:
        raise SystemExit(f"camrender batch failed ({len(ended)} of {count} jobs done)")
    render = statistics.mean(result["seconds"] for result in json.loads(summary.read_text())["results"][1:])
    wall = ended[-1] - ended[0]
    return {"jobs": args.jobs, "wall_s": round(wall, 3), "seconds_per_job": round(wall / args.jobs, 3),
            "render_s_per_job": round(render, 3), "overhead_s_per_job": round(wall / args.jobs - render, 3)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as folder:
        folder = Path(folder)
        server = Server(folder / "store", args)
        try:
            result = asyncio.run(measure_server(server.url, args))
        finally:
            server.stop()
        result["batch"] = run_batch(args, folder)
    for name in ("serve", "serve_polled"):
        result[f"{name}_vs_batch_percent"] = round(
            100 * (result[name]["seconds_per_job"] / result["batch"]["seconds_per_job"] - 1), 1)
    result["setup"] = {"model": args.model, "device": args.device or "default", "size": args.size or "model's",
                       "frames": args.frames, "steps": args.steps, "jobs": args.jobs, "cpus": os.cpu_count(),
                       "machine": platform.machine(), "python": platform.python_version()}
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
