"""Benchmark the fused camera branch against diffusers' PyTorch camera branch on one GPU.

Prints one JSON object (also written to --out): for each shape, the median time per block of
ours (tf32, bf16 inputs as in the bf16 pipeline), of diffusers' camera branch (RMSNorm + ReLU +
SanaWMBidirectionalGDNCamAttention, bf16), and of a device-to-device copy moving the same bytes
as the branch's minimum traffic (read raw q, k, v once, write the output once); errors
||ours - ref|| / ||ref|| against the fp32 ieee PyTorch reference; a per-kernel breakdown; and
a small sweep of launch configurations.

    python bench/bench_cam_branch.py --out results.json
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch
import triton
import triton.testing
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm import SanaWMBidirectionalGDNCamAttention
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from camrender import kernels  # noqa: E402
from camrender.kernels.camera_branch_reference import camera_branch_ref  # noqa: E402
from common import kernel_ms  # noqa: E402

SHAPES = {
    "release": dict(B=2, T=21, S=880, H=20, D=112, initial_state=False),
    "stream": dict(B=1, T=3, S=880, H=20, D=112, initial_state=True),
    "tiny": dict(B=1, T=2, S=6, H=2, D=16, initial_state=True),  # CPU smoke test of this script
}
CONFIGS = {  # launch-parameter sweep at the release shape (kernels.camera_branch `tuning`)
    "default": {},
    "rec_bv64_w8_st1": dict(block_v=64, num_warps=(8, 8, 4), num_stages=(3, 1, 3)),
    "rec_bv128_w8_st1": dict(block_v=128, num_warps=(8, 8, 4), num_stages=(3, 1, 3)),
    "out_split2": dict(s_split=2),
}


def random_rays(batch, tokens, dim, gen, device):
    """(P, P_T, P_inv, rope_cam) like diffusers': random SE(3) per token, random RoPE angles."""
    rot, _ = torch.linalg.qr(torch.randn(batch * tokens, 3, 3, generator=gen, dtype=torch.float64))
    p = torch.zeros(batch * tokens, 4, 4, dtype=torch.float64)
    p[:, :3, :3] = rot
    p[:, :3, 3] = 0.5 * torch.randn(batch * tokens, 3, generator=gen, dtype=torch.float64)
    p[:, 3, 3] = 1.0
    p_inv = torch.linalg.inv(p)
    p, p_inv = (m.float().reshape(batch, tokens, 4, 4).to(device) for m in (p, p_inv))
    angles = torch.rand(1, 1, tokens, dim // 4, generator=gen) * 6.2832
    rope = torch.polar(torch.ones_like(angles), angles).to(device)
    return p, p.transpose(-1, -2), p_inv, rope


def make_inputs(shape, seed, device):
    gen = torch.Generator().manual_seed(seed)
    b, t, s, h, d = (shape[x] for x in "BTSHD")
    n, c = t * s, h * d
    q, k, v = (torch.randn(b, n, h, d, generator=gen).to(device) for _ in range(3))
    beta = torch.sigmoid(torch.randn(b, t, s, h, generator=gen)).permute(0, 3, 1, 2).to(device)
    decay = (0.5 + 0.5 * torch.rand(b, h, t, generator=gen)).to(device)
    qw, kw = ((0.5 + torch.rand(c, generator=gen)).to(device) for _ in range(2))
    state = (0.05 * torch.randn(b, h, d, d, generator=gen)).to(device) if shape["initial_state"] else None
    return dict(q=q, k=k, v=v, beta=beta, decay=decay, rays=random_rays(b, n, d, gen, device), qw=qw, kw=kw,
                state=state)


BASE_TUNING = {}  # --tuning / --tuning-from: applied under every configuration


def ours(x, dtype, matmul_precision="tf32", tuning=None):
    cast = (lambda a: a.to(dtype))
    out, _ = kernels.camera_branch(cast(x["q"]), cast(x["k"]), cast(x["v"]), cast(x["beta"]), x["decay"], x["rays"],
                                   q_norm_weight=x["qw"], k_norm_weight=x["kw"], initial_state=x["state"],
                                   matmul_precision=matmul_precision, backend="triton",
                                   tuning={**BASE_TUNING, **(tuning or {})})
    return out


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return dict(rel_l2=((out - ref).norm() / ref.norm()).item(),
                max_abs_over_max_ref=((out - ref).abs().max() / ref.abs().max()).item())


def diffusers_branch_fn(x, dtype):
    """diffusers' camera branch on bf16 tensors: block norm + ReLU + SanaWMBidirectionalGDNCamAttention."""
    b, n, h, d = x["q"].shape
    t = x["decay"].shape[-1]
    qn, kn = RMSNorm(h * d, eps=1e-5).to(x["q"].device, dtype), RMSNorm(h * d, eps=1e-5).to(x["q"].device, dtype)
    with torch.no_grad():
        qn.weight.copy_(x["qw"])
        kn.weight.copy_(x["kw"])
    attn = SanaWMBidirectionalGDNCamAttention()
    q, k, v, beta = (x[name].to(dtype) for name in ("q", "k", "v", "beta"))
    rays = tuple(m.to(dtype) for m in x["rays"][:3]) + (x["rays"][3],)  # its einsum needs one dtype

    def run():
        with torch.no_grad():
            qq = torch.relu(qn(q.reshape(b, n, -1)).reshape(b, n, h, d))
            kk = torch.relu(kn(k.reshape(b, n, -1)).reshape(b, n, h, d))
            return attn(qq, kk, v, rays, beta, x["decay"], t)
    return run


def bench_ms(fn, rep=200):
    return kernel_ms(fn, warmup=25, rep=rep)


def kernel_breakdown(fn):
    """Per-kernel device time (ms per call) from the torch profiler, over 10 calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for evt in prof.key_averages():
        dev = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if dev:
            rows[evt.key[:60]] = round(dev / 1000 / 10, 4)
    return dict(sorted(rows.items(), key=lambda kv: -kv[1])[:12])


def run_shape(name, shape, sweep, log, device="cuda", timings=True):
    res = dict(shape=shape)
    x = make_inputs(shape, 0, device)
    b, t, s, h, d = (shape[k] for k in "BTSHD")
    # fp32 ieee reference from bf16-rounded inputs (what the bf16 pipeline hands the branch).
    xb = dict(x, **{k: x[k].to(torch.bfloat16).float() for k in ("q", "k", "v", "beta")})
    torch.backends.cuda.matmul.allow_tf32 = False
    ref, _ = camera_branch_ref(xb["q"], xb["k"], xb["v"], xb["beta"], xb["decay"], xb["rays"],
                                         q_norm_weight=x["qw"], k_norm_weight=x["kw"], initial_state=x["state"])
    log(f"{name}: reference done")
    errs = {}
    out = ours(xb, torch.float32, "ieee")
    errs["ours_ieee_fp32_in"] = rel_err(out, ref)
    out = ours(xb, torch.float32, "tf32")
    errs["ours_tf32_fp32_in"] = rel_err(out, ref)
    poison = ours(x, torch.bfloat16, "tf32")
    errs["ours_tf32_bf16_in_bf16_out"] = rel_err(poison, ref)
    errs["all_finite"] = bool(torch.isfinite(poison).all().item())
    try:
        dref = diffusers_branch_fn(xb, torch.bfloat16)()
        errs["diffusers_bf16"] = rel_err(dref, ref)
    except Exception as exc:  # diffusers missing: keep the rest of the run
        errs["diffusers_bf16"] = repr(exc)
    res["errors"] = errs
    del ref, out, poison
    log(f"{name}: errors {json.dumps(errs)}")
    if not timings:
        return res

    times = {}
    xbf = dict(x, **{k: x[k].to(torch.bfloat16) for k in ("q", "k", "v", "beta")})
    for cname, tuning in (CONFIGS.items() if sweep else list(CONFIGS.items())[:1]):
        try:
            times[f"ours_{cname}"] = bench_ms(lambda: ours(xbf, torch.bfloat16, "tf32", tuning))
        except Exception as exc:
            times[f"ours_{cname}"] = repr(exc)[:300]
        log(f"{name}: {cname} {times[f'ours_{cname}']}")
    try:
        graph_fn = lambda: ours(xbf, torch.bfloat16, "tf32")  # noqa: E731  (launch gaps removed)
        times["ours_default_cudagraph"] = triton.testing.do_bench_cudagraph(graph_fn, rep=100, return_mode="median")
    except Exception as exc:
        times["ours_default_cudagraph"] = repr(exc)[:300]
    try:
        times["diffusers_bf16"] = bench_ms(diffusers_branch_fn(x, torch.bfloat16), rep=500)
    except Exception as exc:
        times["diffusers_bf16"] = repr(exc)[:300]
    nbytes = 4 * b * t * s * h * d * 2  # read q, k, v + write out, bf16
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times["d2d_copy_same_bytes"] = bench_ms(lambda: dst.copy_(src))
    times["copy_bytes_moved"] = nbytes
    res["times_ms"] = times
    try:
        res["breakdown_ms"] = kernel_breakdown(lambda: ours(xbf, torch.bfloat16, "tf32"))
    except Exception as exc:
        res["breakdown_ms"] = repr(exc)[:300]
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--shapes", default="release,stream")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--cpu-smoke", action="store_true", help="errors only, on CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--tuning", default=None, help="JSON dict of camera_branch launch parameters to run with")
    parser.add_argument("--tuning-from", default=None,
                        help="JSON written by tune_cam_branch.py: run with its 'best' configuration")
    args = parser.parse_args()
    if args.tuning_from:
        try:
            with open(args.tuning_from) as fh:
                BASE_TUNING.update(json.load(fh)["best"]["tuning"])
        except (OSError, KeyError, ValueError) as exc:
            print(f"--tuning-from {args.tuning_from}: {exc!r}; using the defaults", file=sys.stderr)
    if args.tuning:
        BASE_TUNING.update(json.loads(args.tuning))

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    device = "cpu" if args.cpu_smoke else "cuda"
    result = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  torch=torch.__version__, triton=triton.__version__, tuning=dict(BASE_TUNING))
    for name in args.shapes.split(","):
        try:
            result[name] = run_shape(name, SHAPES[name], not args.no_sweep and name == "release", log,
                                     device=device, timings=not args.cpu_smoke)
        except Exception:
            result[name] = traceback.format_exc()[-2000:]
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
