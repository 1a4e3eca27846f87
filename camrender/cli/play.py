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

from camrender.api.requests import plan_request
from camrender.cli.options import LOAD, declare, split_options
from camrender.cli.render import quiet_libraries
from camrender.errors import CamrenderError
from camrender.files import check_output_path, probe_writable
from camrender.limits import ROPE_LATENT_FRAMES, TIME_STRIDE, check_finite
from camrender.render.load_settings import LoadSettings
from camrender.model.stage1.recipes import get_recipe
from camrender.render.prompt_cache import resolve_cache_dir
from camrender.trajectory.controls import make_scheme
from camrender.vocabulary import TINY

DEFAULT_PORT = 8765
DEFAULT_SECONDS = 120.0  # the longest flight: its noise is drawn up front (noise of the whole clip)
PLAY_LOAD = tuple(name for name in LOAD if name != "offload")  # the live page renders on one GPU, resident


def longest_clip(seconds: float, fps: float, segment_frames: int) -> int:
    """Video frames of the longest flight: whole segments (1 + segment_frames k latent frames, the layout whose
    first segment every shorter flight shares) covering at least `seconds`, within the RoPE table."""
    segments = max(1, math.ceil((seconds * fps - 1) / (TIME_STRIDE * segment_frames)))
    segments = min(segments, (ROPE_LATENT_FRAMES - 1) // segment_frames)
    return TIME_STRIDE * segment_frames * segments + 1


def resolve_template(options: dict):
    """(the segment-mode `RenderRequest` every flight starts from, with no path yet: the flight steers it;
    the session stem)."""
    stem = options.pop("out") or Path(time.strftime("play-%Y%m%d-%H%M%S"))
    video = stem.with_name(stem.name + ".mp4")
    check_output_path(video)
    probe_writable(video)
    if options["recipe"] is None and options["model"] == TINY and options["transformer_weights"] is None:
        options["recipe"] = "streaming"  # the offline model takes any recipe: the live one
    load, render, rest = split_options(options)
    settings = LoadSettings.create(**load)
    recipe = get_recipe(settings.recipe)
    if recipe.sampler == "chunk-flow-euler":
        raise CamrenderError("camrender play renders one segment after the other (the streaming recipe); the "
                             "chunk-causal teacher keeps several chunks in flight", field="recipe")
    check_finite(rest["max_seconds"], "max-seconds", minimum=1.0)
    chunk = render["segment_frames"] or recipe.chunk_frames
    render["prompt_cache"] = resolve_cache_dir(render.get("prompt_cache"))
    request = plan_request(settings, (), mode="segments", frames=longest_clip(rest["max_seconds"], 16.0, chunk),
                           fps=16.0, **render)
    return dataclasses.replace(request, cameras=None), stem, rest


@click.command()
@declare("image", "prompt", "negative_prompt", *PLAY_LOAD, "steps", "guidance", "seed", "height", "width",
         "segment_frames", "cached_segments", "prompt_cache")
@click.option("--max-seconds", default=DEFAULT_SECONDS, show_default=True, type=float,
              help="Longest flight in seconds of video (its noise is drawn when it starts).")
@click.option("--pace/--no-pace", default=True, show_default=True,
              help="Keep the render about one segment ahead of real-time playback (--no-pace: as fast as it goes, "
                   "the page buffers; for throughput benchmarks).")
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Saved flights: OUT.mp4, OUT.traj.json, OUT.render.json, then OUT-2.* after a Restart "
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

    from camrender.api.pipeline import CamrenderPipeline
    from camrender.play.listen import check_listen
    from camrender.play.server import PlayServer, is_loopback, serve

    check_listen(options["host"], options["port"])
    template, stem, rest = resolve_template(options)
    token = None if is_loopback(rest["host"]) else secrets.token_urlsafe(16)
    log = lambda line: click.echo(f"camrender: {line}", err=True)  # noqa: E731
    quiet_libraries()
    log(f"loading {template.settings.model}")
    pipe = CamrenderPipeline.from_pretrained(settings=template.settings, log=log, prepare=template)
    server = PlayServer(pipe.pipe, template, make_scheme("sana-wm"), stem, token=token, log=log, pace=rest["pace"])

    def ready(url: str) -> None:
        click.echo(url)
        sys.stdout.flush()
        log(f"open {url} in a browser (from another machine: ssh -L {url.rsplit(':', 1)[1].split('/')[0]}:"
            f"127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]} HOST); Ctrl-C stops")

    asyncio.run(serve(server, rest["host"], rest["port"], ready))
    saved = [path for files in server.saved for path in files.values()]
    log(f"stopped; {len(saved)} files saved" + (f": {', '.join(saved)}" if saved else ""))
