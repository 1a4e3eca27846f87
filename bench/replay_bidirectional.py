"""Replay a bidirectional golden of NVlabs' `SanaMSVideoCamCtrl` + `LTXFlowEuler` through camrender's full mode.

A bidirectional golden (format `sana-wm-bidirectional-golden/1`, written by the reference kit's
`make_golden_bidirectional.py`; layout in the kit README, "Bidirectional goldens") holds a tiny
random model in original checkpoint format, one whole-clip forward with every block's output, and a
short guided sampling run (steps, CFG 5, shift 9.8, frame 0 pinned) with every model input and
prediction. This module

1. builds a float32 `SanaWMTransformer3DModel` of the golden's size and loads the weights through
   camrender's original-format loader (`camrender.model.stage1.loading.load_transformer_weights`);
2. builds the camera tensors from the stored poses and intrinsics with camrender's camera code;
3. patches the model with the recipe's full-mode rules (`patch_transformer(..., recipe=...)`): the
   recipe is the one reproducing the golden's `nvlabs_commit` (`RECIPE_OF_COMMIT`) unless one is named;
4. runs the whole-clip forward (the golden's latents and per-frame timesteps, batch 1) and full
   mode's sampler (`camrender.render.full.denoise_clip` with `full_scheduler(recipe)`) from the
   golden's initial latents, text and negative text, recording every prediction.

Returns JSON: `max_rel_error` = max |ours - golden| / max |golden| of the sampled latents (what the
tolerance applies to), `cosine`, the forward's and every block's error, the timesteps' error and the
per-step prediction errors (uncond / cond, free-running: each step's model input is ours).
The softmax blocks attend in fp32, as the goldens (`--fp32-softmax`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from safetensors import safe_open

import camrender.render.denoise as denoise_module
from camrender.model.stage1.loading import load_transformer_weights
from camrender.model.stage1.patch import KernelSettings, patch_transformer, set_full_options
from camrender.model.stage1.recipes import get_recipe
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention
from camrender.model.stage1.state import SegmentOptions
from camrender.render.full import denoise_clip, full_scheduler

from golden_common import VAE_STRIDE, _camera, _model_from_config

BIDIRECTIONAL_FORMAT = "sana-wm-bidirectional-golden/1"
# NVlabs commit of a golden -> the recipe reproducing that commit's arithmetic.
RECIPE_OF_COMMIT = {"40151c8": "bidirectional", "5498e5b": "bidirectional-nvlabs-latest"}


def recipe_of_commit(commit: str) -> str:
    """The recipe of a golden's `nvlabs_commit` (full hash or prefix); ValueError for an unknown one."""
    for prefix, name in RECIPE_OF_COMMIT.items():
        if commit.startswith(prefix):
            return name
    raise ValueError(f"no recipe reproduces NVlabs commit {commit!r}; pass a recipe ({', '.join(RECIPE_OF_COMMIT)})")


def _rel(ours, golden) -> float:
    return float((ours.float() - golden).abs().max() / golden.abs().max().clamp_min(1e-30))


def _cosine(ours, golden) -> float:
    a, b = ours.flatten().double(), golden.flatten().double()
    return float(a @ b / (a.norm() * b.norm()))


