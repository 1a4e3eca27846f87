"""Whether a refined render gives its stages CUDA streams of their own: only where the GPU has room for the streams'
own caches (`camrender.render.stage_two.room_for_overlap`), read from the device's memory, the process's cap, what
is allocated and what other processes hold; elsewhere the same order on one stream. CUDA's queries are replaced by
a card's figures, so this runs on a CPU."""
from types import SimpleNamespace

import pytest
import torch

from camrender.render import stage_two

GIB = 2**30


@pytest.fixture
def card(monkeypatch):
    """card(total_gib, allocated_gib, fraction, others_gib, cached_gib): CUDA's memory queries answer with these
    figures (fraction None: a PyTorch without `get_per_process_memory_fraction`; others_gib: held by other
    processes; cached_gib: this process's allocator holds it unallocated)."""
    def make(total_gib, allocated_gib, fraction=1.0, others_gib=0.0, cached_gib=0.0):
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda index: SimpleNamespace(total_memory=int(total_gib * GIB)))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index=None: int(allocated_gib * GIB))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: int((allocated_gib + cached_gib) * GIB))
        free = total_gib - allocated_gib - cached_gib - others_gib
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (int(free * GIB), int(total_gib * GIB)))
        if fraction is None:
            monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction", raising=False)
        else:
            monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda index=None: fraction)
    return make


def test_a_large_card_has_room_for_the_streams_and_a_48gb_card_has_not(card):
    card(139.8, 27.0)  # an H200 with the bf16 refined pipeline's weights on it
    assert stage_two.room_for_overlap("cuda")
    card(44.5, 27.0)  # a 48 GB card
    assert not stage_two.room_for_overlap("cuda:0")


def test_the_process_cap_counts(card):
    card(139.8, 27.0, fraction=44 / 139.8)  # the H200 capped as a 48 GB card
    assert not stage_two.room_for_overlap("cuda")
    card(139.8, 27.0, fraction=None)  # no cap query in this PyTorch: the whole card
    assert stage_two.room_for_overlap("cuda")


def test_the_threshold_is_the_room_left(card, monkeypatch):
    monkeypatch.setattr(stage_two, "OVERLAP_MIN_ROOM_GIB", 10)
    card(40.0, 30.5)
    assert not stage_two.room_for_overlap("cuda")
    card(40.0, 29.5)
    assert stage_two.room_for_overlap("cuda")


def test_other_processes_memory_counts_and_the_allocators_cache_does_not(card):
    card(139.8, 27.0, others_gib=90.0)  # an H200 shared with another job
    assert not stage_two.room_for_overlap("cuda")
    card(139.8, 27.0, others_gib=70.0)
    assert stage_two.room_for_overlap("cuda")
    card(139.8, 27.0, cached_gib=80.0)  # this process's own cache is room for it
    assert stage_two.room_for_overlap("cuda")


def test_off_cuda_there_is_always_room():
    assert stage_two.room_for_overlap("cpu")


class _Refined(stage_two.PassThrough):
    """A pass-through standing in for a `RefinerStream` (what `refined_frames` checks for a refined render)."""


@pytest.mark.parametrize("room", [True, False])
def test_a_refined_render_without_room_keeps_the_overlap_order_on_one_stream(monkeypatch, room):
    """With a refiner and no room for the streams' caches, the default schedule is the overlapped one on the render's
    own stream: chunk k's frames still come out after chunk k+1 is taken (the host runs a segment ahead), the
    frames are the same, and no stage gets a stream of its own."""
    from test_decode_overlap import latent_chunks
    from camrender.model.stage1.tiny import build_tiny_pipeline
    from camrender.render.decode import CausalStreamDecoder

    monkeypatch.setattr(stage_two, "RefinerStream", _Refined)
    monkeypatch.setattr(stage_two, "room_for_overlap", lambda device: room)
    schedules = []
    original = stage_two._StageStreams.__init__

    def record(self, device, schedule):
        schedules.append(schedule)
        original(self, device, schedule)

    monkeypatch.setattr(stage_two._StageStreams, "__init__", record)
    vae = build_tiny_pipeline(seed=0).vae
    chunks, taken = latent_chunks(vae), []

    def source():
        for index, chunk in enumerate(chunks):
            taken.append(index)
            yield chunk

    with torch.no_grad():
        out = [(count, len(taken), frames) for count, frames in
               stage_two.refined_frames(_Refined(), source(), CausalStreamDecoder(vae), "cpu")]
        alone = [frames for _, frames in stage_two.refined_frames(stage_two.PassThrough(), iter(chunks),
                                                                  CausalStreamDecoder(vae), "cpu", overlap=False)]
    assert [s.streams for s in schedules] == [room]
    assert [(count, seen) for count, seen, _ in out] == [(1, 2), (2, 3), (3, 4), (4, 4)]
    assert all((a == b).all() for (_, _, a), b in zip(out, alone)) and len(out) == len(alone)
