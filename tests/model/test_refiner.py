"""Stage 2: the streamed refiner equals diffusers' SanaWMLTX2Refiner on the whole clip (tiny, fp32, CPU)."""
import pytest
import torch
from helpers import rel

from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
from camrender.model.refiner.tiny import build_tiny_refiner

PROMPT = "a sunlit room"
# The history bookkeeping tests run the fused path's PyTorch references: the Triton kernels go
# through the interpreter in the diffusers-equivalence tests here and in tests/kernels (seconds, not minutes).
BOOKKEEPING = dict(kernel_backend="torch")


@pytest.fixture(scope="module")
def refiner():
    return build_tiny_refiner(seed=3)


def reference(refiner, clip, seed):
    return refiner(clip, PROMPT, fps=16.0, generator=torch.Generator().manual_seed(seed), output_type="latent")


def streamed(refiner, clip, seed, splits, **options):
    text = encode_refiner_prompt(refiner, PROMPT, "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(seed), **options)
    pieces, start = [], 0
    for stop in splits + [clip.shape[2]]:
        pieces.append(stream.push(clip[:, :, start:stop]))
        start = stop
    pieces.append(stream.finish())
    return pieces, stream


@pytest.mark.parametrize("frames, splits", [
    (17, [4, 7, 10, 13, 16]),  # segment mode's layout (4, 3, 3, ...): one block per segment, trims the history
    (12, [1, 2, 6, 11]),  # any split; the last block is shorter (11 = 1 + 3 * 3 + 1)
])
def test_streamed_equals_diffusers_call(refiner, frames, splits):
    clip = torch.randn(1, 8, frames, 4, 6, generator=torch.Generator().manual_seed(frames))
    expected = reference(refiner, clip, seed=7)
    pieces, stream = streamed(refiner, clip, seed=7, splits=splits)
    got = torch.cat(pieces, dim=2)
    assert got.shape == expected.shape
    error = rel(got, expected)
    max_error = ((got - expected).abs().max() / expected.abs().max()).item()
    print(f"frames {frames}: relative error {error:.2e} (norm), {max_error:.2e} (max abs diff / max abs)")
    assert error <= 1e-5 and max_error <= 1e-5
    assert torch.equal(got[:, :, :1], clip[:, :, :1])  # the sink is kept verbatim
    assert rel(got[:, :, 1:], clip[:, :, 1:]) > 0.1  # and the rest is really refined
    assert stream.blocks_done == -(-(frames - 1) // 3)
    # each block is final as soon as its frames have arrived (the video can grow segment by segment)
    sizes = [p.shape[2] for p in pieces]
    if splits[0] == 4:
        assert sizes == [4, 3, 3, 3, 3, 0, 1]  # the 1-frame tail waits for the end of the clip


def test_history_stays_bounded(refiner):
    clip = torch.randn(1, 8, 31, 4, 6, generator=torch.Generator().manual_seed(0))
    _, stream = streamed(refiner, clip, seed=1, splits=list(range(4, 31, 3)), **BOOKKEEPING)
    tokens_per_frame = 4 * 6
    for layer in stream.cache.layer_caches:
        assert layer.history_k.shape[1] == 10 * tokens_per_frame  # sink + 10 recent frames, whatever the length
        assert layer.sink_k_pre.shape[1] == tokens_per_frame


def test_finish_needs_more_than_the_sink(refiner):
    text = encode_refiner_prompt(refiner, PROMPT, "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0)
    with pytest.raises(ValueError, match="more than 1 latent frame"):
        stream.finish()


@pytest.mark.parametrize("start, frames", [(0, 1), (5, 3), (40, 2)])
def test_rope_equals_diffusers_absolute_positions(refiner, start, frames):
    stream = RefinerStream(refiner, encode_refiner_prompt(refiner, PROMPT, "cpu", torch.float32), fps=12.5)
    expected = refiner.transformer.build_rotary_emb_for_absolute_positions(
        batch_size=1, frame_positions=list(range(start, start + frames)), height=4, width=6,
        device=torch.device("cpu"), fps=12.5)
    for got, want in zip(stream._rope(start, frames, 4, 6), expected):
        assert torch.equal(got, want)


def test_prompt_keys_and_values_are_computed_once(refiner, monkeypatch):
    """The cross-attention K/V projections of the fixed prompt run once per stream, not once per forward."""
    watched = {id(block.attn2.to_k): 0 for block in refiner.transformer.transformer_blocks}
    linear_forward = torch.nn.Linear.forward

    def counting(module, x):
        if id(module) in watched:
            watched[id(module)] += 1
        return linear_forward(module, x)

    monkeypatch.setattr(torch.nn.Linear, "forward", counting)
    clip = torch.randn(1, 8, 7, 4, 6, generator=torch.Generator().manual_seed(5))
    pieces, stream = streamed(refiner, clip, seed=0, splits=[4])
    assert stream.blocks_done == 2  # 1 sink pass + 2 blocks x 3 passes + the first block's history pass
    assert set(watched.values()) == {1}
    assert "forward" not in vars(refiner.transformer.transformer_blocks[0].attn2.to_k)  # unpatched afterwards


def test_long_path_equals_diffusers_call(refiner):
    """Past the window's fill (sink + 10 frames, from block 5) the history slides every block: 9 full blocks
    and a short last one still give diffusers' call's latents within fp32 rounding."""
    frames = 1 + 3 * 9 + 2
    clip = torch.randn(1, 8, frames, 4, 6, generator=torch.Generator().manual_seed(11))
    pieces, stream = streamed(refiner, clip, seed=3, splits=list(range(4, frames, 3)), **BOOKKEEPING)
    assert stream.blocks_done == 10
    got, expected = torch.cat(pieces, dim=2), reference(refiner, clip, seed=3)
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= 1e-5


def test_full_history_is_shifted_in_place(refiner):
    """Once the window is full, each layer's history keeps its storage (no copy of the window per block)."""
    clip = torch.randn(1, 8, 1 + 3 * 6, 4, 6, generator=torch.Generator().manual_seed(4))
    text = encode_refiner_prompt(refiner, PROMPT, "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(0), **BOOKKEEPING)
    stream.push(clip[:, :, :13])  # sink + 4 blocks: 12 frames refined, the history holds the last 10
    stream.settle()  # the last block's history pass
    addresses = [layer.history_k.data_ptr() for layer in stream.cache.layer_caches]
    before = stream.cache.layer_caches[0].history_k.clone()
    stream.push(clip[:, :, 13:])
    stream.settle()
    layer = stream.cache.layer_caches[0]
    assert [cache.history_k.data_ptr() for cache in stream.cache.layer_caches] == addresses
    tokens = 4 * 6
    assert torch.equal(layer.history_k[:, :4 * tokens], before[:, 6 * tokens:])  # 2 blocks later: shifted by 6 frames


def test_finished_stream_is_freed_without_the_cycle_collector(refiner):
    """A render's stream (its KV cache and window buffers) goes as soon as the render drops it."""
    import gc
    import weakref

    clip = torch.randn(1, 8, 1 + 3 * 6, 4, 6, generator=torch.Generator().manual_seed(6))
    gc.disable()
    try:
        _, stream = streamed(refiner, clip, seed=0, splits=list(range(4, clip.shape[2], 3)), **BOOKKEEPING)
        history = weakref.ref(stream.cache.layer_caches[0].history_k)
        gone = weakref.ref(stream)
        del stream
        assert gone() is None and history() is None
    finally:
        gc.enable()
