"""Fused main-branch prep: full-C RMSNorm per token (across heads), ReLU, scale, optional RoPE.

One program handles BLOCK_N tokens: pass 1 sums squares over all C channels (no separate
PyTorch reduction), pass 2 normalises, applies the weight, ReLU, the scale and (optionally)
RoPE on interleaved pairs, and writes (B, N, C) contiguous in the input dtype. Values are rounded
where diffusers' code writes a tensor (RMSNorm's normalised input and its weighted output in the
weight's dtype, the scaled key, the rotated pair), so bf16 results match the stock model's bits
up to the fp32 sum of squares. Reference: `kernels.main_prep_reference.main_prep_ref` (same arguments).
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv
from ._rounding import cast_as, round_as
from ._reference_parts import rope_pairs
from ._validate import check_inv_rms, use_triton
from .main_prep_reference import main_prep_ref

__all__ = ["main_prep"]


@triton.jit
def _normed(x, w, rstd, scale, RELU: tl.constexpr, DT: tl.constexpr):
    """x * rstd * w (RMSNorm), ReLU if RELU, times scale, rounded to DT at diffusers' steps;
    fp32 (BLOCK_N, BLOCK_C)."""
    y = round_as(round_as(x * rstd[:, None], DT) * w[None, :], DT)
    if RELU:
        y = tl.maximum(y, 0.0)
    return round_as(y * scale, DT)  # exact for scale == 1


@triton.jit
def _main_prep_kernel(
    x_ptr, w_ptr, rope_ptr, out_ptr, rot_ptr, rstd_ptr,
    stride_xb, stride_xn, stride_ob, stride_on, stride_oh,
    N, C, norm_eps, scale, D: tl.constexpr,
    RELU: tl.constexpr, ROPE: tl.constexpr, WRITE_PLAIN: tl.constexpr, GIVEN_RSTD: tl.constexpr,
    HEAD_MAJOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    DT: tl.constexpr = w_ptr.dtype.element_ty  # diffusers' RMSNorm returns the weight's dtype
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    n_offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_offs < N
    row = x_ptr + b.to(tl.int64) * stride_xb + n_offs.to(tl.int64)[:, None] * stride_xn
    if GIVEN_RSTD:  # computed outside: the norm spans channels this call does not hold (head split)
        rstd = tl.load(rstd_ptr + b.to(tl.int64) * N + n_offs, mask=n_mask, other=0.0)
    else:
        sumsq = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            c_offs = c0 + tl.arange(0, BLOCK_C)
            m = n_mask[:, None] & (c_offs < C)[None, :]
            x = tl.load(row + c_offs[None, :], mask=m, other=0.0).to(tl.float32)
            sumsq += tl.sum(x * x, axis=1)
        rstd = 1.0 / tl.sqrt(sumsq / C + norm_eps)
    out_row = b.to(tl.int64) * stride_ob + n_offs.to(tl.int64)[:, None] * stride_on
    for c0 in range(0, C, BLOCK_C):
        c_offs = c0 + tl.arange(0, BLOCK_C)
        c_mask = c_offs < C
        if HEAD_MAJOR:  # heads apart in memory (a window's slot): head, then channel of the head
            out_col = (c_offs // D) * stride_oh + c_offs % D
        else:
            out_col = c_offs
        m = n_mask[:, None] & c_mask[None, :]
        x = tl.load(row + c_offs[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        y = _normed(x, w, rstd, scale, RELU, DT)
        if WRITE_PLAIN:
            tl.store(out_ptr + out_row + out_col[None, :], cast_as(y, out_ptr.dtype.element_ty), mask=m)
        if ROPE:
            # the pair partner of channel c is c ^ 1 (heads start at even channels)
            partner = c_offs ^ 1
            xp = tl.load(row + partner[None, :], mask=m, other=0.0).to(tl.float32)
            wp = tl.load(w_ptr + partner, mask=c_mask, other=0.0).to(tl.float32)
            yp = _normed(xp, wp, rstd, scale, RELU, DT)
            half = D // 2
            pair = (c_offs % D) // 2
            tab = (n_offs.to(tl.int64)[:, None] * half + pair[None, :]) * 2  # (cos, sin) of the pair
            cos = tl.load(rope_ptr + tab, mask=m, other=1.0)
            sin = tl.load(rope_ptr + tab + 1, mask=m, other=0.0)
            sign = tl.where((c_offs % 2) == 0, -1.0, 1.0)
            y = round_as(y * cos + yp * sin * sign[None, :], DT)
            tl.store(rot_ptr + out_row + out_col[None, :], cast_as(y, rot_ptr.dtype.element_ty), mask=m)


def _out_strides(out, batch, tokens, heads, head_dim) -> tuple:
    """(batch, token, head) element strides of main_prep's `out`; checks its shape and unit channel stride."""
    if out.dim() == 3 and tuple(out.shape) == (batch, tokens, heads * head_dim) and out.is_contiguous():
        return out.stride(0), out.stride(1), head_dim
    if out.dim() == 4 and tuple(out.shape) == (batch, tokens, heads, head_dim) and out.stride(-1) == 1:
        return out.stride(0), out.stride(1), out.stride(2)
    raise ValueError(f"out must be a contiguous ({batch}, {tokens}, {heads * head_dim}) tensor or a ({batch}, "
                     f"{tokens}, {heads}, {head_dim}) view with unit channel stride, got {tuple(out.shape)} strides "
                     f"{out.stride()}")


