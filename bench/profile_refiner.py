"""Profile of one steady-state block of the refiner (stage 2) at the release shape, on the GPU, bf16 and FP8.

The release refiner (48 layers, 4096 wide, random weights, the audio branch dropped) refines a clip through
`RefinerStream` until its window is full (sink + 10 history frames), then one more block of 3 latent frames
(24 video frames: 3 denoising passes and the history pass) runs under `torch.profiler`, once per precision
(`--precision bf16,fp8`: the same transformer, its block linears quantized between the two). For each:

- `s_per_block`: the synced wall time of a block outside the profiler (median of `--blocks`);
- `by_kind`: GPU kernel ms per kind (GEMMs, FP8 quantization, attention, the fused glue, other elementwise and
  copies), so the block's time can be read against its GEMM and attention rooflines;
- `kernels`: the kernels by name (top 25), with their launch counts; `gpu_span_ms` and `gpu_idle_ms`.

    python3 bench/profile_refiner.py --out $OUT/profile_refiner.json
    python3 bench/profile_refiner.py --tiny      # the tiny refiner on a CPU: checks the script
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_segments as stage_one  # noqa: E402
from camrender.model.fp8 import quantize_blocks  # noqa: E402
from camrender.model.refiner.stream import RefinerStream  # noqa: E402
from common import emit, sync  # noqa: E402
from profile_segment import profile_table  # noqa: E402
from refiner_common import VIDEO_FPS, as_refiner, build_refiner_transformer, kernel_backend, refiner_text  # noqa: E402

# kernel name fragments per kind, first match wins (lower-case); camrender's Triton kernels are named after
# their Python functions (a leading underscore), PyTorch's and the libraries' are not
KINDS = (
    ("fp8_quantize", ("quantize",)),
    ("attention", ("sdpa", "flash", "attention", "fmha")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "cublas")),
    ("copy", ("copy", "memcpy", "memset", "catarray")),
    ("layout_transpose", ("nchwtonhwc", "nhwctonchw")),
    ("elementwise", ("elementwise", "reduce_kernel", "layer_norm")),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    for kind, fragments in KINDS:
        if any(fragment in lower for fragment in fragments):
            return kind
    return "triton" if name.startswith("_") else "other"


def by_kind(profiler) -> dict:
    """GPU kernel ms per `KINDS` entry, with launch counts."""
    ms, launches = collections.defaultdict(float), collections.Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kind = kind_of(event.name)
            ms[kind] += event.device_time / 1e3
            launches[kind] += 1
    return {kind: dict(ms=round(ms[kind], 3), launches=launches[kind]) for kind in sorted(ms, key=lambda k: -ms[k])}


def steady_stream(transformer, text, clip, device):
    """A `RefinerStream` over `clip`'s first 1 + 12 latent frames: its history window is full from here on."""
    stream = RefinerStream(as_refiner(transformer), text, fps=VIDEO_FPS, device=device,
                           generator=torch.Generator().manual_seed(0), kernel_backend=kernel_backend(device))
    stream.push(clip[:, :, :13])
    stream.settle()
    sync()
    return stream


def profile_precision(transformer, text, clip, device, blocks: int) -> dict:
    """Timed blocks, then one profiled block, of a steady stream over `clip`."""
    stream = steady_stream(transformer, text, clip, device)
    start, seconds = 13, []
    for _ in range(blocks):
        began = time.perf_counter()
        stream.push(clip[:, :, start:start + 3])
        stream.settle()
        sync()
        seconds.append(time.perf_counter() - began)
        start += 3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        stream.push(clip[:, :, start:start + 3])
        stream.settle()
        sync()
    table = profile_table(profiler, set())
    return dict(s_per_block=round(sorted(seconds)[len(seconds) // 2], 4), by_kind=by_kind(profiler),
                kernel_ms_total=table["kernel_ms_total"], kernel_launches=table["kernel_launches"],
                gpu_span_ms=table["gpu_span_ms"], gpu_idle_ms=table["gpu_idle_ms"], kernels=table["kernels"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16,fp8", help="comma-separated, in order: bf16, fp8")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks before the profiled one")
    parser.add_argument("--text-tokens", type=int, default=1024)
    parser.add_argument("--tiny", action="store_true", help="the tiny refiner on a CPU (checks the script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if any(p not in ("bf16", "fp8") for p in precisions):
        parser.error(f"--precision: bf16 or fp8, got {args.precision!r}")
    if args.tiny:
        device, dtype, shape, tokens = torch.device("cpu"), torch.float32, (32, 32), min(args.text_tokens, 16)
        stage_one.SPATIAL = 8
    else:
        device, dtype, shape, tokens = torch.device("cuda"), torch.bfloat16, (704, 1280), args.text_tokens
    transformer = build_refiner_transformer(args.tiny, device, dtype)
    text = refiner_text(transformer, tokens, device, dtype)
    h, w = shape[0] // stage_one.SPATIAL, shape[1] // stage_one.SPATIAL
    clip = torch.randn(1, transformer.config.in_channels, 13 + 3 * (args.blocks + 1), h, w,
                       generator=torch.Generator().manual_seed(2)).to(device, dtype)
    result = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                  height=shape[0], width=shape[1], text_tokens=tokens, precisions={})
    quantized = False
    with torch.no_grad():
        for precision in precisions:
            if precision == "fp8" and not quantized:
                if device.type == "cuda":  # FP8 needs _scaled_mm (compute capability 8.9+)
                    result["fp8_linears"] = quantize_blocks(transformer.transformer_blocks)
                quantized = True
            elif precision == "bf16" and quantized:
                parser.error("--precision: bf16 before fp8 (the blocks are quantized in place)")
            result["precisions"][precision] = profile_precision(transformer, text, clip, device, args.blocks)
            print({precision: result["precisions"][precision]["s_per_block"]}, flush=True)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
