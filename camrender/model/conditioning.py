"""Transformer inputs derived from the camera path that stay fixed over a render's denoising steps:
the UCPE ray transforms and the precomputed RoPE / camera tables (shapes in each docstring)."""
from __future__ import annotations

def ray_transforms(transformer, camera_conditions, grid, rope):
    """The transformer's UCPE ray transforms `(P, P_T, P_inv, rope_cam)` (P* (B, N, 4, 4)) and absolute
    ray map (B, T, h, w, 3) for camera_conditions (B, T, 20) on grid (T, h, w) after patching;
    rope: the complex RoPE table of those tokens, or None. Ray matrices are per frame, so a slice
    of a trajectory gives the rows of the whole trajectory's matrices."""
    from diffusers.models.transformers.transformer_sana_wm import (
        _prepare_ucpe_ray_transforms,
        _process_camera_conditions_ucpe,
    )

    raymats, absmap = _process_camera_conditions_ucpe(camera_conditions, camera_conditions.shape[0], grid,
                                                      transformer.patch_size)
    transforms = _prepare_ucpe_ray_transforms(
        head_dim=transformer.linear_head_dim, camera_conditions=camera_conditions, HW=grid,
        patch_size=transformer.patch_size, rotary_emb=rope, raymats=raymats)
    return transforms, absmap



def step_constants(transformer, camera_conditions, grid) -> dict:
    """Transformer inputs that stay fixed over a render's denoising steps, computed once.

    Without them the transformer rebuilds, every step, its RoPE table (copied from the CPU) and the
    camera's ray matrices (a few hundred small kernels, some fed from the CPU), which also keeps a
    step out of a CUDA graph. grid: (T, h, w) latent frames after patching; camera_conditions
    (B, T, 20) or None. Returns the `pos_embeds` and `cam_pos_embeds` keyword arguments (empty
    for layouts they do not cover: packed latents, no camera).
    """
    if camera_conditions is None or getattr(transformer, "pack_latents", False):
        return {}
    pos_embeds = transformer.rope(grid, device=camera_conditions.device) if transformer.use_pe else None
    (P, _, P_inv, rope_cam), absmap = ray_transforms(transformer, camera_conditions, grid, pos_embeds)
    absmap = absmap.permute(0, 4, 1, 2, 3).to(transformer.dtype)  # as the transformer lays it out itself
    return {"pos_embeds": pos_embeds,
            "cam_pos_embeds": {"absmap": absmap, "P": P, "P_inv": P_inv, "pos_embeds_cam": rope_cam}}

