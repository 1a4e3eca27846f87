"""GPU benchmark of segment mode (camrender.render.segments) against full mode, random weights.

Measures, at the release resolution (704x1280, LTX-2 VAE 8x32x32, 128 latent channels,
SANA-WM 1.6B DiT in bfloat16):

- segment mode (the streaming recipe: sink + 1 recent segment, 1/sqrt(D) softmax scale) on
  paths of 3, 10 and 30 segments (3 latent frames each, the first 4):
  peak GPU memory (flat in the path length is the goal), stage-1 and decode seconds, and video
  frames produced per second of wall time (stage 1 + streaming decode; 4-step list, no CFG);
- segment mode on the 161-frame path (21 latent frames, 7 segments of 3);
- full mode on the same 161-frame path: the 4-step list without CFG (measured), and the released
  full-mode recipe, 60 steps with CFG (2 guided steps measured, extrapolated to 60), plus one
  whole-clip causal decode.

No text encoder and no VAE encoder run (random text embeddings and first-frame latent): stage 1
plus decode is what the figures cover. Results print as JSON on stdout (one line per
measurement as it finishes, then the whole document); `--out FILE` also writes the document.

    python3 bench/bench_segments.py --out $OUT/bench_segments.json            # release shape
    python3 bench/bench_segments.py --quick                                   # small smoke run
"""
from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from diffusers import AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, SanaWMTransformer3DModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from camrender.model.fp8 import PRECISIONS, quantize_blocks  # noqa: E402
from camrender.model.stage1.patch import patch_transformer  # noqa: E402
from camrender.model.stage1.recipes import get_recipe  # noqa: E402
from camrender.model.stage1.segments import segment_bounds  # noqa: E402
from camrender.model.stage1.state import FULL_MODE  # noqa: E402
from camrender.model.stage1.tiny import build_tiny_transformer, build_tiny_vae  # noqa: E402
from camrender.render.decode import (CausalStreamDecoder, decode_max_frames, to_uint8_frames,  # noqa: E402
                                     video_frames_for_latents)
from camrender.render.denoise import Denoiser, pin, pinned_frames  # noqa: E402
from camrender.render.inputs import RenderInputs, drop_text_padding  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402
from camrender.render.stage_two import PassThrough, refined_frames  # noqa: E402
from common import (GIB, Events, HostSyncs, Laps, allocated_bytes, emit, measure, peak_bytes,  # noqa: E402
                    reset_peak, steady_rates, sync)

try:
    from camrender.render.segments import segment_options
except ImportError:  # a tree from before it, measured by these scripts beside it (run_segment_targets.sh's OLD)
    from camrender.model.stage1.state import SegmentOptions

    def segment_options(recipe, cached_segments):
        return SegmentOptions.for_recipe(recipe, cached_segments=cached_segments)

SPATIAL = 32  # VAE spatial stride (8 for the --cpu-smoke tiny VAE)
DECODE_MAX_FRAMES = decode_max_frames(refined=False)  # latent frames per VAE call, as a render (--decode-max-frames)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small config (8 blocks, 352x640, paths of 2/4/8 segments)")
    parser.add_argument("--segments", default=None,
                        help="comma-separated path lengths in segments (default 3,10,30)")
    parser.add_argument("--kernels", default="fused", choices=["fused", "torch"], help="fused: Triton kernels on CUDA")
    parser.add_argument("--stage1-precision", default="bf16", choices=PRECISIONS,
                        help="stage 1's block linears (fp8: e4m3 W8A8, `camrender.model.fp8`, as a render's "
                             "--stage1-precision fp8); the full-mode rows too")
    parser.add_argument("--skip-full", action="store_true", help="skip the full-mode measurements")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="segment mode without CUDA-graph replay (default: replay, plus one eager run timed beside it)")
    parser.add_argument("--capture-first-sight", action="store_true",
                        help="experiment: every CUDA graph captured at its layout's first call, the first layout's "
                             "too (a render warms that one up eagerly; `camrender.model.graphs`); reports each graph "
                             "instance's counts")
    parser.add_argument("--host-profile", action="store_true",
                        help="also run stage 1 alone on the first path length once more with the warm-up's passes "
                             "under cProfile (`warmup_host_profile`: where their host time goes)")
    parser.add_argument("--full-cfg-steps", type=int, default=2,
                        help="guided full-mode steps measured (extrapolated to 60)")
    parser.add_argument("--loop-segments", type=int, default=30,
                        help="path length (segments) of the render-loop rows, overlapped and in line (0: none)")
    parser.add_argument("--decode-max-frames", type=int, default=None,
                        help="latent frames per VAE call of the streaming decode (default: the render's, "
                             "without a refiner: a whole segment per call)")
    parser.add_argument("--official", default=None, metavar="KIT",
                        help="also run NVlabs' released streaming sampler (the reference kit's "
                             "bench_official_stage1.py in KIT) on the same path lengths, in its own process")
    parser.add_argument("--official-timeout", type=int, default=300)
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    parser.add_argument("--markdown", default=None, help="also write the figures as a markdown table here")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="run on the CPU with the tiny test models (checks the script; no figures)")
    return parser.parse_args(argv)


