"""A pool of render workers on a Ray cluster fed from one queue (`RayWorkers`), usable without the CLI:

    with RayWorkers(make_runner, workers=4) as pool:      # Ray initialized already (ray.init / ray_cluster)
        pool.submit(job)                                  # a planned job (`camrender.batch.plan.Planned`), any time
        for result in pool.results(): ...                 # each job's result as it finishes
        pool.cancel(job.index)                            # a job stopped: its worker killed and replaced

A worker is one actor (`camrender.batch.ray_actor.RenderWorker`: one GPU, or one CPU) or a video group of
`per_video` actors packed on one node. A worker that frees up takes the first queued job of the load settings it
has loaded (its pipeline is kept), else the queue's first. A worker lost while rendering (its process killed, out of
memory, its node gone) costs only that job: what the killed render left is removed
(`camrender.output.targets.clear_killed_render`), the job goes back to the front of the queue (a segment-mode job
resuming from its checkpoint) at most `retries` times, then it fails; the worker is replaced. Every lost attempt is
named in the job's result ("retries"). A worker lost while it starts (its node leaving, its process killed) is
replaced too, at most `retries` times in a row until one starts (a worker that cannot start is not started forever);
one whose start raises is not replaced (it would fail again).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from camrender.batch.ray_actor import RenderWorker
from camrender.errors import CamrenderError

CLOSE_WAIT_S = 10.0  # how long a killed worker's calls in flight may take to end (its processes to be gone)
CLAIM_POLL_S = 0.05  # how often a killed render's output is looked at until its process lets it go


@dataclasses.dataclass
class _Worker:
    """The driver's view of one worker: its actors (rank 0 writes), the calls in flight ({ref: rank}), its stage
    ("placing" -> "starting" -> "ready" <-> "busy"), the job it renders and the load settings it has loaded."""

    name: str
    actors: list
    group: Any = None  # the placement group of a video group of several actors
    stage: str = "placing"
    calls: dict = dataclasses.field(default_factory=dict)
    places: dict = dataclasses.field(default_factory=dict)
    job: Any = None
    result: Optional[dict] = None
    settings: Any = None
    dispatched: float = 0.0  # time.monotonic() when its job was handed to it
    dispatched_at: float = 0.0  # the same as time.time(), against the files' modification times


class RayWorkers:
    """Render workers on the Ray cluster this process is connected to (call from one thread).

    make_runner(ranks) -> `camrender.batch.executors.JobRunner`, pickled to and called in each actor; workers: how
    many; per_video: actors (GPUs) rendering each video together; gpus: one GPU per actor (else one CPU); retries:
    how many times a job whose worker was lost is rendered again; log: a callable taking one line (lost workers).
    `loads` maps each worker's name to its model loads so far."""

    def __init__(self, make_runner: Callable, workers: int, *, per_video: int = 1, gpus: bool = False,
                 retries: int = 2, log: Callable[[str], None] = lambda line: None):
        # lazy: Ray is an optional extra
        import ray

        self.ray, self.make_runner, self.per_video, self.gpus = ray, make_runner, per_video, gpus
        self.retries, self.log = retries, log
        self.actor = ray.remote(RenderWorker)
        self.resources = {"num_cpus": 1, "num_gpus": 1 if gpus else 0, "max_restarts": 0}
        self.queue, self.finished = collections.deque(), collections.deque()
        self.lost = {}  # job index -> its lost attempts
        self.workers, self.loads, self.last_loss = [], {}, ""
        self.made = 0
        self.lost_starting = 0  # workers lost while starting since one last started
        for _ in range(workers):
            self._add_worker()

    # ----------------------------------------------------------------------------- the queue
    def submit(self, job) -> None:
        """Queue a planned job (status "render"); it renders when a worker frees up. Its `index` names it in its
        result and must differ from those of the other jobs submitted."""
        self.queue.append(job)

    @property
    def pending(self) -> int:
        """Jobs queued, rendering, or finished and not handed out yet."""
        return len(self.queue) + sum(worker.job is not None for worker in self.workers) + len(self.finished)

    def results(self) -> Iterator[dict]:
        """Each job's result as it finishes, until nothing is queued or rendering."""
        while (result := self.next_result()) is not None:
            yield result

    def next_result(self, timeout: Optional[float] = None) -> Optional[dict]:
        """The next finished job's result: `JobRunner.render`'s dict with "worker" (its name) and "retries" (the
        lost attempts: worker, reason, seconds); None when nothing is queued or rendering, or after `timeout`
        seconds without a result."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.finished:
            self._dispatch()
            if not self.queue and not any(worker.job is not None for worker in self.workers):
                return None
            calls = [ref for worker in self.workers for ref in worker.calls]
            if not calls:  # jobs queued and no worker left
                self._fail_queue(f"no worker left to render it ({self.last_loss or 'none could start'})")
                continue
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = self.ray.wait(calls, num_returns=1, timeout=wait)
            if not ready:
                return None
            self._settle(ready[0])
        return self.finished.popleft()

    def cancel(self, index) -> Optional[str]:
        """Stop job `index` (the `index` it was submitted with); no result comes for it. A queued job leaves the
        queue; a job rendering has its worker killed (what the render left is cleared as after a loss, a segment-mode
        checkpoint kept) and the worker replaced. Where the job was: "queued", "rendering", "finished" (its result
        not handed out yet: dropped), or None (not here)."""
        job = next((job for job in self.queue if job.index == index), None)
        if job is not None:
            self.queue.remove(job)
            return "queued"
        result = next((result for result in self.finished if result["index"] == index), None)
        if result is not None:
            self.finished.remove(result)
            return "finished"
        worker = next((worker for worker in self.workers if worker.job is not None and worker.job.index == index),
                      None)
        if worker is None:
            return None
        self._remove(worker)
        with contextlib.suppress(CamrenderError):  # a render still writing it is left be
            clear_killed_render(worker.job, self.per_video)
        self.lost.pop(index, None)
        self._add_worker()
        return "rendering"

    def wait_started(self, timeout: Optional[float] = None) -> int:
        """Wait until every worker has started (its runner made; a model loads with its first job), at most
        `timeout` seconds; how many have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while starting := [ref for worker in self.workers if worker.stage in ("placing", "starting")
                           for ref in worker.calls]:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = self.ray.wait(starting, num_returns=1, timeout=wait)
            if not ready:
                break
            self._settle(ready[0])
        return sum(worker.stage in ("ready", "busy") for worker in self.workers)

    def close(self) -> None:
        """Stop every worker: the jobs queued or in flight are dropped (what a render in flight left is removed)."""
        self.queue.clear()
        for worker in list(self.workers):
            self._remove(worker)
            if worker.job is not None:
                with contextlib.suppress(CamrenderError):  # a render still writing it is left be
                    clear_killed_render(worker.job, self.per_video)

    def __enter__(self) -> "RayWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------------------- workers
    def _add_worker(self) -> None:
        """Start one more worker: its actors placed (a video group packed on one node), then started."""
        self.made += 1
        group, options = None, []
        if self.per_video > 1:
            # lazy: Ray is an optional extra
            from ray.util import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": 1, **({"GPU": 1} if self.gpus else {})}
            group = placement_group([bundle] * self.per_video, strategy="STRICT_PACK")
            options = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)}
                       for i in range(self.per_video)]
        actors = [self.actor.options(**self.resources, **(options[rank] if options else {})).remote(self.make_runner)
                  for rank in range(self.per_video)]
        worker = _Worker(f"w{self.made}", actors, group)
        worker.calls = {actor.place.remote(): rank for rank, actor in enumerate(actors)}
        self.workers.append(worker)
        self.loads[worker.name] = 0

    def _dispatch(self) -> None:
        """Hand queued jobs to ready workers, each preferring a job of the load settings it has loaded."""
        for worker in self.workers:
            if not self.queue:
                return
            if worker.stage != "ready":
                continue
            job = next((job for job in self.queue if job.request.settings == worker.settings), self.queue[0])
            self.queue.remove(job)
            worker.job, worker.result, worker.settings = job, None, job.request.settings
            worker.dispatched, worker.dispatched_at, worker.stage = time.monotonic(), time.time(), "busy"
            worker.calls = {actor.render.remote(job): rank for rank, actor in enumerate(worker.actors)}

    def _settle(self, ref) -> None:
        """One call of a worker has ended: move the worker on, or handle its loss."""
        worker = next(worker for worker in self.workers if ref in worker.calls)
        rank = worker.calls.pop(ref)
        try:
            value = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as error:  # raised inside the actor: the job's, not a loss
            self._broken(worker, first_line(error.cause if error.cause is not None else error))
            return
        except self.ray.exceptions.RayError as error:  # the actor's process or node is gone
            self._lose(worker, first_line(error))
            return
        if worker.stage == "placing":
            worker.places[rank] = value
            if not worker.calls:
                self._start(worker)
        elif worker.stage == "starting":
            if not worker.calls:
                worker.stage, self.lost_starting = "ready", 0
        elif worker.stage == "busy":
            if value is not None:
                worker.result = value
            if not worker.calls:
                self._finish(worker)

    def _start(self, worker: _Worker) -> None:
        leader = worker.places[0]
        master = (leader["ip"], leader["port"])
        gpus = sorted({gpu for place in worker.places.values() for gpu in place["gpus"]}, key=str)
        device = "cuda" if self.gpus else "cpu"
        worker.stage = "starting"
        worker.calls = {actor.start.remote(rank, self.per_video, master, gpus, device): rank
                        for rank, actor in enumerate(worker.actors)}

    def _finish(self, worker: _Worker) -> None:
        result, job = worker.result, worker.job
        self.loads[worker.name] = result.pop("loads")
        self.finished.append({**result, "worker": worker.name, "retries": self.lost.get(job.index, [])})
        worker.job, worker.result, worker.stage = None, None, "ready"

    def _broken(self, worker: _Worker, reason: str) -> None:
        """A call raised inside the worker: its job failed (not rendered again); the worker, whose video group's
        ranks may be waiting in a collective, is replaced."""
        job, started = worker.job, worker.stage in ("ready", "busy")
        self._remove(worker)
        if job is not None:
            with contextlib.suppress(CamrenderError):  # a render still writing it is left be
                clear_killed_render(job, self.per_video)
            self._failed(job, worker.name, reason)
        if started:
            self._add_worker()
        else:
            self.last_loss = f"{worker.name} could not start: {reason}"
            self.log(self.last_loss)

    def _lose(self, worker: _Worker, reason: str) -> None:
        """The worker's process (or node) is gone: its job is rendered again elsewhere, and the worker replaced (one
        lost while starting: at most `retries` times in a row)."""
        job, started = worker.job, worker.stage in ("ready", "busy")
        self._remove(worker)
        self.last_loss = f"{worker.name} lost: {reason}"
        replaced = started or self.lost_starting < self.retries
        if job is not None:
            self._render_again(job, worker, reason)
        else:
            self.log(f"{self.last_loss}{'; starting another' if replaced else ''}")
        if not started and replaced:
            self.lost_starting += 1
        if replaced:
            self._add_worker()

    def _remove(self, worker: _Worker) -> None:
        """Kill the worker's actors and wait (at most CLOSE_WAIT_S) until their calls in flight have ended: a rank of
        a video group still alive could otherwise write after its job's files were cleared or its job queued again."""
        for actor in worker.actors:
            self.ray.kill(actor)
        if worker.calls:
            self.ray.wait(list(worker.calls), num_returns=len(worker.calls), timeout=CLOSE_WAIT_S)
        if worker.group is not None:
            # lazy: Ray is an optional extra
            from ray.util import remove_placement_group

            remove_placement_group(worker.group)
        self.workers.remove(worker)

    # ----------------------------------------------------------------------------- a lost job
    def _render_again(self, job, worker: _Worker, reason: str) -> None:
        """Queue a lost worker's job again (at the front), or fail it after `retries` retries; a video the lost
        attempt finished is kept (never written twice)."""
        attempts = self.lost.setdefault(job.index, [])
        seconds = time.monotonic() - worker.dispatched
        attempts.append({"worker": worker.name, "reason": reason, "seconds": round(seconds, 3)})
        try:
            resumable = clear_killed_render(job, self.per_video)
        except CamrenderError as error:  # its render still runs somewhere (a node cut off, not gone): leave it be
            self._failed(job, worker.name, f"its worker was lost ({reason}), but {error}")
            return
        if _written_since(job.out, worker.dispatched_at):
            self.log(f"job {job.out} on {worker.name}: worker lost ({reason}) after writing the video")
            self.finished.append({"index": job.index, "where": job.where, "out": job.out, "status": "done",
                                  "frames": job.request.num_frames, "seconds": round(seconds, 3),
                                  "worker": worker.name, "retries": attempts})
        elif len(attempts) > self.retries:
            self._failed(job, worker.name, f"its worker was lost {len(attempts)} times (last: {reason})")
        else:
            job.resume = job.resume or resumable  # from the checkpoint the lost attempt left
            self.queue.appendleft(job)
            self.log(f"job {job.out} on {worker.name}: worker lost ({reason}); rendering it again "
                     f"(retry {len(attempts)} of {self.retries})")

    def _failed(self, job, worker_name: str, reason: str) -> None:
        self.finished.append({"index": job.index, "where": job.where, "out": job.out, "status": "failed",
                              "reason": f"{job.where}: {reason}", "worker": worker_name,
                              "retries": self.lost.get(job.index, [])})

    def _fail_queue(self, reason: str) -> None:
        while self.queue:
            job = self.queue.popleft()
            self._failed(job, "", reason)


