"""The `camrender play` server without a browser: aiohttp's test client drives the WebSocket, the tiny
model renders the flights (real segment loop), the session is saved; token, origin, roles, bad messages."""
import asyncio
import json
import os
import signal
import struct

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from camrender import trajectory
from camrender.cli.play import longest_clip
from camrender.play.server import MAX_MESSAGE, PlayServer, is_loopback, page_url, serve
from camrender.render.pipeline import load_patched_pipeline
from helpers import render_request
from camrender.trajectory.controls import make_scheme


@pytest.fixture(scope="module")
def template():
    return render_request(traj=None, prompt="a street", steps=None, guidance=None, seed=5,
                         num_frames=longest_clip(4.0, 16.0, 3), height=32, width=48, model="tiny", device="cpu",
                         mode="segments", recipe="streaming")


@pytest.fixture(scope="module")
def pipe(template):
    """The tiny pipeline, run on one torch thread here (the flight thread, JPEG and x264 share the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_patched_pipeline(template.settings)
    torch.set_num_threads(threads)


def run(coroutine):
    return asyncio.run(coroutine)


async def open_client(server):
    client = TestClient(TestServer(server.app))
    await client.start_server()
    return client


async def next_json(ws, kind, timeout=60):
    """The next text message of type `kind`, counting the frames that came before it."""
    frames = []
    while True:
        message = await ws.receive(timeout=timeout)
        if message.type == aiohttp.WSMsgType.BINARY:
            frames.append(struct.unpack("<II", message.data[:8]))
            continue
        assert message.type == aiohttp.WSMsgType.TEXT, message
        data = json.loads(message.data)
        if data["type"] == kind:
            return data, frames


def test_longest_clip_is_whole_segments_of_the_streaming_layout():
    assert longest_clip(4.0, 16.0, 3) == 73  # 63 frames wanted -> 3 segments: 25 + 24 + 24
    assert (longest_clip(120.0, 16.0, 3) - 1) % 24 == 0 and longest_clip(120.0, 16.0, 3) >= 1920
    assert longest_clip(1e6, 16.0, 3) == 8 * 1023 + 1  # the RoPE table's 1024 latent frames


def test_loopback_and_urls():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert page_url("0.0.0.0", 8765, "abc") == "http://0.0.0.0:8765/?token=abc"


def test_token_and_origin_are_checked(pipe, template, tmp_path):
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s", token="secret-token")
        client = await open_client(server)
        try:
            assert (await client.get("/")).status == 403
            assert (await client.get("/?token=wrong")).status == 403
            page = await client.get("/?token=secret-token")
            assert page.status == 200 and "camrender play" in await page.text()
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect("/ws")
            assert refused.value.status == 403
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect("/ws?token=secret-token", headers={"Origin": "http://evil.example"})
            assert refused.value.status == 403
            assert server.flights == 0  # nothing started
        finally:
            await client.close()

    run(body())


def test_steer_watch_bad_messages_and_the_saved_session(pipe, template, tmp_path):
    """The first page steers, the second watches; junk is dropped and counted; Stop saves the flight."""
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s")
        client = await open_client(server)
        try:
            steer = await client.ws_connect("/ws")
            hello, _ = await next_json(steer, "hello")
            assert hello["role"] == "steer" and (hello["width"], hello["height"], hello["fps"]) == (48, 32, 16.0)
            watch = await client.ws_connect("/ws")
            assert (await next_json(watch, "hello"))[0]["role"] == "watch"
            await watch.send_str(json.dumps({"type": "stop"}))  # a watcher cannot stop the flight
            watched = asyncio.create_task(next_json(watch, "ended"))  # read on (it answers the server's pings)
            for junk in ("not json", json.dumps({"type": "key", "key": "q", "down": True}),
                         json.dumps({"type": "key", "key": "w", "down": "yes"}), json.dumps([1, 2]),
                         json.dumps({"type": "key", "key": "w", "down": True, "pad": "x" * MAX_MESSAGE})):
                await steer.send_str(junk)
            await steer.send_bytes(b"\x00" * 16)
            await steer.send_str(json.dumps({"type": "key", "key": "w", "down": True, "id": 1}))
            first, frames = await next_json(steer, "segment")
            assert first["index"] == 0 and first["count"] == 25
            second, more = await next_json(steer, "segment")
            frames += more
            await steer.send_str(json.dumps({"type": "stop"}))
            ended, more = await next_json(steer, "ended")
            frames += more
            assert ended["error"] is None and ended["frames"] >= 49 and ended["frames"] == len(frames)
            assert [index for _, index in frames] == list(range(ended["frames"]))
            assert server.dropped == {"malformed": 4, "oversized": 1, "binary": 1, "watcher": 1}
            seen, seen_frames = await watched
            assert seen["frames"] == ended["frames"] == len(seen_frames)  # the watcher saw it all
            assert server.latencies and all(lat >= 0 for lat in server.latencies)
            return ended
        finally:
            await client.close()

    ended = run(body())
    saved = ended["saved"]
    assert set(saved) == {"video", "trajectory", "render"}
    path = trajectory.load(saved["trajectory"])
    assert path.num_frames == ended["frames"] and path.seed == 5 and path.prompt == "a street"
    assert path.c2w[-1, 2, 3] > 0.5 and np.allclose(path.c2w[:, 0, 3], 0)  # W: straight ahead
    import imageio.v3 as iio

    assert iio.imread(saved["video"]).shape == (ended["frames"], 32, 48, 3)
    assert not list(tmp_path.glob(".*"))  # no partial files left


def test_leaving_page_saves_and_a_new_page_flies_again(pipe, template, tmp_path):
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s")
        client = await open_client(server)
        try:
            steer = await client.ws_connect("/ws")
            await next_json(steer, "segment")
            await steer.close()  # page closed: the flight stops and is saved
            for _ in range(600):
                if server.saved:
                    break
                await asyncio.sleep(0.1)
            again = await client.ws_connect("/ws")
            assert (await next_json(again, "hello"))[0]["role"] == "steer"
            started, _ = await next_json(again, "started")
            assert started["flight"] == 2 and started["seed"] != 5
            await again.send_str(json.dumps({"type": "restart"}))
            assert (await next_json(again, "ended"))[0]["flight"] == 2
            assert (await next_json(again, "started"))[0]["flight"] == 3
        finally:
            await client.close()  # shutdown stops and saves flight 3
        return server

    server = run(body())
    assert server.saved[0]["video"].endswith("s.mp4")
    assert sorted(p.name for p in tmp_path.glob("*.render.json"))[0] == "s.render.json"


def test_sigterm_while_flying_saves_the_flight_and_tells_the_page(pipe, template, tmp_path, monkeypatch):
    """`serve` (what the CLI runs) with a page steering: SIGTERM stops the flight at a segment boundary,
    saves it, sends "ended" and closes the sockets; serve returns (the CLI then exits 0). All of it before
    aiohttp's own shutdown begins: that closes the sockets of a flight slower than its grace to stop."""
    cleanup, saved_at_cleanup = aiohttp.web.AppRunner.cleanup, []

    async def recorded_cleanup(runner):
        saved_at_cleanup.append(len(server.saved))
        await cleanup(runner)

    monkeypatch.setattr(aiohttp.web.AppRunner, "cleanup", recorded_cleanup)
    server = PlayServer(pipe, template, make_scheme(), tmp_path / "s")

    async def body():
        urls, ready = [], asyncio.Event()
        serving = asyncio.create_task(serve(server, "127.0.0.1", 0, lambda url: (urls.append(url), ready.set())))
        await ready.wait()
        seen = []
        async with aiohttp.ClientSession() as session, session.ws_connect(urls[0] + "ws") as ws:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    seen.append(json.loads(message.data))
                    if seen[-1]["type"] == "segment" and seen[-1]["index"] == 0:
                        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 60)
        return seen

    seen = run(body())
    ended = [m for m in seen if m["type"] == "ended"]
    assert ended and set(ended[0]["saved"]) == {"video", "trajectory", "render"} and ended[0]["frames"] >= 25
    assert saved_at_cleanup == [1]
    assert trajectory.load(tmp_path / "s.traj.json").num_frames == ended[0]["frames"]
    assert not list(tmp_path.glob(".*"))
