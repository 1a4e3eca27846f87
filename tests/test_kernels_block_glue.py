"""kernels.block_glue: the single-pass adaLN glue against its references and against the stock
block's PyTorch ops (CPU, Triton interpreter from conftest)."""
import pytest
import torch

from kernels.block_glue import (
    ada_norm,
    ada_norm_ref,
    gated_residual,
    gated_residual_ref,
    merge_heads,
    residual_ada_norm,
    silu_gate,
    silu_gate_ref,
)


def glue_inputs(batch=2, frames=3, spatial=5, channels=40, dtype=torch.float32, seed=0):
    """x as a channel slice of a wider tensor (token stride != C), a contiguous y, and the per-frame
    modulation rows as views into a (B, T, 6, C) tensor."""
    g = torch.Generator().manual_seed(seed)
    tokens = frames * spatial
    x = torch.randn(batch, tokens, channels + 8, generator=g).to(dtype)[..., 4:4 + channels]
    y = torch.randn(batch, tokens, channels, generator=g).to(dtype)
    rows = (torch.randn(batch, frames, 6, channels, generator=g) * 0.5).to(dtype).unbind(2)
    return x, y, rows


def stock_modulate(x, shift, scale, eps=1e-6):
    """What SanaVideoMSCamCtrlBlock does: LayerNorm, then `* (1 + scale) + shift` per frame."""
    batch, tokens, channels = x.shape
    frames = shift.shape[1]
    normed = torch.nn.functional.layer_norm(x, (channels,), eps=eps).reshape(batch, frames, -1, channels)
    return (normed * (1 + scale[:, :, None]) + shift[:, :, None]).reshape(batch, tokens, channels)


def test_references_equal_the_stock_block_ops():
    x, y, (shift, scale, gate, *_) = glue_inputs()
    torch.testing.assert_close(ada_norm_ref(x, shift, scale), stock_modulate(x, shift, scale), rtol=1e-5, atol=1e-5)
    stock = x + (gate[:, :, None] * y.reshape(2, 3, 5, 40)).reshape(x.shape)
    torch.testing.assert_close(gated_residual_ref(x, y, gate), stock, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels", [40, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_references(channels, dtype):
    x, y, (shift, scale, gate, _, _, _) = glue_inputs(channels=channels, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)

    out = ada_norm(x, shift, scale, eps=1e-6, backend="triton")
    assert out.is_contiguous() and out.dtype == dtype
    torch.testing.assert_close(out.float(), ada_norm_ref(x, shift, scale).float(), **tol)

    updated, normed = residual_ada_norm(x, y, shift, scale, backend="triton")
    torch.testing.assert_close(updated.float(), (x.float() + y.float()).to(dtype).float(), **tol)
    torch.testing.assert_close(normed.float(), ada_norm_ref(updated, shift, scale).float(), **tol)

    z = torch.randn_like(y)
    torch.testing.assert_close(gated_residual(x, y, gate, backend="triton").float(),
                               gated_residual_ref(x, y, gate).float(), **tol)
    torch.testing.assert_close(gated_residual(x, y, gate, y2=z, backend="triton").float(),
                               gated_residual_ref(x, y, gate, z).float(), **tol)
    torch.testing.assert_close(gated_residual(x, y, gate, extra=y[:1], backend="triton").float(),
                               gated_residual_ref(x, y, gate, extra=y[:1].expand_as(y)).float(), **tol)
    torch.testing.assert_close(gated_residual(x, y, gate, extra=y, backend="triton").float(),
                               (x.float() + gate.float().repeat_interleave(5, 1) * y.float() + y.float()).to(dtype)
                               .float(), **tol)

    a, b, g = y, z, torch.randn_like(y)
    torch.testing.assert_close(silu_gate(a, g, b=b, backend="triton").float(), silu_gate_ref(a, g, b).float(), **tol)
    torch.testing.assert_close(silu_gate(a, g, backend="triton").float(), silu_gate_ref(a, g).float(), **tol)


def test_modulation_is_per_frame():
    """Changing one frame's scale changes that frame's tokens only."""
    x, _, (shift, scale, *_) = glue_inputs()
    base = ada_norm(x, shift, scale, backend="triton")
    scale = scale.clone()
    scale[1, 2] += 1.0
    moved = (ada_norm(x, shift, scale, backend="triton") - base).abs().amax(dim=-1)  # (B, N)
    changed = moved.reshape(2, 3, 5) > 1e-6
    expected = torch.zeros(2, 3, 5, dtype=torch.bool)
    expected[1, 2] = True
    assert torch.equal(changed, expected)


def test_bad_shapes_raise():
    x, y, (shift, scale, gate, *_) = glue_inputs()
    with pytest.raises(ValueError, match="contiguous channel"):
        ada_norm(x.transpose(1, 2).contiguous().transpose(1, 2), shift, scale, backend="triton")
    with pytest.raises(ValueError, match="frames"):
        ada_norm(x, shift[:, :2], scale[:, :2], backend="triton")  # 15 tokens do not split into 2 frames
    with pytest.raises(ValueError, match="y must have shape"):
        gated_residual(x, y[:, :-1], gate, backend="triton")
    with pytest.raises(ValueError, match="gate must have shape"):
        silu_gate(y, y[:, :-1], backend="triton")


def test_merge_heads_transposes_the_attention_output():
    o = torch.randn(2, 3, 37, 24)  # (B, H, N, D) as SDPA lays it out
    view = o.transpose(1, 2)  # (B, N, H, D)
    merged = merge_heads(view, backend="triton")
    assert merged.is_contiguous() and merged.shape == (2, 37, 72)
    torch.testing.assert_close(merged, view.reshape(2, 37, 72), rtol=0, atol=0)
