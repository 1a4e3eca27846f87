"""A corpus of bad requests to `camrender serve` over HTTP (bad JSON, wrong types, huge values, a missing image for a
non-tiny model, a token missing or wrong, path traversal in ids, a full queue): a 4xx JSON error naming the field
for each, nothing stored, and the server still serving. The server here plans jobs for the release model and
renders none (no pipeline is loaded: its jobs stay queued)."""
import asyncio
import base64
import io
import json

import aiohttp
import numpy as np
import PIL.Image
import pytest
from yarl import URL

from camrender import trajectory
from camrender.render.load_settings import LoadSettings
from camrender.serve.jobs import JobRules
from camrender.trajectory import Trajectory
from camrender.vocabulary import DEFAULT_MODEL
from serve_clients import ThreadServer, request

TOKEN = "a-test-token-of-some-length"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def image_url(size=(64, 36), noise=False) -> str:
    out = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) if noise else \
        np.full((size[1], size[0], 3), (10, 200, 30), dtype=np.uint8)
    PIL.Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


GOOD = {"prompt": "a street", "input_reference": image_url(), "extra_params": {"sana_wm": {"action": "w-16"}}}


@pytest.fixture(scope="module")
def rules():
    return JobRules(LoadSettings(model=DEFAULT_MODEL), None, 64 << 10)


@pytest.fixture(scope="module")
def server(rules, tmp_path_factory):
    running = ThreadServer(tmp_path_factory.mktemp("refusals") / "store", rules=rules, token=TOKEN, max_queue=2,
                           max_body_bytes=1 << 20, start_worker=False)
    yield running
    running.stop()


def with_good(**changes):
    body = json.loads(json.dumps(GOOD))
    body.update(changes)
    return body


def other_image(**image):
    body = with_good(**image)
    del body["input_reference"]
    return body


def sana(**fields):
    return with_good(extra_params={"sana_wm": fields})


def deep(depth):
    return "[" * depth + "]" * depth


