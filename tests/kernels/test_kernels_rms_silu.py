"""The VAE decoder's fused RMS norm + SiLU (kernels/rms_silu.py) against diffusers' stock modules, under the
Triton interpreter: the same bits in bf16 (it rounds where stock rounds), fp32 within the sum's order."""
import pytest
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import PerChannelRMSNorm

from camrender.kernels.rms_silu import rms_silu


@pytest.mark.parametrize("layout", ["channels_last", "ncdhw"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_silu_equals_stock_norm_then_silu(dtype, layout):
    x = torch.randn(2, 40, 3, 4, 5, generator=torch.Generator().manual_seed(1)) * 3  # C = 40: a partial tile
    x = x.to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    stock = F.silu(PerChannelRMSNorm()(x))
    fused = rms_silu(x, backend="triton")
    assert fused.shape == x.shape and fused.dtype == dtype
    assert fused.is_contiguous(memory_format=torch.channels_last_3d)
    if dtype == torch.bfloat16:
        assert torch.equal(fused, stock)
    else:
        torch.testing.assert_close(fused, stock, rtol=2e-6, atol=2e-6)
    assert not torch.equal(fused, F.silu(x))  # the norm did something


def test_rms_silu_rejects_other_shapes():
    with pytest.raises(ValueError, match="x must have shape"):
        rms_silu(torch.zeros(2, 3, 4), backend="triton")


@pytest.mark.parametrize("batch", [1, 2])
def test_rms_silu_adds_the_conv_bias_and_writes_into_a_padded_view(batch):
    """bias: the conv's bias that stock adds in a pass of its own (rounded), taken in the same pass; out: the
    interior of a padded channels-last buffer, written there and nowhere else (each position's place in it taken
    apart from the row index, batch included). The same bits as stock in bf16."""
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(batch, 40, 3, 4, 5, generator=generator) * 3).bfloat16()
    x = x.contiguous(memory_format=torch.channels_last_3d)
    bias = torch.randn(40, generator=generator).bfloat16()
    stock = F.silu(PerChannelRMSNorm()(x + bias.view(1, -1, 1, 1, 1)))
    padded = torch.full((batch, 40, 5, 6, 7), 7.0, dtype=torch.bfloat16)
    padded = padded.contiguous(memory_format=torch.channels_last_3d)
    interior = padded[:, :, 2:, 1:5, 1:6]
    returned = rms_silu(x, bias=bias, out=interior, backend="triton")
    assert returned is interior and torch.equal(interior, stock)
    untouched = torch.ones_like(padded, dtype=torch.bool)
    untouched[:, :, 2:, 1:5, 1:6] = False
    assert (padded[untouched] == 7.0).all()
    assert not torch.equal(stock, F.silu(PerChannelRMSNorm()(x)))  # the bias did something
    assert torch.equal(rms_silu(x, bias=bias, backend="torch"), stock)  # the reference


def test_rms_silu_refuses_2_to_the_31_positions_before_copying_anything():
    """The kernel takes a position's place apart in int32: 2**31 positions (here on the meta device, no memory)
    are refused with one line before any layout copy or launch."""
    x = torch.empty(1, 8, 2**15, 2**8, 2**8, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2147483648 positions"):
        rms_silu(x, backend="triton")


def test_rms_silu_rejects_an_out_with_strided_channels():
    x = torch.zeros(1, 4, 2, 3, 3)
    with pytest.raises(ValueError, match="unit channel stride"):
        rms_silu(x, out=torch.zeros(1, 4, 2, 3, 3), backend="triton")  # NCDHW: channels strided


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bias_residual_equals_stock_bias_then_residual(dtype):
    """The end of a decoder resnet: (conv output + bias) + residual in x's place, rounded as stock's two adds."""
    from camrender.kernels.bias_residual import bias_residual

    generator = torch.Generator().manual_seed(4)
    x = torch.randn(1, 40, 3, 4, 5, generator=generator).to(dtype).contiguous(memory_format=torch.channels_last_3d)
    bias = torch.randn(40, generator=generator).to(dtype)
    residual = torch.randn(1, 40, 3, 4, 5, generator=generator).to(dtype)  # NCDHW: laid out channels-last first
    stock = (x + bias.view(1, -1, 1, 1, 1)) + residual
    for backend in ("triton", "torch"):
        out = x.clone(memory_format=torch.channels_last_3d)
        assert bias_residual(out, bias, residual, backend=backend) is out
        assert torch.equal(out, stock), backend
    with pytest.raises(ValueError, match="channels-last"):
        bias_residual(x.contiguous(), bias, residual, backend="triton")
