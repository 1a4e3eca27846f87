"""Replay a golden file of an official NVlabs sampler through camrender (segment mode or full mode).

Chunk-causal teacher goldens (metadata recipe "chunk-causal", tools/make_golden_chunk_causal.py) are
replayed by bench/replay_teacher.py with the teacher's sampler; bidirectional goldens (format
`sana-wm-bidirectional-golden/1`, the kit's make_golden_bidirectional.py) by bench/replay_bidirectional.py
through full mode, with the recipe of the golden's `nvlabs_commit` (40151c8: bidirectional, 5498e5b:
bidirectional-nvlabs-latest) unless `--recipe` names one:

    python3 bench/replay_golden.py tests/golden/bidirectional_40151c8_seed1.safetensors --kernels fused --json

The rest of this docstring is about the streaming goldens.

A golden file (`tests/golden/*.safetensors`, written by the reference kit's `make_golden.py`)
holds a tiny random model in original checkpoint format (`generator.<key>`), the camera path
(`inputs/c2w`, `inputs/intrinsics`), text embeddings, the noise, the official final latents and
every model input and prediction per chunk and step. This script

1. builds a diffusers `SanaWMTransformer3DModel` of the golden's size in float32 and loads the
   weights through camrender's original-format loader (`camrender.model.stage1.loading`);
2. builds the camera conditioning from the poses and intrinsics with camrender's own camera code
   (`camrender.render.camera.build_camera_inputs`; the stored `camera_conditions` / `chunk_plucker` are
   only compared against);
3. samples with camrender's segment mode (`render_segments.sample_segments`, the streaming recipe)
   from the golden's text embeddings and noise, recording every model prediction;

and prints JSON: `max_rel_error` = max |ours - golden| / max |golden| over the final latents,
`cosine`, per-chunk errors of the final latents, per-chunk-and-step errors of the predictions
(each against the golden prediction of that step). Exit 0 when max_rel_error <= --tolerance.

    python3 bench/replay_golden.py tests/golden/streaming_s2_h64x2_f14.safetensors --kernels fused --json

`--kernels fused` runs the Triton kernels (under the interpreter on a CPU; `matmul_precision="ieee"`),
`--kernels torch` the PyTorch references. The goldens keep the softmax blocks' q/k/v in fp32
(`--fp32-softmax`), so the replay attends in fp32 too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from safetensors import safe_open

if not torch.cuda.is_available():  # --kernels fused on a CPU: the interpreter, set before camrender imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # golden_common, replay_* beside it
import camrender.model.stage1.segments as segments_module  # noqa: E402
import camrender.render.denoise as denoise_module  # noqa: E402
from camrender.model.stage1.loading import load_transformer_weights  # noqa: E402
from camrender.model.stage1.patch import KernelSettings, patch_transformer  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.render.inputs import RenderInputs  # noqa: E402
from camrender.render.segments import sample_segments, segment_timesteps  # noqa: E402

from replay_bidirectional import BIDIRECTIONAL_FORMAT, replay_bidirectional  # noqa: E402

from golden_common import (  # noqa: E402,F401
    TOLERANCE, VAE_STRIDE, _camera, _model_from_config, _rel, exact_float32, inputs_on, replay_device)
from replay_teacher import replay as replay_teacher  # noqa: E402


def replay(golden_path: str, kernels: str = "torch", recipe=None, chunks=None, **overrides) -> dict:
    """Replay `golden_path`; returns the JSON document (see the module docstring). The fused kernels run
    on the GPU when there is one (`golden_common.replay_device`), the rest on the CPU.

    recipe: a recipe name (bidirectional goldens only; None: the golden's commit's).
    chunks: streaming goldens: sample and compare only the first `chunks` chunks (the self-forcing sampler
        makes each chunk from the caches of the ones before, so they are the golden's as they stand).
    overrides: `SegmentOptions` fields replacing the recipe's (tests use them to show that a
    rule other than the official one is caught)."""
    with exact_float32():
        return _replay(golden_path, kernels, recipe, chunks, **overrides)


def _replay(golden_path: str, kernels: str, recipe, chunks, **overrides) -> dict:
    with safe_open(golden_path, framework="pt") as handle:
        metadata = handle.metadata()
        if metadata.get("recipe") == "chunk-causal":  # the teacher's sampler: bench/replay_teacher.py
            return replay_teacher(golden_path, kernels, **overrides)
        if metadata.get("format") == BIDIRECTIONAL_FORMAT:
            return replay_bidirectional(golden_path, kernels, recipe, **overrides)
        tensors = {key: handle.get_tensor(key) for key in handle.keys() if not key.startswith("generator.")}
    config, shapes = json.loads(metadata["model_config"]), json.loads(metadata["shapes"])
    sampler = json.loads(metadata["sampler_config"])
    recipe = get_recipe(metadata.get("recipe", "streaming"))

    model = _model_from_config(config)
    report = load_transformer_weights(model, golden_path)  # refuses a file leaving weights unloaded
    camera_conditions, chunk_plucker = _camera(tensors, shapes)
    inputs = RenderInputs(text=tensors["inputs/text_embeds"], text_mask=tensors["inputs/text_mask"],
                          camera_conditions=camera_conditions, chunk_plucker=chunk_plucker,
                          first_latent=tensors["inputs/first_latent"], noise=tensors["inputs/latents_init"])
    bounds = segments_module.segment_bounds(shapes["latent_frames"], recipe.chunk_frames)[:chunks]
    device = replay_device(kernels)
    model.to(device)
    inputs = inputs_on(inputs, device)
    patch_transformer(model, settings=KernelSettings("triton" if kernels == "fused" else "torch", "ieee"))
    # a render's options without the refiner (the key slot, the Plucker projections once per segment)
    options = segments_module.SegmentOptions.for_recipe(recipe, sdpa_dtype=torch.float32,
                                                        **{"plucker_once": True, **overrides})
    timesteps = segment_timesteps(None, None, recipe)

    predictions = []  # (frame_start, write, prediction) of every model call
    forward = denoise_module.segment_forward

    def recording_forward(model, hidden_states, timestep, *args, **kwargs):
        out = forward(model, hidden_states, timestep, *args, **kwargs)
        predictions.append((kwargs.get("frame_start", 0), kwargs.get("write_cache", False), out.detach().cpu()))
        return out

    started = time.perf_counter()
    denoise_module.segment_forward = recording_forward
    try:
        with torch.no_grad():
            latents = torch.cat([x for *_, x in sample_segments(model, inputs, bounds, timesteps, options,
                                                                device)], dim=2).cpu()
    finally:
        denoise_module.segment_forward = forward
    seconds = time.perf_counter() - started

    golden = tensors["outputs/latents"][:, :, :bounds[-1][1]]
    per_chunk, per_step = [], []
    steps = [p for _, write, p in predictions if not write]
    for index, (start, stop) in enumerate(bounds):
        per_chunk.append(_rel(latents[:, :, start:stop], golden[:, :, start:stop]))
        expected = tensors[f"chunk{index}/pred"]
        per_step.append([_rel(steps[index * len(timesteps) + s][0], expected[s]) for s in range(len(timesteps))])
    flat_ours, flat_golden = latents.flatten().double(), golden.flatten().double()
    cosine = float(flat_ours @ flat_golden / (flat_ours.norm() * flat_golden.norm()))
    max_rel = _rel(latents, golden)
    return {
        "golden": os.path.basename(golden_path),
        "kernels": kernels,
        "max_rel_error": max_rel,
        "cosine": cosine,
        "tolerance": TOLERANCE,
        "passed": max_rel <= TOLERANCE,
        "chunk_bounds": [b[0] for b in bounds] + [bounds[-1][1]],
        "golden_chunk_bounds": sampler["chunk_bounds"][:len(bounds) + 1],
        "device": str(device),
        "final_latents_rel_error_per_chunk": per_chunk,
        "prediction_rel_error_per_chunk_step": per_step,
        "camera_conditions_rel_error": _rel(camera_conditions, tensors["inputs/camera_conditions"]),
        "chunk_plucker_rel_error": _rel(chunk_plucker, tensors["inputs/chunk_plucker"]),
        "weights_loaded": len(report.loaded),
        "seconds": round(seconds, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("golden", help="golden .safetensors file")
    parser.add_argument("--kernels", default="torch", choices=["torch", "fused"],
                        help="torch: PyTorch references; fused: Triton kernels (interpreted on a CPU), "
                             "ieee matmul precision")
    parser.add_argument("--json", action="store_true", help="print the whole JSON document (default: a summary line)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="max_rel_error allowed (default 1e-4)")
    parser.add_argument("--recipe", default=None, help="bidirectional goldens: the recipe to replay with "
                        "(default: the golden's nvlabs_commit's: 40151c8 bidirectional, 5498e5b bidirectional-nvlabs-latest)")
    parser.add_argument("--forward-only", action="store_true", help="bidirectional goldens: the forward, no sampling")
    parser.add_argument("--teacher-steps", default="", help="bidirectional goldens: sampler steps (e.g. 0,3) whose "
                        "model call is also replayed on the golden's inputs")
    args = parser.parse_args(argv)
    extra = {"sample": False} if args.forward_only else {}
    if args.teacher_steps:
        extra["teacher_steps"] = [int(step) for step in args.teacher_steps.split(",")]
    result = replay(args.golden, args.kernels, args.recipe, **extra)
    result["tolerance"] = args.tolerance
    result["passed"] = result["max_rel_error"] <= args.tolerance
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{result['golden']} ({args.kernels}): max_rel_error {result['max_rel_error']:.3g}, "
              f"cosine {result['cosine']:.9f}, {'ok' if result['passed'] else 'FAILED'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
