"""`camrender encode-prompt`: encode a prompt once and keep it in the prompt cache, for renders on this or
another machine (copy the cache folder) that then load no text encoder.

    camrender encode-prompt --prompt "a quiet street at dusk" --model PIPELINE --refiner REFINER --device cpu

Stores stage 1's entries (the prompt alone, and with the negative prompt for renders with guidance) and,
with --refiner, the refiner's (`camrender.render.prompt_cache`).
"""
from __future__ import annotations

import click

from camrender.cli.preflight import check_device
from camrender.errors import CamrenderError
from camrender.model.device import resolve_device
from camrender.model.refiner.loading import resolve_refiner, vae_latent_channels
from camrender.model.stage1.loading import DEFAULT_MODEL, load_pipeline
from camrender.render.inputs import encode_text
from camrender.render.prompt_cache import PromptCache, note, refiner_key, resolve_cache_dir, stage_one_key
from camrender.render.request import RenderRequest


@click.command("encode-prompt")
@click.option("--prompt", required=True, help="The prompt to encode.")
@click.option("--negative-prompt", default="", help="The negative prompt of renders with guidance.")
@click.option("--model", default=DEFAULT_MODEL, show_default=True, help="Hub id, local pipeline folder, or tiny.")
@click.option("--refiner", default="none", show_default=True, help="The refiner whose prompt to encode too, or none.")
@click.option("--dtype", default="bfloat16", show_default=True,
              type=click.Choice(["auto", "bfloat16", "float16", "float32"]),
              help="The dtype of the renders that will use the entries (part of the cache key): bfloat16 as GPU "
                   "renders run, also when encoding on a CPU; auto: bfloat16 on CUDA, float32 on a CPU.")
@click.option("--device", default=None, help="Where to encode: cuda, cuda:N or cpu (default: cuda when available).")
@click.option("--prompt-cache", default=None,
              help="Cache folder (default: $CAMRENDER_CACHE, else the user cache folder: $XDG_CACHE_HOME/camrender "
                   "or ~/.cache/camrender).")
def command(prompt, negative_prompt, model, refiner, dtype, device, prompt_cache):
    """Encode a prompt into the prompt cache (renders with it then load no text encoder)."""
    # lazy: keeps `camrender --help` free of torch, diffusers
    import torch

    from camrender.render.stage_two import load_stage_two

    folder = resolve_cache_dir(prompt_cache)
    if folder is None:
        raise CamrenderError("encode-prompt stores into the prompt cache: give a folder, not 'off'",
                             field="prompt-cache")
    check_device(device, False)
    spec = resolve_refiner(refiner, vae_latent_channels(model, None))
    request = RenderRequest(traj=None, prompt=prompt, negative_prompt=negative_prompt, model=model, dtype=dtype,
                            device=device, refiner=spec, prompt_cache=folder, offload=False)
    where = resolve_device(device)
    cache = PromptCache(folder, log=note)
    pipe = load_pipeline(model, dtype=dtype, device=where)
    with torch.no_grad():
        for guidance in (False, True):
            embeds, mask = encode_text(pipe, request, where, guidance)
            path = cache.put(stage_one_key(request, guidance), {"embeds": embeds, "mask": mask})
            click.echo(f"camrender: stage 1{' (with the negative prompt)' if guidance else ''}: {path}", err=True)
        if spec is not None:
            load_stage_two(pipe, request, place=False)  # encodes the refiner's prompt at load, into the cache
            path = cache.path(refiner_key(request))
            if cache.get(refiner_key(request)) is None:
                raise CamrenderError("the refiner's prompt could not be stored", path=path, field="prompt-cache")
            click.echo(f"camrender: refiner: {path}", err=True)
