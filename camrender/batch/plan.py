"""Planning a batch (`plan_jobs`): each job resolved to its request once, before the first renders, or skipped
(its output exists: a re-run resumes) or failed (with the reason, naming its line or file)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from camrender.batch.shards import Shard
from camrender.errors import CamrenderError
from camrender.files import make_folders
from camrender.output.targets import check_batch_output
from camrender.render.request import RenderRequest
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY, partial_folder


@dataclasses.dataclass
class Planned:
    """A planned job: status "render" (with its `RenderRequest` and how it is written: `resume` from an interrupted
    render's checkpoint, `checkpoint_every` seconds), "skipped" or "failed" (with `reason`). `index`: its place in
    the jobs file; `where`: what names it in messages ("jobs.jsonl line 3")."""

    index: int
    where: str
    out: str
    status: str
    reason: str = ""
    request: Optional[RenderRequest] = None
    resume: bool = False
    checkpoint_every: float = DEFAULT_CHECKPOINT_EVERY
    overwrite: bool = False


def plan_jobs(jobs: list, resolve: Callable, created: Optional[list] = None, overwrite: bool = False,
              shard: Optional[Shard] = None) -> list:
    """Plan `jobs` (`camrender.batch.jobs.Job`s): `resolve(job) -> (RenderRequest, {"resume", "checkpoint_every"})`
    checks a job's values (raising CamrenderError); a job whose output exists is skipped, one whose output another
    job already has, or that an interrupted render's checkpoint holds (unless it resumes), fails; with `overwrite`
    a job whose output exists renders again, replacing it. Output folders made for the jobs are appended to `created`
    (when given), deepest first, so that a refused batch can take them away again (`remove_created`); one that
    cannot be made fails its job. shard: every
    job is checked (a jobs file with errors is refused whole in every shard), those of other shards that pass are
    left out of the plan (their interrupted renders unchecked: another process may be rendering them now)."""
    planned, outputs = [], {}
    for index, job in enumerate(jobs):
        mine = shard is None or shard.holds(index, len(jobs))
        out = str(job.values.get("out", ""))
        if job.error:
            planned.append(Planned(index, job.where, out, "failed", job.error))
            continue
        try:
            if out:  # checked before the job's values: a finished job is skipped unplanned (a re-run resumes)
                out = str(Path(out).resolve())
                check_batch_output(out, outputs, job.where)
                if Path(out).exists() and not overwrite:
                    if mine:
                        planned.append(Planned(index, job.where, out, "skipped", "output exists"))
                    continue
                _make_folder(Path(out).parent, created, job.where)  # (every shard's: `resolve` checks it)
            request, writing = resolve(job)
            if not mine:
                continue
            if partial_folder(out).exists() and not writing["resume"]:  # an interrupted render: never overwritten
                raise CamrenderError(f"{partial_folder(out)} holds an interrupted render: continue it with "
                                     f"`camrender render ... --resume` or remove it", path=job.where, field="output")
            planned.append(Planned(index, job.where, out, "render", request=request, overwrite=overwrite, **writing))
        except CamrenderError as error:
            message = str(error) if str(error).startswith(job.where) else f"{job.where}: {error}"
            planned.append(Planned(index, job.where, out, "failed", message))
    return planned


def _make_folder(folder: Path, created: Optional[list], where: str) -> None:
    """Make an output's folder, appending the folders made to `created` (deepest first); one that cannot be made
    (a file in its way, no permission): CamrenderError naming the job."""
    try:
        make_folders(folder, made=created)
    except OSError as error:
        reason = ("a file is in the way" if isinstance(error, (FileExistsError, NotADirectoryError))
                  else error.strerror or str(error))
        raise CamrenderError(f"cannot make the output's folder {folder}: {reason}", path=where,
                             field="output") from None


def remove_created(folders: list) -> None:
    """Remove the output folders `plan_jobs` made, deepest first, where they are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


def refuse_bad_jobs(planned: list, source, log: Callable) -> None:
    """A batch with bad jobs renders nothing: log every failed job's reason (one line each, naming its
    line or file) and raise CamrenderError (exit 2) saying how many and what to do."""
    failed = [job for job in planned if job.status == "failed"]
    if not failed:
        return
    for job in failed:
        log(f"error: {job.reason}")
    raise CamrenderError(f"{len(failed)} of {len(planned)} jobs cannot render (listed above); nothing was rendered: "
                         f"fix them, or pass --skip-bad-jobs to render the others", path=source)
