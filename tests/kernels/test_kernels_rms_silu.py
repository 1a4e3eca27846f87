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
