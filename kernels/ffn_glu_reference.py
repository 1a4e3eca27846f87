"""Plain PyTorch (fp32) reference of `kernels.ffn_glu.glu_depthwise`, the GLU depthwise stage of the FFN.
"""
import torch.nn.functional as F


def glu_depthwise_ref(h, weight, bias, height, width):
    """Plain PyTorch reference of `glu_depthwise` (its arguments less the launch knobs).

    fp32: a = silu(h); y = depthwise conv of a (padding k//2) + bias over each (H, W) image;
    value, gate = y[..., :Hd], y[..., Hd:]; returns value * silu(gate) as (F, H*W, Hd) in h's dtype.
    """
    frames, _, channels = h.shape
    ksize = weight.shape[-1]
    # (F, H, W, 2Hd) viewed as (F, 2Hd, H, W): channels-last memory, no copy before the conv.
    act = F.silu(h.float()).reshape(frames, height, width, channels).permute(0, 3, 1, 2)
    conv = F.conv2d(act, weight.float(), None if bias is None else bias.float(), padding=ksize // 2,
                    groups=channels)
    value, gate = conv.permute(0, 2, 3, 1).reshape(frames, height * width, channels).chunk(2, dim=-1)
    return (value * F.silu(gate)).to(h.dtype)
