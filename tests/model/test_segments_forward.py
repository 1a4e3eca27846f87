"""Segment-by-segment forward of SanaWMTransformer3DModel (camrender.model.stage1.segments) on a tiny random model.

Anchors: one segment covering the clip equals the stock diffusers bidirectional forward; the
cached segment-by-segment forward equals the dense whole-sequence forward with the same
chunk-causal attention pattern (earlier segments at timestep 0).
"""
import math

import pytest
import torch

from camrender.model.stage1.patch import KernelSettings, patch_transformer
from camrender.model.stage1.segments import (
    SegmentCache,
    SegmentOptions,
    dense_reference_forward,
    segment_bounds,
    segment_forward,
)
from camrender.model.stage1.tiny import build_tiny_transformer

DIFFUSERS = SegmentOptions(softmax_scale="padded", gdn_camera_downscale=True, softmax_camera_downscale=True)
HEAD_DIM = 16  # tiny model: hidden 32, 2 heads; block 0 GDN, block 1 softmax


@pytest.fixture(scope="module")
def model():
    # full mode under diffusers' rules: the stock forward is the anchor
    return patch_transformer(build_tiny_transformer(seed=0), kernels="torch", recipe="bidirectional-diffusers")


def camera_inputs(batch, frames, height, width, seed=0):
    """Camera conditions (B, T, 20) of a turning, moving camera and random Plucker maps (B, 48, T, h, w)."""
    rows = []
    for f in range(frames):
        angle = 0.07 * f
        c2w = torch.eye(4)
        c2w[:3, :3] = torch.tensor(
            [[math.cos(angle), 0, math.sin(angle)], [0, 1, 0], [-math.sin(angle), 0, math.cos(angle)]]
        )
        c2w[:3, 3] = torch.tensor([0.1 * f, -0.05 * f, 0.2 * f])
        intrinsics = torch.tensor([0.9 * width, 0.9 * height, width / 2 - 0.3, height / 2 + 0.2])
        rows.append(torch.cat([c2w.flatten(), intrinsics]))
    conditions = torch.stack(rows)[None].repeat(batch, 1, 1)
    generator = torch.Generator().manual_seed(seed)
    return conditions, torch.randn(batch, 48, frames, height, width, generator=generator)


def model_inputs(batch, frames, height, width, seed=0):
    """Latents (B, 8, T, h, w), text (B, 1, 6, 32) and a text mask with two padding tokens."""
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, 8, frames, height, width, generator=generator)
    text = torch.randn(batch, 1, 6, 32, generator=generator)
    mask = torch.ones(batch, 6, dtype=torch.long)
    mask[:, -2:] = 0
    return latents, text, mask


