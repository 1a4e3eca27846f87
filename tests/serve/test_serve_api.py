"""`camrender serve` on the tiny model, driven over HTTP on 127.0.0.1 by aiohttp's client and curl: submit, poll,
download (byte-identical to `camrender render` with the same options, and to `--from-render` of the job's
render.json), range requests, 20 concurrent submissions, a cancel mid-render, the README's client, metrics."""
import asyncio
import base64
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import PIL.Image
import pytest

from camrender.api.pipeline import CamrenderPipeline
from camrender.render.prompt_cache import resolve_cache_dir
from camrender.serve.jobs import JobRules
from helpers import run_cli
from serve_clients import ACTION, SMALL, ThreadServer, call, request, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pipe():
    return CamrenderPipeline.from_pretrained("tiny")


@pytest.fixture(scope="module")
def server(pipe, tmp_path_factory):
    running = ThreadServer(tmp_path_factory.mktemp("serve") / "store", pipe,
                           rules=JobRules(pipe.settings, resolve_cache_dir(None), 1 << 20), checkpoint_every=0.0)
    yield running
    running.stop()


def png(color=(90, 120, 200), size=(32, 32)) -> bytes:
    out = io.BytesIO()
    PIL.Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def submit_and_wait(url: str, body: dict) -> dict:
    status, job, _ = request("POST", f"{url}/v1/videos", json=body)
    assert status == 202, job
    assert job["status"] == "queued" and job["object"] == "video" and re.fullmatch(r"video_[0-9a-f]{32}", job["id"])
    return asyncio.run(wait_for(url, job["id"]))


def test_submit_poll_download_is_the_cli_render(server, tmp_path, capsys):
    body = {"prompt": "a quiet street", "size": "32x32", "num_frames": 17, "num_inference_steps": 2, "seed": 11,
            "extra_params": {"sana_wm": {"action": "w-16", "translation_speed": 0.05}}}
    job = submit_and_wait(server.url, body)
    assert job["status"] == "completed", job
    assert (job["progress"], job["size"], job["num_frames"], job["seed"], job["seconds"]) == (100, "32x32", 17, 11, "1")
    assert job["wait_seconds"] >= 0 and job["inference_time_s"] > 0 and job["attempts"] == 1
    status, video, headers = request("GET", f"{server.url}/v1/videos/{job['id']}/content")
    assert status == 200 and headers["Content-Type"] == "video/mp4" and video[4:8] == b"ftyp"

    out = tmp_path / "cli.mp4"
    code, _, err = run_cli(["render", "--traj", "w-16", "--translation-speed", "0.05", "--prompt", "a quiet street",
                            "--width", "32", "--height", "32", "--frames", "17", "--steps", "2", "--seed", "11",
                            "--model", "tiny", "--out", out, "--progress", "none"], capsys)
    assert code == 0, err
    assert out.read_bytes() == video

    status, part, headers = request("GET", f"{server.url}/v1/videos/{job['id']}/content",
                                    headers={"Range": "bytes=100-1099"})
    assert status == 206 and part == video[100:1100]
    assert headers["Content-Range"] == f"bytes 100-1099/{len(video)}"

    status, render_json, _ = request("GET", f"{server.url}/v1/videos/{job['id']}/render.json")
    assert status == 200 and render_json["settings"]["seed"] == 11 and render_json["settings"]["num_frames"] == 17
    (tmp_path / "job.render.json").write_text(json.dumps(render_json))
    again = tmp_path / "again.mp4"
    code, _, err = run_cli(["render", "--from-render", tmp_path / "job.render.json", "--out", again,
                            "--progress", "none"], capsys)
    assert code == 0, err
    assert again.read_bytes() == video


