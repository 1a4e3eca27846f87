"""`bench_refiner.py --setting NAME`: one setting of the card-size target table, measured as a render runs it,
with a memory breakdown at each phase (prompt encoding, first segment, steady state).

Order, as `camrender.render.pipeline` loads a render: stage 1's DiT and VAE on the GPU (their block linears
in FP8 under fp8); the prompts encoded before the refiner's DiT is placed (Gemma-2-2B, then the
Gemma-3-12B text tower, each on the GPU for its one call and dropped after: the text encoders live in CPU
memory; a cached prompt skips this phase); the refiner's DiT placed (FP8: quantized block by block on the
GPU; `layers`: streamed from page-locked CPU memory); then segment mode with the refiner, the stages
overlapped as rendered. A memory cap (`torch.cuda.set_per_process_memory_fraction`) applies from the
render's first allocation on: weights built and quantized before it. The first frame is encoded before the
render, as a render's inputs are: the VAE's encoder then waits in CPU memory (only its decoder stays).

Breakdown (GiB): weights per component (parameters + buffers on the GPU), the refiner's KV window (its
layer buffers), stage 1's segment caches (`SegmentCache.nbytes`), `other_allocated` (allocated minus the
named parts: CUDA-graph pools of stage 1, activations in flight, the decode's buffers), allocator slack
(reserved minus allocated) and the phase's peak; separately the decode workspace of one 3-frame block (peak
above what was allocated, whole block and one latent frame per call) and the refiner's activation peak of
one steady block.
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

import allocator_pools
import pipeline_trace
import refiner_common as base
from common import STEADY_FROM, steady_rates
import bench_segments as stage_one
from camrender.model.block_streaming import block_streamer, stream_blocks
from camrender.model.fp8 import Fp8Linear, quantize_blocks
from camrender.model.refiner.loading import stream_layers, streamed_blocks
from camrender.model.refiner.stream import RefinerStream, park_prompt_projections
from camrender.model.stage1.segments import SegmentCache, SegmentOptions, segment_bounds
from camrender.render.decode import REFINED_DECODE_MAX_FRAMES, CausalStreamDecoder
from camrender.render.inputs import encode_first_frame
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments
from camrender.render.stage_two import Schedule, chosen_schedule, refined_frames
from common import GIB, gib, sync

# `--schedule`: (overlap, schedule) of `refined_frames`: as a render chooses (the streams where the GPU has room,
# `stage_two.room_for_overlap`, else one stream), the streams, the decode queued on the refiner's stream after each
# block, the streams' order on the render's one stream, or each chunk's frames before the next chunk is queued (the
# live page's low-latency order)
SCHEDULES = {"rendered": (None, Schedule()), "overlapped": (True, Schedule()),
             "decode-on-refiner": (True, Schedule(decode_apart=False)), "one-stream": (True, Schedule(streams=False)),
             "in-order": (False, Schedule())}

# `--trace-segments`: the trace starts once this segment's frames are out, so it holds steady segments only (a
# trace from segment 3 on held the cache pass's graph capture)
TRACE_FROM = STEADY_FROM

# stage 1's rules beside the refiner, as a render runs it (no key slot: `SegmentOptions.key_slot`)
REFINED_OPTIONS = SegmentOptions(cached_segments=2, key_slot=False)

SETTINGS = {
    "bf16": dict(precision="bf16", window=11, offload="none", cap_gib=None),
    "fp8": dict(precision="fp8", window=11, offload="none", cap_gib=None),
    # the bf16 default (all weights resident; the prompt's projections parked in CPU memory) under a card's cap:
    # 40 GiB, and a 48 GB card's 44 GiB
    "bf16-40gib": dict(precision="bf16", window=11, offload="none", cap_gib=40),
    "bf16-48gb-resident": dict(precision="bf16", window=11, offload="none", cap_gib=44),
    # two candidates for a 24 GB card: a short KV window, or the refiner's layers streamed
    "fp8-22gib-window2": dict(precision="fp8", window=2, offload="none", cap_gib=22),
    "fp8-22gib-layers": dict(precision="fp8", window=11, offload="layers", cap_gib=22),
    # part of the refiner's blocks streamed from CPU memory behind the others' compute (--refiner-offload N):
    # a 48 GB card in bf16 (44 GiB usable; 12 of 48 blocks: 5 GiB less), a 24 GB card in fp8 with the short window
    "bf16-48gb": dict(precision="bf16", window=11, offload="12", cap_gib=44),
    "fp8-22gib-stream": dict(precision="fp8", window=2, offload="24", cap_gib=22),
    # a 24 GB card at the default window (11 frames): every block streamed, about 11 GiB over PCIe a pass
    "fp8-22gib-stream-window11": dict(precision="fp8", window=11, offload="48", cap_gib=22),
    # the same with 36 of the 48 blocks streamed: a quarter fewer copies a pass, about 2.6 GiB more resident
    "fp8-22gib-stream36-window11": dict(precision="fp8", window=11, offload="36", cap_gib=22),
    # a 32 GB card (an RTX 5090 has 31.4 GiB; the cap leaves room for the CUDA context and a display) at the default
    # window: 12 or 24 blocks streamed
    "fp8-28gib-stream12-window11": dict(precision="fp8", window=11, offload="12", cap_gib=28),
    "fp8-28gib-stream24-window11": dict(precision="fp8", window=11, offload="24", cap_gib=28),
}


def module_bytes(module, device) -> int:
    """Bytes of `module`'s parameters and buffers that live on `device`'s type."""
    kind = torch.device(device).type
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers())
               if t.device.type == kind)


def window_bytes(stream) -> int:
    """The refiner's KV cache: every tensor its layers hold (window buffers, sink keys; stock: sink + history)."""
    total, seen = 0, set()
    for layer in stream.cache.layer_caches:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
    return total


