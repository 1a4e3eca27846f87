"""Streaming causal LTX-2 decode (camrender.render.decode): chunked frames equal a whole-clip causal decode."""
import pytest
import torch

from camrender.model.stage1.segments import segment_bounds
from camrender.model.stage1.tiny import build_tiny_vae
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames, video_frames_for_latents


@pytest.fixture(scope="module")
def vae():
    return build_tiny_vae(latent_channels=8, seed=0)


@pytest.fixture(scope="module")
def clip(vae):
    """Normalised latents (1, 8, 8, 2, 3) and their whole-clip causal decode (1, 3, 57, 16, 24)."""
    latents = torch.randn(1, 8, 8, 2, 3, generator=torch.Generator().manual_seed(0))
    mean = vae.latents_mean.view(1, -1, 1, 1, 1)
    std = vae.latents_std.view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(latents / vae.config.scaling_factor * std + mean, causal=True, return_dict=False)[0]
    return latents, video


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("segment_frames,max_frames", [(3, None), (1, None), (3, 1), (3, 2)])
def test_streamed_decode_equals_whole_clip_causal_decode(vae, clip, segment_frames, max_frames, channels_last):
    latents, whole = clip
    # max_frames: each chunk in pieces; channels_last: the convs on (N, T, H, W, C) activations
    decoder = CausalStreamDecoder(vae, max_frames=max_frames, channels_last=channels_last)
    chunks = []
    for start, stop in segment_bounds(latents.shape[2], segment_frames):
        chunk = decoder.decode(latents[:, :, start:stop])
        assert chunk.shape[2] == video_frames_for_latents(start, stop)
        chunks.append(chunk)
    streamed = torch.cat(chunks, dim=2)
    assert streamed.shape == whole.shape == (1, 3, 57, 16, 24)
    torch.testing.assert_close(streamed, whole, atol=1e-5, rtol=1e-5)
    # The decoder's own modules are untouched afterwards: a plain decode still works.
    assert all("forward" not in vars(m) for m in vae.decoder.modules())


@pytest.mark.parametrize("channels_last", [False, True])
def test_decoder_state_continues_the_stream(vae, clip, channels_last):
    """`state()` after a chunk holds each conv's last input frames without the reflected borders the decoder keeps
    with them; a fresh decoder that loads it decodes the next chunks as the first one goes on to."""
    latents, _ = clip
    going = CausalStreamDecoder(vae, channels_last=channels_last)
    going.decode(latents[:, :, :4])
    state = going.state()
    for conv, tail in zip(going._convs, state["tails"]):
        assert tail.shape[2] == conv.kernel_size[0] - 1
    assert {tuple(t.shape[3:]) for t in state["tails"]} == {(2, 3), (4, 6), (8, 12), (16, 24)}  # frames, no border
    resumed = CausalStreamDecoder(vae, channels_last=channels_last)
    resumed.load_state(state)
    assert all(torch.equal(a, b) for a, b in zip(resumed.state()["tails"], state["tails"]))  # saved again as loaded
    for start, stop in ((4, 6), (6, 8)):
        assert torch.equal(resumed.decode(latents[:, :, start:stop]), going.decode(latents[:, :, start:stop]))


@pytest.mark.parametrize("channels_last", [False, True])
def test_streamed_decode_of_zero_padded_convs_equals_whole_clip(channels_last):
    """The decoder's convs in another spatial padding mode (zeros; the LTX-2 decoder's own is reflect): each streamed
    conv pads its input as the conv module does."""
    vae = build_tiny_vae(latent_channels=8, seed=1)
    for conv in vae.decoder.modules():
        if isinstance(conv, torch.nn.Conv3d):
            conv.padding_mode = "zeros"
    latents = torch.randn(1, 8, 7, 2, 3, generator=torch.Generator().manual_seed(1))
    mean, std = vae.latents_mean.view(1, -1, 1, 1, 1), vae.latents_std.view(1, -1, 1, 1, 1)
    with torch.no_grad():
        whole = vae.decode(latents / vae.config.scaling_factor * std + mean, causal=True, return_dict=False)[0]
        decoder = CausalStreamDecoder(vae, channels_last=channels_last)
        streamed = torch.cat([decoder.decode(latents[:, :, start:stop])
                              for start, stop in segment_bounds(latents.shape[2], 3)], dim=2)
    torch.testing.assert_close(streamed, whole, atol=1e-5, rtol=1e-5)


