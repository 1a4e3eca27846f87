"""Segment mode's stage 1 never makes the host wait for the GPU after its first segment (GPU only:
`python3 -m pytest -m gpu`).

A sync at a segment's start (a copy from pageable host memory, boolean indexing, a tensor built from Python
numbers on the GPU) drains the GPU's queue and leaves the GPU idle while the host prepares the segment's
conditioning; a capture that synchronizes leaves it idle for the whole capture. `no_syncs` raises at the syncs
PyTorch's sync debug mode sees (copies, `nonzero`, `item`), and at `torch.cuda.synchronize` and
`torch.cuda.empty_cache`, which that mode does not see (`torch.cuda.graph` calls both before a capture).
`gpu_kept_busy` checks the host directly: work queued before it is still running after it.
"""
import contextlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


@contextlib.contextmanager
def no_syncs(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the host waited for the GPU")

    with monkeypatch.context() as patched:
        patched.setattr(torch.cuda, "synchronize", forbidden)
        patched.setattr(torch.cuda, "empty_cache", forbidden)
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")


@contextlib.contextmanager
def gpu_kept_busy(seconds: float = 2.0):
    """Queue `seconds` of GPU work, run the block, then check that the work is still running: the block never
    waited for the GPU (keep the block's own launches few: a full launch queue makes the host wait too)."""
    clock_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 2_000_000)  # not in every release
    cycles = int(clock_khz * 1e3 * seconds)
    torch.cuda._sleep(cycles)
    queued = torch.cuda.Event()
    queued.record()
    yield
    still_running = not queued.query()
    torch.cuda.synchronize()
    assert still_running, "the host waited for the GPU's queued work"


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("source, dtype", [(torch.float32, torch.bfloat16), (torch.float32, None),
                                           (torch.complex64, None)])
def test_to_device_copies_without_a_sync_and_keeps_the_values(monkeypatch, source, dtype, contiguous):
    from camrender.model.device import to_device

    host = torch.randn(3, 40, 17, dtype=source)
    host = host if contiguous else host[:, 5:]
    expected = host.to(device="cuda", dtype=dtype)  # the plain copy (it syncs)
    # the first page-locked block of a size waits for the GPU (cudaHostAlloc; seen on an H100): a render
    # makes its blocks in its first segment, and later ones reuse them from the allocator's cache
    to_device(host, "cuda", dtype)
    with gpu_kept_busy(), no_syncs(monkeypatch):
        moved = to_device(host, "cuda", dtype)
        host.zero_()  # before the queued copy has run: it reads a page-locked copy of its own
    assert moved.dtype == expected.dtype and torch.equal(moved, expected)


def test_graphed_forward_captures_without_waiting_for_the_gpu(monkeypatch):
    from camrender.model.graphs import GraphedForward

    weight = torch.randn(64, 64, device="cuda")

    def forward(x):
        return torch.tanh(x @ weight)

    graphs = GraphedForward(forward)
    x = torch.randn(8, 64, device="cuda")
    eager = graphs(x)  # first sight: eager
    # no PyTorch sync, no synchronize or empty_cache. (`gpu_kept_busy` saw the host wait during this first capture
    # on an H100, below PyTorch: a new private pool's allocation or the graph's instantiation; not
    # asserted here until its cause is known)
    with no_syncs(monkeypatch):
        captured = graphs(x.clone())  # captures, then replays
    assert graphs.stats == {"eager": 1, "captures": 1, "replays": 1} and graphs.enabled
    assert torch.equal(captured, eager)


def test_segment_mode_stage_one_makes_no_sync_after_its_first_segment(monkeypatch, graph_log):
    """Seven segments of the tiny model's streaming render, CUDA graphs on, cameras from the render's feed: after
    the first segment (the kernels' compilation, the text's keys) nothing syncs, the captures of segments 1 and 2
    (at first sight) and of segment 3's cache pass included, and every graph stays on. The latents equal those of
    the same render without the check."""
    from camrender.model.stage1.loading import load_pipeline
    from camrender.model.stage1.patch import patch_transformer
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.inputs import prepare_inputs
    from helpers import render_request
    from camrender.render.segments import sample_segments
    from camrender.trajectory import Trajectory

    pipe = load_pipeline("tiny", device="cuda")
    patch_transformer(pipe.transformer, kernels="fused")
    frames = 169  # 22 latent frames: 7 segments
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, frames)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([56.0, 56.0, 56.0, 32.0], (frames, 1)), width=112, height=64, fps=16)
    request = render_request(traj=traj, prompt="a quiet street", guidance=5.0, num_frames=frames, height=64, width=112,
                             model="tiny", device="cuda", kernels="fused", mode="segments", recipe="streaming")
    device = torch.device("cuda")
    latents = {}
    for checked in (False, True):
        graph_log.clear()
        inputs = prepare_inputs(pipe, request, device)  # a fresh camera feed
        bounds = segment_bounds(inputs.noise.shape[2])
        assert len(bounds) == 7
        chunks = []
        with torch.no_grad():
            sampled = sample_segments(pipe.transformer, inputs, bounds, [1000.0, 800.0, 500.0],
                                      SegmentOptions(plucker_once=True), device, cuda_graphs=True)
            chunks.append(next(sampled)[3].clone())
            with no_syncs(monkeypatch) if checked else contextlib.nullcontext():
                chunks += [x.clone() for *_, x in sampled]
        latents[checked] = torch.cat(chunks, dim=2)
        denoising, cache_passes = graph_log
        assert denoising.enabled and cache_passes.enabled
        assert denoising.stats["eager"] == 1 and denoising.stats["captures"] == 3  # segments 0 (second pass), 1, 2
        # segments 3 (captured, then replayed) to 6
        assert cache_passes.stats == {"eager": 0, "captures": 1, "replays": 4}
    assert torch.equal(latents[True], latents[False])