def clear_killed_render(job, per_video: int) -> bool:
    """`camrender.output.targets.clear_killed_render` for `job`, its checkpoint kept where its request, as a video
    group of `per_video` renders it, can resume from one: whether it is kept. A killed actor's process may outlive
    the kill by a moment (Ray reports it dead first): its claim on the output is waited for, at most CLOSE_WAIT_S,
    so that nothing is cleared while it can still write (CamrenderError when it holds the output still)."""
    # lazy: keeps `camrender --help` free of torch
    from camrender.api.requests import on_video_group, resume_refusal
    from camrender.output import targets

    try:
        request = on_video_group(job.request, per_video) if per_video > 1 else job.request
    except CamrenderError:  # a layout the group cannot split: the job never rendered
        request = job.request
    keep = request.mode == "segments" and resume_refusal(request) is None
    deadline = time.monotonic() + CLOSE_WAIT_S
    while True:
        try:
            return targets.clear_killed_render(job.out, keep)
        except CamrenderError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(CLAIM_POLL_S)


def _written_since(out, since: float) -> bool:
    """Whether the video `out` was written (renamed into place) at `since` (time.time()) or later: by the attempt
    that started then, not an earlier render a job with --overwrite replaces."""
    try:
        return Path(out).stat().st_mtime >= since - 1.0  # a file system's coarse timestamps
    except OSError:
        return False


def first_line(error: BaseException) -> str:
    """An error in a few words: its type and its message's first line (Ray's go on for many)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]