def main_prep(x, weight, heads, *, norm_eps=1e-5, scale=1.0, relu=True, rope=None, out=None,
              keep_unrotated=False, inv_rms=None, backend="auto"):
    """Full-C RMSNorm, ReLU, scale, RoPE; see `kernels.main_prep_reference.main_prep_ref`.

    Args:
        x: (B, N, C) raw projection; channel stride must be 1 (a slice of the qkv output is fine).
        weight: (C,) RMSNorm weight. heads: H.
        rope: None, diffusers' complex table (1, 1, N, D/2) (read in place when complex64, `rope_pairs`),
            (cos, sin) of (N, D/2), or `rope_pairs`' (N, D/2, 2) fp32 table.
        out: optional buffer for the result (the rotated one when rope is given): (B, N, C) contiguous, or a
            (B, N, H, D) view with unit stride along D (a softmax window's key slot, (B, H, n, D) transposed), which
            is written in place and returned as it is (without keep_unrotated).
        keep_unrotated: with rope, also write the un-rotated result (one pass over x for both).
        inv_rms: optional (B, N) fp32 1 / RMS per token, used instead of the one over x's C channels
            (the head split: x holds some heads of a norm over all of them; see
            `camrender.parallel.heads.SplitRMSNorm.inv_rms`).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `main_prep_ref`), "triton", "torch".

    Returns:
        (B, N, C) contiguous (or `out`), x.dtype; with rope and keep_unrotated, (unrotated, rotated).
    """
    batch, tokens, channels = x.shape
    head_dim = channels // heads
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype)
    out_strides = _out_strides(out, batch, tokens, heads, head_dim)
    write_plain = rope is None or keep_unrotated
    plain = rot = out
    if rope is not None and keep_unrotated:
        if out.dim() != 3 or not out.is_contiguous():
            raise ValueError("keep_unrotated writes into a contiguous (B, N, C) out only")
        plain = torch.empty_like(out)
    if inv_rms is not None:
        inv_rms = check_inv_rms("inv_rms", inv_rms, batch, tokens, x.device)
    if not use_triton(x, backend):  # the reference's results, written where the kernel writes them
        prep = dict(norm_eps=norm_eps, scale=scale, relu=relu, inv_rms=inv_rms)
        rot.copy_(main_prep_ref(x, weight, heads, rope=rope, **prep).view(rot.shape))
        if rope is not None and keep_unrotated:
            plain.copy_(main_prep_ref(x, weight, heads, **prep))
            return plain, rot
        return out
    table = weight if rope is None else rope_pairs(rope, x.device)
    block_n, block_c = 4, 256
    grid = (cdiv(tokens, block_n), batch)
    _main_prep_kernel[grid](
        x, weight, table, plain, rot, weight if inv_rms is None else inv_rms, x.stride(0), x.stride(1), *out_strides,
        tokens, channels, float(norm_eps), float(scale), D=head_dim,
        RELU=relu, ROPE=rope is not None, WRITE_PLAIN=write_plain, GIVEN_RSTD=inv_rms is not None,
        HEAD_MAJOR=out_strides[2] != head_dim,
        BLOCK_N=block_n, BLOCK_C=block_c, num_warps=4,
    )
    if rope is not None and keep_unrotated:
        return plain, rot
    return out
