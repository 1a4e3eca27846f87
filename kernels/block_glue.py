"""The adaLN glue of a SANA-WM block as single-pass kernels (references: `kernels.block_glue_reference`).

A block (diffusers `SanaVideoMSCamCtrlBlock`) wraps attention, cross-attention and FFN in
per-frame adaLN modulation. Stock PyTorch runs each step as its own broadcast kernel over the
(B, N, C) activations (LayerNorm, `* (1 + scale)`, `+ shift`, `gate *`, `x +`, ...), several of
them through the slow non-vectorised broadcast path. Here each step is one pass over memory, fp32
math in registers, rounded to the activations' dtype exactly where the stock code writes an
intermediate tensor (`kernels._rounding`), so a bf16 result equals stock's bit for bit up to the
LayerNorm's fp32 sum order:

    ada_norm(x, shift, scale)           LayerNorm(x) * (1 + scale[t]) + shift[t]
                                        (norm="rms": diffusers' weightless RMSNorm, the LTX-2 refiner's;
                                        quantize=True: written as the next FP8 linear's e4m3 rows + scales)
    residual_ada_norm(x, r, shift, scale)   x' = x + r; returns (x', ada_norm(x', shift, scale))
    gated_residual(x, y, gate, y2=None, extra=None, extra_bias=None)
                                        x + gate[t] * (y + y2) + (extra + extra_bias)
    silu_gate(a, gate, b=None)          (a + b) * silu(gate), the attentions' output gate
    merge_heads(o)                      (B, N, H, D) attention output -> contiguous (B, N, H * D)

Where an FP8 linear reads the result, `quantize=True` writes its e4m3 rows and scales in the same pass (the bits
of `kernels.fp8_quant.quantize_rows` on the result): in place of the result (ada_norm, silu_gate), beside it
(gated_residual: the residual stream goes on), or both (ada_norm's `keep`: a block attention's input, which bf16
linears read too).

The references (`<op>_ref`) are the stock block's own op sequence. Shapes: x, r, y, y2, extra (B, N, C) with
N = T * S tokens frame-major (channel stride 1, any batch / token strides); shift, scale, gate
(B, T, C) per-frame rows (channel stride 1; e.g. views into the block's (B, T, 6, C) modulation
tensor). LayerNorm has no affine parameters (SANA-WM's).
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._rounding import cast_as, round_as
from ._validate import check_choice, triton_interpreted, use_triton
from .block_glue_reference import ada_norm_ref, gated_residual_ref, merge_heads_ref, silu_gate_ref
from .fp8_quant import row_scales, to_e4m3

__all__ = ["ada_norm", "residual_ada_norm", "gated_residual", "merge_heads", "silu_gate"]


# --------------------------------------------------------------------------- kernels
@triton.jit
def _token_offset(row, tokens, stride_b, stride_n):
    """Element offset of token row `row` (of B * N) in a (B, N, C) tensor."""
    return (row // tokens).to(tl.int64) * stride_b + (row % tokens).to(tl.int64) * stride_n


@triton.jit
def _frame_offset(row, tokens, spatial, stride_b, stride_t):
    """Element offset of the frame row of token row `row` in a (B, T, C) modulation tensor."""
    return (row // tokens).to(tl.int64) * stride_b + ((row % tokens) // spatial).to(tl.int64) * stride_t


@triton.jit
def _store_quantized(values, mask, row, n_rows, offsets, q_ptr, q_scale_ptr, DT: tl.constexpr):
    """Store fp32 rows (ROWS, BLOCK_C), rounded to DT as the stock op writes them, as the next FP8 linear's input:
    e4m3 at q_ptr + offsets, a scale per row at q_scale_ptr + row (`kernels.fp8_quant.quantize_rows`' bits).
    Returns the DT-rounded rows (padding lanes 0)."""
    values = tl.where(mask, round_as(values, DT), 0.0)
    q_scale, q_inverse = row_scales(values, 1)
    tl.store(q_scale_ptr + row, q_scale[:, None], mask=row < n_rows)
    tl.store(q_ptr + offsets, to_e4m3(values, q_inverse[:, None]), mask=mask)
    return values


@triton.jit
def _silu_gated(a_ptr, b_ptr, gate_ptr, offsets, mask, HAS_B: tl.constexpr, DT: tl.constexpr):
    """(a + b) * silu(gate) at `offsets`, fp32: the sum rounded to DT (stock writes it), the SiLU of the fp32 gate."""
    total = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:  # stock: main + camera -> tensor
        total = round_as(total + tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32), DT)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return total * (gate / (1.0 + tl.exp(-gate)))  # fp32, as F.silu on the fp32 gate


@triton.jit
def _ada_norm_kernel(x_ptr, r_ptr, x_out_ptr, out_ptr, shift_ptr, scale_ptr, q_scale_ptr, kept_ptr,
                     n_rows, tokens, spatial, channels, eps,
                     stride_xb, stride_xn, stride_rb, stride_rn, stride_sb, stride_st, stride_cb, stride_ct,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr, RMS: tl.constexpr = False,
                     MODULATE: tl.constexpr = True, ROWS: tl.constexpr = 1, QUANTIZE: tl.constexpr = False,
                     KEEP: tl.constexpr = False):
    # ROWS token rows per program (1 on the GPU; more under the interpreter, where programs run one by one)
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # (ROWS, 1)
    c = tl.arange(0, BLOCK_C)[None, :]
    mask = (c < channels) & (row < n_rows)
    DT: tl.constexpr = x_ptr.dtype.element_ty  # the outputs' (with QUANTIZE, out_ptr is the e4m3 rows)
    x = tl.load(x_ptr + _token_offset(row, tokens, stride_xb, stride_xn) + c, mask=mask, other=0.0).to(tl.float32)
    out_off = row.to(tl.int64) * channels + c  # outputs are contiguous (B, N, C)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + _token_offset(row, tokens, stride_rb, stride_rn) + c, mask=mask, other=0.0)
        x = round_as(x + r.to(tl.float32), DT)  # normalise what the next step reads, as the stock block does
        tl.store(x_out_ptr + out_off, x.to(DT), mask=mask)
    if RMS:  # diffusers RMSNorm without weight: x * rsqrt(mean(x^2) + eps), rounded
        centred = x
    else:
        mean = tl.sum(x, axis=1)[:, None] / channels
        centred = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1)[:, None] / channels + eps)
    normed = round_as(centred * rstd, DT)
    if MODULATE:
        shift = tl.load(shift_ptr + _frame_offset(row, tokens, spatial, stride_sb, stride_st) + c, mask=mask,
                        other=0.0)
        scale = tl.load(scale_ptr + _frame_offset(row, tokens, spatial, stride_cb, stride_ct) + c, mask=mask,
                        other=0.0)
        # stock: norm1(x) -> tensor; (1 + scale) -> tensor; product -> tensor; + shift
        out = round_as(normed * round_as(1.0 + scale.to(tl.float32), DT), DT) + shift.to(tl.float32)
    else:
        out = normed
    if QUANTIZE:  # the next linear's row-wise e4m3 input, from the DT values the stock block would write
        out = _store_quantized(out, mask, row, n_rows, out_off, out_ptr, q_scale_ptr, DT)
        if KEEP:  # the DT rows too, for readers that are not FP8 linears
            tl.store(kept_ptr + out_off, out.to(DT), mask=mask)
    else:
        tl.store(out_ptr + out_off, cast_as(out, DT), mask=mask)


@triton.jit
def _gated_residual_kernel(x_ptr, y_ptr, y2_ptr, e_ptr, eb_ptr, gate_ptr, out_ptr, q_ptr, q_scale_ptr, n_rows, tokens,
                           spatial, channels, stride_xb, stride_xn, stride_yb, stride_yn, stride_zb, stride_zn,
                           stride_eb, stride_en, stride_gb, stride_gt, HAS_Y2: tl.constexpr, HAS_EXTRA: tl.constexpr,
                           HAS_EXTRA_BIAS: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr = 1,
                           QUANTIZE: tl.constexpr = False):
    DT: tl.constexpr = out_ptr.dtype.element_ty
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # (ROWS, 1), as _ada_norm_kernel
    c = tl.arange(0, BLOCK_C)[None, :]
    mask = (c < channels) & (row < n_rows)
    update = tl.load(y_ptr + _token_offset(row, tokens, stride_yb, stride_yn) + c, mask=mask, other=0.0)
    update = update.to(tl.float32)
    if HAS_Y2:  # stock FFN: y + t_conv(y) -> tensor
        z = tl.load(y2_ptr + _token_offset(row, tokens, stride_zb, stride_zn) + c, mask=mask, other=0.0)
        update = round_as(update + z.to(tl.float32), DT)
    gate = tl.load(gate_ptr + _frame_offset(row, tokens, spatial, stride_gb, stride_gt) + c, mask=mask, other=0.0)
    x = tl.load(x_ptr + _token_offset(row, tokens, stride_xb, stride_xn) + c, mask=mask, other=0.0)
    out = x.to(tl.float32) + round_as(gate.to(tl.float32) * update, DT)
    if HAS_EXTRA:  # stock: x + gate * attn -> tensor, then + plucker_proj(...) (its bias added to the GEMM output)
        extra = tl.load(e_ptr + _token_offset(row, tokens, stride_eb, stride_en) + c, mask=mask, other=0.0)
        extra = extra.to(tl.float32)
        if HAS_EXTRA_BIAS:
            extra = round_as(extra + tl.load(eb_ptr + c, mask=c < channels, other=0.0).to(tl.float32), DT)
        out = round_as(out, DT) + extra
    out_off = row.to(tl.int64) * channels + c
    tl.store(out_ptr + out_off, cast_as(out, DT), mask=mask)
    if QUANTIZE:  # the next FP8 linear's rows, from the DT values written
        _store_quantized(out, mask, row, n_rows, out_off, q_ptr, q_scale_ptr, DT)


@triton.jit
def _merge_heads_kernel(o_ptr, out_ptr, tokens, stride_b, stride_h, stride_n, HEADS: tl.constexpr,
                        D: tl.constexpr, DP: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HEADS).to(tl.int64)
    h = bh % HEADS
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, DP)
    mask = (n < tokens)[:, None] & (d < D)[None, :]
    tile = tl.load(o_ptr + b * stride_b + h * stride_h + n.to(tl.int64)[:, None] * stride_n + d[None, :], mask=mask)
    dst = out_ptr + (b * tokens + n.to(tl.int64))[:, None] * (HEADS * D) + h * D + d[None, :]
    tl.store(dst, tile, mask=mask)


@triton.jit
def _silu_gate_kernel(a_ptr, b_ptr, gate_ptr, out_ptr, numel, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    DT: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + offs, cast_as(_silu_gated(a_ptr, b_ptr, gate_ptr, offs, mask, HAS_B, DT), DT), mask=mask)


@triton.jit
def _silu_gate_rows_kernel(a_ptr, b_ptr, gate_ptr, q_ptr, q_scale_ptr, n_rows, channels, HAS_B: tl.constexpr,
                           BLOCK_C: tl.constexpr, ROWS: tl.constexpr = 1):
    """`_silu_gate_kernel`'s values by rows of contiguous (M, C) operands, written as the next FP8 linear's rows."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, BLOCK_C)[None, :]
    mask = (c < channels) & (row < n_rows)
    offs = row.to(tl.int64) * channels + c
    DT: tl.constexpr = a_ptr.dtype.element_ty
    gated = _silu_gated(a_ptr, b_ptr, gate_ptr, offs, mask, HAS_B, DT)
    _store_quantized(gated, mask, row, n_rows, offs, q_ptr, q_scale_ptr, DT)


# --------------------------------------------------------------------------- entry points
def _check(x, modulations, others=()):
    batch, tokens, channels = x.shape
    for name, t in (("x", x),) + tuple(others):
        if t.shape != x.shape:
            raise ValueError(f"{name} must have shape {tuple(x.shape)}, got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous channel dimension")
    frames = modulations[0][1].shape[1]
    for name, m in modulations:
        if m.dim() != 3 or m.shape[0] != batch or m.shape[2] != channels or m.shape[1] != frames:
            raise ValueError(f"{name} must have shape ({batch}, T, {channels}), got {tuple(m.shape)}")
        if m.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous channel dimension")
    if frames <= 0 or tokens % frames:
        raise ValueError(f"{tokens} tokens do not split into {frames} frames")
    return batch, tokens, channels, tokens // frames


def _rows_per_program():
    """Token rows per program: 1 on the GPU (the tuned launch); 64 under the Triton interpreter, which runs
    programs one after another, so the CPU tests take a fraction of the time."""
    return 64 if triton_interpreted() else 1


def _launch_config(channels, num_warps=None):
    """(BLOCK_C, warps): one program per token row, the whole row in registers. 4 warps: fastest at
    C = 2240 on the H200 (bench/bench_glue.py: ada_norm 0.134 ms at 4 warps, 0.153 at 8, 0.213 at 16)."""
    block_c = next_power_of_2(channels)
    return block_c, num_warps or max(1, min(4, block_c // 256))


def ada_norm(x, shift, scale, *, eps=1e-6, residual=None, norm="layer", backend="auto", num_warps=None,
             quantize=False, keep=False):
    """norm(x [+ residual]) * (1 + scale) + shift, one pass.

    Args:
        x: (B, N, C) activations, N = T * S frame-major.
        shift, scale: (B, T, C) per-frame modulation rows, or both None (the norm alone).
        eps: the norm's epsilon (no affine parameters).
        residual: optional (B, N, C) added to x first (see `residual_ada_norm`).
        norm: "layer" (LayerNorm, SANA-WM) or "rms" (diffusers' RMSNorm, LTX-2 / the refiner).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1), "triton" or "torch".
        num_warps: launch override (default 4).
        quantize: return the normed rows as the next FP8 linear's input instead, quantized in the same pass:
            (q (B * N, C) float8_e4m3fn, scale (B * N, 1) fp32), the bits of `kernels.fp8_quant.quantize_rows`
            on the x.dtype result (no x.dtype tensor written).
        keep: with `quantize`, write the x.dtype rows too and return (normed, (q, scale)): the input of a block
            attention, which FP8 and bf16 linears both read.
    Returns:
        (B, N, C) contiguous in x.dtype (or what `quantize` and `keep` say); with `residual`, the pair
        (x + residual, normed).
    """
    check_choice("norm", norm, ("layer", "rms"))
    modulate = shift is not None
    if modulate != (scale is not None):
        raise ValueError("shift and scale must both be given or both be None")
    others = () if residual is None else (("residual", residual),)
    if modulate:
        batch, tokens, channels, spatial = _check(x, (("shift", shift), ("scale", scale)), others)
    else:
        batch, tokens, channels, spatial = _check(x, (("x", x[:, :1]),), others)  # one "frame": no rows to read
        shift = scale = x
    if not use_triton(x, backend):
        mods = (shift, scale) if modulate else (None, None)
        return ada_norm_ref(x, *mods, eps=eps, residual=residual, norm=norm, quantize=quantize, keep=keep)
    keep = keep and quantize
    kept = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype) if keep else x
    if quantize:
        out = torch.empty(batch * tokens, channels, device=x.device, dtype=torch.float8_e4m3fn)
        q_scale = torch.empty(batch * tokens, 1, device=x.device, dtype=torch.float32)
        updated = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype) if residual is not None else x
    else:
        out = q_scale = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype)
        updated = torch.empty_like(out) if residual is not None else out
    r = residual if residual is not None else x
    # quantizing, a second row reduction: 8 warps (25.4 us against 27.4 at 4 at the refiner's 2640 x 4096 on the
    # H200; a second, noisier call ranked them 70.9 against 66.1: bench/results/2026-12-03_block_glue_fp8_quantizing*)
    block_c, warps = _launch_config(channels, num_warps or (8 if quantize and channels >= 2048 else None))
    rows = _rows_per_program()
    _ada_norm_kernel[(cdiv(batch * tokens, rows),)](
        x, r, updated, out, shift, scale, q_scale, kept, batch * tokens, tokens, spatial, channels, eps,
        x.stride(0), x.stride(1), r.stride(0), r.stride(1), shift.stride(0), shift.stride(1),
        scale.stride(0), scale.stride(1), HAS_RESIDUAL=residual is not None, BLOCK_C=block_c,
        RMS=norm == "rms", MODULATE=modulate, ROWS=rows, QUANTIZE=quantize, KEEP=keep, num_warps=warps,
    )
    if quantize:
        out = (kept, (out, q_scale)) if keep else (out, q_scale)
    return out if residual is None else (updated, out)


