"""SANA-WM FFN (`GLUMBConvTemp`) on one GPU: stock diffusers vs camrender.model.stage1.ffn, and the GLU kernel.

Release shape by default: B=2, T=21 frames of 22x40 tokens, C=2240, Hd=6720, bf16, random
weights (the released block layout: biases on the inverted and depthwise convs). Prints one JSON
object (also written to --out):

- ms: median over --repeats (CUDA events) of
    stock         GLUMBConvTemp.forward (diffusers)
    patched       PatchedGLUMBConvTemp.forward (settings backend "auto")
    inverted_gemm / glu_depthwise / point_gemm / temporal_conv: the patched parts alone
    glu_depthwise_ref: the PyTorch reference of the GLU stage
    segment_*:    ffn_parts on a segment-mode call (T = --segment-frames, cached left frame)
                  against the stock forward on the same frames; segment_temporal_conv / _gemms: its
                  temporal conv alone, as a convolution (cuDNN) and as GEMMs per tap (`ffn._temporal`)
- glu_depthwise_gbps: bytes moved at the floor (h read once, g written once) over its time;
- peak_gib: peak memory of one stock / one patched forward (above the inputs and weights);
- agreement: cosine and max relative error (max |a-b| / max |b|) of the patched output, of the
  GLU kernel and of the segment call's temporal conv (both ways) against fp32 references.

    python3 bench/bench_ffn.py [--repeats 20] [--tuning '{"block_c": 16, "num_warps": 8}'] [--sweep]

--sweep adds glu_depthwise_sweep: time and bandwidth of the GLU kernel for lanes 64/128/256 with the
exp silu and 64/128 with the tanh silu x (block_c, num_warps) in (8,4), (16,8), (8,8), (16,4) x
prefetch 1/2 (~1 min on an H200), and glu_depthwise_segment_sweep: the same on one segment call
(--segment-frames frames of batch 1).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import GLUMBConvTemp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from camrender.kernels.ffn_glu import glu_depthwise  # noqa: E402
from camrender.kernels.ffn_glu_reference import glu_depthwise_ref  # noqa: E402
from camrender.model.settings import KernelSettings  # noqa: E402
from camrender.model.stage1 import ffn  # noqa: E402
from camrender.model.stage1.ffn import PatchedGLUMBConvTemp, _conv_frames, ffn_parts  # noqa: E402

from bench_transformer import agreement  # noqa: E402  (cosine, max |a - b| / max |b|)
from common import add_latent_args, emit, gib, median_ms, peak_of  # noqa: E402


def timed(fn, repeats):
    """Median ms of fn() over `repeats` calls after 3 warm-up calls (common.median_ms)."""
    return median_ms(fn, repeats=repeats)


@contextlib.contextmanager
def temporal_path(gemm_frames: int):
    """The temporal conv as GEMMs per tap on calls of at most `gemm_frames` frames (0: always the convolution)."""
    kept = ffn.TEMPORAL_GEMM_MAX_FRAMES
    ffn.TEMPORAL_GEMM_MAX_FRAMES = gemm_frames
    try:
        yield
    finally:
        ffn.TEMPORAL_GEMM_MAX_FRAMES = kept


def glu_sweep(h, depth, height, width, repeats) -> list:
    """Time and bandwidth of the GLU kernel on `h` for 40 launch configurations."""
    rows = []
    floor_bytes = h.numel() * h.element_size() * 3 // 2  # h read once, g (half its channels) written once
    for lanes, silu in ((64, "exp"), (128, "exp"), (256, "exp"), (128, "tanh"), (64, "tanh")):
        for block_c, num_warps in ((8, 4), (16, 8), (8, 8), (16, 4)):
            for prefetch in (1, 2):
                tuning = {"lanes": lanes, "block_c": block_c, "num_warps": num_warps, "prefetch": prefetch,
                          "silu": silu}
                trial = glu_depthwise(h, depth.weight, depth.bias, height, width, tuning=tuning)
                took = timed(lambda: glu_depthwise(h, depth.weight, depth.bias, height, width, out=trial,
                                                   tuning=tuning), repeats)
                rows.append({**tuning, "ms": took, "gbps": floor_bytes / (took * 1e-3) / 1e9})
    return rows


def peak_gib(fn):
    """Peak GiB of one call of fn() above the memory allocated before it (None off CUDA)."""
    return gib(peak_of(fn, above_current=True)[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_latent_args(parser)
    parser.add_argument("--channels", type=int, default=2240)
    parser.add_argument("--mlp-ratio", type=float, default=3.0)
    parser.add_argument("--segment-frames", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tuning", type=json.loads, default=None, help="glu_depthwise launch overrides (JSON)")
    parser.add_argument("--sweep", action="store_true", help="also time 40 launch configurations of the GLU kernel")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()


    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the script (use tiny sizes)
    dtype = torch.bfloat16
    batch, frames, height, width, channels = args.batch, args.frames, args.height, args.width, args.channels
    hidden = int(channels * args.mlp_ratio)
    spatial = height * width
    stock = GLUMBConvTemp(channels, hidden, use_bias=(True, True, False), act=("silu", "silu", None))
    with torch.no_grad():
        for p in stock.parameters():
            p.normal_(0.0, (1.0 / p[0].numel()) ** 0.5 if p.ndim > 1 else 0.1)
    stock = stock.to(device, dtype).eval()
    patched = PatchedGLUMBConvTemp.adopt(stock, KernelSettings.from_kernels("fused"))
    x = torch.randn(batch, frames * spatial, channels, device=device, dtype=dtype)
    hw = (frames, height, width)
    results = {"shape": {"batch": batch, "frames": frames, "height": height, "width": width,
                         "channels": channels, "hidden": hidden, "dtype": str(dtype)},
               "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
               "tuning": args.tuning, "ms": {}}
    ms = results["ms"]

    inverted, depth, point = stock.inverted_conv.conv, stock.depth_conv.conv, stock.point_conv.conv
    with torch.no_grad():
        h = F.linear(x, inverted.weight[:, :, 0, 0], inverted.bias).view(batch * frames, spatial, 2 * hidden)
        g = glu_depthwise(h, depth.weight, depth.bias, height, width, tuning=args.tuning)
        y = F.linear(g, point.weight[:, :, 0, 0]).view(batch, frames, spatial, channels)
        t_weight = stock.t_conv.weight.contiguous(memory_format=torch.channels_last)

        ms["stock"] = timed(lambda: stock(x, HW=hw), args.repeats)
        ms["patched"] = timed(lambda: patched(x, HW=hw), args.repeats)
        ms["inverted_gemm"] = timed(lambda: F.linear(x, inverted.weight[:, :, 0, 0], inverted.bias), args.repeats)
        ms["glu_depthwise"] = timed(
            lambda: glu_depthwise(h, depth.weight, depth.bias, height, width, out=g, tuning=args.tuning), args.repeats)
        ms["point_gemm"] = timed(lambda: F.linear(g, point.weight[:, :, 0, 0]), args.repeats)
        ms["temporal_conv"] = timed(lambda: _conv_frames(y, t_weight, None), args.repeats)
        ms["glu_depthwise_ref"] = timed(lambda: glu_depthwise_ref(h, depth.weight, depth.bias, height, width),
                                        max(3, args.repeats // 4))
        floor_bytes = h.numel() * h.element_size() + g.numel() * g.element_size()
        results["glu_depthwise_gbps"] = floor_bytes / (ms["glu_depthwise"] * 1e-3) / 1e9

        if args.sweep:
            # every launch configuration's time (their outputs equal the default launch's:
            # tests/kernels/test_kernels_gpu.py), on the whole clip and on one segment call (batch 1)
            segment_h = h[:args.segment_frames].contiguous()
            for key, sample in (("glu_depthwise_sweep", h), ("glu_depthwise_segment_sweep", segment_h)):
                results[key] = glu_sweep(sample, depth, height, width, args.repeats)

        seg_frames = args.segment_frames
        x_seg = x[:, :seg_frames * spatial].contiguous()
        left = torch.randn(batch, 1, spatial, channels, device=device, dtype=dtype)
        ms["segment_ffn_parts"] = timed(
            lambda: ffn_parts(patched, x_seg, seg_frames, height, width, left=left), args.repeats)
        ms["segment_stock_forward"] = timed(lambda: stock(x_seg, HW=(seg_frames, height, width)), args.repeats)
        # the temporal conv of a segment call with its cached left frame, both ways (`ffn._temporal`)
        y_seg = y[:, :seg_frames].contiguous()
        segment_z = {}
        for path, gemm_frames in (("conv", 0), ("gemms", seg_frames)):
            with temporal_path(gemm_frames):
                ms[f"segment_temporal_{path}"] = timed(lambda: ffn._temporal(patched, y_seg, left, [(0, seg_frames)]),
                                                       args.repeats)
                segment_z[path] = ffn._temporal(patched, y_seg, left, [(0, seg_frames)])

        results["peak_gib"] = {"stock": peak_gib(lambda: stock(x, HW=hw)),
                               "patched": peak_gib(lambda: patched(x, HW=hw))}

        out = patched(x, HW=hw)
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        reference = stock.float()(x.float(), HW=hw)  # fp32 stock, TF32 off
        with temporal_path(0):
            segment_reference = ffn._temporal(stock, y_seg.float(), left.float(), [(0, seg_frames)])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        stock.to(dtype)
        results["agreement"] = {
            "patched_vs_fp32_stock": agreement(out, reference),
            "stock_bf16_vs_fp32_stock": agreement(stock(x, HW=hw), reference),
            "glu_depthwise_vs_fp32_ref": agreement(
                g, glu_depthwise_ref(h.float(), depth.weight.float(), depth.bias.float(), height, width)),
            **{f"segment_temporal_{path}_vs_fp32": agreement(z, segment_reference) for path, z in segment_z.items()},
        }
    emit(results, args.out)


if __name__ == "__main__":
    main()