def build_models(args, device, dtype):
    """The transformer (patched with `args.kernels`: both modes run the patched blocks, as the CLI) and VAE."""

    if args.cpu_smoke:
        transformer, vae = build_tiny_transformer(seed=0).to(dtype), build_tiny_vae(latent_channels=8).to(dtype)
    else:
        config = dict(num_layers=8) if args.quick else {}
        torch.manual_seed(0)
        with torch.device(device):
            transformer = SanaWMTransformer3DModel(**config)
            vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
        transformer = transformer.to(dtype).eval()
        vae = vae.to(dtype).eval()
    patch_transformer(transformer, kernels=args.kernels)
    if getattr(args, "stage1_precision", "bf16") == "fp8":
        quantize_blocks(transformer.blocks)  # as `camrender.render.pipeline` loads a render's stage 1
    return transformer, vae


def path_inputs(transformer, latent_frames, height, width, device, dtype, guidance=1.0, seed=0):
    """Random conditioning for a path of `latent_frames` (a slow forward dolly with a turn)."""
    generator = torch.Generator().manual_seed(seed)
    h, w = height // SPATIAL, width // SPATIAL
    batch = 2 if guidance > 1 else 1
    rows = []
    for f in range(latent_frames):
        angle = 0.02 * f
        c2w = torch.eye(4)
        c2w[:3, :3] = torch.tensor([[math.cos(angle), 0, math.sin(angle)], [0, 1, 0],
                                    [-math.sin(angle), 0, math.cos(angle)]])
        c2w[2, 3] = 0.1 * f
        rows.append(torch.cat([c2w.flatten(), torch.tensor([0.8 * w, 0.8 * w, w / 2, h / 2])]))
    conditions = torch.stack(rows)[None].expand(batch, -1, -1).to(device, dtype)
    plucker = torch.randn(1, 48, latent_frames, h, w, generator=generator).expand(batch, -1, -1, -1, -1)
    text = torch.randn(batch, 1, 300, transformer.config.caption_channels, generator=generator)
    mask = torch.zeros(batch, 300, dtype=torch.long)
    mask[:, :120] = 1  # a prompt of 120 tokens, padded to 300 and its padding dropped, as a render's is
    if batch == 2:
        mask[0, 1:] = 0  # under guidance the first row is the default negative prompt, "": its BOS token alone
    text, mask = drop_text_padding(text, mask)
    channels = transformer.config.in_channels
    return RenderInputs(
        text=text.to(device, dtype), text_mask=mask.to(device), camera_conditions=conditions,
        chunk_plucker=plucker.to(device, dtype),
        first_latent=torch.randn(1, channels, 1, h, w, generator=generator).to(device, dtype),
        noise=torch.randn(1, channels, latent_frames, h, w, generator=generator).to(dtype), guidance=guidance,
    )


