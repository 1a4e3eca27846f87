"""GPU benchmark of the chunk-causal teacher recipe (camrender.render.chunk_causal) in segment mode, random weights.

At the release shape (704x1280, 128 latent channels, SANA-WM 1.6B DiT in bfloat16, fused kernels):
ChunkFlowEuler with 60 steps, guidance 5 (batch 2), flow shift 9.8, state passing, streaming
causal decode of each finished chunk; per path: stage-1 and decode seconds, video frames per second
of wall time, peak GPU memory, model calls, and the largest number of chunks in flight.

Paths (latent frames -> teacher chunks (0,4),(4,7),...): 21 (161 video frames, 6 chunks) and 31
(241 frames, 10 chunks) with the official interval_k = 1 / chunks (every chunk in flight at once
around step 60: memory grows with the path), plus 31 with interval_k = 1 (one chunk in flight).
Helpers (models, inputs, memory) are bench_segments.py's. JSON on stdout, as bench_segments.py.

    python3 bench/bench_chunk_causal.py --out $OUT/bench_chunk_causal.json     # release shape
    python3 bench/bench_chunk_causal.py --cpu-smoke                            # checks the script
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_segments as bs  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.model.stage1.segments import SegmentOptions  # noqa: E402
from camrender.render.chunk_causal import (DEFAULT_GUIDANCE, DEFAULT_STEPS, sample_chunk_causal,  # noqa: E402
                                    teacher_chunk_bounds, teacher_schedule)
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames  # noqa: E402
from common import GIB, Laps, allocated_bytes, emit, measure, peak_bytes, reset_peak  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", default="21,31", help="latent frames of the paths (default 21,31)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--kernels", default="fused", choices=["fused", "torch"])
    parser.add_argument("--quick", action="store_true", help="8 blocks at 352x640")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU (checks the script)")
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args(argv)


def run_teacher_path(transformer, vae, latent_frames, height, width, options, device, dtype, steps,
                     interval_k=None):
    """Render `latent_frames` with the teacher sampler + streaming decode; times and peak memory."""
    inputs = bs.path_inputs(transformer, latent_frames, height, width, device, dtype, guidance=DEFAULT_GUIDANCE)
    bounds = teacher_chunk_bounds(latent_frames)
    schedule = teacher_schedule(len(bounds), steps=steps, interval_k=interval_k)
    decoder = CausalStreamDecoder(vae)
    calls, widest = [0], [0]

    def on_step(step, start, stop, frame_t, prediction):
        calls[0] += 1
        widest[0] = max(widest[0], stop - start)

    reset_peak()
    base = allocated_bytes()
    frames = 0
    with torch.no_grad():
        laps = Laps(device)
        for _, _, _, latents in sample_chunk_causal(transformer, inputs, bounds, schedule, options, device,
                                                    on_step=on_step):
            laps("stage1")
            frames += len(to_uint8_frames(decoder.decode(latents)))
            laps("decode")
    stage1, decode = laps.totals["stage1"], laps.totals["decode"]
    total = stage1 + decode
    return dict(
        latent_frames=latent_frames, chunks=len(bounds), video_frames=frames, steps=steps, guidance=DEFAULT_GUIDANCE,
        interval_k=round(1.0 / len(bounds) if interval_k is None else interval_k, 4), model_calls=calls[0],
        cache_passes=len(bounds) - 1, widest_call_frames=widest[0],
        stage1_s=round(stage1, 3), decode_s=round(decode, 3), total_s=round(total, 3),
        video_fps=round(frames / total, 3), stage1_fps=round(frames / stage1, 3),
        peak_gib=round(peak_bytes() / GIB, 3), peak_above_weights_gib=round((peak_bytes() - base) / GIB, 3),
    )


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_smoke:
        device, dtype = torch.device("cpu"), torch.float32
        bs.SPATIAL = 8
        height, width = 32, 32
        frames = [7, 10]
        args.steps = min(args.steps, 4)
    elif not torch.cuda.is_available():
        print('{"error": "no CUDA device (use --cpu-smoke to check the script on a CPU)"}')
        return 1
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        height, width = (352, 640) if args.quick else (704, 1280)
        frames = [int(x) for x in args.frames.split(",")]
    recipe = get_recipe("chunk-causal")
    options = SegmentOptions.for_recipe(recipe)  # backend: build_models' patch
    bench_args = argparse.Namespace(cpu_smoke=args.cpu_smoke, quick=args.quick, kernels=args.kernels)
    results = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   kernels=args.kernels, height=height, width=width, dtype=str(dtype).replace("torch.", ""),
                   recipe="chunk-causal", steps=args.steps, guidance=DEFAULT_GUIDANCE, paths={}, errors={})
    began = time.perf_counter()
    transformer, vae = bs.build_models(bench_args, device, dtype)
    results["weights_gib"] = round(allocated_bytes() / GIB, 3)
    results["build_s"] = round(time.perf_counter() - began, 1)

    def record(name, fn):
        value = measure(results["errors"], name, fn)
        if value is not None:
            results["paths"][name] = value
        return value

    # Warm-up (kernel compilation for every in-flight width): a short run of the first path.
    record("warmup", lambda: run_teacher_path(transformer, vae, frames[0], height, width, options, device, dtype,
                                              steps=min(args.steps, 6)))
    results["paths"].pop("warmup", None)
    for latent_frames in frames:
        record(f"frames_{latent_frames}", lambda: run_teacher_path(transformer, vae, latent_frames, height, width,
                                                                  options, device, dtype, args.steps))
    record(f"frames_{frames[-1]}_interval_1", lambda: run_teacher_path(
        transformer, vae, frames[-1], height, width, options, device, dtype, args.steps, interval_k=1.0))
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
