"""`camrender batch JOBS`: many renders, each job's options parsed as `camrender render` parses its own and
planned through the API (`camrender.batch`), then rendered by an executor: this process, the ranks of a
torchrun run, or the workers of a Ray cluster."""
from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from pathlib import Path

import click

from camrender.batch.executors import InProcessExecutor, JobRunner, TorchrunExecutor
from camrender.batch.jobs import read_jobs
from camrender.batch.plan import plan_jobs, refuse_bad_jobs, remove_created
from camrender.batch.ray_executor import RayExecutor, import_ray, local_cpus, ray_cluster
from camrender.batch.shards import choose_shard
from camrender.batch.summary import summarize, summary_lines
from camrender.cli import launch as cli_launch
from camrender.cli.launch import options_to_argv
from camrender.cli.options import RAY, declare, overwrite_option, refuse_ray_options
from camrender.cli.progress import count, make_progress
from camrender.cli.render import plan_from_options, quiet_libraries, render
from camrender.cli.signals import raise_if_signalled
from camrender.errors import CamrenderError
from camrender.files import atomic_write_text, check_output_path, probe_writable
from camrender.output.targets import check_summary_target
from camrender.parallel import distributed

_RUN_OPTIONS = {"traj", "out", "gpus", "from_render", "overwrite"}  # render options a batch does not take as defaults
NOT_JOB_OPTIONS = {"gpus", "progress", "quiet", "from_render", "overwrite"}  # options of the run, not of one render


def _render_defaults(command):
    """`batch` takes every `camrender render` option, as the default of each job."""
    for param in render.params:
        if param.name not in _RUN_OPTIONS:
            command.params.append(copy.copy(param))
    return command


def job_keys() -> dict:
    """{key: whether its value is a file path} of what a job may set: `camrender render`'s options."""
    return {param.name: isinstance(param.type, click.Path) for param in render.params
            if param.name not in NOT_JOB_OPTIONS}


def job_params(job, defaults: dict) -> dict:
    """The `camrender render` parameters of `job`: `defaults`, then the job's values, parsed by the command
    itself. A value it refuses raises CamrenderError naming the job."""
    argv = options_to_argv(render, {**defaults, **job.values})
    try:
        return render.make_context("render", argv).params
    except click.ClickException as error:
        raise CamrenderError(error.format_message(), path=job.where) from None


def resolver(defaults: dict, log=None):
    """resolve(job) -> (RenderRequest, how it is written): a job planned as `camrender render` plans its options;
    its notes (a re-timed path) go to `log`, naming the job."""
    def resolve(job):
        notes = []
        request, rest = plan_from_options(job_params(job, defaults), notes)
        for note in notes if log is not None else ():
            log(f"{job.where}: {note}")
        return request, {"resume": rest["resume"], "checkpoint_every": rest["checkpoint_every"]}
    return resolve


@_render_defaults
@click.command()
@click.argument("jobs", type=click.Path(path_type=Path))
@click.option("--out-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the videos of a folder of trajectories go (default: that folder), or those of a "
                   "SANA-WM-Bench split (<scene_id>_generated.mp4; needed).")
@cli_launch.gpus_option("GPUs of this host, one torchrun worker each.")
@click.option("--gpus-per-video", default=1, show_default=True, type=click.IntRange(min=1),
              help="GPUs rendering each video together (2: the guidance branches of full mode on a GPU each).")
@click.option("--summary", "summary_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the summary as JSON to this file.")
@overwrite_option(False, "Render the jobs whose output exists again, replacing it (default: skip them, so a re-run "
                        "resumes the batch).")
@click.option("--skip-bad-jobs", is_flag=True,
              help="Render the good jobs of a jobs file with errors and report the rest (default: refuse it whole).")
@click.option("--shard", default=None, metavar="K/N",
              help="Render the K-th (from 0) of N slices of the jobs, each a run of consecutive jobs (default in a "
                   "Slurm job array: the task's place in the array, SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT).")
@click.option("--executor", default="local", show_default=True, type=click.Choice(["local", "ray"]),
              help="local: this process, or the ranks of --gpus / torchrun; ray: the workers of a Ray cluster (one "
                   "per GPU, or per --gpus-per-video GPUs), each taking the next job as it frees up (needs the ray "
                   "extra).")