def test_segment_bounds_follow_the_official_layout():
    """create_autoregressive_segments: the first chunk holds the image frame and absorbs F % 3."""
    assert segment_bounds(16) == [(0, 4), (4, 7), (7, 10), (10, 13), (13, 16)]
    assert segment_bounds(17) == [(0, 5), (5, 8), (8, 11), (11, 14), (14, 17)]
    assert segment_bounds(18) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18)]
    assert segment_bounds(4) == [(0, 4)]
    assert segment_bounds(5) == [(0, 5)]
    assert segment_bounds(6) == [(0, 3), (3, 6)]
    assert segment_bounds(7) == [(0, 4), (4, 7)]
    assert segment_bounds(5, 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert segment_bounds(3) == [(0, 3)] and segment_bounds(1) == [(0, 1)]
    with pytest.raises(ValueError):
        segment_bounds(0)


def test_segment_rope_rows_match_the_whole_table(model):
    """A segment's RoPE keeps absolute positions: rows of the whole-trajectory table (diffusers)."""
    from camrender.model.stage1.segments import prepare_conditioning

    frames, height, width = 9, 2, 3
    whole = model.rope((frames, height, width))
    text, mask = torch.zeros(1, 1, 2, 32), torch.ones(1, 2, dtype=torch.long)
    part = prepare_conditioning(model, (3, height, width), text, mask, frame_start=4).rope
    torch.testing.assert_close(part, whole[:, :, 4 * height * width:7 * height * width], rtol=0, atol=0)


def test_single_segment_equals_stock_bidirectional_forward(model):
    batch, frames, height, width = 2, 5, 3, 4
    latents, text, mask = model_inputs(batch, frames, height, width)
    conditions, plucker = camera_inputs(batch, frames, height, width)
    timestep = torch.tensor([[0, 500, 500, 500, 500], [0, 300.7, 300.7, 300.7, 300.7]])[:, None]
    with torch.no_grad():
        stock = model(latents, timestep, text, encoder_attention_mask=mask, camera_conditions=conditions,
                      chunk_plucker=plucker, return_dict=False)[0]
        ours = segment_forward(model, latents, timestep, text, mask, camera_conditions=conditions,
                               chunk_plucker=plucker, options=DIFFUSERS)
        head_scale = segment_forward(model, latents, timestep, text, mask, camera_conditions=conditions, chunk_plucker=plucker,
                                     options=SegmentOptions(softmax_scale="head", gdn_camera_downscale=True,
                                                            softmax_camera_downscale=True))
    assert ours.shape == stock.shape
    torch.testing.assert_close(ours, stock, atol=5e-4, rtol=1e-3)
    # The original code's camera scale, 1/sqrt(16) instead of diffusers' 1/sqrt(128), is a different model.
    assert (head_scale - stock).abs().max() > 1e-3


def run_segments(model, latents, text, mask, conditions, plucker, bounds, last_timestep, options):
    """Cache passes (timestep 0) on every segment but the last, then the last at `last_timestep`.

    Returns the outputs of every call, concatenated over frames, and the cache.
    """
    cache = SegmentCache.empty(model)
    outputs = []
    batch = latents.shape[0]
    for index, (start, stop) in enumerate(bounds):
        last = index == len(bounds) - 1
        timestep = torch.full((batch, 1, stop - start), float(last_timestep if last else 0))
        if start == 0:
            timestep[..., 0] = 0
        outputs.append(segment_forward(
            model, latents[:, :, start:stop], timestep, text, mask,
            camera_conditions=conditions[:, start:stop], chunk_plucker=plucker[:, :, start:stop],
            frame_start=start, cache=cache, write_cache=not last, options=options,
        ))
    return torch.cat(outputs, dim=2), cache


@pytest.mark.parametrize(
    "frames, segment_frames, cached_segments",
    [
        (4, 3, 2),  # 1 segment
        (7, 3, 2),  # 2 segments
        (11, 2, 4),  # 5 segments, no eviction (every segment stays cached)
        (11, 2, 1),  # 5 segments, softmax keys of old segments evicted; short-conv tail spans 2 segments
    ],
)
def test_cached_segments_equal_dense_reference(model, frames, segment_frames, cached_segments):
    batch, height, width = 2, 2, 3
    latents, text, mask = model_inputs(batch, frames, height, width, seed=1)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=1)
    bounds = segment_bounds(frames, segment_frames)
    options = SegmentOptions(cached_segments=cached_segments, sdpa_dtype=torch.float32)
    timestep = torch.zeros(batch, 1, frames)
    timestep[..., bounds[-1][0]:] = 700.0
    timestep[..., 0] = 0
    with torch.no_grad():
        dense = dense_reference_forward(model, latents, timestep, text, mask, segments=bounds,
                                        camera_conditions=conditions, chunk_plucker=plucker, options=options)
        cached, cache = run_segments(model, latents, text, mask, conditions, plucker, bounds, 700.0, options)
    torch.testing.assert_close(cached, dense, atol=2e-5, rtol=1e-5)
    if len(bounds) > 1:
        assert cache.next_frame == bounds[-1][0]
        softmax_cache = cache.blocks[1]
        assert len(softmax_cache.recent) == min(cached_segments, len(bounds) - 2)


def test_cache_and_eviction_change_the_result(model):
    """The caches carry information: dropping them, or evicting more, changes the last segment."""
    batch, frames, height, width = 1, 11, 2, 3
    latents, text, mask = model_inputs(batch, frames, height, width, seed=2)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=2)
    bounds = segment_bounds(frames, 2)
    start, stop = bounds[-1]
    timestep = torch.full((batch, 1, frames), 0.0)
    timestep[..., start:] = 700.0
    kwargs = dict(segments=bounds, camera_conditions=conditions, chunk_plucker=plucker)
    with torch.no_grad():
        keep_all = dense_reference_forward(model, latents, timestep, text, mask,
                                           options=SegmentOptions(cached_segments=4), **kwargs)
        evict = dense_reference_forward(model, latents, timestep, text, mask,
                                        options=SegmentOptions(cached_segments=1), **kwargs)
        alone = segment_forward(model, latents[:, :, start:stop], timestep[..., start:stop], text, mask,
                                camera_conditions=conditions[:, start:stop], chunk_plucker=plucker[:, :, start:stop],
                                frame_start=start)
    assert (keep_all[:, :, start:] - evict[:, :, start:]).abs().max() > 1e-3
    assert (keep_all[:, :, start:] - alone).abs().max() > 1e-3
    # Segments 0-2 see the same keys either way.
    torch.testing.assert_close(keep_all[:, :, :bounds[3][0]], evict[:, :, :bounds[3][0]])