def breakdown(weights: dict, named: dict, device) -> dict:
    """The memory now: weights {name: module}, named buffers {name: bytes}; GiB."""
    if torch.device(device).type != "cuda":
        return dict(weights={k: gib(module_bytes(m, device)) for k, m in weights.items()}, note="CPU: no CUDA figures")
    sync()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    weight_bytes = {name: module_bytes(module, device) for name, module in weights.items()}
    known = sum(weight_bytes.values()) + sum(named.values())
    return dict(weights={k: gib(v) for k, v in weight_bytes.items()}, **{k: gib(v) for k, v in named.items()},
                other_allocated=gib(allocated - known), allocated=gib(allocated), allocator_slack=gib(reserved - allocated),
                peak_allocated=gib(torch.cuda.max_memory_allocated()), pools=allocator_pools.pools())


def encode_phase(args, device, dtype, weights) -> dict:
    """Gemma-2-2B (stage 1) and the Gemma-3-12B text tower (refiner), each built on the GPU, run once on a prompt
    of 300 / `args.text_tokens` tokens and dropped; peak and breakdown while the larger one is resident."""
    # lazy: transformers' Gemma classes are optional here (a transformers without them still runs the other benches)
    from transformers import Gemma2Config, Gemma2ForCausalLM

    result = {}
    for name, tokens in (("gemma2_stage1", 300), ("gemma3_refiner", args.text_tokens)):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if name == "gemma2_stage1":
            config = (Gemma2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=8, vocab_size=128) if args.tiny
                      else Gemma2Config(**base.GEMMA2_2B))
            with torch.device(device), base.default_dtype(dtype):
                model = Gemma2ForCausalLM(config).eval()
        else:
            model = base.build_text_model(args.tiny, device, dtype)
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=device)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
        result[name] = breakdown(dict(weights, text_encoder=model), {}, device)
        del model, ids
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def note(name, value) -> None:
    """One JSON line as soon as a phase is measured (a run stopped by its time limit keeps them in its log)."""
    print(json.dumps({name: value}, default=str), flush=True)


