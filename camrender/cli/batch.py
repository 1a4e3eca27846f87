"""`camrender batch JOBS`: render many videos, spread over the GPUs of a torchrun run (`camrender.cli.batch_jobs`)."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import click

from camrender.cli import batch_jobs as batching
from camrender.cli import launch as cli_launch
from camrender.cli.preflight import probe_writable
from camrender.cli.progress import count, make_progress
from camrender.cli.render import _quiet_libraries, _resolve_request, render
from camrender.cli.signals import raise_if_signalled
from camrender.errors import CamrenderError
from camrender.files import atomic_write_text, check_output_path
from camrender.output.targets import check_summary_target
from camrender.parallel import distributed

_RUN_OPTIONS = {"traj", "out", "gpus"}  # render options a batch does not take as defaults
# --progress and --quiet are the batch's own (every job's progress shows the same way)


def _render_defaults(command):
    """`batch` takes every `camrender render` option, as the default of each job."""
    for param in render.params:
        if param.name not in _RUN_OPTIONS:
            command.params.append(copy.copy(param))
    return command


@_render_defaults
@click.command()
@click.argument("jobs", type=click.Path(path_type=Path))
@click.option("--out-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the videos of a folder of trajectories go (default: that folder).")
@cli_launch.gpus_option("GPUs of this host, one torchrun worker each.")
@click.option("--gpus-per-video", default=1, show_default=True, type=click.IntRange(min=1),
              help="GPUs rendering each video together (2: the guidance branches of full mode on a GPU each).")
@click.option("--summary", "summary_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the summary as JSON to this file.")
@click.option("--skip-bad-jobs", is_flag=True,
              help="Render the good jobs of a jobs file with errors and report the rest (default: refuse it whole).")
def batch(jobs, out_dir, gpus, gpus_per_video, summary_path, skip_bad_jobs, **defaults):
    """Render many videos: JOBS is a JSON-lines file (one render per line) or a folder of trajectories.

    \b
    camrender batch jobs.jsonl --gpus 8 --model PATH
    torchrun --nproc-per-node 8 -m camrender batch paths/ --out-dir renders/ --steps 30
    {"trajectory": "a.json", "image": "a.png", "prompt": "...", "output": "a.mp4", "options": {"seed": 1}}

    Every job is checked before the first renders: a jobs file with errors (malformed lines, missing
    inputs, duplicate outputs, a --summary that cannot be written) is refused whole, every error listed
    with its line, exit code 2, nothing rendered (--skip-bad-jobs renders the good ones). A job whose
    output exists is skipped (a re-run resumes); a job that fails while rendering is reported and the
    rest go on; a summary follows (exit code 3 when a job failed). Options given here apply to every job.
    """
    # lazy: keeps `camrender --help` free of torch, diffusers
    from camrender.api.output import write_video
    from camrender.render.pipeline import load_patched_pipeline

    given = {name: value for name, value in defaults.items()
             if click.get_current_context().get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    progress_style, quiet = defaults.pop("progress"), defaults.pop("quiet")
    given.pop("progress", None), given.pop("quiet", None)
    if summary_path is not None:  # before any job: a summary that cannot be written used to fail after them all
        probe_writable(check_output_path(summary_path))
    job_list = batching.read_jobs(jobs, render, out_dir)
    check_summary_target(summary_path, jobs, [{**given, **job.values} for job in job_list])
    if cli_launch.wants_launch(gpus):
        if not skip_bad_jobs:  # a bad jobs file is refused here, before any worker starts (they plan again)
            created = []
            with cli_launch.quiet_checks(gpus):
                planned = batching.plan_jobs(job_list, render, given, _resolve_request, created)
            batching.remove_created(created)
            batching.refuse_bad_jobs(planned, jobs, lambda line: click.echo(f"camrender: {line}", err=True))
        if gpus % gpus_per_video:
            raise CamrenderError(f"{gpus_per_video} GPUs per video do not divide {gpus} GPUs", field="gpus-per-video")
        sys.exit(cli_launch.relaunch(gpus, defaults["device"]))
    ranks = None
    if distributed.world_size() > 1:
        ranks = distributed.start(defaults["device"], per_video=gpus_per_video)
    elif gpus_per_video > 1:
        raise CamrenderError(f"{gpus_per_video} GPUs per video need that many processes (--gpus or torchrun)",
                             field="gpus-per-video")
    log = lambda line: click.echo(f"camrender: {line}", err=True)  # noqa: E731
    try:
        _quiet_libraries()
        started = time.perf_counter()
        planned, created = None, []
        if ranks is None or ranks.is_main:
            planned = batching.plan_jobs(job_list, render, given, _resolve_request, created)
        planned = distributed.broadcast_object(planned, ranks)
        if not skip_bad_jobs and any(job.status == "failed" for job in planned):
            batching.remove_created(created)
            batching.refuse_bad_jobs(planned, jobs, log if ranks is None or ranks.is_main else lambda line: None)
        if ranks is None or ranks.is_main:
            to_render = sum(job.status == "render" for job in planned)
            groups = 1 if ranks is None else ranks.num_videos
            log(f"batch: {count(len(planned), 'job')}, {to_render} to render on {count(groups, 'group')} of "
                f"{count(gpus_per_video, 'GPU')}")
        pipelines = batching.Pipelines(load_patched_pipeline)
        leader = ranks is None or ranks.is_leader

        def write(pipe, request):
            progress = make_progress(progress_style if leader else "none", "step" if request.mode == "full"
                                     else "segment", quiet=quiet)
            try:
                return write_video(pipe, request, progress, check=raise_if_signalled)[0]
            finally:
                progress.close()

        results = batching.run_jobs(planned, ranks, pipelines, write, log)
        gathered = distributed.gather_objects((results, pipelines.loads), ranks)
        if gathered is None:
            return
        summary = batching.summarize(planned, [r for rank_results, _ in gathered for r in rank_results],
                                     time.perf_counter() - started, ranks, [loads for _, loads in gathered])
    finally:
        distributed.stop()
    for line in batching.summary_lines(summary):
        log(line)
    if summary_path is not None:
        atomic_write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    if summary["failed"]:
        sys.exit(distributed.FAILED_JOBS_EXIT_CODE)