def run_segment_path(transformer, vae, latent_frames, height, width, options, device, dtype, cuda_graphs=True):
    """Render a path of `latent_frames` latent frames in segments; times stage 1 and decode separately.
    A path of n segments has 1 + 3 n latent frames (8 (1 + 3 n) - 7 video frames)."""
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)
    bounds = segment_bounds(latent_frames, 3)
    decoder = CausalStreamDecoder(vae, max_frames=DECODE_MAX_FRAMES)
    reset_peak()
    base = allocated_bytes()
    frames = 0
    per_segment_peak, stage1_ms = [], []
    with torch.no_grad():
        laps = Laps(device)
        for _, _, _, latents in sample_segments(transformer, inputs, bounds, list(DEFAULT_SEGMENT_TIMESTEPS),
                                                options, device, cuda_graphs=cuda_graphs):
            stage1_ms.append(round(laps("stage1") * 1e3, 1))
            frames += len(to_uint8_frames(decoder.decode(latents)))
            laps("decode")
            per_segment_peak.append(peak_bytes() / GIB)
    stage1, decode = laps.totals["stage1"], laps.totals["decode"]
    total = stage1 + decode
    return dict(
        segments=len(bounds), latent_frames=latent_frames, video_frames=frames,
        stage1_s=round(stage1, 3), decode_s=round(decode, 3), total_s=round(total, 3),
        video_fps=round(frames / total, 2), stage1_fps=round(frames / stage1, 2),
        peak_gib=round(peak_bytes() / GIB, 3),
        peak_above_weights_gib=round((peak_bytes() - base) / GIB, 3),
        peak_after_first_segment_gib=round(per_segment_peak[0], 3),
        stage1_ms_per_segment=stage1_ms,  # the first segments set up CUDA graphs (camrender.model.graphs)
    )


def run_stage1_alone(transformer, latent_frames, height, width, options, device, dtype, cuda_graphs=True,
                     host_profile=False):
    """Stage 1 alone as a render runs it: the sampler's segments queued back to back, no decode and no wait
    for the GPU between them (the host prepares a segment's conditioning while the GPU runs the one before;
    `run_segment_path` waits after each segment to time the decode apart). Wall time to the last latents, each
    segment's GPU time from CUDA events, and the warm-up's passes (`PassTimeline`, with `host_profile` its
    profile of the host: then the row's times are not figures)."""
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)
    bounds = segment_bounds(latent_frames, 3)
    frames = 0
    with torch.no_grad(), PassTimeline(device, host_profile=host_profile) as timeline:
        sync()
        began = time.perf_counter()
        events = Events(device)
        for index, start, stop, _ in sample_segments(transformer, inputs, bounds, list(DEFAULT_SEGMENT_TIMESTEPS),
                                                     options, device, cuda_graphs=cuda_graphs):
            frames += video_frames_for_latents(start, stop)
            events.mark(str(index))
        sync()
        total = time.perf_counter() - began
    return dict(segments=len(bounds), video_frames=frames, stage1_s=round(total, 3),
                stage1_fps=round(frames / total, 2), stage1_ms_per_segment=[round(ms, 1) for _, ms in events.laps_ms()],
                warmup_passes=timeline.rows(), **({"host_profile": timeline.host_profile()} if host_profile else {}))


def count_host_syncs(transformer, latent_frames, height, width, options, device, dtype, cuda_graphs=True) -> dict:
    """Stage 1's host-device syncs in each segment of a path (`HostSyncs`; none off CUDA), and the lines making
    them: a sync at a segment's start leaves the GPU idle while the host prepares the segment's conditioning."""
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)
    per_segment = []
    with torch.no_grad(), HostSyncs(device) as syncs:
        for _ in sample_segments(transformer, inputs, segment_bounds(latent_frames, 3), list(DEFAULT_SEGMENT_TIMESTEPS),
                                 options, device, cuda_graphs=cuda_graphs):
            per_segment.append(syncs.count - sum(per_segment))
    return dict(segments=len(per_segment), syncs_per_segment=per_segment, sites=syncs.sites())