def replay_bidirectional(golden_path: str, kernels: str = "torch", recipe=None, sample: bool = True,
                         teacher_steps=(), **overrides) -> dict:
    """Replay `golden_path` (see the module docstring).

    Args:
        kernels: "torch" (PyTorch references, diffusers' GDN main branch) or "fused" (Triton kernels,
            under the interpreter on a CPU; ieee matmul precision).
        recipe: recipe name; None: `recipe_of_commit` of the golden's `nvlabs_commit`.
        sample: also run the sampler (else only the forward; `max_rel_error` is then the forward's).
        teacher_steps: sampler steps whose model call is replayed teacher-forced (the golden's `sample/x_in`
            and `sample/timestep`, CFG batch of 2): `teacher_forced_prediction_rel_error` {step: [uncond, cond]}.
        overrides: `SegmentOptions` fields replacing the recipe's (tests show that other rules are caught).
    """

    with safe_open(golden_path, framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys() if not key.startswith("generator.")}
    config, shapes = json.loads(metadata["model_config"]), json.loads(metadata["shapes"])
    sampler = json.loads(metadata["sampler_config"])
    commit = metadata["nvlabs_commit"]
    recipe = get_recipe(recipe or recipe_of_commit(commit))

    model = _model_from_config(config)
    report = load_transformer_weights(model, golden_path)
    camera_conditions, chunk_plucker = _camera(tensors, shapes)
    patch_transformer(model, settings=KernelSettings("triton" if kernels == "fused" else "torch", "ieee"))
    set_full_options(model, dataclasses.replace(SegmentOptions.full_mode(recipe), **overrides))
    for block in model.blocks:
        if isinstance(block.attn, PatchedSoftmaxAttention):
            block.attn.sdpa_dtype = torch.float32  # the goldens keep the softmax q/k/v in fp32
    image_hw = torch.tensor([[shapes["latent_h"] * VAE_STRIDE[1], shapes["latent_w"] * VAE_STRIDE[2]]],
                            dtype=torch.float)
    camera = {"camera_conditions": camera_conditions, "chunk_plucker": chunk_plucker}

    block_outputs = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: block_outputs.append(
        (out[0] if isinstance(out, tuple) else out).detach().clone())) for block in model.blocks]
    started = time.perf_counter()
    with torch.no_grad():
        forward = model(tensors["inputs/forward_latents"], tensors["inputs/forward_timestep"],
                        tensors["inputs/text_embeds"], mask=tensors["inputs/text_mask"],
                        data_info={"img_hw": image_hw}, return_dict=False, **camera)[0]
    for hook in hooks:
        hook.remove()
    forward_seconds = time.perf_counter() - started
    result = {
        "golden": os.path.basename(golden_path),
        "nvlabs_commit": commit[:7],
        "recipe": recipe.name,
        "kernels": kernels,
        "forward_rel_error": _rel(forward, tensors["outputs/forward"]),
        "forward_cosine": _cosine(forward, tensors["outputs/forward"]),
        "block_rel_errors": [_rel(ours, tensors[f"forward/block{i}"]) for i, ours in enumerate(block_outputs)],
        "camera_conditions_rel_error": _rel(camera_conditions, tensors["inputs/camera_conditions"]),
        "chunk_plucker_rel_error": _rel(chunk_plucker, tensors["inputs/chunk_plucker"]),
        "weights_loaded": len(report.loaded),
        "forward_seconds": round(forward_seconds, 2),
    }
    text = torch.cat([tensors["inputs/neg_text_embeds"], tensors["inputs/text_embeds"]])
    text_mask = torch.cat([tensors["inputs/neg_text_mask"], tensors["inputs/text_mask"]])
    camera2 = {"camera_conditions": camera_conditions.repeat(2, 1, 1), "chunk_plucker": chunk_plucker}
    if teacher_steps:
        result["teacher_forced_prediction_rel_error"] = {}
        for step in teacher_steps:
            with torch.no_grad():
                pred = model(tensors["sample/x_in"][step:step + 1].repeat(2, 1, 1, 1, 1),
                             tensors["sample/timestep"][step].expand(2, 1, -1), text, mask=text_mask,
                             data_info={"img_hw": image_hw}, return_dict=False, **camera2)[0]
            result["teacher_forced_prediction_rel_error"][step] = [_rel(pred[0], tensors["sample/pred_uncond"][step]),
                                                                   _rel(pred[1], tensors["sample/pred_cond"][step])]
    if not sample:
        return {**result, "max_rel_error": result["forward_rel_error"], "cosine": result["forward_cosine"]}

    predictions = []
    # every model call of a render is the Denoiser's `segment_forward`: record its raw [uncond, cond] rows

    forward_of_renders = denoise_module.segment_forward

    def recording_forward(*args, **kwargs):
        out = forward_of_renders(*args, **kwargs)
        predictions.append(out.detach().clone())
        return out

    denoise_module.segment_forward = recording_forward
    # a recipe on the pipeline's own scheduler (bidirectional-diffusers) gets the golden's scheduler config
    scheduler = (full_scheduler(None, recipe) if recipe.flow_shift is not None
                 else FlowMatchEulerDiscreteScheduler.from_config(sampler["scheduler_config"]))
    started = time.perf_counter()
    try:
        latents = denoise_clip(model, scheduler, tensors["inputs/latents_init"].clone(), text, text_mask, camera2,
                               sampler["steps"], sampler["cfg_scale"], image_hw)
    finally:
        denoise_module.segment_forward = forward_of_renders
    golden = tensors["outputs/latents"]
    return {
        **result,
        "max_rel_error": _rel(latents, golden),
        "cosine": _cosine(latents, golden),
        "timesteps_rel_error": _rel(scheduler.timesteps, tensors["sample/timesteps"]),
        "prediction_rel_error_per_step": [[_rel(p[0], tensors["sample/pred_uncond"][s]),
                                           _rel(p[1], tensors["sample/pred_cond"][s])]
                                          for s, p in enumerate(predictions)],
        "frame0_exact": bool(torch.equal(latents[:, :, :1], golden[:, :, :1])),
        "sample_seconds": round(time.perf_counter() - started, 2),
    }
