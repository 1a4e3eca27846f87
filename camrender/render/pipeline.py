"""The pipeline a render runs: loaded (hub id, local folder or "tiny") with its `LoadSettings`, patched with the
fused kernels, each stage's blocks in their precision, the stage-2 refiner attached when the settings name one,
and its blocks split over the heads when the video group splits them (`camrender.parallel.heads`)."""
from __future__ import annotations

from typing import Optional

from camrender.render.load_settings import LoadSettings
from camrender.model.precision import get_precision
from camrender.model.settings import RenderSettings, model_settings
from camrender.model.stage1.block import park_text_projections
from camrender.model.stage1.loading import load_pipeline
from camrender.model.stage1.patch import patch_transformer
from camrender.parallel.cfg import head_split_of
from camrender.parallel.heads import split_transformer
from camrender.render.prompt_cache import cached_stages
from camrender.render.stage_two import load_stage_two


_SETTINGS = "_camrender_settings"
_LOAD_SETTINGS = "_camrender_load_settings"


def pipeline_settings(pipe, request) -> RenderSettings:
    """The `RenderSettings` `pipe` was prepared with (`load_patched_pipeline`). A bare pipeline (built in
    a test or a script) gets those of the request's `LoadSettings`, decided here once: its transformer is
    patched with them, or, patched by the caller already, keeps its patch."""
    settings = getattr(pipe, _SETTINGS, None)
    if settings is None:
        settings = RenderSettings.decide(request.settings, stage_one=model_settings(pipe.transformer))
        patch_transformer(pipe.transformer, settings=settings.stage_one)
        setattr(pipe, _SETTINGS, settings)
        setattr(pipe, _LOAD_SETTINGS, request.settings)
    return settings


def loaded_with(pipe) -> Optional[LoadSettings]:
    """The `LoadSettings` `pipe` was loaded (or first used) with; None for a pipeline not yet used."""
    return getattr(pipe, _LOAD_SETTINGS, None)


def load_patched_pipeline(load: LoadSettings, log=None, *, ranks=None, prepare=None):
    """The pipeline of `load` on its device, patched and placed by `prepare_pipeline`. The text encoders live in
    CPU memory and visit the device for a render's prompt encoding (`camrender.render.inputs.visiting`; the
    refiner's at load, `load_stage_two`).
    prepare: the `RenderRequest` the pipeline is loaded for, when it is loaded for that one render (the
    command line): a stage whose prompt is in its prompt cache loads no text encoder, and the refiner encodes
    its prompt at load, before its DiT takes the GPU. None: every encoder loads (renders of any prompt).
    """
    settings = RenderSettings.decide(load, ranks=ranks)
    cached = cached_stages(prepare) if prepare is not None else {"stage1": False, "refiner": False}
    pipe = load_pipeline(load.model, dtype=settings.dtype, device=settings.device, offload=load.offload,
                         transformer_weights=load.transformer_weights, vae=load.vae, log=log,
                         allow_missing_weights=load.allow_missing_weights, text_encoder=not cached["stage1"])
    if pipe.text_encoder is not None and not load.offload:
        pipe.text_encoder.to("cpu")
    if log is not None and any(cached.values()):
        log("prompt found in the prompt cache: " + ", ".join(f"no {stage} text encoder loaded"
                                                             for stage, hit in cached.items() if hit))
    prepare_pipeline(pipe, load, ranks=ranks, log=log)
    if load.refiner is not None:
        if log is not None:
            log(f"loading the refiner {load.refiner}")
        load_stage_two(pipe, load, prompt=prepare, text_encoder=not cached["refiner"], settings=settings.refiner)
    return pipe


def prepare_pipeline(pipe, load: LoadSettings, *, ranks=None, log=None):
    """Make a loaded `SanaWMPipeline` (stage 1) render as `load` says: its transformer patched with the
    `RenderSettings` decided from `load` (kept already when the caller patched it), stage 1's block linears in
    their precision (`camrender.model.precision`), this rank's share of every block's heads under a head split
    (`load.head_split` over the video group of `ranks`) and the text projections parked. The settings stay with
    the pipeline (`pipeline_settings`, `loaded_with`) for its renders. Returns `pipe`."""
    settings = RenderSettings.decide(load, stage_one=model_settings(pipe.transformer), ranks=ranks)
    patch_transformer(pipe.transformer, settings=settings.stage_one)
    get_precision(load.stage1_precision).prepare_blocks(pipe.transformer.blocks)
    setattr(pipe, _SETTINGS, settings)
    setattr(pipe, _LOAD_SETTINGS, load)
    split = head_split_of(ranks, load.head_split)
    if split is not None:
        split_transformer(pipe.transformer, split)
        if log is not None:
            log(f"every block's heads split over {split.size} GPUs")
    if not load.offload:
        park_text_projections(pipe.transformer, settings.device)
    return pipe
