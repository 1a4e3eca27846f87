"""Plain PyTorch reference of `kernels.bias_residual.bias_residual`: the end of an LTX-2 decoder resnet, its second
conv's bias and the residual added as stock adds them (two tensors written, each rounded to the input's dtype).
"""


def bias_residual_ref(x, bias, residual):
    """x, residual (B, C, T, H, W), bias (C,) -> (x + bias) + residual, each sum rounded to x's dtype."""
    with_bias = (x.float() + bias.float().view(1, -1, 1, 1, 1)).to(x.dtype)
    return (with_bias.float() + residual.float()).to(x.dtype)
