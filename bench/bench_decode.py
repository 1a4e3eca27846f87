"""Streaming causal decode speed of the LTX-2 video VAE (camrender.render.decode), GPU.

Decodes a path of 3-latent-frame segments (the first 4 frames) at the release resolution with
`CausalStreamDecoder`, random VAE weights in bf16, side by side: the decoder's activations in NCDHW
(PyTorch's default layout; cuDNN transposes around each 3-d conv) and channels-last (`channels_last=True`,
the default on CUDA), each a segment per VAE call (no refiner) and one latent frame per call (beside a
refiner), with and without cuDNN's autotuning. Prints JSON: seconds per path, video frames per second,
the largest difference of each variant's frames from the first's (beside `ncdhw_one_ulp`: the stock layout
on latents moved one bf16 ulp, the decode's own noise floor), and (`--profile`) the GPU kernels of one
steady segment's decode by kind and by name. Channels-last runs the norm -> SiLU pairs fused
(`kernels.rms_silu`); `channels_last_stock_norms` runs them as diffusers does, to tell the two gains apart.

    python3 bench/bench_decode.py --segments 6 --profile --out decode.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from diffusers import AutoencoderKLLTX2Video
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from camrender.model.stage1.segments import segment_bounds  # noqa: E402
from camrender.render.decode import CausalStreamDecoder  # noqa: E402
from common import Stopwatch, emit, sync  # noqa: E402
from profile_refiner import by_kind  # noqa: E402
from profile_segment import profile_table  # noqa: E402

VARIANTS = {  # name: (channels_last, latent frames per VAE call, cuDNN benchmark, fused norms, latents one ulp up)
    "ncdhw": (False, None, False, False, False),
    "ncdhw_one_ulp": (False, None, False, False, True),
    "channels_last": (True, None, False, True, False),
    "channels_last_stock_norms": (True, None, False, False, False),
    "ncdhw_one_frame_per_call": (False, 1, False, False, False),
    "channels_last_one_frame_per_call": (True, 1, False, True, False),
    "ncdhw_cudnn_benchmark": (False, None, True, False, False),
    "channels_last_cudnn_benchmark": (True, None, True, True, False),
}


def decode_path(vae, latents, channels_last: bool, max_frames, fused_norms: bool = True, *, profiled: bool = False):
    """(synced seconds, the decoded video (1, 3, F, H, W), the profile of the last segment's decode or None)."""
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    for conv in vae.decoder.modules():  # each variant's kernels in its own layout (a decoder lays them out once)
        if isinstance(conv, torch.nn.Conv3d):
            conv.weight.data = conv.weight.data.contiguous(memory_format=memory_format)
    decoder = CausalStreamDecoder(vae, max_frames=max_frames, channels_last=channels_last)
    if not fused_norms:
        decoder._fusable, decoder._fuse_head = [], False
    bounds = segment_bounds(latents.shape[2], 3)
    videos, profiler = [], None
    with Stopwatch("cuda") as watch:
        for start, stop in bounds[:-1]:
            videos.append(decoder.decode(latents[:, :, start:stop]))
    seconds = watch.seconds
    start, stop = bounds[-1]
    if profiled:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            videos.append(decoder.decode(latents[:, :, start:stop]))
            sync()
    else:
        videos.append(decoder.decode(latents[:, :, start:stop]))
    return seconds, torch.cat(videos, dim=2), profiler


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=6, help="timed segments (one more is profiled)")
    parser.add_argument("--profile", action="store_true", help="kernel tables of one steady segment's decode")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8)
    vae = vae.to(torch.bfloat16).eval()
    latents = torch.randn(1, vae.config.latent_channels, 1 + 3 * (args.segments + 1), 22, 40, device="cuda",
                          dtype=torch.bfloat16)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "segments": args.segments,
              "variants": {}}
    reference = None
    saved = torch.backends.cudnn.benchmark
    try:
        with torch.no_grad():
            for name, (channels_last, max_frames, benchmark, fused, nudge) in VARIANTS.items():
                torch.backends.cudnn.benchmark = benchmark
                inputs = torch.nextafter(latents, torch.full_like(latents, float("inf"))) if nudge else latents
                decode_path(vae, inputs, channels_last, max_frames, fused)  # warm-up (and cuDNN autotuning)
                seconds, video, profiler = decode_path(vae, inputs, channels_last, max_frames, fused,
                                                       profiled=args.profile)
                timed_frames = 1 + 24 * args.segments  # every segment but the last (profiled) one
                reference = video.float() if reference is None else reference
                row = {"seconds": round(seconds, 3), "video_frames": timed_frames,
                       "video_fps": round(timed_frames / seconds, 1),
                       "max_abs_diff_vs_first": float((video.float() - reference).abs().max())}
                if profiler is not None:
                    table = profile_table(profiler, set())
                    row["profile"] = dict(by_kind=by_kind(profiler), kernel_ms_total=table["kernel_ms_total"],
                                          kernel_launches=table["kernel_launches"], kernels=table["kernels"][:15])
                result["variants"][name] = row
                print(json.dumps({name: {k: v for k, v in row.items() if k != "profile"}}), flush=True)
    finally:
        torch.backends.cudnn.benchmark = saved
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
