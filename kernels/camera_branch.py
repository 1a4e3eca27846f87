"""The whole SANA-WM camera branch, raw projections -> (B, N, C), as one entry point.

Equals diffusers' block code `q_norm_cam` / `k_norm_cam` (RMSNorm over C) + ReLU followed by
`SanaWMBidirectionalGDNCamAttention.forward`: k-scale D^-0.5 S^-0.5, UCPE encode (P_T on q,
P_inv on k and v, RoPE on the second half), downscale to the pre-UCPE RMS, dynamic beta
discounting, forward (inclusive) + reverse (exclusive) numerator-only delta rule, decode.
"""
import torch

from . import camera_branch_reference
from ._grid import filling_tile
from ._validate import MATMUL_PRECISIONS, check_choice, check_tensor, multiprocessors, segment_starts_tensor, use_triton
from .cam_prep import cam_stage, check_norm_weight, check_projections, given_inv_rms, ray_views
from .delta_scan import run_scan

__all__ = ["camera_branch"]

# Launch defaults: the fastest measured on the H200 (bench/results/2026-11-29_camera_branch_tuning_h200.json):
# 4-warp output kernel, fp16 recurrence products. The stage's 16 tokens a program are halved on a segment's few
# tokens, as far as the GPU needs to be filled (`_grid.filling_tile`), unless `tuning` sets them: 2.7 ms a segment
# against 5.1 (H200, bench/results/2026-12-05_segment_targets_75df780_h200.json). The transitions stay whole
# (`delta_scan.run_scan` col_split).
SCAN_TUNING = {"rec_f16": True, "num_warps": (8, 4, 4)}
STAGE_TUNING = {"stage_block_s": 16, "stage_num_warps": 4, "stage_maxnreg": None}


