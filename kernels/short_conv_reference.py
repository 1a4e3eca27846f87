"""Plain PyTorch (fp32) reference of `kernels.short_conv.short_conv`, the bidirectional depthwise temporal
convolution; same arguments (the causal half's left context in as the initial state, the raw frames the next
segment's causal half reads out as the final state, as segment mode carries them).
"""
import torch


def short_conv_ref(x, weight, num_frames, *, initial_state=None, output_final_state=False):
    """Bidirectional depthwise temporal convolution (kernel K over T, spatial axis in the batch).

    y[t] = sum_j w_j x[t-K+1+j] + sum_j w_j x[t+K-1-j] - w_{K-1} x[t], zero outside the clip,
    which equals diffusers' `SanaWMTemporalShortConvolution`.

    Args:
        x: (B, N, C) with N = num_frames * S (any strides).
        weight: (C, 1, K) or (C, K) conv weight.
        num_frames: T.
        initial_state: optional (B, F*S, C), F <= K-1, raw input of the F frames just before x
            (oldest first, the left context). The causal half reads it instead of zeros (segment mode); the
            anti-causal half stays inside x. None gives the plain bidirectional form.
        output_final_state: also return the left context of the next segment (`short_conv_state`).

    Returns:
        (out (B, N, C) in x.dtype, final_state (B, F'*S, C) or None unless output_final_state).
    """
    batch, tokens, channels = x.shape
    frames = num_frames
    spatial = tokens // frames
    w = weight.reshape(channels, -1).float()
    ksize = w.shape[1]
    xf = x.float().reshape(batch, frames, spatial, channels)
    left = xf.new_zeros(batch, ksize - 1, spatial, channels)
    if initial_state is not None and initial_state.shape[1] > 0:
        ctx = initial_state.float().reshape(batch, -1, spatial, channels)
        left[:, ksize - 1 - ctx.shape[1]:] = ctx
    right = xf.new_zeros(batch, ksize - 1, spatial, channels)
    padded = torch.cat([left, xf, right], dim=1)  # frame t of x sits at t + K - 1
    out = -w[:, ksize - 1] * xf
    for j in range(ksize):
        causal = padded[:, j:j + frames]
        anti = padded[:, 2 * (ksize - 1) - j:2 * (ksize - 1) - j + frames]
        out = out + w[:, j] * (causal + anti)
    final = short_conv_state(x, num_frames, initial_state, ksize - 1) if output_final_state else None
    return out.reshape(batch, tokens, channels).to(x.dtype), final


def short_conv_state(x, num_frames, initial_state, frames):
    """The left context after x: the raw input of the last `frames` (K - 1) frames of `initial_state` then x.

    Args:
        x: (B, N, C) the segment's raw input; initial_state: the left context handed to it (B, F*S, C), or None.

    Returns:
        (B, F'*S, C), F' = min(frames, the frames of both), a contiguous copy in x's dtype.
    """
    spatial = x.shape[1] // num_frames
    seq = x if initial_state is None else torch.cat([initial_state, x], dim=1)
    keep = min(frames, seq.shape[1] // spatial)
    return seq[:, seq.shape[1] - keep * spatial:].contiguous()
