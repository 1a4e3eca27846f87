"""`camrender serve --executor ray` as a subprocess with a local Ray of its own (127.0.0.1, two workers of one CPU)
on the tiny model: three jobs submitted at once render on the workers, each video the bytes `camrender render`
writes; a cancel in the middle of a render stops it on its worker (whose process is killed and replaced), leaves
nothing of the job, and the next job renders; without Ray installed the command is one line naming the extra,
before anything loads, and Ray's options without --executor ray are refused."""
import asyncio
import json
import sys
import time

import aiohttp
import pytest

from camrender.render.resume import partial_folder
from camrender.serve.jobs import VIDEO
from helpers import assert_process_ends, run_cli
from serve_clients import SMALL, ProcessServer, request, wait_for

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray at a time on an xdist worker, as the batch's Ray tests

JOBS = [  # (request body, the same render's `camrender render` options)
    ({**SMALL, "seed": 1, "extra_params": {"sana_wm": {"action": "w-8"}}},
     ["--traj", "w-8", "--width", "32", "--height", "32", "--frames", "9", "--steps", "1", "--seed", "1"]),
    ({"prompt": "a lane", "size": "32x32", "num_frames": 17, "num_inference_steps": 2, "seed": 2,
      "trajectory": "w-8,dw-8"},
     ["--traj", "w-8,dw-8", "--prompt", "a lane", "--width", "32", "--height", "32", "--frames", "17", "--steps", "2",
      "--seed", "2"]),
    ({**SMALL, "seed": 3, "mode": "segments", "segment_frames": 1, "num_frames": 17, "trajectory": "w-16"},
     ["--traj", "w-16", "--mode", "segments", "--segment-frames", "1", "--width", "32", "--height", "32", "--frames",
      "17", "--steps", "1", "--seed", "3"]),
]
LONG = {**SMALL, "mode": "segments", "segment_frames": 1, "num_frames": 321, "num_inference_steps": 4,
        "extra_params": {"sana_wm": {"action": "w-320"}}}  # 41 segments: cancelled long before its end


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("ray")
    store = tmp_path_factory.mktemp("serve_ray") / "store"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "0")  # the workers render on the PyTorch references, as the tests' CLI renders
        running = ProcessServer(store, "--executor", "ray", "--workers", "2", "--checkpoint-every", "0")
    running.store = store
    yield running
    assert running.stop() == 0
    log = running.log.read_text()
    assert "Traceback" not in log and "camrender: stopped" in log, log[-3000:]


def submit(url: str, body: dict) -> str:
    status, job, _ = request("POST", f"{url}/v1/videos", json=body)
    assert status == 202, job
    return job["id"]


def test_jobs_render_on_the_ray_workers_as_the_cli_renders_them(server, tmp_path, capsys):
    async def run():
        async with aiohttp.ClientSession() as session:
            async def post(body):
                async with session.post(f"{server.url}/v1/videos", json=body) as answer:
                    assert answer.status == 202
                    return (await answer.json())["id"]

            ids = await asyncio.gather(*(post(body) for body, _ in JOBS))
            jobs = await asyncio.gather(*(wait_for(server.url, job_id) for job_id in ids))
            videos = []
            for job_id in ids:
                async with session.get(f"{server.url}/v1/videos/{job_id}/content") as answer:
                    videos.append(await answer.read())
            return jobs, videos

    jobs, videos = asyncio.run(run())
    assert [job["status"] for job in jobs] == ["completed"] * 3, jobs
    assert [job["progress"] for job in jobs] == [100] * 3 and jobs[2]["segments_done"] == jobs[2]["segments_total"]
    for index, (_, options) in enumerate(JOBS):
        out = tmp_path / f"cli{index}.mp4"
        code, _, err = run_cli(["render", *options, "--model", "tiny", "--out", out, "--progress", "none"], capsys)
        assert code == 0, err
        assert out.read_bytes() == videos[index], index
    log = server.log.read_text()
    assert "2 of 2 Ray workers started (one CPU each)" in log and "loading tiny" not in log  # the server loads none


