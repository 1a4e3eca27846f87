"""`kernels.gdn_gates` (the GDN block's beta and decay in three launches) against its PyTorch reference, in the
Triton interpreter: bf16 (the release's dtype, beta to the bit), a frame of more than 64 token tiles (the mean's
sums read in two passes), biases left out, and the argument checks. The table of kernel cases covers the rest."""
import pytest
import torch

from camrender.kernels.gdn_gates import gdn_gates
from camrender.kernels.gdn_gates_reference import gdn_gates_ref


def _inputs(batch, frames, spatial, channels, heads, dtype, biases=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames * spatial, channels, generator=gen).to(dtype)
    weights = [(torch.randn(heads, channels, generator=gen) * scale * channels ** -0.5).to(dtype) for scale in (1, 4)]
    bias = [torch.randn(heads, generator=gen).to(dtype) if biases else None for _ in range(2)]
    rate, dt_bias = -3 * torch.rand(heads, generator=gen), torch.randn(heads, generator=gen)
    return x, frames, weights[0], bias[0], weights[1], bias[1], rate, dt_bias


@pytest.mark.parametrize("batch, frames, spatial, channels, heads, dtype, biases", [
    (1, 3, 40, 72, 20, torch.bfloat16, True),  # the release's 20 heads, bf16
    (2, 2, 1100, 24, 3, torch.float32, True),  # 69 tiles of 16 tokens: two passes over the sums
    (1, 1, 7, 130, 17, torch.float32, False),  # no biases; channels past two 64-wide blocks, 17 heads padded to 32
])
def test_gates_match_the_reference(batch, frames, spatial, channels, heads, dtype, biases):
    args = _inputs(batch, frames, spatial, channels, heads, dtype, biases)
    beta, decay = gdn_gates(*args, backend="triton")
    want_beta, want_decay = gdn_gates_ref(*args)
    assert beta.shape == want_beta.shape == (batch, heads, frames, spatial) and beta.dtype == dtype
    assert decay.shape == want_decay.shape == (batch, heads, frames) and decay.dtype == torch.float32
    if dtype == torch.bfloat16:  # the logits rounded to bf16, then their sigmoid, as stock: a logit summed in
        # another order may round the other way, one bf16 step of beta at most
        assert (beta.float() - want_beta.float()).abs().max() <= 2.0 ** -8
        assert (beta != want_beta).float().mean() < 0.01
    else:
        torch.testing.assert_close(beta, want_beta, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(decay, want_decay, rtol=1e-5, atol=1e-6)


def test_gates_reject_bad_shapes():
    x, frames, beta_weight, beta_bias, gate_weight, gate_bias, rate, dt_bias = _inputs(1, 2, 5, 8, 2, torch.float32)
    with pytest.raises(ValueError, match="frames"):
        gdn_gates(x, 3, beta_weight, beta_bias, gate_weight, gate_bias, rate, dt_bias)
    with pytest.raises(ValueError, match="gate_weight"):
        gdn_gates(x, frames, beta_weight, beta_bias, gate_weight[:, :4], gate_bias, rate, dt_bias)
    with pytest.raises(ValueError, match="dt_bias"):
        gdn_gates(x, frames, beta_weight, beta_bias, gate_weight, gate_bias, rate, dt_bias[:1])
