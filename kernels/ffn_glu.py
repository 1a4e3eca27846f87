"""GLU depthwise stage of SANA-WM's FFN (`GLUMBConvTemp`), channels-last, in one pass.

Input h (F, H*W, 2*Hd) is the inverted conv's GEMM output (bias included) of F images, token-major:
channel c of pixel p of image f at h[f, p, c]. The stage computes, in fp32,

    a = silu(h);  y = depthwise_conv3x3(a) + bias   (per channel, zero padding, per image)
    g = y[..., :Hd] * silu(y[..., Hd:])              -> (F, H*W, Hd) in h's dtype

which is diffusers' `inverted_conv.act -> depth_conv -> chunk -> value * glu_act(gate)` without the
permutes to channels-first (on CUDA the silu runs on the hardware's approximate tanh, see `_silu`).
`kernels.ffn_glu_reference.glu_depthwise_ref` is the plain PyTorch reference (same arguments).

Kernel layout. A program owns BLOCK_C value channels (and the matching gate channels) of a set of
"column tasks": a task is one image and a run of CHUNK_W columns (the whole width when it fits).
The tile's pixel axis holds LANES lanes, split into groups of CHUNK_W + 2 lanes (one halo column
each side), one task per group. The program walks down the rows: every input row is loaded once
(16-byte vectors along channels, next rows prefetched), activated once, shifted left/right
inside the tile with `tl.gather` (warp shuffles), and added into the running sums of the three
output rows it touches; the finished row above is stored. So each element of h is read once
from memory (halo columns twice, mostly from L2) and goes through one silu.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._validate import use_triton
from .ffn_glu_reference import glu_depthwise_ref

__all__ = ["glu_depthwise"]

# Launch defaults: the fastest of `bench/bench_ffn.py --sweep` on the H200 at the release shape
# (0.94 ms with the tanh silu, 1.11 ms with the exp one, bench/results/2026-11-29_ffn_glu_sweep_h200.json; the first
# default, picked from the offline sm_90 compile report of bench/compile_ffn_glu.py, block_c 8 /
# prefetch 2, took 1.58 ms). The kernel sits at the 255-register limit: the exp silu's second MUFU op
# costs more than the tanh one's few spilled registers.
DEFAULT_TUNING = {"lanes": 128, "block_c": 16, "num_warps": 4, "prefetch": 1, "silu": "tanh"}


@triton.jit
def _silu(x, FAST_EXP: tl.constexpr, TANH: tl.constexpr = False):
    """fp32 x * sigmoid(x), 1 / d written rsqrt(d)^2: two MUFU ops (ex2, rsq) and a few FMULs
    instead of a full-range division sequence (~10 instructions). d = inf (x < -88) gives 0.
    TANH (CUDA only): x * sigmoid(x) = h + h * tanh(h), h = x / 2, one MUFU op (tanh.approx,
    relative error ~2^-11, an eighth of a bf16 unit)."""
    if TANH:
        half = x * 0.5
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [half], dtype=tl.float32, is_pure=True,
                                      pack=1)
        return half + half * t
    if FAST_EXP:
        # ex2.approx.ftz: no denormal range fix-up around MUFU.EX2 (results below 2^-126 are 0).
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * -1.4426950408889634],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        e = tl.exp(-x)
    r = tl.math.rsqrt(1.0 + e)
    return x * (r * r)


@triton.jit
def _tap_weights(w_ptr, chans, chan_ok, row: tl.constexpr):
    """Weights of kernel row `row` (3 taps) of channels `chans`, fp32, shaped (1, BLOCK_C)."""
    base = w_ptr + chans * 9 + row * 3
    w0 = tl.load(base, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(base + 1, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(base + 2, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
    return w0, w1, w2


@triton.jit
def _glu_depthwise_kernel(
    h_ptr, w_ptr, b_ptr, out_ptr,
    HEIGHT, WIDTH, HIDDEN, N_TASKS, N_CHUNKS, CHUNK_W,
    stride_hf, stride_hp, stride_of, stride_op,
    HAS_BIAS: tl.constexpr, LANES: tl.constexpr, GROUP: tl.constexpr, BLOCK_C: tl.constexpr,
    PREFETCH: tl.constexpr, FAST_EXP: tl.constexpr, TANH: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    lane = tl.arange(0, LANES)
    group = lane // GROUP
    x = lane % GROUP  # 0 and CHUNK_W + 1 are the halo columns of the group
    task = pid_t * (LANES // GROUP) + group
    live = (group < LANES // GROUP) & (task < N_TASKS)
    image = task // N_CHUNKS
    cols = (task % N_CHUNKS) * CHUNK_W - 1 + x
    col_in = live & (cols >= 0) & (cols < WIDTH)
    col_out = live & (x >= 1) & (x <= CHUNK_W) & (cols < WIDTH)
    chans = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    chan_ok = chans < HIDDEN

    # 3x3 weights of the value channels (wv*) and gate channels (wg*): row-major taps.
    wv0, wv1, wv2 = _tap_weights(w_ptr, chans, chan_ok, 0)
    wv3, wv4, wv5 = _tap_weights(w_ptr, chans, chan_ok, 1)
    wv6, wv7, wv8 = _tap_weights(w_ptr, chans, chan_ok, 2)
    wg0, wg1, wg2 = _tap_weights(w_ptr, chans + HIDDEN, chan_ok, 0)
    wg3, wg4, wg5 = _tap_weights(w_ptr, chans + HIDDEN, chan_ok, 1)
    wg6, wg7, wg8 = _tap_weights(w_ptr, chans + HIDDEN, chan_ok, 2)
    if HAS_BIAS:
        bv = tl.load(b_ptr + chans, mask=chan_ok, other=0.0).to(tl.float32)[None, :]
        bg = tl.load(b_ptr + HIDDEN + chans, mask=chan_ok, other=0.0).to(tl.float32)[None, :]

    left = tl.broadcast_to(tl.maximum(lane - 1, 0)[:, None], (LANES, BLOCK_C))
    right = tl.broadcast_to(tl.minimum(lane + 1, LANES - 1)[:, None], (LANES, BLOCK_C))
    # int64 offsets: F * H*W * 2Hd may exceed 2^31 elements.
    in_ptr = h_ptr + (image.to(tl.int64) * stride_hf + cols.to(tl.int64) * stride_hp)[:, None] + chans[None, :]
    o_ptr = out_ptr + (image.to(tl.int64) * stride_of + cols.to(tl.int64) * stride_op)[:, None] + chans[None, :]
    in_mask = col_in[:, None] & chan_ok[None, :]
    out_mask = col_out[:, None] & chan_ok[None, :]
    row_step = tl.cast(WIDTH, tl.int64) * stride_hp  # tl.cast: WIDTH == 1 arrives as a constexpr
    out_row_step = tl.cast(WIDTH, tl.int64) * stride_op
    zero_rows = 0 * lane  # row tests are built on vectors (the interpreter mishandles scalar & tensor)

    # Running sums: *_mid for the output row of the current input row, *_next for the row below.
    # Row -1 is zero padding and contributes nothing, so both start at zero.
    v_mid = tl.zeros((LANES, BLOCK_C), tl.float32)
    v_next = tl.zeros((LANES, BLOCK_C), tl.float32)
    g_mid = tl.zeros((LANES, BLOCK_C), tl.float32)
    g_next = tl.zeros((LANES, BLOCK_C), tl.float32)

    raw_v = tl.load(in_ptr, mask=in_mask, other=0.0)
    raw_g = tl.load(in_ptr + HIDDEN, mask=in_mask, other=0.0)
    if PREFETCH == 2:
        ahead = in_mask & ((1 + zero_rows) < HEIGHT)[:, None]
        ahead_v = tl.load(in_ptr + row_step, mask=ahead, other=0.0)
        ahead_g = tl.load(in_ptr + row_step + HIDDEN, mask=ahead, other=0.0)
    # Iteration r reads input row r (row HEIGHT is zero padding) and completes output row r - 1.
    for r in range(0, HEIGHT + 1):
        cur_v = raw_v
        cur_g = raw_g
        if PREFETCH == 2:
            raw_v = ahead_v
            raw_g = ahead_g
            ahead = in_mask & ((r + 2 + zero_rows) < HEIGHT)[:, None]
            ahead_v = tl.load(in_ptr + (r + 2) * row_step, mask=ahead, other=0.0)
            ahead_g = tl.load(in_ptr + (r + 2) * row_step + HIDDEN, mask=ahead, other=0.0)
        else:
            ahead = in_mask & ((r + 1 + zero_rows) < HEIGHT)[:, None]
            raw_v = tl.load(in_ptr + (r + 1) * row_step, mask=ahead, other=0.0)
            raw_g = tl.load(in_ptr + (r + 1) * row_step + HIDDEN, mask=ahead, other=0.0)
        v = _silu(cur_v.to(tl.float32), FAST_EXP, TANH)
        g = _silu(cur_g.to(tl.float32), FAST_EXP, TANH)
        v_left = tl.gather(v, left, 0)  # column - 1 (garbage only in halo lanes)
        v_right = tl.gather(v, right, 0)  # column + 1
        g_left = tl.gather(g, left, 0)
        g_right = tl.gather(g, right, 0)
        # Input row r meets kernel row 2 for output row r - 1, row 1 for r, row 0 for r + 1.
        # (written as multiply-add chains so that each tap is one FFMA)
        v_done = v_mid + wv6 * v_left + wv7 * v + wv8 * v_right
        v_mid = v_next + wv3 * v_left + wv4 * v + wv5 * v_right
        v_next = wv0 * v_left + wv1 * v + wv2 * v_right
        g_done = g_mid + wg6 * g_left + wg7 * g + wg8 * g_right
        g_mid = g_next + wg3 * g_left + wg4 * g + wg5 * g_right
        g_next = wg0 * g_left + wg1 * g + wg2 * g_right
        if HAS_BIAS:
            v_done += bv
            g_done += bg
        result = v_done * _silu(g_done, FAST_EXP, TANH)
        store_mask = out_mask & ((r + zero_rows) >= 1)[:, None]
        tl.store(o_ptr + (r - 1) * out_row_step, result.to(out_ptr.dtype.element_ty), mask=store_mask)


def column_plan(width, lanes):
    """Split `width` columns into chunks that fit a lane group: (n_chunks, chunk_w, group = chunk_w + 2)."""
    n_chunks = cdiv(width, lanes - 2)
    chunk_w = cdiv(width, n_chunks)
    return n_chunks, chunk_w, chunk_w + 2


def _check(h, weight, bias, height, width):
    if h.dim() != 3 or h.shape[-1] % 2:
        raise ValueError(f"h must have shape (F, H*W, 2*Hd), got {tuple(h.shape)}")
    if h.shape[1] != height * width:
        raise ValueError(f"h holds {h.shape[1]} pixels per image, height * width = {height * width}")
    channels = h.shape[-1]
    if tuple(weight.shape) != (channels, 1, 3, 3):
        raise ValueError(f"weight must have shape ({channels}, 1, 3, 3), got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"bias must have shape ({channels},), got {tuple(bias.shape)}")


def glu_depthwise(h, weight, bias, height, width, *, out=None, backend="auto", tuning=None):
    """silu -> depthwise 3x3 conv (+ bias) -> value * silu(gate), channels-last, fp32 math.

    Args:
        h: (F, H*W, 2*Hd) pre-activation, any float dtype; the channel axis must be contiguous.
        weight: (2*Hd, 1, 3, 3) depthwise weight; bias: (2*Hd,) or None.
        height, width: H and W of each image.
        out: optional contiguous (F, H*W, Hd) buffer in h's dtype.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else PyTorch), "triton", "torch".
        tuning: optional launch overrides, keys of DEFAULT_TUNING (lanes, block_c: powers of two;
            num_warps; prefetch: rows loaded ahead, 1 or 2; silu: "exp" or "tanh", see `_silu`).

    Returns:
        (F, H*W, Hd) in h's dtype (`out` when given).
    """
    _check(h, weight, bias, height, width)
    if not use_triton(h, backend):
        result = glu_depthwise_ref(h, weight, bias, height, width)
        return result if out is None else out.copy_(result)
    frames, _, channels = h.shape
    hidden = channels // 2
    if h.stride(-1) != 1:
        h = h.contiguous()
    weight = weight.contiguous()
    if out is None:
        out = torch.empty(frames, height * width, hidden, device=h.device, dtype=h.dtype)
    elif tuple(out.shape) != (frames, height * width, hidden) or out.stride(-1) != 1:
        raise ValueError(f"out must have shape ({frames}, {height * width}, {hidden}) with a contiguous last axis")
    if frames == 0 or hidden == 0 or height * width == 0:
        return out
    settings = dict(DEFAULT_TUNING)
    if not h.is_cuda:
        # Triton interpreter: its cost is per program and op, not per element, so use few, wide programs.
        settings["block_c"] = min(64, max(8, next_power_of_2(hidden)))
    settings.update(tuning or {})
    lanes = settings["lanes"]
    fast = h.is_cuda and torch.version.hip is None  # PTX approximations
    n_chunks, chunk_w, group = column_plan(width, lanes)
    tasks = frames * n_chunks
    grid = (cdiv(hidden, settings["block_c"]), cdiv(tasks, lanes // group))
    _glu_depthwise_kernel[grid](
        h, weight, bias if bias is not None else weight, out,
        height, width, hidden, tasks, n_chunks, chunk_w,
        h.stride(0), h.stride(1), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, LANES=lanes, GROUP=group, BLOCK_C=settings["block_c"],
        PREFETCH=settings["prefetch"], FAST_EXP=fast, TANH=fast and settings["silu"] == "tanh",
        num_warps=settings["num_warps"],
    )
    return out
