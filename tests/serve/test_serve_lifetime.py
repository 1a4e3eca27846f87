"""The server of `camrender serve` around its requests (`camrender.serve.app`, no pipeline: its jobs stay queued): a
submission cancelled while it is stored keeps its inputs."""
import asyncio
import json
import threading
import time

import pytest

from camrender.render.load_settings import LoadSettings
from camrender.serve.app import ServerConfig, VideoServer
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
