"""The server of `camrender serve` around its requests (`camrender.serve.app`, no pipeline: its jobs stay queued): a
signal stops the dispatcher before the web server, so a waiting /v1/videos/sync answers 503 at once; the purge runs
off the event loop and goes on after an error; a submission cancelled while it is stored keeps its inputs."""
import asyncio
import json
import os
import signal
import sqlite3
import threading
import time

import aiohttp
import pytest

from camrender.render.load_settings import LoadSettings
from camrender.serve.app import ServerConfig, VideoServer, serve
from camrender.serve.jobs import JobRules
from camrender.serve.store import JobStore
from camrender.serve.worker import Dispatcher, InProcessRenderer

RULES = JobRules(LoadSettings.create("tiny"), None, 1 << 20)
BODY = {"trajectory": "w-8", "size": "32x32", "num_frames": 9}


@pytest.fixture
def server(tmp_path):
    """A server whose dispatcher is never started (its jobs stay queued); its log lines in `server.lines`."""
    store = JobStore(tmp_path / "store")
    lines = []
    dispatcher = Dispatcher(store, InProcessRenderer(None), RULES, checkpoint_every=0.0, log=lines.append)
    made = VideoServer(store, dispatcher, RULES, ServerConfig(None, 2.0, 10, 1 << 20), log=lines.append)
    made.lines = lines
    yield made
    made.close()
    store.close()


def test_a_signal_stops_the_dispatcher_first_and_a_waiting_sync_request_answers_503(server):
    async def main():
        urls, ready = [], asyncio.Event()
        serving = asyncio.create_task(serve(server, "127.0.0.1", 0, lambda url: (urls.append(url), ready.set()),
                                            grace=1.0))
        await ready.wait()
        async with aiohttp.ClientSession() as session:
            async def sync():
                async with session.post(f"{urls[0]}/v1/videos/sync", json=BODY) as response:
                    return response.status, await response.json(), response.headers

            waiting = asyncio.create_task(sync())
            while server.store.counts()["queued"] == 0:  # stored; the request waits for its render
                await asyncio.sleep(0.02)
            os.kill(os.getpid(), signal.SIGTERM)
            answer = await asyncio.wait_for(waiting, 30)
        await asyncio.wait_for(serving, 30)
        return answer

    status, error, headers = asyncio.run(main())
    assert (status, error["error"]["code"]) == (503, "stopping"), error
    assert int(headers["Retry-After"]) > 0
    job = server.store.get(headers["X-Video-Id"])
    assert (job.status, job.attempts) == ("queued", 0)  # it renders when the server starts again
    assert server.dispatcher.stopping


def test_the_purge_runs_off_the_event_loop_and_goes_on_after_an_error(server, monkeypatch):
    threads = []

    def purge(finished_before, busy=()):
        threads.append(threading.current_thread())
        if len(threads) == 1:
            raise sqlite3.OperationalError("database is locked")
        return []

    monkeypatch.setattr(server.store, "purge", purge)

    async def main():
        purging = asyncio.create_task(server.purge_now_and_then())  # every second (keep: 2 s)
        deadline = time.monotonic() + 20
        while len(threads) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        purging.cancel()

    asyncio.run(main())
    assert len(threads) == 2 and threading.main_thread() not in threads
    assert any("purging the store failed" in line and "database is locked" in line for line in server.lines)


class JsonRequest:
    """What `_submit` reads of an aiohttp request with a JSON body."""

    content_type = "application/json"

    def __init__(self, body: dict):
        self.data = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self.data


def test_a_submission_cancelled_while_it_is_stored_keeps_its_inputs(server, monkeypatch):
    add, adding = server.store.add, threading.Event()

    def slow_add(*args):
        adding.set()
        time.sleep(0.3)  # the commit is under way when the request is cancelled
        return add(*args)

    monkeypatch.setattr(server.store, "add", slow_add)

    async def main():
        submitting = asyncio.create_task(server._submit(JsonRequest(BODY)))
        while not adding.is_set():
            await asyncio.sleep(0.01)
        submitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submitting

    asyncio.run(main())
    server.close()  # the submission's thread finishes
    (job,), _ = server.store.page(None, 10)
    assert (server.store.folder_of(job.id) / job.spec["trajectory"]).is_file()
