"""Replay a chunk-causal teacher golden (tools/make_golden_chunk_causal.py) through camrender.

Loads the golden's weights through camrender's original-format loader into a diffusers
`SanaWMTransformer3DModel` of the golden's size, builds the camera conditioning from the golden's
poses and pixel intrinsics with camrender's camera code (the stored `camera_conditions` /
`chunk_plucker` are only compared against), runs `camrender.chunk_causal.sample_chunk_causal` in
fp32 with the golden's text embeddings and noise, and reports `max_rel_error` (max |ours - golden| /
max |golden| over the final latents), `cosine`, per-chunk errors of the final latents and per-step
errors of the guided model predictions of the chunks in flight.

    python3 bench/replay_teacher.py tests/golden/chunk_causal_seed1.safetensors --kernels fused --json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOLERANCE = 1e-4


def max_rel(ours, golden) -> float:
    """max |ours - golden| / max |golden| (float64)."""
    return float((ours.double() - golden.double()).abs().max() / golden.double().abs().max())


def cosine(ours, golden) -> float:
    return float(torch.nn.functional.cosine_similarity(ours.double().flatten(), golden.double().flatten(), dim=0))


def read_golden(path):
    """(tensors, metadata) of a golden file; `metadata` values JSON-decoded where they are JSON."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        raw = handle.metadata() or {}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    meta = {}
    for key, value in raw.items():
        try:
            meta[key] = json.loads(value)
        except (json.JSONDecodeError, TypeError):
            meta[key] = value
    return tensors, meta


def golden_transformer(tensors, meta):
    """fp32 `SanaWMTransformer3DModel` of the golden's size with its weights (camrender's loader)."""
    from diffusers import SanaWMTransformer3DModel

    from camrender.loading import load_transformer_weights

    config = meta["model_config"]
    build = config["build_model_kwargs"]
    model = SanaWMTransformer3DModel(
        in_channels=build["in_channels"], num_layers=config["depth"], hidden_size=config["hidden_size"],
        num_attention_heads=config["num_heads"], linear_head_dim=build["linear_head_dim"],
        caption_channels=build["caption_channels"], chunk_plucker_post_attn_blocks=config["depth"],
        mlp_ratio=build["mlp_ratio"], pos_embed_type=build["pos_embed_type"], softmax_every_n=build["softmax_every_n"],
    ).float().eval()
    weights = {key[len("generator."):]: value for key, value in tensors.items() if key.startswith("generator.")}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "weights.pt")
        torch.save({"generator": weights}, path)
        report = load_transformer_weights(model, path)
    return model, report


def golden_camera(tensors, meta, model):
    """camera_conditions (1, F, 20) and chunk_plucker (1, 48, F, h, w) from the golden's c2w / intrinsics."""
    from camrender.camera import build_camera_inputs
    from camrender.trajectory.model import Trajectory

    shapes = meta["shapes"]
    traj = Trajectory(c2w=tensors["inputs/c2w"].double().numpy(), intrinsics=tensors["inputs/intrinsics"].double().numpy(),
                      width=shapes["pixel_w"], height=shapes["pixel_h"], fps=16.0)
    camera = build_camera_inputs(traj, height=shapes["pixel_h"], width=shapes["pixel_w"],
                                 vae_stride=tuple(shapes["vae_stride"]), patch_size=tuple(model.config.patch_size))
    return camera["camera_conditions"][None], camera["chunk_plucker"][None]


def teacher_options(kernels: str):
    """Segment options of the chunk-causal recipe in fp32 (softmax in fp32 as the goldens)."""
    from camrender.segments import SegmentOptions

    backend = {"torch": "torch", "fused": "triton"}[kernels]
    return SegmentOptions(cached_segments=None, softmax_scale="head", sdpa_dtype=torch.float32, backend=backend,
                          precision="ieee", camera_downscale=False)


