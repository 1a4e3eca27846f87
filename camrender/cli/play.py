"""`camrender play`: load the pipeline once, serve the live page (`camrender.play.server`), fly segment mode
with the keyboard and save each flight (torch, diffusers and aiohttp imported inside the command)."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import secrets
import sys
import time
from pathlib import Path

import click

from camrender.api.requests import build_request, check_refiner_options
from camrender.cli.preflight import check_render_options, probe_writable
from camrender.cli.render import _quiet_libraries, given_on_command_line
from camrender.cli.stage_options import cli_spelling, refiner_offload_option, resolve_stage_options, stage_options
from camrender.errors import CamrenderError
from camrender.limits import ROPE_LATENT_FRAMES, TIME_STRIDE, check_finite
from camrender.model.stage1.loading import DEFAULT_MODEL
from camrender.model.stage1.recipes import get_recipe, resolve_recipe
from camrender.trajectory.controls import make_scheme

DEFAULT_PORT = 8765
DEFAULT_SECONDS = 120.0  # the longest flight: its noise is drawn up front (noise of the whole clip)


def longest_clip(seconds: float, fps: float, segment_frames: int) -> int:
    """Video frames of the longest flight: whole segments (1 + segment_frames k latent frames, the layout whose
    first segment every shorter flight shares) covering at least `seconds`, within the RoPE table."""
    segments = max(1, math.ceil((seconds * fps - 1) / (TIME_STRIDE * segment_frames)))
    segments = min(segments, (ROPE_LATENT_FRAMES - 1) // segment_frames)
    return TIME_STRIDE * segment_frames * segments + 1


def resolve_template(options: dict):
    """(the segment-mode `RenderRequest` every flight starts from, with no path yet: the flight steers it;
    the session stem)."""
    check_finite(options["max_seconds"], "max-seconds", minimum=1)
    stem = options["out"] or Path(time.strftime("play-%Y%m%d-%H%M%S"))
    check_refiner_options(options.get("refiner"), given_on_command_line(options), spell=cli_spelling)
    check_render_options({**options, "out": stem.with_name(stem.name + ".mp4"), "fps": None, "offload": False})
    probe_writable(stem.with_name(stem.name + ".mp4"))
    if options["recipe"] is None and options["model"] == "tiny" and options["transformer_weights"] is None:
        recipe = get_recipe("streaming")  # the offline model takes any recipe: the live one
    else:
        recipe = resolve_recipe(options["recipe"], options["transformer_weights"], options["model"])
    if recipe.sampler == "chunk-flow-euler":
        raise CamrenderError("camrender play renders one segment after the other (the streaming recipe); the "
                             "chunk-causal teacher keeps several chunks in flight", field="recipe")
    chunk = options["segment_frames"] or recipe.chunk_frames
    request = build_request(
        None, recipe, model=options["model"], mode="segments", frames=longest_clip(options["max_seconds"], 16.0, chunk),
        cameras=(), image=options["image"], prompt=options["prompt"], negative_prompt=options["negative_prompt"],
        seed=options["seed"], fps=16.0, height=options["height"], width=options["width"], steps=options["steps"],
        guidance=options["guidance"], refiner=options["refiner"], vae=options["vae"], dtype=options["dtype"],
        device=options["device"], transformer_weights=options["transformer_weights"], kernels=options["kernels"],
        allow_missing_weights=options["allow_missing_weights"], segment_frames=options["segment_frames"],
        cached_segments=options["cached_segments"], cuda_graphs=options["cuda_graphs"],
        refiner_offload=options["refiner_offload"], **resolve_stage_options(options, options["device"]))
    return dataclasses.replace(request, cameras=None), stem


@click.command()
@click.option("--image", default=None, type=click.Path(path_type=Path), help="First-frame image.")
@click.option("--prompt", default="", help="Text prompt.")
@click.option("--negative-prompt", default="", help="Negative prompt (only with guidance).")
@click.option("--model", default=DEFAULT_MODEL, show_default=True,
              help="Hub id, local diffusers folder, or 'tiny' (offline random-weight model: frames are noise).")
@click.option("--transformer-weights", default=None, type=click.Path(path_type=Path),
              help="Original-format DiT weights, e.g. SANA-WM_streaming/sana_dit/model.pt.")
@click.option("--vae", default=None, type=click.Path(path_type=Path),
              help="Diffusers VAE folder replacing the pipeline's (the streaming causal VAE).")
@click.option("--recipe", default=None, help="Checkpoint recipe (default: told from the checkpoint; tiny: streaming).")
@click.option("--allow-missing-weights", is_flag=True, help="Run even when --transformer-weights leaves weights unloaded.")
@click.option("--refiner", default="none", show_default=True, help="Stage 2 (a folder, a hub id, 'tiny' or 'none').")
@refiner_offload_option
@stage_options
@click.option("--steps", default=None, type=click.IntRange(min=1), help="Denoising steps (default: the recipe's list).")
@click.option("--guidance", default=None, type=float, help="Classifier-free guidance (default: the recipe's).")
@click.option("--seed", default=0, show_default=True, type=int, help="Noise seed of the first flight (Restart: new).")
@click.option("--height", default=None, type=click.IntRange(min=1), help="Video height (default 704; tiny: 64).")
@click.option("--width", default=None, type=click.IntRange(min=1), help="Video width (default 1280; tiny: 112).")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "bfloat16", "float16", "float32"]))
@click.option("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available).")
@click.option("--kernels", default="fused", show_default=True, type=click.Choice(["fused", "torch"]))
@click.option("--segment-frames", default=None, type=click.IntRange(min=1), help="Latent frames per segment.")
@click.option("--cached-segments", default=None, type=click.IntRange(min=0), help="Recent segments attended to.")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True)
@click.option("--max-seconds", default=DEFAULT_SECONDS, show_default=True, type=click.FloatRange(min=1),
              help="Longest flight in seconds of video (its noise is drawn when it starts).")
@click.option("--pace/--no-pace", default=True, show_default=True,
              help="Keep the render about one segment ahead of real-time playback (--no-pace: as fast as it goes, "
                   "the page buffers; for throughput benchmarks).")
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Saved sessions: OUT.mp4, OUT.traj.json, OUT.render.json, then OUT-2.* after a Restart "
                   "(default: play-DATE-TIME in the current folder).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs the token in the printed URL.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
def play(**options):
    """Fly through the world live: a local web page shows segment mode as it renders, steered by the keyboard.

    \b
    camrender play --image first.png --prompt "..." --transformer-weights SANA-WM_streaming/sana_dit/model.pt
    camrender play --model tiny          # on a CPU: random frames, the whole loop

    Keys (the official demo's): W/S forward/back, A/D yaw, arrows pitch (up/down) and strafe
    (left/right). Stop, closing the page or Ctrl-C saves the flight: OUT.mp4 (as shown),
    OUT.traj.json (the path flown) and OUT.render.json (`camrender render --from-render
    OUT.render.json --out again.mp4` renders the same frames offline).
    """
    if importlib.util.find_spec("aiohttp") is None:
        raise CamrenderError("camrender play needs aiohttp: pip install 'camrender[play]'", field="play")
    # lazy: keeps `camrender --help` free of torch, diffusers and asyncio (30 ms)
    import asyncio

    from camrender.play.listen import check_listen
    from camrender.play.server import PlayServer, is_loopback, serve
    from camrender.render.pipeline import load_patched_pipeline

    check_listen(options["host"], options["port"])
    template, stem = resolve_template(options)
    token = None if is_loopback(options["host"]) else secrets.token_urlsafe(16)
    log = lambda line: click.echo(f"camrender: {line}", err=True)  # noqa: E731
    _quiet_libraries()
    log(f"loading {template.model}")
    pipe = load_patched_pipeline(template, log)
    server = PlayServer(pipe, template, make_scheme("sana-wm"), stem, token=token, log=log, pace=options["pace"])

    def ready(url: str) -> None:
        click.echo(url)
        sys.stdout.flush()
        log(f"open {url} in a browser (from another machine: ssh -L {url.rsplit(':', 1)[1].split('/')[0]}:"
            f"127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]} HOST); Ctrl-C stops")

    asyncio.run(serve(server, options["host"], options["port"], ready))
    saved = [path for files in server.saved for path in files.values()]
    log(f"stopped; {len(saved)} files saved" + (f": {', '.join(saved)}" if saved else ""))
