"""Replay of chunk-causal teacher goldens (tools/make_golden_chunk_causal.py); `bench/replay_golden.py`
calls `replay` for files whose metadata says recipe "chunk-causal".

Loads the golden's weights through camrender's original-format loader, builds the camera
conditioning from the golden's poses and pixel intrinsics with camrender's camera code, and runs
`camrender.render.chunk_causal.sample_chunk_causal` (the recipe's options, fp32) with the golden's text
embeddings (negative prompt first under guidance) and noise. The report has replay_golden's keys,
with the predictions compared per global sampler step: the guided prediction of the chunks in
flight against the golden's (its raw [negative, prompt] outputs combined with the same guidance).

    python3 bench/replay_golden.py tests/golden/chunk_causal_seed1.safetensors --kernels fused --json
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import torch
from safetensors import safe_open

from camrender.model.stage1.loading import load_transformer_weights
from camrender.model.stage1.patch import KernelSettings, patch_transformer
from camrender.model.stage1.recipes import get_recipe
from camrender.model.stage1.segments import SegmentOptions
from camrender.render.chunk_causal import sample_chunk_causal, teacher_schedule
from camrender.render.inputs import RenderInputs

from golden_common import TOLERANCE, _camera, _model_from_config, _rel, inputs_on, replay_device


def replay(golden_path: str, kernels: str = "torch", **overrides) -> dict:
    """Replay one chunk-causal golden; overrides replace fields of the recipe's `SegmentOptions`. The fused
    kernels run on the GPU when there is one (`golden_common.replay_device`)."""

    with safe_open(str(golden_path), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {key: handle.get_tensor(key) for key in handle.keys() if not key.startswith("generator.")}
    config, shapes = json.loads(metadata["model_config"]), json.loads(metadata["shapes"])
    sampler = json.loads(metadata["sampler_config"])
    model = _model_from_config(config)
    weights = load_transformer_weights(model, golden_path)
    patch_transformer(model, settings=KernelSettings("triton" if kernels == "fused" else "torch", "ieee"))
    camera_conditions, chunk_plucker = _camera(tensors, shapes)

    guidance = float(sampler["cfg_scale"])
    text, mask = tensors["inputs/text_embeds"], tensors["inputs/text_mask"]
    if guidance > 1:
        text = torch.cat([tensors["inputs/negative_embeds"], text])
        mask = torch.cat([tensors["inputs/negative_mask"], mask])
    inputs = RenderInputs(text=text, text_mask=mask, camera_conditions=camera_conditions.expand(text.shape[0], -1, -1),
                          chunk_plucker=chunk_plucker, first_latent=tensors["inputs/first_latent"],
                          noise=tensors["inputs/latents_init"], guidance=guidance)
    starts = tensors["inputs/chunk_bounds"].tolist()
    bounds = list(zip(starts[:-1], starts[1:]))
    schedule = teacher_schedule(len(bounds), steps=int(sampler["steps"]), flow_shift=float(sampler["flow_shift"]),
                                interval_k=float(sampler["interval_k"]))
    matrix = torch.tensor([[schedule.timestep(c, s) for s in range(schedule.total)] for c in range(len(bounds))])
    options = dataclasses.replace(
        SegmentOptions.for_recipe(get_recipe("chunk-causal"), sdpa_dtype=torch.float32),
        **overrides)

    per_step, per_chunk_step = [], [[] for _ in bounds]
    device = replay_device(kernels)
    model.to(device)
    inputs = inputs_on(inputs, device)

    def on_step(step, start, stop, frame_t, prediction):
        prediction, frame_t = prediction.cpu(), frame_t.cpu()
        raw = tensors[f"step{step}/pred"][:, :, start:stop]
        golden = raw[:1] + guidance * (raw[1:] - raw[:1]) if guidance > 1 else raw
        per_step.append(dict(step=step, frames=[start, stop], rel_error=_rel(prediction, golden),
                             timesteps_match=bool(torch.equal(frame_t, tensors[f"step{step}/timestep"][start:stop]))))
        for index, (a, b) in enumerate(bounds):
            if start <= a < stop:
                per_chunk_step[index].append(_rel(prediction[:, :, a - start:b - start], golden[:, :, a - start:b - start]))

    started = time.perf_counter()
    with torch.no_grad():
        latents = torch.cat([x for *_, x in sample_chunk_causal(model, inputs, bounds, schedule, options, device,
                                                                on_step=on_step)], dim=2).float().cpu()
    seconds = time.perf_counter() - started
    golden = tensors["outputs/latents"]
    flat_ours, flat_golden = latents.flatten().double(), golden.flatten().double()
    max_rel = _rel(latents, golden)
    schedule_ok = bool(torch.equal(matrix, tensors["inputs/timestep_matrix"]))
    return {
        "golden": os.path.basename(str(golden_path)),
        "recipe": "chunk-causal",
        "kernels": kernels,
        "device": str(device),
        "max_rel_error": max_rel,
        "cosine": float(flat_ours @ flat_golden / (flat_ours.norm() * flat_golden.norm())),
        "tolerance": TOLERANCE,
        "passed": max_rel <= TOLERANCE and schedule_ok and all(s["timesteps_match"] for s in per_step),
        "chunk_bounds": starts,
        "golden_chunk_bounds": sampler["chunk_bounds"],
        "schedule_matches": schedule_ok,
        "final_latents_rel_error_per_chunk": [_rel(latents[:, :, a:b], golden[:, :, a:b]) for a, b in bounds],
        "prediction_rel_error_per_step": per_step,
        "prediction_rel_error_per_chunk_step": per_chunk_step,
        "max_prediction_rel_error": max(s["rel_error"] for s in per_step),
        "camera_conditions_rel_error": _rel(camera_conditions, tensors["inputs/camera_conditions"]),
        "chunk_plucker_rel_error": _rel(chunk_plucker, tensors["inputs/chunk_plucker"]),
        "weights_loaded": len(weights.loaded),
        "seconds": round(seconds, 2),
    }