def run_setting(args, name: str) -> dict:
    setting = SETTINGS[name]
    tiny = args.tiny
    if tiny:
        device, dtype, shape = torch.device("cpu"), torch.bfloat16, (32, 32)
        stage_one.SPATIAL = 8
    else:
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, (704, 1280)
    results = dict(setting=name, **setting, segments=args.segments, height=shape[0], width=shape[1],
                   device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   note="random weights; release configs; prompt encode = the encoders' own phase, before the "
                        "refiner DiT is placed; the render uses random prompt embeddings")
    began = time.perf_counter()
    fp8 = setting["precision"] == "fp8"
    Fp8Linear.backend = base.kernel_backend(device)  # on a CPU the PyTorch reference, never the interpreter
    stage_args = SimpleNamespace(cpu_smoke=tiny, quick=False, kernels="fused" if device.type == "cuda" else "torch")
    # the tiny stage 1 runs in fp32 on the CPU (diffusers' CPU RoPE grid refuses bf16); the refiner in bf16
    stage_dtype = torch.float32 if tiny else dtype
    transformer, vae = stage_one.build_models(stage_args, device, stage_dtype)
    if fp8 and device.type == "cuda":  # _scaled_mm's bf16 output on CUDA; the CPU checks the refiner's path
        results["stage1_fp8_linears"] = quantize_blocks(transformer.blocks)
    weights = {"stage1_dit": transformer, "vae": vae}
    if setting["cap_gib"] is None:
        results["prompt_encoding"] = encode_phase(args, device, dtype, weights)
        note("prompt_encoding", results["prompt_encoding"])
    else:
        results["prompt_encoding"] = "cached (camrender encode-prompt): no text encoder under the cap"

    refiner_transformer = base.build_refiner_transformer(tiny, device, dtype)
    if fp8:
        results["refiner_fp8_linears"] = quantize_blocks(refiner_transformer.transformer_blocks)
    if args.refiner_offload is not None:
        setting = dict(setting, offload=args.refiner_offload)
        results["offload"] = args.refiner_offload
    if streamed_blocks(setting["offload"]):
        blocks = refiner_transformer.transformer_blocks  # the tiny refiner has 2
        streamer = stream_blocks(blocks, min(len(blocks), streamed_blocks(setting["offload"])), device)
        results["streamed_blocks"] = streamer.streamed
        results["staging_slots_gib"] = gib(streamer.slot_bytes * len(streamer.slots))
        if device.type == "cuda":
            results["pinned_copy_gb_s"] = pinned_copy_rate(device)
    elif setting["offload"] == "layers":
        refiner_transformer.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        stream_layers(SimpleNamespace(transformer=refiner_transformer, text_encoder=None), device,
                      use_stream=device.type == "cuda")
    weights["refiner_dit"] = refiner_transformer
    parked = time.perf_counter()  # as the loader: the prompt's projections to page-locked CPU memory
    park_prompt_projections(refiner_transformer)
    results["park_prompt_projections_s"] = round(time.perf_counter() - parked, 2)
    if setting["cap_gib"] is not None and device.type == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(setting["cap_gib"] * GIB / total)
        torch.cuda.empty_cache()
    text = base.refiner_text(refiner_transformer, args.text_tokens if not tiny else 16, device, dtype)
    # as a render's inputs: the first frame through the VAE's encoder, which then leaves the GPU
    pixels = torch.rand(1, 3, *shape, generator=torch.Generator().manual_seed(4)) * 2 - 1
    with torch.no_grad():
        encode_first_frame(vae, pixels, device, stage_dtype)
    results["build_s"] = round(time.perf_counter() - began, 1)
    results["render"] = render(args, transformer, vae, refiner_transformer, text, shape, device, stage_dtype,
                               setting, weights)
    results["total_wall_s"] = round(time.perf_counter() - began, 1)
    timed = results["render"].get("timed") or results["render"].get("warmup")  # the warm-up when it ran out
    encode_peaks = [phase.get("peak_allocated") for phase in results["prompt_encoding"].values()] \
        if isinstance(results["prompt_encoding"], dict) else []
    peaks = [p for p in encode_peaks + [timed.get("peak_gib")] if p is not None]
    ran_out = any("out_of_memory" in row for row in results["render"].values())
    results["summary"] = dict(setting=name, out_of_memory=ran_out, video_fps_steady=timed.get("video_fps_steady"),
                              peak_gib=max(peaks) if peaks else None, render_peak_gib=timed.get("peak_gib"),
                              encode_peak_gib=max(encode_peaks) if encode_peaks and None not in encode_peaks else None)
    return results


def pinned_copy_rate(device, gib_copied: float = 1.0) -> float:
    """GB/s of one page-locked host -> `device` copy of `gib_copied` GiB (what a streamed block rides on)."""
    source = torch.empty(int(gib_copied * GIB), dtype=torch.uint8, pin_memory=True)
    target = torch.empty_like(source, device=device)
    target.copy_(source, non_blocking=True)  # warm
    sync()
    began = time.perf_counter()
    target.copy_(source, non_blocking=True)
    sync()
    rate = source.numel() / (time.perf_counter() - began) / 1e9
    del source, target
    torch.cuda.empty_cache()
    return round(rate, 1)


