"""`camrender eval`: did the video follow the camera? SANA-WM-Bench's metrics for one video or a results folder
(`camrender.eval`; docs/eval.md). No model import; the estimator loads only once the inputs are checked."""
from __future__ import annotations

import os
import sys

import click

from camrender.cli.options import RUN, declare
from camrender.cli.progress import count, make_progress
from camrender.errors import CamrenderError
from camrender.eval.backends import BACKENDS, DEFAULT_BACKEND
from camrender.eval.sampling import SKIP_CHOICES
from camrender.files import check_output_path

FAILED_ESTIMATE_EXIT_CODE = 3  # everything was read and written, and some estimate failed (the report says why)
AGGREGATE_NAME = "eval_aggregate.json"


@click.command("eval")
@click.argument("target", type=click.Path())
@click.option("--traj", default=None, type=click.Path(dir_okay=False),
              help="The path the video was asked to follow (default: NAME.traj.json beside NAME.mp4, as a render "
                   "writes it).")
@click.option("--manifest", default=None, type=click.Path(),
              help="For a results folder of <scene_id>_generated.mp4: the SANA-WM-Bench split folder or its "
                   "run_manifest.jsonl.")
@click.option("--interval", default=4, show_default=True, type=click.IntRange(min=1),
              help="Score every N-th frame (the benchmark's 4).")
@click.option("--backend", default=DEFAULT_BACKEND, show_default=True, type=click.Choice(BACKENDS),
              help="Pose estimator: colmap (pycolmap, CPU, no weights) or pi3 (the benchmark's; needs Pi3 and "
                   "its weights).")
@click.option("--pi3-weights", default=None, help="Pi3's weights: a hub id, a folder or a file (default yyfz233/Pi3).")
@click.option("--skip-first-frame", "skip_choice", default="auto", show_default=True,
              type=click.Choice(SKIP_CHOICES),
              help="Leave frame 0 out (auto: when the video was refined, per NAME.render.json or ../method_info.json).")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="The report: NAME.eval.json beside a video; for a folder the table's JSON (default "
                   f"RESULTS/{AGGREGATE_NAME}, the markdown beside it as .md).")
@click.option("--rescore", is_flag=True, help="Folder: score again the videos whose NAME.eval.json is up to date.")
@declare(*RUN)
def command(target, traj, manifest, interval, backend, pi3_weights, skip_choice, out, rescore, progress, quiet):
    """Score how well a video follows its camera path: RotErr, TransErr_rel, CamMC_rel, revisit PSNR / SSIM.

    \b
    camrender eval out/orbit.mp4                          # against out/orbit.traj.json
    camrender eval video.mp4 --traj path.json --backend pi3
    camrender eval results/my_method/simple_60s --manifest SANA-WM-Bench/benchmark_v2_smooth_60s

    Bad input (an unreadable video, a video and path of different lengths, a path of fewer than 3 poses, a
    manifest row pointing at a missing file, a backend that is not installed) is one line, exit code 2,
    nothing written. A failed estimate is reported as such, exit code 3.
    """
    say = (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))
    progress = make_progress(progress, "frame", quiet=quiet)
    if os.path.isdir(target):
        failed = _folder(target, traj, manifest, out, rescore, interval, backend, pi3_weights, skip_choice, progress,
                         say)
    else:
        failed = _video(target, traj, manifest, out, interval, backend, pi3_weights, skip_choice, progress, say)
    progress.close()
    if failed:
        sys.exit(FAILED_ESTIMATE_EXIT_CODE)


def _estimator(backend, pi3_weights):
    from camrender.eval.backends import load_backend

    return load_backend(backend, pi3_weights=pi3_weights)


