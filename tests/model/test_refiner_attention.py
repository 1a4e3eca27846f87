"""The refiner's fused path (camrender.model.refiner.block / attention / window) against
diffusers' stock block forward and attention processor (tiny refiner, fp32, CPU, Triton interpreter)."""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm_refiner import (
    SanaWMLTX2RefinerAttnProcessor,
    SanaWMRefinerKVCache,
)

from camrender.model.refiner.attention import FusedRefinerAttnProcessor
from camrender.model.refiner.block import fused_block_forward, use_refiner_kernels
from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
from camrender.model.refiner.tiny import build_tiny_refiner
from camrender.model.refiner.window import WindowKVCache


@pytest.fixture(scope="module")
def refiner():
    return build_tiny_refiner(seed=5)


def run(refiner, clip, kernels, **options):
    text = encode_refiner_prompt(refiner, "a hall", "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(2), kernels=kernels,
                           **options)
    out = [stream.push(clip[:, :, :4]), stream.push(clip[:, :, 4:]), stream.finish()]
    return torch.cat(out, dim=2), stream


@pytest.mark.parametrize("block_slot", [False, True])
def test_fused_stream_equals_stock_stream(refiner, monkeypatch, block_slot):
    """Window cache + fused processor + fused glue give diffusers' blocks' latents and history (fp32), in both
    window layouts: [sink | history] with the block attended to apart (merged by log-sum-exp), and the block slot."""
    from camrender.model.refiner import window as refiner_window

    monkeypatch.setattr(refiner_window, "BLOCK_SLOT", block_slot)
    clip = torch.randn(1, 8, 1 + 3 * 5 + 2, 4, 6, generator=torch.Generator().manual_seed(1))  # trims, short tail
    stock, stock_stream = run(refiner, clip, "torch")
    blocks = refiner.transformer.transformer_blocks
    assert all(type(b.attn1.processor) is SanaWMLTX2RefinerAttnProcessor and "forward" not in vars(b) for b in blocks)
    assert type(stock_stream.cache) is SanaWMRefinerKVCache
    fused, fused_stream = run(refiner, clip, "fused")
    assert all(isinstance(b.attn1.processor, FusedRefinerAttnProcessor) for b in blocks)
    assert all(vars(b)["forward"].__func__ is fused_block_forward for b in blocks)
    assert isinstance(fused_stream.cache, WindowKVCache)
    tokens = 4 * 6
    window_frames = 1 + fused_stream.max_history + (3 if block_slot else 0)  # sink + history (+ the block's slot)
    assert all(layer.key.shape[1] == window_frames * tokens for layer in fused_stream.cache.layer_caches)
    assert ((fused - stock).abs().max() / stock.abs().max()).item() <= 1e-6
    for window, layer in zip(fused_stream.cache.layer_caches, stock_stream.cache.layer_caches):
        torch.testing.assert_close(window.history_k, layer.history_k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(window.history_v, layer.history_v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(window.sink_v, layer.sink_v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(window.sink_k_pre, layer.sink_k_pre, rtol=1e-5, atol=1e-5)


def test_fused_processor_keeps_the_stock_cache_contract(refiner, monkeypatch):
    """Inside diffusers' own `SanaWMLTX2Refiner.__call__` (its `SanaWMRefinerKVCache`) the fused path
    concatenates and captures as the stock processor does."""
    import camrender.model.refiner.attention as attention

    windows = []
    stock_window = attention._stock_window
    monkeypatch.setattr(attention, "_stock_window", lambda *a, **k: windows.append(1) or stock_window(*a, **k))
    clip = torch.randn(1, 8, 1 + 3 * 5, 4, 6, generator=torch.Generator().manual_seed(3))
    refined = {}
    try:
        for kernels in ("torch", "fused"):
            use_refiner_kernels(refiner.transformer, kernels, "torch")
            refined[kernels] = refiner(clip, "a hall", fps=16.0, generator=torch.Generator().manual_seed(2),
                                       output_type="latent")
    finally:
        use_refiner_kernels(refiner.transformer, "torch")
    layers = len(refiner.transformer.transformer_blocks)
    assert len(windows) == 5 * 4 * layers  # 5 blocks x (3 denoising passes + the cache pass), fused only
    stock, fused = refined["torch"], refined["fused"]
    assert ((fused - stock).abs().max() / stock.abs().max()).item() <= 1e-6


def test_window_sink_is_reroped_once_per_block(refiner, monkeypatch):
    """The sink's RoPE runs on the first pass of each block only (its position is fixed for the block)."""
    import camrender.model.refiner.attention as attention

    calls = []
    rope_rows = attention.rope_rows
    monkeypatch.setattr(attention, "rope_rows", lambda *a, **k: calls.append(1) or rope_rows(*a, **k))
    clip = torch.randn(1, 8, 1 + 3 * 3, 4, 6, generator=torch.Generator().manual_seed(4))
    _, stream = run(refiner, clip, "fused")
    layers = len(refiner.transformer.transformer_blocks)
    assert stream.blocks_done == 3 and len(calls) == 3 * layers  # not 3 blocks x 4 passes


def test_window_history_slides_in_place():
    cache = WindowKVCache(1, history_frames=2, block_frames=3, sink_frames=1, block_slot=True)
    layer = cache.layer_caches[0]
    tokens = 2  # per frame
    layer.store_sink(torch.zeros(1, tokens, 4), torch.full((1, tokens, 4), -1.0))
    assert layer.key.shape == (1, tokens * (1 + 2 + 3), 4)
    for block, frames in enumerate((3, 1, 2)):
        start, end = layer.place(frames * tokens)
        assert start == tokens + layer.history_tokens
        for buffer in (layer.key, layer.value):
            buffer[:, start:end] = torch.arange(frames * tokens, dtype=torch.float32)[None, :, None] + 10 * block
        layer.commit(frames)
        assert layer.history_k.data_ptr() == layer.key[:, tokens:].data_ptr()  # always right after the sink
    # history = the last 2 frames of [block 0 (3 frames), block 1 (1 frame), block 2 (2 frames)] = block 2
    assert layer.history_tokens == 2 * tokens
    assert layer.history_v[0, :, 0].tolist() == [20.0, 21.0, 22.0, 23.0]
    assert torch.equal(layer.sink_v, torch.full((1, tokens, 4), -1.0))  # the sink is never moved
    with pytest.raises(ValueError, match="does not fit the window"):
        layer.place(4 * tokens)


def test_use_refiner_kernels_rejects_unknown_names(refiner):
    with pytest.raises(ValueError, match="fused, torch"):
        use_refiner_kernels(refiner.transformer, "turbo")


def test_window_slide_equals_the_stock_concatenation_and_trim():
    """The release proportions (10 history frames, blocks of 3): drop < keep, the slide goes in pieces."""
    cache = WindowKVCache(1, history_frames=10, block_frames=3, sink_frames=1, block_slot=True)
    layer = cache.layer_caches[0]
    tokens = 3
    layer.store_sink(torch.zeros(1, tokens, 2), torch.zeros(1, tokens, 2))
    history = torch.zeros(1, 0, 2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(6):
        start, end = layer.place(3 * tokens)
        block = torch.randn(1, end - start, 2, generator=generator)
        layer.key[:, start:end] = block
        layer.value[:, start:end] = -block
        layer.commit(3)
        history = torch.cat([history, block], dim=1)[:, -10 * tokens:]
        assert torch.equal(layer.history_k, history) and torch.equal(layer.history_v, -history)


@pytest.mark.parametrize("history_frames, blocks", [
    (10, [3, 3, 3, 3, 3, 3]),  # the release proportions: the slide goes in pieces once the window is full
    (2, [3, 1, 2, 1]),  # a block longer than the history, then blocks shorter than it
    (1, [3, 3]),  # --refiner-window 2: sink + 1 frame
])
def test_window_append_equals_the_stock_concatenation_and_trim(history_frames, blocks):
    """Without the block slot the window holds sink + history only; the cache pass's K/V go in after the
    history slides: the same tokens, in the same order, as the stock concatenation and trim."""
    cache = WindowKVCache(1, history_frames=history_frames, block_frames=3, sink_frames=1, block_slot=False)
    layer = cache.layer_caches[0]
    tokens = 3
    sink = torch.randn(1, tokens, 2)
    layer.store_sink(torch.zeros(1, tokens, 2), sink)
    assert layer.key.shape == (1, tokens * (1 + history_frames), 2)
    history = torch.zeros(1, 0, 2)
    generator = torch.Generator().manual_seed(0)
    addresses = set()
    for frames in blocks:
        block = torch.randn(1, frames * tokens, 2, generator=generator)
        layer.append(block, -block)
        layer.commit(frames)  # nothing more to do in this layout
        history = torch.cat([history, block], dim=1)[:, -history_frames * tokens:]
        assert torch.equal(layer.history_k, history) and torch.equal(layer.history_v, -history)
        prefix_k, prefix_v = layer.prefix()
        assert torch.equal(prefix_v, torch.cat([sink, -history], dim=1))  # the sink stays where it is
        assert torch.equal(prefix_k[:, tokens:], history)
        addresses.add(layer.history_k.data_ptr())
    assert addresses == {layer.key[:, tokens:].data_ptr()}  # always right after the sink, in the one buffer
    with pytest.raises(RuntimeError, match="no slot"):
        layer.place(tokens)