def residual_ada_norm(x, residual, shift, scale, *, eps=1e-6, norm="layer", backend="auto", quantize=False,
                      keep=False):
    """x' = x + residual (rounded to x.dtype) and norm(x') * (1 + scale) + shift, one pass.
    Shapes as `ada_norm`; returns (x', normed), both (B, N, C) contiguous in x.dtype (normed as `ada_norm`'s
    `quantize` and `keep` say)."""
    return ada_norm(x, shift, scale, eps=eps, residual=residual, norm=norm, backend=backend, quantize=quantize,
                    keep=keep)


def gated_residual(x, y, gate, *, y2=None, extra=None, extra_bias=None, backend="auto", num_warps=None,
                   quantize=False):
    """x + gate * (y + y2) + (extra + extra_bias), one pass.

    Args:
        x, y, y2, extra: (B, N, C) (y2, extra optional), N = T * S frame-major; gate: (B, T, C)
            per-frame rows. `extra` is an ungated term added after the gated one (the
            post-attention Plucker projection, its GEMM output without bias); a (1, N, C) extra is
            broadcast over the batch. extra_bias: optional (C,) bias added to extra.
        num_warps: launch override.
        quantize: also write the result as the next FP8 linear's input, in the same pass (the bits of
            `kernels.fp8_quant.quantize_rows` on it), and return (out, (q (B * N, C) e4m3, scale (B * N, 1) fp32)).
    Returns:
        (B, N, C) contiguous in x.dtype (and its quantized rows with `quantize`).
    """
    if extra is not None and extra.shape[0] == 1:
        extra = extra.expand_as(x)
    if extra_bias is not None and (extra is None or extra_bias.shape != (x.shape[-1],)):
        raise ValueError(f"extra_bias must have shape ({x.shape[-1]},) and come with extra")
    others = (("y", y),) + (() if y2 is None else (("y2", y2),)) + (() if extra is None else (("extra", extra),))
    batch, tokens, channels, spatial = _check(x, (("gate", gate),), others)
    if not use_triton(x, backend):
        return gated_residual_ref(x, y, gate, y2, extra, extra_bias, quantize=quantize)
    out = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype)
    if quantize:
        q = torch.empty(batch * tokens, channels, device=x.device, dtype=torch.float8_e4m3fn)
        q_scale = torch.empty(batch * tokens, 1, device=x.device, dtype=torch.float32)
    else:
        q = q_scale = out
    z = y2 if y2 is not None else y
    e = extra if extra is not None else y
    eb = extra_bias.contiguous() if extra_bias is not None else gate
    block_c, warps = _launch_config(channels, num_warps)
    rows = _rows_per_program()
    _gated_residual_kernel[(cdiv(batch * tokens, rows),)](
        x, y, z, e, eb, gate, out, q, q_scale, batch * tokens, tokens, spatial, channels,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1), z.stride(0), z.stride(1), e.stride(0), e.stride(1),
        gate.stride(0), gate.stride(1), HAS_Y2=y2 is not None, HAS_EXTRA=extra is not None,
        HAS_EXTRA_BIAS=extra_bias is not None, BLOCK_C=block_c, ROWS=rows, QUANTIZE=quantize, num_warps=warps,
    )
    return (out, (q, q_scale)) if quantize else out


