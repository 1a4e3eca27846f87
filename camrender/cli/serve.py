"""`camrender serve`: its options parsed into `LoadSettings`, the job rules and the server's configuration, the
pipeline loaded once, and the video job API served (`camrender.serve`; torch, diffusers and aiohttp imported
inside the command)."""
from __future__ import annotations

import contextlib
import importlib.util
import math
import re
import secrets
import sys
from pathlib import Path

import click

from camrender.api.requests import check_checkpoint_every
from camrender.batch.ray_executor import import_ray
from camrender.cli.options import LOAD, RAY, declare, refuse_ray_options, split_options
from camrender.cli.render import quiet_libraries
from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.render.prompt_cache import resolve_cache_dir

DEFAULT_PORT = 8000
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# seconds the renders get to reach their next step when the server stops; then their jobs are queued again all the
# same and the process exits
STOP_GRACE_S = 10.0
MIB = 1 << 20


def duration_seconds(text: str, field: str = "keep") -> float:
    """"7d", "12h", "30m", "90s" or a number of seconds -> seconds (CamrenderError naming `field` otherwise)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not found or float(found.group(1)) <= 0:
        raise CamrenderError(f"must be a positive duration such as 7d, 12h, 30m or 90s, got {text!r}", field=field)
    return float(found.group(1)) * UNITS[found.group(2) or "s"]


def read_token(path: Path) -> str:
    """The bearer token in `path` (its first line, stripped)."""
    try:
        token = path.read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CamrenderError(f"cannot read the token: {getattr(error, 'strerror', None) or error}", path=path,
                             field="token-file") from None
    if not token or len(token[0].strip()) < 16:
        raise CamrenderError("must hold a token of at least 16 characters on its first line", path=path,
                             field="token-file")
    return token[0].strip()


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise CamrenderError(f"must be a positive number, got {value:g}", field=name)
    return value


@click.command()
@declare(*LOAD)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs a bearer token (--token-file, else one is "
                   "generated and printed).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="0: a free port (the URL printed says which).")
@click.option("--store", default="camrender-store", show_default=True, type=click.Path(path_type=Path),
              help="Folder of the job store: jobs.sqlite3, and each job's uploads and video.")
@click.option("--keep", default="7d", show_default=True,
              help="How long a finished job and its video stay: 7d, 12h, 30m, 90s.")
@click.option("--token-file", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="File whose first line is the bearer token clients send (Authorization: Bearer TOKEN).")
@click.option("--max-queue", default=100, show_default=True, type=click.IntRange(min=1),
              help="Jobs waiting at most; a submission beyond is answered 429.")
@click.option("--max-body-mb", default=64.0, show_default=True, type=float,
              help="Largest request body in MiB (uploads included).")
@click.option("--max-image-mb", default=32.0, show_default=True, type=float,
              help="Largest first-frame image in MiB.")
@click.option("--executor", default="local", show_default=True, type=click.Choice(["local", "ray"]),
              help="local: jobs render one at a time on this process's pipeline; ray: on the workers of a Ray "
                   "cluster (one per GPU), each taking the next queued job as it frees up (needs the ray extra).")
@declare(*RAY, "prompt_cache", "checkpoint_every")
def serve(**options):
    """Serve renders over HTTP: the video job API of SGLang-diffusion and vLLM-Omni (/v1/videos), jobs kept in a
    store that outlives the server.

    \b
    camrender serve --model tiny --port 8000
    curl -s localhost:8000/v1/videos -H 'Content-Type: application/json' \\
      -d '{"prompt": "a street", "extra_params": {"sana_wm": {"action": "w-16"}}, "size": "112x64"}'

    The pipeline loads once; jobs render one at a time on its device (--executor ray: on a Ray
    cluster's workers, each loading its own). A server killed and started
    again on the same --store keeps every accepted job: finished ones are served, queued ones run,
    the one in progress continues from its segment-mode checkpoint (full mode starts it again).
    API, fields and limits: docs/serve.md.
    """
    executor = options.pop("executor")
    if executor == "ray":
        import_ray()  # the extra to install, before anything else
    refuse_ray_options(executor)
    ray_options = {name: options.pop(name) for name in RAY}
    if importlib.util.find_spec("aiohttp") is None:
        raise CamrenderError("camrender serve needs aiohttp: pip install 'camrender[play]'", field="serve")
    keep = duration_seconds(options.pop("keep"))
    load, render, rest = split_options(options)
    settings = LoadSettings.create(**load)
    checkpoint_every = rest["checkpoint_every"]
    check_checkpoint_every(checkpoint_every)
    max_body = int(_positive("max-body-mb", rest["max_body_mb"]) * MIB)
    max_image = int(_positive("max-image-mb", rest["max_image_mb"]) * MIB)
    # lazy: keeps `camrender --help` free of torch, diffusers and aiohttp
    import asyncio

    from camrender.play.listen import check_listen
    from camrender.play.server import is_loopback
    from camrender.serve.app import ServerConfig, VideoServer, serve as run_server
    from camrender.serve.jobs import JobRules
    from camrender.serve.store import JobStore

    check_listen(rest["host"], rest["port"])  # an address or a port it cannot have: now, not after the model loads
    token = None if rest["token_file"] is None else read_token(rest["token_file"])
    generated = token is None and not is_loopback(rest["host"])
    token = secrets.token_urlsafe(32) if generated else token
    store = JobStore(rest["store"])
    log = lambda line: click.echo(f"camrender: {line}", err=True)  # noqa: E731
    try:
        rules = JobRules(settings, resolve_cache_dir(render.get("prompt_cache")), max_image)
        quiet_libraries()
        from camrender.serve.worker import Dispatcher

        with _renderer(executor, settings, ray_options, log) as renderer:
            interrupted = store.requeue_interrupted()
            if interrupted:
                log(f"{len(interrupted)} job{'' if len(interrupted) == 1 else 's'} in progress when the server "
                    "stopped: queued again (segment mode continues from its checkpoint)")
            dispatcher = Dispatcher(store, renderer, rules, checkpoint_every=checkpoint_every, log=log)
            server = VideoServer(store, dispatcher, rules, ServerConfig(token, keep, rest["max_queue"], max_body),
                                 log)
            dispatcher.start()

            def ready(url: str) -> None:
                click.echo(url)
                if generated:
                    click.echo(f"token {token}")
                sys.stdout.flush()
                log(f"serving {settings.model} at {url} (store {store.folder}); Ctrl-C stops")

            try:
                asyncio.run(run_server(server, rest["host"], rest["port"], ready, STOP_GRACE_S))
            finally:
                dispatcher.stop(STOP_GRACE_S)  # (done already, unless the server failed)
                server.close()
    finally:
        store.close()
    log("stopped")


@contextlib.contextmanager
def _renderer(executor: str, settings: LoadSettings, ray_options: dict, log):
    """What renders the jobs: this process's pipeline, loaded now ("local"), or the workers of a Ray cluster
    (`camrender.serve.ray_renderer`: the server loads no pipeline), for the duration of the block."""
    if executor == "ray":
        # lazy: Ray is an optional extra
        from camrender.serve.ray_renderer import ray_renderer

        with ray_renderer(settings, log=log, **ray_options) as renderer:
            yield renderer
        return
    # lazy: keeps `camrender --help` free of torch and diffusers
    from camrender.api.pipeline import CamrenderPipeline
    from camrender.serve.worker import InProcessRenderer

    log(f"loading {settings.model}")
    yield InProcessRenderer(CamrenderPipeline.from_pretrained(settings=settings, log=log))