def render(args, transformer, vae, refiner_transformer, text, shape, device, dtype, setting, weights) -> dict:
    """Warm-up path (compiles, captures stage 1's graphs, fills the window), then the timed path with phase
    snapshots; then the decode workspace and the refiner's activation peak."""
    height, width = shape
    out = {}
    for label, segments in (("warmup", 2 if args.tiny else min(5, args.segments)), ("timed", args.segments)):
        latent_frames = 1 + 3 * segments
        inputs = stage_one.path_inputs(transformer, latent_frames, height, width, device, dtype)
        cache = SegmentCache.empty(transformer)
        stream = RefinerStream(base.as_refiner(refiner_transformer), text, fps=base.VIDEO_FPS, device=device,
                               generator=torch.Generator().manual_seed(0), kv_max_frames=setting["window"],
                               kernel_backend=base.kernel_backend(device))
        decoder = CausalStreamDecoder(vae, max_frames=REFINED_DECODE_MAX_FRAMES)  # as segment mode renders
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        arrivals, frames, snapshots = [], 0, {}
        trace = pipeline_trace.Trace()
        tracing = label == "timed" and device.type == "cuda" and 0 < args.trace_segments <= segments - TRACE_FROM - 2
        began = time.perf_counter()
        try:
            with torch.no_grad(), allocator_pools.name_streams():
                chunks = (x for *_, x in sample_segments(transformer, inputs, segment_bounds(latent_frames, 3),
                                                         list(DEFAULT_SEGMENT_TIMESTEPS), REFINED_OPTIONS,
                                                         device, cuda_graphs=device.type == "cuda", cache=cache))
                overlap, schedule = chosen_schedule(stream, device, *SCHEDULES[args.schedule])
                out.setdefault("stage_streams", {})[label] = overlap and schedule.streams and device.type == "cuda"
                for index, (_, chunk) in enumerate(refined_frames(stream, chunks, decoder, device, overlap=overlap,
                                                                  schedule=schedule)):
                    frames += len(chunk)
                    arrivals.append((time.perf_counter(), frames))
                    if tracing and index == TRACE_FROM:
                        trace.start()
                    elif tracing and index == TRACE_FROM + args.trace_segments:
                        trace.stop()
                        wall = arrivals[-1][0] - arrivals[-1 - args.trace_segments][0]
                        snapshots["trace"] = dict(trace.summary(), segments=args.trace_segments, wall_s=round(wall, 3))
                    if label == "timed" and index in (0, segments - 2):
                        named = dict(refiner_kv_window=window_bytes(stream), stage1_caches=cache.nbytes())
                        streamer = block_streamer(refiner_transformer.transformer_blocks)
                        if streamer is not None:
                            named["refiner_staging_slots"] = streamer.slot_bytes * len(streamer.slots)
                        snapshots["first_segment" if index == 0 else "steady_state"] = breakdown(weights, named,
                                                                                                  device)
        except torch.OutOfMemoryError as error:  # under a cap: where the reserved memory sat when it ran out
            out[label] = dict(out_of_memory=str(error).splitlines()[0][:400], video_frames=frames,
                              pools=allocator_pools.pools(), **snapshots)
            note(label, out[label])
            return out
        sync()
        total = time.perf_counter() - began
        row = dict(video_frames=frames, total_s=round(total, 3), video_fps=round(frames / total, 2))
        row.update(steady_rates(arrivals))
        if device.type == "cuda":
            row["peak_gib"] = gib(torch.cuda.max_memory_allocated())
        row.update(snapshots)
        out[label] = row
        note(label, row)
    out["decode_workspace"] = decode_workspace(vae, shape, device, dtype)
    return out


def decode_workspace(vae, shape, device, dtype) -> dict:
    """Peak above the allocated memory of decoding one block of 3 latent frames (after a first frame), whole and
    one latent frame per VAE call (`CausalStreamDecoder(max_frames=1)`)."""
    h, w = shape[0] // stage_one.SPATIAL, shape[1] // stage_one.SPATIAL
    latents = torch.randn(1, vae.config.latent_channels, 4, h, w, generator=torch.Generator().manual_seed(3))
    latents = latents.to(device, dtype)
    result = {}
    for label, max_frames in (("block_per_call", None), ("one_frame_per_call", 1)):
        decoder = CausalStreamDecoder(vae, max_frames=max_frames)
        try:
            with torch.no_grad():
                decoder.decode(latents[:, :, :1])
                if device.type == "cuda":
                    sync()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                began = time.perf_counter()
                decoder.decode(latents[:, :, 1:])
                sync()
        except torch.OutOfMemoryError as error:  # under a cap a whole block need not fit: the render decodes less
            result[label] = dict(out_of_memory=str(error).splitlines()[0][:200])
            continue
        result[label] = dict(s=round(time.perf_counter() - began, 4))
        if device.type == "cuda":
            result[label]["workspace_gib"] = gib(torch.cuda.max_memory_allocated() - before)
    return result
