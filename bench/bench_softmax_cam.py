"""Time the softmax blocks' camera encode / decode (kernels.softmax_cam) at the release shape (GPU).

Release shape: B=2, N=21*880=18480 tokens, camera heads H=10 of D=112 (C=1120, padded to DPAD=128),
bf16 projections as the bf16 pipeline hands them over. Checks both kernels against the fp32
references (kernels.softmax_cam_reference) on the same bf16 inputs, then times them with
triton.testing.do_bench (median ms per call, L2 flushed between calls): the default launch, a
sweep of (block of tokens, warps), a device copy of the same bytes (the memory floor), and, with
--old PATH, an older kernels/softmax_cam.py loaded from that file for a side-by-side figure.

Prints one JSON object (also written to --out).

    python3 bench/bench_softmax_cam.py --out softmax_cam.json [--old path/to/softmax_cam_old.py]
    TRITON_INTERPRET=1 python bench/bench_softmax_cam.py --tiny     # CPU smoke test of this script
"""
import argparse
import importlib.util
import json
import sys
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cam_branch import random_rays  # noqa: E402
from camrender.kernels import softmax_cam  # noqa: E402
from camrender.kernels.softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref  # noqa: E402
from common import emit, kernel_ms  # noqa: E402

SHAPES = {"release": dict(B=2, N=21 * 880, H=10, D=112), "tiny": dict(B=1, N=40, H=2, D=16)}
SWEEP = [(bs, w) for bs in (8, 16, 32) for w in (2, 4, 8)]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def load_old(path):
    spec = importlib.util.spec_from_file_location("softmax_cam_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shape (CPU, TRITON_INTERPRET=1): no timings")
    parser.add_argument("--old", default=None, help="an older softmax_cam.py to time side by side")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    shape = SHAPES["tiny" if args.tiny else "release"]
    device = "cpu" if args.tiny else "cuda"
    b, n, h, d = (shape[x] for x in "BNHD")
    c, dpad = h * d, 128
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, c, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    qw, kw = ((0.5 + torch.rand(c, generator=gen)).to(device, torch.bfloat16) for _ in range(2))
    rays = random_rays(b, n, d, gen, device)
    # the SDPA output for the transposed (B, N, H, DPAD) encodings: a (B, H, N, DPAD) view
    o = torch.randn(b, n, h, dpad, generator=gen).to(device, torch.bfloat16).transpose(1, 2)
    enc_kw = dict(q_norm_weight=qw, k_norm_weight=kw, heads=h)
    res = dict(shape=shape, torch=torch.__version__, triton=triton.__version__,
               device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
               default_launch=dict(encode=softmax_cam.ENCODE_LAUNCH, decode=softmax_cam.DECODE_LAUNCH))

    want = cam_softmax_encode_ref(q, k, v, rays, out_dtype=torch.float32, **enc_kw)
    got32 = softmax_cam.cam_softmax_encode(q, k, v, rays, out_dtype=torch.float32, **enc_kw)
    got16 = softmax_cam.cam_softmax_encode(q, k, v, rays, **enc_kw)
    want_dec = cam_softmax_decode_ref(o, rays, dim=d, out_dtype=torch.float32)
    errors = {f"encode_{x}_fp32_out": rel_err(g, w) for x, g, w in zip("qkv", got32, want)}
    errors.update({f"encode_{x}_bf16_out": rel_err(g, w) for x, g, w in zip("qkv", got16, want)})
    errors["encode_pad_zero"] = all(bool((g[..., d:] == 0).all()) for g in got16)
    errors["decode_fp32_out"] = rel_err(softmax_cam.cam_softmax_decode(o, rays, dim=d, out_dtype=torch.float32),
                                        want_dec)
    errors["decode_bf16_out"] = rel_err(softmax_cam.cam_softmax_decode(o, rays, dim=d), want_dec)
    old = None
    if args.old:
        try:
            old = load_old(args.old)
            errors["old_encode_q_bf16_out"] = rel_err(old.cam_softmax_encode(q, k, v, rays, **enc_kw)[0], want[0])
            errors["old_decode_bf16_out"] = rel_err(old.cam_softmax_decode(o, rays, dim=d), want_dec)
        except Exception:
            errors["old"] = traceback.format_exc()[-400:]
            old = None
    res["errors"] = errors
    del want, got32, got16, want_dec
    print(json.dumps(res), file=sys.stderr, flush=True)

    if not args.tiny:
        views = softmax_cam.ray_inputs(rays, b, n, d, q.device)

        def enc(bs, w):
            return lambda: softmax_cam.encode_launch(q, k, v, views, q_norm_weight=qw, k_norm_weight=kw,
                                                     norm_eps=1e-5, heads=h, downscale=True,
                                                     out_dtype=torch.bfloat16, block_s=bs, num_warps=w)

        def dec(bs, w):
            return lambda: softmax_cam.decode_launch(o, views, dim=d, out_dtype=torch.bfloat16, block_s=bs,
                                                     num_warps=w)

        def bench(fn):
            try:
                return round(kernel_ms(fn, warmup=10, rep=60), 4)
            except Exception as exc:
                return repr(exc)[:200]

        times = dict(encode_public=bench(lambda: softmax_cam.cam_softmax_encode(q, k, v, rays, **enc_kw)),
                     decode_public=bench(lambda: softmax_cam.cam_softmax_decode(o, rays, dim=d)))
        if old is not None:
            times["old_encode_public"] = bench(lambda: old.cam_softmax_encode(q, k, v, rays, **enc_kw))
            times["old_decode_public"] = bench(lambda: old.cam_softmax_decode(o, rays, dim=d))
        enc_bytes = 3 * (b * n * c + b * n * h * dpad) * 2  # read q, k, v once, write 3 padded encodings
        dec_bytes = 2 * b * n * c * 2
        for name, nbytes in (("encode", enc_bytes), ("decode", dec_bytes)):
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            times[f"{name}_copy_same_bytes"] = bench(lambda: dst.copy_(src))
            del src, dst
        if not args.no_sweep:
            times["encode_sweep"] = {f"bs{bs}_w{w}": bench(enc(bs, w)) for bs, w in SWEEP}
            times["decode_sweep"] = {f"bs{bs}_w{w}": bench(dec(bs, w)) for bs, w in SWEEP}
        res["times_ms"] = times
    emit(res, args.out)
    return res


if __name__ == "__main__":
    main()