class PassTimeline:
    """The model passes of a sampler's first `segments` segments (the warm-up, and one steady segment to compare),
    one row each: the segment, whether the pass writes the cache, what the CUDA-graph path did with it ("eager",
    "capture", "replay"; "plain" without graphs), the host's milliseconds in the call (an eager pass or a capture
    runs the model's Python, a replay copies its inputs and launches) and the GPU's (CUDA events around it; the
    host clock off CUDA). A context manager: it wraps `Denoiser.predict` while open.

    host_profile: also run those passes under cProfile (which slows the host: not for the timed rows) and report
    the functions with the most time of their own (`host_profile()`): where an eager pass or a capture spends it
    (Python, a library's plan building inside a builtin call, Triton's compiler)."""

    def __init__(self, device, segments: int = 5, host_profile: bool = False):
        self.device, self.segments = device, segments
        self.starts, self.records = [], []
        self.profiler = cProfile.Profile() if host_profile else None

    def __enter__(self):
        self.original = Denoiser.predict
        timeline = self

        def predict(denoiser, latents, frame_timesteps, conditioning, **kwargs):
            start = conditioning.frame_start
            if start not in timeline.starts:
                timeline.starts.append(start)
            if len(timeline.starts) > timeline.segments:
                return timeline.original(denoiser, latents, frame_timesteps, conditioning, **kwargs)
            before = timeline._counts(denoiser)
            events = Events(timeline.device)
            host = time.perf_counter()
            if timeline.profiler is not None:
                timeline.profiler.enable()
            prediction = timeline.original(denoiser, latents, frame_timesteps, conditioning, **kwargs)
            if timeline.profiler is not None:
                timeline.profiler.disable()
            host = time.perf_counter() - host
            events.mark("pass")
            kind = timeline._kind(before, timeline._counts(denoiser), denoiser.graphs is not None)
            timeline.records.append((timeline.starts.index(start), bool(kwargs.get("write")), kind, host * 1e3,
                                     events))
            return prediction

        Denoiser.predict = predict
        return self

    def __exit__(self, *exc):
        Denoiser.predict = self.original

    @staticmethod
    def _counts(denoiser) -> dict:
        graphs = [g for g in (denoiser.graphs, denoiser.write_graphs) if g is not None]
        return {kind: sum(g.stats[kind] for g in graphs) for kind in ("eager", "captures", "replays")}

    @staticmethod
    def _kind(before: dict, after: dict, graphs: bool) -> str:
        """What the graph path did (a capture also counts its replay); a pass the graphs did not see (a cache pass
        before its layout is warm) ran eagerly."""
        grown = [kind for kind in after if after[kind] > before[kind]]
        if grown:
            return {"eager": "eager", "captures": "capture", "replays": "replay"}[grown[0]]
        return "eager" if graphs else "plain"

    def rows(self) -> list:
        return [dict(segment=segment, write=write, kind=kind, host_ms=round(host_ms, 1),
                     gpu_ms=round(events.laps_ms()[0][1], 1))
                for segment, write, kind, host_ms, events in self.records]

    def host_profile(self, top: int = 40) -> list:
        """[(function, calls, own ms, cumulative ms)] of the profiled passes, most own time first."""
        if self.profiler is None:
            return []
        stats = pstats.Stats(self.profiler).stats
        rows = [(f"{Path(file).name}:{line}({name})" if line else name, calls, own * 1e3, cumulative * 1e3)
                for (file, line, name), (_, calls, own, cumulative, _) in stats.items()]
        rows.sort(key=lambda row: -row[2])
        return [(name, calls, round(own, 2), round(cumulative, 2)) for name, calls, own, cumulative in rows[:top]]


def run_segment_loop(transformer, vae, latent_frames, height, width, options, device, dtype, overlap,
                     cuda_graphs=True):
    """Segment mode as a render runs it: the library's loop (`refined_frames` with no refiner) from the
    sampler's chunks to uint8 frames on the host; `overlap`: the decode on its own CUDA stream beside the
    next segment's stage 1 (the render's default on CUDA), else in line. Wall time end to end."""
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)
    bounds = segment_bounds(latent_frames, 3)
    decoder = CausalStreamDecoder(vae, max_frames=DECODE_MAX_FRAMES)
    reset_peak()
    frames, arrivals = 0, []
    with torch.no_grad():
        sync()
        began = time.perf_counter()
        chunks = (latents for *_, latents in sample_segments(
            transformer, inputs, bounds, list(DEFAULT_SEGMENT_TIMESTEPS), options, device, cuda_graphs=cuda_graphs))
        for _, chunk in refined_frames(PassThrough(), chunks, decoder, device, overlap=overlap):
            frames += len(chunk)
            arrivals.append((time.perf_counter() - began, frames))
        sync()
        total = time.perf_counter() - began
    return dict(segments=len(bounds), video_frames=frames, overlap=overlap, total_s=round(total, 3),
                video_fps=round(frames / total, 2), peak_gib=round(peak_bytes() / GIB, 3), **steady_rates(arrivals))


