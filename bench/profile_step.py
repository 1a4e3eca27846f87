"""Kernel-level profile of one patched (or stock) SANA-WM denoising step on the GPU.

Runs the release-config transformer of `bench_transformer.py` (random weights, bf16, B=2,
161 frames at 704x1280) once to warm up, then once under `torch.profiler`, and prints JSON:
the GPU kernels grouped by name (total ms, calls), sorted by time, with the step's wall time
and the summed kernel time; the PyTorch ops (with input shapes) behind the GPU time; and the GPU's
idle gaps between kernels (a large total means the step waits on the CPU / launches).

    python3 bench/profile_step.py --top 40 --out profile.json
    python3 bench/profile_step.py --stock           # the unpatched model
    python3 bench/profile_step.py --segments 3      # stage 1 of a 3-segment path in segment mode
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from camrender.model.stage1.patch import patch_transformer  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.model.stage1.segments import SegmentOptions, segment_bounds  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402

from bench_segments import build_models, path_inputs  # noqa: E402
from bench_transformer import bench_setup, build_model, make_inputs  # noqa: E402
from common import Stopwatch, emit  # noqa: E402


def kernel_table(profiler, top: int) -> tuple[list, float]:
    """[(kernel name, total ms, calls)] for the `top` slowest kernel names, and the sum over all kernels."""
    totals, calls = collections.defaultdict(float), collections.Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / 1e3
            calls[event.name] += 1
    rows = sorted(totals.items(), key=lambda item: -item[1])
    return [(name[:120], round(ms, 3), calls[name]) for name, ms in rows[:top]], sum(totals.values())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stock", action="store_true", help="profile the unpatched model")
    parser.add_argument("--quick", action="store_true", help="4 layers, 41 frames")
    parser.add_argument("--segments", type=int, default=0,
                        help="profile stage 1 of a segment-mode path of this many segments instead")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)


    if args.segments:
        return profile_segments(args)
    device, dtype, config, frames, height, width = bench_setup(quick=args.quick)
    model = build_model(config, device, dtype)
    if not args.stock:
        patch_transformer(model, kernels="fused")
    inputs = make_inputs(config, frames, height, width, device, dtype)
    with torch.no_grad():
        model(**inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as profiler:
            with Stopwatch("cuda") as watch:
                model(**inputs)
        wall_ms = watch.seconds * 1e3
    return report(args, "stock" if args.stock else "patched", profiler, wall_ms)


def op_table(profiler, top: int) -> list:
    """[(aten op, input shapes, calls, device ms)]: the PyTorch ops that launched the most GPU time."""
    rows = []
    for entry in profiler.key_averages(group_by_input_shape=True):
        device_us = getattr(entry, "self_device_time_total", None)
        if device_us is None:
            device_us = entry.self_cuda_time_total
        if device_us > 0:
            rows.append((entry.key, str(entry.input_shapes)[:160], entry.count, round(device_us / 1e3, 3)))
    return sorted(rows, key=lambda row: -row[3])[:top]


def union_gaps(spans) -> list:
    """[(ms, i)] for (start, end) spans in microseconds sorted by start: each gap in their union on the clock, and
    the index of the span that ends it (the GPU idle between kernels, when the spans are kernels)."""
    gaps, end = [], None
    for index, (start, stop) in enumerate(spans):
        if end is not None and start > end:
            gaps.append(((start - end) / 1e3, index))
        end = stop if end is None else max(end, stop)
    return gaps


def idle_gaps(profiler, top: int = 15) -> dict:
    """GPU idle time between consecutive kernels: the total and the `top` largest gaps (ms) with the
    kernels on both sides."""
    kernels = sorted((e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    gaps = [(round(ms, 3), kernels[index - 1].name[:60], kernels[index].name[:60])
            for ms, index in union_gaps([(e.time_range.start, e.time_range.end) for e in kernels])]
    gaps.sort(key=lambda row: -row[0])
    return {"total_ms": round(sum(g[0] for g in gaps), 1), "largest": gaps[:top]}


def report(args, variant: str, profiler, wall_ms: float) -> dict:
    rows, kernel_ms = kernel_table(profiler, args.top)
    launches = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    result = {"variant": variant, "wall_ms_profiled": round(wall_ms, 1), "kernel_ms": round(kernel_ms, 1),
              "kernel_launches": launches, "kernels": rows, "ops": op_table(profiler, args.top),
              "gaps": idle_gaps(profiler)}
    emit(result, args.out)
    return result


def profile_segments(args) -> dict:
    """Stage 1 (denoising + cache passes, no decode) of a path of `args.segments` segments."""

    device, dtype = torch.device("cuda"), torch.bfloat16
    build_args = argparse.Namespace(cpu_smoke=False, quick=args.quick, kernels="torch" if args.stock else "fused")
    transformer, _ = build_models(build_args, device, dtype)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))  # backend: build_models' patch
    latent_frames = 1 + 3 * args.segments

    def stage1():
        inputs = path_inputs(transformer, latent_frames, 704, 1280, device, dtype)
        steps = list(DEFAULT_SEGMENT_TIMESTEPS)
        for _ in sample_segments(transformer, inputs, segment_bounds(latent_frames, 3), steps, options, device):
            pass
        torch.cuda.synchronize()

    with torch.no_grad():
        stage1()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as profiler:
            with Stopwatch("cuda") as watch:
                stage1()
        wall_ms = watch.seconds * 1e3
    return report(args, f"segments_{args.segments}", profiler, wall_ms)


if __name__ == "__main__":
    main()
