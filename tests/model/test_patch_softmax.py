"""Fused softmax-block attention (camrender.model.stage1.softmax_attention) against diffusers' stock block.

CPU, Triton interpreter, tiny shapes. The stock block runs in float64 with its bf16 cast before
SDPA disabled (the camera branch casts to bf16 whatever the input dtype); the patched block runs
in float32 with fp32 SDPA, so the comparison sees only the fused kernels' arithmetic: within
1e-4 relative. The default bf16-attention path is checked against the plain stock block loosely
(the interpreter's bf16 rounding is not the GPU's).
"""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm import (
    SanaWMRotaryPosEmbed,
    _invert_SE3,
    _slice_rope_for_cam,
    _SoftmaxUCPESinglePathLiteLA,
)

from camrender.kernels.softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref
from camrender.kernels.softmax_cam import cam_softmax_decode, cam_softmax_encode
from camrender.model.settings import KernelSettings
from camrender.model.stage1.patch import patch_attention
from camrender.model.stage1.softmax_attention import PatchedSoftmaxAttention
from helpers import rel


def _random_se3(count, generator):
    """count random rigid transforms (count, 4, 4) fp64."""
    a = torch.randn(count, 3, 3, generator=generator, dtype=torch.float64)
    rot, _ = torch.linalg.qr(a)
    rot = rot * torch.sign(torch.linalg.det(rot))[:, None, None]
    mats = torch.eye(4, dtype=torch.float64).repeat(count, 1, 1)
    mats[:, :3, :3] = rot
    mats[:, :3, 3] = torch.randn(count, 3, generator=generator, dtype=torch.float64)
    return mats


