"""Benchmark the fused main GDN branch and the fused softmax block against diffusers (GPU).

Release shape by default: B=2, T=21, S=22*40=880, H=20, D=112, bf16 activations, random weights.
Prints one JSON object (also written to --out) with:
- accuracy: cosine / max relative error (max |a - b| / max |b|) / norm relative error of
  ours (bf16, tf32) and of stock diffusers (bf16) against stock diffusers in fp32; and of ours in
  fp32 + ieee against stock fp32 (kernel arithmetic alone);
- timings (median ms, triton.testing.do_bench): stock main branch (short conv + norms + GDN), ours
  and its parts (short conv, prep, scan, divide), kernels.delta_scan on the two streams, the copy
  roofline (bytes the branch must move / measured copy bandwidth);
- peak memory of stock vs ours;
- the softmax block (stock vs camrender.model.stage1.softmax_attention), time and accuracy.

Usage: python3 bench/bench_main_branch.py [--out results.json] [--quick]
"""
import argparse
import copy
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm import (
    _invert_SE3,
    _slice_rope_for_cam,
    _SoftmaxUCPESinglePathLiteLA,
    BidirectionalGDNUCPESinglePathLiteLA,
    SanaWMBidirectionalGDNAttention,
    SanaWMRotaryPosEmbed,
    SanaWMTemporalShortConvolution,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from camrender import kernels  # noqa: E402
from camrender.kernels._reference_parts import rope_pairs  # noqa: E402
from camrender.kernels.main_branch import _chunkwise, main_branch  # noqa: E402
from camrender.kernels.main_prep import main_prep  # noqa: E402
from camrender.kernels.short_conv import short_conv  # noqa: E402
from camrender.model.settings import KernelSettings  # noqa: E402
from camrender.model.stage1.gdn_attention import PatchedGDNAttention  # noqa: E402
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention, sdpa  # noqa: E402

from common import add_latent_args, emit, kernel_ms, peak_of  # noqa: E402


def _stats(ours, ref):
    a, b = ours.double().flatten(), ref.double().flatten()
    return {
        "cosine": (a @ b / (a.norm() * b.norm())).item(),
        "max_rel": ((a - b).abs().max() / b.abs().max()).item(),
        "norm_rel": ((a - b).norm() / b.norm()).item(),
        "finite": bool(torch.isfinite(a).all()),
    }


def _bench(fn, quick):
    """Median ms (common.kernel_ms: do_bench on CUDA, one timed call in a CPU smoke run)."""
    return kernel_ms(fn, warmup=10 if quick else 25, rep=50 if quick else 200)


def _peak(fn):
    """Peak MiB of one call above what was allocated before it (None off CUDA)."""
    peak = peak_of(fn, above_current=True)[1]
    return None if peak is None else peak / 2**20


def _random_se3(count, device, generator):
    a = torch.randn(count, 3, 3, generator=generator, device=device)
    rot, _ = torch.linalg.qr(a)
    rot = rot * torch.sign(torch.linalg.det(rot))[:, None, None]
    mats = torch.eye(4, device=device).repeat(count, 1, 1)
    mats[:, :3, :3] = rot
    mats[:, :3, 3] = torch.randn(count, 3, generator=generator, device=device)
    return mats


def bench_main(args, res):

    dev = torch.device(args.device)
    B, T, hh, ww, H, D = args.batch, args.frames, args.height, args.width, args.heads, args.head_dim
    S, C = hh * ww, H * D
    N = T * S
    gen = torch.Generator(device=dev).manual_seed(0)
    qkv = torch.randn(B, N, 3 * C, device=dev, generator=gen).bfloat16()
    beta = torch.rand(B, T, S, H, device=dev, generator=gen).bfloat16().permute(0, 3, 1, 2)
    decay = (0.3 + 0.7 * torch.rand(B, T, H, device=dev, generator=gen)).transpose(1, 2)
    rope = SanaWMRotaryPosEmbed(D, (1, 1, 1), 1024)((T, hh, ww), device=dev)
    conv = SanaWMTemporalShortConvolution(C, 4).to(dev)
    q_norm, k_norm = RMSNorm(C, 1e-5).to(dev), RMSNorm(C, 1e-5).to(dev)
    with torch.no_grad():
        conv.weight.copy_(0.5 * torch.randn(conv.weight.shape, device=dev, generator=gen))
        q_norm.weight.copy_(1 + 0.1 * torch.randn(C, device=dev, generator=gen))
        k_norm.weight.copy_(1 + 0.1 * torch.randn(C, device=dev, generator=gen))
    attn = SanaWMBidirectionalGDNAttention(eps=1e-8)
    recall = torch.zeros(1, device=dev)
    res["shape"] = {"B": B, "T": T, "S": S, "H": H, "D": D, "N": N, "C": C}

    def stock(inp, conv_m, qn_m, kn_m):
        q, k, v = inp.reshape(B, N, 3, H, D).unbind(2)
        k = conv_m(k.reshape(B, N, C), T)
        q = torch.relu(qn_m(q.reshape(B, N, C))).reshape(B, N, H, D)
        k = torch.relu(kn_m(k)).reshape(B, N, H, D)
        return attn(q, k, v, beta, decay, recall, T, rotary_emb=rope)

    def ours(inp, weights=(conv, q_norm, k_norm), matmul_precision="tf32"):
        k, _ = short_conv(inp[..., C:2 * C], weights[0].weight, T)
        out, _ = main_branch(inp[..., :C], k, inp[..., 2 * C:], beta, decay, rope, q_norm_weight=weights[1].weight,
                             k_norm_weight=weights[2].weight, matmul_precision=matmul_precision)
        return out

    conv16, qn16, kn16 = (copy.deepcopy(m).to(torch.bfloat16) for m in (conv, q_norm, k_norm))
    with torch.no_grad():
        ref32 = stock(qkv.float(), conv, q_norm, k_norm)
        stock16 = stock(qkv, conv16, qn16, kn16)
        ours16 = ours(qkv, (conv16, qn16, kn16))
        ours32 = ours(qkv.float(), matmul_precision="ieee")
    res["accuracy"] = {
        "ours_bf16_tf32_vs_stock_fp32": _stats(ours16, ref32),
        "stock_bf16_vs_stock_fp32": _stats(stock16, ref32),
        "ours_bf16_vs_stock_bf16": _stats(ours16, stock16),
        "ours_fp32_ieee_vs_stock_fp32": _stats(ours32, ref32),
    }
    print(json.dumps(res["accuracy"]), flush=True)
    del ref32, ours32

    t = {}
    with torch.no_grad():
        t["stock_main_branch"] = _bench(lambda: stock(qkv, conv16, qn16, kn16), args.quick)
        t["ours_main_branch"] = _bench(lambda: ours(qkv, (conv16, qn16, kn16)), args.quick)
        key_raw = qkv[..., C:2 * C]
        t["part_short_conv"] = _bench(lambda: short_conv(key_raw, conv16.weight, T), args.quick)
        t["stock_short_conv"] = _bench(lambda: conv16(key_raw, T), args.quick)
        k_conv, _ = short_conv(key_raw, conv16.weight, T)
        pairs = rope_pairs(rope)  # the table the kernels read (main_branch makes it once for both preps)
        t["part_prep_q_and_k_with_rotated_copies"] = _bench(lambda: (
            main_prep(qkv[..., :C], qn16.weight, H, rope=pairs, keep_unrotated=True),
            main_prep(k_conv, kn16.weight, H, scale=D ** -0.5 * S ** -0.5, rope=pairs, keep_unrotated=True)),
            args.quick)
        qn, qr = main_prep(qkv[..., :C], qn16.weight, H, rope=pairs, keep_unrotated=True)
        kn, kr = main_prep(k_conv, kn16.weight, H, scale=D ** -0.5 * S ** -0.5, rope=pairs, keep_unrotated=True)
        v = qkv[..., 2 * C:]
        out_buf = torch.empty(B, N, C, device=dev, dtype=torch.bfloat16)
        t["part_scans_chunkwise_kv_z_divide"] = _bench(lambda: _chunkwise(
            qn, kn, qr, kr, v, beta, decay, out_buf, eps=1e-8, initial_state=None, segment_starts=None,
            matmul_precision="tf32", output_final_state=False), args.quick)
        t["ours_main_branch_ieee"] = _bench(lambda: ours(qkv, (conv16, qn16, kn16), matmul_precision="ieee"),
                                            args.quick)
    res["ms"] = t
    print(json.dumps(t), flush=True)

    # kernels.delta_scan on the two streams, in the scan layout

    def to_scan(x):
        return x.reshape(B, T, S, H, -1).permute(0, 3, 1, 2, 4).contiguous()

    qs, ks, qrs, krs, vs = (to_scan(x) for x in (qn, kn, qr, kr, v))
    ones = torch.ones_like(ks[..., :1])
    with torch.no_grad():
        kernels.delta_scan(qrs, krs, vs, beta, decay)
        res["ms"]["delta_scan_kv_only_scan_layout"] = _bench(lambda: kernels.delta_scan(qrs, krs, vs, beta, decay),
                                                             args.quick)
        res["ms"]["delta_scan_z_only_scan_layout"] = _bench(lambda: kernels.delta_scan(qs, ks, ones, beta, decay),
                                                            args.quick)

    # copy roofline
    buf = torch.empty(2**28 if dev.type == "cuda" else 2**16, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(buf)
    copy_ms = _bench(lambda: dst.copy_(buf), args.quick)
    bw = 2 * buf.numel() * 2 / (copy_ms * 1e-3)
    must_move = 4 * B * N * C * 2  # read q, k, v once, write the output once (bf16)
    flops = 2 * 2 * 3 * S * D * D * B * H * T  # KV scan: 3 (S x D x D) products per frame, both directions
    res["roofline"] = {"copy_GBps": bw / 1e9, "bytes_must_move": must_move, "floor_ms_memory": must_move / bw * 1e3,
                       "kv_scan_gflop": flops / 1e9}
    res["peak_MiB"] = {
        "stock_main_branch": _peak(lambda: stock(qkv, conv16, qn16, kn16)),
        "ours_main_branch": _peak(lambda: ours(qkv, (conv16, qn16, kn16))),
    }


def bench_softmax(args, res):

    dev = torch.device(args.device)
    B, T, hh, ww, H, D = args.batch, args.frames, args.height, args.width, args.heads, args.head_dim
    S, C = hh * ww, H * D
    N = T * S
    gen = torch.Generator(device=dev).manual_seed(1)
    torch.manual_seed(1)
    block = _SoftmaxUCPESinglePathLiteLA(C, C, cam_dim=C, cam_heads=H, heads=H, dim=D, qk_norm=True,
                                         patch_size=(1, 1, 1)).to(dev)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("weight") and p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, device=dev, generator=gen))
    x = torch.randn(B, N, C, device=dev, generator=gen)
    rope = SanaWMRotaryPosEmbed(D, (1, 1, 1), 1024)((T, hh, ww), device=dev)
    p = _random_se3(B * N, dev, gen).reshape(B, N, 4, 4)
    rays = (p, p.transpose(-1, -2), _invert_SE3(p), _slice_rope_for_cam(rope, D, D // 2))
    cam = torch.zeros(B, T, 20, device=dev)
    kw32 = dict(HW=(T, hh, ww), rotary_emb=rope, camera_conditions=cam, ucpe_ray_transforms=rays)
    # the pipeline builds the ray matrices in the activation dtype (the stock einsum needs it)
    rays16 = tuple(r if r.is_complex() else r.bfloat16() for r in rays)
    kw = dict(kw32, camera_conditions=cam.bfloat16(), ucpe_ray_transforms=rays16)

    block16 = copy.deepcopy(block).to(torch.bfloat16)
    patched = PatchedSoftmaxAttention.adopt(block16)
    x16 = x.bfloat16()
    with torch.no_grad():
        ref32 = block(x, **kw32)
        stock16 = block16(x16, **kw)
        ours16 = patched(x16, **kw)
        res["softmax_accuracy"] = {
            "ours_bf16_vs_stock_fp32": _stats(ours16, ref32),
            "stock_bf16_vs_stock_fp32": _stats(stock16, ref32),
            "ours_bf16_vs_stock_bf16": _stats(ours16, stock16),
        }
        print(json.dumps(res["softmax_accuracy"]), flush=True)
        res["softmax_ms"] = {
            "stock_block_attention": _bench(lambda: block16(x16, **kw), args.quick),
            "ours_block_attention": _bench(lambda: patched(x16, **kw), args.quick),
        }
        res["softmax_peak_MiB"] = {"stock": _peak(lambda: block16(x16, **kw)), "ours": _peak(lambda: patched(x16, **kw))}
        for label, backends in (("flash_only", ["FLASH_ATTENTION"]),
                                ("cudnn_first", ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"])):
            try:
                patched.sdpa_backends = backends
                out = patched(x16, **kw)
                res["softmax_ms"][f"ours_{label}"] = _bench(lambda: patched(x16, **kw), args.quick)
                res["softmax_accuracy"][f"ours_{label}_vs_stock_fp32"] = _stats(out, ref32)
            except Exception as exc:
                res["softmax_ms"][f"ours_{label}"] = repr(exc)[:300]
        patched.sdpa_backends = None
        q16 = torch.randn(B, H, N, 128, device=dev, generator=gen).bfloat16()
        for label, backends in (("flash", ["FLASH_ATTENTION"]), ("cudnn", ["CUDNN_ATTENTION"])):
            try:
                res["softmax_ms"][f"sdpa_only_d128_{label}"] = _bench(lambda: sdpa(q16, q16, q16, backends=backends),
                                                                        args.quick)
            except Exception as exc:
                res["softmax_ms"][f"sdpa_only_d128_{label}"] = repr(exc)[:300]
    print(json.dumps(res["softmax_ms"]), flush=True)


def bench_gdn_block(args, res):
    """Whole GDN block attention with the camera branch off: stock vs camrender.model.stage1.patch
    (main branch + glue)."""

    dev = torch.device(args.device)
    B, T, hh, ww, H, D = args.batch, args.frames, args.height, args.width, args.heads, args.head_dim
    C = H * D
    N = T * hh * ww
    gen = torch.Generator(device=dev).manual_seed(2)
    torch.manual_seed(2)
    block = BidirectionalGDNUCPESinglePathLiteLA(C, C, cam_dim=C, cam_heads=H, heads=H, dim=D, qk_norm=True,
                                                 eps=1e-8, patch_size=(1, 1, 1)).to(dev)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, device=dev, generator=gen))
            elif name.startswith("conv_k"):
                p.copy_(0.5 * torch.randn(p.shape, device=dev, generator=gen))
    x = torch.randn(B, N, C, device=dev, generator=gen)
    rope = SanaWMRotaryPosEmbed(D, (1, 1, 1), 1024)((T, hh, ww), device=dev)
    kw = dict(HW=(T, hh, ww), rotary_emb=rope)
    block16 = copy.deepcopy(block).to(torch.bfloat16)
    patched = PatchedGDNAttention.adopt(block16, KernelSettings.from_kernels("fused", "tf32"))
    x16 = x.bfloat16()
    with torch.no_grad():
        ref32 = block(x, **kw)
        res["gdn_block_main_only_accuracy"] = {
            "ours_bf16_vs_stock_fp32": _stats(patched(x16, **kw), ref32),
            "stock_bf16_vs_stock_fp32": _stats(block16(x16, **kw), ref32),
        }
        res["gdn_block_main_only_ms"] = {"stock": _bench(lambda: block16(x16, **kw), args.quick),
                                         "ours": _bench(lambda: patched(x16, **kw), args.quick)}
    print(json.dumps(res["gdn_block_main_only_ms"]), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_latent_args(parser)
    parser.add_argument("--heads", type=int, default=20)
    parser.add_argument("--head-dim", type=int, default=112)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="shorter timing runs")
    parser.add_argument("--skip-softmax", action="store_true")
    parser.add_argument("--skip-main", action="store_true")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only for a smoke run under TRITON_INTERPRET=1")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_main_branch needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1 for a smoke run)")

    res = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__, "triton": triton.__version__}
    start = time.time()
    for name, fn in (("main", bench_main), ("softmax", bench_softmax), ("gdn_block", bench_gdn_block)):
        if (name == "softmax" and args.skip_softmax) or (name == "main" and args.skip_main):
            continue
        try:
            fn(args, res)
        except Exception:
            res[f"{name}_error"] = traceback.format_exc()[-3000:]
            print(res[f"{name}_error"], file=sys.stderr, flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    res["bench_seconds"] = time.time() - start
    emit(res, args.out, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))


if __name__ == "__main__":
    main()
