"""Stage 2 in a render: segment mode refines each finished segment; full mode the whole clip; the CLI's --refiner."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from camrender.model.refiner.tiny import build_tiny_refiner
from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.segments import SegmentOptions, segment_bounds
from camrender.model.stage1.tiny import build_tiny_pipeline
from camrender.render.decode import CausalStreamDecoder, to_uint8_frames
from camrender.render.inputs import prepare_inputs
from camrender.render.loop import render_frames
from helpers import render_request
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments
from camrender.render.stage_two import attach_refiner
from camrender.trajectory import Trajectory

FRAMES = 81  # 11 latent frames: segments (0, 4), (4, 7), (7, 11); refiner: sink + blocks 1-3, 4-6, 7-9, 10
SIZE = 32
PROMPT = "a quiet street"


@pytest.fixture(scope="module")
def pipe():
    pipe = build_tiny_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    patch_transformer(pipe.transformer, kernels="torch")  # as the CLI does for the requests' --kernels torch
    attach_refiner(pipe, build_tiny_refiner(seed=1))
    return pipe


def request_for(**changes):
    c2w = np.tile(np.eye(4), (FRAMES, 1, 1))
    c2w[:, 0, 3] = np.linspace(0.0, 1.0, FRAMES)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (FRAMES, 1)), width=SIZE, height=SIZE,
                      fps=16)
    fields = dict(traj=traj, prompt=PROMPT, steps=None, guidance=1.0, num_frames=FRAMES, height=SIZE, width=SIZE,
                  model="tiny", dtype="float32", kernels="torch", mode="segments", seed=3, refiner="tiny")
    fields.update(changes)
    return render_request(**fields)


def stage_one(pipe, request):
    inputs = prepare_inputs(pipe, request, torch.device("cpu"))
    with torch.no_grad():
        return torch.cat([x for *_, x in sample_segments(pipe.transformer, inputs, segment_bounds(inputs.noise.shape[2]),
                                                         list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(),
                                                         torch.device("cpu"))], dim=2)


def test_segment_mode_refines_each_segment_as_it_finishes(pipe, monkeypatch):
    request = request_for()
    refiner = pipe._camrender_refiner
    encodes = []
    monkeypatch.setattr(refiner, "_encode_prompt", lambda *a, _encode=refiner._encode_prompt, **k:
                        encodes.append(a) or _encode(*a, **k))
    chunks = list(render_frames(pipe, request))
    assert len(encodes) == 1  # the refiner's prompt is encoded once per render
    # the video still grows segment by segment: 1 + 3*8, 3*8, 3*8 frames, then the clip's 1-frame last block
    assert [len(chunk) for chunk in chunks] == [25, 24, 24, 8]

    # ... and is diffusers' SanaWMLTX2Refiner on the whole stage-1 clip, decoded causally
    latents = stage_one(pipe, request)
    refined = pipe._camrender_refiner(latents, PROMPT, fps=16.0, generator=torch.Generator().manual_seed(3),
                                      output_type="latent")
    with torch.no_grad():
        expected = to_uint8_frames(CausalStreamDecoder(pipe.vae).decode(refined))
        unrefined = to_uint8_frames(CausalStreamDecoder(pipe.vae).decode(latents))
    got = np.concatenate(chunks).astype(int)
    assert np.abs(got - expected.astype(int)).max() <= 1
    assert np.abs(got - unrefined.astype(int)).mean() > 5  # stage 2 really changed the video


def test_full_mode_refines_the_whole_clip(pipe):
    request = request_for(mode="full", steps=2)
    (video,) = list(render_frames(pipe, request))
    attach_refiner(pipe, None)
    try:
        (plain,) = list(render_frames(pipe, request))
    finally:
        attach_refiner(pipe, build_tiny_refiner(seed=1))
    assert video.shape == plain.shape == (FRAMES, SIZE, SIZE, 3)
    assert np.abs(video.astype(int) - plain.astype(int)).mean() > 5


def run_cli(argv):
    from camrender.cli.main import main

    with pytest.raises(SystemExit) as done:
        main([str(a) for a in argv])
    return done.value.code


@pytest.mark.parametrize("mode", ["segments", "full"])
def test_cli_tiny_refiner_writes_a_playable_video(tmp_path, monkeypatch, mode):
    import imageio.v3 as iio

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = tmp_path / "orbit.mp4"
    traj = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"
    code = run_cli(["--traj", traj, "--out", out, "--model", "tiny", "--refiner", "tiny", "--mode", mode,
                    "--frames", "33", "--height", "32", "--width", "32", "--steps", "2", "--guidance", "1",
                    "--kernels", "torch"])
    assert code == 0
    assert np.stack(list(iio.imiter(out))).shape == (33, 32, 32, 3)
    assert not list(tmp_path.glob(".orbit.mp4.*"))


@pytest.mark.parametrize("case", ["not a refiner", "channels"])
def test_cli_bad_refiner_is_one_line_exit_2(tmp_path, capsys, case):
    folder = tmp_path / "refiner"
    if case == "not a refiner":
        (folder / "transformer").mkdir(parents=True)
        (folder / "transformer" / "config.json").write_text('{"_class_name": "SanaWMTransformer3DModel"}')
        expected = "not an LTX-2 refiner: its transformer is a SanaWMTransformer3DModel"
    else:
        build_tiny_refiner(seed=0).save_pretrained(folder)
        capsys.readouterr()
        vae = tmp_path / "vae"
        vae.mkdir()
        (vae / "config.json").write_text('{"_class_name": "AutoencoderKLLTX2Video", "latent_channels": 128}')
        expected = "the refiner works on 8 latent channels but the VAE makes 128"
    work = tmp_path / "work"
    work.mkdir()
    traj = Path(__file__).resolve().parents[2] / "trajectories" / "orbit.json"
    argv = ["--traj", traj, "--out", work / "v.mp4", "--model", "tiny", "--refiner", folder]
    code = run_cli(argv + (["--vae", tmp_path / "vae"] if case == "channels" else []))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == f"camrender: error: {folder}: refiner: {expected}"
    assert not list(work.iterdir())


def test_full_mode_reports_refiner_progress(pipe):
    calls = []
    list(render_frames(pipe, request_for(mode="full", steps=1), lambda *call, **named: calls.append((call, named))))
    refining = [call for call, named in calls if named["stage"] == "stage 2 (refiner)"]
    assert [call[:2] for call in refining] == [(1, 4), (2, 4), (3, 4), (4, 4)]  # blocks 1-3, 4-6, 7-9, 10
    assert {named["unit"] for call, named in calls} == {"step", "block"}
    assert [named["stage"] for call, named in calls][0] == "stage 1"


def test_overlapped_stage_two_yields_each_segment_one_chunk_later(pipe):
    """The overlapped schedule of refined_frames (its stream calls are no-ops on a CPU): same frames,
    and a segment's frames come out only after the next segment has been taken from stage 1."""
    from camrender.render.stage_two import refined_frames, stage_two

    request = request_for()
    latents = stage_one(pipe, request)
    chunks = [latents[:, :, :4], latents[:, :, 4:7], latents[:, :, 7:11]]
    results = {}
    for overlap in (False, True):
        taken = []

        def source():
            for index, chunk in enumerate(chunks):
                taken.append(index)
                yield chunk

        events, video = [], []
        for done, frames in refined_frames(stage_two(pipe, request, "cpu"), source(), CausalStreamDecoder(pipe.vae),
                                           "cpu", overlap=overlap):
            events.append((done, len(frames), len(taken)))
            video.append(frames)
        results[overlap] = events, np.concatenate(video)
    assert results[False][0] == [(1, 25, 1), (2, 24, 2), (3, 24, 3), (3, 8, 3)]
    assert results[True][0] == [(1, 25, 2), (2, 24, 3), (3, 24, 3), (3, 8, 3)]
    assert np.array_equal(results[True][1], results[False][1])


