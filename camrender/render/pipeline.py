"""The pipeline a render runs: loaded (hub id, local folder or "tiny"), patched with the fused kernels,
with the stage-2 refiner attached when the request names one, and its blocks split over the heads when
this rank's video group splits them (`camrender.parallel.heads`)."""
from __future__ import annotations

from typing import Optional

from camrender.errors import CamrenderError
from camrender.model.loading import load_pipeline
from camrender.model.patch import patch_transformer
from camrender.model.settings import RenderSettings, model_settings
from camrender.parallel.cfg import head_split
from camrender.parallel.heads import split_transformer
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


def load_patched_pipeline(request, log=None, settings: Optional[RenderSettings] = None):
    """The request's pipeline on its device, patched with its settings (`RenderSettings.of_request`, or
    `settings`), with its `--refiner` attached, and this rank's share of every block's heads under a head
    split. The settings stay with the pipeline (`pipeline_settings`) for its renders."""

    split = head_split(request.mode, request.guidance)
    if split is not None and request.offload:
        raise CamrenderError("--offload does not work with the head split of several GPUs per video (each GPU "
                             "holds its share of the weights)", field="offload")
    if split is not None and request.kernels != "fused":
        raise CamrenderError("--kernels torch runs the stock diffusers blocks, which the head split of several GPUs "
                             "per video does not cover: use --kernels fused", field="kernels")
    settings = RenderSettings.of_request(request) if settings is None else settings
    pipe = load_pipeline(request.model, dtype=settings.dtype, device=settings.device, offload=request.offload,
                         transformer_weights=request.transformer_weights, vae=request.vae, log=log,
                         allow_missing_weights=request.allow_missing_weights)
    patch_transformer(pipe.transformer, settings=settings.stage_one)
    setattr(pipe, _SETTINGS, settings)
    if split is not None:
        split_transformer(pipe.transformer, split)
        if log is not None:
            log(f"every block's heads split over {split.size} GPUs")
    if request.refiner is not None:
        if log is not None:
            log(f"loading the refiner {request.refiner}")
        load_stage_two(pipe, request)
    return pipe
