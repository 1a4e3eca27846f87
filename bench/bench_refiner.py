"""GPU benchmark of stage 2 (the SANA-WM refiner, camrender.model.refiner.stream) in segment mode, random weights.

At the release shape (704x1280: 22x40 latent tokens per frame, 128 latent channels, bf16), with
the release configs (SANA-WM 1.6B DiT and LTX-2 VAE as in bench_segments.py; the refiner
transformer at diffusers' `SanaWMLTX2RefinerTransformer3DModel` defaults: 48 layers, 32 heads x
128, audio branch dropped as camrender does; a Gemma-3-12B-shaped text model standing in for the
refiner's text encoder; a Gemma-2-2B-shaped stage-1 text encoder held on the GPU as in a render),
one run measures side by side:

- segment mode without and with the refiner on the same path (stage 1 + refiner + streaming
  decode; video frames per second of wall time, end to end and in steady state, the median time
  between two segments' frames; no syncs inside), with the stages overlapped on CUDA streams (three
  schedules: `stage_two.Schedule`) and in order, and a breakdown per stage (synced per segment);
- the refiner alone in steady state (window full): seconds per block
  (= per segment of 3 latent frames = 24 video frames) and per second of video, the host time to
  enqueue a block against its GPU time, and the host-device syncs inside a block (torch.cuda sync
  debug mode);
- the refiner's FLOPs per block (torch's FlopCounterMode on a real block: GEMMs and attention)
  and the roofline they imply at 790 TFLOP/s (bf16 dense, H200): the fastest a refiner can go,
  and segment mode's ceiling with it given the measured stage 1 + decode;
- the refiner blocks' fused path (`camrender.model.refiner.block`: fused q/k norm + RoPE, the KV window
  read in place, fused adaLN glue) against diffusers' stock blocks (`--refiner-kernels both`):
  segment mode and steady state side by side, kernel launches per layer and pass (torch.profiler);
- peak GPU memory of each `--refiner-offload` setting (none: the refiner's DiT resident and the
  text encoder visiting the GPU once; layers: both stream their blocks), prompt encoding and
  render separately, and which setting fits 24/48/80/141 GB GPUs.

The refiner's prompt is random embeddings (1024 tokens) for the render figures; the Gemma-3
encode is timed on its own (it runs once per render). Prints one JSON line per measurement, then
the whole document; `--out FILE` also writes it. About 3-5 minutes on one H200.

    python3 bench/bench_refiner.py --out $OUT/bench_refiner.json     # release shape, one H200
    python3 bench/bench_refiner.py --segments 8 --skip-layers        # quicker (no layer-streaming run)
    python3 bench/bench_refiner.py --tiny                            # the script's logic on a CPU
    python3 bench/bench_refiner.py --setting bf16 --allocator default  # PyTorch's allocator, no expandable segments
    python3 bench/bench_refiner.py --setting bf16 --refiner-window-layout split  # the window without the block's slot
    python3 bench/bench_refiner.py --setting bf16-40gib       # the bf16 default under a 40 GiB cap
    python3 bench/bench_refiner.py --setting bf16-48gb        # 12 of the refiner's blocks streamed, a 44 GiB cap
    python3 bench/bench_refiner.py --setting fp8-22gib-stream --refiner-offload 32  # another number of streamed blocks
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import allocator_pools  # noqa: E402
import bench_segments as stage_one  # noqa: E402
import refiner_targets  # noqa: E402
from camrender.allocator import ALLOC_CONF, use_expandable_segments  # noqa: E402
from camrender.model.refiner import window as refiner_window  # noqa: E402
from camrender.model.refiner.loading import stream_layers  # noqa: E402
from camrender.model.refiner.stream import RefinerStream  # noqa: E402
from camrender.model.stage1.segments import segment_bounds  # noqa: E402
from camrender.render.decode import REFINED_DECODE_MAX_FRAMES, CausalStreamDecoder, to_uint8_frames  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402
from camrender.render.stage_two import PassThrough, Schedule, refined_frames  # noqa: E402
from common import GIB, HostSyncs, Laps, emit, measure, gib, peak_bytes, reset_peak, sync  # noqa: E402
from refiner_common import (GEMMA2_2B, GEMMA3_12B_TEXT, VIDEO_FPS, as_refiner, build_refiner_transformer,  # noqa: E402,F401
                            build_text_model, default_dtype, kernel_backend, refiner_text)

PEAK_BF16_FLOPS = 790e12  # H200 dense bf16 tensor-core peak used for the roofline
GPU_SIZES_GB = (24, 48, 80, 141)
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm")
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny models: checks the script (no figures)")
    parser.add_argument("--segments", type=int, default=16,
                        help="path length in segments (3 latent frames each; the refiner's window is full from the 5th)")
    parser.add_argument("--layers-segments", type=int, default=3, help="segments rendered with --refiner-offload layers")
    parser.add_argument("--skip-layers", action="store_true", help="skip the layer-streaming memory run")
    parser.add_argument("--refiner-kernels", choices=("both", "fused", "torch"), default="both",
                        help="the refiner blocks' path (camrender.model.refiner.block): both = side by side rows "
                             "(the stock ones suffixed _stock_kernels), fused (renders' default) or stock only")
    parser.add_argument("--text-tokens", type=int, default=1024, help="refiner prompt tokens (release: 1024)")
    parser.add_argument("--setting", default=None, choices=tuple(refiner_targets.SETTINGS),
                        help="only this row of the memory/precision targets, with a memory breakdown per phase "
                             "(bench/refiner_targets.py); run each in its own process (a memory cap stays)")
    parser.add_argument("--refiner-offload", default=None, metavar="none|layers|N",
                        help="with --setting: the refiner's placement instead of the setting's (N: blocks streamed)")
    parser.add_argument("--refiner-window-layout", choices=("split", "slot"), default="slot",
                        help="the refiner's KV window (camrender.model.refiner.window): with the block's slot (one "
                             "attention call; renders' default), or sink + history with the block attended to apart, "
                             "merged by log-sum-exp (2.1 GB less at the release shape), to compare")
    parser.add_argument("--allocator", choices=("expandable", "default"), default="expandable",
                        help="PyTorch's CUDA allocator: expandable segments, as camrender's processes run (unless "
                             "PYTORCH_CUDA_ALLOC_CONF is set), or PyTorch's default, to compare")
    parser.add_argument("--schedule", choices=tuple(refiner_targets.SCHEDULES), default="rendered",
                        help="with --setting: how the stages are queued (refiner_targets.SCHEDULES)")
    parser.add_argument("--memory-history", action="store_true",
                        help="with --setting: record the allocator's events, so the pools say who allocated the "
                             "largest free blocks (bench/allocator_pools.py)")
    parser.add_argument("--trace-segments", type=int, default=0,
                        help="with --setting: trace this many steady segments of the timed render on CUDA (GPU "
                             "busy and idle per stream, host calls in the idle gaps: bench/pipeline_trace.py)")
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args(argv)


def render_path(models, segments, refined, *, breakdown=False, overlap=None, schedule=Schedule(), kernels="fused"):
    """Segment mode on a path of `segments` segments: stage 1 -> refiner (optional) -> streaming decode.

    Without `breakdown`: the render's own loop (`camrender.render.stage_two.refined_frames`; `overlap`: the stages
    overlapped on CUDA streams, default as rendered), timed end to end, from the first frames out to the last, and
    in steady state (`video_fps_steady`: what a long path approaches). With it: the same stages in sequence,
    synced after each stage of each segment to time them apart.
    Stage 1 replays its CUDA graphs; the refiner runs eagerly, as in renders.
    kernels: the refiner blocks' path, "fused" or "torch" (`RefinerStream`'s `kernels`).
    schedule: how the overlap places the stages on CUDA streams (`camrender.render.stage_two.Schedule`).
    """
    transformer, vae, refiner_transformer, text, shape, options, device, dtype = models
    height, width = shape
    latent_frames = 1 + 3 * segments
    inputs = stage_one.path_inputs(transformer, latent_frames, height, width, device, dtype)
    decoder = CausalStreamDecoder(vae, max_frames=REFINED_DECODE_MAX_FRAMES)  # as segment mode renders
    stream = RefinerStream(as_refiner(refiner_transformer), text, fps=VIDEO_FPS, device=device,
                           generator=torch.Generator().manual_seed(0), kernels=kernels,
                           kernel_backend=kernel_backend(device)) if refined else PassThrough()
    arrivals = []  # (wall time, video frames so far) at each yield of the render loop
    frames = 0
    lap = Laps(device)
    started = lap.last

    with torch.no_grad():
        chunks = (x for *_, x in sample_segments(transformer, inputs, segment_bounds(latent_frames, 3),
                                                 list(DEFAULT_SEGMENT_TIMESTEPS), options, device,
                                                 cuda_graphs=device.type == "cuda"))
        if not breakdown:
            for _, chunk in refined_frames(stream, chunks, decoder, device, overlap=overlap,
                                                     schedule=schedule):
                frames += len(chunk)
                arrivals.append((time.perf_counter(), frames))
        else:
            for latents in chunks:
                lap("stage1")
                latents = stream.push(latents)
                stream.settle()  # the block's history pass, timed with its refinement
                lap("refiner")
                if latents.shape[2]:
                    frames += len(to_uint8_frames(decoder.decode(latents)))
                lap("decode")
            tail = stream.finish()
            if tail.shape[2]:
                frames += len(to_uint8_frames(decoder.decode(tail)))
    lap("end")
    total = lap.last - started
    times = dict(dict(stage1=0.0, refiner=0.0, decode=0.0), **lap.totals)
    times.pop("end")
    result = dict(segments=segments, video_frames=frames, total_s=round(total, 3), video_fps=round(frames / total, 2))
    if len(arrivals) >= 2:  # frames yielded after the first ones over the time they took
        (t0, f0), (t1, f1) = arrivals[0], arrivals[-1]
        result["video_fps_after_first_frames"] = round((f1 - f0) / (t1 - t0), 2) if t1 > t0 else None
    # The steady rate: the median time between two segments' frames once the warm-up is over, leaving out the last
    # segment's, which can arrive right after the one before (its work was queued before the host waited for
    # those frames, and the GPU had nearly caught up with the queue).
    result.update(refiner_targets.steady_rates(arrivals))
    if breakdown:
        result.update({f"{name}_s": round(value, 3) for name, value in times.items() if value})
        if refined:
            result["refiner_s_per_segment"] = round(times["refiner"] / segments, 4)
    return result


def launches_per_layer(stream, block, device):
    """GPU kernels (and copies) launched per transformer layer and pass while `stream` refines `block`
    (3 denoising passes + the cache pass; torch.profiler on CUDA; None elsewhere)."""
    stream.settle()  # only this block's passes below
    if device.type != "cuda":
        stream.push(block)
        stream.settle()
        return None

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        stream.push(block)
        stream.settle()
        sync()
    kernels = sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)
    return round(kernels / (4 * len(stream.transformer.transformer_blocks)), 1)


def refiner_steady_state(refiner_transformer, text, shape, device, dtype, blocks=3, kernels="fused", nudge=False):
    """The refiner alone, window full: per-block GPU and host-enqueue time, syncs inside a block, FLOPs,
    kernel launches per layer.
    `first_block` (popped by main): the first timed block's refined latents, the same block for every row.
    nudge: move every clip value one ulp up (in `dtype`): the reference's own noise floor."""
    h, w = shape[0] // stage_one.SPATIAL, shape[1] // stage_one.SPATIAL
    channels = refiner_transformer.config.in_channels
    # sink + 4 blocks = 13 frames: the history holds its 10 frames from here on
    warm_blocks = 4
    # one clip and one noise seed for every row
    clip = torch.randn(1, channels, 1 + 3 * (warm_blocks + blocks + 3), h, w, generator=torch.Generator().manual_seed(2))
    clip = clip.to(device, dtype)
    if nudge:
        clip = torch.nextafter(clip, torch.full_like(clip, float("inf")))
    stream = RefinerStream(as_refiner(refiner_transformer), text, fps=VIDEO_FPS, device=device,
                           generator=torch.Generator().manual_seed(0), kernels=kernels,
                           kernel_backend=kernel_backend(device))
    stream.push(clip[:, :, :1 + 3 * warm_blocks])
    stream.settle()
    sync()
    gpu, enqueue, refined = [], [], []
    for index in range(blocks):
        start = 1 + 3 * (warm_blocks + index)
        began = time.perf_counter()
        refined.append(stream.push(clip[:, :, start:start + 3]))
        stream.settle()  # a block: 3 denoising passes and its history pass
        enqueue.append(time.perf_counter() - began)
        sync()
        gpu.append(time.perf_counter() - began)
    start = 1 + 3 * (warm_blocks + blocks)
    with HostSyncs(device) as host_syncs:
        stream.push(clip[:, :, start:start + 3])
        stream.settle()
    syncs = host_syncs.count
    history_frames = stream.history_frames
    counter = FlopCounterMode(display=False)
    with counter:
        stream.push(clip[:, :, start + 3:start + 6])
        stream.settle()
    counts = counter.get_flop_counts().get("Global", {})
    launches = launches_per_layer(stream, clip[:, :, start + 6:start + 9], device)
    gemm = sum(v for op, v in counts.items() if str(op).split(".")[-1] in GEMM_OPS)
    counted_attention = sum(v for op, v in counts.items() if "attention" in str(op))
    # QK^T and PV (2 flops per multiply-add each) of the 3 denoising passes and the cache pass, per layer:
    # self-attention over [sink, history, block], cross-attention over the prompt tokens
    config = refiner_transformer.config
    inner = config.num_attention_heads * config.attention_head_dim
    tokens = h * w // config.patch_size ** 2
    queries, keys = 3 * tokens, (stream.sink_frames + history_frames + 3) * tokens
    analytic_attention = 4 * config.num_layers * 4 * queries * (keys + text.embeds.shape[1]) * inner
    attention = counted_attention or analytic_attention  # FlopCounterMode counts SDPA on CUDA, not on every CPU path
    per_block = sorted(gpu)[len(gpu) // 2]
    return dict(kernels=kernels, blocks_timed=blocks,
                first_block=refined[0], launches_per_layer_pass=launches,
                s_per_block=round(per_block, 4),
                s_per_video_second=round(per_block * VIDEO_FPS / 24, 4),
                enqueue_s_per_block=round(sorted(enqueue)[len(enqueue) // 2], 4), host_syncs_per_block=syncs,
                flop_per_block=gemm + attention, gemm_flop_per_block=gemm,
                tflop_per_block=round((gemm + attention) / 1e12, 3), gemm_tflop_per_block=round(gemm / 1e12, 3),
                attention_tflop_per_block=round(attention / 1e12, 3),
                attention_tflop_analytic=round(analytic_attention / 1e12, 3),
                window_frames=stream.sink_frames + history_frames + 3,
                flop_by_op={str(op): round(v / 1e12, 4) for op, v in counts.items()})


def relative_difference(block, reference):
    """max |block - reference| / max |reference| of two refined blocks."""
    difference = (block.float() - reference.float()).abs().max().item()
    return float(f"{difference / max(reference.float().abs().max().item(), 1e-12):.3g}")


def kernels_comparison(fused, stock, fused_render, stock_render, stock_nudged_block=None):
    """The fused refiner path against diffusers' stock blocks: steady-state seconds and launches per block,
    segment-mode fps, and how far the same refined block lies apart (bf16 rounding, relative to its scale),
    beside the stock blocks' own distance under a one-ulp change of the clip (the agreement bar)."""
    row = dict(s_per_block_fused=fused["s_per_block"], s_per_block_stock=stock["s_per_block"],
               speedup=round(stock["s_per_block"] / fused["s_per_block"], 3),
               enqueue_s_per_block_fused=fused["enqueue_s_per_block"],
               enqueue_s_per_block_stock=stock["enqueue_s_per_block"],
               launches_per_layer_pass_fused=fused["launches_per_layer_pass"],
               launches_per_layer_pass_stock=stock["launches_per_layer_pass"],
               block_max_abs_diff_over_max_abs=relative_difference(fused["first_block"], stock["first_block"]))
    if stock_nudged_block is not None:
        row.update(stock_one_ulp_floor=relative_difference(stock_nudged_block, stock["first_block"]))
        row.update(within_floor=row["block_max_abs_diff_over_max_abs"] <= row["stock_one_ulp_floor"])
    if fused_render and stock_render:
        row.update(video_fps_fused=fused_render["video_fps"], video_fps_stock=stock_render["video_fps"])
    return row


def steady_row(row, blocks):
    """The steady-state row for the JSON: its refined block (a tensor) moved to `blocks`."""
    if row is not None:
        blocks.append(row.pop("first_block"))
    return row


def roofline(steady, plain_fps):
    """What 790 TFLOP/s allows: the refiner's floor per block and segment mode's ceiling with it, the stages
    in sequence (steady: the eager steady-state row, which counts the FLOPs; plain_fps: video frames per second
    of stage 1 + decode without the refiner)."""
    floor_s = steady["flop_per_block"] / PEAK_BF16_FLOPS
    refiner_fps = 24 / floor_s
    ceiling = 1 / (1 / plain_fps + 1 / refiner_fps) if plain_fps else None
    return dict(peak_tflops=PEAK_BF16_FLOPS / 1e12,
                refiner_tflop_per_video_second=round(steady["flop_per_block"] * VIDEO_FPS / 24 / 1e12, 2),
                refiner_gemm_tflop_per_video_second=round(steady["gemm_flop_per_block"] * VIDEO_FPS / 24 / 1e12, 2),
                refiner_floor_s_per_block=round(floor_s, 4), refiner_only_fps_at_peak=round(refiner_fps, 2),
                refiner_only_fps_measured=round(24 / steady["s_per_block"], 2),
                segment_mode_fps_ceiling_with_refiner=None if ceiling is None else round(ceiling, 2),
                refiner_measured_fraction_of_peak=round(floor_s / steady["s_per_block"], 3))


def fits(peaks):
    """Per GPU size, the first setting whose measured peak leaves 8% headroom (CUDA context, fragmentation)."""
    table = {}
    for size in GPU_SIZES_GB:
        usable = size * 1e9 * 0.92 / GIB
        table[f"{size}GB"] = next((name for name, peak in peaks.items() if peak is not None and peak <= usable), None)
    return table


def memory_settings(args, models, results, record, peak_of, peaks):
    """Peak GPU memory of `--refiner-offload none` (the Gemma-3 encode with everything resident, then the
    render already measured) and `layers` (refiner DiT and text encoder streaming their blocks)."""
    transformer, vae, refiner_transformer, text, shape, options, device, dtype = models
    text_model = build_text_model(args.tiny, device, dtype)
    results["text_encoder_weights_gib"] = gib(sum(p.numel() * p.element_size() for p in text_model.parameters()))
    tokens = torch.randint(0, text_model.config.vocab_size, (1, args.text_tokens), device=device)

    def encode():
        sync()
        began = time.perf_counter()
        with torch.no_grad():
            text_model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_hidden_states=True)
        sync()
        return dict(encode_s=round(time.perf_counter() - began, 3))

    encode()  # warm-up
    none_encode = record("none_encode", lambda: peak_of(encode))  # everything resident at once
    text_model.to("cpu")
    none_render = results.get("with_refiner")
    if none_encode is not None and none_render is not None:
        peaks["none"] = max(none_encode["peak_gib"], none_render["peak_gib"])
    if args.skip_layers:
        return

    def layered():
        # lazy: accelerate is optional (the offload extra)
        import accelerate  # noqa: F401  (diffusers' group offloading needs it, as camrender's --offload does)

        refiner_transformer.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        stream_layers(SimpleNamespace(transformer=refiner_transformer, text_encoder=text_model), device,
                      use_stream=device.type == "cuda")
        encode()  # onloads once (group offloading learns the block order on its first call)
        value = {"encode": peak_of(encode)}
        value["render"] = peak_of(lambda: render_path(models, args.layers_segments, True, breakdown=True))
        return value

    layers = record("layers", layered)
    if layers is not None:
        peaks["layers"] = max(layers["encode"]["peak_gib"], layers["render"]["peak_gib"])


def main(argv=None):
    args = parse_args(argv)
    if args.allocator == "expandable":  # before CUDA's allocator starts (camrender.allocator)
        use_expandable_segments()
    allocator = os.environ.get(ALLOC_CONF) or "default"
    refiner_window.BLOCK_SLOT = args.refiner_window_layout == "slot"  # read by every RefinerStream made below
    if args.setting is not None:
        if not args.tiny and not torch.cuda.is_available():
            print(json.dumps({"error": "no CUDA device (use --tiny to check the script on a CPU)"}))
            return 1

        if args.tiny:
            args.segments = min(args.segments, 4)
        elif args.memory_history:
            allocator_pools.record_history()
        emit(dict(refiner_targets.run_setting(args, args.setting), allocator=allocator,
                  refiner_window_layout=args.refiner_window_layout), args.out)
        return 0
    if args.tiny:
        device, dtype, shape = torch.device("cpu"), torch.float32, (32, 32)
        stage_one.SPATIAL = 8
        args.text_tokens = min(args.text_tokens, 16)
        args.segments = min(args.segments, 4)  # 4 yields: enough for the steady rate
    elif not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device (use --tiny to check the script on a CPU)"}))
        return 1
    else:
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, (704, 1280)
    results = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   tiny=args.tiny, height=shape[0], width=shape[1], dtype=str(dtype).replace("torch.", ""),
                   video_fps=VIDEO_FPS, text_tokens=args.text_tokens, segments=args.segments, allocator=allocator,
                   refiner_window_layout=args.refiner_window_layout, errors={},
                   note="random weights; refiner prompt = random embeddings for the renders, the Gemma-3 encode is "
                        "timed on its own; segment mode: 4-step list, no guidance, CUDA graphs for stage 1")
    began_all = time.perf_counter()

    def record(name, fn):
        results[name] = measure(results["errors"], name, fn)
        return results[name]

    def peak_of(fn):
        """fn's result with the peak GPU memory it reached (everything allocated counts; 0 off CUDA)."""
        reset_peak(device)
        value = fn()
        value["peak_gib"] = gib(peak_bytes(device))
        return value

    allocated = (lambda: torch.cuda.memory_allocated()) if device.type == "cuda" else (lambda: 0)
    kernels = "fused" if device.type == "cuda" else "torch"  # on a CPU (tests) the PyTorch references, never the interpreter
    stage_args = SimpleNamespace(cpu_smoke=args.tiny, quick=False, kernels=kernels)
    transformer, vae = stage_one.build_models(stage_args, device, dtype)
    if not args.tiny:
        # lazy: transformers' Gemma classes are optional here (a transformers without them still runs the other benches)
        from transformers import Gemma2Config, Gemma2ForCausalLM

        with torch.device(device), default_dtype(dtype):
            stage_one_text_encoder = Gemma2ForCausalLM(Gemma2Config(**GEMMA2_2B)).eval()  # noqa: F841 (kept resident)
    results["stage1_weights_gib"] = gib(allocated())  # DiT, VAE and (release) the Gemma-2-2B text encoder
    before = allocated()
    refiner_transformer = build_refiner_transformer(args.tiny, device, dtype)
    results["refiner_weights_gib"] = gib(allocated() - before)
    results["refiner_params_b"] = round(sum(p.numel() for p in refiner_transformer.parameters()) / 1e9, 3)
    text = refiner_text(refiner_transformer, args.text_tokens, device, dtype)
    options = refiner_targets.REFINED_OPTIONS  # backend: the one build_models patched the transformer with
    models = (transformer, vae, refiner_transformer, text, shape, options, device, dtype)
    results["build_s"] = round(time.perf_counter() - began_all, 1)

    # warm-up: compiles the kernels and captures every stage-1 segment layout; fills the refiner window
    record("warmup", lambda: peak_of(lambda: render_path(models, min(5, args.segments), True)))
    plain = record("without_refiner", lambda: peak_of(lambda: render_path(models, args.segments, False)))
    main_kernels = "fused" if args.refiner_kernels in ("both", "fused") else "torch"  # the rows without a suffix
    record("with_refiner", lambda: peak_of(lambda: render_path(models, args.segments, True, kernels=main_kernels)))
    if args.refiner_kernels == "both":
        record("with_refiner_stock_kernels",
               lambda: peak_of(lambda: render_path(models, args.segments, True, kernels="torch")))
    # the overlap's schedule, side by side: stage 1 and the decode on high-priority streams (as rendered), all
    # three streams at equal priority, and the decode after each block on the refiner's stream at equal priority
    record("with_refiner_equal_priorities", lambda: render_path(
        models, args.segments, True, schedule=Schedule(stage_one_first=False), kernels=main_kernels))
    record("with_refiner_decode_on_refiner_stream", lambda: render_path(
        models, args.segments, True, schedule=Schedule(stage_one_first=False, decode_apart=False),
        kernels=main_kernels))
    record("with_refiner_no_overlap", lambda: render_path(models, args.segments, True, overlap=False,
                                                          kernels=main_kernels))
    if results.get("warmup") and results.get("with_refiner"):  # flat in the path length: 5 vs --segments segments
        results["with_refiner_peak_gib_short_vs_long"] = [results["warmup"]["peak_gib"],
                                                          results["with_refiner"]["peak_gib"]]
    record("with_refiner_breakdown", lambda: render_path(models, args.segments, True, breakdown=True,
                                                         kernels=main_kernels))
    fused_blocks, stock_blocks = [], []
    steady = record("refiner_steady_state_eager", lambda: steady_row(
        refiner_steady_state(refiner_transformer, text, shape, device, dtype, kernels=main_kernels), fused_blocks))
    if args.refiner_kernels == "both":
        stock = record("refiner_steady_state_eager_stock_kernels", lambda: steady_row(
            refiner_steady_state(refiner_transformer, text, shape, device, dtype, kernels="torch"), stock_blocks))
        nudged_blocks = []
        record("refiner_steady_state_eager_stock_kernels_one_ulp", lambda: steady_row(refiner_steady_state(
            refiner_transformer, text, shape, device, dtype, kernels="torch", nudge=True), nudged_blocks))
        if steady and stock:
            record("refiner_kernels_fused_vs_stock", lambda: kernels_comparison(
                dict(steady, first_block=fused_blocks[0]), dict(stock, first_block=stock_blocks[0]),
                results.get("with_refiner"), results.get("with_refiner_stock_kernels"),
                nudged_blocks[0] if nudged_blocks else None))
    if steady is not None:
        # stage 1 + decode's steady rate (a long path's); the end-to-end one where the path is too short for it
        plain_fps = (plain.get("video_fps_steady") or plain["video_fps"]) if plain else None
        record("roofline", lambda: roofline(steady, plain_fps))

    # Memory per --refiner-offload setting: prompt encode and render measured apart.
    peaks = {"none": None}
    try:
        memory_settings(args, models, results, record, peak_of, peaks)
    except Exception as error:  # e.g. out of memory building the text model: keep what was measured
        results["errors"]["memory_settings"] = f"{type(error).__name__}: {str(error)[:300]}"
    results["peak_gib_by_setting"] = peaks
    results["setting_for_gpu"] = fits(peaks)
    results["total_wall_s"] = round(time.perf_counter() - began_all, 1)
    emit(results, args.out)
    return 0 if not results["errors"] else 2


if __name__ == "__main__":
    sys.exit(main())
