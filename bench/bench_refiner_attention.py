"""The refiner's self-attention at the release shape, bf16 against FP8, on one GPU. Prints one JSON document.

One steady pass of the refiner attends 2640 queries (a block of 3 latent frames of 22x40 tokens) over its whole
window (`--keys`, default 12320: the 1-frame sink, 10 history frames and the block itself), 32 heads of 128, in the
(B, S, H, D) layout the refiner holds; a block runs it 192 times (48 layers, 3 denoising passes and the history
pass). Side by side, each on the same random bf16 inputs:

- cudnn_bf16: cuDNN's flash kernel through PyTorch, what the refiner runs today; flash_bf16: PyTorch's flash kernel;
- cudnn_fp8_*: cuDNN's FP8 SDPA through `nvidia-cudnn-frontend` (its `sdpa_fp8` graph; per-tensor e4m3 scales
  of q, k, v and the probabilities; the output in e4m3 or bf16, the (B, S, H, D) layout or (B, H, S, D)), when that
  package is installed; a variant cuDNN refuses reports its error;
- triton_fp8: a Triton FP8 flash attention written here (per-row e4m3 scales of q and k, per-token scales of v
  folded into the probabilities before they are rounded to e4m3, V transposed to (B, H, D, S) so both dots take
  K-major operands), autotuned over its block shapes.

For each: the median ms of a call (`triton.testing.do_bench`), TFLOP/s (4 n m D per head), the ratio to cudnn_bf16,
and the output's relative L2 error against a float32 attention of the same bf16 inputs (quantizing the inputs is
part of each FP8 path's error). `attention_s_per_block`: the ms times 192.

    python3 bench/bench_refiner_attention.py --out bench/results/DATE_refiner_attention_CARD.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import emit, kernel_ms  # noqa: E402

E4M3_MAX = 448.0
CALLS_PER_BLOCK = 192  # 48 layers x (3 denoising passes + the history pass)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2640, help="query tokens (a block of 3 latent frames)")
    parser.add_argument("--keys", type=int, nargs="+", default=[12320, 5280], help="window tokens, one row each")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--out", default=None, help="also write the JSON document here")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------- Triton FP8 kernel
def _configs():
    return [triton.Config({"BLOCK_M": 128, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)
            for block_n in (64, 128) for warps in (4, 8) for stages in (2, 3, 4)]


@triton.autotune(configs=_configs(), key=["n", "m"])
@triton.jit
def _attention_fp8(Q, K, KS, VT, VS, VMAX, O, n, m, sm_scale, sqb, sqn, sqh, skb, skm, skh, sksb, sksm,
                   svb, svh, svd, svsb, svsm, sob, son, soh, H: tl.constexpr, D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (BLOCK_M queries, head) tile: q (B, n, H, D) bf16 quantized per row here; K (B, m, H, D) e4m3 with KS
    (B, m, H) fp32; VT (B, H, D, m) e4m3 with VS (B, m, H) fp32 and VMAX (B, H) its largest; O (B, n, H, D)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    dims = tl.arange(0, D)
    q = tl.load(Q + b * sqb + rows[:, None] * sqn + h * sqh + dims[None, :], mask=rows[:, None] < n,
                other=0.0).to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(q), 1), 1e-12) / 448.0
    q8 = (q / q_scale[:, None]).to(tl.float8e4nv)
    score_scale = q_scale * (sm_scale * 1.4426950408889634)  # exp2 below
    p_gain = 448.0 / tl.load(VMAX + bh)  # the largest probability x v-scale lands on e4m3's largest value
    row_max = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, m, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < m
        k = tl.load(K + b * skb + cols[:, None] * skm + h * skh + dims[None, :], mask=inside[:, None], other=0.0)
        k_scale = tl.load(KS + b * sksb + cols * sksm + h, mask=inside, other=0.0)
        s = tl.dot(q8, tl.trans(k)) * score_scale[:, None] * k_scale[None, :]
        s = tl.where(inside[None, :], s, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(s, 1))
        alpha = tl.math.exp2(row_max - new_max)
        p = tl.math.exp2(s - new_max[:, None])
        row_sum = row_sum * alpha + tl.sum(p, 1)
        v_scale = tl.load(VS + b * svsb + cols * svsm + h, mask=inside, other=0.0)
        p8 = (p * (v_scale * p_gain)[None, :]).to(tl.float8e4nv)
        vt = tl.load(VT + b * svb + h * svh + dims[:, None] * svd + cols[None, :], mask=inside[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p8, tl.trans(vt))
        row_max = new_max
    out = acc / (row_sum * p_gain)[:, None]
    tl.store(O + b * sob + rows[:, None] * son + h * soh + dims[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] < n)


def quantize_rows(x):
    """x (..., D) -> (e4m3 values, fp32 scales (...)) with each row's largest magnitude at e4m3's largest."""
    scale = x.float().abs().amax(-1).clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def triton_fp8(q, k, v):
    """The Triton kernel's call on (B, S, H, D) bf16 inputs; k and v quantized once, outside the timed call (as a
    window kept in e4m3 would hold them)."""
    batch, n, heads, dim = q.shape
    m = k.shape[1]
    k8, k_scale = quantize_rows(k)
    v8, v_scale = quantize_rows(v)
    vt = v8.permute(0, 2, 3, 1).contiguous()
    v_max = v_scale.amax(1).contiguous()
    out = torch.empty_like(q)

    def call():
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), batch * heads)  # noqa: E731
        _attention_fp8[grid](q, k8, k_scale, vt, v_scale, v_max, out, n, m, dim ** -0.5, *q.stride()[:3],
                             *k8.stride()[:3], *k_scale.stride()[:2], *vt.stride()[:3], *v_scale.stride()[:2],
                             *out.stride()[:3], H=heads, D=dim)
        return out
    return call


# ------------------------------------------------------------------------------------------- library calls
def torch_sdpa(op):
    def make(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if op == "cudnn":
            return lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, False,
                                                                              False)[0].transpose(1, 2)
        return lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)[0].transpose(1, 2)
    return make


def cudnn_fp8(layout: str, out_type: str):
    """cuDNN's FP8 SDPA (cudnn-frontend's `sdpa_fp8`), per-tensor scales; `layout` "bshd" or "bhsd" of q, k, v
    and o; `out_type` "fp8" or "bf16"."""
    def make(q, k, v):
        import cudnn

        device = q.device
        f8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        scales = [t.float().abs().amax() / E4M3_MAX for t in (q, k, v)]
        inputs = [(t.float() / s).to(torch.float8_e4m3fn) for t, s in zip((q, k, v), scales)]
        if layout == "bhsd":
            inputs = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in inputs]
        batch, n, heads, dim = q.shape
        out_scale = 1.0 / 0.05 if out_type == "fp8" else 1.0
        out = torch.empty(inputs[0].shape, device=device,
                          dtype=torch.float8_e4m3fn if out_type == "fp8" else torch.bfloat16)
        if layout == "bhsd":
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        scalar = lambda value: torch.full((1, 1, 1, 1), float(value), device=device)  # noqa: E731
        handle = cudnn.create_handle()
        graph = cudnn.pygraph(io_data_type=f8, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

        def bhsd_view(name, tensor):  # cuDNN's dims are (B, H, S, D); the strides say where each lives
            dims = [tensor.shape[0], tensor.shape[2], tensor.shape[1], tensor.shape[3]]
            strides = [tensor.stride(0), tensor.stride(2), tensor.stride(1), tensor.stride(3)]
            return graph.tensor(name=name, dim=dims, stride=strides, data_type=f8), dims, strides

        (tq, dims, strides), (tk, *_), (tv, *_) = (bhsd_view(name, t) for name, t in zip("qkv", inputs))
        scalars = {name: graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
                   for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        o, _, amax_s, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, **scalars, generate_stats=False,
                                              attn_scale=dim ** -0.5, use_causal_mask=False)
        o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(
            f8 if out_type == "fp8" else cudnn.data_type.BFLOAT16)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
        values = dict(zip(scalars.values(), (scalar(scales[0]), scalar(scales[1]), scalar(scales[2]),
                                            scalar(1.0 / E4M3_MAX), scalar(E4M3_MAX), scalar(out_scale))))
        pack = {tq: inputs[0], tk: inputs[1], tv: inputs[2], o: out, amax_s: scalar(0), amax_o: scalar(0), **values}

        def call():
            graph.execute(pack, workspace, handle=handle)
            return out.float() / out_scale
        return call
    return make


CANDIDATES = {"cudnn_bf16": torch_sdpa("cudnn"), "flash_bf16": torch_sdpa("flash"),
              "cudnn_fp8_bshd_fp8_out": cudnn_fp8("bshd", "fp8"), "cudnn_fp8_bhsd_fp8_out": cudnn_fp8("bhsd", "fp8"),
              "cudnn_fp8_bshd_bf16_out": cudnn_fp8("bshd", "bf16"), "triton_fp8": triton_fp8}


def compare(args, keys: int) -> dict:
    torch.manual_seed(0)
    shape = (1, args.queries, args.heads, args.head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, keys, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    exact = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v))).transpose(1, 2)
    flop = 4 * args.heads * args.queries * keys * args.head_dim
    row = {"queries": args.queries, "keys": keys, "heads": args.heads, "head_dim": args.head_dim}
    for name, make in CANDIDATES.items():
        try:
            call = make(q, k, v)
            error = ((call().float() - exact).norm() / exact.norm()).item()
            ms = kernel_ms(call)
        except Exception as failure:  # noqa: BLE001 - a library refusing a variant is a result here
            row[name] = {"error": f"{type(failure).__name__}: {str(failure).splitlines()[0][:300]}"}
            continue
        row[name] = {"ms": round(ms, 3), "tflop_s": round(flop / ms / 1e9, 1), "rel_error": float(f"{error:.3g}"),
                     "attention_s_per_block": round(ms * CALLS_PER_BLOCK / 1e3, 3)}
        if name == "triton_fp8":
            row[name]["config"] = str(_attention_fp8.best_config)
    base = row["cudnn_bf16"]["ms"]
    for value in row.values():
        if isinstance(value, dict) and "ms" in value:
            value["speedup_over_cudnn_bf16"] = round(base / value["ms"], 2)
    return row


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = {"command": "python3 bench/bench_refiner_attention.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "cudnn": torch.backends.cudnn.version()}
    try:
        import cudnn
        result["cudnn_frontend"] = cudnn.__version__
    except ImportError:
        result["cudnn_frontend"] = None
    result["rows"] = [compare(args, keys) for keys in args.keys]
    return result


if __name__ == "__main__":
    emit(main(), parse_args().out)
