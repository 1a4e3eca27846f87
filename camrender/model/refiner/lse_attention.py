"""Softmax attention over keys held in separate parts, merged by log-sum-exp (exact up to rounding).

The refiner's queries attend to [its KV window's prefix (sink + history) ; the current block]. Rather than
writing the block into the window first (a slot of 3 frames per layer: 2.1 GB at the release shape), each
part gets its own attention call, which also returns the log-sum-exp of its scores per query row:

    o_i = softmax(q k_i^T s) v_i,   l_i = log sum_j exp(q k_ij^T s)        (s = 1 / sqrt(D))
    o   = sum_i exp(l_i - l) o_i,    l   = log sum_i exp(l_i)

o is softmax(q [k_1; k_2]^T s) [v_1; v_2], the attention over the concatenated keys, exactly; only the
rounding differs (each o_i is rounded to the operands' dtype before the fp32 merge).

On CUDA each part runs one of PyTorch's fused attention kernels that return the log-sum-exp (`LSE_BACKENDS`,
in order; one that refuses the inputs is skipped from then on); elsewhere (CPU tests) plain PyTorch in fp32.
Shapes: q (B, H, n, D), each part's k and v (B, H, m_i, D); out (B, H, n, D) in q's dtype.
"""
from __future__ import annotations

import torch

# PyTorch's fused attention forwards that return the log-sum-exp (natural log, fp32), tried in this order on
# CUDA: cuDNN's (the faster one at head dim 128 on an H200 in stage 1's attention, `softmax_attention`), flash,
# memory-efficient. Each returns (out, logsumexp, ...) (schemas as in torch 2.13; the GPU suite's
# tests/model/test_lse_attention.py runs each on the GPU box's torch).
LSE_BACKENDS = ("cudnn", "flash", "efficient")
_refused: set = set()  # (backend, dtype, head dim) that raised in this process: not tried again


def _cudnn(q, k, v):
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)[:2]
    return out, lse


def _flash(q, k, v):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)[:2]
    return out, lse


def _efficient(q, k, v):
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False)[:2]
    return out, lse


_KERNELS = {"cudnn": _cudnn, "flash": _flash, "efficient": _efficient}


def attention_math(q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T / sqrt(D)) v in q's dtype, log-sum-exp (B, H, n) fp32), in fp32 PyTorch."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float())
    return out.to(q.dtype), lse


# cuDNN's kernel takes fp32 inputs without an error on an H200 (torch 2.11) but returns NaN: half types only.
_HALF_ONLY = {"cudnn", "flash"}


def attention_with_lse(q, k, v, backends=LSE_BACKENDS) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention output (B, H, n, D) in q's dtype, its log-sum-exp (B, H, n) fp32) of one key part."""
    if q.is_cuda:
        for name in backends:
            kind = (name, q.dtype, q.shape[-1])
            if kind in _refused or (name in _HALF_ONLY and q.dtype not in (torch.float16, torch.bfloat16)):
                continue
            try:
                out, lse = _KERNELS[name](q, k, v)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError:  # inputs this kernel does not take (dtype, head dim, GPU): the next one
                _refused.add(kind)
                continue
            # cuDNN's is (B, H, n, 1), the efficient kernel's padded to a multiple of 32 rows
            return out, lse.flatten(2)[..., :q.shape[2]]
    return attention_math(q, k, v)


def merge_parts(parts) -> torch.Tensor:
    """[(out_i (B, H, n, D), lse_i (B, H, n))] -> the attention over all the parts' keys, in out_0's dtype."""
    outs, lses = zip(*parts)
    total = torch.stack(lses).logsumexp(dim=0)
    merged = sum(out.float() * torch.exp(lse - total).unsqueeze(-1) for out, lse in zip(outs, lses))
    return merged.to(outs[0].dtype)


def attend_parts(q, parts, backends=LSE_BACKENDS) -> torch.Tensor:
    """softmax(q [k_1; k_2; ...]^T / sqrt(D)) [v_1; v_2; ...] from parts [(k_i, v_i)] (none empty), (B, H, n, D)."""
    if len(parts) == 1:
        return attention_with_lse(q, *parts[0], backends=backends)[0]
    return merge_parts([attention_with_lse(q, k, v, backends=backends) for k, v in parts])
