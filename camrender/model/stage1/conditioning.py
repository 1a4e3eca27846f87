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
    of a trajectory gives the rows of the whole trajectory's matrices."""
    raymats, absmap = _process_camera_conditions_ucpe(camera_conditions, camera_conditions.shape[0], grid,
                                                      transformer.patch_size)
    transforms = _prepare_ucpe_ray_transforms(
        head_dim=transformer.linear_head_dim, camera_conditions=camera_conditions, HW=grid,
        patch_size=transformer.patch_size, rotary_emb=rope, raymats=raymats)
    return transforms, absmap
