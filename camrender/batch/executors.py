"""Where a batch's jobs render: an `Executor` hands the planned jobs to its workers, each of which renders its jobs
with a `JobRunner` (one loaded pipeline kept from job to job) and returns their results.

    results, loads = executor.run(jobs, make_runner)   # on the process that reports; None elsewhere

make_runner(ranks) -> JobRunner: the runner of one worker, `ranks` its video group
(`camrender.parallel.distributed.Ranks`, passed explicitly) or None on one process.

- `InProcessExecutor`: this process renders every job, in order.
- `TorchrunExecutor`: the ranks of a torchrun run, the jobs dealt round-robin to its video groups (one GPU each, or
  `--gpus-per-video` GPUs); rank 0 gathers.
- `camrender.batch.ray_executor.RayExecutor`: the actors of a Ray cluster, each taking the next job from one queue
  as it frees up; a lost worker's job is rendered again.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Protocol

from camrender.api.requests import for_ranks
from camrender.batch.pipelines import PipelineCache
from camrender.batch.progress import JobLines, outcome
from camrender.errors import CamrenderError
from camrender.parallel import distributed


class JobRunner:
    """Renders planned jobs on one worker (a process, or a video group's rank), keeping its pipeline between them.

    load(settings) -> pipeline; write(pipeline, job) -> frames written (the planned job: its request and how it is
    written); strict: an error other than bad input stops the worker instead of failing the job (a video group
    whose partners may wait in a collective)."""

    def __init__(self, load: Callable, write: Callable, strict: bool = False):
        self.pipelines = PipelineCache(load)
        self.write, self.strict = write, strict

    @property
    def loads(self) -> int:
        return self.pipelines.loads

    def render(self, job) -> dict:
        """Render one planned job: its result {"index", "where", "out", "status" ("done" with "frames" and
        "seconds", or "failed" with "reason")}."""
        result = {"index": job.index, "where": job.where, "out": job.out}
        try:
            pipe = self.pipelines.get(job.request.settings)  # on a change, the previous goes before the next loads
            started = time.perf_counter()  # a video's seconds leave out the model load it may have waited for
            frames = self.write(pipe, job)
            result.update(status="done", frames=frames, seconds=round(time.perf_counter() - started, 3))
        except Exception as error:  # noqa: BLE001 - reported per job, the batch goes on
            if self.strict and not isinstance(error, CamrenderError):
                raise
            reason = str(error) if isinstance(error, CamrenderError) else f"{type(error).__name__}: {error}"
            result.update(status="failed", reason=f"{job.where}: {reason}")
        return result


def render_on(runner: JobRunner, job, ranks=None) -> dict:
    """`runner.render(job)` on a video group's rank (`ranks`; None: one process): the job's request given the
    rank's device and the group's head split first; a layout the group cannot split fails the job."""
    if ranks is None:
        return runner.render(job)
    try:
        job.request = for_ranks(job.request, ranks)
    except CamrenderError as error:
        return {"index": job.index, "where": job.where, "out": job.out, "status": "failed",
                "reason": f"{job.where}: {error}"}
    return runner.render(job)


class Executor(Protocol):
    """Runs a batch's jobs on its workers. `workers`: how many render at once; `per_video`: GPUs per video."""

    workers: int
    per_video: int

    def run(self, jobs: list, make_runner: Callable[..., JobRunner]) -> Optional[tuple]:
        """Render `jobs` (planned, status "render"): (every job's result, each worker's model loads) on the
        process that reports, None on the others."""


class InProcessExecutor:
    """Every job in this process, in order. log: a callable taking one line per finished job."""

    workers = 1
    per_video = 1

    def __init__(self, log: Callable[[str], None]):
        self.log = log

    def run(self, jobs: list, make_runner: Callable[..., JobRunner]) -> tuple:
        runner, results, lines = make_runner(None), [], JobLines(len(jobs), self.log)
        for job in jobs:
            results.append(runner.render(job))
            lines(results[-1])
        return results, [runner.loads]


class TorchrunExecutor:
    """The ranks of a torchrun run: video group g renders jobs g, g + G, ... (G groups); each rank of a group
    renders along (collectives) and its leader writes; rank 0 gathers the results."""

    def __init__(self, ranks, log: Callable[[str], None]):
        self.ranks, self.log = ranks, log
        self.workers, self.per_video = ranks.num_videos, ranks.per_video

    def run(self, jobs: list, make_runner: Callable[..., JobRunner]) -> Optional[tuple]:
        ranks = self.ranks
        runner, results = make_runner(ranks), []
        for position, job in enumerate(jobs):
            if position % ranks.num_videos != ranks.video_index:
                continue
            result = render_on(runner, job, ranks)
            if ranks.is_leader:
                results.append({**result, "rank": ranks.rank})
                self.log(f"[rank {ranks.rank}] job {position + 1}/{len(jobs)} {job.out}: {outcome(result)}")
        gathered = distributed.gather_objects((results, runner.loads), ranks)
        if gathered is None:
            return None
        return [r for rank_results, _ in gathered for r in rank_results], [loads for _, loads in gathered]
