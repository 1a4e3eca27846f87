"""Where the server's jobs render: a `Renderer` renders one planned job at a time per slot (a GPU), and the
`Dispatcher` hands it the queued jobs from the store, oldest first, one thread per slot.

    dispatcher = Dispatcher(store, InProcessRenderer(pipe), rules, checkpoint_every=180.0, log=print)
    dispatcher.start(); ...; dispatcher.wake()   # a job was queued
    dispatcher.cancel(job_id); dispatcher.stop()

The store stays with the dispatcher (the server's process): a renderer only renders and reports through the
`JobProgress` it is handed. `InProcessRenderer` renders on this process's loaded pipeline;
`camrender.serve.ray_renderer.RayRenderer` on the workers of a Ray cluster (docs/serve.md, "Workers").

A job whose folder holds what an interrupted attempt left (the server was killed or stopped) continues from its
segment-mode checkpoint when it has one and the render can resume (`rerun_state`), else starts over.
"""
from __future__ import annotations

import dataclasses
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional, Protocol

from camrender.api.requests import prepare_output
from camrender.errors import CamrenderError
from camrender.files import remove_quietly
from camrender.render.request import RenderRequest
from camrender.render.resume import CHECKPOINT_NAME, leftover_part_files, partial_folder
from camrender.serve.jobs import JobRules, plan_job
from camrender.serve.progress import JobProgress, JobStopped
from camrender.serve.store import Job, JobStore

MAX_ATTEMPTS = 3  # renders of one job a kill ended: a job that brings the server down every time fails after these
IDLE_CHECK_S = 1.0  # an idle slot looks at the queue at least this often (besides `wake`)


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """A job ready to render: its `id`, its `request` (the video `request.out` in the job's folder, the inputs
    beside it), whether it continues from its checkpoint (`resume`) and the seconds between checkpoints."""

    id: str
    request: RenderRequest
    resume: bool
    checkpoint_every: float


class Renderer(Protocol):
    """Renders the server's jobs: `slots` at once (one per GPU).

    render(job, progress) blocks its dispatcher thread until `job.request.out` and its side files are written and
    returns the frames written. It calls `progress(done, total, info, stage=, unit=)` as the render goes and
    `progress.check()` before each chunk is written; both raise `JobStopped` when the job should stop (cancelled,
    or the server stopping), which `render` lets through after stopping the render. Bad input raises
    CamrenderError. close() lets the renderer's resources go."""

    slots: int

    def render(self, job: PlannedJob, progress: JobProgress) -> int: ...

    def close(self) -> None: ...


class InProcessRenderer:
    """The pipeline this process loaded (`camrender.api.CamrenderPipeline`): one job at a time."""

    slots = 1

    def __init__(self, pipe):
        self.pipe = pipe

    def render(self, job: PlannedJob, progress: JobProgress) -> int:
        return self.pipe.write(job.request, progress=progress, resume=job.resume,
                               checkpoint_every=job.checkpoint_every, check=progress.check).frames

    def close(self) -> None:
        self.pipe = None


def rerun_state(request: RenderRequest, checkpoint_every: float) -> bool:
    """Whether the render of `request` continues from the checkpoint an interrupted attempt left in its partial
    folder (segment mode, a render that can resume, the same settings, a checkpoint and segment files that
    verify); what an attempt left is removed otherwise, so the render starts over."""
    for leftover in leftover_part_files(request.out):
        remove_quietly(leftover)
    folder = partial_folder(request.out)
    if not folder.exists():
        return False
    if request.mode == "segments" and (folder / CHECKPOINT_NAME).exists():
        try:
            prepared = prepare_output(request, resume=True, checkpoint_every=checkpoint_every)
        except CamrenderError:  # the refiner, another recipe, other settings: not resumable
            pass
        else:
            prepared.release()  # (the render claims the output again when it starts)
            if prepared.resume_info is not None:
                return True
    shutil.rmtree(folder, ignore_errors=True)
    return False