def test_chunks_decoded_independently_differ(vae, clip):
    """Without the carried conv context the second chunk's frames are wrong (the test above can fail)."""
    latents, whole = clip
    mean = vae.latents_mean.view(1, -1, 1, 1, 1)
    std = vae.latents_std.view(1, -1, 1, 1, 1)
    with torch.no_grad():
        alone = vae.decode(latents[:, :, 4:] / vae.config.scaling_factor * std + mean, causal=True,
                           return_dict=False)[0]
    assert (alone[:, :, -24:] - whole[:, :, -24:]).abs().max() > 1e-3


def test_uint8_frames_layout():
    video = torch.tensor([-1.0, 0.0, 1.0]).view(1, 3, 1, 1, 1).expand(1, 3, 2, 2, 4)
    frames = to_uint8_frames(video)
    assert frames.shape == (2, 2, 4, 3) and frames.dtype.name == "uint8"
    assert frames[0, 0, 0].tolist() == [0, 128, 255]
    assert video_frames_for_latents(0, 4) == 25 and video_frames_for_latents(4, 7) == 24


@pytest.mark.parametrize("shape, pad", [((1, 3, 2, 5, 7), (1, 1)), ((2, 4, 3, 6, 4), (2, 1)), ((1, 2, 1, 3, 3), (1, 2))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_reflect_borders_equal_reflect_pad(shape, pad, channels_last):
    """The streaming decoder's conv input, its interior written and its borders reflected in place, equals
    F.pad(mode="reflect") of the interior (what a reflect-mode Conv3d pads its input with)."""
    import torch.nn.functional as F

    from camrender.render.decode import reflect_borders

    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    expected = F.pad(x, (pad[1], pad[1], pad[0], pad[0], 0, 0), mode="reflect")
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    padded = torch.full(expected.shape, float("nan")).contiguous(memory_format=layout)
    padded[..., pad[0]:pad[0] + shape[3], pad[1]:pad[1] + shape[4]] = x
    assert reflect_borders(padded, *pad) is padded
    assert torch.equal(padded, expected)


def test_channels_last_decode_feeds_every_conv_channels_last(vae, clip, monkeypatch):
    """With channels_last every 3-d conv of the decoder gets a channels-last input and kernel (no layout
    conversion inside the conv), the conv tails it carries are channels-last too, and the norms run fused
    (kernels.rms_silu; the frames are checked in the test above)."""
    import torch.nn.functional as F

    latents, _ = clip
    layouts = []
    conv3d = F.conv3d

    def recording(input, weight, *args, **kwargs):
        layouts.append((input.is_contiguous(memory_format=torch.channels_last_3d),
                        weight.is_contiguous(memory_format=torch.channels_last_3d)))
        return conv3d(input, weight, *args, **kwargs)

    monkeypatch.setattr(F, "conv3d", recording)
    decoder = CausalStreamDecoder(vae, channels_last=True)
    decoder.decode(latents[:, :, :4])
    decoder.decode(latents[:, :, 4:7])
    assert len(layouts) >= 2 * len(decoder._convs) and all(a and b for a, b in layouts), layouts
    assert decoder._fusable and decoder._fuse_head  # every norm -> SiLU of the tiny decoder ran fused
    assert all(t.is_contiguous(memory_format=torch.channels_last_3d) for t in decoder.state()["tails"])
