"""The servers the serve tests drive and the client calls they make (importable as `serve_clients`).

`ThreadServer`: a `camrender serve` server in this process (its event loop on a thread) on 127.0.0.1 and a free
port, over a store in a temporary folder; `ProcessServer`: `camrender serve` as a subprocess (SIGKILL-able).
Both are stopped by the test that starts them. `call` / `wait_for`: aiohttp's client over real HTTP.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

from camrender.play.serving import base_url, listen
from camrender.serve.app import ServerConfig, VideoServer
from camrender.serve.jobs import JobRules
from camrender.serve.store import JobStore
from camrender.serve.worker import Dispatcher, InProcessRenderer

SMALL = {"size": "32x32", "num_inference_steps": 1, "num_frames": 9}  # a job of a second or less on a CPU
ACTION = {"extra_params": {"sana_wm": {"action": "w-8"}}}


class ThreadServer:
    """A server of `pipe` (None: no pipeline; give `rules`) over a store in `folder`; `start_worker` False keeps
    its jobs queued. `url` once started; `stop()` stops it."""

    def __init__(self, folder, pipe=None, *, rules=None, token=None, max_queue=100, max_body_bytes=8 << 20,
                 start_worker=True, checkpoint_every=180.0):
        self.store = JobStore(folder)
        self.rules = rules or JobRules(pipe.settings, None, 1 << 20)
        self.dispatcher = Dispatcher(self.store, InProcessRenderer(pipe), self.rules,
                                     checkpoint_every=checkpoint_every, log=lambda line: None)
        self.server = VideoServer(self.store, self.dispatcher, self.rules,
                                  ServerConfig(token, 3600.0, max_queue, max_body_bytes))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.thread.start()
        self.runner, port = asyncio.run_coroutine_threadsafe(
            listen(self.server.app, "127.0.0.1", 0), self.loop).result(30)
        self.url = base_url("127.0.0.1", port)
        if start_worker:
            self.dispatcher.start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.dispatcher.stop(30.0)
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.store.close()


class ProcessServer:
    """`camrender serve --model tiny --port 0 --store STORE ARGS...` as a subprocess on one CPU thread (as the tests'
    own renders; a render repeats bit for bit on the same thread count); `url` once it listens."""

    def __init__(self, store, *args, timeout=120.0):
        self.log = Path(store).with_suffix(".log")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "camrender", "serve", "--model", "tiny", "--port", "0", "--store", str(store),
             *map(str, args)], stdout=subprocess.PIPE, stderr=open(self.log, "a"), text=True,  # noqa: SIM115
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})  # one thread: renders repeat
        line = self.process.stdout.readline().strip()
        if not line.startswith("http://"):
            self.process.kill()
            raise AssertionError(f"the server did not start: {line!r}; {self.log.read_text()}")
        self.url = line

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM killer ends it."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


async def call(method: str, url: str, **kwargs) -> tuple:
    """(status, JSON or bytes, headers) of one request."""
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, **kwargs) as response:
            data = await response.read()
            if response.content_type == "application/json":
                data = json.loads(data)
            return response.status, data, response.headers


def request(method: str, url: str, **kwargs) -> tuple:
    return asyncio.run(call(method, url, **kwargs))


async def wait_for(url: str, job_id: str, statuses=("completed", "failed", "cancelled"), timeout=120.0,
                   headers=None) -> dict:
    """The job object once its status is one of `statuses` (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(headers=headers) as session:
        while True:
            async with session.get(f"{url}/v1/videos/{job_id}") as response:
                job = await response.json()
            if job["status"] in statuses:
                return job
            assert time.monotonic() < deadline, f"job still {job['status']} after {timeout} s: {job}"
            await asyncio.sleep(0.05)
