"""The UCPE ray transforms of a call's camera conditions (`ray_transforms`), built once per call by
`camrender.model.stage1.segments.prepare_conditioning` and reused over its denoising steps."""
from __future__ import annotations

from diffusers.models.transformers.transformer_sana_wm import (
    _prepare_ucpe_ray_transforms,
    _process_camera_conditions_ucpe,
)


def ray_transforms(transformer, camera_conditions, grid, rope):
    """The transformer's UCPE ray transforms `(P, P_T, P_inv, rope_cam)` (P* (B, N, 4, 4)) and absolute
    ray map (B, T, h, w, 3) for camera_conditions (B, T, 20) on grid (T, h, w) after patching;
    rope: the complex RoPE table of those tokens, or None. Ray matrices are per frame, so a slice
    of a trajectory gives the rows of the whole trajectory's matrices. The matrices come as the kernels
    read them (`widened_rays`)."""
    raymats, absmap = _process_camera_conditions_ucpe(camera_conditions, camera_conditions.shape[0], grid,
                                                      transformer.patch_size)
    transforms = _prepare_ucpe_ray_transforms(
        head_dim=transformer.linear_head_dim, camera_conditions=camera_conditions, HW=grid,
        patch_size=transformer.patch_size, rotary_emb=rope, raymats=raymats)
    return widened_rays(transforms), absmap


def widened_rays(rays):
    """Diffusers' `(P, P_T, P_inv, rope_cam)` with bf16 / fp16 matrices held in float32, as the kernels read them:
    widened once per call here, not in every block and pass (P_T stays a transposed view of P). Diffusers' own
    attention code takes them back in its activations' dtype (`stock_rays`)."""
    p, _, p_inv, rope_cam = rays
    if p.element_size() < 4:
        p, p_inv = p.float(), p_inv.float()
    return p, p.transpose(-1, -2), p_inv, rope_cam


def stock_rays(rays, dtype):
    """Ray transforms `(P, P_T, P_inv, rope_cam)` with the matrices in `dtype`, as diffusers' attention code
    multiplies them with its activations (`widened_rays` widened narrower ones: narrowing them back is exact)."""
    if rays is None:
        return None
    p, p_t, p_inv, rope_cam = rays
    return p.to(dtype), p_t.to(dtype), p_inv.to(dtype), rope_cam