BAD_BODIES = [  # (JSON body or raw text, the field the error names)
    ("{bad", None),
    ("[1, 2]", None),
    ('{"prompt": ' + deep(100000) + "}", None),
    (with_good(prompt=3), "prompt"),
    (with_good(num_frames="seventeen"), "num_frames"),
    (with_good(seed=1.5), "seed"),
    (with_good(size=1280), "size"),
    (with_good(size="1280 by 704"), "size"),
    (with_good(smooth="maybe"), "smooth"),
    (with_good(extra_params="not json"), "extra_params"),
    (with_good(extra_params={"sana_wm": [1]}), "extra_params.sana_wm"),
    (with_good(extra_params={"wan": {}}), "extra_params.wan"),
    (sana(action="w-16", num_frames=9), "extra_params.sana_wm.num_frames"),
    (sana(camera={"poses": [[1, 2], [3]]}), "extra_params.sana_wm.camera.poses"),
    (sana(camera={"poses": [[[1, 0, 0, 0]] * 4]}), "extra_params.sana_wm.camera"),
    (sana(action="w-16", intrinsics={"fx": 1, "fy": 1}), "extra_params.sana_wm.intrinsics.cx"),
    (sana(action="w-16", intrinsics={"fx": 0, "fy": 1, "cx": 2, "cy": 2}), "extra_params.sana_wm.intrinsics"),
    (sana(action="q-16"), "extra_params.sana_wm.action"),
    (sana(action="w-16", camera={"poses": []}), "extra_params.sana_wm.camera"),
    (with_good(extra_params={}), "trajectory"),
    (with_good(extra_params={}, trajectory=5), "trajectory"),
    (with_good(extra_params={}, trajectory={"version": 1, "frames": "none"}), "trajectory"),
    (with_good(num_frames=10**9), "num_frames"),
    (with_good(num_frames=10), "num_frames"),
    (with_good(seconds=1e308), "seconds"),
    (with_good(seconds=-4), "seconds"),
    (with_good(seed=2**70), "seed"),
    (with_good(size="100000x100000"), "size"),
    (with_good(width=10**400), "width"),
    (with_good(num_inference_steps=10**6), "num_inference_steps"),
    (with_good(fps=1e9), "fps"),
    ('{"prompt": "a", "guidance_scale": 1e400}', "guidance_scale"),
    (with_good(mode="sideways"), "mode"),
    (with_good(action_scheme="qwerty"), "action_scheme"),
    (with_good(input_reference=None), "input_reference"),
    (with_good(input_reference="https://example.com/first.png"), "input_reference"),
    (with_good(input_reference="file:///etc/passwd"), "input_reference"),
    (with_good(input_reference="bm90IGFuIGltYWdl"), "input_reference"),  # base64 of "not an image"
    (with_good(input_reference="%%%"), "input_reference"),
    (with_good(input_reference=image_url((200, 200), noise=True)), "input_reference"),  # over the 64 KiB limit
    (other_image(image_reference={"file_id": "file-1"}), "image_reference.file_id"),
    (other_image(image_reference={"image_url": "http://example.com/x.png"}), "image_reference.image_url"),
    (other_image(image_reference="not json"), "image_reference"),
    (with_good(image=image_url()), "input_reference"),  # two images
    (with_good(model="sora-2"), "model"),
    (with_good(n=2), "n"),
    (with_good(seconds=4, num_frames=17), "num_frames"),
    (with_good(steps=4), "steps"),
    (with_good(video_reference={"video_url": "x"}), "video_reference"),
    (with_good(output_path="/etc/cron.d/x"), "output_path"),
    (with_good(out="/tmp/x.mp4"), "out"),
    (with_good(prompt_cache="/"), "prompt_cache"),
    (with_good(device="cuda:7"), "device"),
    (with_good(intrinsics="/etc/passwd"), "intrinsics"),
    (with_good(qualityy="high"), "qualityy"),
    (with_good(prompt="x" * 2_000_000), None),  # over the server's 1 MiB body limit
]


def jobs_on_disk(server) -> int:
    return sum(1 for _ in (server.store.folder / "jobs").iterdir())


