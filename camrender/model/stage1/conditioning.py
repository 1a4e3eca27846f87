"""The UCPE ray transforms of a call's camera conditions (`ray_transforms`), built once per call by
`camrender.model.stage1.segments.prepare_conditioning` and reused over its denoising steps.

The ray matrices are diffusers' (`_process_camera_conditions_ucpe`), the same numbers, computed without a
host-device sync: diffusers resets the matrices of undefined rays by boolean indexing, which waits for the GPU, so
`ray_matrices` selects them with `torch.where` instead. The absolute ray map is only computed for models that
embed it (its diffusers code syncs too)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_sana_wm import (
    _prepare_ucpe_ray_transforms,
    _process_camera_conditions_ucpe,
    compute_fov_from_fx_xi,
    ucm_unproject_grid_fov,
)


def ray_transforms(transformer, camera_conditions, grid, rope, absmap: bool = True):
    """The transformer's UCPE ray transforms `(P, P_T, P_inv, rope_cam)` (P* (B, N, 4, 4)) and absolute
    ray map (B, T, h, w, 3) for camera_conditions (B, T, 20) on grid (T, h, w) after patching;
    rope: the complex RoPE table of those tokens, or None. Ray matrices are per frame, so a slice
    of a trajectory gives the rows of the whole trajectory's matrices. The matrices come as the kernels
    read them (`widened_rays`). absmap: False for a model that does not embed the map (it comes back None)."""
    if absmap:
        raymats, ray_map = _process_camera_conditions_ucpe(camera_conditions, camera_conditions.shape[0], grid,
                                                           transformer.patch_size)
    else:
        raymats, ray_map = camera_ray_matrices(camera_conditions, grid, transformer.patch_size), None
    transforms = _prepare_ucpe_ray_transforms(
        head_dim=transformer.linear_head_dim, camera_conditions=camera_conditions, HW=grid,
        patch_size=transformer.patch_size, rotary_emb=rope, raymats=raymats)
    return widened_rays(transforms), ray_map


def camera_ray_matrices(camera_conditions, grid, patch_size) -> torch.Tensor:
    """The `ray <- world` transforms (B, T, h, w, 4, 4) of camera_conditions (B, T, 20) (c2w flattened, then fx,
    fy, cx, cy in pixels of the patched grid's image) on grid (T, h, w): a pinhole (UCM xi = 0) ray through
    every token's pixel, as `_process_camera_conditions_ucpe` computes them, in the conditions' dtype."""
    batch, frames = camera_conditions.shape[:2]
    _, height, width = grid
    device, dtype = camera_conditions.device, camera_conditions.dtype
    with torch.autocast(device_type=device.type, enabled=False):  # as diffusers: camera geometry in the input dtype
        c2w = camera_conditions[..., :16].view(batch, frames, 4, 4)
        fx, fy, cx, cy = camera_conditions[..., 16:20].unbind(-1)
        xi = torch.zeros((batch, frames), device=device, dtype=dtype)
        fov_x = compute_fov_from_fx_xi(fx, xi, width * patch_size[2], device=device, dtype=dtype).view(batch, frames)
        fov_y = compute_fov_from_fx_xi(fy, xi, height * patch_size[1], device=device, dtype=dtype).view(batch, frames)
        rays = ucm_unproject_grid_fov(fov_x, fov_y, xi, height, width, cx / patch_size[2], cy / patch_size[1],
                                      device=device, dtype=dtype)
        # (B * T, h, w, 3), or (h, w, 3) for a single frame of a single row
        return ray_matrices(rays.reshape(batch, frames, height, width, 3), c2w)


def ray_matrices(rays: torch.Tensor, c2w: torch.Tensor) -> torch.Tensor:
    """Per-ray `ray <- world` transforms (B, T, h, w, 4, 4) for camera-frame rays (B, T, h, w, 3) and camera
    poses c2w (B, T, 4, 4): the ray's frame has z along the ray in world space, x orthogonal to it and the
    camera's y axis, y completing it, and its origin at the camera. A ray with a NaN component gets the identity.
    The same arithmetic as diffusers' `world_to_ray_mats`, with no host-device sync."""
    rotation, position = c2w[..., :3, :3], c2w[..., :3, 3]
    world = torch.einsum("btij,bthwj->bthwi", rotation, rays)
    up = rotation[..., :, 1][:, :, None, None, :].expand_as(world)
    z_axis = F.normalize(world, dim=-1, eps=1e-6)
    x_axis = F.normalize(torch.cross(up, z_axis, dim=-1), dim=-1, eps=1e-6)
    y_axis = F.normalize(torch.cross(z_axis, x_axis, dim=-1), dim=-1, eps=1e-6)
    to_ray = torch.stack([x_axis, y_axis, z_axis], dim=-1).transpose(-1, -2)  # rows: the ray frame's axes
    origin = -torch.einsum("bthwij,bthwj->bthwi", to_ray, position[:, :, None, None, :].expand_as(world))
    matrices = torch.zeros(*world.shape[:-1], 4, 4, device=world.device, dtype=world.dtype)
    matrices[..., :3, :3] = to_ray
    matrices[..., :3, 3] = origin
    matrices[..., 3, 3] = 1.0
    undefined = torch.isnan(world).any(-1)[..., None, None]
    return torch.where(undefined, torch.eye(4, device=world.device, dtype=world.dtype), matrices)


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
