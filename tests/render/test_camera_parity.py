"""build_camera_inputs against diffusers' prepare_camera / _process_camera_conditions_ucpe / _prepare_ucpe_ray_transforms."""
import os

import numpy as np
import pytest
import torch

from camrender.render.camera import build_camera_inputs, cover_crop_geometry, crop_intrinsics
from camrender.errors import CamrenderError
from camrender.trajectory import Trajectory, load, rotations
from camrender.trajectory.v1 import parse_document
from camrender.trajectory import presets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5

from diffusers.models.transformers import transformer_sana_wm as sana_wm  # noqa: E402  (parity reference only)
from diffusers.pipelines.sana_wm import cam_utils  # noqa: E402


def _reference(traj, height, width, vae_stride, patch_size=(1, 1, 1)):
    """diffusers' own path: crop intrinsics, prepare_camera, then the transformer's UCPE ray transforms."""
    from PIL import Image

    image = Image.new("RGB", (traj.width, traj.height))
    _, src, resized, offset = cam_utils.resize_and_center_crop(image, height, width)
    intr = cam_utils.transform_intrinsics_for_crop(traj.intrinsics.astype(np.float32), src, resized, offset)
    cam = cam_utils.prepare_camera(traj.c2w.astype(np.float32), intr, target_size=(height, width), vae_stride=vae_stride)
    conditions = cam["raymap"][None]
    t = conditions.shape[1]
    hw = (t, height // vae_stride[1] // patch_size[1], width // vae_stride[2] // patch_size[2])
    raymats, _ = sana_wm._process_camera_conditions_ucpe(conditions, 1, hw, patch_size)
    P, P_T, P_inv, _ = sana_wm._prepare_ucpe_ray_transforms(16, conditions, hw, patch_size)
    return cam, intr, raymats[0], P[0], P_T[0], P_inv[0]


def _check(traj, height, width, vae_stride=(8, 32, 32), patch_size=(1, 1, 1)):
    ours = build_camera_inputs(traj, height=height, width=width, vae_stride=vae_stride, patch_size=patch_size)
    cam, intr, raymats, P, P_T, P_inv = _reference(traj, height, width, vae_stride, patch_size)
    pairs = {
        "camera_conditions": cam["raymap"],
        "chunk_plucker": cam["chunk_plucker"],
        "ray_mats": raymats,
        "P": P,
        "P_T": P_T,
        "P_inv": P_inv,
    }
    for name, ref in pairs.items():
        assert ours[name].shape == ref.shape, name
        assert ours[name].dtype == torch.float32
        diff = (ours[name] - ref).abs().max().item()
        assert diff <= TOL, f"{name}: max abs diff {diff:.3g}"
    np.testing.assert_allclose(ours["intrinsics"].numpy(), intr, rtol=1e-6)
    return ours


def _wobbly(n, width, height, seed=0):
    """A path with rotation about every axis, translation and changing, off-centre intrinsics."""
    rng = np.random.default_rng(seed)
    c2w = np.tile(np.eye(4), (n, 1, 1))
    c2w[0, :3, :3] = rotations.rot_y(0.7) @ rotations.rot_x(-0.4)
    c2w[0, :3, 3] = [2.0, -1.0, 3.0]
    for i in range(1, n):
        step = rotations.rot_y(rng.normal(0, 0.05)) @ rotations.rot_x(rng.normal(0, 0.05)) @ rotations.rot_z(rng.normal(0, 0.03))
        c2w[i, :3, :3] = c2w[i - 1, :3, :3] @ step
        c2w[i, :3, 3] = c2w[i - 1, :3, 3] + rng.normal(0, 0.1, 3)
    f = np.linspace(0.8, 1.3, n) * width
    intr = np.stack([f, f * 1.02, width / 2 + 7.5 + np.arange(n), height / 2 - 3.25 * np.ones(n)], axis=1)
    return Trajectory(c2w, intr, width, height, 16.0)


@pytest.mark.parametrize("src", [(640, 480), (1280, 704), (300, 900)], ids=["4:3", "same", "portrait"])
def test_parity_small_grid(src):
    traj = _wobbly(17, *src)
    out = _check(traj, height=128, width=256)
    assert out["camera_conditions"].shape == (3, 20)
    assert out["chunk_plucker"].shape == (48, 3, 4, 8)
    assert out["P"].shape == (3 * 4 * 8, 4, 4)


def test_parity_patch_size_2():
    _check(_wobbly(9, 640, 360, seed=2), height=256, width=256, patch_size=(1, 2, 2))


@pytest.mark.parametrize("name,latent_frames", [("orbit.json", 21)])
def test_parity_release_shape_on_example_files(name, latent_frames):
    traj = load(os.path.join(ROOT, "trajectories", name))
    out = _check(traj, height=704, width=1280)
    assert out["chunk_plucker"].shape == (48, latent_frames, 22, 40)
    assert out["P_inv"].shape == (latent_frames * 22 * 40, 4, 4)


def test_first_latent_frame_is_identity_and_relative():
    traj = _wobbly(9, 320, 320)
    out = build_camera_inputs(traj, height=64, width=64)
    np.testing.assert_array_equal(out["camera_conditions"][0, :16].numpy(), np.eye(4, dtype=np.float32).reshape(-1))
    expected = np.linalg.inv(traj.c2w[0]) @ traj.c2w[8]
    np.testing.assert_allclose(out["camera_conditions"][1, :16].numpy(), expected.reshape(-1), atol=1e-6)
    # P_inv really is the inverse of P
    eye = torch.eye(4).expand_as(out["P"])
    assert (out["P"] @ out["P_inv"] - eye).abs().max() < 1e-5


def test_crop_rule_matches_diffusers_examples():
    for src in [(640, 480), (1920, 1080), (1000, 1000), (1281, 705)]:
        from PIL import Image

        _, _, resized, offset = cam_utils.resize_and_center_crop(Image.new("RGB", src), 704, 1280)
        assert cover_crop_geometry(src, (1280, 704)) == (resized, offset)
    k = np.array([[500.0, 500.0, 320.0, 240.0]])
    np.testing.assert_allclose(crop_intrinsics(k, (640, 480), (1280, 704)), [[1000, 1000, 640, 352]])


def test_rejects_non_model_lengths():
    traj = parse_document(presets.make("dolly", num_frames=12))
    with pytest.raises(CamrenderError, match="not 8k\\+1"):
        build_camera_inputs(traj)
