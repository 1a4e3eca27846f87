"""The camera path as a stream (`camrender.render.camera_feed`): per-segment cameras pulled as the
segment loop needs them give the same tensors and the same video, bit for bit, as the whole path."""
import numpy as np
import pytest
import torch

from camrender.errors import CamrenderError
from camrender.model.stage1.recipes import segment_bounds
from camrender.model.stage1.tiny import build_tiny_pipeline
from camrender.render.camera import build_camera_inputs
from camrender.render.camera_feed import CameraFeed, SegmentCamera, trajectory_segments, video_frames
from camrender.render.loop import render_frames
from camrender.trajectory import Trajectory


def curved_path(frames, size=32):
    """A path that trucks, pushes in and pans (every pose different), intrinsics of a 48x40 image."""
    angle = np.linspace(0.0, 0.5, frames)
    c2w = np.tile(np.eye(4), (frames, 1, 1))
    c2w[:, 0, 0], c2w[:, 0, 2], c2w[:, 2, 0], c2w[:, 2, 2] = np.cos(angle), np.sin(angle), -np.sin(angle), np.cos(angle)
    c2w[:, :3, 3] = np.stack([np.linspace(0.3, 1.0, frames), np.sin(angle), np.linspace(0.2, 0.7, frames)], axis=1)
    intrinsics = np.tile([40.0, 41.0, 24.0, 20.0], (frames, 1)) + np.linspace(0, 2, frames)[:, None]
    return Trajectory(c2w=c2w, intrinsics=intrinsics, width=48, height=40, fps=16)


def test_segments_tile_the_video_frames():
    bounds = segment_bounds(8, 3)  # (0, 5), (5, 8)
    assert [video_frames(*b) for b in bounds] == [(0, 33), (33, 57)]
    traj = curved_path(57)
    pieces = list(trajectory_segments(traj, bounds))
    np.testing.assert_array_equal(np.concatenate([p.c2w for p in pieces]), traj.c2w)


@pytest.mark.parametrize("frames, bounds", [(57, [(0, 5), (5, 8)]), (57, [(0, 1), (1, 2), (2, 8)]), (9, [(0, 1), (1, 2)]),
                                            (1, [(0, 1)])])
def test_feed_equals_the_whole_path_tensors_bit_for_bit(frames, bounds):
    traj = curved_path(frames)
    whole = build_camera_inputs(traj, height=32, width=32, vae_stride=(8, 8, 8))
    feed = CameraFeed(trajectory_segments(traj, bounds), num_frames=frames, height=32, width=32, vae_stride=(8, 8, 8))
    for start, stop in bounds:
        conditions, plucker = feed.take(start, stop)
        assert torch.equal(conditions[0], whole["camera_conditions"][start:stop])
        assert torch.equal(plucker[0], whole["chunk_plucker"][:, start:stop])
    assert feed.received == frames


def test_feed_pulls_only_what_the_frames_read():
    traj = curved_path(57)
    feed = CameraFeed(trajectory_segments(traj, [(0, 1), (1, 2), (2, 5), (5, 8)]), num_frames=57, height=32,
                      width=32, vae_stride=(8, 8, 8))
    feed.take(0, 1)  # latent frame 0's Plucker window is video frames 0..7: the second item holds 1..8
    assert feed.pulls == 2
    feed.take(1, 2)
    assert feed.pulls == 2
    feed.take(2, 5)
    assert feed.pulls == 3


def test_a_stream_that_ends_early_or_runs_long_is_a_one_line_error():
    traj = curved_path(57)
    short = CameraFeed(trajectory_segments(traj, [(0, 5)]), num_frames=57, height=32, width=32, vae_stride=(8, 8, 8))
    with pytest.raises(CamrenderError, match="ended after 33 frames"):
        short.take(5, 8)
    long = CameraFeed(iter([SegmentCamera(traj.c2w, traj.intrinsics, 48, 40)]), num_frames=49, height=32, width=32,
                      vae_stride=(8, 8, 8))
    with pytest.raises(CamrenderError, match="more than the render's 49 frames"):
        long.take(0, 1)
    bad = traj.c2w.copy()
    bad[40, 0, 0] = np.nan
    broken = CameraFeed(trajectory_segments(Trajectory(bad, traj.intrinsics, 48, 40, 16), [(0, 5), (5, 8)]),
                        num_frames=57, height=32, width=32, vae_stride=(8, 8, 8))
    broken.take(0, 5)
    with pytest.raises(CamrenderError, match="frame 40"):
        broken.take(5, 8)


@pytest.mark.parametrize("recipe, steps, guidance", [("streaming", None, 1.0), ("chunk-causal", 3, 3.0)])
def test_a_generator_of_segments_renders_the_same_video_bit_for_bit(recipe, steps, guidance):
    """The segment loop pulls segment k's cameras when it starts segment k: a generator yielding the
    path one segment at a time (with no trajectory in the request) renders the very same frames."""
    from test_segments_render import request_for

    pipe = build_tiny_pipeline(seed=0)
    traj = curved_path(57)
    whole = request_for(traj=traj, recipe=recipe, steps=steps, guidance=guidance, seed=4)
    expected = list(render_frames(pipe, whole))
    events = []

    def cameras():
        for index, piece in enumerate(trajectory_segments(traj, segment_bounds(8, 3))):  # (0, 5), (5, 8)
            events.append(f"cameras {index}")
            yield piece

    streamed = request_for(traj=None, cameras=cameras(), recipe=recipe, steps=steps, guidance=guidance, seed=4)
    got = []
    for frames in render_frames(pipe, streamed):
        events.append(f"frames {len(got)}")
        got.append(frames)
    assert len(got) == len(expected) == 2  # chunk-causal: the teacher's (0, 4), (4, 8), not the pieces' layout
    for ours, theirs in zip(got, expected):
        np.testing.assert_array_equal(ours, theirs)
    if recipe == "streaming":  # the second segment's cameras are asked for after the first one's frames
        assert events == ["cameras 0", "frames 0", "cameras 1", "frames 1"]
