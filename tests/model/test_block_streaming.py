"""Streaming part of a model's blocks through two staging slots (`camrender.model.block_streaming`,
`--refiner-offload N`): the same outputs as resident blocks, the weights back in CPU memory between
forwards, the slots reused, any call order, and undo."""
import pytest
import torch

from camrender.errors import CamrenderError
from camrender.model.block_streaming import block_streamer, stream_blocks, streamed_indices
from camrender.model.fp8 import Fp8Linear, quantize_blocks
from camrender.model.refiner.loading import check_refiner_offload, place_refiner, streamed_blocks
from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
from camrender.model.refiner.tiny import build_tiny_refiner


class Block(torch.nn.Module):
    def __init__(self, width=6):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.register_buffer("offset", torch.randn(width))

    def forward(self, x):
        return torch.tanh(self.linear(x)) + self.offset


def blocks_and_input(count=7, seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(Block() for _ in range(count)), torch.randn(3, 6)


def run(blocks, x, order=None):
    for index in order if order is not None else range(len(blocks)):
        x = blocks[index](x)
    return x


def test_streamed_indices_spread_over_the_list():
    assert streamed_indices(48, 4) == [6, 18, 30, 42]
    assert streamed_indices(5, 5) == [0, 1, 2, 3, 4]
    assert len(streamed_indices(48, 11)) == 11
    with pytest.raises(ValueError):
        streamed_indices(4, 5)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_streamed_blocks_compute_what_resident_ones_do(count):
    blocks, x = blocks_and_input()
    expected = [run(blocks, x), run(blocks, x, order=[6, 5, 0, 3, 3, 1])]
    state = {name: value.clone() for name, value in blocks.state_dict().items()}
    streamer = stream_blocks(blocks, count, "cpu")
    assert len(streamer.slots) == min(2, count)
    seen = []  # where a streamed block's weight lives while it runs (this hook runs after the streamer's)
    blocks[streamer.streamed[-1]].register_forward_pre_hook(
        lambda module, args: seen.append(module.linear.weight.data_ptr()))
    for _ in range(3):  # passes in order wrap round the streamed blocks; any other order loads on demand
        assert torch.equal(run(blocks, x), expected[0])
        assert torch.equal(run(blocks, x, order=[6, 5, 0, 3, 3, 1]), expected[1])
    slot_storage = {tensor.data_ptr() for slot in streamer.slots for tensor in slot}
    assert seen and set(seen) <= slot_storage
    for index in streamer.streamed:  # between forwards a streamed block holds its own copy, not a slot
        assert all(t.data_ptr() not in slot_storage for t in [*blocks[index].parameters(), *blocks[index].buffers()])
    assert all(torch.equal(value, state[name]) for name, value in blocks.state_dict().items())


def test_streaming_again_is_a_no_op_and_remove_undoes_it():
    blocks, x = blocks_and_input()
    expected = run(blocks, x)
    streamer = stream_blocks(blocks, 3, "cpu")
    assert stream_blocks(blocks, 3, "cpu") is streamer and block_streamer(blocks) is streamer
    other = stream_blocks(blocks, 4, "cpu")  # another count: restreamed
    assert other is not streamer and other.streamed == [0, 2, 4, 6]
    other.remove()
    assert block_streamer(blocks) is None
    assert all(not block._forward_pre_hooks and not block._forward_hooks for block in blocks)
    assert torch.equal(run(blocks, x), expected)


def test_a_raising_block_and_new_weights_leave_the_streamer_right():
    """A forward that raises still points the block back at its CPU copy; `load_state_dict` between
    forwards is what the next forward computes with (the slots are refilled), also after `remove()` twice."""
    blocks, x = blocks_and_input()
    fresh, _ = blocks_and_input(seed=1)
    streamer = stream_blocks(blocks, 3, "cpu")
    slot_storage = {tensor.data_ptr() for slot in streamer.slots for tensor in slot}
    failing = blocks[streamer.streamed[0]]
    failing.register_forward_pre_hook(lambda module, args: (_ for _ in ()).throw(RuntimeError("inside the block")))
    with pytest.raises(RuntimeError, match="inside the block"):
        failing(x)
    assert failing.linear.weight.data_ptr() not in slot_storage
    failing._forward_pre_hooks.popitem()
    run(blocks, x)  # the slots now hold the old weights
    blocks.load_state_dict(fresh.state_dict())
    assert torch.equal(run(blocks, x), run(fresh, x))
    streamer.remove()
    streamer.remove()
    assert torch.equal(run(blocks, x), run(fresh, x))


def test_blocks_of_another_layout_are_refused():
    blocks, _ = blocks_and_input(3)
    blocks.append(Block(width=4))
    with pytest.raises(ValueError, match="block 3 holds other tensors"):
        stream_blocks(blocks, 4, "cpu")


def refine(refiner, clip):
    text = encode_refiner_prompt(refiner, "a cat", "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(0), device="cpu",
                           kernel_backend="torch")
    return torch.cat([stream.push(clip), stream.finish()], dim=2)


@pytest.mark.parametrize("fp8", [False, True])
def test_refiner_with_streamed_blocks_refines_the_same(fp8, monkeypatch):
    """`place_refiner(..., "3")` on the tiny refiner with 5 blocks (FP8: the quantized blocks' buffers stream)."""
    refiner = build_tiny_refiner(seed=4, num_layers=5)
    if fp8:
        monkeypatch.setattr(Fp8Linear, "backend", "torch")  # the activations' quantization: not the interpreter
        quantize_blocks(refiner.transformer.transformer_blocks)
    clip = torch.randn(1, 8, 7, 4, 6, generator=torch.Generator().manual_seed(2))  # sink + 2 blocks: 8 passes
    before = refine(refiner, clip)
    place_refiner(refiner, "cpu", "3")
    assert block_streamer(refiner.transformer.transformer_blocks).streamed == [0, 2, 4]
    assert torch.equal(refine(refiner, clip), before)
    place_refiner(refiner, "cpu", "3")  # a second render's placement: a no-op
    assert torch.equal(refine(refiner, clip), before)


def test_refiner_offload_spellings():
    assert [check_refiner_offload(v) for v in ("none", "layers", "12", " 007", 3)] == ["none", "layers", "12", "7", "3"]
    assert [streamed_blocks(v) for v in ("none", "layers", "12")] == [0, 0, 12]
    for bad in ("0", "2", "-2", "half", "1.5", "", "\u00b2"):  # "²": a digit to str.isdigit, not to int()
        with pytest.raises(CamrenderError, match="refiner-offload: must be none, layers or a number of blocks"):
            check_refiner_offload(bad)
    refiner = build_tiny_refiner(seed=4, text_encoder=False)
    with pytest.raises(CamrenderError, match="the refiner has 2 blocks, cannot stream 3"):
        place_refiner(refiner, "cpu", "3")


class SlowBlock(Block):
    """A block whose kernels outlast its copy: a missing wait on either side would read or overwrite a slot
    in flight."""

    def forward(self, x):
        torch.cuda._sleep(1_000_000)  # about 0.5 ms of GPU time before the block's own kernels
        return super().forward(x)


@pytest.mark.gpu
def test_streamed_blocks_on_cuda_match_resident_ones():
    """The asynchronous path: copies on a side stream, the blocks run on another stream as the refiner's do
    (16 MiB blocks, distinct weights: a slot read before its copy or refilled while read gives other numbers)."""
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(SlowBlock(width=2048) for _ in range(9)).cuda()
    x = torch.randn(64, 2048, device="cuda")
    expected, shuffled = run(blocks, x), run(blocks, x, order=[8, 0, 4, 4])
    streamer = stream_blocks(blocks, 5, "cuda")
    assert all(t.device.type == "cpu" and t.is_pinned() for copies in streamer.host for t in copies)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        results = [run(blocks, x) for _ in range(4)]
    torch.cuda.synchronize()
    assert all(torch.equal(result, expected) for result in results)
    assert torch.equal(run(blocks, x, order=[8, 0, 4, 4]), shuffled)