def _video(video, traj_path, manifest, out, interval, backend, pi3_weights, skip_choice, progress, say) -> bool:
    from camrender.eval import report
    from camrender.eval.picture import plot_score
    from camrender.eval.revisit import Lpips
    from camrender.eval.score import prepare, score
    from camrender.trajectory import load

    if manifest is not None:
        raise CamrenderError("--manifest goes with a results folder, not a video", path=video, field="manifest")
    if not os.path.exists(video):
        raise CamrenderError("file not found", path=video, field="video")
    out = out or report.default_output(video)
    check_output_path(out)
    check_output_path(report.picture_path(out))
    if traj_path is None:
        traj_path = os.path.splitext(video)[0] + ".traj.json"
        if not os.path.isfile(traj_path):
            raise CamrenderError(f"no --traj given and no {os.path.basename(traj_path)} beside the video", path=video,
                                 field="traj")
    job = prepare(video, load(traj_path), interval=interval, skip_choice=skip_choice)
    estimator = _estimator(backend, pi3_weights)
    say(f"camrender: eval: {count(len(job.plan), 'frame')} of {video} with {backend} (every {interval}, "
        f"frame 0 {'skipped' if job.plan.skip_first_frame else 'kept'}: {job.skip_reason})")
    result = score(job, estimator, lpips=Lpips(), progress=progress)
    record = report.video_record(result)
    written = [out]
    if result.errors is not None:
        plot_score(result, report.picture_path(out), f"{os.path.basename(video)}: {report.summary_line(record)}")
        written.append(report.picture_path(out))
    report.write_record(record, out)
    for note in record["notes"]:
        say(f"camrender: note: {note}")
    click.echo(f"{video}: {report.summary_line(record)}")
    say(f"camrender: wrote {' and '.join(written)}")
    return result.status != "scored"


def _folder(results, traj, manifest, out, rescore, interval, backend, pi3_weights, skip_choice, progress, say) -> bool:
    import json

    from camrender.eval.aggregate import aggregate_record, markdown
    from camrender.eval.folder import plan_folder, score_folder
    from camrender.eval.revisit import Lpips
    from camrender.files import atomic_write_text

    if traj is not None:
        raise CamrenderError("--traj goes with a video; a results folder takes --manifest", path=results, field="traj")
    if manifest is None:
        raise CamrenderError("a results folder needs --manifest (a SANA-WM-Bench split folder or its "
                             "run_manifest.jsonl)", path=results, field="manifest")
    out = out or os.path.join(results, AGGREGATE_NAME)
    table = os.path.splitext(out)[0] + ".md"
    check_output_path(out)
    check_output_path(table)
    plan = plan_folder(results, manifest, interval=interval, skip_choice=skip_choice)
    estimator = _estimator(backend, pi3_weights)
    say(f"camrender: eval: {count(len(plan.jobs), 'video')} of {plan.method}/{plan.split} with {backend}"
        + (f" ({count(len(plan.missing), 'scene')} of the manifest without a video)" if plan.missing else ""))
    # a bar per video stage would be redrawn between the estimator's: bars count videos, log lines say all
    frames_progress = progress if progress.style == "lines" else None
    video_progress = make_progress(progress.style, "video")
    records = score_folder(plan, estimator, lpips=Lpips(), rescore=rescore, progress=frames_progress,
                           video_progress=video_progress)
    video_progress.close()
    skips = {job.plan.skip_first_frame for job in plan.jobs}
    settings = {"backend": backend, "interval": interval,
                "skip_first_frame": skips.pop() if len(skips) == 1 else "mixed"}
    aggregate = aggregate_record(plan.method, plan.split, records, plan.missing, settings)
    atomic_write_text(out, json.dumps({"records": [aggregate]}, indent=1, allow_nan=False) + "\n")
    atomic_write_text(table, markdown([aggregate]))
    camera = aggregate.get("camera")
    if camera:
        click.echo(f"{plan.method}/{plan.split}: RotErr {camera['rot_err_deg']:.3f} deg, TransErr_rel "
                   f"{camera['trans_err_rel']:.4f}, CamMC_rel {camera['cam_mc_rel']:.4f} over "
                   f"{count(camera['n_scenes'], 'video')}")
    failed = aggregate["videos"]["failed"]
    if failed:
        click.echo(f"{count(len(failed), 'failed estimate')}: {', '.join(failed)}")
    say(f"camrender: wrote {out} and {table}")
    return bool(failed)