def test_denoising_passes_only_read_the_cache(model):
    batch, frames, height, width = 1, 7, 2, 2
    latents, text, mask = model_inputs(batch, frames, height, width, seed=3)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=3)
    cache = SegmentCache.empty(model)
    with torch.no_grad():
        segment_forward(model, latents[:, :, :4], torch.zeros(1, 1, 4), text, mask,
                        camera_conditions=conditions[:, :4], chunk_plucker=plucker[:, :, :4],
                        cache=cache, write_cache=True)
        snapshot = [dict(vars(block)) for block in cache.blocks]
        saved = [{k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)} for s in snapshot]
        segment_forward(model, latents[:, :, 4:], torch.full((1, 1, 3), 900.0), text, mask,
                        camera_conditions=conditions[:, 4:], chunk_plucker=plucker[:, :, 4:],
                        frame_start=4, cache=cache)
    assert cache.next_frame == 4
    for block, before, values in zip(cache.blocks, snapshot, saved):
        for name, value in vars(block).items():
            assert value is before[name] if not isinstance(value, list) else value == before[name]
        for name, tensor in values.items():
            torch.testing.assert_close(getattr(block, name), tensor, rtol=0, atol=0)
    gdn = cache.blocks[0]
    assert gdn.kv_state.shape == (1, 2, HEAD_DIM, HEAD_DIM) and gdn.z_state.shape == (1, 2, HEAD_DIM, 1)
    assert gdn.cam_state.shape == (1, 2, HEAD_DIM, HEAD_DIM) and gdn.key_tail.shape == (1, 3, 4, 32)
    with pytest.raises(ValueError, match="expects latent frame 4"):
        segment_forward(model, latents[:, :, 5:], torch.zeros(1, 1, 2), text, mask, frame_start=5, cache=cache)


def test_segment_mode_needs_a_patched_model():
    latents, text, mask = model_inputs(1, 2, 2, 2)
    with pytest.raises(ValueError, match="patch the transformer first"):
        segment_forward(build_tiny_transformer(seed=0), latents, torch.zeros(1, 1, 2), text, mask)


def test_fused_kernels_pass_state_like_the_reference(model):
    """A model patched with backend "triton" (Triton kernels, interpreted on CPU) carries GDN states across
    segments like one on the PyTorch references."""
    batch, frames, height, width = 1, 7, 2, 2
    latents, text, mask = model_inputs(batch, frames, height, width, seed=4)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=4)
    bounds = segment_bounds(frames)
    outputs = {}
    with torch.no_grad():
        for backend in ("torch", "triton"):
            patched = patch_transformer(build_tiny_transformer(seed=0), settings=KernelSettings(backend, "ieee"))
            outputs[backend], _ = run_segments(patched, latents, text, mask, conditions, plucker, bounds, 600.0,
                                               SegmentOptions(sdpa_dtype=torch.float32))
    torch.testing.assert_close(outputs["triton"], outputs["torch"], atol=1e-4, rtol=1e-4)


