"""Segment-mode rendering on the tiny pipeline: sampler, streaming output, CLI, original-format DiT files."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.segments import (SegmentCache, SegmentOptions, dense_reference_forward, segment_bounds,
                                             segment_forward)
from camrender.model.stage1.tiny import build_tiny_pipeline, build_tiny_transformer
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames
from camrender.render.inputs import prepare_inputs
from camrender.render.loop import render_frames
from helpers import render_request
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments, segment_timesteps
from camrender.trajectory import Trajectory

FRAMES = 57  # 8 latent frames -> segments (0, 4), (4, 8)
SIZE = 32


@pytest.fixture(scope="module")
def pipe():
    pipe = build_tiny_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    patch_transformer(pipe.transformer, kernels="torch")  # as the CLI does for the requests' --kernels torch
    return pipe


def request_for(frames=FRAMES, **changes):
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, frames)  # truck right
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, frames)  # and forward
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (frames, 1)), width=SIZE,
                      height=SIZE, fps=16)
    fields = dict(traj=traj, prompt="a quiet street", steps=None, guidance=1.0, num_frames=frames, height=SIZE,
                  width=SIZE, model="tiny", dtype="float32", kernels="torch", mode="segments", recipe="streaming")
    fields.update(changes)
    return render_request(**fields)


def dense_sampler(model, inputs, bounds, timesteps, options):
    """The segment sampler written against the dense reference forward: every step of segment k runs
    the whole prefix [0, stop) with finished segments clean at timestep 0. Returns (1, C, T, h, w)."""
    clean = inputs.noise.clone()
    batch = inputs.text.shape[0]
    sigmas = [t / 1000.0 for t in timesteps] + [0.0]
    for index, (start, stop) in enumerate(bounds):
        x = inputs.noise[:, :, start:stop].clone()
        if start == 0:
            x[:, :, 0] = inputs.first_latent[:, :, 0]
        for step, t in enumerate(timesteps):
            timestep = torch.zeros(1, 1, stop)
            timestep[..., start:] = t
            timestep[..., 0] = 0.0
            prefix = torch.cat([clean[:, :, :start], x], dim=2)
            camera, plucker = inputs.camera(0, stop)
            velocity = dense_reference_forward(
                model, prefix.expand(batch, -1, -1, -1, -1), timestep.expand(batch, 1, stop), inputs.text,
                inputs.text_mask, segments=bounds[: index + 1], camera_conditions=camera, chunk_plucker=plucker,
                options=options,
            )[:, :, start:]
            if batch == 2:
                velocity = velocity[:1] + inputs.guidance * (velocity[1:] - velocity[:1])
            stepped = x + (sigmas[step + 1] - sigmas[step]) * velocity
            if start == 0:
                stepped[:, :, 0] = x[:, :, 0]
            x = stepped
        clean[:, :, start:stop] = x
    return clean


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_segment_sampler_equals_dense_sampler(pipe, guidance):
    request = request_for(guidance=guidance, steps=2 if guidance > 1 else None)
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    assert inputs.text.shape[0] == (2 if guidance > 1 else 1)
    bounds = segment_bounds(inputs.noise.shape[2], 3)
    assert bounds == [(0, 5), (5, 8)]  # the first segment absorbs the remainder
    timesteps = segment_timesteps(pipe.scheduler, request.steps)
    options = SegmentOptions(sdpa_dtype=torch.float32)
    with torch.no_grad():
        cached = torch.cat([latents for *_, latents in sample_segments(pipe.transformer, inputs, bounds, timesteps,
                                                                       options, torch.device("cpu"))], dim=2)
        dense = dense_sampler(pipe.transformer, inputs, bounds, timesteps, options)
    torch.testing.assert_close(cached, dense, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cached[:, :, :1], inputs.first_latent)  # the image frame stays pinned
    assert (cached[:, :, 1:] - inputs.noise[:, :, 1:]).abs().min() > 0  # every other frame was denoised


def test_render_segments_streams_one_chunk_per_segment(pipe):
    request = request_for()
    calls = []
    chunks = list(render_frames(pipe, request, lambda done, total, info, **named: calls.append((done, total, info,
                                                                                               named))))
    assert [len(chunk) for chunk in chunks] == [33, 24]
    assert all(chunk.dtype == np.uint8 and chunk.shape[1:] == (SIZE, SIZE, 3) for chunk in chunks)
    assert [call[:2] for call in calls] == [(1, 2), (2, 2)]
    assert calls[-1][2].startswith("57 frames, 3.500 s of video")  # (frames - 1) / fps, as `traj check` says
    assert calls[-1][3] == {"stage": "stage 1", "unit": "segment"}

    # The streamed frames are the whole-clip causal decode of the sampled latents.
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    bounds = segment_bounds(inputs.noise.shape[2])
    with torch.no_grad():
        latents = torch.cat([x for *_, x in sample_segments(pipe.transformer, inputs, bounds,
                                                            list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(),
                                                            torch.device("cpu"))], dim=2)
        whole = to_uint8_frames(CausalStreamDecoder(pipe.vae).decode(latents))
    assert np.abs(np.concatenate(chunks).astype(int) - whole.astype(int)).max() <= 1


def cache_tensors(cache) -> list:
    """(data pointer, shape) of every tensor of a `SegmentCache`, in block order."""
    found = []

    def walk(node):
        if isinstance(node, torch.Tensor):
            found.append((node.data_ptr(), tuple(node.shape)))
        elif dataclasses.is_dataclass(node):
            for field in dataclasses.fields(node):
                walk(getattr(node, field.name))
        elif isinstance(node, (list, tuple)):
            for item in node:
                walk(item)

    walk(cache)
    return found


def test_graph_replay_path_gives_the_eager_latents(pipe, monkeypatch):
    """sample_segments(cuda_graphs=True) off CUDA runs the graph bookkeeping without graphs: inputs copied
    into static tensors, one layout per segment shape and cache size, the cache read where it lies. It must
    give the eager latents; the replayed forwards must read the render's cache itself (no copy of it), and
    the steady-state segments (sink + 1 recent segment cached, written in place) must reuse one layout, and
    the cache passes replay once they write the cache in place."""
    import camrender.render.denoise as denoise

    request = request_for(frames=121)  # 16 latent frames: segments (0, 4), (4, 7), ..., (13, 16)
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    bounds = segment_bounds(inputs.noise.shape[2])
    assert len(bounds) == 5
    timesteps = [1000.0, 800.0, 500.0]
    made, reads = [], []

    class Recorded(denoise.GraphedForward):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    model_forward = denoise._model_forward

    def recording(model, options, x, timestep, conditioning, cache, text_keys=None, projected=None, segments=None,
                  write=False):
        if not write:
            reads.append((cache, cache_tensors(cache)))
        return model_forward(model, options, x, timestep, conditioning, cache, text_keys, projected, segments, write)

    monkeypatch.setattr(denoise, "GraphedForward", Recorded)
    monkeypatch.setattr(denoise, "_model_forward", recording)
    runs, addresses = {}, {}
    with torch.no_grad():
        for graphs in (False, True):
            cache = SegmentCache.empty(pipe.transformer)
            reads.clear()
            latents = []
            for index, *_, x in sample_segments(pipe.transformer, inputs, bounds, timesteps, SegmentOptions(),
                                                torch.device("cpu"), cuda_graphs=graphs, cache=cache):
                latents.append(x)
                addresses[graphs, index] = cache_tensors(cache)
            runs[graphs] = torch.cat(latents, dim=2)
            assert all(seen is cache for seen, _ in reads)  # the render's cache object, never a copy of it
    torch.testing.assert_close(runs[True], runs[False], rtol=0, atol=0)
    # every forward read the cache's own tensors: the addresses it saw are the cache's after the segment before
    graphed_reads = [tensors for _, tensors in reads]
    per_segment = len(timesteps)
    for index in range(1, len(bounds)):
        for tensors in graphed_reads[index * per_segment:(index + 1) * per_segment]:
            assert tensors == addresses[True, index - 1]
    # once segment 1 has filled the window (sink + one recent segment) the cache passes write in place
    assert addresses[True, 0] != addresses[True, 1]
    assert addresses[True, 1] == addresses[True, 2] == addresses[True, 3] == addresses[True, 4]
    graphs, write_graphs = made
    # only the first layout (segment 0) runs eagerly: segments 1 and 2 set theirs up at their first pass (no
    # capture to count on the CPU); segments 3 and 4 replay segment 2's layout
    assert graphs.stats == {"eager": 1, "captures": 0, "replays": len(bounds) * per_segment - 1}
    # the cache passes: segments 0 and 1 grow the cache (eager, no graph), segment 2 writes it in place (eager:
    # it warms the write graph's layout), segment 3 sets the graph up at once (no warm-up call), segment 4 replays
    assert write_graphs.stats == {"eager": 0, "captures": 0, "replays": 2}


@pytest.mark.parametrize("graphs", [False, True])
def test_plucker_maps_projected_once_per_segment_give_the_same_latents(pipe, monkeypatch, graphs):
    """`SegmentOptions.plucker_once`: the denoiser projects a segment's Plucker maps for every block once, for all
    of the segment's passes, into the same tensors from segment to segment while their shape holds (the graphs
    read them where they are): the latents of every block projecting them in every pass, bit for bit."""
    import camrender.model.stage1.block as block_module

    request = request_for(frames=121)  # 16 latent frames: segments (0, 4), (4, 7), ..., (13, 16)
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    bounds = segment_bounds(inputs.noise.shape[2])
    timesteps = [1000.0, 800.0, 500.0]
    projecting = sum(hasattr(block, "plucker_proj") for block in pipe.transformer.blocks)
    assert projecting > 0
    calls = []
    projection = block_module.plucker_projection

    def counted(block, plucker, out=None):
        made = projection(block, plucker, out=out)
        calls.append(made.data_ptr())
        return made

    monkeypatch.setattr(block_module, "plucker_projection", counted)  # plucker_projections calls it there too
    runs = {}
    with torch.no_grad():
        for once in (False, True):
            calls.clear()
            runs[once] = torch.cat([x for *_, x in sample_segments(
                pipe.transformer, inputs, bounds, timesteps, SegmentOptions(plucker_once=once), torch.device("cpu"),
                cuda_graphs=graphs)], dim=2)
            passes = len(timesteps) + 1  # the denoising passes and the cache pass
            assert len(calls) == projecting * len(bounds) * (1 if once else passes)
            if once:  # segment 0 (4 frames) has its own tensors; segments 1-4 (3 frames) share theirs
                per_segment = [calls[i * projecting:(i + 1) * projecting] for i in range(len(bounds))]
                assert per_segment[1] == per_segment[2] == per_segment[3] == per_segment[4] != per_segment[0]
    assert torch.equal(runs[True], runs[False])


def test_graph_replay_reads_resident_arguments_in_place():
    """A resident argument is never copied: the replay reads its tensors themselves, values written in place
    included; a resident tensor in new storage is a new layout (eager first, then set up again)."""
    from camrender.model.graphs import GraphedForward

    seen = []

    def forward(x, state):
        seen.append(state["bias"].data_ptr())
        return x + state["bias"]

    graphs = GraphedForward(forward, capture=False, resident=(1,))
    bias = torch.zeros(3)
    state = {"bias": bias}
    assert [graphs(torch.ones(3), state).tolist() for _ in range(3)] == [[1.0] * 3] * 3
    assert graphs.stats == {"eager": 1, "captures": 0, "replays": 2}
    assert set(seen) == {bias.data_ptr()}
    bias += 2.0  # written in place: read as it is now, the same layout
    assert graphs(torch.ones(3), state).tolist() == [3.0] * 3
    assert graphs.stats["eager"] == 1 and graphs._replay.inputs[1] is None  # the graph holds no reference to it
    state["bias"] = torch.full((3,), 5.0)  # new storage: a new layout
    assert graphs(torch.ones(3), state).tolist() == [6.0] * 3
    assert graphs.stats["eager"] == 2


def test_graph_replay_warmed_layout_sets_up_at_its_first_call():
    """After `warmed` (the caller ran the forward on that layout itself) the first call sets the graph up
    at once; another layout still runs eagerly first."""
    from camrender.model.graphs import GraphedForward

    graphs = GraphedForward(lambda x, state: x * state["scale"], capture=False, resident=(1,))
    state = {"scale": torch.tensor(2.0)}
    graphs.warmed(torch.zeros(3), state)
    assert graphs(torch.ones(3), state).tolist() == [2.0] * 3
    assert graphs.stats == {"eager": 0, "captures": 0, "replays": 1}
    graphs(torch.ones(3), {"scale": torch.tensor(2.0)})  # the resident tensor in new storage: not warmed
    assert graphs.stats["eager"] == 1


def test_graph_replay_sets_new_layouts_up_at_once_when_asked():
    """`capture_new_layouts`: only the first layout warms up eagerly; a later layout is set up at its first call, and
    its results are still the forward's."""
    from camrender.model.graphs import GraphedForward

    for capture_new, eager in ((False, 3), (True, 1)):
        graphs = GraphedForward(lambda x: x * 2.0, capture=False, capture_new_layouts=capture_new)
        results = [graphs(torch.full((size,), 1.0)).tolist() for size in (3, 3, 4, 4, 5)]
        assert results == [[2.0] * 3] * 2 + [[2.0] * 4] * 2 + [[2.0] * 5]
        assert graphs.stats == {"eager": eager, "captures": 0, "replays": 5 - eager}


