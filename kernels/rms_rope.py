"""Query/key prep of an LTX-2 self-attention (the SANA-WM refiner's) as one pass (references:
`kernels.rms_rope_reference`).

Stock diffusers (`SanaWMLTX2RefinerAttnProcessor`) runs, on the q and k GEMM outputs (B, N, C):
RMSNorm over the full inner dim C with a weight (`torch.nn.RMSNorm`), then RoPE in fp32 (`x * cos +
rotate(x) * sin`, rounded back to the activation dtype), each step several elementwise kernels and
a full pass over memory. `rms_rope_qk` does both for q and k in one launch (one program per token
row and tensor, the row in registers), optionally

* writing k straight into a caller's buffer (a slice of an attention window [sink | history | current],
  so no concatenation follows),
* also writing k's pre-RoPE (normalised) values (what the refiner caches for its attention sink).

`rope_rows` is RoPE alone (the sink's cached pre-RoPE keys rotated to a new position), into a buffer.

Rounding follows the stock ops: the normalised row times the weight is rounded once to the activation
dtype (ATen's `rms_norm` on the CPU and its fused CUDA kernel), the rotation is fp32 and rounded once on
store.

RoPE layouts (diffusers' `rope_type`):
    "interleaved": cos, sin (B, N, C); channel pairs (2i, 2i+1) rotate together.
    "split":       cos, sin (B, H, N, D/2) (any strides, last dim contiguous); within each head of
                   size D, channel j < D/2 rotates with j + D/2.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._rounding import cast_as, round_as
from ._validate import check_choice, triton_interpreted, use_triton
from .rms_rope_reference import ROPE_TYPES, rms_rope_qk_ref, rope_rows_ref

__all__ = ["rms_rope_qk", "rope_rows"]


# --------------------------------------------------------------------------- kernel
@triton.jit
def _rows(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pre_ptr, first_row, n_rows, tokens, channels, eps,
          stride_xb, stride_xn, stride_ob, stride_on, stride_pb, stride_pn,
          stride_cb, stride_cn, stride_ch, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr,
          HAS_WEIGHT: tl.constexpr, HAS_PRE: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr):
    """ROWS token rows from `first_row`: [RMSNorm (x weight)] then RoPE; stores out (and the pre-RoPE rows)."""
    DT: tl.constexpr = out_ptr.dtype.element_ty
    row = first_row + tl.arange(0, ROWS)[:, None]  # (ROWS, 1)
    b = (row // tokens).to(tl.int64)
    n = (row % tokens).to(tl.int64)
    c = tl.arange(0, BLOCK_C)[None, :]  # (1, BLOCK_C)
    mask = (c < channels) & (row < n_rows)
    head = c // HEAD_DIM
    j = c % HEAD_DIM
    if SPLIT:
        HALF: tl.constexpr = HEAD_DIM // 2
        first = j < HALF
        partner = tl.where(first, c + HALF, c - HALF)
        table = head * stride_ch + j % HALF
    else:
        first = (c % 2) == 0
        partner = tl.where(first, c + 1, c - 1)
        table = head * stride_ch + j
    x_row = x_ptr + b * stride_xb + n * stride_xn
    x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(x_row + partner, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1)[:, None] / channels + eps)
        x = x * rstd
        xp = xp * rstd
        if HAS_WEIGHT:  # ATen's rms_norm (CPU, and CUDA's fused kernel): x * rstd * weight in fp32, rounded once
            x = x * tl.load(w_ptr + c, mask=c < channels, other=0.0).to(tl.float32)
            xp = xp * tl.load(w_ptr + partner, mask=c < channels, other=0.0).to(tl.float32)
        x = round_as(x, DT)
        xp = round_as(xp, DT)
        if HAS_PRE:
            tl.store(pre_ptr + b * stride_pb + n * stride_pn + c, x.to(DT), mask=mask)
    table = b * stride_cb + n * stride_cn + table
    cos = tl.load(cos_ptr + table, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
    out = x * cos + tl.where(first, -xp, xp) * sin
    tl.store(out_ptr + b * stride_ob + n * stride_on + c, cast_as(out, DT), mask=mask)


@triton.jit
def _rms_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, k_pre_ptr,
                     n_rows, tokens, channels, eps,
                     stride_qb, stride_qn, stride_kb, stride_kn, stride_qob, stride_qon, stride_kob, stride_kon,
                     stride_pb, stride_pn, stride_cb, stride_cn, stride_ch,
                     HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, NORM: tl.constexpr, HAS_Q: tl.constexpr,
                     HAS_WEIGHT: tl.constexpr, HAS_PRE: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr):
    # programs 2i and 2i + 1 take rows block i of q and of k: both read the same cos/sin rows (the second
    # time from L2)
    pid = tl.program_id(0)
    if HAS_Q:
        first_row = (pid // 2) * ROWS
        is_key = pid % 2 == 1
    else:
        first_row = pid * ROWS
        is_key = True
    if is_key:
        _rows(k_ptr, kw_ptr, cos_ptr, sin_ptr, k_out_ptr, k_pre_ptr, first_row, n_rows, tokens, channels, eps,
              stride_kb, stride_kn, stride_kob, stride_kon, stride_pb, stride_pn, stride_cb, stride_cn, stride_ch,
              HEAD_DIM, SPLIT, NORM, HAS_WEIGHT, HAS_PRE, BLOCK_C, ROWS)
    else:
        _rows(q_ptr, qw_ptr, cos_ptr, sin_ptr, q_out_ptr, q_out_ptr, first_row, n_rows, tokens, channels, eps,
              stride_qb, stride_qn, stride_qob, stride_qon, 0, 0, stride_cb, stride_cn, stride_ch,
              HEAD_DIM, SPLIT, NORM, HAS_WEIGHT, False, BLOCK_C, ROWS)


# --------------------------------------------------------------------------- entry points
def _table_strides(cos, sin, batch, tokens, channels, head_dim, rope_type):
    """(stride_b, stride_n, stride_head) of the cos/sin tables (a batch of 1 broadcasts)."""
    check_choice("rope_type", rope_type, ROPE_TYPES)
    if cos.shape != sin.shape or cos.stride() != sin.stride() or cos.stride(-1) != 1:
        raise ValueError(f"cos and sin must have the same shape and strides, last dim contiguous; got "
                         f"{tuple(cos.shape)} {tuple(cos.stride())} and {tuple(sin.shape)} {tuple(sin.stride())}")
    if rope_type == "interleaved":
        if cos.dim() != 3 or cos.shape[1:] != (tokens, channels) or cos.shape[0] not in (1, batch):
            raise ValueError(f"interleaved cos must have shape ({batch}, {tokens}, {channels}), got {tuple(cos.shape)}")
        return (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(1), head_dim
    heads = channels // head_dim
    if cos.dim() != 4 or cos.shape[1:] != (heads, tokens, head_dim // 2) or cos.shape[0] not in (1, batch):
        raise ValueError(f"split cos must have shape ({batch}, {heads}, {tokens}, {head_dim // 2}), "
                         f"got {tuple(cos.shape)}")
    return (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(2), cos.stride(1)


def _check_rows(name, t, batch, tokens, channels):
    if t.dim() != 3 or t.shape != (batch, tokens, channels) or t.stride(-1) != 1:
        raise ValueError(f"{name} must have shape ({batch}, {tokens}, {channels}) with a contiguous last dim, "
                         f"got {tuple(t.shape)} strides {tuple(t.stride())}")


def _launch(block_c, rows):
    """(rows per program, warps): one row per program on the GPU (the row in registers); 64 rows under the
    Triton interpreter, which runs programs one after another."""
    per_program = 64 if triton_interpreted() else 1
    return per_program, cdiv(rows, per_program), max(1, min(8, block_c // 512))


def rms_rope_qk(q, k, q_weight, k_weight, cos, sin, *, eps, head_dim, rope_type="interleaved", k_out=None,
                return_k_pre=False, backend="auto"):
    """RoPE(RMSNorm(q)) and RoPE(RMSNorm(k)) in one launch.

    Args:
        q, k: (B, N, C) GEMM outputs (last dim contiguous), C = heads * head_dim.
        q_weight, k_weight: (C,) RMSNorm weights, or None.
        cos, sin: fp32 RoPE tables for `rope_type` (module docstring).
        eps: RMSNorm epsilon.
        k_out: optional (B, N, C) tensor (last dim contiguous, e.g. a window slice) that receives
            the rotated k.
        return_k_pre: also return k after RMSNorm, before RoPE.
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1), "triton" or "torch".
    Returns:
        (q_rot, k_rot[, k_pre]): q_rot contiguous (B, N, C), k_rot is `k_out` when given.
    """
    batch, tokens, channels = q.shape
    if channels % head_dim:
        raise ValueError(f"channels {channels} are not a multiple of head_dim {head_dim}")
    for name, t in (("q", q), ("k", k)) + ((("k_out", k_out),) if k_out is not None else ()):
        _check_rows(name, t, batch, tokens, channels)
    stride_cb, stride_cn, stride_ch = _table_strides(cos, sin, batch, tokens, channels, head_dim, rope_type)
    if not use_triton(q, backend):
        q_rot, k_rot, k_pre = rms_rope_qk_ref(q, k, q_weight, k_weight, cos, sin, eps=eps, rope_type=rope_type)
        if k_out is not None:
            k_out.copy_(k_rot)
            k_rot = k_out
        return (q_rot, k_rot, k_pre) if return_k_pre else (q_rot, k_rot)
    q_rot = torch.empty(batch, tokens, channels, device=q.device, dtype=q.dtype)
    k_rot = k_out if k_out is not None else torch.empty_like(q_rot)
    k_pre = torch.empty_like(q_rot) if return_k_pre else q_rot
    has_weight = q_weight is not None
    if has_weight != (k_weight is not None):
        raise ValueError("q_weight and k_weight must both be given or both be None")
    block_c = next_power_of_2(channels)
    per_program, programs, warps = _launch(block_c, batch * tokens)
    _rms_rope_kernel[(2 * programs,)](
        q, k, q_weight if has_weight else q, k_weight if has_weight else k, cos, sin, q_rot, k_rot, k_pre,
        batch * tokens, tokens, channels, eps, q.stride(0), q.stride(1), k.stride(0), k.stride(1), q_rot.stride(0), q_rot.stride(1),
        k_rot.stride(0), k_rot.stride(1), k_pre.stride(0), k_pre.stride(1), stride_cb, stride_cn, stride_ch,
        HEAD_DIM=head_dim, SPLIT=rope_type == "split", NORM=True, HAS_Q=True, HAS_WEIGHT=has_weight,
        HAS_PRE=return_k_pre, BLOCK_C=block_c, ROWS=per_program, num_warps=warps)
    return (q_rot, k_rot, k_pre) if return_k_pre else (q_rot, k_rot)


def rope_rows(x, cos, sin, *, head_dim, rope_type="interleaved", out=None, backend="auto"):
    """RoPE of x (B, N, C) (e.g. the sink's cached pre-RoPE keys at this window's sink position).

    Writes `out` ((B, N, C), last dim contiguous; default a new tensor) in x.dtype and returns it.
    """
    batch, tokens, channels = x.shape
    _check_rows("x", x, batch, tokens, channels)
    if out is not None:
        _check_rows("out", out, batch, tokens, channels)
    stride_cb, stride_cn, stride_ch = _table_strides(cos, sin, batch, tokens, channels, head_dim, rope_type)
    if not use_triton(x, backend):
        rotated = rope_rows_ref(x, cos, sin, rope_type=rope_type)
        return rotated if out is None else out.copy_(rotated)
    out = out if out is not None else torch.empty(batch, tokens, channels, device=x.device, dtype=x.dtype)
    block_c = next_power_of_2(channels)
    per_program, programs, warps = _launch(block_c, batch * tokens)
    _rms_rope_kernel[(programs,)](
        x, x, x, x, cos, sin, out, out, out, batch * tokens, tokens, channels, 0.0, 0, 0, x.stride(0), x.stride(1), 0, 0,
        out.stride(0), out.stride(1), 0, 0, stride_cb, stride_cn, stride_ch,
        HEAD_DIM=head_dim, SPLIT=rope_type == "split", NORM=False, HAS_Q=False, HAS_WEIGHT=False,
        HAS_PRE=False, BLOCK_C=block_c, ROWS=per_program, num_warps=warps)
    return out
