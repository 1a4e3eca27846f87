"""Fused temporal short convolution (kernels.short_conv) against diffusers' module (CPU interpreter)."""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm import SanaWMTemporalShortConvolution

from camrender.kernels.short_conv_reference import short_conv_ref
from camrender.kernels.short_conv import short_conv
from helpers import rel


def _module(channels, seed):
    torch.manual_seed(seed)
    module = SanaWMTemporalShortConvolution(channels, 4)
    torch.nn.init.normal_(module.weight)
    return module


def test_bidirectional_reads_qkv_slice_in_place():
    batch, frames, spatial, channels = 2, 5, 33, 40  # S > tile, C not a multiple of the tile
    module = _module(channels, 0)
    qkv = torch.randn(batch, frames * spatial, 3 * channels)
    key = qkv[..., channels:2 * channels]  # strided view, as in the block
    with torch.no_grad():
        want = module(key, frames)
        got, no_state = short_conv(key, module.weight, frames)
        ref, _ = short_conv_ref(key, module.weight, frames)
    assert no_state is None
    assert got.shape == want.shape and got.is_contiguous()
    assert rel(got, want) < 1e-6
    assert rel(ref, want) < 1e-6


def test_short_clips_and_bf16():
    module = _module(16, 1)
    for frames in (1, 2, 3):  # shorter than the kernel: every tap past either end is zero
        x = torch.randn(1, frames * 4, 16)
        with torch.no_grad():
            assert rel(short_conv(x, module.weight, frames)[0], module(x, frames)) < 1e-6
    x = torch.randn(2, 4 * 6, 16).bfloat16()
    with torch.no_grad():
        got, _ = short_conv(x, module.weight, 4)
        want, _ = short_conv_ref(x.float(), module.weight, 4)
    assert got.dtype == torch.bfloat16 and rel(got, want) < 1e-2


def test_cached_causal_form_matches_dense_segment_rule():
    # Segment mode: the causal half sees up to 3 cached frames before the segment (the initial state, the final
    # state of the segment before), the anti-causal half stays inside the segment. Dense reference from diffusers'
    # own causal conv.
    batch, frames, spatial, channels = 2, 7, 5, 24
    module = _module(channels, 2)
    x = torch.randn(batch, frames * spatial, channels)

    def frame_major(t):
        return t.reshape(batch, -1, spatial, channels).permute(0, 2, 1, 3).reshape(batch * spatial, -1, channels)

    def back(t, count):
        return t.reshape(batch, spatial, count, channels).permute(0, 2, 1, 3).reshape(batch, count * spatial, channels)

    w_last = module.weight[:, 0, -1]
    with torch.no_grad():
        causal_full = module._causal_conv(frame_major(x))
        previous = None
        for start, stop in ((0, 1), (1, 3), (3, 7)):  # contexts of 0, 1 and 3 frames
            seg = x[:, start * spatial:stop * spatial]
            count = stop - start
            anti = module._causal_conv(frame_major(seg).flip(1)).flip(1)
            want = back(causal_full[:, start:stop] + anti, count) - seg * w_last
            got, state = short_conv(seg, module.weight, count, initial_state=previous, output_final_state=True)
            ref, ref_state = short_conv_ref(seg, module.weight, count, initial_state=previous,
                                            output_final_state=True)
            assert rel(got, want) < 1e-6, (start, stop)
            assert rel(ref, want) < 1e-6, (start, stop)
            # the raw input of the last 3 frames seen so far
            assert torch.equal(state, x[:, max(0, stop - 3) * spatial:stop * spatial])
            assert torch.equal(ref_state, state) and state.is_contiguous()
            previous = state


def test_bf16_weight_is_widened_in_the_kernel():
    """The kernel reads the module's bf16 weight in place and widens it itself: the same bits as an fp32 copy."""
    module = _module(24, 3)
    weight = module.weight.detach().bfloat16()
    x = torch.randn(1, 5 * 6, 24).bfloat16()
    left = torch.randn(1, 2 * 6, 24).bfloat16()
    got, _ = short_conv(x, weight, 5, initial_state=left)
    want, _ = short_conv(x, weight.float(), 5, initial_state=left)
    assert torch.equal(got, want)


def test_an_initial_state_of_more_frames_than_the_causal_half_reads_is_refused():
    module = _module(8, 4)  # K = 4: the causal half reads 3 frames before x
    x = torch.randn(1, 2 * 5, 8)
    for backend in ("triton", "torch"):
        for tokens in (4 * 5, 2 * 5 + 1):  # four frames; a frame and a part
            with pytest.raises(ValueError, match="at most 3 whole frames of 5 tokens"):
                short_conv(x, module.weight, 2, initial_state=torch.randn(1, tokens, 8), backend=backend)
