"""`camrender render`: its options parsed into the Python API's values (`LoadSettings`, `plan_request`'s options)
and one call of `CamrenderPipeline` (torch and diffusers are imported inside the command)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click
from click.core import ParameterSource

from camrender.api.requests import for_ranks, on_video_group, plan_request, prepare_output
from camrender.cli import launch as cli_launch
from camrender.cli.options import LOAD, RENDER, RUN, declare, overwrite_option, split_options
from camrender.cli.path_options import read_prompt_option
from camrender.cli.progress import count, make_progress
from camrender.cli.signals import raise_if_signalled
from camrender.errors import CamrenderError
from camrender.parallel import distributed
from camrender.render.load_settings import REFINER_FIELDS, LoadSettings
from camrender.render.prompt_cache import resolve_cache_dir
from camrender.render.settings_file import read_render_json


def plan_from_options(options: dict, notes: list | None = None):
    """(the request, the command's own options): a render's options (a `render` command's parsed values, a batch
    job's) checked and resolved through the API, nothing loaded or written. `options` may hold `_trajectory` and
    `_controls` (a render file's path and action-scheme record, `apply_render_file`)."""
    source = options.pop("_trajectory", None)
    controls = options.pop("_controls", None)
    read_prompt_option(options)
    load, render, rest = split_options(options)
    if source is None:
        if rest.get("traj") is None:
            raise CamrenderError("give --traj FILE (or --from-render NAME.render.json)", field="traj")
        source = rest["traj"]
    render["prompt_cache"] = resolve_cache_dir(render.get("prompt_cache"))
    settings = LoadSettings.create(**load)
    request = plan_request(settings, source, out=rest.get("out"), controls=controls, notes=notes, **render)
    return request, rest


def given_on_command_line(options: dict) -> set:
    """The names of the current command's `options` the user gave (not left at their defaults)."""
    ctx = click.get_current_context()
    return {name for name in options if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def apply_render_file(options: dict, given: set) -> None:
    """--from-render FILE: the settings and path of FILE (a `NAME.render.json`) for every option not `given` on
    the command line (--prompt-file counts as --prompt); the values go through the options' own types."""
    path = options.pop("from_render", None)
    if path is None:
        return
    if "traj" in given:
        raise CamrenderError("--traj and --from-render exclude each other (the render file holds the path)",
                             field="traj")
    ctx = click.get_current_context()
    settings, options["_trajectory"] = read_render_json(path)
    options["_controls"] = settings.get("controls")  # the action scheme that rolled the path out, if any
    params = {param.name: param for param in ctx.command.params}
    taken = given | ({"prompt"} if "prompt_file" in given else set())
    if settings.get("refiner") is None:  # the refiner's options were recorded at their defaults, not chosen
        taken |= set(REFINER_FIELDS)
    for name, value in settings.items():
        option = "frames" if name == "num_frames" else name
        if option in params and option not in taken:
            try:
                options[option] = params[option].type_cast_value(ctx, value)
            except click.BadParameter as error:
                raise CamrenderError(f"{error.format_message()}", path=path, field=f"settings.{name}") from None


def quiet_libraries() -> None:
    """Hub/offload chatter of diffusers and transformers goes away; our errors say what matters."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    transformers_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(diffusers|transformers|torch)\b")


@click.command()
@click.option("--traj", "traj", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Trajectory file (v1 JSON, RealEstate10K .txt, nerfstudio camera_path.json, COLMAP "
                   "images.txt, transforms.json, SANA-WM NAME_pose.npy) or an action string such as w-100,dw-60.")
@click.option("--from-render", "from_render", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Render again from a NAME.render.json written beside a video (its settings and path; "
                   "options given here win).")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Output video (.mp4).")
@declare(*RENDER, "prompt_file", *LOAD, "resume", "checkpoint_every", *RUN)
@overwrite_option(True, "Replace an existing --out (with a note); --no-overwrite refuses it, as batch does by default.")
@cli_launch.gpus_option("GPUs for this video, started as torchrun workers: full mode with guidance runs its two "
                        "branches on half each; every block's heads split over the GPUs of a branch (segment mode: "
                        "over all).")
def render(**options):
    """Render a video along a camera path.

    \b
    camrender --traj trajectories/orbit.json --out orbit.mp4 --model tiny
    camrender render --traj path.json --image first.png --prompt "..." --out video.mp4

    Writes VIDEO.mp4 (H.264), VIDEO.traj.json (the resolved trajectory: prompt, image, seed,
    frames), VIDEO.render.json (every setting plus the path: --from-render renders the same
    video) and VIDEO.path.png (a plot of the path). Segment mode saves checkpoints; after an
    interruption, the same command with --resume continues it.
    """
    apply_render_file(options, given_on_command_line(options))
    notes = []
    gpus = options["gpus"]
    with cli_launch.quiet_checks(gpus):  # their warnings come once, from rank 0
        request, rest = plan_from_options(options, notes)
        if gpus is not None and gpus > 1:  # what the split rules out, checked before any worker starts
            prepare_output(on_video_group(request, gpus), resume=rest["resume"],
                           checkpoint_every=rest["checkpoint_every"], leader=False)
    if cli_launch.wants_launch(gpus):  # one host, several GPUs: torchrun's workers run this command again
        sys.exit(cli_launch.relaunch(gpus, request.settings.device))
    ranks = distributed.start(request.settings.device) if distributed.world_size() > 1 else None
    request = for_ranks(request, ranks)
    leader = ranks is None or ranks.is_leader
    quiet = rest["quiet"]
    log = lambda line: click.echo(f"camrender: {line}", err=True) if leader and not quiet else None  # noqa: E731
    prepared = prepare_output(request, resume=rest["resume"], checkpoint_every=rest["checkpoint_every"],
                              overwrite=rest["overwrite"], log=log, leader=leader)
    for note in notes:
        log(note)
    bar = None
    try:
        quiet_libraries()
        log(f"loading {request.settings.model}")
        # lazy: keeps `camrender --help` free of torch, diffusers
        from camrender.api.pipeline import CamrenderPipeline

        pipe = CamrenderPipeline.from_pretrained(settings=request.settings, ranks=ranks, log=log, prepare=request)
        bar = make_progress(rest["progress"] if leader else "none", "step" if request.mode == "full" else "segment",
                            quiet=quiet)  # its clock starts now
        result = pipe.write(request, progress=bar, prepared=prepared, check=raise_if_signalled)
    finally:
        if bar is not None:
            bar.close()
        prepared.release()  # the output's claim, held since before the model loaded
        distributed.stop()
    log(f"wrote {request.out} ({count(result.frames, 'frame')}, {request.width}x{request.height}, {request.fps:g} fps) "
        f"and {', '.join(str(p) for p in result.side_files)}")


COMMANDS = [render]
