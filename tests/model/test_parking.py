"""Weights parked in CPU memory between their calls (`camrender.model.parking`), and the renders that park the
prompt's projections: the same values, each parked module run once per render."""
import numpy as np
import pytest
import torch

from camrender.model import parking
from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
from camrender.model.refiner.tiny import build_tiny_refiner
from camrender.trajectory import Trajectory

PROMPT = "a sunlit room"


@pytest.fixture
def parking_on_cpu(monkeypatch):
    """Parking on for CPU modules (on a GPU-less machine it is the only device there is), and a count of the
    calls that go through parked weights, by module."""
    monkeypatch.setattr(parking, "PARKED_DEVICE_TYPES", ("cpu", "cuda"))
    visits = {}
    visit = parking._visit

    def counting(module, forward, *args, **kwargs):
        visits[id(module)] = visits.get(id(module), 0) + 1
        return visit(module, forward, *args, **kwargs)

    monkeypatch.setattr(parking, "_visit", counting)
    return visits


def test_parked_module_computes_the_same(parking_on_cpu):
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    expected = linear(x)
    state = {k: v.clone() for k, v in linear.state_dict().items()}
    weight = linear.weight
    assert parking.park(linear) and parking.is_parked(linear)
    assert linear.weight is weight  # the same Parameter, its data moved
    assert torch.equal(linear(x), expected)
    assert all(torch.equal(state[k], v) for k, v in linear.state_dict().items())
    assert parking.park(linear)  # again: one wrapper, the same values
    assert torch.equal(linear(x), expected) and parking_on_cpu[id(linear)] == 2


def test_what_cannot_be_parked_is_left_alone(monkeypatch):
    linear = torch.nn.Linear(8, 4)
    assert not parking.park(linear)  # a CPU model: CPU only parks in tests
    monkeypatch.setattr(parking, "PARKED_DEVICE_TYPES", ("cpu",))
    linear.bias = torch.nn.Parameter(linear.bias.data.to("meta"))  # split across devices: a streamer's business
    assert not parking.park(linear) and not parking.is_parked(linear)
    assert not parking.park(torch.nn.GELU())  # no weights


def run_refiner(refiner, clip, seed=0):
    text = encode_refiner_prompt(refiner, PROMPT, "cpu", torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(seed))
    pieces = [stream.push(clip[:, :, :4]), stream.push(clip[:, :, 4:]), stream.finish()]
    return torch.cat(pieces, dim=2), stream


def test_refiner_parks_its_prompt_projections(parking_on_cpu, monkeypatch):
    """The caption projection and every cross-attention's key and value projections are parked by the stream,
    run once per render (the memo serves every later pass) and give the unparked render's values bit for bit."""
    clip = torch.randn(1, 8, 10, 4, 6, generator=torch.Generator().manual_seed(5))
    with monkeypatch.context() as unparked:
        unparked.setattr(parking, "PARKED_DEVICE_TYPES", ())
        expected, _ = run_refiner(build_tiny_refiner(seed=3), clip)
    refiner = build_tiny_refiner(seed=3)
    blocks = refiner.transformer.transformer_blocks
    parked = [refiner.transformer.caption_projection] + [m for b in blocks for m in (b.attn2.to_k, b.attn2.to_v)]
    for render in range(2):
        parking_on_cpu.clear()
        got, stream = run_refiner(refiner, clip)
        assert torch.equal(got, expected)
        assert all(parking.is_parked(module) for module in parked)
        assert not parking.is_parked(blocks[0].attn2.to_q) and not parking.is_parked(blocks[0].attn1.to_k)
        assert parking_on_cpu == {id(module): 1 for module in parked}, f"render {render}"
    # the memo keeps the normed keys only: what the key projection is remembered as returning
    key, norm = blocks[0].attn2.to_k, blocks[0].attn2.norm_k
    context = stream.text_memo.remembered[id(key)][0]
    assert torch.equal(stream.text_memo.remembered[id(key)][2], norm(key(context)))
    assert id(norm) not in stream.text_memo.remembered


def test_stage_one_parks_its_text_projections(parking_on_cpu, monkeypatch):
    """Segment mode on the fused kernels: each block's text `kv_linear` is parked once its keys are prepared,
    runs once in the next render (its keys) and the frames' latents equal the unparked render's bit for bit."""
    from camrender.model.stage1.loading import load_pipeline
    from camrender.model.stage1.patch import patch_transformer
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.inputs import prepare_inputs
    from helpers import render_request
    from camrender.render.segments import sample_segments

    pipe = load_pipeline("tiny", device="cpu")
    patch_transformer(pipe.transformer, kernels="fused")
    frames = 13
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, frames)  # forward
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([32.0, 32.0, 32.0, 16.0], (frames, 1)), width=64, height=32,
                      fps=16)
    request = render_request(traj=traj, prompt="a quiet street", guidance=1.0, num_frames=frames, height=32,
                             width=64, model="tiny", device="cpu", kernels="fused", mode="segments",
                             recipe="streaming")
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    bounds = segment_bounds(inputs.noise.shape[2])

    def render():
        with torch.no_grad():
            return torch.cat([x for *_, x in sample_segments(pipe.transformer, inputs, bounds, [1000.0],
                                                             SegmentOptions(), torch.device("cpu"))], dim=2)

    with monkeypatch.context() as unparked:
        unparked.setattr(parking, "PARKED_DEVICE_TYPES", ())
        expected = render()
    projections = [block.cross_attn.kv_linear for block in pipe.transformer.blocks]
    assert not any(parking.is_parked(p) for p in projections)
    for visits in (0, 1):  # the first render prepares its keys before parking; the next one visits
        parking_on_cpu.clear()
        assert torch.equal(render(), expected)
        assert all(parking.is_parked(p) for p in projections)
        assert not parking.is_parked(pipe.transformer.blocks[0].cross_attn.q_linear)
        assert parking_on_cpu == ({id(p): 1 for p in projections} if visits else {})


def test_the_loaders_park_what_the_renders_call_once(parking_on_cpu):
    """`load_patched_pipeline` (stage 1 on the fused kernels) and its refiner's `load_stage_two` park the prompt's
    projections at load, and only those."""
    from camrender.render.pipeline import load_patched_pipeline
    from helpers import render_request
    from camrender.render.stage_two import _ATTRIBUTE

    frames = 9
    traj = Trajectory(c2w=np.tile(np.eye(4), (frames, 1, 1)), intrinsics=np.tile([16.0, 16.0, 16.0, 16.0], (frames, 1)),
                      width=32, height=32, fps=16)
    request = render_request(traj=traj, prompt=PROMPT, guidance=1.0, num_frames=frames, height=32, width=32,
                             model="tiny", device="cpu", kernels="fused", mode="segments", refiner="tiny")
    pipe = load_patched_pipeline(request.settings, prepare=request)
    stage_one = pipe.transformer.blocks[0].cross_attn
    assert parking.is_parked(stage_one.kv_linear) and not parking.is_parked(stage_one.q_linear)
    refiner = getattr(pipe, _ATTRIBUTE).transformer
    attention = refiner.transformer_blocks[0].attn2
    assert parking.is_parked(refiner.caption_projection)
    assert parking.is_parked(attention.to_k) and parking.is_parked(attention.to_v)
    assert not parking.is_parked(attention.to_q) and not parking.is_parked(refiner.transformer_blocks[0].attn1.to_k)
    assert not parking_on_cpu  # nothing ran yet
