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