def test_a_cancel_mid_render_kills_its_worker_and_leaves_nothing(server):
    job_id = submit(server.url, LONG)
    folder = server.store / "jobs" / job_id
    partial = partial_folder(folder / VIDEO)
    deadline = time.monotonic() + 120
    while (request("GET", f"{server.url}/v1/videos/{job_id}")[1]["segments_done"] or 0) < 2:  # the worker's progress
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker = json.loads((partial / "owner.json").read_text())["pid"]  # the Ray worker's process renders it
    status, cancelled, _ = request("DELETE", f"{server.url}/v1/videos/{job_id}")
    assert status == 200 and cancelled["status"] == "cancelled", cancelled
    final = asyncio.run(wait_for(server.url, job_id))
    assert final["status"] == "cancelled" and 2 <= final["segments_done"] < final["segments_total"] == 41
    while folder.exists():  # the dispatcher removes the job's files once its render stopped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert_process_ends(worker)
    after = submit(server.url, {**SMALL, "trajectory": "w-8", "seed": 5})
    assert asyncio.run(wait_for(server.url, after))["status"] == "completed"  # the slot and the pool go on
    assert request("GET", f"{server.url}/v1/videos/{after}/content")[1][4:8] == b"ftyp"
    log = server.log.read_text()
    assert f"job {job_id}: its Ray worker was stopped; a new one replaces it" in log
    assert f"job {job_id}: cancelled" in log


def test_without_ray_serve_executor_ray_is_one_line_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as without the package
    code, out, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", "--port", "0",
                              "--executor", "ray"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and 'pip install "camrender[ray]"' in err, err
    assert not (tmp_path / "store").exists()
    for option, value in (("--workers", "2"), ("--address", "auto"), ("--retries", "0")):
        code, out, err = run_cli(["serve", "--model", "tiny", "--store", tmp_path / "store", option, value], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert f"{option} is for the Ray executor: add --executor ray" in err
    assert not (tmp_path / "store").exists()


def test_a_failure_of_the_ray_workers_stops_the_renders_of_the_jobs_it_fails(tmp_path, monkeypatch):
    """In-process: the pool failing under the owner thread fails the job in flight and stops its render on its
    worker (cancelled on the pool, its worker killed), so nothing keeps writing into a failed job's folder."""
    pytest.importorskip("ray")
    from camrender.api.requests import plan_request
    from camrender.batch.ray_executor import ray_cluster
    from camrender.errors import CamrenderError
    from camrender.render.load_settings import LoadSettings
    from camrender.serve.progress import JobProgress
    from camrender.serve.ray_renderer import RayRenderer
    from camrender.serve.worker import PlannedJob

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    settings = LoadSettings.create("tiny", device="cpu")
    request = plan_request(settings, "w-320", frames=321, steps=4, height=32, width=32, mode="segments",
                           segment_frames=1, out=tmp_path / "long.mp4", prompt_cache=None)
    with ray_cluster(num_cpus=1):
        renderer = RayRenderer(settings, workers=1)
        assert renderer.start() == 1
        reported, cancelled = [], []
        progress = JobProgress(lambda **fields: reported.append(fields), lambda: None, refiner=False)
        cancel = renderer.pool.cancel
        monkeypatch.setattr(renderer.pool, "cancel", lambda index: cancelled.append(cancel(index)))
        next_result = renderer.pool.next_result

        def fail_once_rendering(timeout=None):
            if reported and not cancelled:  # the render is under way: the cluster fails now
                raise RuntimeError("the cluster went away")
            return next_result(timeout=timeout)

        monkeypatch.setattr(renderer.pool, "next_result", fail_once_rendering)
        try:
            with pytest.raises(CamrenderError, match="the Ray workers failed: RuntimeError: the cluster went away"):
                renderer.render(PlannedJob("job1", request, False, 0.0), progress)
            assert cancelled == ["rendering"]
        finally:
            renderer.close()
    assert not (tmp_path / "long.mp4").exists()
