"""kernels.block_glue: the single-pass adaLN glue against its references and against the stock
block's PyTorch ops (CPU, Triton interpreter from conftest)."""
import pytest
import torch

from camrender.kernels.block_glue import ada_norm, gated_residual, merge_heads, residual_ada_norm, silu_gate
from camrender.kernels.block_glue_reference import ada_norm_ref, gated_residual_ref, silu_gate_ref


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_references_equal_the_stock_block_ops(dtype):
    x, y, (shift, scale, gate, *_) = glue_inputs(dtype=dtype)
    z = torch.randn_like(y)
    assert torch.equal(ada_norm_ref(x, shift, scale), stock_modulate(x, shift, scale))
    per_frame = (2, 3, 5, 40)
    stock = x + (gate[:, :, None] * y.reshape(per_frame)).reshape(x.shape)
    assert torch.equal(gated_residual_ref(x, y, gate), stock)
    stock_ffn = x + (gate[:, :, None] * (y + z).reshape(per_frame)).reshape(x.shape)
    assert torch.equal(gated_residual_ref(x, y, gate, y2=z), stock_ffn)


def assert_rounds_like(out, ref, *, max_flips=0.0):
    """bf16: out equals ref bit for bit, except a fraction `max_flips` of elements one unit apart in
    the last place (an fp32 sum taken in another order landing on the other side of a rounding tie).
    fp32: equal up to fp32 rounding."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        return
    differ = out != ref
    assert differ.float().mean() <= max_flips, f"{int(differ.sum())} of {out.numel()} elements differ"
    if differ.any():
        ulp = torch.finfo(ref.dtype).eps * ref[differ].float().abs()
        assert ((out[differ].float() - ref[differ].float()).abs() <= ulp * 1.01).all()


@pytest.mark.parametrize("channels", [40, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_references(channels, dtype):
    """Each kernel rounds where the stock ops write a tensor: in bf16 the results equal the references
    (the stock op sequence) bit for bit; the LayerNorm's fp32 sums may tip a rare element by one ulp."""
    x, y, (shift, scale, gate, _, _, _) = glue_inputs(channels=channels, dtype=dtype)
    norm_flips = 1e-3

    out = ada_norm(x, shift, scale, eps=1e-6, backend="triton")
    assert out.is_contiguous()
    assert_rounds_like(out, ada_norm_ref(x, shift, scale), max_flips=norm_flips)

    updated, normed = residual_ada_norm(x, y, shift, scale, backend="triton")
    assert torch.equal(updated, x + y)
    assert_rounds_like(normed, ada_norm_ref(updated, shift, scale), max_flips=norm_flips)

    z, bias = torch.randn_like(y), torch.randn(channels).to(dtype)
    assert_rounds_like(gated_residual(x, y, gate, backend="triton"), gated_residual_ref(x, y, gate))
    assert_rounds_like(gated_residual(x, y, gate, y2=z, backend="triton"), gated_residual_ref(x, y, gate, z))
    assert_rounds_like(gated_residual(x, y, gate, extra=y[:1], backend="triton"),
                       gated_residual_ref(x, y, gate, extra=y[:1].expand_as(y)))
    plucker = gated_residual(x, y, gate, extra=z, extra_bias=bias, backend="triton")
    assert_rounds_like(plucker, gated_residual_ref(x, y, gate, extra=z, extra_bias=bias))
    assert_rounds_like(plucker, gated_residual_ref(x, y, gate) + (z + bias))  # the stock block's two adds

    a, b, g = y, z, torch.randn_like(y)
    assert_rounds_like(silu_gate(a, g, b=b, backend="triton"), silu_gate_ref(a, g, b), max_flips=1e-3)
    assert_rounds_like(silu_gate(a, g, backend="triton"), silu_gate_ref(a, g), max_flips=1e-3)


def test_bf16_glue_is_not_rounded_once():
    """The stock rounding points matter in bf16: rounding x + gate * (y + z) once gives other bits."""
    x, y, (_, _, gate, *_) = glue_inputs(dtype=torch.bfloat16)
    z = torch.randn_like(y)
    once = (x.float() + gate.float().repeat_interleave(5, 1) * (y.float() + z.float())).to(torch.bfloat16)
    assert not torch.equal(gated_residual(x, y, gate, y2=z, backend="triton"), once)


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
    with pytest.raises(ValueError, match="extra_bias"):
        gated_residual(x, y, gate, extra_bias=gate[0, 0], backend="triton")  # a bias without extra


def test_merge_heads_transposes_the_attention_output():
    o = torch.randn(2, 3, 37, 24)  # (B, H, N, D) as SDPA lays it out
    view = o.transpose(1, 2)  # (B, N, H, D)
    merged = merge_heads(view, backend="triton")
    assert merged.is_contiguous() and merged.shape == (2, 37, 72)
    torch.testing.assert_close(merged, view.reshape(2, 37, 72), rtol=0, atol=0)
