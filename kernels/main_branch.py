"""Fused main Gated DeltaNet branch: prep, KV + Z bidirectional scans, division.

Pipeline (release shape B=2, T=21, S=880, H=20, D=112):
1. `main_prep` on q and k, one pass each: full-C RMSNorm, ReLU, k-scale D^-0.5 S^-0.5, writing
   the un-rotated (Z stream) and the RoPE'd (KV stream) result, (B, N, C) in the input dtype.
2. `kernels.delta_scan` on the KV stream (q_rot, k_rot, v) and on the Z stream (q, k, ones),
   both reading the (B, N, C) tensors in place through permuted views (v straight from the qkv
   output).
3. `_divide_heads_kernel` writes out = num / (den + eps), (B, N, C) in v.dtype.
Initial states feed the forward scans; final states are the forward states after frame T-1;
segment_starts restarts the reverse scans. Reference: `kernels.main_branch_reference.main_branch_ref`.
"""
import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._reference_parts import rope_pairs
from ._validate import MATMUL_PRECISIONS, check_choice, use_triton
from .delta_scan import delta_scan
from .main_branch_reference import main_branch_ref
from .main_prep import main_prep

__all__ = ["main_branch"]


@triton.jit
def _divide_heads_kernel(num_ptr, den_ptr, out_ptr, sn_b, sn_h, sn_t, sn_s, sd_b, sd_h, sd_t, sd_s, T, S, H, D, eps,
                         BS: tl.constexpr, BD: tl.constexpr):
    """out[b, t*S + s, h*D + d] = num[b, h, t, s, d] / (den[b, h, t, s] + eps); one (b, h, t, s-block) per program."""
    n_sblocks = tl.cdiv(S, BS)
    t = tl.program_id(0) // n_sblocks
    s = (tl.program_id(0) % n_sblocks) * BS + tl.arange(0, BS)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    d = tl.arange(0, BD)
    m = (s < S)[:, None] & (d < D)[None, :]
    num = tl.load(num_ptr + b * sn_b + h * sn_h + t * sn_t + s[:, None] * sn_s + d[None, :], mask=m, other=0.0)
    den = tl.load(den_ptr + b * sd_b + h * sd_h + t * sd_t + s * sd_s, mask=s < S, other=1.0)
    rows = (b * T + t) * S + s
    tl.store(out_ptr + (rows[:, None] * H + h) * D + d[None, :], (num / (den[:, None] + eps)).to(
        out_ptr.dtype.element_ty), mask=m)


def _chunkwise(qn, kn, q_rot, k_rot, v, beta, decay, out, *, eps, initial_state, segment_starts, matmul_precision,
               output_final_state):
    """KV and Z streams through kernels.delta_scan on permuted (B, H, T, S, D) views; divide into `out`."""
    batch, tokens, channels = v.shape
    heads, frames, spatial = beta.shape[1], beta.shape[2], beta.shape[3]
    head_dim = channels // heads

    def heads_view(x):
        return x.reshape(batch, frames, spatial, heads, head_dim).permute(0, 3, 1, 2, 4)

    init_kv = init_z = None
    if initial_state is not None:
        init_kv, init_z = initial_state
    # tf32: fp16 operands (same mantissa, twice the rate; normalised q, scaled k and bf16 v fit its range).
    scan = dict(segment_starts=segment_starts, output_final_state=output_final_state,
                matmul_precision=matmul_precision, f16_operands=matmul_precision == "tf32", backend="triton")
    num, kv = delta_scan(heads_view(q_rot), heads_view(k_rot), heads_view(v), beta, decay, initial_state=init_kv,
                         **scan)
    ones = torch.ones((), device=v.device).expand(batch, heads, frames, spatial, 1)  # the Z stream's values
    den, z = delta_scan(heads_view(qn), heads_view(kn), ones, beta, decay, initial_state=init_z, **scan)
    bs = 32
    _divide_heads_kernel[(frames * cdiv(spatial, bs), batch * heads)](
        num, den, out, *num.stride()[:4], *den.stride()[:4], frames, spatial, heads, head_dim, float(eps),
        BS=bs, BD=max(16, next_power_of_2(head_dim)), num_warps=4)
    return (kv, z) if output_final_state else None


def main_branch(q, k, v, beta, decay, rope, *, q_norm_weight, k_norm_weight, norm_eps=1e-5, eps=1e-8,
                initial_state=None, segment_starts=None, matmul_precision="tf32", backend="auto",
                output_final_state=False, q_inv_rms=None, k_inv_rms=None):
    """Main GDN branch of one block, fused; same contract as `kernels.main_branch_reference.main_branch_ref`.

    Args:
        q: (B, N, C) raw query projection; k: (B, N, C) key after the short conv; v: (B, N, C) value.
            Channel stride 1; slices of the fused qkv output are read in place.
        beta: (B, H, T, S); decay: (B, H, T) (any strides).
        rope: diffusers' complex table (1, 1, N, D/2) or (cos, sin) of (N, D/2).
        q_norm_weight, k_norm_weight: (C,); norm_eps: RMSNorm epsilon; eps: denominator epsilon.
        initial_state: optional (kv (B, H, D, D), z (B, H, D, 1)) fp32 forward states.
        segment_starts: optional bool (T,) or (B, T); reverse scans restart at segment starts.
        matmul_precision: "tf32" (tensor cores on fp16 operands and fp16 transition matrices: q, k, v must
            stay within fp16 range, as normalised q, scaled k and bf16-range v do) or "ieee"
            (exact fp32 dots).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `main_branch_ref`), "triton", "torch".
        output_final_state: return the forward states (kv, z) after the last frame (else None).
        q_inv_rms, k_inv_rms: optional (B, N) fp32 1 / RMS per token of q and k, used instead of the
            one over these C channels (head split: the norm spans heads this call does not hold).

    Returns:
        (out (B, N, C) in v.dtype, (kv, z) or None).
    """
    check_choice("matmul_precision", matmul_precision, MATMUL_PRECISIONS)
    if not use_triton(v, backend):
        return main_branch_ref(q, k, v, beta, decay, rope, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                               norm_eps=norm_eps, eps=eps, initial_state=initial_state, segment_starts=segment_starts,
                               output_final_state=output_final_state, q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms)
    batch, tokens, channels = v.shape
    heads, spatial = beta.shape[1], beta.shape[3]
    head_dim = channels // heads
    q, k, v = (x.reshape(batch, tokens, channels) for x in (q, k, v))
    rope = rope_pairs(rope, v.device)  # one (N, D/2, 2) table for both preps (diffusers' read in place)
    k_scale = head_dim ** -0.5 * spatial ** -0.5
    qn, q_rot = main_prep(q, q_norm_weight, heads, norm_eps=norm_eps, rope=rope, keep_unrotated=True,
                          inv_rms=q_inv_rms, backend="triton")
    kn, k_rot = main_prep(k, k_norm_weight, heads, norm_eps=norm_eps, scale=k_scale, rope=rope, keep_unrotated=True,
                          inv_rms=k_inv_rms, backend="triton")
    out = torch.empty(batch, tokens, channels, device=v.device, dtype=v.dtype)
    final = _chunkwise(qn, kn, q_rot, k_rot, v, beta, decay, out, eps=eps, initial_state=initial_state,
                       segment_starts=segment_starts, matmul_precision=matmul_precision,
                       output_final_state=output_final_state)
    return out, final
