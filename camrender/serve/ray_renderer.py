"""`camrender serve --executor ray`: the server's jobs rendered by the actors of a Ray cluster (`RayRenderer`, a
`camrender.serve.worker.Renderer`), the workers of `camrender batch --executor ray`
(`camrender.batch.ray_workers.RayWorkers`) fed from the server's one queue; the store stays in the server.

    with ray_renderer(settings, address=None, workers=None, retries=2, log=print) as renderer:
        dispatcher = Dispatcher(store, renderer, rules, checkpoint_every=180.0, log=print)   # renderer.slots threads

Each slot thread of the dispatcher hands its job to the one thread that drives the pool (the pool is driven from
one thread: it submits, collects results, stops a cancelled job's worker) and waits for the result, passing the
render's progress on to its `JobProgress` as it comes: a worker reports each progress call to a `ProgressBoard`
actor without waiting, and the owner thread collects them every POLL_S. When the job should stop (a cancel, the
server stopping) the slot thread has the job's worker killed and replaced: what the render left is cleared, a
segment-mode checkpoint kept (the dispatcher removes a cancelled job's folder; a stopped one continues from its
checkpoint when the server starts again). A job whose worker is lost renders again elsewhere, at most `retries`
times, as in a batch. The server loads no pipeline: each worker loads its own with its first job.

Ray is an optional extra; this module imports without it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import queue
import threading
import time
import traceback
from typing import Callable, Optional

from camrender.batch.executors import JobRunner
from camrender.batch.plan import Planned
from camrender.batch.ray_executor import cluster_workers, import_ray, local_cpus, ray_cluster
from camrender.batch.ray_workers import RayWorkers, first_line
from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.serve.progress import JobProgress, JobStopped
from camrender.serve.worker import PlannedJob

POLL_S = 0.05  # how often the owner thread collects progress and a waiting slot thread looks at its job
START_WAIT_S = 120.0  # how long the server waits for its workers to start before it serves


class ProgressBoard:
    """An actor holding the progress calls of the workers' renders until the server takes them: report(index,
    call) from a worker (never waited for), take() -> [(job index, (done, total, info, stage, unit)), ...] since
    the last take."""

    def __init__(self):
        self.calls = []

    def report(self, index: int, call: tuple) -> None:
        self.calls.append((index, call))

    def take(self) -> list:
        calls, self.calls = self.calls, []
        return calls


def actor_runner(board, ranks) -> JobRunner:
    """The `JobRunner` of one worker, made in its actor: pipelines loaded through the API, each job written with its
    progress reported to the `board` actor (the job stops by the worker being killed: no stop check here)."""
    def load(settings: LoadSettings):
        # lazy: torch and diffusers load in the actor, with its first job (the worker starts at once)
        from camrender.api.pipeline import CamrenderPipeline

        return CamrenderPipeline.from_pretrained(settings=settings, ranks=ranks)

    def write(pipe, job: Planned) -> int:
        def progress(done: int, total: int, info: str = "", stage: str = "stage 1", unit: str = "") -> None:
            board.report.remote(job.index, (done, total, info, stage, unit))

        return pipe.write(job.request, progress=progress, resume=job.resume,
                          checkpoint_every=job.checkpoint_every).frames

    return JobRunner(load, write)


@dataclasses.dataclass
class _Ticket:
    """One job between its slot thread and the owner thread: the planned job, the progress calls not passed on yet
    (appended by the owner, taken by the slot thread), and its end (`done` set; `result` None: stopped)."""

    job: Planned
    calls: collections.deque = dataclasses.field(default_factory=collections.deque)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Optional[dict] = None


class RayRenderer:
    """The workers of the Ray cluster this process is connected to (`ray_cluster`): `slots` of them, one per GPU
    (one per CPU when the server renders on the CPU or the cluster has no GPUs), at most `workers`. retries: times a
    job whose worker was lost renders again; log: a callable taking one line. `start()` before the first render."""

    def __init__(self, settings: LoadSettings, *, workers: Optional[int] = None, retries: int = 2,
                 log: Callable[[str], None] = lambda line: None):
        self.ray, self.log = import_ray(), log
        gpus, self.unit, self.slots = cluster_workers(1, settings.device != "cpu", workers)
        # on this process's node: a board on a node that leaves would take every later job's progress with it
        here = self.ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
            node_id=self.ray.get_runtime_context().get_node_id(), soft=False)
        self.board = self.ray.remote(ProgressBoard).options(num_cpus=0, scheduling_strategy=here).remote()
        self.pool = RayWorkers(functools.partial(actor_runner, self.board), self.slots, gpus=gpus, retries=retries,
                               log=log)
        self._inbox = queue.SimpleQueue()  # ("render" | "cancel", ticket), ("close", None): to the owner thread
        self._tickets = {}  # job index -> its ticket, while the pool has it (the owner thread's)
        self._indexes = itertools.count()
        self._owner: Optional[threading.Thread] = None
        self._closed = False

    def start(self, timeout: float = START_WAIT_S) -> int:
        """Wait (at most `timeout` seconds) for the workers to start, then hand the pool to its thread: how many
        started. CamrenderError when none could."""
        started = self.pool.wait_started(timeout)
        if started == 0 and self.pool.last_loss:
            raise CamrenderError(f"no Ray worker could start ({self.pool.last_loss})", field="executor")
        self._owner = threading.Thread(target=self._own, name="camrender-ray", daemon=True)
        self._owner.start()
        return started

    # --------------------------------------------------------------------------- a slot thread
    def render(self, job: PlannedJob, progress: JobProgress) -> int:
        if self._closed:  # a slot thread that took a job as the server stopped: it stays queued
            raise JobStopped("stopping")
        ticket = _Ticket(Planned(next(self._indexes), job.id, str(job.request.out), "render", request=job.request,
                                 resume=job.resume, checkpoint_every=job.checkpoint_every))
        self._inbox.put(("render", ticket))
        try:
            while not ticket.done.wait(POLL_S):
                progress.check()
                while ticket.calls:
                    done, total, info, stage, unit = ticket.calls.popleft()
                    progress(done, total, info, stage=stage, unit=unit)
        except JobStopped:
            self._inbox.put(("cancel", ticket))
            ticket.done.wait()  # its worker killed, what the render left cleared (or it had finished)
            if ticket.result is None:
                raise
        result = ticket.result
        if result is None:  # the renderer closed under it
            raise JobStopped("stopping")
        if result["status"] != "done":
            raise CamrenderError(result["reason"].removeprefix(f"{job.id}: "))
        return result["frames"]

    def close(self) -> None:
        """Stop every worker (a render still running is killed, as by a stop) and the progress board."""
        if self._closed:
            return
        self._closed = True
        if self._owner is not None:
            self._inbox.put(("close", None))
            self._owner.join()
        else:
            self.pool.close()
        self.ray.kill(self.board)

    # --------------------------------------------------------------------------- the owner thread
    def _own(self) -> None:
        while True:
            try:
                if not self._take_messages():
                    break
                if self._tickets:
                    result = self.pool.next_result(timeout=POLL_S)
                    if result is not None:
                        self._end(self._tickets.pop(result["index"], None), result)
                    self._pass_progress()
            except Exception as error:  # noqa: BLE001 - the cluster failing: its jobs in flight fail, the thread lives
                self.log(f"Ray workers: {traceback.format_exc().strip()}")
                for ticket in list(self._tickets.values()):
                    with contextlib.suppress(Exception):  # its render stopped: nothing writes for a failed job
                        self.pool.cancel(ticket.job.index)
                    self._end(ticket, {"status": "failed", "reason": f"the Ray workers failed: {first_line(error)}"})
                self._tickets.clear()
                time.sleep(POLL_S)
        with contextlib.suppress(Exception):  # the cluster may be gone already
            self.pool.close()
        for ticket in self._tickets.values():
            self._end(ticket, None)
        self._tickets.clear()

    def _take_messages(self) -> bool:
        """Submit the jobs handed over and cancel those asked (waiting for a message while the pool is idle);
        False once the renderer closes."""
        block = not self._tickets
        while True:
            try:
                kind, ticket = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if kind == "close":
                return False
            if kind == "render":
                self._tickets[ticket.job.index] = ticket
                self.pool.submit(ticket.job)
            elif self._tickets.pop(ticket.job.index, None) is not None:  # "cancel" of a job the pool has
                if self.pool.cancel(ticket.job.index) == "rendering":
                    self.log(f"job {ticket.job.where}: its Ray worker was stopped; a new one replaces it")
                self._end(ticket, None)

    def _pass_progress(self) -> None:
        for index, call in self.ray.get(self.board.take.remote()):
            ticket = self._tickets.get(index)
            if ticket is not None:
                ticket.calls.append(call)

    @staticmethod
    def _end(ticket: Optional[_Ticket], result: Optional[dict]) -> None:
        if ticket is not None:
            ticket.result = result
            ticket.done.set()


@contextlib.contextmanager
def ray_renderer(settings: LoadSettings, *, address: Optional[str], workers: Optional[int], retries: int,
                 log: Callable[[str], None]):
    """A started `RayRenderer` on the cluster at `address` (None: a Ray started on this machine for the server,
    on 127.0.0.1; see `ray_cluster`), closed with the block (and the Ray it started stopped)."""
    with ray_cluster(address, num_cpus=local_cpus(workers)):
        renderer = RayRenderer(settings, workers=workers, retries=retries, log=log)
        try:
            started = renderer.start()
            log(f"{started} of {renderer.slots} Ray worker{'' if renderer.slots == 1 else 's'} started "
                f"(one {renderer.unit} each); each loads the pipeline with its first job")
            yield renderer
        finally:
            renderer.close()
