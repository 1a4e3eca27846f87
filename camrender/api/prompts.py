"""Encoded prompts ahead of a render (`encode_prompt`): stage 1's Gemma-2 and the refiner's Gemma-3 outputs kept in
the prompt cache, so that renders of the prompt, on this machine or another (copy the folder), load no text
encoder (`camrender.render.prompt_cache`)."""
from __future__ import annotations

from typing import Callable, Optional

from camrender.errors import CamrenderError
from camrender.render.load_settings import LoadSettings
from camrender.model.stage1.loading import load_pipeline
from camrender.render.inputs import encode_text
from camrender.render.prompt_cache import PromptCache, note, refiner_key, stage_one_key
from camrender.render.request import RenderRequest
from camrender.render.stage_two import load_stage_two


def encode_prompt(settings: LoadSettings, prompt: str, negative_prompt: str, folder: str,
                  log: Optional[Callable[[str], None]] = None) -> list:
    """Encode `prompt` with the text encoders of `settings` (its model, its refiner if any, in its dtype, on its
    device) into the prompt cache `folder`: stage 1's entries (the prompt alone, and with `negative_prompt` for
    renders with guidance) and the refiner's. Only the encoders and what they need load (the refiner's DiT stays
    in CPU memory). Returns [(what, path)] of the entries written."""
    # lazy: keeps `camrender --help` free of torch
    import torch

    from camrender.model.device import resolve_device

    request = RenderRequest(traj=None, prompt=prompt, negative_prompt=negative_prompt, prompt_cache=folder,
                            settings=settings)
    where = resolve_device(settings.device)
    cache = PromptCache(folder, log=note)
    pipe = load_pipeline(settings.model, dtype=settings.dtype, device=where)
    written = []
    with torch.no_grad():
        for guidance in (False, True):
            embeds, mask = encode_text(pipe, request, where, guidance)
            path = cache.put(stage_one_key(request, guidance), {"embeds": embeds, "mask": mask})
            written.append(("stage 1 (with the negative prompt)" if guidance else "stage 1", path))
        if settings.refiner is not None:
            load_stage_two(pipe, settings, prompt=request, place=False)  # encodes at load, into the cache
            path = cache.path(refiner_key(request))
            if cache.get(refiner_key(request)) is None:
                raise CamrenderError("the refiner's prompt could not be stored", path=path, field="prompt-cache")
            written.append(("refiner", path))
    for what, path in written:
        if log is not None:
            log(f"{what}: {path}")
    return written
