"""Many renders in one run (`camrender batch JOBS`), spread over the ranks of a torchrun run.

JOBS is either
- a JSON-lines file, one render per line: {"trajectory": "a.json", "output": "a.mp4", "image": ...,
  "prompt": ..., "options": {"steps": 30, ...}}; any `camrender render` option may stand at the top
  level or under "options" (dashes or underscores), relative paths are relative to the file's folder;
- or a folder of trajectory files: each one renders to OUT_DIR/<name>.mp4 (OUT_DIR defaults to the
  folder; the `*.traj.json` side files of earlier renders and the `*_intrinsics.npy` beside pose files
  are not jobs).

Options given on the `batch` command line apply to every job; a job's own values win.

Rank 0 plans (`plan_jobs`): a job whose output exists is skipped (a re-run resumes), a job whose
input is wrong fails at once; the jobs left are dealt round-robin to the video groups
(`camrender.parallel.distributed`: one GPU each, or `--gpus-per-video` GPUs). Every rank keeps its loaded
pipeline from job to job (`Pipelines`); a job that fails is reported and the rest go on; rank 0
gathers the results and prints the summary (`summarize`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

import click

from camrender.cli.launch import options_to_argv
from camrender.cli.progress import count
from camrender.errors import CamrenderError
from camrender.parallel import distributed
from camrender.parallel.cfg import check_split, head_split_size
from camrender.output.targets import check_batch_output
from camrender.render.resume import partial_folder
from camrender.trajectory.formats import FORMAT_MODULES, looks_like_actions
from camrender.trajectory.formats.fileio import json_lines, read_text

ALIASES = {"trajectory": "traj", "output": "out"}
NOT_JOB_OPTIONS = {"gpus", "progress", "quiet"}  # options of the run, not of one render
# RenderRequest fields the loaded pipeline depends on: jobs agreeing on them share it.
MODEL_FIELDS = ("model", "dtype", "device", "offload", "transformer_weights", "vae", "kernels", "refiner",
                "refiner_offload")


@dataclasses.dataclass
class Job:
    """One render of a batch: `where` names it in messages ("jobs.jsonl line 3", a trajectory file);
    `values` maps `camrender render` parameter names to the job's values (paths resolved); `error`: why
    the line is not a job at all (not JSON, an unknown key), reported when the batch is planned."""

    where: str
    values: dict
    error: str = ""


# ----------------------------------------------------------------------------- reading JOBS
def read_jobs(source: Path, command: click.Command, out_dir: Optional[Path] = None) -> list:
    """The jobs of a JSON-lines file or a folder of trajectory files (see the module docstring).

    Raises CamrenderError when JOBS itself cannot be read (no such file, an empty folder). A line
    that is not a JSON object or has an unknown key becomes a Job with `error` set (naming the file
    and line), so that planning lists every bad line at once; a job's values are checked when it
    is planned.
    """
    source = Path(source)
    if source.is_dir():
        return _folder_jobs(source, out_dir or source)
    if out_dir is not None:
        raise CamrenderError("--out-dir is for a folder of trajectories; a jobs file names each output",
                             path=source, field="out-dir")
    names = {param.name: param for param in command.params}
    jobs = []
    text = read_text(source, what="a jobs file")
    _refuse_one_document(text, source)
    for number, line in enumerate(json_lines(text), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            jobs.append(Job(where, _line_values(line, where, names, source.parent)))
        except CamrenderError as error:
            jobs.append(Job(where, {}, error=str(error)))
    return jobs


def _refuse_one_document(text: str, source: Path) -> None:
    """A JSON document over several lines (a trajectory given as JOBS) is one error, not one per line."""
    if text.count("\n") < 2 or text.lstrip()[:1] not in "{[":
        return
    try:
        json.loads(json_lines(text)[0])
    except ValueError:
        try:
            json.loads(text)
        except ValueError:
            return
        raise CamrenderError("is one JSON document over several lines, not a jobs file (JSON lines: one job object "
                             "per line); to render trajectory files, pass their folder", path=source) from None


def _line_values(line: str, where: str, names: dict, folder: Path) -> dict:
    """The render parameters of one JSON line (paths relative to `folder`); CamrenderError naming `where`."""
    try:
        entry = json.loads(line)
    except (json.JSONDecodeError, RecursionError, ValueError) as error:
        column = f" at column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        message = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply or too long a number"
        raise CamrenderError(f"invalid JSON{column}: {message}", path=where) from None
    if not isinstance(entry, dict):
        raise CamrenderError("a job is a JSON object", path=where)
    options = entry.pop("options", {})
    if not isinstance(options, dict):
        raise CamrenderError("must be a JSON object", path=where, field="options")
    values = {}
    for key, value in {**entry, **options}.items():
        name = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in names or name in NOT_JOB_OPTIONS:
            raise CamrenderError("unknown key (keys are trajectory, output and camrender render's options)",
                                 path=where, field=key)
        if isinstance(names[name].type, click.Path) and isinstance(value, str) and not _action_string(name, value,
                                                                                                     folder):
            value = str(folder / Path(value).expanduser())  # absolute paths stay as they are
        values[name] = value
    return values


def _action_string(name: str, value: str, folder: Path) -> bool:
    """Whether a job's "trajectory" is an action string ("w-100,dw-60"), not a file in the jobs file's folder."""
    return name == "traj" and looks_like_actions(value) and not (folder / value).exists()


def _folder_jobs(folder: Path, out_dir: Path) -> list:
    suffixes = {suffix for module in FORMAT_MODULES for suffix in module.SUFFIXES}
    files = sorted(path for path in folder.iterdir()
                   if path.is_file() and path.suffix.lower() in suffixes and not path.name.endswith(".traj.json")
                   and not path.name.endswith("_intrinsics.npy"))  # the intrinsics beside NAME_pose.npy
    if not files:
        raise CamrenderError(f"no trajectory files ({', '.join(sorted(suffixes))}) in this folder", path=folder)
    return [Job(str(path), {"traj": str(path), "out": str(out_dir / (path.stem + ".mp4"))}) for path in files]


def job_params(job: Job, command: click.Command, defaults: dict) -> dict:
    """The `command` (camrender render) parameters of `job`: `defaults`, then the job's values,
    parsed by the command itself. A value it refuses raises CamrenderError naming the job."""
    argv = options_to_argv(command, {**defaults, **job.values})
    try:
        return command.make_context("render", argv).params
    except click.ClickException as error:
        raise CamrenderError(error.format_message(), path=job.where) from None


# ----------------------------------------------------------------------------- plan
@dataclasses.dataclass
class Planned:
    """A job as rank 0 planned it: status "render" (with its request), "skipped" or "failed"."""

    index: int
    where: str
    out: str
    status: str
    reason: str = ""
    request: object = None


def plan_jobs(jobs: list, command: click.Command, defaults: dict, resolve: Callable,
              created: Optional[list] = None) -> list:
    """Skip the jobs whose output exists, fail the malformed lines and the ones `resolve(params) ->
    RenderRequest` refuses. Output folders it had to make are appended to `created` (when given), so
    that a refused batch can take them away again (`remove_created`)."""
    planned, outputs = [], {}
    for index, job in enumerate(jobs):
        out = str(job.values.get("out", ""))
        if job.error:
            planned.append(Planned(index, job.where, out, "failed", job.error))
            continue
        try:
            params = job_params(job, command, defaults)
            out = str(Path(params["out"]).resolve())
            check_batch_output(out, outputs, job.where)
            if Path(out).exists():
                planned.append(Planned(index, job.where, out, "skipped", "output exists"))
                continue
            if partial_folder(out).exists():  # an interrupted render's checkpoint: never overwritten here
                raise CamrenderError(f"{partial_folder(out)} holds an interrupted render: continue it with "
                                     f"`camrender render ... --resume` or remove it", path=job.where, field="output")
            missing = [folder for folder in [Path(out).parent, *Path(out).parent.parents] if not folder.exists()]
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            if created is not None:
                created.extend(missing)  # deepest first
            planned.append(Planned(index, job.where, out, "render", request=resolve(params)))
        except CamrenderError as error:
            message = str(error) if str(error).startswith(job.where) else f"{job.where}: {error}"
            planned.append(Planned(index, job.where, out, "failed", message))
    return planned


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


# ----------------------------------------------------------------------------- running
class Pipelines:
    """One loaded pipeline per rank, kept while consecutive jobs agree on `MODEL_FIELDS` and on how
    their video group splits the heads (`camrender.parallel.cfg.head_split_size`: a guided full-mode
    job and a segment-mode job on the same group hold different shares of the weights)."""

    def __init__(self, load: Callable):
        self.load = load
        self.key = None
        self.pipe = None
        self.loads = 0

    def get(self, request):
        ranks = distributed.current()
        split = head_split_size(getattr(request, "mode", "full"), getattr(request, "guidance", None),
                                1 if ranks is None else ranks.per_video)
        key = (*(str(getattr(request, name)) for name in MODEL_FIELDS), split)
        if key != self.key:
            self.pipe, self.key = None, None  # let the previous model go before the next one loads
            self.pipe = self.load(request)
            self.key = key
            self.loads += 1
        return self.pipe


def run_jobs(planned: list, ranks, pipelines: Pipelines, write: Callable, log: Callable) -> list:
    """Render this rank's share of the planned jobs; returns one result dict per job rendered.

    write(pipe, request) -> frames written renders one job (on a video group, every rank calls it
    and the leader writes). A failing job is reported and the next one starts; on a group of
    several ranks, an error other than bad input stops the process (its partners may be waiting
    in a collective: torchrun then stops the run, and a re-run resumes).
    """
    pending = [job for job in planned if job.status == "render"]
    groups, group = (1, 0) if ranks is None else (ranks.num_videos, ranks.video_index)
    per_video = 1 if ranks is None else ranks.per_video
    leader = ranks is None or ranks.is_leader
    rank = 0 if ranks is None else ranks.rank
    results = []
    for position, job in enumerate(pending):
        if position % groups != group:
            continue
        request = job.request
        if ranks is not None:
            request.device = str(ranks.device)
        result = {"index": job.index, "where": job.where, "out": job.out, "rank": rank}
        try:
            check_split(request.mode, request.guidance, per_video)
            pipe = None  # on a model change the previous pipeline goes before the next one loads
            pipe = pipelines.get(request)
            started = time.perf_counter()  # a video's seconds leave out the model load it may have waited for
            frames = write(pipe, request)
            result.update(status="done", frames=frames, seconds=round(time.perf_counter() - started, 3))
            message = f"done in {result['seconds']:.1f} s ({count(frames, 'frame')})"
        except Exception as error:  # noqa: BLE001 - reported per job, the batch goes on
            if per_video > 1 and not isinstance(error, CamrenderError):
                raise
            reason = str(error) if isinstance(error, CamrenderError) else f"{type(error).__name__}: {error}"
            result.update(status="failed", reason=f"{job.where}: {reason}")
            message = f"failed: {reason}"
        if leader:
            results.append(result)
            log(f"[rank {rank}] job {position + 1}/{len(pending)} {job.out}: {message}")
    return results


# ----------------------------------------------------------------------------- summary
def summarize(planned: list, results: list, seconds: float, ranks, loads: list) -> dict:
    """The batch summary: counts, failures, seconds per video and videos per minute."""
    failed = [{"where": job.where, "out": job.out, "reason": job.reason} for job in planned if job.status == "failed"]
    failed += [{"where": r["where"], "out": r["out"], "reason": r["reason"]} for r in results if r["status"] == "failed"]
    done = [r for r in results if r["status"] == "done"]
    return {
        "jobs": len(planned),
        "done": len(done),
        "skipped": sum(job.status == "skipped" for job in planned),
        "failed": len(failed),
        "failures": failed,
        "seconds": round(seconds, 3),
        "seconds_per_video": round(sum(r["seconds"] for r in done) / len(done), 3) if done else None,
        "videos_per_minute": round(60.0 * len(done) / seconds, 3) if done and seconds > 0 else 0.0,
        "ranks": 1 if ranks is None else ranks.world_size,
        "gpus_per_video": 1 if ranks is None else ranks.per_video,
        "model_loads_per_rank": loads,
        "results": sorted(results, key=lambda r: r["index"]),
    }


def summary_lines(summary: dict) -> list:
    """The summary as the lines `camrender batch` prints."""
    per_video = summary["seconds_per_video"]
    lines = [f"batch: {summary['done']} done, {summary['skipped']} skipped (output exists), {summary['failed']} "
             f"failed of {summary['jobs']} jobs in {summary['seconds']:.1f} s on {summary['ranks']} rank(s)"
             + (f": {per_video:.1f} s per video, {summary['videos_per_minute']:.2f} videos per minute"
                if per_video is not None else "")]
    lines += [f"failed: {failure['reason']}" for failure in summary["failures"]]
    return lines