@declare(*RAY)
def batch(jobs, out_dir, gpus, gpus_per_video, summary_path, overwrite, skip_bad_jobs, shard, executor, address,
          workers, retries, **defaults):
    """Render many videos: JOBS is a JSON-lines file (one render per line), a folder of trajectories or a
    SANA-WM-Bench split folder (its sanawm_export_v2/run_manifest.jsonl).

    \b
    camrender batch jobs.jsonl --gpus 8 --model PATH
    torchrun --nproc-per-node 8 -m camrender batch paths/ --out-dir renders/ --steps 30
    camrender batch SANA-WM-Bench/SPLIT --preset sana-wm-bench --refiner REFINER --out-dir results/METHOD/SPLIT
    {"trajectory": "a.json", "image": "a.png", "prompt": "...", "output": "a.mp4", "options": {"seed": 1}}

    Every job is checked before the first renders: a jobs file with errors (malformed lines, missing
    inputs, duplicate outputs, a --summary that cannot be written) is refused whole, every error listed
    with its line, exit code 2, nothing rendered (--skip-bad-jobs renders the good ones). A job whose
    output exists is skipped (a re-run resumes); a job that fails while rendering is reported and the
    rest go on; a summary follows (exit code 3 when a job failed). Options given here apply to every job.
    """
    ctx = click.get_current_context()
    if executor == "ray":
        import_ray()  # the extra to install, before anything else
        if gpus is not None or distributed.world_size() > 1:
            raise CamrenderError("--executor ray starts its own workers: without --gpus or torchrun", field="executor")
    refuse_ray_options(executor)
    shard = choose_shard(shard)
    given = {name: value for name, value in defaults.items()
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    progress_style, quiet = defaults.pop("progress"), defaults.pop("quiet")
    given.pop("progress", None), given.pop("quiet", None)
    if summary_path is not None:  # before any job: a summary that cannot be written used to fail after them all
        probe_writable(check_output_path(summary_path))
    job_list = read_jobs(jobs, job_keys(), out_dir)
    check_summary_target(summary_path, jobs, [{**given, **job.values} for job in job_list])
    log = lambda line: click.echo(f"camrender: {line}", err=True)  # noqa: E731
    resolve = resolver(given, log if distributed.is_main_process() else None)
    if cli_launch.wants_launch(gpus):
        if not skip_bad_jobs:  # a bad jobs file is refused here, before any worker starts (they plan again)
            created = []
            with cli_launch.quiet_checks(gpus):
                planned = plan_jobs(job_list, resolve, created, overwrite=overwrite, shard=shard)
            remove_created(created)
            refuse_bad_jobs(planned, jobs, lambda line: click.echo(f"camrender: {line}", err=True))
        if gpus % gpus_per_video:
            raise CamrenderError(f"{gpus_per_video} GPUs per video do not divide {gpus} GPUs", field="gpus-per-video")
        sys.exit(cli_launch.relaunch(gpus, defaults["device"]))
    ranks = None
    if distributed.world_size() > 1:
        ranks = distributed.start(defaults["device"], per_video=gpus_per_video)
    elif gpus_per_video > 1 and executor != "ray":
        raise CamrenderError(f"{gpus_per_video} GPUs per video need that many processes (--gpus or torchrun)",
                             field="gpus-per-video")
    try:
        started = time.perf_counter()
        main = ranks is None or ranks.is_main
        planned, created = None, []
        if main:
            planned = plan_jobs(job_list, resolve, created, overwrite=overwrite, shard=shard)
        planned = distributed.broadcast_object(planned, ranks)
        if not skip_bad_jobs and any(job.status == "failed" for job in planned):
            remove_created(created)
            refuse_bad_jobs(planned, jobs, log if main else lambda line: None)
        planned = [job for job in planned if shard is None or shard.holds(job.index, len(job_list))]
        pending = [job for job in planned if job.status == "render"]
        # a Ray worker's own progress reaches this terminal as Ray's log lines: only when lines were asked for
        style = progress_style if executor != "ray" or progress_style == "lines" else "none"
        with _executor(executor, pending, ranks, log, address=address, workers=workers, per_video=gpus_per_video,
                       retries=retries) as chosen:
            if main:
                unit = getattr(chosen, "unit", None) or _unit(defaults["device"])  # a Ray cluster's: its workers'
                log(f"batch{'' if shard is None else f' (shard {shard})'}: {count(len(planned), 'job')}, "
                    f"{len(pending)} to render on {count(chosen.workers, 'group')} of {count(chosen.per_video, unit)}")
            ran = chosen.run(pending, lambda group: _runner(group, style, quiet))
            if ran is None:
                return
            summary = summarize(planned, ran[0], time.perf_counter() - started, chosen.workers, chosen.per_video,
                                ran[1])
            # said and written before the executor stops: the output is complete while a Ray instance shuts down
            for line in summary_lines(summary):
                log(line)
            if summary_path is not None:
                atomic_write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    finally:
        distributed.stop()
    if summary["failed"]:
        sys.exit(distributed.FAILED_JOBS_EXIT_CODE)


@contextlib.contextmanager
def _executor(name: str, pending: list, ranks, log, *, address, workers, per_video: int, retries: int):
    """The executor of `--executor`: this process or the torchrun ranks ("local"), or a Ray cluster's workers for
    the duration of the block (none started for a batch with nothing to render)."""
    if name != "ray" or not pending:
        yield InProcessExecutor(log) if ranks is None else TorchrunExecutor(ranks, log)
        return
    actors = per_video * min(len(pending), workers or len(pending))
    with ray_cluster(address, num_cpus=local_cpus(actors)):
        yield RayExecutor(pending, log, per_video=per_video, workers=workers, retries=retries)


def _unit(device) -> str:
    """What renders a video's share: a GPU, or the CPU."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    return "GPU" if device != "cpu" and torch.cuda.is_available() else "CPU"


def _runner(ranks, progress_style: str, quiet: bool) -> JobRunner:
    """This process's `JobRunner`: pipelines loaded through the API, each job written with the batch's progress
    display (the leader of a video group shows it) and Ctrl-C / SIGTERM checked between chunks. Called where the
    jobs render (this process, a torchrun rank, a Ray worker): a driver that only hands jobs to Ray workers never
    imports torch or diffusers."""
    quiet_libraries()
    # lazy: keeps `camrender --help` free of torch, diffusers
    from camrender.api.pipeline import CamrenderPipeline

    leader = ranks is None or ranks.is_leader

    def load(settings):
        return CamrenderPipeline.from_pretrained(settings=settings, ranks=ranks)

    def write(pipe, job):
        request = job.request
        progress = make_progress(progress_style if leader else "none",
                                 "step" if request.mode == "full" else "segment", quiet=quiet)
        try:
            return pipe.write(request, progress=progress, resume=job.resume, checkpoint_every=job.checkpoint_every,
                              overwrite=job.overwrite, check=raise_if_signalled).frames
        finally:
            progress.close()

    return JobRunner(load, write, strict=ranks is not None and ranks.per_video > 1)
