"""Profile of one steady-state segment of segment mode (stage 1 + decode) at the release shape, on the GPU.

Release-size random weights (SANA-WM 1.6B DiT, LTX-2 VAE), bf16, 704x1280, the streaming recipe (4 denoising
passes over a 3-latent-frame segment, 2640 tokens, then one timestep-0 pass that writes the caches). A path
of `--warm` segments runs first (kernels compiled, CUDA graphs captured, caches full); then segment
`--warm` is measured three ways:

- `timed`: CUDA events around each pass as a render runs it (denoising passes and, in the steady state,
  the cache pass replayed as CUDA graphs) and around the decode of the segment's latents (the streaming
  causal decoder);
- `eager_passes`: the same passes without graphs (host launch cost = eager - graphed);
- `profile`: one more segment eager under `torch.profiler`, with a range around every block's self-attention
  (by kind: GDN or softmax), cross-attention and FFN and around every pass: GPU kernel time per range
  (the block glue is the block's time minus its three parts), the kernels by name, the PyTorch ops (with
  input shapes) behind the most GPU time, idle gaps;
- `graphed_profile`: one more segment as a render runs it (graphs replayed) under `torch.profiler`: its
  kernel time against its span on the GPU, and the largest idle gaps (where the GPU waits for the host).

    python3 bench/profile_segment.py --out $OUT/profile_segment.json
    python3 bench/profile_segment.py --cpu-smoke        # tiny models on the CPU: checks the script
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_segments  # noqa: E402
from bench_segments import build_models, path_inputs  # noqa: E402
from common import Events, emit, sync  # noqa: E402
from profile_step import idle_gaps, op_table, union_gaps  # noqa: E402
import camrender.model.stage1.ffn as ffn_module  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.model.stage1.segments import SegmentCache, segment_bounds  # noqa: E402
from camrender.render.decode import CausalStreamDecoder, decode_max_frames  # noqa: E402
from camrender.render.denoise import Denoiser, pin, pinned_frames  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segment, segment_options  # noqa: E402


def timed_segment(denoiser, cache, decoder, start, stop, timesteps, *, graphs: bool) -> list:
    """[(pass name, ms)] of one segment: each denoising pass, the cache pass, the decode."""
    inputs, device = denoiser.inputs, denoiser.device
    saved = denoiser.graphs, denoiser.write_graphs
    if not graphs:
        denoiser.graphs = denoiser.write_graphs = None
    events = Events(device)
    latents = inputs.noise[:, :, start:stop].to(device=device, dtype=torch.float32).clone()
    pinned = pinned_frames(inputs, start, stop, device)
    with record_function("pass.conditioning"):
        conditioning = denoiser.condition(start, stop)
    events.mark("conditioning")
    sigmas = [t / 1000.0 for t in timesteps] + [0.0]
    for index, t in enumerate(timesteps):
        with record_function("pass.denoise"):
            velocity = denoiser.predict(latents, pin(pinned, t), conditioning, cache=cache)
            latents = latents + (sigmas[index + 1] - sigmas[index]) * velocity
        events.mark(f"denoise_{index}")
    with record_function("pass.cache"):
        denoiser.predict(latents, torch.zeros(stop - start, device=device), conditioning, cache=cache, write=True)
    events.mark("cache_pass")
    with record_function("pass.decode"):
        decoder.decode(latents)
    events.mark("decode")
    denoiser.graphs, denoiser.write_graphs = saved
    laps = events.laps_ms()
    laps.append(("stage1_total", round(sum(ms for name, ms in laps if name != "decode"), 3)))
    return laps


def annotate(model) -> list:
    """Put a `record_function` range around every block and its self-attention, cross-attention and FFN;
    returns the undo callables. The FFN is not called as a module (the block runs its parts,
    `ffn_parts`), so that function is wrapped where the block module finds it, and the cross-attention's
    processor class is wrapped for the same reason."""
    handles = []
    kinds = {}

    block_module = sys.modules[type(model.blocks[0]).__module__]
    original = ffn_module.ffn_parts

    def ffn_parts(mlp, *args, **kwargs):
        with record_function(f"ffn.{kinds.get(id(mlp), 'gdn')}"):
            return original(mlp, *args, **kwargs)

    for module in (ffn_module, block_module):
        if getattr(module, "ffn_parts", None) is original:
            setattr(module, "ffn_parts", ffn_parts)
            handles.append(lambda module=module: setattr(module, "ffn_parts", original))

    # the cross-attention's processor, not the module: under FP8 the block calls the processor itself (with the
    # query's quantized rows), and would not while the module had hooks
    processor_class = block_module.FusedCrossAttnProcessor
    called = processor_class.__call__

    def cross_attention(processor, attn, *args, **kwargs):
        with record_function(f"cross_attn.{kinds.get(id(attn), 'gdn')}"):
            return called(processor, attn, *args, **kwargs)

    processor_class.__call__ = cross_attention
    handles.append(lambda: setattr(processor_class, "__call__", called))

    def ranged(module, name):
        state = {}

        def enter(*_):
            state["range"] = record_function(name)
            state["range"].__enter__()

        def leave(*_):
            state.pop("range").__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter).remove)
        handles.append(module.register_forward_hook(leave).remove)

    for block in model.blocks:
        kind = "gdn" if "GDN" in type(block.attn).__name__ else "softmax"
        ranged(block, f"block.{kind}")
        ranged(block.attn, f"attn.{kind}")
        kinds[id(block.mlp)] = kinds[id(block.cross_attn)] = kind
    return handles


def device_ms(event) -> float:
    total = getattr(event, "device_time_total", None)
    if total is None:
        total = event.cuda_time_total
    return total / 1e3


def profile_table(profiler, ranges: set) -> dict:
    """GPU ms per range name (summed), the block glue per kind, kernels by name (top 25), idle gaps."""
    per_range, calls = collections.defaultdict(float), collections.Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CPU and event.name in ranges:
            per_range[event.name] += device_ms(event)
            calls[event.name] += 1
    glue = {}
    for kind in ("gdn", "softmax"):
        if f"block.{kind}" in per_range:
            glue[f"glue.{kind}"] = round(per_range[f"block.{kind}"] - sum(
                per_range.get(f"{part}.{kind}", 0.0) for part in ("attn", "cross_attn", "ffn")), 3)
    kernels, kernel_calls = collections.defaultdict(float), collections.Counter()
    spans = []
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.name not in ranges \
                and not event.name.startswith(("pass.", "segment")):
            kernels[event.name] += event.device_time / 1e3
            kernel_calls[event.name] += 1
            spans.append((event.time_range.start, event.time_range.end))
    spans.sort()
    idle = sum(ms for ms, _ in union_gaps(spans))
    top = sorted(kernels.items(), key=lambda item: -item[1])[:25]
    return dict(
        ranges_ms={name: round(ms, 3) for name, ms in sorted(per_range.items())},
        range_calls=dict(calls), glue_ms=glue,
        kernel_ms_total=round(sum(kernels.values()), 3), kernel_launches=sum(kernel_calls.values()),
        gpu_idle_ms=round(idle, 3), gpu_span_ms=round(((spans[-1][1] - spans[0][0]) / 1e3) if spans else 0, 3),
        kernels=[(name[:110], round(ms, 3), kernel_calls[name]) for name, ms in top],
    )


# PyTorch ops that only move or combine activations elementwise: where a fused kernel could take them over
ELEMENTWISE_OPS = ("aten::copy_", "aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::cat",
                   "aten::where", "aten::sub", "aten::fill_", "aten::zero_", "aten::index", "aten::index_put_")


def copy_sites(profiler, top: int = 40) -> list:
    """[(op, the camrender frames of its Python stack, innermost first, calls, device ms)] of the elementwise ops
    (`ELEMENTWISE_OPS`), by GPU time (CPU time off CUDA): which line of the model launched each copy. Needs
    `with_stack`."""
    totals, calls = collections.defaultdict(float), collections.Counter()
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CPU or event.name not in ELEMENTWISE_OPS:
            continue
        # older PyTorch lists the frames on the op (`stack`), newer as the op's Python-function parents
        names, parent = list(event.stack or []), event.cpu_parent
        while parent is not None and not event.stack:
            names.append(parent.name)
            parent = parent.cpu_parent
        frames = [name.split("camrender/")[-1] for name in names if "camrender/" in name or "kernels/" in name][:4]
        us = event.self_device_time_total if torch.cuda.is_available() else event.self_cpu_time_total
        key = (event.name, tuple(frames))
        totals[key] += us / 1e3
        calls[key] += 1
    rows = [(name, list(frames), calls[(name, frames)], round(ms, 3)) for (name, frames), ms in totals.items()]
    return sorted(rows, key=lambda row: -row[3])[:top]


def ops_within(profiler, range_name: str, top: int = 25) -> list:
    """[(op, input shapes, calls, device ms, host ms)] of the PyTorch ops called inside the CPU range
    `range_name` (outermost ops only), by device time: what a pass outside the model's blocks launches."""
    ranges = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CPU and e.name == range_name]
    if not ranges:
        return []
    outer = ranges[0]
    totals, calls, host = collections.defaultdict(float), collections.Counter(), collections.defaultdict(float)
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CPU or event.name == range_name \
                or not event.name.startswith("aten::") or event.cpu_parent is None \
                or event.cpu_parent.name.startswith("aten::"):
            continue
        if not (outer.time_range.start <= event.time_range.start and event.time_range.end <= outer.time_range.end):
            continue
        key = (event.name, str(event.input_shapes)[:120])
        totals[key] += device_ms(event)
        host[key] += event.cpu_time_total / 1e3
        calls[key] += 1
    rows = [(name, shapes, calls[(name, shapes)], round(ms, 3), round(host[(name, shapes)], 3))
            for (name, shapes), ms in totals.items()]
    return sorted(rows, key=lambda row: -(row[3] + row[4]))[:top]


