"""The decode beside the next segment's stage 1 without a refiner (`refined_frames` with a pass-through), and the
checkpoint gate that keeps a saved state consistent when frames are yielded one segment late."""
import numpy as np
import pytest
import torch

from camrender.model.stage1.tiny import build_tiny_pipeline
from camrender.render.decode import CausalStreamDecoder
from camrender.render.stage_two import PassThrough, refined_frames


@pytest.fixture(scope="module")
def vae():
    return build_tiny_pipeline(seed=0).vae


def latent_chunks(vae, lengths=(4, 3, 3, 3), seed=0):
    generator = torch.Generator().manual_seed(seed)
    channels = vae.config.latent_channels
    return [torch.randn(1, channels, n, 4, 4, generator=generator) for n in lengths]


def run(vae, chunks, **options):
    """[(count, frames, chunks taken when the frames came out)] and the video."""
    taken = []

    def source():
        for index, chunk in enumerate(chunks):
            taken.append(index)
            yield chunk

    events, video = [], []
    with torch.no_grad():
        for count, frames in refined_frames(PassThrough(), source(), CausalStreamDecoder(vae), "cpu", **options):
            events.append((count, len(frames), len(taken)))
            video.append(frames)
    return events, np.concatenate(video)


def test_pass_through_overlap_gives_the_same_frames_one_segment_later(vae):
    chunks = latent_chunks(vae)
    inline_events, inline_video = run(vae, chunks, overlap=False)
    overlap_events, overlap_video = run(vae, chunks, overlap=True)
    assert [taken for *_, taken in inline_events] == [1, 2, 3, 4]
    assert [taken for *_, taken in overlap_events] == [2, 3, 4, 4]
    assert [e[:2] for e in overlap_events] == [e[:2] for e in inline_events]
    assert np.array_equal(overlap_video, inline_video)


def test_hold_yields_the_waiting_segment_before_the_next_is_taken(vae):
    """A checkpoint after chunk 2 (hold(2) True): its frames come out while only 2 chunks have been taken."""
    asked = []

    def hold(count):
        asked.append(count)
        return count == 2

    events, video = run(vae, latent_chunks(vae), overlap=True, hold=hold)
    assert asked == [1, 2, 3, 4]  # the last is asked too: the source may hold more
    assert [taken for *_, taken in events] == [2, 2, 4, 4]
    assert np.array_equal(video, run(vae, latent_chunks(vae), overlap=False)[1])
