"""`camrender serve` as a subprocess, killed with SIGKILL mid-job and started again on its store: every accepted job
completes, the one in progress continues from its segment-mode checkpoint and its video is the same file as an
uninterrupted render's; SIGTERM stops the server with its running job queued again and a waiting
/v1/videos/sync request answered 503."""
import asyncio
import threading
import time

from camrender.render.resume import CHECKPOINT_NAME, partial_folder
from camrender.serve.jobs import VIDEO
from camrender.serve.store import JobStore
from serve_clients import ACTION, SMALL, ProcessServer, request, wait_for

LONG = {**SMALL, "num_frames": 97, "num_inference_steps": 2, "mode": "segments", "segment_frames": 1, "seed": 3,
        "extra_params": {"sana_wm": {"action": "w-96"}}}  # 13 segments


def submit(url: str, body: dict) -> str:
    status, job, _ = request("POST", f"{url}/v1/videos", json=body)
    assert status == 202, job
    return job["id"]


def wait_for_segments(url: str, job_id: str, count: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = request("GET", f"{url}/v1/videos/{job_id}")[1]
        if (job["segments_done"] or 0) >= count:
            return job
        assert job["status"] in ("queued", "in_progress") and time.monotonic() < deadline, job
        time.sleep(0.02)


def test_sigkill_mid_job_then_restart_completes_every_job(tmp_path):
    store = tmp_path / "store"
    server = ProcessServer(store, "--checkpoint-every", "0")
    try:
        resumed = submit(server.url, LONG)
        queued = [submit(server.url, {**ACTION, **SMALL, "seed": 1}),
                  submit(server.url, {**SMALL, "mode": "segments", "trajectory": "w-8,dw-8", "num_frames": 17})]
        at_kill = wait_for_segments(server.url, resumed, 3)
        server.kill()
    finally:
        server.stop()
    assert at_kill["status"] == "in_progress" and at_kill["segments_done"] < at_kill["segments_total"] == 13
    assert (partial_folder(store / "jobs" / resumed / VIDEO) / CHECKPOINT_NAME).is_file()

    server = ProcessServer(store, "--checkpoint-every", "0")
    try:
        jobs = {job_id: asyncio.run(wait_for(server.url, job_id)) for job_id in [resumed, *queued]}
        assert {job["status"] for job in jobs.values()} == {"completed"}, jobs
        assert [jobs[job_id]["attempts"] for job_id in [resumed, *queued]] == [2, 1, 1]
        video = request("GET", f"{server.url}/v1/videos/{resumed}/content")[1]
        again = submit(server.url, LONG)  # the same job, rendered without an interruption
        assert asyncio.run(wait_for(server.url, again))["status"] == "completed"
        assert request("GET", f"{server.url}/v1/videos/{again}/content")[1] == video
        for job_id in queued:
            assert request("GET", f"{server.url}/v1/videos/{job_id}/content")[1][4:8] == b"ftyp"

        stopped = submit(server.url, LONG)
        wait_for_segments(server.url, stopped, 2)
        answers = []
        waiting = threading.Thread(target=lambda: answers.append(
            request("POST", f"{server.url}/v1/videos/sync", json={**ACTION, **SMALL})))
        waiting.start()
        while request("GET", f"{server.url}/v1/videos?limit=1")[1]["data"][0]["id"] == stopped:
            time.sleep(0.02)  # until the sync request's job is stored, queued behind `stopped`
        assert server.stop() == 0  # SIGTERM: the render stops at its next segment, its job goes back to the queue
        waiting.join(30)
    finally:
        server.stop()
    status, error, headers = answers[0]
    assert (status, error["error"]["code"]) == (503, "stopping") and int(headers["Retry-After"]) > 0
    log = server.log.read_text()
    assert f"job {resumed}: rendering (resumed from its checkpoint)" in log
    assert "1 job in progress when the server stopped: queued again" in log
    assert f"job {stopped}: stopped with the server" in log and "Traceback" not in log
    kept = JobStore(store)
    try:
        assert kept.get(stopped).status == "queued" and kept.counts()["completed"] == 4
        assert kept.get(headers["X-Video-Id"]).status == "queued"
        assert kept.get(stopped).attempts == 0  # a stop on purpose is not an attempt that failed
        assert (partial_folder(kept.folder_of(stopped) / VIDEO) / CHECKPOINT_NAME).is_file()
    finally:
        kept.close()
