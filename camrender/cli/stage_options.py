"""The render options of issue 24: numeric precision per stage, the refiner's KV window and the prompt
cache, with the checks that run before any model loads.

    --precision bf16|fp8            both stages (the official CLI's name)
    --stage1-precision, --refiner-precision   one stage each (default: --precision)
    --refiner-window N              the refiner's KV window in latent frames (official --refiner_kv_max_frames)
    --prompt-cache DIR|off          where encoded prompts are kept (default: the platform's cache folder)
"""
from __future__ import annotations

import click

from camrender.api.requests import PRECISIONS, stage_precisions
from camrender.errors import CamrenderError
from camrender.limits import check_latent_frames
from camrender.model.refiner.loading import check_refiner_offload
from camrender.render.prompt_cache import resolve_cache_dir

# sink + 10 recent frames, the released recipe (camrender.model.refiner.stream.KV_MAX_FRAMES)
DEFAULT_REFINER_WINDOW = 11


def stage_options(command):
    """Add the options to a click command (innermost first, so --help lists them in this order)."""
    options = [
        click.option("--precision", default="bf16", show_default=True, type=click.Choice(PRECISIONS),
                     help="Both stages: bf16, or fp8 (e4m3 W8A8 linears of the transformer blocks; GPUs of compute "
                          "capability 8.9+: Ada, Hopper)."),
        click.option("--stage1-precision", default=None, type=click.Choice(PRECISIONS),
                     help="Stage 1's precision (default: --precision)."),
        click.option("--refiner-precision", default=None, type=click.Choice(PRECISIONS),
                     help="The refiner's precision (default: --precision)."),
        click.option("--refiner-window", default=DEFAULT_REFINER_WINDOW, show_default=True,
                     type=click.IntRange(min=1),
                     help="The refiner's KV window in latent frames: the sink plus N-1 recent frames (the official "
                          "--refiner_kv_max_frames; 2 = faster and smaller, at a quality cost)."),
        click.option("--prompt-cache", default=None,
                     help="Folder of encoded prompts (default: $CAMRENDER_CACHE, else the user cache folder: "
                          "$XDG_CACHE_HOME/camrender or ~/.cache/camrender); 'off' encodes every time and stores "
                          "nothing."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _offload_value(context, parameter, value):
    try:
        return check_refiner_offload(value)
    except CamrenderError as error:
        raise click.BadParameter(error.detail) from None


refiner_offload_option = click.option(
    "--refiner-offload", default="none", show_default=True, callback=_offload_value, metavar="none|layers|N",
    help="Where the refiner's DiT lives: none: on the GPU; N: N of its blocks stay in CPU memory and visit the GPU "
         "in turn behind the others' compute (about N - 2 blocks' weights less on the GPU: 0.5 GiB each in bf16, "
         "0.25 in fp8; N from 3); layers: every block visits the GPU in turn (smallest, slowest; needs accelerate).")


def resolve_stage_options(options: dict, device) -> dict:
    """The RenderRequest fields of these options (popped from `options`); FP8 checked against `device`
    before any model loads (`camrender.api.requests.stage_precisions`: the option that asked for it named)."""
    precisions = stage_precisions(options.pop("precision", "bf16"), options.pop("stage1_precision", None),
                                  options.pop("refiner_precision", None), device, spell=cli_spelling)
    window = check_latent_frames(int(options.pop("refiner_window", DEFAULT_REFINER_WINDOW)), "refiner-window")
    return dict(**precisions, refiner_window=window,
                prompt_cache=resolve_cache_dir(options.pop("prompt_cache", None)))


def cli_spelling(name: str) -> str:
    """A RenderRequest field as its command-line option: refiner_window -> --refiner-window."""
    return "--" + name.replace("_", "-")
