"""Where the server's jobs render: a `Renderer` renders one planned job at a time per slot (a GPU), and the
`Dispatcher` hands it the queued jobs from the store, oldest first, one thread per slot.

    dispatcher = Dispatcher(store, InProcessRenderer(pipe), rules, checkpoint_every=180.0, log=print)
    dispatcher.start(); ...; dispatcher.wake()   # a job was queued
    dispatcher.cancel(job_id); dispatcher.stop()

The store stays with the dispatcher (the server's process): a renderer only renders and reports through the
`JobProgress` it is handed. `InProcessRenderer` renders on this process's loaded pipeline;
`camrender.serve.ray_renderer.RayRenderer` on the workers of a Ray cluster (docs/serve.md, "Workers").

A job whose folder holds what an interrupted attempt left (the server was killed or stopped) continues from its
segment-mode checkpoint when it has one and the render can resume (`rerun_state`), else starts over; a job whose
video and render file were written whole before the kill is completed without a render (`written_whole`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional, Protocol

from camrender.api.requests import prepare_output
from camrender.errors import CamrenderError
from camrender.output.mp4_check import check_whole
from camrender.output.targets import clear_killed_render, companion_path
from camrender.render.request import RenderRequest
from camrender.render.resume import partial_folder
from camrender.render.settings_file import read_render_json, settings_differences, settings_record
from camrender.serve.jobs import VIDEO, JobRules, plan_job
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
    verify). What a killed attempt left goes first (`clear_killed_render`: the temporary files of the video and
    its side files, the lock file), and the partial folder too unless the render continues from it."""
    if not clear_killed_render(request.out, keep_checkpoint=True):
        return False
    try:
        prepared = prepare_output(request, resume=True, checkpoint_every=checkpoint_every)
    except CamrenderError:  # full mode, the refiner, another recipe, other settings: not resumable
        pass
    else:
        prepared.release()  # (the render claims the output again when it starts)
        if prepared.resume_info is not None:
            return True
    shutil.rmtree(partial_folder(request.out), ignore_errors=True)
    return False


def written_whole(request: RenderRequest) -> bool:
    """Whether an earlier attempt wrote the video of `request` and its render file whole (the server was killed
    after the video's rename, before its job was marked completed): the video holds the request's frames at its
    size and the render file records the request's settings."""
    render_file = companion_path(request.out, ".render.json")
    if not (Path(request.out).is_file() and render_file.is_file()):
        return False
    try:
        check_whole(request.out, request.num_frames, request.out, (request.height, request.width))
        saved, _ = read_render_json(render_file)
    except CamrenderError:
        return False
    return not settings_differences(saved, settings_record(request))


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
        self._stopped = False
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

    @property
    def stopping(self) -> bool:
        """Whether the server is stopping (`begin_stop`)."""
        return self._stopping

    def begin_stop(self) -> None:
        """No job starts from now; the renders stop at their next step or segment, their jobs back in the queue."""
        with self._wake:
            self._stopping = True
            self._wake.notify_all()

    def stop(self, grace: float) -> None:
        """`begin_stop`, and wait up to `grace` seconds for the renders to stop. A job still rendering then goes
        back to the queue all the same (the next start continues it, as after a kill); a stop counts as no
        attempt of a job. Again: nothing."""
        if self._stopped:
            return
        self.begin_stop()
        deadline = time.monotonic() + grace
        try:
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        finally:  # (also when a second Ctrl-C cuts the wait short)
            self._stopped = True
            for job_id in sorted(self.busy()):
                if self.store.requeue(job_id, attempted=False):
                    self.log(f"job {job_id}: still rendering {grace:g} s after the stop; queued again, it goes on "
                             "when the server starts again")

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
            folder = self.store.folder_of(job.id)
            try:
                self._run(job, folder)
            except Exception as error:  # noqa: BLE001 - a slot never dies: the job fails, the next one runs
                if self._stopped:  # a render that outlived the stop's grace: `stop` queued it again, checkpoint kept
                    self.log(f"job {job.id}: {type(error).__name__} after the stop; it stays queued")
                    continue
                try:
                    self._failed(job.id, folder, error)
                except Exception:  # noqa: BLE001 - the store itself fails (a full disk): said, and a pause
                    self.log(f"job {job.id}: {traceback.format_exc().strip()}")
                    time.sleep(IDLE_CHECK_S)
            finally:
                with self._wake:
                    self._running.pop(job.id, None)
                if not self._kept(job.id):  # cancelled or deleted while the slot had it: its files go
                    shutil.rmtree(folder, ignore_errors=True)

    def _run(self, job: Job, folder: Path) -> None:
        """Plan, start and render `job`; an exception (a refusal, a bug, the render's error) fails it."""
        if job.attempts >= MAX_ATTEMPTS:
            raise CamrenderError(f"the server was killed while it rendered this job, {job.attempts} times: it is "
                                 "not tried again")
        request = plan_job(job.spec, folder, self.rules)
        if written_whole(request):
            if self.store.finish(job.id, "completed", queued_too=True):
                self.log(f"job {job.id}: completed (its video was written whole before the server stopped)")
            return
        resume = rerun_state(request, self.checkpoint_every)
        if self._stopping or not self.store.start(job.id, time.time()):  # stopping, or cancelled meanwhile
            return
        self.log(f"job {job.id}: rendering" + (" (resumed from its checkpoint)" if resume else ""))
        progress = JobProgress(lambda **fields: self.store.report(job.id, **fields),
                               lambda: self._stop_reason(job.id), refiner=request.settings.refiner is not None)
        started = time.perf_counter()
        try:
            self.renderer.render(PlannedJob(job.id, request, resume, self.checkpoint_every), progress)
        except JobStopped as stopped:
            if stopped.reason != "stopping":
                self.log(f"job {job.id}: cancelled")
            elif self.store.requeue(job.id, attempted=False):  # (False: `stop` queued it again already)
                self.log(f"job {job.id}: stopped with the server; it goes on when the server starts again")
            return
        seconds = round(time.perf_counter() - started, 3)
        if self.store.finish(job.id, "completed", inference_s=seconds):
            self.log(f"job {job.id}: completed in {seconds:.1f} s")
        # (else it was cancelled while its last frames were written, or queued again by `stop`)

    def _kept(self, job_id: str) -> bool:
        """Whether the job is still wanted: neither cancelled nor deleted."""
        job = self.store.get(job_id)
        return job is not None and job.status != "cancelled"

    def _failed(self, job_id: str, folder: Path, error: Exception) -> None:
        """Fail the job, queued or in progress, with `error` (logged once: with its traceback when it is not a
        CamrenderError). A failed job is not rendered again: what its render left goes, its inputs stay."""
        if not isinstance(error, CamrenderError):
            self.log(f"job {job_id}: {''.join(traceback.format_exception(error)).strip()}")
            error = CamrenderError(f"{type(error).__name__}: {error}")
        message = " ".join(str(error).replace(str(folder), job_id).split())
        self.log(f"job {job_id}: failed: {message}")
        with contextlib.suppress(CamrenderError):  # a render still writing it (one that outlived a stop) is left be
            clear_killed_render(folder / VIDEO, keep_checkpoint=False)
        self.store.finish(job_id, "failed", error={"code": "render_failed", "message": message, "param": error.field},
                          queued_too=True)
