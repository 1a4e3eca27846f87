"""Plain PyTorch reference of `kernels.rms_silu.rms_silu`: the LTX-2 VAE decoder's per-position RMS norm
over channels followed by SiLU (diffusers' `PerChannelRMSNorm` then `nn.SiLU`), fp32 math rounded to the
input's dtype where the stock ops write a tensor.
"""
import torch


def rms_silu_ref(x, eps=1e-8, bias=None):
    """x (B, C, T, H, W), any memory layout -> silu(x / sqrt(mean(x^2 over C) + eps)), x's shape and dtype;
    bias (C,) or None: added to x first (a conv's bias, which stock adds as a pass of its own, rounded).

    The stock sequence rounds after x^2, the mean (an fp32 sum times 1 / C), + eps, the sqrt, the division
    and the SiLU; so does this."""
    def rounded(values):
        return values.to(x.dtype).float()

    wide = x.float() if bias is None else rounded(x.float() + bias.float().view(1, -1, 1, 1, 1))
    mean = rounded(rounded(wide * wide).sum(dim=1, keepdim=True) * (1.0 / x.shape[1]))
    rms = rounded(torch.sqrt(rounded(mean + eps)))
    y = rounded(wide / rms)
    return (y / (1.0 + torch.exp(-y))).to(x.dtype)