def test_curl_as_the_docs_show_and_multipart_is_json(server, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (apt-get install curl)")
    (tmp_path / "first.png").write_bytes(png())
    out = tmp_path / "curl.mp4"
    done = subprocess.run(
        ["curl", "-sS", "-X", "POST", f"{server.url}/v1/videos/sync", "-H", "Accept: video/mp4",
         "-F", "prompt=a slow forward move", "-F", "input_reference=@first.png;type=image/png",
         "-F", "size=32x32", "-F", "num_frames=9", "-F", "num_inference_steps=1", "-F", "seed=42",
         "--form-string", 'extra_params={"sana_wm":{"action":"w-8","rotation_speed_deg":1.2}}',
         "-o", out.name, "-w", "%{http_code}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout == "200", (done.stdout, done.stderr, out.read_bytes()[:300])
    image = "data:image/png;base64," + base64.b64encode(png()).decode()
    job = submit_and_wait(server.url, {"prompt": "a slow forward move", "input_reference": image, "seed": 42,
                                       **SMALL, "extra_params": {"sana_wm": {"action": "w-8",
                                                                             "rotation_speed_deg": 1.2}}})
    _, video, _ = request("GET", f"{server.url}/v1/videos/{job['id']}/content")
    assert out.read_bytes() == video


def test_twenty_concurrent_submissions_all_complete(server):
    async def run():
        async with aiohttp.ClientSession() as session:
            async def submit(seed):
                async with session.post(f"{server.url}/v1/videos", json={**ACTION, **SMALL, "seed": seed}) as answer:
                    assert answer.status == 202
                    return (await answer.json())["id"]

            ids = await asyncio.gather(*(submit(seed) for seed in range(20)))
            jobs = await asyncio.gather(*(wait_for(server.url, job_id, timeout=300) for job_id in ids))
            videos = []
            for job_id in ids:
                async with session.get(f"{server.url}/v1/videos/{job_id}/content") as answer:
                    assert answer.status == 200
                    videos.append(await answer.read())
            return ids, jobs, videos

    ids, jobs, videos = asyncio.run(run())
    assert len(set(ids)) == 20
    assert [job["status"] for job in jobs] == ["completed"] * 20
    assert all(video[4:8] == b"ftyp" for video in videos) and len(set(videos)) == 20  # 20 seeds, 20 videos
    status, page, _ = request("GET", f"{server.url}/v1/videos?limit=100")
    assert status == 200 and set(ids) <= {job["id"] for job in page["data"]}


def test_cancel_mid_render_then_delete(server):
    body = {**SMALL, "mode": "segments", "segment_frames": 1, "num_frames": 161, "num_inference_steps": 2,
            "extra_params": {"sana_wm": {"action": "w-160"}}}
    status, job, _ = request("POST", f"{server.url}/v1/videos", json=body)
    assert status == 202
    while request("GET", f"{server.url}/v1/videos/{job['id']}")[1]["segments_done"] is None:  # mid-render
        asyncio.run(asyncio.sleep(0.02))
    status, cancelled, _ = request("DELETE", f"{server.url}/v1/videos/{job['id']}")
    assert status == 200 and cancelled["status"] == "cancelled", cancelled
    final = asyncio.run(wait_for(server.url, job["id"]))
    assert final["status"] == "cancelled" and final["segments_done"] < final["segments_total"] == 21
    status, error, _ = request("GET", f"{server.url}/v1/videos/{job['id']}/content")
    assert status == 409 and error["error"]["param"] == "video_id"
    status, deleted, _ = request("DELETE", f"{server.url}/v1/videos/{job['id']}")
    assert (status, deleted) == (200, {"id": job["id"], "object": "video.deleted", "deleted": True})
    asyncio.run(asyncio.sleep(0.5))  # the render thread lets the job's folder go once it has stopped
    assert request("GET", f"{server.url}/v1/videos/{job['id']}")[0] == 404
    assert not server.store.folder_of(job["id"]).exists()
    assert submit_and_wait(server.url, {**ACTION, **SMALL})["status"] == "completed"  # the slot goes on


def test_readme_client_example(server, tmp_path):
    text = (REPO / "README.md").read_text()
    match = re.search(r"<!-- serve-example[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md has no serve-example block"
    code = match.group(1)
    assert "http://127.0.0.1:8000" in code
    (tmp_path / "first.png").write_bytes(png(size=(112, 64)))
    done = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:8000", server.url)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "street.mp4").read_bytes()[4:8] == b"ftyp"


def test_health_list_pages_and_metrics(server):
    assert request("GET", f"{server.url}/health")[:2] == (200, {"status": "ok", "model": "tiny"})
    for _ in range(3):
        assert request("POST", f"{server.url}/v1/videos", json={**ACTION, **SMALL})[0] == 202
    status, first, _ = request("GET", f"{server.url}/v1/videos?limit=2")
    assert status == 200 and len(first["data"]) == 2 and first["has_more"]
    status, second, _ = request("GET", f"{server.url}/v1/videos?limit=2&after={first['last_id']}")
    assert second["data"][0]["id"] != first["data"][1]["id"]
    seqs = [job["created_at"] for job in first["data"] + second["data"]]
    assert seqs == sorted(seqs, reverse=True)
    status, oldest, _ = request("GET", f"{server.url}/v1/videos?limit=1&order=asc")
    assert oldest["data"][0]["created_at"] <= seqs[-1]
    for job in first["data"]:
        asyncio.run(wait_for(server.url, job["id"]))
    status, text, headers = request("GET", f"{server.url}/metrics")
    text = text.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    completed = int(re.search(r'camrender_serve_jobs\{status="completed"\} (\d+)', text).group(1))
    assert completed == server.store.counts()["completed"] >= 2
    assert f'camrender_serve_job_seconds_bucket{{le="+Inf"}} {completed}' in text
    assert re.search(r"^camrender_serve_queue_length \d+$", text, re.M)