def test_full_mode_is_one_segment_without_state():
    """The patched model's own forward (full mode) and `segment_forward` over one segment with
    the default recipe's rules and no cache run the same block modules: equal outputs, on the PyTorch
    references (backend "torch" in segment mode) and on the Triton kernels (interpreted)."""
    from camrender.model.stage1.state import FULL_MODE

    batch, frames, height, width = 2, 4, 2, 3
    latents, text, mask = model_inputs(batch, frames, height, width, seed=5)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=5)
    timestep = torch.full((batch, 1, frames), 400.0)
    model = patch_transformer(build_tiny_transformer(seed=0), settings=KernelSettings("triton", "ieee"))
    with torch.no_grad():
        full = model(latents, timestep, text, encoder_attention_mask=mask, camera_conditions=conditions,
                     chunk_plucker=plucker, return_dict=False)[0]
        one_segment = segment_forward(model, latents, timestep, text, mask, camera_conditions=conditions,
                                      chunk_plucker=plucker, options=FULL_MODE)
    torch.testing.assert_close(one_segment, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cached_segments, frames", [(1, 13), (2, 16), (None, 16)])
def test_window_slot_and_prepared_text_keep_every_bit(monkeypatch, cached_segments, frames):
    """Three shortcuts of the fused path change no bit: softmax blocks attend over the cache's window with the
    call's keys written into its slot (not a concatenation of the cached keys with them on every call), each
    block's text keys are computed once for the render (`prepared_text`, not in every cross-attention), and
    each block's Plucker projection once for the call (`plucker_projections`), against none of them (no slot,
    `key_slot=False`, as beside the refiner). Triton kernels, interpreted; 4 or 5 segments, so the recent window
    fills and slides in place (1 and 2 recent segments) or keeps growing (None). With a slot, the kernels write
    the keys and the camera values there themselves: only the main values are copied in."""
    from camrender.model.stage1 import softmax_attention
    from camrender.model.stage1.block import prepared_text
    from camrender.model.stage1.segments import plucker_projections, prepare_conditioning
    from camrender.model.stage1.state import BlockCache

    batch, height, width = 1, 2, 3
    latents, text, mask = model_inputs(batch, frames, height, width, seed=6)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=6)
    bounds = segment_bounds(frames)
    patched = patch_transformer(build_tiny_transformer(seed=0), settings=KernelSettings("triton", "ieee"))

    def render(shortcuts: bool, key_slot: bool = True):
        options = SegmentOptions(cached_segments=cached_segments, sdpa_dtype=torch.float32, key_slot=key_slot)
        cache, outputs = SegmentCache.empty(patched), []
        for index, (start, stop) in enumerate(bounds):
            last = index == len(bounds) - 1
            timestep = torch.full((batch, 1, stop - start), 600.0 if last else 0.0)
            conditioning = prepare_conditioning(patched, (stop - start, height, width), text, mask,
                                                camera_conditions=conditions[:, start:stop],
                                                chunk_plucker=plucker[:, :, start:stop], frame_start=start)
            keys = prepared_text(patched, conditioning.text, conditioning.text_mask) if shortcuts else None
            projected = plucker_projections(patched, conditioning.plucker) if shortcuts else None
            assert (keys is not None) == shortcuts and (projected is not None) == shortcuts
            outputs.append(segment_forward(patched, latents[:, :, start:stop], timestep, frame_start=start,
                                           cache=cache, write_cache=not last, options=options,
                                           conditioning=conditioning, text_keys=keys, projected_plucker=projected))
        return torch.cat(outputs, dim=2), cache

    slots = []
    window_slot = BlockCache.window_slot

    def counted(self, tokens):
        slots.append(window_slot(self, tokens))
        return slots[-1]

    in_place = []  # per slot write: whether a kernel had written it already
    same_view = softmax_attention._same_view

    def written(slot, tensor):
        in_place.append(same_view(slot, tensor))
        return in_place[-1]

    monkeypatch.setattr(BlockCache, "window_slot", counted)
    monkeypatch.setattr(softmax_attention, "_same_view", written)
    with torch.no_grad():
        shortcut, cache = render(shortcuts=True)
        softmax = cache.blocks[1]
        windowed = sum(slot is not None for slot in slots)
        assert softmax.window is not None and windowed == len(bounds) - 2
        assert in_place.count(True) == 3 * windowed and in_place.count(False) == windowed  # key, cam key, cam value
        for view in [softmax.sink.key] + [kv.key for kv in softmax.recent]:  # the context lives in the window
            assert view.untyped_storage().data_ptr() == softmax.window.key.untyped_storage().data_ptr()
        slots.clear()
        plain, cache = render(shortcuts=False, key_slot=False)  # no slot: every call concatenates
        assert not any(slots)
        window = cache.blocks[1].window  # the context only (a growing one is no single buffer)
        assert window is None if cached_segments is None else window.key.shape[2] == cache.blocks[1].context_tokens()
    assert torch.equal(shortcut, plain)


def test_prepared_text_of_unpadded_text_skips_the_mask():
    """A render's text has its padding dropped (`drop_text_padding`); its prepared keys then carry no mask, so the
    cross-attentions run without one, and a segment gives what the padded text and its mask give."""
    from camrender.model.stage1.block import prepared_text
    from camrender.model.stage1.segments import prepare_conditioning
    from camrender.render.inputs import drop_text_padding

    batch, frames, height, width = 2, 4, 2, 3
    latents, text, mask = model_inputs(batch, frames, height, width, seed=8)
    conditions, plucker = camera_inputs(batch, frames, height, width, seed=8)
    patched = patch_transformer(build_tiny_transformer(seed=2), settings=KernelSettings("triton", "ieee"))
    timestep = torch.full((batch, 1, frames), 500.0)
    outputs = []
    with torch.no_grad():
        for words, attended in (drop_text_padding(text, mask), (text, mask)):
            conditioning = prepare_conditioning(patched, (frames, height, width), words, attended,
                                                camera_conditions=conditions, chunk_plucker=plucker, frame_start=0)
            keys = prepared_text(patched, conditioning.text, conditioning.text_mask)
            assert all((k.mask is None) == (words.shape[2] == 4) for k in keys)  # 4 of 6 tokens kept: no mask
            outputs.append(segment_forward(patched, latents, timestep, frame_start=0, options=SegmentOptions(),
                                           conditioning=conditioning, text_keys=keys))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
