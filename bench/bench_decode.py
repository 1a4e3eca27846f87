"""Streaming causal decode speed of the LTX-2 video VAE (camrender.render.decode), GPU.

Decodes a path of 3-latent-frame segments (the first 4 frames) at the release resolution with
`CausalStreamDecoder`, random VAE weights in bf16, under several cuDNN settings side by side.
Prints JSON: seconds per path, video frames per second. That the settings give the same frames
is a test: tests/kernels/test_kernels_gpu.py (`python3 -m pytest -m gpu`).

    python3 bench/bench_decode.py --segments 6 --out decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from diffusers import AutoencoderKLLTX2Video

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from camrender.model.stage1.segments import segment_bounds  # noqa: E402
from camrender.render.decode import CausalStreamDecoder  # noqa: E402
from common import Stopwatch, emit  # noqa: E402


def decode_path(vae, latents, channels_last: bool) -> tuple[float, int]:
    """(synced seconds, video frames) of the streaming decode of `latents`, 3 latent frames a call."""
    decoder = CausalStreamDecoder(vae)
    frames = 0
    with Stopwatch("cuda") as watch:
        for start, stop in segment_bounds(latents.shape[2], 3):
            chunk = latents[:, :, start:stop]
            if channels_last:
                chunk = chunk.contiguous(memory_format=torch.channels_last_3d)
            frames += decoder.decode(chunk).shape[2]
    return watch.seconds, frames


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
    vae = vae.to(torch.bfloat16).eval()
    latents = torch.randn(1, vae.config.latent_channels, 1 + 3 * args.segments, 22, 40, device="cuda",
                          dtype=torch.bfloat16)
    variants = {
        "default": dict(benchmark=False, channels_last=False),
        "cudnn_benchmark": dict(benchmark=True, channels_last=False),
        "cudnn_benchmark_channels_last_3d": dict(benchmark=True, channels_last=True),
    }
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "segments": args.segments,
              "variants": {}}
    with torch.no_grad():
        for name, setting in variants.items():
            torch.backends.cudnn.benchmark = setting["benchmark"]
            vae.to(memory_format=torch.channels_last_3d if setting["channels_last"] else torch.contiguous_format)
            decode_path(vae, latents, setting["channels_last"])  # warm-up (and cuDNN autotuning)
            seconds, frames = decode_path(vae, latents, setting["channels_last"])
            result["variants"][name] = {
                "seconds": round(seconds, 3), "video_frames": frames, "video_fps": round(frames / seconds, 1),
            }
            print(json.dumps({name: result["variants"][name]}), flush=True)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