def test_low_latency_order_decodes_a_block_before_its_history_pass(pipe, monkeypatch):
    """In order (the live page's low-latency loop) each refined block's decode is queued before the block's
    history pass (sigma 0, its K/V into the window), so on a GPU the frames do not wait for that pass; the
    overlapped schedule keeps the pass before the decode, as measured. The frames are the same."""
    from camrender.model.refiner.stream import RefinerStream
    from camrender.render.stage_two import refined_frames, stage_two

    request = request_for()
    latents = stage_one(pipe, request)
    chunks = [latents[:, :, :4], latents[:, :, 4:7], latents[:, :, 7:11]]
    forward, decode = RefinerStream._forward, CausalStreamDecoder.decode
    order, videos = [], {}
    monkeypatch.setattr(RefinerStream, "_forward", lambda self, block, sigma, rope, mode: (
        order.append("history" if mode == "inject_and_capture_post_rope" else "pass"),
        forward(self, block, sigma, rope, mode))[1])
    monkeypatch.setattr(CausalStreamDecoder, "decode", lambda self, x: (order.append("decode"), decode(self, x))[1])
    for overlap in (False, True):
        order.clear()
        videos[overlap] = np.concatenate([frames for _, frames in refined_frames(
            stage_two(pipe, request, "cpu"), iter(chunks), CausalStreamDecoder(pipe.vae), "cpu", overlap=overlap)])
        sequence = "".join({"pass": "p", "history": "h", "decode": "d"}[step] for step in order)
        # the sink's capture pass, then blocks of 3 passes (the sink's frame decoded with the first); the
        # clip's last block comes from `finish`, without a history pass (nothing reads the window after it)
        if overlap:
            assert sequence == "p" + "ppphd" * 3 + "pppd", sequence
        else:
            assert sequence == "p" + "pppdh" * 3 + "pppd", sequence
    assert np.array_equal(videos[False], videos[True])


