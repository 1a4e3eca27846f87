"""The gates of a GDN block in three kernels (reference: `kernels.gdn_gates_reference`).

    gdn_gates(x, frames, beta_weight, beta_bias, gate_weight, gate_bias, negative_rate, dt_bias)
        x (B, N, C), N = T * S  ->  beta (B, H, T, S) in x's dtype, decay (B, H, T) float32

Stock computes them in seven launches: the per-token projection to H heads (a cuBLAS GEMM whose N = H = 20 leaves it
at a third of the memory's pace), its sigmoid, the frame means (a strided reduction), the projection of the means
and small element-wise ops. Here `_beta_kernel` reads x once for the projection, its sigmoid and the frame sums: each
program takes a tile of one frame's tokens, multiplies it into the heads, writes their sigmoid, and writes the
tile's column sums. Then `_gate_kernel` (a block of channels of a frame) adds the tiles' sums into the frame's mean
and multiplies it into the gate's heads, and `_decay_kernel` (a frame) adds the blocks' products and writes the
decay. Every sum runs in a fixed order, so the results do not depend on scheduling. The linears' outputs are rounded
to x's dtype where stock's are.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._rounding import cast_as, round_as
from ._validate import MATMUL_PRECISIONS, check_choice, check_tensor, triton_interpreted, use_triton
from .gdn_gates_reference import gdn_gates_ref

__all__ = ["gdn_gates"]


@triton.jit
def _beta_kernel(x_ptr, wb_ptr, bb_ptr, beta_ptr, sums_ptr, spatial, channels, heads, PREC: tl.constexpr,
                 NATIVE_DOT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, HP: tl.constexpr):
    DT: tl.constexpr = x_ptr.dtype.element_ty
    tile, frame, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    tiles, frames = tl.num_programs(0), tl.num_programs(1)
    s = tile * BLOCK_S + tl.arange(0, BLOCK_S)
    row = (b * frames + frame).to(tl.int64) * spatial + s  # token rows of x (B * N, C)
    h = tl.arange(0, HP)
    sums_row = ((b * frames + frame) * tiles + tile).to(tl.int64) * channels
    acc = tl.zeros((BLOCK_S, HP), tl.float32)
    for k0 in range(0, channels, BLOCK_K):
        c = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + row[:, None] * channels + c[None, :],
                     mask=(s[:, None] < spatial) & (c[None, :] < channels), other=0.0)
        w = tl.load(wb_ptr + h[None, :] * channels + c[:, None], mask=(h[None, :] < heads) & (c[:, None] < channels),
                    other=0.0)  # (BLOCK_K, HP): beta_weight^T
        if NATIVE_DOT:  # bf16 / fp16 operands on the tensor cores, summed in fp32
            acc = tl.dot(xt, w, acc)
        else:  # fp32 operands (bf16 and fp16 values are exact in tf32; the interpreter's dot takes neither)
            acc = tl.dot(xt.to(tl.float32), w.to(tl.float32), acc, input_precision=PREC)
        tl.store(sums_ptr + sums_row + c, tl.sum(xt.to(tl.float32), axis=0), mask=c < channels)
    logit = round_as(acc + tl.load(bb_ptr + h, mask=h < heads, other=0.0).to(tl.float32)[None, :], DT)
    beta = 1.0 / (1.0 + tl.exp(-logit))
    tl.store(beta_ptr + row[:, None] * heads + h[None, :], cast_as(beta, DT),
             mask=(s[:, None] < spatial) & (h[None, :] < heads))


@triton.jit
def _gate_kernel(sums_ptr, wg_ptr, partial_ptr, like_ptr, spatial, channels, heads, tiles, BLOCK_T: tl.constexpr,
                 BLOCK_K: tl.constexpr, HP: tl.constexpr):
    """One block of channels of one frame: the frame's mean over its tiles' sums, times gate_weight^T -> (HP,)."""
    DT: tl.constexpr = like_ptr.dtype.element_ty  # x's dtype (like_ptr is never read)
    block, frame, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    blocks, frames = tl.num_programs(0), tl.num_programs(1)
    c = block * BLOCK_K + tl.arange(0, BLOCK_K)
    h = tl.arange(0, HP)
    first = (b * frames + frame).to(tl.int64) * tiles * channels
    total = tl.zeros((BLOCK_K,), tl.float32)
    for t0 in range(0, tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        total += tl.sum(tl.load(sums_ptr + first + t[:, None] * channels + c[None, :],
                                mask=(t[:, None] < tiles) & (c[None, :] < channels), other=0.0), axis=0)
    mean = round_as(total / spatial, DT)  # stock's frame mean, a tensor in x's dtype
    w = tl.load(wg_ptr + h[None, :] * channels + c[:, None], mask=(h[None, :] < heads) & (c[:, None] < channels),
                other=0.0).to(tl.float32)  # (BLOCK_K, HP): gate_weight^T
    tl.store(partial_ptr + ((b * frames + frame) * blocks + block).to(tl.int64) * HP + h,
             tl.sum(mean[:, None] * w, axis=0))


@triton.jit
def _decay_kernel(partial_ptr, gb_ptr, rate_ptr, dt_bias_ptr, decay_ptr, like_ptr, heads, blocks,
                  BLOCK_B: tl.constexpr, HP: tl.constexpr):
    """One frame: the channel blocks' products summed in order, the gate's bias, softplus and exp -> decay."""
    DT: tl.constexpr = like_ptr.dtype.element_ty
    frame, b = tl.program_id(0), tl.program_id(1)
    frames = tl.num_programs(0)
    h = tl.arange(0, HP)
    k = tl.arange(0, BLOCK_B)
    parts = tl.load(partial_ptr + ((b * frames + frame) * blocks + k).to(tl.int64)[:, None] * HP + h[None, :],
                    mask=k[:, None] < blocks, other=0.0)
    head = h < heads
    gate = round_as(tl.sum(parts, axis=0) + tl.load(gb_ptr + h, mask=head, other=0.0).to(tl.float32), DT)
    z = gate + tl.load(dt_bias_ptr + h, mask=head, other=0.0)
    # torch's softplus: z above 20, else log1p(exp(z)) (log1p as log(w) u / (w - 1), w = 1 + u: exact for small u)
    u = tl.exp(z)
    w = 1.0 + u
    softplus = tl.where(z > 20.0, z, tl.where(w == 1.0, u, tl.log(w) * (u / (w - 1.0))))
    decay = tl.exp(tl.load(rate_ptr + h, mask=head, other=0.0) * softplus)
    tl.store(decay_ptr + (b * heads + h).to(tl.int64) * frames + frame, decay, mask=head)


# `_beta_kernel`'s launch: tokens and channels of a tile, warps, pipeline stages of its channel loop. The fastest of
# `bench/bench_glue.py`'s sweep on a segment (H100, bench/results/2026-12-05_block_glue_gdn_gates_sweep_h100.json:
# 18.6 µs for the three kernels against stock's 51.9; the first guess, 16 tokens and 256 channels a step, took
# 57.3): the sm_90 code of the bf16 loop does not prefetch, so wide steps keep more of the memory busy.
DEFAULT_TUNING = {"block_s": 32, "block_k": 512, "num_warps": 4, "num_stages": 1}


def gdn_gates(x, frames, beta_weight, beta_bias, gate_weight, gate_bias, negative_rate, dt_bias, *, backend="auto",
              matmul_precision="ieee", tuning=None):
    """Beta and decay of a GDN block (see `kernels.gdn_gates_reference.gdn_gates_ref` for the arguments; a bias
    may be None).

    backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `gdn_gates_ref`), "triton", "torch".
    matmul_precision: the tile products' precision for float32 x ("ieee" or "tf32"; bf16 and fp16 are exact either
    way).
    tuning: overrides of DEFAULT_TUNING (powers of two: block_s >= 16, block_k >= 16).
    Returns beta (B, H, T, S) (a view of a contiguous (B, T, S, H) tensor) and decay (B, H, T) float32, contiguous.
    """
    check_choice("matmul_precision", matmul_precision, MATMUL_PRECISIONS)
    check_tensor("x", x, (None, None, None), contiguous=False)
    batch, tokens, channels = x.shape
    heads = beta_weight.shape[0]
    if frames <= 0 or tokens % frames:
        raise ValueError(f"{tokens} tokens do not split into {frames} frames")
    for name, t, shape in (("beta_weight", beta_weight, (heads, channels)), ("beta_bias", beta_bias, (heads,)),
                           ("gate_weight", gate_weight, (heads, channels)), ("gate_bias", gate_bias, (heads,)),
                           ("negative_rate", negative_rate, (heads,)), ("dt_bias", dt_bias, (heads,))):
        if t is not None or name not in ("beta_bias", "gate_bias"):
            check_tensor(name, t, shape)
    if not use_triton(x, backend):
        return gdn_gates_ref(x, frames, beta_weight, beta_bias, gate_weight, gate_bias, negative_rate, dt_bias)
    zeros = None if beta_bias is not None and gate_bias is not None else x.new_zeros(heads)
    beta_bias, gate_bias = (zeros if bias is None else bias for bias in (beta_bias, gate_bias))
    x = x.contiguous()
    launch = {**DEFAULT_TUNING, **(tuning or {})}
    spatial = tokens // frames
    block_s, gate_block_k, hp = launch["block_s"], 64, max(16, next_power_of_2(heads))
    tiles, blocks = cdiv(spatial, block_s), cdiv(channels, gate_block_k)
    beta = torch.empty(batch, tokens, heads, device=x.device, dtype=x.dtype)
    sums = torch.empty(batch, frames, tiles, channels, device=x.device, dtype=torch.float32)
    partial = torch.empty(batch, frames, blocks, hp, device=x.device, dtype=torch.float32)
    decay = torch.empty(batch, heads, frames, device=x.device, dtype=torch.float32)
    prec = matmul_precision if x.dtype == torch.float32 else "tf32"
    native = x.dtype in (torch.bfloat16, torch.float16) and beta_weight.dtype == x.dtype and not triton_interpreted()
    _beta_kernel[(tiles, frames, batch)](x, beta_weight, beta_bias, beta, sums, spatial, channels, heads, PREC=prec,
                                         NATIVE_DOT=native, BLOCK_S=block_s, BLOCK_K=launch["block_k"], HP=hp,
                                         num_warps=launch["num_warps"], num_stages=launch["num_stages"])
    _gate_kernel[(blocks, frames, batch)](sums, gate_weight, partial, x, spatial, channels, heads, tiles,
                                          BLOCK_T=min(64, next_power_of_2(tiles)), BLOCK_K=gate_block_k, HP=hp,
                                          num_warps=4)
    _decay_kernel[(frames, batch)](partial, gate_bias, negative_rate.float(), dt_bias.float(), decay, x, heads, blocks,
                                   BLOCK_B=next_power_of_2(blocks), HP=hp, num_warps=4)
    return beta.view(batch, frames, spatial, heads).permute(0, 3, 1, 2), decay