@pytest.mark.parametrize("body, param", BAD_BODIES, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD_BODIES)])
def test_a_bad_body_is_a_4xx_naming_the_field(server, body, param):
    before = (server.store.counts(), jobs_on_disk(server))
    data = body if isinstance(body, str) else json.dumps(body)
    status, error, headers = request("POST", f"{server.url}/v1/videos", data=data,
                                     headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= status < 500, (status, error)
    assert headers["Content-Type"].startswith("application/json")
    assert error["error"]["param"] == param, error
    assert error["error"]["message"] and "Traceback" not in error["error"]["message"]
    assert "/jobs/" not in error["error"]["message"]  # the server's paths stay on the server
    if status == 413:
        assert "limit of" in error["error"]["message"], error
    assert (server.store.counts(), jobs_on_disk(server)) == before
    assert request("GET", f"{server.url}/health")[0] == 200


def test_the_missing_image_of_a_non_tiny_model(server):
    body = dict(GOOD)
    del body["input_reference"]
    status, error, _ = request("POST", f"{server.url}/v1/videos", json=body, headers=AUTH)
    assert (status, error["error"]["param"]) == (400, "input_reference")
    assert "first-frame image" in error["error"]["message"]


def test_a_path_naming_a_file_on_the_server_is_refused(server, tmp_path):
    (tmp_path / "server.png").write_bytes(base64.b64decode(image_url().split(",")[1]))
    c2w = np.tile(np.eye(4), (9, 1, 1))
    c2w[:, 2, 3] = np.linspace(0, 1, 9)
    path = tmp_path / "path.json"
    trajectory.save(Trajectory(c2w, np.tile([50.0, 50.0, 32.0, 18.0], (9, 1)), 64, 36, 16.0), path)
    document = {**json.loads(path.read_text()), "image": str(tmp_path / "server.png")}
    for named in (document, {**document, "image": "/no/such/file.png"}):  # the same answer: no file oracle
        for trajectory_field in (named, json.dumps(named)):
            status, error, _ = request("POST", f"{server.url}/v1/videos", json={"trajectory": trajectory_field},
                                       headers=AUTH)
            assert (status, error["error"]["param"]) == (400, "trajectory"), error
            assert "names a file on the server" in error["error"]["message"]
        form = aiohttp.FormData()
        form.add_field("trajectory", json.dumps(named).encode(), filename="path.json")
        status, error, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
        assert (status, error["error"]["param"]) == (400, "trajectory"), error


def test_multipart_and_other_bodies(server):
    form = aiohttp.FormData()
    form.add_field("prompt", "a street")
    form.add_field("input_reference", b"not an image", filename="first.png", content_type="image/png")
    form.add_field("trajectory", "w-16")
    status, error, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
    assert (status, error["error"]["param"]) == (400, "input_reference")
    form = aiohttp.FormData()
    form.add_field("prompt", "a")
    form.add_field("trajectory", b"{}", filename="../../etc/passwd.exe")
    status, error, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
    assert (status, error["error"]["param"]) == (400, "trajectory")
    status, error, _ = request("POST", f"{server.url}/v1/videos", data=b"--x\r\nbroken",
                               headers={**AUTH, "Content-Type": "multipart/form-data; boundary=x"})
    assert 400 <= status < 500, error
    status, error, _ = request("POST", f"{server.url}/v1/videos", data="prompt", headers={**AUTH,
                                                                                          "Content-Type": "text/plain"})
    assert status == 415
    for first, then in (("text", "file"), ("file", "text")):  # a path as a text and as a file: refused either way
        form = aiohttp.FormData()
        for kind in (first, then):
            form.add_field("trajectory", "w-16", **({} if kind == "text" else {"filename": "path.actions"}))
        status, error, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
        assert (status, error["error"]["param"]) == (400, "trajectory") and "given twice" in str(error), error


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}])
def test_a_missing_or_wrong_token_is_401(server, headers):
    for method, path in (("POST", "/v1/videos"), ("GET", "/v1/videos"), ("GET", "/metrics"),
                         ("GET", "/v1/videos/video_" + "0" * 32)):
        status, error, answer = request(method, f"{server.url}{path}", json=GOOD, headers=headers)
        assert (status, error["error"]["param"]) == (401, "Authorization"), (method, path)
        assert answer["WWW-Authenticate"] == "Bearer"


def test_the_auth_scheme_is_case_insensitive(server):
    for scheme in ("bearer", "BEARER"):
        assert request("GET", f"{server.url}/v1/videos", headers={"Authorization": f"{scheme} {TOKEN}"})[0] == 200


@pytest.mark.parametrize("path, param", [
    ("/v1/videos/..%2F..%2Fetc%2Fpasswd", "video_id"), ("/v1/videos/video_..%2F..%2Fjobs.sqlite3", "video_id"),
    ("/v1/videos/%2e%2e/content", "video_id"), ("/v1/videos/video_" + "0" * 31 + "%2F/render.json", "video_id"),
    ("/v1/videos?after=..%2F..%2Fx", "video_id"), ("/v1/videos?limit=0", "limit"), ("/v1/videos?limit=abc", "limit"),
    ("/v1/videos?order=sideways", "order"), ("/v1/videos/video_" + "a" * 32, "video_id"),
])
def test_ids_and_queries_are_checked(server, path, param):
    for method in ("GET", "DELETE") if path.count("/") == 3 else ("GET",):
        status, error, _ = asyncio.run(_raw(method, f"{server.url}{path}"))
        assert 400 <= status < 500 and error["error"]["param"] == param, (method, path, status, error)


async def _raw(method, url):
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.request(method, URL(url, encoded=True)) as response:
            return response.status, await response.json(), response.headers


