"""Plain PyTorch (fp32) reference of `kernels.short_conv.short_conv`, the bidirectional depthwise temporal
convolution; same arguments (the causal half's left context in, as segment mode carries it).
"""
import torch


def short_conv_ref(x, weight, num_frames, *, left_context=None):
    """Bidirectional depthwise temporal convolution (kernel K over T, spatial axis in the batch).

    y[t] = sum_j w_j x[t-K+1+j] + sum_j w_j x[t+K-1-j] - w_{K-1} x[t], zero outside the clip,
    which equals diffusers' `SanaWMTemporalShortConvolution`.

    Args:
        x: (B, N, C) with N = num_frames * S (any strides).
        weight: (C, 1, K) or (C, K) conv weight.
        num_frames: T.
        left_context: optional (B, F*S, C), F <= K-1, raw input of the F frames just before x
            (oldest first). The causal half reads it instead of zeros (segment mode); the
            anti-causal half stays inside x. None gives the plain bidirectional form.

    Returns:
        (B, N, C) in x.dtype.
    """
    batch, tokens, channels = x.shape
    frames = num_frames
    spatial = tokens // frames
    w = weight.reshape(channels, -1).float()
    ksize = w.shape[1]
    xf = x.float().reshape(batch, frames, spatial, channels)
    left = xf.new_zeros(batch, ksize - 1, spatial, channels)
    if left_context is not None and left_context.shape[1] > 0:
        ctx = left_context.float().reshape(batch, -1, spatial, channels)
        left[:, ksize - 1 - ctx.shape[1]:] = ctx
    right = xf.new_zeros(batch, ksize - 1, spatial, channels)
    padded = torch.cat([left, xf, right], dim=1)  # frame t of x sits at t + K - 1
    out = -w[:, ksize - 1] * xf
    for j in range(ksize):
        causal = padded[:, j:j + frames]
        anti = padded[:, 2 * (ksize - 1) - j:2 * (ksize - 1) - j + frames]
        out = out + w[:, j] * (causal + anti)
    return out.reshape(batch, tokens, channels).to(x.dtype)
