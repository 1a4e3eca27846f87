"""What a flight's offline render relies on: the noise of a longer draw (`RenderRequest.noise_frames`)."""
import pytest
import torch

from camrender.cli.preflight import check_noise_frames
from camrender.errors import CamrenderError
from camrender.render.inputs import initial_latents


def test_a_longer_noise_draw_keeps_its_first_frames_and_the_default_is_unchanged():
    first = torch.zeros(1, 4, 1, 2, 3)
    short = initial_latents(first, 5, 2, 3, seed=7, device="cpu", dtype=torch.float32)
    again = initial_latents(first, 5, 2, 3, seed=7, device="cpu", dtype=torch.float32, drawn_frames=5)
    long = initial_latents(first, 11, 2, 3, seed=7, device="cpu", dtype=torch.float32)
    cut = initial_latents(first, 5, 2, 3, seed=7, device="cpu", dtype=torch.float32, drawn_frames=11)
    assert torch.equal(short, again) and torch.equal(cut, long[:, :, :5]) and not torch.equal(cut, short)
    with pytest.raises(CamrenderError, match="shorter than the clip"):
        initial_latents(first, 5, 2, 3, seed=7, device="cpu", dtype=torch.float32, drawn_frames=4)
    assert check_noise_frames(None, 49) is None and check_noise_frames(21, 49) == 21
    with pytest.raises(CamrenderError, match="at least the clip's 7 latent frames"):
        check_noise_frames(6, 49)