@pytest.mark.parametrize("failures, enabled", [(1, True), (2, False)])
def test_a_capture_out_of_memory_empties_the_cache_and_is_tried_once_more(monkeypatch, failures, enabled):
    """During a capture PyTorch's allocator does not return its cached blocks to the driver: a capture that runs out
    of memory empties the cache and is tried once more, the graphs staying on; out of memory again, the instance
    runs eagerly for good. The results are the forward's either way."""
    from camrender.model.graphs import GraphedForward

    emptied, record = [], GraphedForward._record
    left = [failures]

    def running_out(self, inputs):
        if left[0]:
            left[0] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return record(self, inputs)

    monkeypatch.setattr(GraphedForward, "_record", running_out)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    graphs = GraphedForward(lambda x: x + 1.0, capture=False)
    results = [graphs(torch.full((3,), float(i))).tolist() for i in range(3)]
    assert results == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
    assert graphs.enabled == enabled and emptied == [True]
    assert graphs.stats == ({"eager": 1, "captures": 0, "replays": 2} if enabled else
                            {"eager": 3, "captures": 0, "replays": 0})


def test_graph_replay_reuses_a_layout():
    from camrender.model.graphs import GraphedForward

    calls = []

    def forward(x, state):
        calls.append(x.data_ptr())
        return x * state["scale"][0]

    graphs = GraphedForward(forward, capture=False)
    state = {"scale": [torch.tensor(2.0)]}
    outs = [graphs(torch.full((3,), float(i)), state) for i in range(4)]
    assert [float(o[0]) for o in outs] == [0.0, 2.0, 4.0, 6.0]
    assert graphs.stats == {"eager": 1, "captures": 0, "replays": 3}
    assert len(set(calls[1:])) == 1 and calls[0] != calls[1]  # replays read one static input
    graphs(torch.ones(5), state)  # a new layout: eager first
    assert graphs.stats["eager"] == 2


