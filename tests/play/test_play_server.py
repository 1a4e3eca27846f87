"""The `camrender play` server without a browser: aiohttp's clients drive the WebSocket (the test client, or a
session against the server `serve` runs on 127.0.0.1), the tiny model renders the flights (real segment loop),
the session is saved; Host names, token, origin, roles, bad and oversized messages, a reload, Stop mid-segment."""
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
from camrender.play.server import MAX_MESSAGE, PlayServer, host_name, is_loopback, page_url, serve
from camrender.play.session import Flight
from camrender.play.steering import KeyTimeline
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
    assert [host_name(h) for h in ("localhost:8765", "[::1]:8765", "127.0.0.1", "::1", "evil.example:80")] == \
        ["localhost", "::1", "127.0.0.1", "::1", "evil.example"]


async def serving(server):
    """`serve` (what the CLI runs) on 127.0.0.1 and a free port: (task, base URL)."""
    urls, ready = [], asyncio.Event()
    task = asyncio.create_task(serve(server, "127.0.0.1", 0, lambda url: (urls.append(url), ready.set())))
    await ready.wait()
    return task, urls[0]


async def stop_serving(task):
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, 60)


def test_a_page_of_another_name_is_refused_without_a_token(pipe, template, tmp_path):
    """DNS rebinding: a page of evil.example whose name resolves to 127.0.0.1 sends `Host: evil.example:PORT`
    (and that Origin): without a token only this machine's loopback names are served; the icon is served."""
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s")
        task, url = await serving(server)
        port = url.rsplit(":", 1)[1].strip("/")
        try:
            async with aiohttp.ClientSession() as session:
                statuses = {}
                for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}",
                             f"127.0.0.1.nip.io:{port}", f"localhost:{port}", f"LOCALHOST:{port}",
                             f"127.0.0.1:{port}", f"127.0.0.2:{port}", f"[::1]:{port}", "localhost:9999"):
                    async with session.get(url, headers={"Host": host}) as response:
                        statuses[host] = response.status
                assert [statuses[h] for h in statuses] == [403] * 4 + [200] * 6, statuses
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(url + "ws", headers={"Host": f"evil.example:{port}",
                                                                  "Origin": f"http://evil.example:{port}"})
                assert refused.value.status == 403 and server.flights == 0
                async with session.get(url + "favicon.svg") as icon:
                    assert icon.status == 200 and icon.content_type == "image/svg+xml"
                    assert (await icon.text()).startswith("<svg")
        finally:
            await stop_serving(task)

    run(body())


def test_token_and_origin_are_checked(pipe, template, tmp_path):
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s", token="secret-token")
        client = await open_client(server)
        try:
            assert (await client.get("/")).status == 403
            for query in ("wrong", "secret-tokenx", "%C3%A9", "%FF", "\u00e9t\u00e9"):  # any text: 403, never a 500
                response = await client.get("/?token=" + query)
                assert response.status == 403, (query, await response.text())
            assert (await client.get("/favicon.svg")).status == 200 and (await client.get("/favicon.ico")).status == 200
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
    """The first page steers, the second watches; junk (a 2 MB message too) is dropped and counted, the flight
    goes on; Stop saves the flight."""
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
                         json.dumps({"type": "key", "key": "w", "down": True, "pad": "x" * MAX_MESSAGE}),
                         json.dumps({"type": "stop", "pad": "x" * (2 << 20)})):  # 2 MB: dropped, the socket stays
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
            assert server.dropped == {"malformed": 4, "oversized": 2, "binary": 1, "watcher": 1}
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
    """A page gone for longer than the reload grace: its flight is saved; the next page flies a new one."""
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s", reload_grace=0.2)
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


def test_a_reloaded_page_keeps_its_flight(pipe, template, tmp_path):
    """The steering page goes and a page comes back within the grace: it steers the same flight (no new seed),
    told so in its hello; before the first frame the pages hear what the flight does."""
    async def body():
        server = PlayServer(pipe, template, make_scheme(), tmp_path / "s", reload_grace=60)
        client = await open_client(server)
        try:
            first = await client.ws_connect("/ws")
            seen = []
            while not seen or seen[-1]["type"] != "segment":
                message = await first.receive(timeout=60)
                if message.type == aiohttp.WSMsgType.TEXT:
                    seen.append(json.loads(message.data))
            kinds = [(m["type"], m.get("text", "")) for m in seen]
            assert kinds[:2] == [("hello", ""), ("started", "")]
            assert kinds[2][1].startswith("preparing") and kinds[3] == ("status", "rendering segment 1 of 3")
            await first.close()  # a reload: the page goes ...
            again = await client.ws_connect("/ws")  # ... and comes back
            hello, _ = await next_json(again, "hello")
            assert hello["role"] == "steer" and hello["flying"] and hello["flight"] == 1
            later, frames = await next_json(again, "segment")
            assert later["flight"] == 1 and later["index"] >= 1
            await again.send_str(json.dumps({"type": "stop"}))
            ended, more = await next_json(again, "ended")
            assert ended["flight"] == 1 and ended["error"] is None and server.flights == 1
            return ended
        finally:
            await client.close()

    ended = run(body())
    assert trajectory.load(ended["saved"]["trajectory"]).seed == 5  # the first flight's seed: no new flight


def test_stop_keeps_the_segment_in_flight(pipe, template, tmp_path):
    """Stop asked while segment 2 renders (its cameras decided, W held): it is finished, shown and saved, and no
    later segment starts."""
    statuses, segments, ended = [], [], []
    timeline = KeyTimeline()
    timeline.press("w")

    def on_status(flight, text):
        statuses.append(text)
        if text.startswith("rendering segment 2"):
            flight.ask_stop()

    flight = Flight(pipe, template, 5, tmp_path / "s", make_scheme(), timeline,
                    on_segment=lambda flight, segment: segments.append(segment), on_end=ended.append,
                    on_status=on_status, pace=False).start()
    assert flight.ended.wait(120) and ended == [flight] and flight.error is None
    assert [segment.index for segment in segments] == [0, 1] and flight.shown == 49
    assert statuses == ["preparing: the prompt, the noise of the whole flight", "rendering segment 1 of 3",
                        "rendering segment 2 of 3"]
    path = trajectory.load(flight.saved["trajectory"])
    assert path.num_frames == 49 and path.c2w[-1, 2, 3] > path.c2w[25, 2, 3] > 0  # W moved it on through segment 2
