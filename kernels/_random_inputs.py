"""Seeded random inputs of the kernel cases (kernels/cases.py): activations, rigid transforms, RoPE
tables, camera rays and segment cuts, drawn on the CPU and moved so every device sees the same values."""
import math

import torch


class Draw:
    """Seeded draws on the CPU, moved to `device`; `dtype` for activations, float32 otherwise."""

    def __init__(self, seed, device, dtype):
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.device, self.dtype = device, dtype

    def randn(self, shape, scale=1.0, *, activation=True):
        x = torch.randn(shape, generator=self.generator) * scale
        return x.to(self.device, self.dtype if activation else torch.float32)

    def rand(self, shape, low=0.0, high=1.0, *, activation=True):
        x = low + (high - low) * torch.rand(shape, generator=self.generator)
        return x.to(self.device, self.dtype if activation else torch.float32)

    def se3(self, count):
        """(count, 4, 4) random rigid transforms (rotation from QR, det +1; translation ~ N(0, 1))."""
        q, r = torch.linalg.qr(torch.randn(count, 3, 3, generator=self.generator))
        q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
        q[torch.det(q) < 0, :, 0] *= -1
        m = torch.eye(4).repeat(count, 1, 1)
        m[:, :3, :3] = q
        m[:, :3, 3] = torch.randn(count, 3, generator=self.generator)
        return m.to(self.device)

    def rope(self, tokens, pairs):
        """Complex (1, 1, N, pairs) unit rotations at uniform random angles (a RoPE table)."""
        angles = torch.rand(1, 1, tokens, pairs, generator=self.generator) * 2 * math.pi
        return torch.polar(torch.ones_like(angles), angles).to(self.device)

    def rays(self, batch, tokens, dim):
        """(P, P_T, P_inv, rope_cam) shaped like diffusers' `_prepare_ucpe_ray_transforms` output."""
        p = self.se3(batch * tokens).reshape(batch, tokens, 4, 4)
        return p, p.transpose(-1, -2).contiguous(), torch.linalg.inv(p).contiguous(), self.rope(tokens, dim // 4)


def middle_segment_start(frames, device):
    """Bool (T,) segment starts with one cut in the middle (the reverse scan restarts there)."""
    starts = torch.zeros(frames, dtype=torch.bool, device=device)
    starts[frames // 2] = True
    return starts