def host_ms(profiler) -> dict:
    """Host (CPU) ms spent in each `pass.*` range: enqueueing, when the GPU runs behind."""
    totals = collections.defaultdict(float)
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("pass."):
            totals[event.name] += event.cpu_time_total / 1e3
    return {name: round(ms, 3) for name, ms in sorted(totals.items())}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=4, help="segments rendered before the measured one")
    parser.add_argument("--stage1-precision", default="bf16", choices=("bf16", "fp8"),
                        help="stage 1's block linears, as bench_segments.py --stage1-precision")
    parser.add_argument("--ops", type=int, default=60, help="rows of the op table (PyTorch ops and kernels)")
    parser.add_argument("--stacks", action="store_true",
                        help="also record Python stacks in the eager profile: `copy_sites`, the copies and elementwise "
                             "ops by the camrender line that launched them")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU (checks the script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device, dtype, height, width = torch.device("cpu"), torch.float32, 32, 32
        bench_segments.SPATIAL = 8
    else:
        device, dtype, height, width = torch.device("cuda"), torch.bfloat16, 704, 1280
    build = argparse.Namespace(cpu_smoke=args.cpu_smoke, quick=False, kernels="fused",
                               stage1_precision=args.stage1_precision)
    transformer, vae = build_models(build, device, dtype)
    recipe = get_recipe("streaming")
    options = segment_options(recipe, recipe.recent_chunks)  # as a render without the refiner runs it
    latent_frames = 1 + 3 * (args.warm + 4)
    bounds = segment_bounds(latent_frames, 3)
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)
    timesteps = list(DEFAULT_SEGMENT_TIMESTEPS)
    cache = SegmentCache.empty(transformer)
    denoiser = Denoiser(transformer, inputs, options, device, cuda_graphs=device.type == "cuda")
    decoder = CausalStreamDecoder(vae, device=device, max_frames=decode_max_frames(refined=False))  # as a render
    result = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                  height=height, width=width, segment_latent_frames=3, timesteps=timesteps,
                  stage1_precision=args.stage1_precision)
    with torch.no_grad():
        for start, stop in bounds[:args.warm]:
            decoder.decode(sample_segment(denoiser, start, stop, cache, timesteps))
        sync()
        start, stop = bounds[args.warm]
        result["timed"] = timed_segment(denoiser, cache, decoder, start, stop, timesteps, graphs=True)
        start, stop = bounds[args.warm + 1]
        result["eager_passes"] = timed_segment(denoiser, cache, decoder, start, stop, timesteps, graphs=False)

        handles = annotate(transformer)
        ranges = {f"{part}.{kind}" for part in ("block", "attn", "cross_attn", "ffn") for kind in ("gdn", "softmax")}
        ranges |= {"pass.denoise", "pass.cache", "pass.decode"}
        start, stop = bounds[args.warm + 2]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities, record_shapes=True, with_stack=args.stacks) as profiler:
            timed_segment(denoiser, cache, decoder, start, stop, timesteps, graphs=False)
            sync()
        for undo in handles:
            undo()
        result["profile"] = profile_table(profiler, ranges)
        result["profile"]["ops"] = op_table(profiler, args.ops)
        result["profile"]["conditioning_ops"] = ops_within(profiler, "pass.conditioning")
        if args.stacks:
            result["profile"]["copy_sites"] = copy_sites(profiler)

        start, stop = bounds[args.warm + 3]
        with profile(activities=activities) as profiler:
            timed_segment(denoiser, cache, decoder, start, stop, timesteps, graphs=True)
            sync()
        graphed = profile_table(profiler, set())
        result["graphed_profile"] = dict(
            kernel_ms_total=graphed["kernel_ms_total"], kernel_launches=graphed["kernel_launches"],
            gpu_span_ms=graphed["gpu_span_ms"], gpu_idle_ms=graphed["gpu_idle_ms"],
            gaps=idle_gaps(profiler, top=20), kernels=graphed["kernels"][:12], host_ms=host_ms(profiler))
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