def test_segment_mode_beside_the_refiner_keeps_no_key_slot(pipe, monkeypatch):
    """Beside the refiner memory is short: the softmax blocks' caches hold the cached keys only, no slot for
    a call's keys (`SegmentOptions.key_slot`; the same results either way, tests/model/test_segments_forward)."""
    from camrender.model.stage1.state import BlockCache

    slots = []
    keep_softmax = BlockCache.keep_softmax

    def recorded(self, entry, cached_segments, slot=True):
        slots.append(slot)
        keep_softmax(self, entry, cached_segments, slot)
        assert self.window.key.shape[2] == self.context_tokens()  # the window holds the context, nothing more

    monkeypatch.setattr(BlockCache, "keep_softmax", recorded)
    list(render_frames(pipe, request_for()))
    assert slots and not any(slots)


def test_stage_one_cache_pass_waits_behind_the_frames_of_its_segment(pipe, monkeypatch):
    """Stage 1's cache pass (timestep 0, it only writes the caches the next segment reads) is queued once the
    segment's refinement and decode are (`ChunkPlan.settle`): in order, after the decode, so the live page's
    frames do not wait for it; overlapped, after the refiner's passes, which no longer wait for it on the GPU.
    Each still runs before the next segment's stage 1, and the frames are the same in both orders."""
    from camrender.model.refiner.stream import RefinerStream
    from camrender.render.denoise import Denoiser

    predict, forward, decode = Denoiser.predict, RefinerStream._forward, CausalStreamDecoder.decode
    order = []
    monkeypatch.setattr(Denoiser, "predict", lambda self, *a, write=False, **k: (
        order.append("c" if write else "s"), predict(self, *a, write=write, **k))[1])
    monkeypatch.setattr(RefinerStream, "_forward", lambda self, block, sigma, rope, mode: (
        order.append("h" if mode == "inject_and_capture_post_rope" else "p"), forward(self, block, sigma, rope, mode))[1])
    monkeypatch.setattr(CausalStreamDecoder, "decode", lambda self, x: (order.append("d"), decode(self, x))[1])
    videos, sequences = {}, {}
    for low_latency in (True, False):
        order.clear()
        videos[low_latency] = np.concatenate(list(render_frames(pipe, request_for(), low_latency=low_latency)))
        sequences[low_latency] = re.sub("d+", "d", "".join(order))  # one decode per latent frame, then the segment
    # segments (0, 4), (4, 7), (7, 11): 4 denoising passes each; refiner: the sink's pass, blocks 1-3, 4-6, 7-9
    # (3 passes, then the history pass), the clip's last block 10 from `finish`
    assert sequences[True] == "sssspppp" "d" "h" "c" + "ssssppp" "d" "h" "c" + "ssssppp" "d" "h" "c" + "ppp" "d", \
        sequences[True]
    assert sequences[False] == "sssspppp" "h" "c" "d" + "ssssppp" "h" "c" "d" + "ssssppp" "h" "c" "d" + "ppp" "d", \
        sequences[False]
    assert np.array_equal(videos[True], videos[False])


def test_a_held_cache_pass_must_be_flushed_before_the_next_is_held():
    """Flushed late, a held cache pass would write the caches after the next segment had read them."""
    from camrender.render.segments import HeldCacheWrite

    ran = []
    held = HeldCacheWrite()
    held.hold(lambda: ran.append(1))
    with pytest.raises(RuntimeError, match="not flushed"):
        held.hold(lambda: ran.append(2))
    held.flush()
    held.flush()  # nothing held: nothing runs
    held.hold(lambda: ran.append(3))
    held.flush()
    assert ran == [1, 3]
