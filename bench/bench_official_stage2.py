"""The refiner alone in steady state (window full), seconds per block of 3 latent frames (24 video frames):
camrender's fused blocks in bf16 and in FP8 beside what NVlabs' streaming script runs for stage 2 (diffusers'
stock refiner blocks under `torch.compile(mode="max-autotune-no-cudagraphs")`), and the stock blocks eager.

Release refiner (48 layers, random weights), 704x1280, 1024 prompt tokens, one GPU. The compiled row
compiles each block once (diffusers' blocks share one graph: parameters are graph inputs) and autotunes
its GEMMs: the first blocks take minutes; `--compile-mode default` is quicker. `--tiny`: a CPU check of
the script, without compiling.

    python3 bench/bench_official_stage2.py --out $OUT/official_stage2.json
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_segments as stage_one  # noqa: E402
import refiner_common  # noqa: E402
from camrender.model.fp8 import Fp8Linear, quantize_blocks  # noqa: E402
from camrender.model.refiner.stream import RefinerStream  # noqa: E402
from common import emit, sync  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--blocks", type=int, default=3, help="timed blocks (after 4 that fill the window)")
    parser.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def seconds_per_block(transformer, text, clip, device, kernels, blocks) -> dict:
    """Median synced seconds of `blocks` refined blocks after 4 warm ones (the window then holds 10 frames)."""
    stream = RefinerStream(refiner_common.as_refiner(transformer), text, fps=refiner_common.VIDEO_FPS, device=device,
                           generator=torch.Generator().manual_seed(0), kernels=kernels,
                           kernel_backend=refiner_common.kernel_backend(device))
    began = time.perf_counter()
    stream.push(clip[:, :, :13])
    sync()
    warm = time.perf_counter() - began
    times = []
    for index in range(blocks):
        start = 13 + 3 * index
        began = time.perf_counter()
        stream.push(clip[:, :, start:start + 3])
        sync()
        times.append(time.perf_counter() - began)
    per_block = sorted(times)[len(times) // 2]
    return dict(s_per_block=round(per_block, 4), video_fps_refiner_alone=round(24 / per_block, 2),
                warmup_s=round(warm, 1))


def main(argv=None):
    args = parse_args(argv)
    if args.tiny:
        device, shape, tokens = torch.device("cpu"), (32, 32), 16
        stage_one.SPATIAL = 8
    elif not torch.cuda.is_available():
        print('{"error": "no CUDA device (use --tiny on a CPU)"}')
        return 1
    else:
        device, shape, tokens = torch.device("cuda"), (704, 1280), 1024
    dtype = torch.bfloat16
    Fp8Linear.backend = refiner_common.kernel_backend(device)
    transformer = refiner_common.build_refiner_transformer(args.tiny, device, dtype)
    text = refiner_common.refiner_text(transformer, tokens, device, dtype)
    h, w = shape[0] // stage_one.SPATIAL, shape[1] // stage_one.SPATIAL
    clip = torch.randn(1, transformer.config.in_channels, 13 + 3 * args.blocks, h, w,
                       generator=torch.Generator().manual_seed(2)).to(device, dtype)
    results = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   tiny=args.tiny, height=shape[0], width=shape[1], text_tokens=tokens, errors={})

    def record(name, fn):
        try:
            results[name] = fn()
        except Exception as error:  # keep the other rows (e.g. a compile failure)
            results["errors"][name] = f"{type(error).__name__}: {str(error)[:300]}"
        print(name, results.get(name, results["errors"].get(name)), flush=True)

    with torch.no_grad():
        # Each copy is made before a stream parks its prompt projections in CPU memory (`RefinerStream` does, as a
        # loader does after quantizing): FP8 quantizes the weights where they lie, and the official script parks
        # nothing (torch.compile cannot trace the parked modules' weight swap).
        quantized = copy.deepcopy(transformer)
        quantize_blocks(quantized.transformer_blocks)
        official = None if args.tiny else copy.deepcopy(transformer)
        record("camrender_fused_bf16", lambda: seconds_per_block(transformer, text, clip, device, "fused", args.blocks))
        record("diffusers_stock_eager", lambda: seconds_per_block(transformer, text, clip, device, "torch",
                                                                  args.blocks))
        record("camrender_fused_fp8", lambda: seconds_per_block(quantized, text, clip, device, "fused", args.blocks))
        del quantized, transformer
        if device.type == "cuda":
            torch.cuda.empty_cache()

        def compiled():
            for block in official.transformer_blocks:
                block.compile(mode=args.compile_mode)
            with refiner_common.unparked():
                return dict(mode=args.compile_mode,
                            **seconds_per_block(official, text, clip, device, "torch", args.blocks))

        if not args.tiny:
            record("official_stock_compiled", compiled)
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