def test_the_queue_limit_then_cancel(server):
    ids = []
    for _ in range(2):
        status, job, _ = request("POST", f"{server.url}/v1/videos", json=GOOD, headers=AUTH)
        assert status == 202 and job["status"] == "queued" and job["size"] == "1280x704", job
        ids.append(job["id"])
    status, error, headers = request("POST", f"{server.url}/v1/videos", json=GOOD, headers=AUTH)
    assert status == 429 and error["error"]["code"] == "queue_full" and int(headers["Retry-After"]) > 0
    assert request("GET", f"{server.url}/v1/videos/{ids[0]}", headers=AUTH)[1]["status"] == "queued"
    for job_id in ids:
        status, job, _ = request("DELETE", f"{server.url}/v1/videos/{job_id}", headers=AUTH)
        assert (status, job["status"]) == (200, "cancelled")
        assert not server.store.folder_of(job_id).exists()
    assert request("POST", f"{server.url}/v1/videos", json=GOOD, headers=AUTH)[0] == 202  # room again
    assert request("PUT", f"{server.url}/v1/videos", headers=AUTH)[0] == 405
    assert request("GET", f"{server.url}/v2/anything", headers=AUTH)[0] == 404


def test_without_a_token_only_loopback_and_no_other_site(rules, tmp_path):
    running = ThreadServer(tmp_path / "store", rules=rules, start_worker=False)
    try:
        assert request("GET", f"{running.url}/v1/videos")[0] == 200
        status, error, _ = request("GET", f"{running.url}/v1/videos", headers={"Host": "evil.example"})
        assert (status, error["error"]["param"]) == (403, "Host")
        status, error, _ = request("POST", f"{running.url}/v1/videos", json=GOOD,
                                   headers={"Origin": "https://evil.example"})
        assert (status, error["error"]["param"]) == (403, "Origin")
        assert running.store.counts()["queued"] == 0
    finally:
        running.stop()


@pytest.mark.parametrize("fmt, names", [("colmap", ["images.txt", "cameras.txt"]),
                                        ("npy", ["path_pose.npy", "path_intrinsics.npy"])])
def test_a_path_file_and_the_files_read_beside_it(server, tmp_path, fmt, names):
    from camrender.trajectory.formats import export_file

    c2w = np.tile(np.eye(4), (25, 1, 1))
    c2w[:, 2, 3] = np.linspace(0, 1, 25)
    export_file(Trajectory(c2w, np.tile([50.0, 50.0, 32.0, 18.0], (25, 1)), 64, 36, 16.0), tmp_path / names[0], fmt)
    form = aiohttp.FormData()
    form.add_field("input_reference", base64.b64decode(image_url().split(",")[1]), filename="first.png")
    for name in names:
        form.add_field("trajectory", (tmp_path / name).read_bytes(), filename=name)
    status, job, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
    assert status == 202 and job["num_frames"] == 25, job
    assert request("DELETE", f"{server.url}/v1/videos/{job['id']}", headers=AUTH)[1]["status"] == "cancelled"
    form = aiohttp.FormData()  # without the second file: as its reader reads a file alone
    form.add_field("input_reference", base64.b64decode(image_url().split(",")[1]), filename="first.png")
    form.add_field("trajectory", (tmp_path / names[0]).read_bytes(), filename=names[0])
    status, answer, _ = request("POST", f"{server.url}/v1/videos", data=form, headers=AUTH)
    if fmt == "colmap":  # COLMAP's intrinsics are in cameras.txt
        assert (status, answer["error"]["param"]) == (400, "trajectory") and "cameras.txt" in str(answer), answer
    else:  # a pose file without intrinsics: the default field of view, said in a note
        assert status == 202 and "field of view" in " ".join(answer["notes"]), answer
        assert "/jobs/" not in " ".join(answer["notes"])
        assert request("DELETE", f"{server.url}/v1/videos/{answer['id']}", headers=AUTH)[0] == 200