def test_graph_replay_copies_only_changed_inputs(monkeypatch):
    """An input that is the object copied last time, unmodified, is not copied again; a new object or
    one modified in place is."""
    from camrender.model.graphs import GraphedForward

    graphs = GraphedForward(lambda x, state: x + state["bias"], capture=False)
    bias = torch.zeros(3)
    graphs(torch.ones(3), {"bias": bias})  # first sight: eager
    copied = []
    copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *args: copied.append(src) or copy(self, src, *args))
    assert graphs(torch.ones(3), {"bias": bias}).tolist() == [1.0] * 3  # set up: both inputs copied
    assert len(copied) == 2
    copied.clear()
    assert graphs(torch.ones(3), {"bias": bias}).tolist() == [1.0] * 3
    assert len(copied) == 1  # only the new x
    bias += 2.0  # modified in place: copied again
    assert graphs(torch.ones(3), {"bias": bias}).tolist() == [3.0] * 3
    assert graphs(torch.ones(3), {"bias": torch.full((3,), 5.0)}).tolist() == [6.0] * 3  # another object


def test_path_longer_than_the_rope_table_is_a_user_error(pipe):
    from camrender.errors import CamrenderError

    frames = 8 * pipe.transformer.rope.max_seq_len + 1
    with pytest.raises(CamrenderError, match="at most 8185 frames") as error:
        next(render_frames(pipe, request_for(frames=frames)))
    assert error.value.field == "frames"