def merge_heads(o, *, backend="auto"):
    """Attention output (B, N, H, D) with any strides (e.g. the transposed view of an SDPA result laid
    out (B, H, N, D)) -> contiguous (B, N, H * D), one tiled pass (PyTorch's generic strided copy
    runs this transpose at a fraction of the bandwidth)."""
    batch, tokens, heads, dim = o.shape
    if not use_triton(o, backend) or o.is_contiguous() or o.stride(-1) != 1:
        return merge_heads_ref(o)
    out = torch.empty(batch, tokens, heads * dim, device=o.device, dtype=o.dtype)
    block_n = 64
    _merge_heads_kernel[(cdiv(tokens, block_n), batch * heads)](
        o, out, tokens, o.stride(0), o.stride(2), o.stride(1), HEADS=heads, D=dim, DP=next_power_of_2(dim),
        BLOCK_N=block_n, num_warps=4,
    )
    return out


def silu_gate(a, gate, *, b=None, backend="auto", quantize=False):
    """(a + b) * silu(gate) in one pass, in a.dtype; a, b, gate of one shape.

    The attentions' output gate: `(main + camera) * silu(output_gate(x))` with stock's rounding
    (the sum in a.dtype, gate and product in fp32), written straight in the activations' dtype
    instead of the stock fp32 intermediate. quantize: written instead as the output projection's FP8 input, the
    rows (M, C) of the result (C its last dimension) as (q e4m3, scale (M, 1) fp32), the bits of
    `kernels.fp8_quant.quantize_rows` on the a.dtype result.
    """
    for name, t in (("gate", gate),) + (() if b is None else (("b", b),)):
        if t.shape != a.shape:
            raise ValueError(f"{name} must have shape {tuple(a.shape)}, got {tuple(t.shape)}")
    if not use_triton(a, backend):
        return silu_gate_ref(a, gate, b, quantize=quantize)
    has_b = b is not None
    a, gate = a.contiguous(), gate.contiguous()
    b = b.contiguous() if has_b else a
    if quantize:
        channels = a.shape[-1]
        n_rows = a.numel() // channels
        q = torch.empty(n_rows, channels, device=a.device, dtype=torch.float8_e4m3fn)
        q_scale = torch.empty(n_rows, 1, device=a.device, dtype=torch.float32)
        block_c, warps = _launch_config(channels)
        rows = _rows_per_program()
        _silu_gate_rows_kernel[(cdiv(n_rows, rows),)](a, b, gate, q, q_scale, n_rows, channels, HAS_B=has_b,
                                                             BLOCK_C=block_c, ROWS=rows, num_warps=warps)
        return q, q_scale
    out = torch.empty_like(a)
    block = 2048
    _silu_gate_kernel[(cdiv(a.numel(), block),)](a, b, gate, out, a.numel(), HAS_B=has_b, BLOCK=block,
                                                          num_warps=8)
    return out
