"""The block's adaLN glue on one GPU: kernels.block_glue against the stock PyTorch ops, side by side.

Release shape (B=2, T=21 frames of 880 tokens, C=2240, bf16). For each step: the stock ops as
`SanaVideoMSCamCtrlBlock` runs them (on a contiguous residual stream and on the transposed one the
patch embedder hands the first block, which the stock model keeps through every block), the
fused kernel at several warp counts, and a device copy of the same bytes (the floor). Prints
JSON (also written to --out): medians of `triton.testing.do_bench` in ms, and the max |error| of
the kernel against its fp32 reference.

Also a GDN block's gates against kernels.gdn_gates, on a segment and on the full clip (`gdn_gates_*` rows), and
the refiner's (LTX-2) self-attention prep and adaLN at its release shape (`refiner_*` rows), and its FP8
activations' quantization, in its own pass against inside the kernel that writes them (`refiner_fp8_*`).

    python3 bench/bench_glue.py --out glue.json
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import triton
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_sana_wm_refiner import apply_interleaved_rotary_emb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from camrender.kernels import block_glue as glue  # noqa: E402
from camrender.kernels import fp8_quant  # noqa: E402
from camrender.kernels.fp8_quant import gelu_quantize_rows, merge_heads_quantize_rows, quantize_rows  # noqa: E402
from camrender.kernels.gdn_gates import gdn_gates  # noqa: E402
from camrender.kernels.gdn_gates_reference import gdn_gates_ref  # noqa: E402
from camrender.kernels.rms_rope import rms_rope_qk  # noqa: E402

from common import emit, kernel_ms  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    batch, frames, spatial, channels = 2, 21, 880, 2240
    tokens = frames * spatial
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)

    x, y, z = randn(batch, tokens, channels), randn(batch, tokens, channels), randn(batch, tokens, channels)
    x_transposed = x.transpose(1, 2).contiguous().transpose(1, 2)  # the stock model's residual layout
    shift, scale, gate = (randn(batch, frames, 1, channels) for _ in range(3))
    norm = torch.nn.LayerNorm(channels, elementwise_affine=False, eps=1e-6)

    def stock_modulate(h):
        return (norm(h).reshape(batch, frames, spatial, channels) * (1 + scale) + shift).reshape(h.shape)

    def stock_gated(h):
        return h + (gate * y.reshape(batch, frames, spatial, channels)).reshape(h.shape)

    bench = kernel_ms

    rows = {"shape": dict(batch=batch, frames=frames, spatial=spatial, channels=channels), "ms": {}, "max_error": {}}
    ms = rows["ms"]
    nbytes = x.numel() * x.element_size()
    copy_src = torch.empty(2 * nbytes, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    ms["copy_2_tensors"] = bench(lambda: copy_dst.copy_(copy_src))  # read 2 x (B, N, C), write 2
    ms["stock_modulate"] = bench(lambda: stock_modulate(x))
    ms["stock_modulate_transposed"] = bench(lambda: stock_modulate(x_transposed))
    ms["stock_gated_residual"] = bench(lambda: stock_gated(x))
    ms["stock_gated_residual_transposed"] = bench(lambda: stock_gated(x_transposed))
    rows_shift, rows_scale, rows_gate = shift[:, :, 0], scale[:, :, 0], gate[:, :, 0]
    for warps in (4, 8, 16):
        ms[f"ada_norm_w{warps}"] = bench(lambda: glue.ada_norm(x, rows_shift, rows_scale, num_warps=warps))
        ms[f"residual_ada_norm_w{warps}"] = bench(
            lambda: glue.ada_norm(x, rows_shift, rows_scale, residual=y, num_warps=warps))
        ms[f"gated_residual_w{warps}"] = bench(lambda: glue.gated_residual(x, y, rows_gate, num_warps=warps))
        ms[f"gated_residual_y2_w{warps}"] = bench(lambda: glue.gated_residual(x, y, rows_gate, y2=z, num_warps=warps))
    ms["silu_gate"] = bench(lambda: glue.silu_gate(x, y, b=z))
    refiner_rows(ms, rows, bench, randn)
    gate_rows(ms, rows, randn)
    errors = rows["max_error"]
    errors["ada_norm"] = float((glue.ada_norm(x, rows_shift, rows_scale).float()
                                - glue.ada_norm_ref(x, rows_shift, rows_scale).float()).abs().max())
    errors["gated_residual"] = float((glue.gated_residual(x, y, rows_gate, y2=z).float()
                                      - glue.gated_residual_ref(x, y, rows_gate, z).float()).abs().max())
    rows["ms"] = {k: round(v, 4) for k, v in ms.items()}
    emit(rows, args.out)
    return rows


@torch.no_grad()
def gate_rows(ms, rows, randn):
    """A GDN block's gates (beta and decay, 20 heads of 2240 channels) on a segment (3 frames) and on the full clip
    (B=2, 21 frames): diffusers' ops against kernels.gdn_gates, each replayed as a CUDA graph (as a render runs
    them: the stock path's seven small launches cost no host time there), the fused outputs' max |error|, and a sweep
    of the beta kernel's launch on the segment (`gdn_gates_sweep`)."""
    heads, channels = 20, 2240
    weights = [randn(heads, channels) * channels ** -0.5 for _ in range(2)]
    biases = [randn(heads) for _ in range(2)]
    rate = -torch.rand(heads, device="cuda") * 3
    dt_bias = torch.randn(heads, device="cuda")
    segment = None
    for name, batch, frames in (("segment", 1, 3), ("full", 2, 21)):
        x = randn(batch, frames * 880, channels)
        args = (x, frames, weights[0], biases[0], weights[1], biases[1], rate, dt_bias)
        segment = segment or args
        ms[f"gdn_gates_stock_{name}"] = triton.testing.do_bench_cudagraph(lambda: gdn_gates_ref(*args))
        ms[f"gdn_gates_{name}"] = triton.testing.do_bench_cudagraph(lambda: gdn_gates(*args))
        for part, got, want in zip(("beta", "decay"), gdn_gates(*args), gdn_gates_ref(*args)):
            rows["max_error"][f"gdn_gates_{name}_{part}"] = float((got.float() - want.float()).abs().max())
    # the beta kernel's launch on the segment (where `gdn_gates.DEFAULT_TUNING` came from: an H100 sweep)
    rows["gdn_gates_sweep"] = []
    for block_s, block_k, num_warps, num_stages in itertools.product((16, 32), (128, 256, 512), (4, 8), (1, 3)):
        tuning = dict(block_s=block_s, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
        took = triton.testing.do_bench_cudagraph(lambda: gdn_gates(*segment, tuning=tuning))
        rows["gdn_gates_sweep"].append({**tuning, "ms": round(took, 4)})


@torch.no_grad()
def refiner_rows(ms, rows, bench, randn):
    """The refiner's self-attention prep and adaLN (release: 3 frames x 880 tokens, C = 32 x 128 = 4096, bf16):
    diffusers' ops against kernels.rms_rope / block_glue(norm="rms"), and the per-pass window concatenation
    the fused path no longer does (sink 1 + history 10 + block 3 frames)."""

    tokens, channels, window = 3 * 880, 4096, 14 * 880
    q, k = randn(1, tokens, channels), randn(1, tokens, channels)
    angles = torch.rand(1, tokens, channels // 2, device="cuda") * 6
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    norm_q = torch.nn.RMSNorm(channels, eps=1e-6, device="cuda", dtype=torch.bfloat16)
    norm_k = torch.nn.RMSNorm(channels, eps=1e-6, device="cuda", dtype=torch.bfloat16)

    def stock_prep():
        return apply_interleaved_rotary_emb(norm_q(q), (cos, sin)), apply_interleaved_rotary_emb(norm_k(k), (cos, sin))

    def fused_prep():
        return rms_rope_qk(q, k, norm_q.weight, norm_k.weight, cos, sin, eps=1e-6, head_dim=128)

    ms["refiner_stock_qk_norm_rope"] = bench(stock_prep)
    ms["refiner_rms_rope_qk"] = bench(fused_prep)
    history = randn(1, window - tokens, channels)
    ms["refiner_stock_window_cat_k_and_v"] = bench(lambda: (torch.cat([history, k], 1), torch.cat([history, q], 1)))
    shift, scale = randn(1, 1, channels), randn(1, 1, channels)
    norm = RMSNorm(channels, eps=1e-6, elementwise_affine=False)
    ms["refiner_stock_modulate"] = bench(lambda: norm(q) * (1 + scale) + shift)
    ms["refiner_ada_norm_rms"] = bench(lambda: glue.ada_norm(q, shift, scale, norm="rms"))
    stock, fused = stock_prep(), fused_prep()
    rows["max_error"]["refiner_rms_rope_qk_vs_stock"] = max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(stock, fused))
    fp8_rows(ms, randn, q, shift, scale, tokens, channels)


def fp8_rows(ms, randn, x, shift, scale, tokens, channels):
    """The refiner's FP8 activations (`refiner_fp8_*`): each linear's input quantized by its own pass after the
    kernel that writes it (the tree before) against the quantization inside that kernel; the FFN's GELU-quantize
    (rows of 4 x 4096) read once against read twice (2048-wide chunks)."""
    ms["refiner_fp8_quantize_rows"] = kernel_ms(lambda: quantize_rows(x.reshape(-1, channels)))
    ms["refiner_fp8_ada_norm_then_quantize"] = kernel_ms(
        lambda: quantize_rows(glue.ada_norm(x, shift, scale, norm="rms").reshape(-1, channels)))
    for warps in (4, 8, 16):
        ms[f"refiner_fp8_ada_norm_quantized_w{warps}"] = kernel_ms(
            lambda: glue.ada_norm(x, shift, scale, norm="rms", num_warps=warps, quantize=True))
    heads = randn(1, 32, tokens, 128).transpose(1, 2)  # SDPA's (B, H, n, D) seen as (B, n, H, D)
    ms["refiner_fp8_merge_copy_then_quantize"] = kernel_ms(lambda: quantize_rows(heads.reshape(tokens, channels)))
    for warps in (4, 8, 16):
        ms[f"refiner_fp8_merge_heads_quantize_w{warps}"] = kernel_ms(
            lambda: merge_heads_quantize_rows(heads, num_warps=warps))
    packed = randn(1, tokens, 32, 128)  # cuDNN's output can come (B, n, H, D)-contiguous: the merge is a view
    ms["refiner_fp8_packed_quantize_rows"] = kernel_ms(lambda: quantize_rows(packed.reshape(tokens, channels)))
    ms["refiner_fp8_packed_merge_heads_quantize"] = kernel_ms(lambda: merge_heads_quantize_rows(packed))
    hidden = randn(tokens, 4 * channels)
    ms["refiner_fp8_gelu_quantize_default"] = kernel_ms(lambda: gelu_quantize_rows(hidden))
    q = torch.empty(hidden.shape, device="cuda", dtype=torch.float8_e4m3fn)
    q_scale = torch.empty(tokens, 1, device="cuda", dtype=torch.float32)

    def launch(block, warps):  # BLOCK 2048 on 16384-wide rows: two passes in chunks (the tree before: 4 warps)
        fp8_quant._quantize_rows_kernel[(tokens,)](hidden, q, q_scale, hidden.shape[1], hidden.stride(0),
                                                   q.stride(0), BLOCK=block, GELU=True, num_warps=warps)
    for block, warps in ((2048, 4), (16384, 8), (16384, 16), (16384, 32)):
        ms[f"refiner_fp8_gelu_quantize_block{block}_w{warps}"] = kernel_ms(lambda: launch(block, warps))


if __name__ == "__main__":
    main()
