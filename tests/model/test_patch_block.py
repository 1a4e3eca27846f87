"""camrender.model.stage1.block pieces against the stock diffusers modules (CPU, Triton interpreter, fp32)."""
import torch
from diffusers.models.transformers.transformer_sana_wm import MultiHeadCrossAttention

from camrender.model.stage1.block import FusedCrossAttnProcessor, plucker_projection
from camrender.model.stage1.gdn_attention import combine_branches
from camrender.model.stage1.tiny import build_tiny_transformer


def test_fused_cross_attention_matches_the_stock_processor():
    torch.manual_seed(0)
    attn = MultiHeadCrossAttention(32, 2, qk_norm=True).eval()
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
    x, text = torch.randn(2, 15, 32), torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 4:] = 0  # a shorter first prompt: padding keys must stay masked
    with torch.no_grad():
        stock = attn(x, text, mask=mask)
        attn.set_processor(FusedCrossAttnProcessor(backend="auto"))  # Triton under the interpreter
        fused = attn(x, text, mask=mask)
    torch.testing.assert_close(fused, stock, rtol=1e-5, atol=1e-5)


def test_plucker_projection_reads_the_transposed_embedding():
    block = build_tiny_transformer(seed=1).blocks[0]
    embedded = torch.randn(2, 32, 18).transpose(1, 2)  # (B, N, C) as the embedder hands it over
    with torch.no_grad():
        out = plucker_projection(block, embedded)
        torch.testing.assert_close(out + block.plucker_proj.bias, block.plucker_proj(embedded), rtol=1e-5, atol=1e-5)
        assert out.is_contiguous()
        one_row = plucker_projection(block, embedded[:1])  # guidance rows share their Plucker maps
    assert one_row.shape == (1, 18, 32)
    torch.testing.assert_close(one_row[0], out[0], rtol=0, atol=0)


def test_combine_branches_fused_equals_stock():
    attn = build_tiny_transformer(seed=2).blocks[0].attn
    x, main, camera = (torch.randn(2, 12, 32) for _ in range(3))
    with torch.no_grad():
        for cam in (camera, None):
            stock = combine_branches(attn, x, main, cam, "torch")
            fused = combine_branches(attn, x, main, cam, "auto")
            torch.testing.assert_close(fused, stock, rtol=1e-5, atol=1e-5)


def test_decay_constants_are_made_once_per_parameter_version():
    """The GDN gates' constants, -exp(A_log) and dt_bias in fp32, are kept on the module and made again only
    when a parameter changes (in place: a new version)."""
    from camrender.model.stage1.gdn_attention import decay_constants, gdn_gates

    attn = next(block.attn for block in build_tiny_transformer(seed=3).blocks if hasattr(block.attn, "A_log"))
    first = decay_constants(attn)
    assert decay_constants(attn)[0] is first[0]
    torch.testing.assert_close(first[0], -attn.A_log.float().exp().view(1, 1, -1), rtol=0, atol=0)
    with torch.no_grad():
        attn.A_log.add_(0.5)
    again = decay_constants(attn)
    assert again[0] is not first[0]
    torch.testing.assert_close(again[0], -attn.A_log.float().exp().view(1, 1, -1), rtol=0, atol=0)
    x = torch.randn(1, 3 * 8, 32)
    with torch.no_grad():
        _, decay = gdn_gates(attn, x, 3)
        gate = attn.gate_proj(x.reshape(1, 3, 8, 32).mean(dim=2)).float()
        rate = attn.A_log.float().exp().view(1, 1, -1)
        want = (-rate * torch.nn.functional.softplus(gate + attn.dt_bias.float().view(1, 1, -1))).exp().transpose(1, 2)
    torch.testing.assert_close(decay, want, rtol=1e-5, atol=1e-6)  # the fused kernel sums the frame in tiles


def test_ray_matrices_are_widened_once_and_narrowed_back_for_stock_code():
    from camrender.model.stage1.conditioning import stock_rays, widened_rays

    p = torch.randn(1, 6, 4, 4).bfloat16()
    p_inv = torch.randn(1, 6, 4, 4).bfloat16()
    rope_cam = torch.randn(1, 1, 6, 2, dtype=torch.complex64)
    widened = widened_rays((p, p.transpose(-1, -2), p_inv, rope_cam))
    assert all(m.dtype == torch.float32 for m in widened[:3]) and widened[3] is rope_cam
    assert widened[1].data_ptr() == widened[0].data_ptr()  # P_T: a view of P, as diffusers gives it
    assert torch.equal(widened[1], p.float().transpose(-1, -2))
    back = stock_rays(widened, torch.bfloat16)
    assert torch.equal(back[0], p) and torch.equal(back[1], p.transpose(-1, -2)) and torch.equal(back[2], p_inv)
    full = (p.float(), p.float().transpose(-1, -2), p_inv.float(), None)
    assert all(a is b for a, b in zip(widened_rays(full)[::2], full[::2]))  # fp32 stays as it is