def camera_branch(q, k, v, beta, decay, ray_transforms, *, q_norm_weight, k_norm_weight, norm_eps=1e-5,
                  initial_state=None, segment_starts=None, downscale=True, matmul_precision="tf32", backend="auto",
                  output_final_state=False, tuning=None, q_inv_rms=None, k_inv_rms=None):
    """Camera branch of a SANA-WM GDN block.

    Args:
        q, k, v: (B, N, H, D) raw camera projections (k already through conv_k_cam), before
            RMSNorm; contiguous, any float dtype; D/2 divisible by 4.
        beta: (B, H, T, S) sigmoid gate as diffusers computes it (N = T*S).
        decay: (B, H, T) per-frame decay.
        ray_transforms: (P, P_T, P_inv, rope_cam) as diffusers' _prepare_ucpe_ray_transforms
            returns them: P* (B, N, 4, 4), rope_cam complex (1, 1, N, D/4) or None.
        q_norm_weight, k_norm_weight: (C,) RMSNorm weights over C = H*D, or None (no norm).
        norm_eps: RMSNorm epsilon.
        initial_state: (B, H, D, D) forward state before frame 0 (rows = key dim), fp32.
        segment_starts: bool (T,) or (B, T): the reverse pass does not cross into a frame
            marked True from the frame after it.
        downscale: scale each encoded vector down to its pre-UCPE RMS (diffusers: True; NVlabs and the
            default bidirectional recipe: False).
        matmul_precision: "tf32" (matrix products on 10-bit-mantissa operands; the encoded q, k, v are
            kept in fp16, so |v| must stay below fp16's 6.5e4) or "ieee" (fp32 throughout).
        backend: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else `camera_branch_ref`), "triton", "torch".
        output_final_state: return the forward state after the last frame (else None in its place).
        tuning: optional dict of launch parameters overriding SCAN_TUNING / STAGE_TUNING
            (block_s, out_block_s, s_split, block_v, num_warps, num_stages, split, rec_f16, w_f16,
            maxnreg: see delta_scan.run_scan; stage_block_s, stage_num_warps, stage_maxnreg: see
            cam_prep.cam_stage), for benchmarks.
        q_inv_rms, k_inv_rms: optional (B, N) fp32 1 / RMS per token of q and k, used instead of the
            one over these H heads (head split: the norm spans heads this call does not hold).

    Returns:
        (out (B, N, H*D) in v's dtype, final_state (B, H, D, D) fp32, or None unless
        output_final_state), as flash-linear-attention's ops return them.
    """
    batch, tokens, heads, dim = check_projections(q, k, v)
    check_tensor("decay", decay, (batch, heads, None), contiguous=False)
    frames = decay.shape[-1]
    if frames <= 0 or tokens % frames:
        raise ValueError(f"decay must have shape (B, H, T) with T dividing N={tokens}, got {tuple(decay.shape)}")
    spatial = tokens // frames
    check_tensor("beta", beta, (batch, heads, frames, spatial), contiguous=False)
    channels = heads * dim
    check_norm_weight("q_norm_weight", q_norm_weight, channels)
    check_norm_weight("k_norm_weight", k_norm_weight, channels)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (batch, heads, dim, dim), contiguous=False)
    check_choice("matmul_precision", matmul_precision, MATMUL_PRECISIONS)
    views = ray_views(ray_transforms, batch, tokens, dim, q.device)  # validates; no copies
    starts = segment_starts_tensor(segment_starts, batch, frames, q.device)
    given_inv_rms(q_inv_rms, k_inv_rms, q_norm_weight, k_norm_weight, batch, tokens, q.device)  # validates

    if not use_triton(q, backend):
        return camera_branch_reference.camera_branch_ref(
            q, k, v, beta, decay, ray_transforms, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
            norm_eps=norm_eps, initial_state=initial_state, segment_starts=segment_starts, downscale=downscale,
            output_final_state=output_final_state, q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms)

    # Stage: encode q, k, v once (beta folded into k and v), fp16 for tf32 (same mantissa), fp32 for ieee.
    chosen = tuning or {}
    tuning = {**SCAN_TUNING, **STAGE_TUNING, **chosen}
    stage = {key: tuning.pop(key) for key in STAGE_TUNING}
    if "stage_block_s" not in chosen:
        stage["stage_block_s"] = filling_tile(tokens, batch, stage["stage_block_s"], multiprocessors(q.device))
    stage_dtype = torch.float16 if matmul_precision == "tf32" else torch.float32
    k_scale = dim ** -0.5 * spatial ** -0.5
    q_enc, k_enc, v_enc, infl = cam_stage(
        q, k, v, views, num_frames=frames, q_norm_weight=q_norm_weight,
        k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale, beta=beta, out_dtype=stage_dtype,
        block_s=stage["stage_block_s"], num_warps=stage["stage_num_warps"], maxnreg=stage["stage_maxnreg"],
        q_inv_rms=q_inv_rms, k_inv_rms=k_inv_rms)
    out = torch.empty(batch, tokens, channels, device=q.device, dtype=v.dtype)
    enc_strides = (heads * tokens * dim, tokens * dim, spatial * dim, dim)  # (B, H, N, D) as (B, H, T, S, D)
    out_strides = (tokens * channels, dim, spatial * channels, channels)    # (B, N, H*D) likewise
    final = run_scan(k=k_enc, v=v_enc, q=q_enc, beta=None, decay=decay, out=out, k_strides=enc_strides,
                     v_strides=enc_strides, q_strides=enc_strides, out_strides=out_strides,
                     batch=batch, heads=heads, frames=frames, spatial=spatial, dk=dim, dv=dim,
                     initial_state=initial_state.float().contiguous() if initial_state is not None else None,
                     starts=starts, reverse=True, matmul_precision=matmul_precision, infl=infl,
                     scale_a=k_scale * k_scale, scale_u=k_scale, decode=(views[0], views[3]),
                     f16_dot=matmul_precision == "tf32", **tuning)
    return out, (final if output_final_state else None)
