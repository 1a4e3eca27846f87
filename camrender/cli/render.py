"""`camrender render`: options, their resolution into a `RenderRequest`, and the video it writes
(torch/diffusers imported inside the command)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click
from click.core import ParameterSource

from camrender import trajectory
from camrender.api.requests import build_request, check_refiner_options
from camrender.cli import path_options
from camrender.cli import launch as cli_launch
from camrender.cli.preflight import (
    check_checkpoint_every, check_noise_frames, check_render_options, probe_writable)
from camrender.cli.progress import count, make_progress
from camrender.cli.progress import STYLES as PROGRESS_STYLES
from camrender.cli.signals import raise_if_signalled
from camrender.cli.stage_options import cli_spelling, refiner_offload_option, resolve_stage_options, stage_options
from camrender.errors import CamrenderError
from camrender.files import check_output_path
from camrender.limits import check_frames
from camrender.output.targets import check_output_names, claim_output
from camrender.model.stage1.loading import DEFAULT_MODEL
from camrender.model.stage1.recipes import (RECIPES, guidance_words, per_recipe, recent_words, resolve_recipe,
                                            steps_words)
from camrender.parallel import distributed
from camrender.parallel.cfg import check_split
from camrender.render.inputs import open_image
from camrender.output.resume_check import check_resume
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY
from camrender.render.settings_file import read_render_json


def _resolve_request(options: dict, notes: list | None = None):
    """The options' `RenderRequest`: the path (file, action string, --from-render's) loaded and checked,
    then `camrender.api.requests.build_request` (the defaults of the Python API).

    Notes for the user (a re-timed path) go to `notes` when given, so that the caller can say them
    after its own checks (an error stays one line); else straight to stderr.

    Everything a user can get wrong is checked here, before the model loads; nothing is written.
    """
    path_options.resolve_prompt(options)
    check_render_options(options)
    out = check_output_path(options["out"])
    check_output_names(out)
    probe_writable(out)
    recipe = resolve_recipe(options["recipe"], options["transformer_weights"], options["model"])
    if options["mode"] is None:
        options["mode"] = recipe.mode
    if options["frames"] is not None:
        check_frames(options["frames"], options["mode"])
    loaded, controls = path_options.resolve_path(options, notes)  # validated; --from-render's if given
    image = options["image"] if options["image"] is not None else loaded.image
    if image is not None:
        size = open_image(image).size  # missing/unreadable -> CamrenderError now, not after the model loads
        if abs(size[0] / size[1] - loaded.width / loaded.height) > 0.01 * loaded.width / loaded.height:
            click.echo(f"camrender: warning: the image is {size[0]}x{size[1]} but the trajectory's intrinsics are "
                       f"for {loaded.width}x{loaded.height}; both are cover-cropped to the video separately", err=True)
    elif options["model"] != "tiny":
        raise CamrenderError("SANA-WM needs a first-frame image: pass --image or set \"image\" in the trajectory",
                             path=options["traj"], field="image")
    request = build_request(
        loaded, recipe, model=options["model"], mode=options["mode"], frames=options["frames"], image=image,
        prompt=options["prompt"], negative_prompt=options["negative_prompt"], seed=options["seed"],
        fps=options["fps"], height=options["height"], width=options["width"], steps=options["steps"],
        guidance=options["guidance"], refiner=options["refiner"], vae=options["vae"], dtype=options["dtype"],
        device=options["device"], offload=options["offload"], transformer_weights=options["transformer_weights"],
        kernels=options["kernels"], allow_missing_weights=options["allow_missing_weights"],
        segment_frames=options["segment_frames"], cached_segments=options["cached_segments"],
        cuda_graphs=options["cuda_graphs"], refiner_offload=options["refiner_offload"], controls=controls, out=out,
        noise_frames=options["noise_frames"], **resolve_stage_options(options, options["device"]))
    check_noise_frames(request.noise_frames, request.num_frames)
    if request.num_frames != loaded.num_frames:
        note = (f"{trajectory.resample.frames_note(loaded.num_frames, request.num_frames, options['frames'])} "
                f"({recipe.frame_stride}k+1, the {recipe.name} recipe's frame counts)")
        if notes is None:
            click.echo(f"camrender: {note}", err=True)
        else:
            notes.append(note)
    return request


def given_on_command_line(options: dict) -> set:
    """The names of the current command's `options` the user gave (not left at their defaults)."""
    ctx = click.get_current_context()
    return {name for name in options if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def _apply_render_file(options: dict) -> None:
    """--from-render FILE: the settings and path of FILE (a `NAME.render.json`) for every option
    not given on the command line; the values go through the options' own types (checked)."""
    path = options.pop("from_render")
    if path is None:
        if options["traj"] is None:
            raise CamrenderError("give --traj FILE (or --from-render NAME.render.json)", field="traj")
        return
    ctx = click.get_current_context()
    given = given_on_command_line(options)
    if "prompt_file" in given:  # the file's prompt given here wins over the render file's, as --prompt would
        given.add("prompt")
    if "traj" in given:
        raise CamrenderError("--traj and --from-render exclude each other (the render file holds the path)",
                             field="traj")
    settings, options["_trajectory"] = read_render_json(path)
    options["_controls"] = settings.get("controls")  # the action scheme that rolled the path out, if any
    params = {param.name: param for param in ctx.command.params}
    for name, value in settings.items():
        option = "frames" if name == "num_frames" else name
        if option in params and option not in given:
            try:
                options[option] = params[option].type_cast_value(ctx, value)
            except click.BadParameter as error:
                raise CamrenderError(f"{error.format_message()}", path=path, field=f"settings.{name}") from None


def _quiet_libraries() -> None:
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
@click.option("--prompt", default=None, help="Text prompt (default: the trajectory's).")
@click.option("--negative-prompt", default=None, help="Negative prompt (default: the trajectory's, else empty).")
@click.option("--image", default=None, type=click.Path(path_type=Path),
              help="First-frame image (default: the trajectory's).")
@path_options.render_options
@click.option("--steps", default=None, type=click.IntRange(min=1),
              help=f"Denoising steps (default: the recipe's: {per_recipe(steps_words)}; tiny full mode: 10).")
@click.option("--guidance", default=None, type=float,
              help=f"Classifier-free guidance, <= 1: off (default: the recipe's: {per_recipe(guidance_words)}).")
@click.option("--seed", default=None, type=int, help="Noise seed (default: the trajectory's, else 0).")
@click.option("--frames", default=None, type=click.IntRange(min=1),
              help=f"Video frames, the recipe's {per_recipe(lambda recipe: f'{recipe.frame_stride}k+1')} (default: "
                   "the path re-timed to the nearest; see README).")
@click.option("--fps", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Output frame rate (default: the trajectory's).")
@click.option("--height", default=None, type=click.IntRange(min=1), help="Video height (default 704; tiny: 64).")
@click.option("--width", default=None, type=click.IntRange(min=1), help="Video width (default 1280; tiny: 112).")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help="Hub id, local diffusers folder, or 'tiny' (offline random-weight model: frames are noise).")
@click.option("--dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "bfloat16", "float16", "float32"]), help="auto: bf16 on GPU, fp32 on CPU.")
@click.option("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available).")
@click.option("--offload", is_flag=True, help="Model CPU offload: components visit the GPU only while they run.")
@click.option("--transformer-weights", default=None, type=click.Path(path_type=Path),
              help="Original-format DiT weights (.safetensors or .pt) loaded over the transformer.")
@click.option("--recipe", default=None,
              help=f"Checkpoint recipe: {', '.join(RECIPES)} (default: told from the checkpoint; the README's "
                   "recipe table says what each reproduces).")
@click.option("--allow-missing-weights", is_flag=True,
              help="Render even when --transformer-weights leaves transformer weights unloaded.")
@click.option("--vae", default=None, type=click.Path(path_type=Path),
              help="Diffusers VAE folder replacing the pipeline's, e.g. SANA-WM_streaming/ltx2_causal_vae.")
@click.option("--kernels", default="fused", show_default=True, type=click.Choice(["fused", "torch"]),
              help="fused: Triton kernels, stage 1 and the refiner (PyTorch on CPU); torch: stage 1 on the "
                   "kernels' PyTorch references, the refiner on diffusers' own block code.")
@click.option("--mode", default=None, type=click.Choice(["full", "segments"]),
              help="full: whole clip at once; segments: segment by segment with cached state "
                   f"(default: the recipe's: {per_recipe(lambda recipe: recipe.mode)}).")
@click.option("--segment-frames", default=None, type=click.IntRange(min=1),
              help="Latent frames per segment after the first (segments mode; default: the recipe's: "
                   f"{per_recipe(lambda recipe: str(recipe.chunk_frames))}).")
@click.option("--cached-segments", default=None, type=click.IntRange(min=0),
              help="Recent segments besides the first the softmax blocks attend to (segments mode; default: "
                   f"the recipe's: {per_recipe(recent_words)}).")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
              help="Replay the denoising passes as CUDA graphs (CUDA only, not with --offload).")
@click.option("--resume", is_flag=True,
              help="Segment mode: continue an interrupted render of the same command from its checkpoint.")
@click.option("--checkpoint-every", default=DEFAULT_CHECKPOINT_EVERY, show_default=True,
              type=click.FloatRange(min=0), help="Segment mode: seconds between checkpoints (0: every segment).")
@click.option("--refiner", default="none", show_default=True,
              help="Stage 2: the SANA-WM refiner (a folder such as SANA-WM_streaming/refiner_diffusers, a hub id, "
                   "'tiny' with --model tiny, or 'none').")
@refiner_offload_option
@click.option("--noise-frames", default=None, type=click.IntRange(min=1), hidden=True,
              help="Latent frames of the noise draw, the clip keeping the first (a live session's render file).")
@click.option("--progress", "progress", default="auto", show_default=True, type=click.Choice(PROGRESS_STYLES),
              help="bar: progress bars; lines: one line per segment, per denoising step at most one every 5 s, with "
                   "stage, counts, rate and ETA (for logs); auto: bar on a terminal, else lines; none: no progress.")
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors: no progress, no loading or done lines.")
@stage_options
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
    given = given_on_command_line(options)
    _apply_render_file(options)
    # after the render file: its refiner counts
    check_refiner_options(options.get("refiner"), given, spell=cli_spelling)
    resume, checkpoint_every = options.pop("resume"), options.pop("checkpoint_every")
    check_checkpoint_every(checkpoint_every)
    gpus = options.pop("gpus")
    progress_style, quiet = options.pop("progress"), options.pop("quiet")
    notes = []
    with cli_launch.quiet_checks(gpus):  # their warnings come once, from rank 0
        request = _resolve_request(options, notes)
    if request.refiner is not None and resume:
        raise CamrenderError("--resume does not work with --refiner yet (the refiner's state is not checkpointed)",
                             field="resume")
    if request.recipe == "chunk-causal" and resume:
        raise CamrenderError("--resume does not work with the chunk-causal recipe (several chunks are in flight at "
                             "every boundary)", field="resume")
    if resume and request.mode == "segments" and max(gpus or 1, distributed.world_size()) > 1:
        raise CamrenderError("--resume does not work with several GPUs per video in segment mode yet (each GPU "
                             "holds its own heads' state; split renders keep no checkpoint)", field="resume")
    if cli_launch.wants_launch(gpus):  # one host, several GPUs: torchrun's workers run this command again
        check_split(request.mode, request.guidance, gpus)
        sys.exit(cli_launch.relaunch(gpus, request.device))
    ranks = cli_launch.join_render(request)  # under torchrun: this rank's group and GPU; None on one process
    leader = ranks is None or ranks.is_leader
    if leader:  # held until the command ends: a second render of this output refuses before anything loads
        click.get_current_context().with_resource(claim_output(request.out))
    log = lambda line: click.echo(f"camrender: {line}", err=True) if leader and not quiet else None  # noqa: E731
    resume_info = check_resume(request, resume, log) if leader else None  # before the model loads
    for note in notes:
        log(note)
    unit = "step" if request.mode == "full" else "segment"
    bar = None
    try:
        _quiet_libraries()
        log(f"loading {request.model}")
        # lazy: keeps `camrender --help` free of torch, diffusers
        from camrender.render.pipeline import load_patched_pipeline

        pipe = load_patched_pipeline(request, log, skip_cached_encoders=True)
        from camrender.api.output import write_video

        bar = make_progress(progress_style if leader else "none", unit, quiet=quiet)  # its clock starts now
        frames, companions = write_video(pipe, request, bar, resume_info=resume_info,
                                         checkpoint_every=checkpoint_every, log=log, check=raise_if_signalled)
    finally:
        if bar is not None:
            bar.close()
        distributed.stop()
    log(f"wrote {request.out} ({count(frames, 'frame')}, {request.width}x{request.height}, {request.fps:g} fps) and "
        f"{', '.join(str(p) for p in companions)}")


COMMANDS = [render]
