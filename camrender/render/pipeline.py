"""The pipeline a render runs: loaded (hub id, local folder or "tiny"), patched with the fused kernels,
with the stage-2 refiner attached when the request names one."""
from __future__ import annotations


def load_patched_pipeline(request, log=None):
    """The request's pipeline on its device, patched with its `--kernels`, with its `--refiner` attached."""
    from camrender.model.loading import load_pipeline
    from camrender.model.patch import patch_transformer

    pipe = load_pipeline(request.model, dtype=request.dtype, device=request.device, offload=request.offload,
                         transformer_weights=request.transformer_weights, vae=request.vae, log=log,
                         allow_missing_weights=request.allow_missing_weights)
    patch_transformer(pipe.transformer, kernels=request.kernels)
    if request.refiner is not None:
        from camrender.render.stage_two import load_stage_two

        if log is not None:
            log(f"loading the refiner {request.refiner}")
        load_stage_two(pipe, request)
    return pipe
