"""The patched GDN block's main branch (camrender.model.stage1.patch, kernels="fused") against the stock block.

CPU, Triton interpreter, tiny shapes, camera branch off (camera_conditions=None) so the output
is the main branch + gate + projection only. Stock in float64, patched in float32 with ieee dots.
"""
import torch
from diffusers.models.transformers.transformer_sana_wm import (
    BidirectionalGDNUCPESinglePathLiteLA,
    SanaWMRotaryPosEmbed,
)

from camrender.model.settings import KernelSettings
from camrender.model.stage1.gdn_attention import PatchedGDNAttention
from helpers import rel


def test_patched_gdn_main_branch_matches_stock():
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    heads, head_dim, frames, hw = 2, 16, 5, (2, 3)
    channels = heads * head_dim
    block = BidirectionalGDNUCPESinglePathLiteLA(channels, channels, cam_dim=channels, cam_heads=heads, heads=heads,
                                                 dim=head_dim, qk_norm=True, eps=1e-8, patch_size=(1, 1, 1))
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name in ("A_log", "dt_bias"):
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim > 1 else 0.1))
        for norm in (block.q_norm, block.k_norm):
            norm.weight.add_(1.0)
    x = torch.randn(2, frames * hw[0] * hw[1], channels, generator=gen, dtype=torch.float64)
    rope = SanaWMRotaryPosEmbed(head_dim, (1, 1, 1), 64)((frames, *hw))
    with torch.no_grad():
        want = block.double()(x, HW=(frames, *hw), rotary_emb=rope)
        block.float()
        fused = PatchedGDNAttention.adopt(block, KernelSettings.from_kernels("fused", "ieee"))
        got = fused(x.float(), HW=(frames, *hw), rotary_emb=rope)
        stock_path = PatchedGDNAttention.adopt(block, KernelSettings.from_kernels("torch", "ieee"))
        torch_out = stock_path(x.float(), HW=(frames, *hw), rotary_emb=rope)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert rel(got, want) < 1e-4
    assert rel(torch_out, want) < 1e-4
    assert not torch.equal(got, torch_out)  # the fused path really ran (different arithmetic, same function)
