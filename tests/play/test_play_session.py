"""What a flight's offline render relies on: the noise of a longer draw (`RenderRequest.noise_frames`)."""
import pytest
import torch

from camrender.api.requests import plan_request
from camrender.render.load_settings import LoadSettings
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
    tiny = LoadSettings(model="tiny")
    assert plan_request(tiny, "w-48", frames=49).noise_frames is None
    assert plan_request(tiny, "w-48", frames=49, noise_frames=21).noise_frames == 21
    with pytest.raises(CamrenderError, match="at least the clip's 7 latent frames"):
        plan_request(tiny, "w-48", frames=49, noise_frames=6)


def test_the_playback_clock_moves_back_by_each_stall_of_the_page():
    """A page playing 16 fps shows frame i at the later of its arrival and frame i-1's turn + 1/16: a late segment
    (a slow first segment, graph captures) moves every later turn back, so pacing does not keep that stall's worth
    of extra video buffered for the rest of the flight."""
    from camrender.play.session import PlaybackClock

    clock = PlaybackClock(16.0)
    clock.arrived(0, 10.0)  # the first segment: frames 0-24 from t = 10
    assert clock.turn(0) == 10.0 and clock.turn(24) == 11.5
    clock.arrived(25, 11.0)  # early: no stall, the turns stay
    assert clock.turn(25) == 10.0 + 25 / 16
    clock.arrived(49, 14.0)  # frame 49's turn was 13.0625: the page waited 0.9375 s
    assert clock.turn(49) == 14.0 and clock.turn(73) == 15.5
    clock.arrived(73, 15.5)  # just in time
    assert clock.turn(73) == 15.5
