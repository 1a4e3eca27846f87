"""The chunk-causal teacher's sampler (camrender.render.chunk_causal) on a tiny random model.

Anchors: the schedule and chunk layout follow ChunkFlowEuler / get_chunk_index_from_config; the
state-passing sampler (finished chunks cached once, in-flight chunks in one multi-segment call)
equals the official loop's recomputation of every started chunk at every global step (here through
`dense_reference_forward` with attention over all earlier chunks).
"""
import pytest
import torch

from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.segments import SegmentCache, SegmentOptions, dense_reference_forward, segment_forward
from camrender.model.stage1.tiny import build_tiny_transformer
from camrender.render.chunk_causal import euler_dt, sample_chunk_causal, teacher_chunk_bounds, teacher_schedule
from camrender.render.inputs import RenderInputs
from helpers import rel
from test_segments_forward import camera_inputs

TEACHER = SegmentOptions(cached_segments=None, sdpa_dtype=torch.float32)


@pytest.fixture(scope="module")
def model():
    return patch_transformer(build_tiny_transformer(seed=0), kernels="torch")


def test_teacher_chunks_put_the_remainder_into_the_last_chunk():
    assert teacher_chunk_bounds(21) == [(0, 4), (4, 7), (7, 10), (10, 13), (13, 16), (16, 21)]
    assert teacher_chunk_bounds(16) == [(0, 4), (4, 7), (7, 10), (10, 13), (13, 16)]
    assert teacher_chunk_bounds(17) == [(0, 4), (4, 7), (7, 10), (10, 13), (13, 17)]
    assert teacher_chunk_bounds(4) == [(0, 4)]
    assert teacher_chunk_bounds(6) == [(0, 6)]


def test_staggered_schedule_starts_and_finishes():
    schedule = teacher_schedule(3, steps=60)
    assert schedule.starts == (0, 20, 40) and schedule.total == 100
    assert schedule.timestep(1, 19) == -1.0 and schedule.timestep(1, 20) == schedule.timesteps[0] == 1000.0
    assert schedule.timestep(0, 60) == 0.0 and schedule.timestep(2, 99) == schedule.timesteps[-1]
    assert float(schedule.sigmas[-1]) == 0.0 and len(schedule.sigmas) == 61
    assert teacher_schedule(4, steps=6).starts == (0, 1, 3, 4)  # int(i * 0.25 * 6)


def test_euler_dt_is_the_schedule_gap_and_zero_at_timestep_zero():
    schedule = teacher_schedule(1, steps=8)
    t = torch.tensor([schedule.timesteps[0], schedule.timesteps[3], schedule.timesteps[-1], 0.0])
    dt = euler_dt(t, schedule.sigmas)
    sig = schedule.sigmas
    expected = torch.tensor([sig[0] - sig[1], sig[3] - sig[4], sig[-2], 0.0])
    torch.testing.assert_close(dt, expected, rtol=0, atol=2e-7)


def _inputs(model, frames, guidance, seed=0):
    height, width, batch = 2, 3, 2 if guidance > 1 else 1
    generator = torch.Generator().manual_seed(seed)
    conditions, plucker = camera_inputs(batch, frames, height, width)
    text = torch.randn(batch, 1, 6, 32, generator=generator)
    mask = torch.ones(batch, 6, dtype=torch.long)
    mask[:, -2:] = 0
    noise = torch.randn(1, 8, frames, height, width, generator=generator)
    first = torch.randn(1, 8, 1, height, width, generator=generator)
    noise[:, :, :1] = first
    return RenderInputs(text=text, text_mask=mask, camera_conditions=conditions, chunk_plucker=plucker[:1],
                        first_latent=first, noise=noise, guidance=guidance)


def _recomputing_sampler(model, inputs, bounds, schedule):
    """The official loop: every global step runs the model on all started chunks (finished ones at t = 0)."""
    latents = inputs.noise.clone()
    batch = inputs.text.shape[0]
    for step in range(schedule.total):
        active = [i for i in range(len(bounds)) if schedule.timestep(i, step) >= 0]
        end = bounds[active[-1]][1]
        frame_t = torch.cat([torch.full((bounds[i][1] - bounds[i][0],), schedule.timestep(i, step)) for i in active])
        frame_t[0] = 0.0
        pred = dense_reference_forward(
            model, latents[:, :, :end].expand(batch, -1, -1, -1, -1), frame_t.view(1, 1, -1).expand(batch, 1, -1),
            inputs.text, inputs.text_mask, segments=[bounds[i] for i in active],
            camera_conditions=inputs.camera_conditions[:, :end], chunk_plucker=inputs.chunk_plucker[:, :, :end],
            options=TEACHER).float()
        if batch == 2:
            pred = pred[:1] + inputs.guidance * (pred[1:] - pred[:1])
        latents[:, :, :end] = latents[:, :, :end] - euler_dt(frame_t, schedule.sigmas).view(1, 1, -1, 1, 1) * pred
    return latents


