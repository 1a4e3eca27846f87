"""`camrender encode-prompt`: encode a prompt once and keep it in the prompt cache, for renders on this or
another machine (copy the cache folder) that then load no text encoder (`camrender.api.prompts`).

    camrender encode-prompt --prompt "a quiet street at dusk" --model PIPELINE --refiner REFINER --device cpu
"""
from __future__ import annotations

import click

from camrender.cli.options import declare
from camrender.cli.render import quiet_libraries
from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.render.prompt_cache import resolve_cache_dir
from camrender.vocabulary import DTYPE


@click.command("encode-prompt")
@click.option("--prompt", required=True, help="The prompt to encode.")
@click.option("--negative-prompt", default="", help="The negative prompt of renders with guidance.")
@declare("model", "refiner")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(DTYPE.values),
              help="The dtype of the renders that will use the entries (part of the cache key): bfloat16 as GPU "
                   "renders run, also when encoding on a CPU; auto: bfloat16 on CUDA, float32 on a CPU.")
@click.option("--device", default=None, help="Where to encode: cuda, cuda:N or cpu (default: cuda when available).")
@declare("prompt_cache")
def command(prompt, negative_prompt, model, refiner, dtype, device, prompt_cache):
    """Encode a prompt into the prompt cache (renders with it then load no text encoder)."""
    from camrender.api.prompts import encode_prompt

    folder = resolve_cache_dir(prompt_cache)
    if folder is None:
        raise CamrenderError("encode-prompt stores into the prompt cache: give a folder, not 'off'",
                             field="prompt-cache")
    # bfloat16 encodes on a CPU too: the entries are for GPU renders (the dtype is part of their key)
    settings = LoadSettings.create(model, refiner=refiner, device=device)
    settings = settings.replace(dtype=dtype)
    quiet_libraries()
    encode_prompt(settings, prompt, negative_prompt, folder, log=lambda line: click.echo(f"camrender: {line}", err=True))
