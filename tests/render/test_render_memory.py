"""Memory a render leaves behind: nothing beyond the weights once it has ended, without a garbage collection.

A reference cycle among a render's objects (e.g. the denoiser and its CUDA-graph replay, whose static
copies include the segment cache) keeps their tensors until Python's cycle collector happens to run:
on a GPU, about 1 GiB more allocated at the start of the next render. These tests switch the collector
off and count the bytes of the tensors still alive after a render.
"""
import dataclasses
import gc
import warnings
import weakref

import numpy as np
import pytest
import torch

from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.segments import SegmentOptions
from camrender.model.stage1.tiny import build_tiny_pipeline
from camrender.render.denoise import Denoiser
from camrender.render.inputs import prepare_inputs
from camrender.render.loop import render_frames
from camrender.render.pipeline import pipeline_settings
from helpers import render_request
from camrender.trajectory import Trajectory

FRAMES = 57  # 8 latent frames: segments (0, 4), (4, 8)
SIZE = 32


@pytest.fixture(scope="module")
def pipe():
    pipe = build_tiny_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    patch_transformer(pipe.transformer, kernels="torch")
    return pipe


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def request_for(mode):
    c2w = np.tile(np.eye(4), (FRAMES, 1, 1))
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, FRAMES)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (FRAMES, 1)), width=SIZE,
                      height=SIZE, fps=16)
    return render_request(traj=traj, prompt="a quiet street", steps=2 if mode == "full" else None, guidance=1.0,
                          num_frames=FRAMES, height=SIZE, width=SIZE, model="tiny", dtype="float32",
                          kernels="torch", mode=mode, recipe="streaming")


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of the live tensors the collector tracks (parameters and buffers included)."""
    storages = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # isinstance on torch.distributed's deprecated names
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("mode,graphs", [("segments", True), ("segments", False), ("full", True)])
def test_a_render_leaves_no_tensors_behind(pipe, no_gc, mode, graphs):
    request = request_for(mode)
    settings = dataclasses.replace(pipeline_settings(pipe, request), cuda_graphs=graphs)  # replay on CPU copies
    list(render_frames(pipe, request, settings=settings))  # warm-up: module-level caches (prompts) fill here
    before = live_tensor_bytes()
    for _ in range(2):
        chunks = list(render_frames(pipe, request, settings=settings))
    assert sum(len(chunk) for chunk in chunks) == FRAMES
    del chunks
    assert live_tensor_bytes() - before == 0


def test_the_denoiser_dies_with_its_last_reference(pipe, no_gc):
    """The graph replay must not refer back to its denoiser (a cycle outlives the render)."""
    inputs = prepare_inputs(pipe, request_for("segments"), torch.device("cpu"))
    denoiser = Denoiser(pipe.transformer, inputs, SegmentOptions(), "cpu", cuda_graphs=True)
    assert denoiser.graphs is not None
    alive = weakref.ref(denoiser)
    del denoiser
    assert alive() is None
