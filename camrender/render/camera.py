"""Camera conditioning for SANA-WM: trajectory -> the tensors the transformer consumes.

Implements SPEC.md section 1 without importing the model (the parity tests compare
against diffusers' ``prepare_camera``, ``_process_camera_conditions_ucpe`` and
``_prepare_ucpe_ray_transforms``). Geometry is computed in float64 and returned in
``dtype`` (float32 by default, like diffusers).

Shapes (release: F = 161 video frames, T = 21, h = 22, w = 40):
    camera_conditions (T, 20)        [c2w relative to frame 0, row-major (16) | fx fy cx cy on the latent grid]
    chunk_plucker     (48, T, h, w)  8 video frames x 6 Plucker channels (d, o x d), frame-major
    ray_mats          (T, h', w', 4, 4)  per-token ray<-world transforms (h' = h / patch, w' = w / patch)
    P, P_T, P_inv     (N, 4, 4)      ray_mats flattened over (t, h', w'); transpose; SE(3) inverse
    intrinsics        (F, 4)         [fx fy cx cy] in pixels of the width x height crop
"""
from __future__ import annotations

import numpy as np
import torch

from camrender.errors import CamrenderError
from camrender.trajectory.crop import cover_crop_geometry, crop_intrinsics  # noqa: F401 (also used from here)
from camrender.trajectory.model import Trajectory
from camrender.trajectory.resample import is_model_length
from camrender.trajectory.rotations import invert_rigid, relative_poses


def to_latent_grid(intrinsics: np.ndarray, height: int, width: int, latent_h: int, latent_w: int) -> np.ndarray:
    """[fx, fy, cx, cy] (..., 4) in pixels of the height x width video -> units of the latent grid (a copy)."""
    latent_intr = np.array(intrinsics, dtype=np.float64, copy=True)
    latent_intr[..., [0, 2]] *= latent_w / float(width)
    latent_intr[..., [1, 3]] *= latent_h / float(height)
    return latent_intr