def capture_at_first_sight() -> list:
    """Make every `GraphedForward` capture at a layout's first call, its first layout's too (no eager warm-up call
    at all: the experiment of `--capture-first-sight`); returns the list of the instances made from now on."""
    from camrender.model import graphs

    class Everything(set):
        def __contains__(self, layout):
            return True

    made = []
    original = graphs.GraphedForward.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._seen = Everything()
        made.append(self)

    graphs.GraphedForward.__init__ = init
    return made


def official_rows(kit: str, lengths, timeout_s: int) -> dict:
    """NVlabs' streaming sampler as released (the kit's `bench_official_stage1.py`, its own process) on
    paths of `lengths` segments: {segments: its result line}. The kit's wheels must be installed on
    PYTHONPATH (see the kit script's docstring)."""
    script = Path(kit) / "bench_official_stage1.py"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "official.jsonl"
        command = [sys.executable, str(script), "--kit", str(kit), "--no-profile", "--repeats", "1",
                   "--latent-frames", ",".join(str(1 + 3 * n) for n in lengths), "--out", str(out)]
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.setdefault("SANA_WM_SITE", env.get("PYTHONPATH", "").split(os.pathsep)[0])
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
            error = None
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s} s"
        lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    rows = {str((line["latent_frames"] - 1) // 3): line for line in lines if line.get("kind") == "result"}
    if error or not rows:  # timed out (perhaps after some lengths' results), or no result: its last error line
        rows["error"] = error or (done.stderr.strip().splitlines() or ["no result"])[-1][:300]
        # how far it got (setup, the warm-ups' seconds, timed runs), so a timeout says where the time went
        rows["lines"] = [{k: v for k, v in line.items() if k in ("kind", "latent_frames", "seconds", "stage1_s")}
                         for line in lines]
    return rows


def run_full(transformer, vae, latent_frames, height, width, steps, guidance, device, dtype, measure_steps=None):
    """Full mode: every latent frame denoised together (frame 0 pinned), then one causal decode.

    With `measure_steps`, only that many steps run (after one warm-up step) and the stage-1
    time is extrapolated to `len(steps)` steps."""
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype, guidance=guidance)
    batch = inputs.text.shape[0]
    latents = inputs.noise.to(device)
    latents[:, :, :1] = inputs.first_latent
    pinned = pinned_frames(inputs, 0, latent_frames, device)
    sigmas = [t / 1000 for t in steps] + [0.0]
    # the library's step (the one a full-mode render takes), eager; the conditioning of the clip once
    denoiser = Denoiser(transformer, inputs, FULL_MODE, device)
    with torch.no_grad():
        conditioning = denoiser.condition(0, latent_frames)

    def step(index):
        nonlocal latents
        velocity = denoiser.predict(latents, pin(pinned, steps[index]), conditioning)
        stepped = (latents.float() + (sigmas[index + 1] - sigmas[index]) * velocity).to(dtype)
        latents = torch.where(pinned[None, None, :, None, None], latents, stepped)

    reset_peak()
    with torch.no_grad():
        if measure_steps:
            step(0)
        sync()
        start = time.perf_counter()
        count = measure_steps or len(steps)
        for index in range(count):
            step(min(index + (1 if measure_steps else 0), len(steps) - 1))
        sync()
        per_step = (time.perf_counter() - start) / count
        stage1 = per_step * len(steps)
        # Decode in segment-sized chunks with the streaming decoder: the frames equal one whole-clip
        # causal decode (tests/render/test_segments_decode.py), without its activation peak (see decode_whole_clip).
        start = time.perf_counter()
        decoder = CausalStreamDecoder(vae, max_frames=DECODE_MAX_FRAMES)
        frames = sum(len(to_uint8_frames(decoder.decode(latents[:, :, a:b]))) for a, b in segment_bounds(latent_frames))
        sync()
        decode = time.perf_counter() - start
    total = stage1 + decode
    return dict(
        latent_frames=latent_frames, video_frames=frames, steps=len(steps), cfg=batch == 2,
        measured_steps=count, step_s=round(per_step, 3), stage1_s=round(stage1, 3), decode_s=round(decode, 3),
        total_s=round(total, 3), video_fps=round(frames / total, 2),
        peak_gib=round(peak_bytes() / GIB, 3),
        extrapolated=bool(measure_steps),
    )


def decode_whole_clip(vae, latent_frames, height, width, device, dtype):
    """One `vae.decode(z, causal=True)` of the whole clip, as a full-mode render decodes: time and peak memory."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(1, vae.config.latent_channels, latent_frames, height // SPATIAL, width // SPATIAL,
                    generator=generator).to(device, dtype)
    reset_peak()
    with torch.no_grad():
        sync()
        start = time.perf_counter()
        video = vae.decode(z, causal=True, return_dict=False)[0]
        sync()
        seconds = time.perf_counter() - start
    return dict(latent_frames=latent_frames, video_frames=int(video.shape[2]), decode_s=round(seconds, 3),
                peak_gib=round(peak_bytes() / GIB, 3))


def main(argv=None):
    args = parse_args(argv)
    global SPATIAL, DECODE_MAX_FRAMES
    if args.cpu_smoke:
        device, dtype = torch.device("cpu"), torch.float32
        SPATIAL = 8
        height, width = 32, 32
        args.segments = args.segments or "1,2"
    elif not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device (use --cpu-smoke to check the script on a CPU)"}))
        return 1
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
        height, width = (352, 640) if args.quick else (704, 1280)
    if args.decode_max_frames is not None:
        DECODE_MAX_FRAMES = args.decode_max_frames or None
    default_lengths = [2, 4, 8] if args.quick else [3, 10, 30]
    lengths = [int(x) for x in args.segments.split(",")] if args.segments else default_lengths
    recipe = get_recipe("streaming")
    options = segment_options(recipe, recipe.recent_chunks)  # as a render without the refiner runs it
    results = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
        quick=args.quick, kernels=args.kernels, stage1_precision=args.stage1_precision, height=height, width=width,
        dtype=str(dtype).replace("torch.", ""),
        recipe=recipe.name, segment_timesteps=list(DEFAULT_SEGMENT_TIMESTEPS), cached_segments=options.cached_segments,
        decode_max_frames=DECODE_MAX_FRAMES,
        segments={}, errors={},
    )
    try:
        results["triton"] = triton.__version__
    except ImportError:
        pass

    def record(name, fn):
        return measure(results["errors"], name, fn)

    graphed = capture_at_first_sight() if args.capture_first_sight else None
    began = time.perf_counter()
    transformer, vae = build_models(args, device, dtype)
    results["weights_gib"] = round(allocated_bytes() / GIB, 3)
    results["build_s"] = round(time.perf_counter() - began, 1)

    # Warm-up on a 22-latent-frame path: compiles the kernels for its 4- and 3-frame segments.
    graphs = not args.no_cuda_graphs and device.type == "cuda"
    results["cuda_graphs"] = graphs
    if record("warmup", lambda: run_segment_path(transformer, vae, 22, height, width, options, device, dtype,
                                                 graphs)) is None \
            and args.kernels != "torch":
        # Keep measuring with the PyTorch scans rather than stopping; the error above says what failed.

        patch_transformer(transformer, kernels="torch")
        results["segment_backend_fallback"] = "torch"
        record("warmup_torch", lambda: run_segment_path(transformer, vae, 22, height, width, options, device, dtype))
    results["host_syncs"] = record("host_syncs", lambda: count_host_syncs(transformer, 19, height, width, options, device,
                                                                         dtype, graphs))
    for length in lengths:
        value = record(f"segments_{length}", lambda: run_segment_path(transformer, vae, 1 + 3 * length, height, width,
                                                                     options, device, dtype, graphs))
        if value is not None:
            results["segments"][str(length)] = value
        value = record(f"stage1_alone_{length}", lambda: run_stage1_alone(transformer, 1 + 3 * length, height, width,
                                                                          options, device, dtype, graphs))
        if value is not None:
            results.setdefault("stage1_alone", {})[str(length)] = value
    if args.host_profile:
        results["warmup_host_profile"] = record("warmup_host_profile", lambda: run_stage1_alone(
            transformer, 1 + 3 * lengths[0], height, width, options, device, dtype, graphs, host_profile=True))
    peaks = [v["peak_gib"] for v in results["segments"].values()]
    if len(peaks) > 1 and min(peaks) > 0:
        results["peak_spread_pct"] = round(100 * (max(peaks) - min(peaks)) / min(peaks), 2)

    if args.loop_segments:
        results["loop"] = {}
        for overlap in (True, False):
            value = record(f"loop_{'overlap' if overlap else 'inline'}", lambda: run_segment_loop(
                transformer, vae, 1 + 3 * args.loop_segments, height, width, options, device, dtype, overlap, graphs))
            if value is not None:
                results["loop"]["overlap" if overlap else "inline"] = value
    # The 161-frame path: 21 latent frames (segments (0,3), (3,6), ..., (18,21): F mod 3 = 0).
    results["segments_161_frames"] = record(
        "segments_161_frames", lambda: run_segment_path(transformer, vae, 21, height, width, options, device, dtype,
                                                        graphs))
    if graphs:
        results["segments_10_eager"] = record(
            "segments_10_eager", lambda: run_segment_path(transformer, vae, 31, height, width, options, device, dtype,
                                                          False))
    if not args.skip_full:
        steps4 = list(DEFAULT_SEGMENT_TIMESTEPS)
        results["full_161_frames_4_steps"] = record(
            "full_161_frames_4_steps",
            lambda: run_full(transformer, vae, 21, height, width, steps4, 1.0, device, dtype))
        results["full_161_frames_whole_clip_decode"] = record(
            "full_161_frames_whole_clip_decode", lambda: decode_whole_clip(vae, 21, height, width, device, dtype))

        scheduler = FlowMatchEulerDiscreteScheduler()
        scheduler.set_timesteps(60)
        steps60 = [float(t) for t in scheduler.timesteps]
        results["full_161_frames_60_steps_cfg"] = record(
            "full_161_frames_60_steps_cfg",
            lambda: run_full(transformer, vae, 21, height, width, steps60, 5.0, device, dtype,
                             measure_steps=args.full_cfg_steps))
    if graphed is not None:  # each instance's counts; a failed capture leaves it disabled (eager)
        results["graph_stats"] = [dict(g.stats, enabled=g.enabled) for g in graphed]
    if args.official:
        del transformer, vae
        torch.cuda.empty_cache()
        results["official"] = official_rows(args.official, lengths, args.official_timeout)
    emit(results, args.out)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(markdown_table(results))
    return 0


def markdown_table(results) -> str:
    """The figures as a markdown table (for docs/performance.md)."""
    rows = [("segment mode, " + str(v["segments"]) + " segments", v) for v in results["segments"].values()]
    for key, label in (("segments_161_frames", "segment mode, 161 frames"),
                       ("segments_10_eager", "segment mode, 10 segments, no CUDA graphs"),
                       ("full_161_frames_4_steps", "full mode, 161 frames, 4 steps"),
                       ("full_161_frames_60_steps_cfg", "full mode, 161 frames, 60 steps + CFG (extrapolated)")):
        if results.get(key):
            rows.append((label, results[key]))
    lines = [
        f"{results['device']}, torch {results['torch']}, triton {results.get('triton', '?')}, "
        f"{results['width']}x{results['height']}, {results['dtype']}, kernels {results['kernels']}, random weights",
        "",
        "| run | video frames | stage 1 (s) | decode (s) | video frames / s | peak GPU memory (GiB) |",
        "|---|---|---|---|---|---|",
    ]
    for label, v in rows:
        lines.append(f"| {label} | {v['video_frames']} | {v['stage1_s']} | {v['decode_s']} | {v['video_fps']} "
                     f"| {v['peak_gib']} |")
    if "peak_spread_pct" in results:
        lines += ["", f"Peak memory spread over the segment paths: {results['peak_spread_pct']} %."]
    whole = results.get("full_161_frames_whole_clip_decode")
    if whole:
        lines += [f"Whole-clip causal decode of 161 frames: {whole['decode_s']} s, peak {whole['peak_gib']} GiB."]
    if results["errors"]:
        lines += ["", "Errors: " + "; ".join(f"{k}: {v}" for k, v in results["errors"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