@pytest.mark.parametrize("frames,guidance,interval_k", [(10, 5.0, None), (11, 1.0, 0.5)])
def test_state_passing_equals_recomputing_every_started_chunk(model, frames, guidance, interval_k):
    bounds = teacher_chunk_bounds(frames)
    schedule = teacher_schedule(len(bounds), steps=4, flow_shift=3.0, interval_k=interval_k)
    inputs = _inputs(model, frames, guidance)
    with torch.no_grad():
        expected = _recomputing_sampler(model, inputs, bounds, schedule)
        finished = list(sample_chunk_causal(model, inputs, bounds, schedule, TEACHER, "cpu"))
    assert [(i, a, b) for i, a, b, _ in finished] == [(i, a, b) for i, (a, b) in enumerate(bounds)]
    ours = torch.cat([x for *_, x in finished], dim=2)
    assert torch.equal(ours[:, :, :1], inputs.first_latent)
    assert rel(ours, expected) < 2e-5, rel(ours, expected)
    assert rel(ours, inputs.noise) > 0.1  # it did denoise


def test_multi_segment_call_from_a_cache_attends_to_every_earlier_segment(model):
    """Frames [4, 10) as two segments after a cached [0, 4) equal the dense block-causal forward."""
    frames, batch = 10, 1
    inputs = _inputs(model, frames, 1.0, seed=3)
    conditions, plucker, text, mask = inputs.camera_conditions, inputs.chunk_plucker, inputs.text, inputs.text_mask
    latents = torch.randn(batch, 8, frames, 2, 3, generator=torch.Generator().manual_seed(4))
    timestep = torch.tensor([0.0] * 4 + [700.0] * 3 + [900.0] * 3).view(1, 1, -1)
    with torch.no_grad():
        dense = dense_reference_forward(model, latents, timestep, text, mask, segments=[(0, 4), (4, 7), (7, 10)],
                                        camera_conditions=conditions, chunk_plucker=plucker, options=TEACHER)
        cache = SegmentCache.empty(model)
        segment_forward(model, latents[:, :, :4], timestep[..., :4], text, mask, camera_conditions=conditions[:, :4],
                        chunk_plucker=plucker[:, :, :4], cache=cache, write_cache=True, options=TEACHER)
        ours = segment_forward(model, latents[:, :, 4:], timestep[..., 4:], text, mask, frame_start=4,
                               camera_conditions=conditions[:, 4:], chunk_plucker=plucker[:, :, 4:], cache=cache,
                               segments=[(0, 3), (3, 6)], options=TEACHER)
    assert rel(ours, dense[:, :, 4:]) < 1e-5
    with torch.no_grad(), pytest.raises(ValueError, match="cached_segments=None"):
        segment_forward(model, latents[:, :, 4:], timestep[..., 4:], text, mask, frame_start=4,
                        camera_conditions=conditions[:, 4:], chunk_plucker=plucker[:, :, 4:], cache=cache,
                        segments=[(0, 3), (3, 6)], options=SegmentOptions(cached_segments=2))


def test_render_segments_runs_the_teacher_sampler_and_streams_each_finished_chunk():
    """The chunk-causal recipe in segment mode: teacher layout, staggered schedule with guidance, one
    decoded piece per chunk, equal to the sampler's latents decoded as a whole clip."""
    import numpy as np

    from camrender.model.stage1.tiny import build_tiny_pipeline
    from camrender.render.decode import CausalStreamDecoder, to_uint8_frames
    from camrender.render.inputs import prepare_inputs
    from camrender.render.loop import render_frames
    from test_segments_render import request_for

    pipe = build_tiny_pipeline(seed=0)
    request = request_for(frames=73, recipe="chunk-causal", steps=3, guidance=5.0)  # 10 latent frames
    calls = []
    chunks = list(render_frames(pipe, request, lambda done, total, info, **_: calls.append((done, total))))
    assert [len(chunk) for chunk in chunks] == [25, 24, 24] and calls == [(1, 3), (2, 3), (3, 3)]
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    bounds = teacher_chunk_bounds(inputs.noise.shape[2])
    options = SegmentOptions(cached_segments=None)
    with torch.no_grad():
        latents = torch.cat([x for *_, x in sample_chunk_causal(pipe.transformer, inputs, bounds,
                                                                teacher_schedule(3, steps=3), options, "cpu")], dim=2)
        whole = to_uint8_frames(CausalStreamDecoder(pipe.vae).decode(latents))
    assert np.abs(np.concatenate(chunks).astype(int) - whole.astype(int)).max() <= 1