def _setup(seed, batch=2, frames=3, hw=(2, 3), heads=2, head_dim=16):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    channels = heads * head_dim
    block = _SoftmaxUCPESinglePathLiteLA(channels, channels, cam_dim=channels, cam_heads=heads, heads=heads,
                                         dim=head_dim, qk_norm=True, patch_size=(1, 1, 1))
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim > 1 else 0.1))
        for norm in (block.q_norm, block.k_norm, block.q_norm_cam, block.k_norm_cam):
            norm.weight.add_(1.0)
    tokens = frames * hw[0] * hw[1]
    x = torch.randn(batch, tokens, channels, generator=gen, dtype=torch.float64)
    rope = SanaWMRotaryPosEmbed(head_dim, (1, 1, 1), 64)((frames, *hw))
    p = _random_se3(batch * tokens, gen).reshape(batch, tokens, 4, 4)
    rays = (p, p.transpose(-1, -2), _invert_SE3(p), _slice_rope_for_cam(rope, head_dim, head_dim // 2))
    return block, x, (frames, *hw), rope, rays


@pytest.mark.parametrize("kernels", ["fused", "torch"])
@pytest.mark.parametrize("seed,head_dim", [(0, 16), (1, 16), (2, 32)])
def test_patched_softmax_block_matches_stock(seed, head_dim, kernels, monkeypatch):
    """Head dim 16 is zero-padded to 128 for the camera SDPA (as in stock, which also scales by
    1/sqrt(128)); 32 is a FlashAttention size stock attends at unpadded, scale 1/sqrt(32). Backend
    "torch" runs the same structure on the PyTorch references."""
    block, x, hw, rope, rays = _setup(seed, head_dim=head_dim)
    cam = torch.zeros(x.shape[0], hw[0], 20)
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self, *a, **k: self)  # stock: attend in full precision
    with torch.no_grad():
        ref = block.double()(x, HW=hw, rotary_emb=rope, camera_conditions=cam, ucpe_ray_transforms=rays)
        block.float()
        patched = PatchedSoftmaxAttention.adopt(block, KernelSettings.from_kernels(kernels))
        patched.sdpa_dtype = torch.float32
        rays32 = tuple(r.float() if not r.is_complex() else r for r in rays)
        out = patched(x.float(), HW=hw, rotary_emb=rope, camera_conditions=cam, ucpe_ray_transforms=rays32)
        main_only = patched(x.float(), HW=hw, rotary_emb=rope)
        main_ref = block.double()(x, HW=hw, rotary_emb=rope)
    monkeypatch.undo()
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert rel(out, ref) < 1e-4
    assert rel(main_only, main_ref) < 1e-4
    # the camera branch really contributes (the comparison above is not main-branch only)
    assert rel(main_ref, ref) > 1e-2


def test_adopt_shares_parameters_and_updates_settings():
    block, *_ = _setup(3)
    block.float()
    keys = {k: v.data_ptr() for k, v in block.state_dict().items()}
    patched = patch_attention(block, KernelSettings.from_kernels("torch"))
    assert {k: v.data_ptr() for k, v in patched.state_dict().items()} == keys
    fused = KernelSettings.from_kernels("fused")
    assert patch_attention(patched, fused) is patched and patched.settings == fused


def test_default_bf16_attention_stays_close_to_stock():
    # The default path attends in bf16 like the stock fp32 block does: close, not bit-equal.
    block, x, hw, rope, rays = _setup(4)
    block.float()
    cam = torch.zeros(x.shape[0], hw[0], 20)
    rays32 = tuple(r.float() if not r.is_complex() else r for r in rays)
    patched = PatchedSoftmaxAttention.adopt(block)
    with torch.no_grad():
        ref = block(x.float(), HW=hw, rotary_emb=rope, camera_conditions=cam, ucpe_ray_transforms=rays32)
        out = patched(x.float(), HW=hw, rotary_emb=rope, camera_conditions=cam, ucpe_ray_transforms=rays32)
    assert rel(out, ref) < 2e-2


def test_cam_encode_decode_kernels_match_reference():
    gen = torch.Generator().manual_seed(5)
    batch, tokens, heads, dim = 2, 10, 2, 24
    channels = heads * dim
    q, k, v = (torch.randn(batch, 3 * tokens, channels, generator=gen)[:, ::3] for _ in range(3))  # strided rows
    qw, kw = (1 + 0.2 * torch.randn(channels, generator=gen) for _ in range(2))
    rope = SanaWMRotaryPosEmbed(2 * dim, (1, 1, 1), 64)((2, 1, 5))
    rope_cam = _slice_rope_for_cam(rope, 2 * dim, dim // 2)
    p = _random_se3(batch * tokens, gen).reshape(batch, tokens, 4, 4).float()
    rays = (p, p.transpose(-1, -2), _invert_SE3(p), rope_cam)
    got = cam_softmax_encode(q, k, v, rays, q_norm_weight=qw, k_norm_weight=kw, heads=heads)
    want = cam_softmax_encode_ref(q, k, v, rays, q_norm_weight=qw, k_norm_weight=kw, heads=heads)
    for g, w in zip(got, want):
        assert g.shape == (batch, tokens, heads, 128)
        assert torch.all(g[..., dim:] == 0)
        assert rel(g, w) < 1e-5
    o = torch.randn(batch, heads, tokens, 128, generator=gen)
    assert rel(cam_softmax_decode(o, rays, dim=dim), cam_softmax_decode_ref(o, rays, dim=dim)) < 1e-5
    # decode undoes the encode when the matrices are pure rotations (P_inv = P^T): the round trip is the identity
    rot = _random_se3(batch * tokens, gen).reshape(batch, tokens, 4, 4).float()
    rot[..., :3, 3] = 0
    rays_rot = (rot, rot.transpose(-1, -2), rot.transpose(-1, -2), rope_cam)
    _, _, v_enc = cam_softmax_encode(q, k, v, rays_rot, heads=heads, downscale=False)
    back = cam_softmax_decode(v_enc.transpose(1, 2), rays_rot, dim=dim)
    assert rel(back, v) < 1e-5