def replay(path, kernels: str = "torch", **overrides) -> dict:
    """Replay one chunk-causal golden; returns the JSON report (see the module docstring).

    overrides: `SegmentOptions` fields replacing the recipe's (tests use them to show that another rule
    is caught)."""
    import dataclasses

    from camrender.chunk_causal import sample_chunk_causal, teacher_schedule
    from camrender.render import RenderInputs

    tensors, meta = read_golden(path)
    if meta.get("recipe") != "chunk-causal":
        raise SystemExit(f"{path}: recipe {meta.get('recipe')!r}, not a chunk-causal golden")
    sampler = meta["sampler_config"]
    model, weights = golden_transformer(tensors, meta)
    conditions, plucker = golden_camera(tensors, meta, model)
    cfg = float(sampler["cfg_scale"])
    guided = cfg > 1.0
    text, mask = tensors["inputs/text_embeds"], tensors["inputs/text_mask"]
    if guided:
        text = torch.cat([tensors["inputs/negative_embeds"], text])
        mask = torch.cat([tensors["inputs/negative_mask"], mask])
    inputs = RenderInputs(text=text, text_mask=mask, camera_conditions=conditions.expand(text.shape[0], -1, -1),
                          chunk_plucker=plucker, first_latent=tensors["inputs/first_latent"],
                          noise=tensors["inputs/latents_init"], guidance=cfg)
    starts = tensors["inputs/chunk_bounds"].tolist()
    bounds = list(zip(starts[:-1], starts[1:]))
    schedule = teacher_schedule(len(bounds), steps=int(sampler["steps"]), flow_shift=float(sampler["flow_shift"]),
                                interval_k=float(sampler["interval_k"]))
    matrix = torch.tensor([[schedule.timestep(c, s) for s in range(schedule.total)] for c in range(len(bounds))])

    step_errors = []

    def on_step(step, start, stop, frame_t, prediction):
        raw = tensors[f"step{step}/pred"][:, :, start:stop]
        golden = raw[:1] + cfg * (raw[1:] - raw[:1]) if guided else raw
        step_errors.append(dict(step=step, frames=[start, stop], max_rel_error=max_rel(prediction, golden),
                                timesteps_match=bool(torch.equal(frame_t, tensors[f"step{step}/timestep"][start:stop]))))

    with torch.no_grad():
        options = dataclasses.replace(teacher_options(kernels), **overrides)
        finished = list(sample_chunk_causal(model, inputs, bounds, schedule, options, "cpu", on_step=on_step))
    ours = torch.cat([x for *_, x in finished], dim=2).float()
    golden = tensors["outputs/latents"]
    report = dict(
        golden=str(path), recipe="chunk-causal", kernels=kernels,
        max_rel_error=max_rel(ours, golden), cosine=cosine(ours, golden),
        per_chunk=[max_rel(ours[:, :, a:b], golden[:, :, a:b]) for a, b in bounds],
        per_step=step_errors,
        max_step_rel_error=max(e["max_rel_error"] for e in step_errors),
        schedule_matches=bool(torch.equal(matrix, tensors["inputs/timestep_matrix"])),
        camera_conditions_rel=max_rel(conditions, tensors["inputs/camera_conditions"]),
        chunk_plucker_rel=max_rel(plucker, tensors["inputs/chunk_plucker"]),
        missing_weights=weights.missing, unexpected_weights=weights.unexpected,
        tolerance=TOLERANCE,
    )
    report["ok"] = bool(report["max_rel_error"] <= TOLERANCE and report["schedule_matches"]
                        and all(e["timesteps_match"] for e in step_errors))
    return report


def _has_gpu() -> bool:
    return torch.cuda.is_available()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("golden")
    parser.add_argument("--kernels", choices=["torch", "fused"], default="torch")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = parser.parse_args(argv)
    if args.kernels == "fused" and not _has_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    report = replay(args.golden, args.kernels)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{args.golden} [{args.kernels}]: max_rel_error {report['max_rel_error']:.3g}, cosine "
              f"{report['cosine']:.8f}, per chunk {[f'{e:.3g}' for e in report['per_chunk']]}, "
              f"worst step {report['max_step_rel_error']:.3g} -> {'ok' if report['ok'] else 'FAIL'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
