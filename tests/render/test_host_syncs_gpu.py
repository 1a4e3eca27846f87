"""Segment mode's stage 1 never makes the host wait for the GPU after its first segment (GPU only:
`python3 -m pytest -m gpu`).

A sync at a segment's start (a copy from pageable host memory, boolean indexing, a tensor built from Python
numbers on the GPU) drains the GPU's queue and leaves the GPU idle while the host prepares the segment's
conditioning; a capture that synchronizes leaves it idle for the whole capture. PyTorch's sync debug mode
raises at any sync PyTorch makes, so these tests fail at the line that made one.
"""
import contextlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


@contextlib.contextmanager
def no_syncs():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("source, dtype", [(torch.float32, torch.bfloat16), (torch.float32, None),
                                           (torch.complex64, None)])
def test_to_device_copies_without_a_sync_and_keeps_the_values(source, dtype):
    from camrender.model.device import to_device

    host = torch.randn(3, 40, 17, dtype=source)[:, 5:]  # not contiguous
    expected = host.to("cuda", dtype)  # the plain copy (it syncs)
    torch.cuda._sleep(50_000_000)  # a busy queue: a sync would wait for it
    with no_syncs():
        moved = to_device(host, "cuda", dtype)
    host.zero_()  # before the queued copy ran: it reads page-locked memory of its own
    assert moved.dtype == expected.dtype and torch.equal(moved, expected)


def test_graphed_forward_captures_without_waiting_for_the_gpu():
    from camrender.model.graphs import GraphedForward

    weight = torch.randn(64, 64, device="cuda")

    def forward(x):
        return torch.tanh(x @ weight)

    graphs = GraphedForward(forward)
    x = torch.randn(8, 64, device="cuda")
    eager = graphs(x)  # first sight: eager
    with no_syncs():
        captured = graphs(x.clone())  # captures, then replays
    assert graphs.stats == {"eager": 1, "captures": 1, "replays": 1} and graphs.enabled
    assert torch.equal(captured, eager)


def test_segment_mode_stage_one_makes_no_sync_after_its_first_segment():
    """Seven segments of the tiny model's streaming render, CUDA graphs on, cameras from the render's feed: after
    the first segment (the kernels' compilation, the text's keys) nothing syncs, the captures of segments 1 to 3
    included. The latents equal those of the same render without the sync check."""
    from camrender.model.stage1.loading import load_pipeline
    from camrender.model.stage1.patch import patch_transformer
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.inputs import prepare_inputs
    from camrender.render.request import RenderRequest
    from camrender.render.segments import sample_segments
    from camrender.trajectory import Trajectory

    pipe = load_pipeline("tiny", device="cuda")
    patch_transformer(pipe.transformer, kernels="fused")
    frames = 169  # 22 latent frames: 7 segments
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, frames)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([56.0, 56.0, 56.0, 32.0], (frames, 1)), width=112, height=64, fps=16)
    request = RenderRequest(traj=traj, prompt="a quiet street", guidance=5.0, num_frames=frames, height=64, width=112,
                            model="tiny", device="cuda", kernels="fused", mode="segments", recipe="streaming")
    device = torch.device("cuda")
    latents = {}
    for checked in (False, True):
        inputs = prepare_inputs(pipe, request, device)  # a fresh camera feed
        bounds = segment_bounds(inputs.noise.shape[2])
        assert len(bounds) == 7
        chunks = []
        with torch.no_grad():
            sampled = sample_segments(pipe.transformer, inputs, bounds, [1000.0, 800.0, 500.0],
                                      SegmentOptions(plucker_once=True), device, cuda_graphs=True)
            chunks.append(next(sampled)[3].clone())
            with no_syncs() if checked else contextlib.nullcontext():
                chunks += [x.clone() for *_, x in sampled]
        latents[checked] = torch.cat(chunks, dim=2)
    assert torch.equal(latents[True], latents[False])
