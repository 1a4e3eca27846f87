"""Where the patched model's output departs from stock: agreement with one part fused at a time.

Builds the release-config transformer of `bench_transformer.py` (random weights, bf16), runs the
stock forward and the stock forward in fp32 (TF32 off) as references, patches it, then runs one
forward per configuration with only the named parts on our kernels and the rest on diffusers' code:

    glue        adaLN steps, residual adds, the attentions' output gate (kernels.block_glue)
    cross_attn  query RMSNorm + head merge of the cross-attention
    ffn         the token-major FFN (GLU depthwise kernel, in-place temporal conv)
    gdn_main    GDN main branch (short conv, prep, scans, division)
    gdn_camera  GDN camera branch (short conv, kernels.camera_branch)
    softmax     softmax-block attention (prep, SDPA, camera encode/decode)
    all / none  every part / no part (none must equal stock bit for bit: checks the switching)
    nudged      no part, but one input element moved by one bf16 ulp: the stock model's own
                sensitivity, the floor of any agreement figure short of bit-identical arithmetic
    tf32        no part, with TF32 matmuls allowed (diffusers' fp32 scans then run on TF32): stock
                as many users run it

and prints JSON: per configuration, cosine and max relative error (max |a-b| / max |b|) of the
transformer output against stock bf16 and against stock fp32, quantiles of |a-b| / max |b|, and
(--blocks) the same two figures for every block's output against stock's, to show where the
outputs part and how the gap grows.

    python3 bench/agreement_parts.py --blocks --out parts.json  # release shape, H200: ~2 min
    python3 bench/agreement_parts.py --quick                     # 4 layers, 41 frames
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch
from diffusers.models.transformers.transformer_sana_wm import GLUMBConvTemp, _SoftmaxUCPESinglePathLiteLA

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import camrender.model.stage1.block as patch_block  # noqa: E402
from camrender.kernels.block_glue import gated_residual  # noqa: E402
from camrender.model.settings import KernelSettings  # noqa: E402
from camrender.model.stage1.gdn_attention import PatchedGDNAttention, combine_branches  # noqa: E402
from camrender.model.stage1.patch import patch_transformer  # noqa: E402
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention  # noqa: E402

from bench_transformer import agreement, bench_setup, build_model, fp32_reference, make_inputs, nudged  # noqa: E402
from common import emit  # noqa: E402

PARTS = ("glue", "cross_attn", "ffn", "gdn_main", "gdn_camera", "softmax")


def spread(out, ref) -> dict:
    """Quantiles of |out - ref| / max |ref| and the count of elements above 1e-2 of it."""
    rel = (out.float() - ref.float()).abs().flatten() / ref.float().abs().max()
    sample = rel  # torch.quantile takes at most 2^24 elements
    if rel.numel() > 1 << 24:
        sample = rel[torch.randperm(rel.numel(), generator=torch.Generator().manual_seed(0))[:1 << 24]]
    quantiles = torch.quantile(sample.double(), torch.tensor([0.5, 0.99, 0.9999], dtype=torch.float64))
    return {"p50": float(quantiles[0]), "p99": float(quantiles[1]), "p99_99": float(quantiles[2]),
            "above_1e-2": int((rel > 1e-2).sum())}


@contextlib.contextmanager
def block_outputs(model, sink):
    """Forward hooks that hand every block's output to sink(index, output)."""
    handles = [block.register_forward_hook(lambda module, args, out, i=i: sink(i, out))
               for i, block in enumerate(model.blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def stock_camera_branch(attn, x, beta, decay, HW, ray_transforms):
    """Diffusers' GDN camera branch up to out_proj_cam (the lines of its forward), (B, N, C)."""
    batch, tokens, _ = x.shape
    frames = HW[0]
    query, key, value = attn.q_proj_cam(x), attn.k_proj_cam(x), attn.v_proj_cam(x)
    if attn.conv_q_cam is not None:
        query = attn.conv_q_cam(query, frames)
    if attn.conv_k_cam is not None:
        key = attn.conv_k_cam(key, frames)
    if attn.conv_v_cam is not None:
        value = attn.conv_v_cam(value, frames)
    shape = (batch, tokens, attn.cam_heads, attn.cam_head_dim)
    query = attn.kernel_func(attn.q_norm_cam(query).reshape(shape))
    key = attn.kernel_func(attn.k_norm_cam(key).reshape(shape))
    return attn.cam_attn(query, key, value.reshape(shape), ray_transforms, beta, decay, frames)


@contextlib.contextmanager
def switches(model):
    """Route each patched module of `model` through our kernels or diffusers' code; yields
    select(parts), which puts the PARTS named in `parts` on our kernels and the rest on diffusers'."""
    fused_settings, torch_settings = KernelSettings("auto", "tf32"), KernelSettings("torch", "tf32")

    chosen = {"parts": set()}
    originals = (patch_block.ffn_residual, PatchedGDNAttention._main_branch, PatchedGDNAttention._camera_branch,
                 PatchedGDNAttention._combine, PatchedSoftmaxAttention.forward)

    def ffn_residual(block, x, mlp_in, grid, gate, backend, **kwargs):
        if "ffn" in chosen["parts"]:
            return originals[0](block, x, mlp_in, grid, gate, backend, **kwargs)
        return gated_residual(x, GLUMBConvTemp.forward(block.mlp, mlp_in, grid), gate, backend=backend), None

    def main_branch(attn, x, beta, decay, rotary_emb, call, block_state, x_rows=None):
        if "gdn_main" in chosen["parts"]:
            return originals[1](attn, x, beta, decay, rotary_emb, call, block_state, x_rows)
        return attn._main_branch_stock(x, beta, decay, call.num_frames, rotary_emb)

    def camera_branch(attn, x, beta, decay, rays, call, block_state):
        if "gdn_camera" in chosen["parts"]:
            return originals[2](attn, x, beta, decay, rays, call, block_state)
        return stock_camera_branch(attn, x, beta, decay, call.grid, rays)

    def softmax(attn, x, *, rotary_emb=None, camera_conditions=None, ucpe_ray_transforms=None, state=None,
                segment=None, x_rows=None):
        if "softmax" in chosen["parts"]:
            return originals[4](attn, x, rotary_emb=rotary_emb, camera_conditions=camera_conditions,
                                ucpe_ray_transforms=ucpe_ray_transforms, state=state, segment=segment, x_rows=x_rows)
        return _SoftmaxUCPESinglePathLiteLA.forward(attn, x, None, segment.grid, rotary_emb, None, camera_conditions,
                                                    ucpe_ray_transforms=ucpe_ray_transforms)

    def combine(attn, x, main, camera, x_rows=None):
        return combine_branches(attn, x, main, camera, "auto" if "glue" in chosen["parts"] else "torch", x_rows)

    def select(parts):
        chosen["parts"] = set(parts)
        for block in model.blocks:
            block.settings = fused_settings if "glue" in parts else torch_settings
            block.cross_attn.processor.backend = "auto" if "cross_attn" in parts else "torch"
            block.mlp.settings = fused_settings if "ffn" in parts else torch_settings

    patch_block.ffn_residual = ffn_residual
    PatchedGDNAttention._main_branch, PatchedGDNAttention._camera_branch = main_branch, camera_branch
    PatchedGDNAttention._combine, PatchedSoftmaxAttention.forward = combine, softmax
    try:
        yield select
    finally:
        patch_block.ffn_residual = originals[0]
        PatchedGDNAttention._main_branch, PatchedGDNAttention._camera_branch = originals[1], originals[2]
        PatchedGDNAttention._combine, PatchedSoftmaxAttention.forward = originals[3], originals[4]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 layers (softmax at 3), 41 frames")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test of this script (tiny model)")
    parser.add_argument("--configs", default="none,nudged,tf32,all," + ",".join(PARTS),
                        help="comma-separated configurations: none, nudged, tf32, all, or parts joined by '+'")
    parser.add_argument("--blocks", action="store_true", help="also compare every block's output")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    device, dtype, config, frames, height, width = bench_setup(quick=args.quick, tiny=args.tiny)
    model = build_model(config, device, dtype)
    inputs = make_inputs(config, frames, height, width, device, dtype)
    stock_blocks = []

    def forward(call_inputs=inputs, sink=None):
        with torch.no_grad(), block_outputs(model, sink) if sink else contextlib.nullcontext():
            return model(**call_inputs)[0].float().cpu()

    def log(message):
        print(f"agreement_parts: {message}", file=sys.stderr, flush=True)

    log("stock forward")
    stock = forward(sink=(lambda i, out: stock_blocks.append(out.clone())) if args.blocks else None)
    fp32 = fp32_reference(model, inputs, device) if dtype == torch.bfloat16 else None
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "frames": frames, "layers": config["num_layers"], "configs": {}}
    if fp32 is not None:
        result["stock_vs_fp32"] = {**agreement(stock, fp32), "spread": spread(stock, fp32)}
    # diffusers' rules: a distance from stock is a parity figure only there (`bidirectional` computes NVIDIA's model)
    patch_transformer(model, kernels="fused", recipe="bidirectional-diffusers")
    with switches(model) as select:
        for name in args.configs.split(","):
            parts = {"none": (), "nudged": (), "tf32": (), "all": PARTS}.get(name, tuple(name.split("+")))
            unknown = set(parts) - set(PARTS)
            if unknown:
                parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
            select(parts)
            blocks = []

            def compare(index, out):
                blocks.append(agreement(out.float(), stock_blocks[index].float()))

            tf32 = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32" or tf32
            try:
                out = forward(nudged(inputs) if name == "nudged" else inputs, compare if args.blocks else None)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = tf32
            entry = {"vs_stock": agreement(out, stock), "spread": spread(out, stock)}
            if fp32 is not None:
                entry["vs_fp32"] = agreement(out, fp32)
            log(f"{name}: {json.dumps(entry)}")
            if blocks:
                entry["blocks_vs_stock"] = blocks
            result["configs"][name] = entry
    emit(result, args.out, indent=2)
    return result


if __name__ == "__main__":
    main()
