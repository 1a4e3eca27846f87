"""Plain PyTorch (fp32) reference of `kernels.camera_branch.camera_branch`, the whole camera branch from raw
projections: prep, dynamic beta discount, bidirectional delta scan (initial state in, final state out), decode.
"""
from ._reference_parts import discount_beta_ref
from .cam_decode_reference import cam_decode_ref
from .cam_prep_reference import cam_prep_ref
from .delta_scan_reference import delta_scan_ref


def camera_branch_ref(q, k, v, beta, decay, ray_transforms, *, q_norm_weight=None, k_norm_weight=None,
                      norm_eps=1e-5, initial_state=None, segment_starts=None, downscale=True,
                      output_final_state=False, q_inv_rms=None, k_inv_rms=None):
    """The whole camera branch from raw projections, fp32 (see kernels.camera_branch).

    q, k, v (B, N, H, D); beta (B, H, T, S); decay (B, H, T); ray_transforms (P, P_T, P_inv,
    rope_cam); q_inv_rms, k_inv_rms as cam_prep_ref. Returns (out (B, N, H*D) in v's dtype, the forward
    state (B, H, D, D) fp32 after the last frame, or None unless output_final_state).
    """
    frames = decay.shape[-1]
    q_enc, k_enc, v_enc, inflation = cam_prep_ref(
        q, k, v, ray_transforms, num_frames=frames, q_norm_weight=q_norm_weight,
        k_norm_weight=k_norm_weight, norm_eps=norm_eps, downscale=downscale, q_inv_rms=q_inv_rms,
        k_inv_rms=k_inv_rms)
    beta_cam = discount_beta_ref(beta, inflation)
    out, state = delta_scan_ref(q_enc, k_enc, v_enc, beta_cam, decay, initial_state=initial_state,
                                segment_starts=segment_starts, reverse=True, output_final_state=output_final_state)
    return cam_decode_ref(out, ray_transforms[0], ray_transforms[3]).to(v.dtype), state