def _image_plane(intrinsics: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, height, width) x = (u - cx) / fx and y = (v - cy) / fy of the integer pixel grid (u column, v row)."""
    v, u = np.meshgrid(np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64), indexing="ij")
    fx, fy, cx, cy = (intrinsics[:, i, None, None] for i in range(4))
    return (u - cx) / fx, (v - cy) / fy


def plucker_map(c2w: np.ndarray, intrinsics: np.ndarray, height: int, width: int) -> np.ndarray:
    """(K, height, width, 6) Plucker rays (unit world direction d, moment o x d) on the integer pixel grid.

    c2w: (K, 4, 4); intrinsics: (K, 4) in pixels of this grid.
    """
    x, y = _image_plane(intrinsics, height, width)
    dirs = np.stack([x, y, np.ones_like(x)], axis=-1)
    world = np.einsum("kij,khwj->khwi", c2w[:, :3, :3], dirs)
    world /= np.linalg.norm(world, axis=-1, keepdims=True)
    origin = np.broadcast_to(c2w[:, None, None, :3, 3], world.shape)
    return np.concatenate([world, np.cross(origin, world)], axis=-1)


def _fov_round_trip_focal(focal: np.ndarray, xi: float, image_size: int, grid_size: int) -> np.ndarray:
    """The focal length diffusers unprojects with: focal -> fov (over image_size) -> focal (over grid_size)."""
    a = 2.0 * focal / image_size
    theta = np.arcsin(np.clip(xi / np.sqrt(a * a + 1.0), -1.0, 1.0)) + np.arctan(1.0 / a)
    return 0.5 * grid_size * (np.cos(theta) + xi) / np.sin(theta)


def ucm_unproject(intrinsics: np.ndarray, height: int, width: int, xi: float = 0.0) -> np.ndarray:
    """(K, height, width, 3) camera rays of the unified camera model on the integer grid (xi = 0: unit pinhole rays).

    Points outside the model's valid image get NaN (sqrt of a negative number).
    """
    x, y = _image_plane(intrinsics, height, width)
    r2 = x * x + y * y
    with np.errstate(invalid="ignore"):
        alpha = xi + np.sqrt(1.0 + (1.0 - xi * xi) * r2)
    gamma = alpha / (1.0 + r2)
    return np.stack([gamma * x, gamma * y, gamma - xi], axis=-1)


def _normalize(v: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), eps)


def ray_matrices(c2w: np.ndarray, rays: np.ndarray) -> np.ndarray:
    """(K, H, W, 4, 4) ray<-world transforms from camera rays (K, H, W, 3) and c2w (K, 4, 4).

    Local frame per ray: z = R d, x = R[:, 1] x z, y = z x x (all normalised);
    P = [[R_w2l, -R_w2l t], [0, 0, 0, 1]] with R_w2l rows x, y, z. NaN rays get the identity.
    """
    rotation = c2w[:, :3, :3]
    world = np.einsum("kij,khwj->khwi", rotation, rays)
    camera_y = np.broadcast_to(rotation[:, None, None, :, 1], world.shape)
    with np.errstate(invalid="ignore"):
        z = _normalize(world)
        x = _normalize(np.cross(camera_y, z))
        y = _normalize(np.cross(z, x))
    w2l = np.stack([x, y, z], axis=-2)
    mats = np.zeros(rays.shape[:-1] + (4, 4))
    mats[..., :3, :3] = w2l
    mats[..., :3, 3] = -np.einsum("khwij,kj->khwi", w2l, c2w[:, :3, 3])
    mats[..., 3, 3] = 1.0
    mats[np.isnan(world).any(-1)] = np.eye(4)
    return mats


def build_camera_inputs(
    traj: Trajectory,
    height: int = 704,
    width: int = 1280,
    vae_stride=(8, 32, 32),
    patch_size=(1, 1, 1),
    *,
    xi: float = 0.0,
    source_size=None,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """All camera tensors for one trajectory (no batch axis; see the module docstring for shapes).

    Args:
        traj: F = 8k+1 frames (use `camrender.trajectory.to_model_frames` first); intrinsics in pixels
            of ``source_size`` (default ``(traj.width, traj.height)``, i.e. the first-frame image size).
        height, width: video size; the source is cover-resized and centre-cropped to it (diffusers
            ``transform_intrinsics_for_crop``).
        vae_stride: (time, height, width) compression of the VAE.
        patch_size: transformer patch (t, h, w); the ray matrices live on the patch grid.
        xi: unified-camera-model parameter for the ray matrices (0 = pinhole, what the model uses).
        dtype: dtype of the returned tensors.
    """
    time_stride, stride_h, stride_w = vae_stride
    frames = traj.num_frames
    if not is_model_length(frames, time_stride):
        raise CamrenderError(
            f"{frames} frames is not {time_stride}k+1; resample with to_model_frames() first",
            path=traj.source,
            field="frames",
        )
    if height % stride_h or width % stride_w:
        raise CamrenderError(f"video size {width}x{height} is not a multiple of the VAE stride {stride_w}x{stride_h}")
    latent_h, latent_w = height // stride_h, width // stride_w
    if latent_h % patch_size[1] or latent_w % patch_size[2]:
        raise CamrenderError(f"latent grid {latent_w}x{latent_h} is not a multiple of the patch size")
    latent_t = (frames - 1) // time_stride + 1

    src = tuple(source_size) if source_size is not None else (traj.width, traj.height)
    intrinsics = crop_intrinsics(traj.intrinsics, src, (width, height))
    latent_intr = to_latent_grid(intrinsics, height, width, latent_h, latent_w)
    poses = relative_poses(traj.c2w)
    conditions, chunk_plucker = latent_camera_rows(poses, latent_intr, range(latent_t), frames, latent_h, latent_w,
                                                   time_stride)

    ray_mats = _ray_mats_from_conditions(conditions, latent_h // patch_size[1], latent_w // patch_size[2], patch_size, xi)
    P = ray_mats.reshape(-1, 4, 4)

    def tensor(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)

    return {
        "camera_conditions": tensor(conditions),
        "chunk_plucker": tensor(chunk_plucker),
        "ray_mats": tensor(ray_mats),
        "P": tensor(P),
        "P_T": tensor(np.swapaxes(P, -1, -2)),
        "P_inv": tensor(invert_rigid(P)),
        "intrinsics": tensor(intrinsics),
    }


def latent_camera_rows(poses: np.ndarray, latent_intr: np.ndarray, latent_frames, num_frames: int, latent_h: int,
                       latent_w: int, time_stride: int = 8) -> tuple:
    """Camera conditions and Plucker maps of some latent frames, from the video frames' cameras.

    poses: (F', 4, 4) c2w relative to video frame 0 and latent_intr: (F', 4) fx fy cx cy on the latent
    grid, for video frames 0 .. F'-1 (a prefix of the path is enough: latent frame j reads video frames
    up to max(8j, min(7, F - 1))); latent_frames: the latent-frame indices wanted; num_frames: F, the
    whole path's video frames (the last Plucker window of a short path repeats its last frame).
    Returns float64 (n, 20) conditions and (48, n, latent_h, latent_w) Plucker maps. Each latent frame
    is computed on its own, so rows computed in pieces equal the rows of the whole path.
    """
    keys = np.asarray([time_stride * int(j) for j in latent_frames], dtype=np.int64)
    conditions = np.concatenate([poses[keys].reshape(len(keys), 16), latent_intr[keys]], axis=1)
    chunks = []
    for key in keys:
        start = max(0, int(key) - (time_stride - 1))
        index = np.minimum(np.arange(start, start + time_stride), num_frames - 1)  # pad by repeating the last
        rays = plucker_map(poses[index], latent_intr[index], latent_h, latent_w)  # (8, h, w, 6)
        chunks.append(rays.transpose(0, 3, 1, 2).reshape(-1, latent_h, latent_w))
    return conditions, np.stack(chunks, axis=1)  # (48, n, h, w)


def _ray_mats_from_conditions(conditions: np.ndarray, grid_h: int, grid_w: int, patch_size, xi: float) -> np.ndarray:
    """(T, grid_h, grid_w, 4, 4) ray matrices from (T, 20) camera conditions, as the transformer builds them."""
    c2w = conditions[:, :16].reshape(-1, 4, 4)
    fx, fy, cx, cy = (conditions[:, 16 + i] for i in range(4))
    intr = np.stack(
        [
            _fov_round_trip_focal(fx, xi, grid_w * patch_size[2], grid_w),
            _fov_round_trip_focal(fy, xi, grid_h * patch_size[1], grid_h),
            cx / patch_size[2],
            cy / patch_size[1],
        ],
        axis=1,
    )
    return ray_matrices(c2w, ucm_unproject(intr, grid_h, grid_w, xi))
