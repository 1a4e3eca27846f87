"""CUDA-graph capture and replay equal eager execution (GPU only: `python3 -m pytest -m gpu`).

`camrender.model.graphs.GraphedForward` on its own, and the two render paths the CLI runs (full mode
and segment mode, tiny model, fused kernels compiled for CUDA) with and without `cuda_graphs`. Replay
runs the same kernels on the same inputs, so the outputs must be bit-identical, and each graphed run
must really have captured (a failed capture falls back to eager calls silently, which would make the
comparison vacuous). Also here: segment mode with the refiner, its stages overlapped on CUDA
streams, against the same stages in order.
"""
import dataclasses

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

FRAMES = 57  # 8 latent frames: two segments in segment mode


def test_graphed_forward_replay_equals_eager():
    from camrender.model.graphs import GraphedForward

    weight = torch.randn(64, 64, device="cuda")

    def forward(x, scale):
        return torch.tanh(x @ weight) * scale

    graphs = GraphedForward(forward)
    inputs = [(torch.randn(8, 64, device="cuda"), torch.rand(1, device="cuda")) for _ in range(5)]
    outputs = [graphs(*args) for args in inputs]
    assert graphs.stats == {"eager": 1, "captures": 1, "replays": 4}
    for (x, scale), got in zip(inputs, outputs):
        assert torch.equal(got, forward(x, scale))
    # an input changed in place between calls is copied again, not replayed stale
    x, scale = inputs[-1]
    x.mul_(2.0)
    assert torch.equal(graphs(x, scale), forward(x, scale))


def _request(mode, frames=FRAMES, refiner=None):
    from camrender.trajectory import Trajectory
    from helpers import render_request

    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, frames)  # truck right
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, frames)  # and forward
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([56.0, 56.0, 56.0, 32.0], (frames, 1)), width=112, height=64,
                      fps=16)
    return render_request(traj=traj, prompt="a quiet street", steps=6 if mode == "full" else None, guidance=5.0,
                          num_frames=frames, height=64, width=112, model="tiny", device="cuda", kernels="fused",
                          mode=mode, recipe="streaming" if mode == "segments" else "bidirectional", refiner=refiner)


@pytest.fixture(scope="module")
def pipe():
    from camrender.model.stage1.loading import load_pipeline
    from camrender.model.stage1.patch import patch_transformer

    pipe = load_pipeline("tiny", device="cuda")
    patch_transformer(pipe.transformer, kernels="fused")
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("mode", ["full", "segments"])
def test_render_with_graphs_equals_eager(mode, graph_log):
    from camrender.render.loop import render_frames
    from camrender.render.pipeline import load_patched_pipeline

    request = _request(mode)
    videos = {}
    for graphs in (False, True):
        # a pipeline per setting: its RenderSettings (CUDA graphs among them) are decided once, at load
        graphed = dataclasses.replace(request, settings=dataclasses.replace(request.settings, cuda_graphs=graphs))
        pipe = load_patched_pipeline(graphed.settings)
        with torch.no_grad():
            frames = list(render_frames(pipe, graphed))
        videos[graphs] = np.concatenate(frames)
    assert videos[True].shape == videos[False].shape and len(videos[True]) == FRAMES
    assert np.array_equal(videos[True], videos[False])
    assert graph_log and sum(g.stats["captures"] for g in graph_log) >= 1
    assert sum(g.stats["replays"] for g in graph_log) >= 2
    assert all(g.enabled for g in graph_log)  # no capture fell back to eager calls


def test_segment_sampler_latents_with_graphs_equal_eager(pipe, graph_log):
    """Stage-1 latents of segment mode, graphed and eager (bench_segments' former graph check), over 7
    segments: the cache passes of segments 4 to 6 replay their graph (segment 2 writes in place first, eagerly,
    which warms the graph's layout; 3 captures). The graphed run projects each segment's Plucker maps once
    (`SegmentOptions.plucker_once`, as a render without the refiner), the eager one in every pass: the graphs
    read the projections in place, and the latents are the same bits."""
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.inputs import prepare_inputs
    from camrender.render.segments import sample_segments

    device = torch.device("cuda")
    inputs = prepare_inputs(pipe, _request("segments", frames=169), device)  # 22 latent frames
    bounds = segment_bounds(inputs.noise.shape[2])
    assert len(bounds) == 7
    latents = {}
    with torch.no_grad():
        for graphs in (False, True):
            latents[graphs] = torch.cat([x for *_, x in sample_segments(
                pipe.transformer, inputs, bounds, [1000.0, 800.0, 500.0], SegmentOptions(plucker_once=graphs),
                device, cuda_graphs=graphs)], dim=2)
    assert torch.equal(latents[True], latents[False])
    denoising, cache_passes = graph_log
    assert denoising.stats["captures"] >= 1 and all(g.enabled for g in graph_log)
    assert cache_passes.stats == {"eager": 0, "captures": 1, "replays": 4}
    # the graphs read the cache and the Plucker projections in place, no copy
    assert all(g._replay.inputs[3] is None and g._replay.inputs[5] is None for g in graph_log)


