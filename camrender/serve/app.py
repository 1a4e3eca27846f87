"""The HTTP side of `camrender serve` (aiohttp): the OpenAI-style video job API that SGLang-diffusion and vLLM-Omni
speak, on the job store (`camrender.serve.store`) and the dispatcher of renders (`camrender.serve.worker`).

    POST   /v1/videos                      submit (JSON or multipart) -> 202, the job object
    POST   /v1/videos/sync                 submit, wait, answer the mp4
    GET    /v1/videos?after=&limit=&order= a page of jobs, newest first
    GET    /v1/videos/{id}                 the job object: status, progress, segments, ETA
    GET    /v1/videos/{id}/content         the mp4 (HTTP range requests: a player seeks)
    GET    /v1/videos/{id}/render.json     the render file as written (its paths are the server's: docs/serve.md)
    DELETE /v1/videos/{id}                 cancel a queued or running job; delete a finished one
    GET    /health                         {"status": "ok", "model": ...} (no token needed)
    GET    /metrics                        Prometheus text

With a token (any host but loopback needs one) every request but /health carries `Authorization: Bearer TOKEN`
(401 with `WWW-Authenticate: Bearer` otherwise). Without one, a request must name this machine in its Host header
and come from no other site (`Origin`): 403 otherwise (a web page cannot drive the user's local server). Every
refusal is a JSON error with a 4xx status naming the field (`camrender.serve.errors`); a full queue (429) and a
server stopping (503, to a /v1/videos/sync request) say when to try again (`Retry-After`).

`serve` runs the server until SIGINT or SIGTERM, which the dispatcher hears first (no job starts, the renders stop
at their next step or segment, /v1/videos/sync answers 503); then the web server closes and the renders get a
grace period, after which a job still rendering goes back to the queue all the same.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hmac
import shutil
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional
from urllib.parse import urlsplit

from aiohttp import web

from camrender.play.server import host_name, is_loopback
from camrender.play.serving import base_url, run_until_signal
from camrender.serve.body import read_body
from camrender.serve.errors import ServeError, error_body
from camrender.serve.jobs import VIDEO, JobRules, accept, check_id, new_id
from camrender.serve.responses import job_list, job_object, metrics_text
from camrender.serve.store import FINISHED, Job, JobStore, QueueFull
from camrender.serve.values import integer
from camrender.serve.worker import Dispatcher

SYNC_POLL_S = 0.05  # how often /v1/videos/sync looks at its job
DEFAULT_PAGE, MAX_PAGE = 20, 100
RENDER_JSON = "video.render.json"
RETRY_AFTER_S = 10  # what a 429 (queue full) and a 503 (stopping) tell a client to wait before it tries again


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """token: None, or the bearer token every request carries; keep_s: seconds a finished job stays; max_queue:
    queued jobs at most (429 beyond); max_body_bytes: the largest request body."""

    token: Optional[str]
    keep_s: float
    max_queue: int
    max_body_bytes: int


class VideoServer:
    """The aiohttp application (`app`) of the job API over `store` and `dispatcher`."""

    def __init__(self, store: JobStore, dispatcher: Dispatcher, rules: JobRules, config: ServerConfig,
                 log: Callable[[str], None] = lambda line: None):
        self.store, self.dispatcher, self.rules, self.config, self.log = store, dispatcher, rules, config, log
        self.model = rules.load.model
        self._threads = ThreadPoolExecutor(4, thread_name_prefix="camrender-serve")  # uploads, planning, fsync
        self.app = web.Application(client_max_size=config.max_body_bytes, middlewares=[self._errors, self._guard])
        self.app.router.add_post("/v1/videos", self._create)
        self.app.router.add_post("/v1/videos/sync", self._sync)
        self.app.router.add_get("/v1/videos", self._list)
        self.app.router.add_get("/v1/videos/{video_id}", self._retrieve)
        self.app.router.add_delete("/v1/videos/{video_id}", self._delete)
        self.app.router.add_get("/v1/videos/{video_id}/content", self._content)
        self.app.router.add_get("/v1/videos/{video_id}/render.json", self._render_json)
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/metrics", self._metrics)

    # --- middlewares --------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request, handler):
        try:
            return await handler(request)
        except ServeError as error:
            return web.json_response(error.body(), status=error.status, headers=error.headers)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            message = error.reason if error.status != 413 else \
                f"the body is larger than the server's limit of {self.config.max_body_bytes} bytes (--max-body-mb)"
            return web.json_response(error_body(error.status, message), status=error.status,
                                     headers={name: value for name, value in error.headers.items()
                                              if name in ("Allow", "WWW-Authenticate")})
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug answers 500 and the server goes on
            self.log(f"{request.method} {request.path}: {traceback.format_exc().strip()}")
            return web.json_response(error_body(500, "internal server error"), status=500)

    @web.middleware
    async def _guard(self, request, handler):
        if request.path == "/health":
            return await handler(request)
        if self.config.token is not None:
            scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode("utf-8", "surrogateescape"), self.config.token.encode()):
                raise ServeError(401, "a valid bearer token is needed (Authorization: Bearer TOKEN)",
                                 param="Authorization", code="invalid_token", headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)
        if not is_loopback(host_name(request.headers.get("Host", ""))):
            raise ServeError(403, "this server answers only to localhost and loopback addresses", param="Host",
                             code="forbidden_host")
        origin = request.headers.get("Origin")
        if origin is not None and not is_loopback(urlsplit(origin).hostname or ""):
            raise ServeError(403, "requests from web pages of other sites are refused", param="Origin",
                             code="forbidden_origin")
        return await handler(request)

    # --- jobs ------------------------------------------------------------------------------------------
    def _job(self, request):
        job = self.store.get(check_id(request.match_info["video_id"]))
        if job is None:
            raise ServeError(404, "no such video", param="video_id", code="not_found")
        return job

    def _object(self, job) -> dict:
        return job_object(job, self.model, self.config.keep_s)

    def _queue_full(self) -> ServeError:
        return ServeError(429, f"the queue is full ({self.config.max_queue} jobs wait); try again later",
                          code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})

    async def _submit(self, request):
        """Read, check and store a job (queued, on disk) and wake the dispatcher: the stored `Job`."""
        created = time.time()
        if self.store.counts()["queued"] >= self.config.max_queue:
            raise self._queue_full()
        body = await read_body(request)
        try:
            job = await asyncio.get_running_loop().run_in_executor(self._threads, self._store_job, body, created)
        except QueueFull:
            raise self._queue_full() from None
        self.dispatcher.wake()
        return job

    def _store_job(self, body: dict, created: float) -> Job:
        """(In a thread.) Check `body`, write its uploads into a new job's folder and store the job; the folder
        goes when any of it fails. All in the thread, which a request cancelled meanwhile does not stop: a job is
        stored with its inputs, or neither is kept."""
        job_id = new_id()
        folder = self.store.folder_of(job_id)
        try:
            accepted = accept(body, folder, self.rules)
            return self.store.add(job_id, accepted.spec, accepted.summary, created, self.config.max_queue)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    async def _create(self, request):
        job = await self._submit(request)
        return web.json_response(self._object(job), status=202)

    def _refuse_while_stopping(self, job: Optional[Job] = None) -> None:
        if self.dispatcher.stopping:
            kept = "" if job is None else "; the job stays queued and renders when the server starts again"
            raise ServeError(503, f"the server is stopping{kept}", param=None if job is None else "video_id",
                             code="stopping", headers={"Retry-After": str(RETRY_AFTER_S),
                                                       **({} if job is None else {"X-Video-Id": job.id})})

    async def _sync(self, request):
        self._refuse_while_stopping()
        job = await self._submit(request)
        while job is not None and job.status not in FINISHED:
            self._refuse_while_stopping(job)
            await asyncio.sleep(SYNC_POLL_S)
            job = self.store.get(job.id)
        if job is None or job.status == "cancelled":
            raise ServeError(409, "the job was cancelled", param="video_id", code="cancelled")
        if job.status == "failed":
            raise ServeError(422, job.error["message"], param=job.error.get("param"), code=job.error["code"])
        return self._file(job, VIDEO, "video/mp4")

    async def _list(self, request):
        query = request.query
        limit = integer(query.get("limit", str(DEFAULT_PAGE)), "limit")
        if not 1 <= limit <= MAX_PAGE:
            raise ServeError(400, f"must be 1 to {MAX_PAGE}, got {limit}", param="limit")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ServeError(400, f"must be asc or desc, got {order[:20]!r}", param="order")
        after = query.get("after")
        try:
            jobs, more = self.store.page(None if after is None else check_id(after), limit, order == "desc")
        except KeyError:
            raise ServeError(400, "no such video", param="after") from None
        return web.json_response(job_list(jobs, more, self.model, self.config.keep_s))

    async def _retrieve(self, request):
        return web.json_response(self._object(self._job(request)))

    async def _delete(self, request):
        job = self._job(request)
        if job.status not in FINISHED:
            before = self.store.cancel(job.id)
            self.dispatcher.cancel(job.id)
            if before == "queued" and job.id not in self.dispatcher.busy():
                shutil.rmtree(self.store.folder_of(job.id), ignore_errors=True)
            return web.json_response(self._object(self.store.get(job.id) or job))
        busy = job.id in self.dispatcher.busy()  # a cancelled render still stopping: its thread removes the folder
        self.store.delete(job.id, files=not busy)
        return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})

    def _file(self, job, name: str, kind: str):
        if job.status != "completed":
            raise ServeError(409, f"the video is not ready (status {job.status})", param="video_id", code="not_ready")
        path = self.store.folder_of(job.id) / name
        if not path.is_file():
            raise ServeError(404, f"the job has no {name}", param="video_id", code="not_found")
        return web.FileResponse(path, headers={"Content-Type": kind, "X-Video-Id": job.id, "Content-Disposition":
                                               f'attachment; filename="{job.id}{name[len("video"):]}"'})

    async def _content(self, request):
        job = self._job(request)
        if request.query.get("variant", "video") != "video":
            raise ServeError(400, "only the video variant exists", param="variant")
        return self._file(job, VIDEO, "video/mp4")

    async def _render_json(self, request):
        return self._file(self._job(request), RENDER_JSON, "application/json")

    async def _health(self, request):
        return web.json_response({"status": "ok", "model": self.model})

    async def _metrics(self, request):
        text = metrics_text(self.store.counts(), self.store.render_seconds(), len(self.dispatcher.busy()),
                            self.dispatcher.renderer.slots)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def purge_now_and_then(self) -> None:
        """Every min(keep / 2, 1 h), from now: the store's purge (`JobStore.purge`), in a thread (SQLite and
        removing folders would stall every request on the event loop); an error is logged and the next purge comes
        all the same."""
        keep = self.config.keep_s
        loop = asyncio.get_running_loop()
        while True:
            try:
                gone = await loop.run_in_executor(self._threads, self._purge)
            except Exception:  # noqa: BLE001 - a locked database, a full disk: the next purge tries again
                self.log(f"purging the store failed: {traceback.format_exc().strip()}")
            else:
                if gone:
                    self.log(f"purged {len(gone)} job{'' if len(gone) == 1 else 's'} finished over {keep:g} s ago")
            await asyncio.sleep(min(max(keep / 2, 1.0), 3600.0))

    def _purge(self) -> list:
        return self.store.purge(time.time() - self.config.keep_s, busy=self.dispatcher.busy())

    def close(self) -> None:
        self._threads.shutdown(wait=True)


async def serve(server: VideoServer, host: str, port: int, on_ready: Callable[[str], None], grace: float) -> None:
    """Run `server` on host:port until SIGINT or SIGTERM, purging the jobs that finished more than `keep_s` ago
    now and then; `on_ready(base url)` once it listens. On the signal the dispatcher stops first, then the web
    server closes, then the renders get `grace` seconds to stop (`Dispatcher.stop`)."""
    loop = asyncio.get_running_loop()
    purging = []

    def ready(bound: int) -> None:
        purging.append(asyncio.create_task(server.purge_now_and_then()))
        on_ready(base_url(host, bound))

    async def stopping() -> None:
        server.dispatcher.begin_stop()
        for task in purging:
            task.cancel()

    async def stopped() -> None:
        await loop.run_in_executor(None, server.dispatcher.stop, grace)

    await run_until_signal(server.app, host, port, ready, stopping=stopping, stopped=stopped)
