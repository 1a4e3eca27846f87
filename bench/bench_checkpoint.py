"""GPU benchmark of segment-mode checkpoints (camrender.render.resume) at the release shape, random weights.

Renders a path segment by segment (stage 1 + streaming decode, as `bench_segments.py`), writes
the checkpoint a resume needs (every block cache, the decoder state, RNG) at a segment boundary
several times, and reports:

- checkpoint_bytes, write_s (median; GPU -> host copy + safetensors write + fsync + rename);
- segment_s: seconds per segment of the uninterrupted render (median);
- overhead_pct_at_default: write_s / DEFAULT_CHECKPOINT_EVERY * 100, the share of render time
  spent on checkpoints at the default interval (one checkpoint per interval of rendering);
- resume_s: seconds to restore the checkpoint and render the rest of the path (CUDA graphs on,
  as the CLI renders). That the resumed frames equal the uninterrupted render's is a test:
  tests/render/test_graphs_gpu.py (`python3 -m pytest -m gpu`).

The checkpoint is written under --dir (default: the current folder, i.e. the disk the video
would go to; /tmp may be memory).

    python3 bench/bench_checkpoint.py --out $OUT/bench_checkpoint.json     # release shape
    python3 bench/bench_checkpoint.py --cpu-smoke                          # checks the script
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_segments  # noqa: E402
from bench_segments import build_models, path_inputs  # noqa: E402
from camrender.model.stage1.segments import SegmentCache, SegmentOptions, segment_bounds  # noqa: E402
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames  # noqa: E402
from camrender.render.resume import DEFAULT_CHECKPOINT_EVERY, Checkpointer  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402
from common import Stopwatch, emit, sync  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=8, help="segments of the path (3 latent frames each)")
    parser.add_argument("--stop-at", type=int, default=4, help="segment boundary the checkpoint is taken at")
    parser.add_argument("--repeats", type=int, default=3, help="checkpoint writes timed")
    parser.add_argument("--dir", default=".", help="folder the checkpoint is written in")
    parser.add_argument("--kernels", default="fused", choices=["fused", "torch"])
    parser.add_argument("--quick", action="store_true", help="8-layer transformer (smoke run on a GPU)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU (checks the script)")
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args(argv)


def render(transformer, vae, inputs, bounds, options, device, cuda_graphs, *, stop=None, checkpoints=None):
    """Frames of segments [first, stop) (uint8 numpy chunks) and seconds per segment; with
    `checkpoints` holding a resume point, starts from it."""
    decoder = CausalStreamDecoder(vae, device=device)
    cache, first = SegmentCache.empty(transformer), 0
    if checkpoints is not None:
        cache, first = checkpoints.restore(cache, decoder, device, bounds)
    chunks, seconds = [], []
    sync()
    start = time.perf_counter()
    for index, _, _, latents in sample_segments(transformer, inputs, bounds, list(DEFAULT_SEGMENT_TIMESTEPS),
                                                options, device, cuda_graphs=cuda_graphs, cache=cache,
                                                first_segment=first):
        chunks.append(to_uint8_frames(decoder.decode(latents)))
        sync()
        now = time.perf_counter()
        seconds.append(now - start)
        start = now
        if stop is not None and index + 1 == stop:
            break
    return chunks, seconds, cache, decoder


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if args.cpu_smoke:
        bench_segments.SPATIAL = 8
    height, width = (64, 64) if args.cpu_smoke else (704, 1280)
    if device.type == "cpu":
        args.kernels = "torch"  # the PyTorch references on a CPU, never the Triton interpreter
    transformer, vae = build_models(args, device, dtype)
    options = SegmentOptions()  # backend: the one build_models patched the transformer with
    latent_frames = 1 + 3 * args.segments
    bounds = segment_bounds(latent_frames, 3)
    cuda_graphs = device.type == "cuda"
    inputs = path_inputs(transformer, latent_frames, height, width, device, dtype)

    with torch.no_grad():
        _, seconds, _, _ = render(transformer, vae, inputs, bounds, options, device, cuda_graphs)
        _, _, cache, decoder = render(transformer, vae, inputs, bounds, options, device, cuda_graphs,
                                      stop=args.stop_at)
        folder = tempfile.mkdtemp(dir=args.dir, prefix=".bench-checkpoint-")
        try:
            checkpoints = Checkpointer(folder, settings={}, every=0)
            writes = []
            for _ in range(args.repeats):
                with Stopwatch(device) as watch:
                    size = checkpoints.save(args.stop_at, bounds, 0, cache, decoder)
                writes.append(watch.seconds)
            del cache, decoder
            resumed = Checkpointer(folder, settings={}, resume_info={"next_segment": args.stop_at,
                                                                      "frames_written": 0})
            with Stopwatch(device) as resume:
                render(transformer, vae, inputs, bounds, options, device, cuda_graphs, checkpoints=resumed)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    write_s = statistics.median(writes)
    segment_s = statistics.median(seconds[1:] or seconds)  # the first segment includes graph capture
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "height": height, "width": width, "segments": len(bounds), "stop_at": args.stop_at,
        "checkpoint_bytes": size,
        "checkpoint_gib": round(size / 1024**3, 3),
        "write_s": round(write_s, 3),
        "write_s_all": [round(w, 3) for w in writes],
        "write_gb_per_s": round(size / 1e9 / write_s, 2),
        "segment_s": round(segment_s, 3),
        "render_s": round(sum(seconds), 3),
        "default_checkpoint_every_s": DEFAULT_CHECKPOINT_EVERY,
        "overhead_pct_at_default": round(100 * write_s / DEFAULT_CHECKPOINT_EVERY, 3),
        "overhead_pct_every_segment": round(100 * write_s / segment_s, 1),
        "resume_s": round(resume.seconds, 3),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