def test_step_list():
    from diffusers import FlowMatchEulerDiscreteScheduler

    assert segment_timesteps(None, None) == [1000.0, 960.0, 889.0, 727.0]
    eight = segment_timesteps(FlowMatchEulerDiscreteScheduler(), 8)
    assert len(eight) == 8 and eight[0] == 1000.0 and eight == sorted(eight, reverse=True) and eight[-1] > 0


def test_cli_segments_mode_writes_a_playable_video(tmp_path, monkeypatch):
    import imageio.v3 as iio

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU render path, as a user runs it (kernels: own tests)
    from camrender.cli.main import main

    out = tmp_path / "orbit.mp4"
    traj = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"
    with pytest.raises(SystemExit) as done:
        main(["--traj", str(traj), "--out", str(out), "--model", "tiny", "--mode", "segments", "--frames", "25",
              "--height", "32", "--width", "32", "--steps", "2", "--guidance", "1", "--segment-frames", "1"])
    assert done.value.code == 0
    frames = np.stack(list(iio.imiter(out)))
    assert frames.shape == (25, 32, 32, 3)
    assert not list(tmp_path.glob(".orbit.mp4.*"))  # no partial file left behind


@pytest.mark.parametrize("fmt", ["chunk_causal_safetensors", "streaming_pt"])
def test_original_format_dit_files_load_and_render(tmp_path, fmt):
    """Tiny chunk-causal (.safetensors) and streaming (.pt: `generator` entry, `model.` prefixes) files
    load into a differently-initialised transformer, which then gives the source model's segment outputs."""
    from safetensors.torch import save_file

    from camrender.model.stage1.loading import load_transformer_weights

    source = patch_transformer(build_tiny_transformer(seed=5), kernels="torch")
    state = {name: tensor.clone().contiguous() for name, tensor in source.state_dict().items()}
    if fmt == "chunk_causal_safetensors":
        path = tmp_path / "sana_wm_chunk_causal_tiny.safetensors"
        original = {name.replace("t_embedder.linear_", "t_embedder.mlp.").replace("mlp.1.", "mlp.0."): tensor
                    for name, tensor in state.items()}
        save_file({**original, "pos_embed": torch.zeros(1, 4, 32)}, str(path))
    else:
        path = tmp_path / "model.pt"
        torch.save({"generator": {f"model.{name}": tensor for name, tensor in state.items()}, "step": 7}, path)

    target = build_tiny_transformer(seed=6)
    report = load_transformer_weights(target, path)
    assert set(report.loaded) == set(state) and not report.missing
    for name, tensor in target.state_dict().items():
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=0)

    latents = torch.randn(1, 8, 4, 2, 2, generator=torch.Generator().manual_seed(1))
    text, mask = torch.randn(1, 1, 5, 32), torch.ones(1, 5, dtype=torch.long)
    timestep = torch.tensor([[[0.0, 889.0, 889.0, 889.0]]])
    patch_transformer(target, kernels="torch")
    with torch.no_grad():
        expected = segment_forward(source, latents, timestep, text, mask)
        got = segment_forward(target, latents, timestep, text, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