def test_resume_from_a_checkpoint_equals_the_uninterrupted_render(pipe, tmp_path):
    """Segment mode with graph replay, stopped after segment 1, checkpointed, restored into a fresh
    cache and finished: the frames of the uninterrupted render (bench_checkpoint's former check)."""
    from camrender.model.stage1.segments import SegmentCache, SegmentOptions, segment_bounds
    from camrender.render.decode import CausalStreamDecoder, to_uint8_frames
    from camrender.render.inputs import prepare_inputs
    from camrender.render.resume import Checkpointer
    from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments

    device = torch.device("cuda")
    inputs = prepare_inputs(pipe, _request("segments", frames=121), device)  # 16 latent frames
    bounds = segment_bounds(inputs.noise.shape[2], 3)
    assert len(bounds) >= 4

    def render(stop=None, checkpoints=None):
        decoder = CausalStreamDecoder(pipe.vae, device=device)
        cache, first = SegmentCache.empty(pipe.transformer), 0
        if checkpoints is not None:
            cache, first = checkpoints.restore(cache, decoder, device, bounds)
        frames = []
        with torch.no_grad():
            for index, _, _, latents in sample_segments(pipe.transformer, inputs, bounds,
                                                        list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(), device,
                                                        cuda_graphs=True, cache=cache, first_segment=first):
                frames.append(to_uint8_frames(decoder.decode(latents)))
                if stop is not None and index + 1 == stop:
                    break
        return frames, cache, decoder

    whole, _, _ = render()
    head, cache, decoder = render(stop=2)
    Checkpointer(tmp_path, settings={}, every=0).save(2, bounds, 0, cache, decoder)
    del cache, decoder
    resumed = Checkpointer(tmp_path, settings={}, resume_info={"next_segment": 2, "frames_written": 0})
    tail, _, _ = render(checkpoints=resumed)
    assert len(head) == 2 and len(head) + len(tail) == len(whole)
    for got, want in zip(head + tail, whole):
        assert got.shape == want.shape and np.array_equal(got, want)


def test_overlapped_stage_two_equals_sequential(pipe):
    """Segment mode with the tiny refiner: the three-stream overlap of `refined_frames` (stage 1, the
    refiner and the decode queued on separate CUDA streams, each schedule) gives the frames of the
    same stages run in order on one stream, bit for bit (a missing wait between streams would show here), also
    with stage 1's cache pass held until the segment's refinement is queued (`HeldCacheWrite`, as renders run)."""
    from camrender.model.refiner.tiny import build_tiny_refiner
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.decode import CausalStreamDecoder
    from camrender.render.inputs import prepare_inputs
    from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, HeldCacheWrite, sample_segments
    from camrender.render.stage_two import Schedule, attach_refiner, refined_frames, stage_two

    device = torch.device("cuda")
    request = _request("segments", frames=121, refiner="tiny")  # 16 latent frames
    inputs = prepare_inputs(pipe, request, device)
    bounds = segment_bounds(inputs.noise.shape[2], 3)
    attach_refiner(pipe, build_tiny_refiner(seed=1).to(device))
    try:
        videos = {}
        for name, overlap, schedule, held in [
                ("in order", False, Schedule(), None), ("in order, held", False, Schedule(), HeldCacheWrite()),
                ("prioritised", True, Schedule(), HeldCacheWrite()),
                ("equal priorities", True, Schedule(stage_one_first=False), HeldCacheWrite()),
                ("decode after refiner", True, Schedule(decode_apart=False), HeldCacheWrite()),
                ("one stream", True, Schedule(streams=False), HeldCacheWrite())]:
            with torch.no_grad():
                chunks = (x for *_, x in sample_segments(pipe.transformer, inputs, bounds,
                                                         list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(), device,
                                                         cuda_graphs=True, held=held))
                frames = [f for _, f in refined_frames(stage_two(pipe, request, device), chunks,
                                                       CausalStreamDecoder(pipe.vae, device=device), device,
                                                       overlap=overlap, schedule=schedule,
                                                       settle_chunk=None if held is None else held.flush)]
            videos[name] = np.concatenate([f for f in frames if len(f)])
    finally:
        attach_refiner(pipe, None)
    assert len(videos["in order"]) == 121
    for name, video in videos.items():
        assert np.array_equal(video, videos["in order"]), name


def test_overlapped_renders_reuse_their_streams_cached_memory(pipe):
    """Renders one after another in a process (the live page's restarts, a batch) queue their stages on the same
    CUDA streams, so the memory a render's stages left cached serves the next one: the third of three equal renders
    reserves no more than the second (on fresh streams each render would reserve its stages' buffers again)."""
    from camrender.model.refiner.tiny import build_tiny_refiner
    from camrender.model.stage1.segments import SegmentOptions, segment_bounds
    from camrender.render.decode import CausalStreamDecoder
    from camrender.render.inputs import prepare_inputs
    from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments
    from camrender.render.stage_two import attach_refiner, refined_frames, stage_two

    device = torch.device("cuda")
    request = _request("segments", frames=121, refiner="tiny")
    inputs = prepare_inputs(pipe, request, device)
    bounds = segment_bounds(inputs.noise.shape[2], 3)
    attach_refiner(pipe, build_tiny_refiner(seed=1).to(device))
    reserved = []
    try:
        for _ in range(3):
            with torch.no_grad():
                chunks = (x for *_, x in sample_segments(pipe.transformer, inputs, bounds,
                                                         list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(), device,
                                                         cuda_graphs=False))
                frames = [f for _, f in refined_frames(stage_two(pipe, request, device), chunks,
                                                       CausalStreamDecoder(pipe.vae, device=device), device,
                                                       overlap=True)]
            torch.cuda.synchronize()
            assert sum(len(f) for f in frames) == 121
            reserved.append(torch.cuda.memory_reserved())
    finally:
        attach_refiner(pipe, None)
    assert reserved[2] <= reserved[1], reserved
