"""A call's conditioning without host-device syncs: the ray matrices (`camrender.model.stage1.conditioning`) equal
diffusers' bit for bit, the absolute ray map is computed only for models that embed it, the RoPE frequency table is
copied to a device once, and `to_device` moves host tensors with the values of `.to`."""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm import _process_camera_conditions_ucpe

from camrender.model.device import to_device
from camrender.model.stage1.conditioning import camera_ray_matrices, ray_transforms
from camrender.model.stage1.segments import _freqs_on, _rope_for_frames, prepare_conditioning
from camrender.model.stage1.tiny import build_tiny_transformer


def camera_conditions(batch, frames, width, height, seed=0, dtype=torch.float32):
    """(B, T, 20): random rotations and positions, intrinsics of a `width` x `height` image."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch * frames):
        rotation, _ = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
        c2w = torch.eye(4, dtype=torch.float64)
        c2w[:3, :3] = rotation * torch.sign(torch.linalg.det(rotation))
        c2w[:3, 3] = torch.randn(3, generator=generator)
        intrinsics = torch.tensor([0.9 * width, 0.8 * width, width / 2 - 0.3, height / 2 + 0.2], dtype=torch.float64)
        rows.append(torch.cat([c2w.flatten(), intrinsics]))
    return torch.stack(rows).view(batch, frames, 20).to(dtype)


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0))


@pytest.mark.parametrize("batch, frames", [(1, 1), (2, 3), (1, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ray_matrices_equal_diffusers_bit_for_bit(batch, frames, dtype):
    grid, patch = (frames, 5, 7), (1, 2, 2)
    conditions = camera_conditions(batch, frames, 14, 10, dtype=dtype)
    expected, _ = _process_camera_conditions_ucpe(conditions, batch, grid, patch)
    assert same_bits(camera_ray_matrices(conditions, grid, patch), expected)


def test_a_frame_with_undefined_rays_gets_identity_matrices_as_in_diffusers():
    grid, patch = (3, 5, 7), (1, 1, 1)
    conditions = camera_conditions(2, 3, 7, 5, seed=3)
    conditions[1, 2, 16] = float("nan")  # fx of one frame: its rays are NaN
    expected, _ = _process_camera_conditions_ucpe(conditions, 2, grid, patch)
    ours = camera_ray_matrices(conditions, grid, patch)
    assert same_bits(ours, expected)
    assert torch.equal(ours[1, 2], torch.eye(4).expand(5, 7, 4, 4))
    assert not torch.equal(ours[1, 1], torch.eye(4).expand(5, 7, 4, 4))


def test_the_ray_map_is_computed_only_for_models_that_embed_it():
    frames, height, width = 3, 2, 3
    text, mask = torch.randn(1, 1, 2, 32), torch.ones(1, 2, dtype=torch.long)
    conditions = camera_conditions(1, frames, width, height, seed=1)
    plucker = torch.randn(1, 48, frames, height, width)
    with torch.no_grad():
        post_attn = build_tiny_transformer()  # Plucker maps after attention: no ray map
        prepared = prepare_conditioning(post_attn, (frames, height, width), text, mask, camera_conditions=conditions,
                                        chunk_plucker=plucker)
        rays, ray_map = ray_transforms(post_attn, conditions, (frames, height, width), prepared.rope)
        assert prepared.raymap is None and ray_map is not None
        assert all(same_bits(a, b) for a, b in zip(prepared.rays, rays))

        embeds_map = build_tiny_transformer(use_chunk_plucker_post_attn=False)
        prepared = prepare_conditioning(embeds_map, (frames, height, width), text, mask, camera_conditions=conditions)
        _, absmap = _process_camera_conditions_ucpe(conditions, 1, (frames, height, width), embeds_map.patch_size)
        assert same_bits(prepared.raymap, embeds_map.raymap_embedder(absmap.permute(0, 4, 1, 2, 3)))


def test_rope_rows_read_the_frequency_table_copied_once_per_device():
    rope = build_tiny_transformer().rope
    assert _freqs_on(rope, "cpu") is rope.freqs  # already there: no copy
    first = _freqs_on(rope, torch.device("meta"))
    assert first.device.type == "meta" and _freqs_on(rope, "meta") is first
    rope.freqs = rope.freqs.clone()  # a new table is copied anew
    assert _freqs_on(rope, "meta") is not first
    assert torch.equal(_rope_for_frames(rope, 2, 3, 4, 5, "cpu"), rope((5, 4, 5))[:, :, 2 * 20:5 * 20])


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_to_device_on_the_cpu_is_a_plain_move(dtype):
    tensor = torch.randn(3, 4, 5)[:, 1:]  # not contiguous
    moved = to_device(tensor, "cpu", dtype)
    assert torch.equal(moved, tensor.to(dtype=dtype)) and moved.dtype == (dtype or torch.float32)



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ray_matrices_equal_diffusers_bit_for_bit_on_the_gpu(dtype):
    """The same kernels as diffusers' on CUDA, in the model's dtype too (bf16 has no CPU path in diffusers)."""
    grid, patch = (3, 5, 7), (1, 2, 2)
    conditions = camera_conditions(2, 3, 14, 10, seed=5, dtype=dtype).cuda()
    conditions[1, 2, 16] = float("nan")
    expected, _ = _process_camera_conditions_ucpe(conditions, 2, grid, patch)
    assert same_bits(camera_ray_matrices(conditions, grid, patch), expected)
