"""The pipeline a render runs: loaded (hub id, local folder or "tiny"), patched with the fused kernels,
with the stage-2 refiner attached when the request names one, and its blocks split over the heads when
this rank's video group splits them (`camrender.parallel.heads`)."""
from __future__ import annotations

from typing import Optional

from camrender.errors import CamrenderError
from camrender.model.fp8 import quantize_blocks
from camrender.model.settings import RenderSettings, model_settings
from camrender.model.stage1.block import park_text_projections
from camrender.model.stage1.loading import load_pipeline
from camrender.model.stage1.patch import patch_transformer
from camrender.parallel.cfg import head_split
from camrender.parallel.heads import split_transformer
from camrender.render.prompt_cache import cached_stages
from camrender.render.stage_two import load_stage_two


_SETTINGS = "_camrender_settings"


def pipeline_settings(pipe, request) -> RenderSettings:
    """The `RenderSettings` `pipe` was prepared with (`load_patched_pipeline`). A bare pipeline (built in
    a test or a script) gets the request's, decided here once: its transformer is patched with them, or,
    patched by the caller already, keeps its patch."""
    settings = getattr(pipe, _SETTINGS, None)
    if settings is None:
        settings = RenderSettings.of_request(request, stage_one=model_settings(pipe.transformer))
        patch_transformer(pipe.transformer, settings=settings.stage_one)
        setattr(pipe, _SETTINGS, settings)
    return settings


def load_patched_pipeline(request, log=None, settings: Optional[RenderSettings] = None,
                          skip_cached_encoders: bool = False):
    """The request's pipeline on its device, patched with its settings (`RenderSettings.of_request`, or
    `settings`; stage 1's block linears in FP8 under `settings.stage_one.linear_precision` "fp8"), with its
    `--refiner` attached, and this rank's share of every block's heads under a head split. The settings
    stay with the pipeline (`pipeline_settings`) for its renders.

    The text encoders live in CPU memory and visit the device for the render's one prompt encoding
    (`camrender.render.inputs.visiting`; the refiner's at load, `load_stage_two`).
    skip_cached_encoders: a stage whose prompt is in `request.prompt_cache` loads no text encoder
    (for one render: a later request with another prompt would find none).
    """

    split = head_split(request.mode, request.guidance)
    if split is not None and request.offload:
        raise CamrenderError("--offload does not work with the head split of several GPUs per video (each GPU "
                             "holds its share of the weights)", field="offload")
    if split is not None and request.kernels != "fused":
        raise CamrenderError("the head split of several GPUs per video runs --kernels fused only (--kernels torch "
                             "is the single-GPU check path)", field="kernels")
    settings = RenderSettings.of_request(request) if settings is None else settings
    fp8 = settings.stage_one.linear_precision == "fp8"
    if fp8 and (split is not None or not settings.stage_one.fused or request.offload):
        raise CamrenderError("--stage1-precision fp8 needs --kernels fused, one GPU per video and no --offload",
                             field="stage1-precision")
    guidance = request.guidance is not None and request.guidance > 1.0
    cached = cached_stages(request, guidance) if skip_cached_encoders else {"stage1": False, "refiner": False}
    pipe = load_pipeline(request.model, dtype=settings.dtype, device=settings.device, offload=request.offload,
                         transformer_weights=request.transformer_weights, vae=request.vae, log=log,
                         allow_missing_weights=request.allow_missing_weights, text_encoder=not cached["stage1"])
    if pipe.text_encoder is not None and not request.offload:
        pipe.text_encoder.to("cpu")
    if log is not None and any(cached.values()):
        log("prompt found in the prompt cache: " + ", ".join(f"no {stage} text encoder loaded"
                                                             for stage, hit in cached.items() if hit))
    patch_transformer(pipe.transformer, settings=settings.stage_one)
    if fp8:
        quantize_blocks(pipe.transformer.blocks)
    setattr(pipe, _SETTINGS, settings)
    if split is not None:
        split_transformer(pipe.transformer, split)
        if log is not None:
            log(f"every block's heads split over {split.size} GPUs")
    if not request.offload:
        park_text_projections(pipe.transformer, settings.device)
    if request.refiner is not None:
        if log is not None:
            log(f"loading the refiner {request.refiner}")
        load_stage_two(pipe, request, text_encoder=not cached["refiner"], settings=settings.refiner)
    return pipe