class Dispatcher:
    """Hands the store's queued jobs to `renderer`, one thread per slot, and records how each ends.

    rules: the server's `JobRules` (plan a stored job again); checkpoint_every: seconds between a segment-mode
    job's checkpoints (0: every segment); log: a callable taking one line."""

    def __init__(self, store: JobStore, renderer: Renderer, rules: JobRules, *, checkpoint_every: float,
                 log: Callable[[str], None]):
        self.store, self.renderer, self.rules, self.log = store, renderer, rules, log
        self.checkpoint_every = checkpoint_every
        self._wake = threading.Condition()
        self._running: dict = {}  # job id -> None, or why it should stop ("cancelled")
        self._stopping = False
        self._threads = []

    def start(self) -> None:
        for slot in range(self.renderer.slots):
            thread = threading.Thread(target=self._serve_slot, name=f"camrender-render-{slot}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """A job was queued."""
        with self._wake:
            self._wake.notify_all()

    def busy(self) -> set:
        """The ids of the jobs rendering now."""
        with self._wake:
            return set(self._running)

    def cancel(self, job_id: str) -> None:
        """Stop the job's render at its next step or segment (the store says it is cancelled already)."""
        with self._wake:
            if job_id in self._running:
                self._running[job_id] = "cancelled"

    def stop(self, grace: float) -> None:
        """Renders stop at their next step or segment (their jobs go back to the queue); waits up to `grace`
        seconds for them. A render still running then is continued by the next start, as after a kill."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        deadline = time.monotonic() + grace
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _stop_reason(self, job_id: str) -> Optional[str]:
        return "stopping" if self._stopping else self._running.get(job_id)

    def _serve_slot(self) -> None:
        while True:
            with self._wake:
                job = None
                while not self._stopping and job is None:
                    job = self.store.next_queued(skip=self._running)
                    if job is None:
                        self._wake.wait(IDLE_CHECK_S)
                if self._stopping:
                    return
                self._running[job.id] = None
            try:
                self._run(job)
            except Exception:  # noqa: BLE001 - a slot never dies: the job is failed below, the next one runs
                self.log(f"job {job.id}: {traceback.format_exc().strip()}")
                self.store.finish(job.id, "failed", error={"code": "server_error", "message": "internal error"})
            finally:
                with self._wake:
                    self._running.pop(job.id, None)
                if self.store.get(job.id) is None:  # deleted while it rendered
                    shutil.rmtree(self.store.folder_of(job.id), ignore_errors=True)

    def _run(self, job: Job) -> None:
        folder = self.store.folder_of(job.id)
        try:
            if job.attempts >= MAX_ATTEMPTS:
                raise CamrenderError(f"the server was killed while it rendered this job, {job.attempts} times: it is "
                                     "not tried again")
            request = plan_job(job.spec, folder, self.rules)
            resume = rerun_state(request, self.checkpoint_every)
        except CamrenderError as error:
            if self.store.start(job.id, time.time()):
                self._failed(job.id, folder, error)
            return
        if not self.store.start(job.id, time.time()):  # cancelled meanwhile
            return
        self.log(f"job {job.id}: rendering" + (" (resumed from its checkpoint)" if resume else ""))
        progress = JobProgress(lambda **fields: self.store.report(job.id, **fields),
                               lambda: self._stop_reason(job.id), refiner=request.settings.refiner is not None)
        started = time.perf_counter()
        try:
            self.renderer.render(PlannedJob(job.id, request, resume, self.checkpoint_every), progress)
        except JobStopped as stopped:
            if stopped.reason == "stopping" and self.store.requeue(job.id, attempted=False):
                self.log(f"job {job.id}: stopped with the server; it goes on when the server starts again")
                return
            shutil.rmtree(folder, ignore_errors=True)
            self.log(f"job {job.id}: cancelled")
            return
        except CamrenderError as error:
            self._failed(job.id, folder, error)
            return
        except Exception as error:  # noqa: BLE001 - out of memory, a bug: the job fails, the server goes on
            self.log(f"job {job.id}: {traceback.format_exc().strip()}")
            self._failed(job.id, folder, CamrenderError(f"{type(error).__name__}: {error}"))
            return
        seconds = round(time.perf_counter() - started, 3)
        if self.store.finish(job.id, "completed", inference_s=seconds):
            self.log(f"job {job.id}: completed in {seconds:.1f} s")
        else:  # cancelled while its last frames were written
            shutil.rmtree(folder, ignore_errors=True)

    def _failed(self, job_id: str, folder: Path, error: CamrenderError) -> None:
        message = " ".join(str(error).replace(str(folder), job_id).split())
        self.log(f"job {job_id}: failed: {message}")
        self.store.finish(job_id, "failed", error={"code": "render_failed", "message": message,
                                                   "param": error.field})
