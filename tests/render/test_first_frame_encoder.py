"""The VAE's encoder leaves the render device once the first frame is encoded (`camrender.render.inputs.encoding_on`):
only the decoder runs again in a render, so only the decoder stays."""
import numpy as np
import pytest

import camrender.render.inputs as inputs_module
from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.tiny import build_tiny_pipeline, build_tiny_vae
from camrender.render.inputs import encoder_modules, encoding_on
from camrender.render.loop import render_frames
from helpers import render_request
from camrender.trajectory import Trajectory

FRAMES, SIZE = 57, 32  # 8 latent frames: two segments


def tiny_pipe():
    pipe = build_tiny_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    patch_transformer(pipe.transformer, kernels="torch")
    return pipe


def request_for(mode):
    c2w = np.tile(np.eye(4), (FRAMES, 1, 1))
    c2w[:, 2, 3] = np.linspace(0.0, 0.5, FRAMES)
    traj = Trajectory(c2w=c2w, intrinsics=np.tile([28.0, 28.0, 16.0, 16.0], (FRAMES, 1)), width=SIZE, height=SIZE,
                      fps=16)
    return render_request(traj=traj, prompt="a quiet street", steps=2 if mode == "full" else None, guidance=1.0,
                          num_frames=FRAMES, height=SIZE, width=SIZE, model="tiny", dtype="float32", kernels="torch",
                          mode=mode, recipe="streaming")


def devices(modules) -> set:
    return {p.device.type for module in modules for p in module.parameters()}


@pytest.mark.parametrize("mode", ["segments", "full"])
def test_render_moves_the_encoder_off_and_renders_the_same_frames(monkeypatch, mode):
    """The render device is the CPU here, so the encoder's home stands in on the meta device: after the
    render the encoder's parameters are there, the decoder's are still on the render device, and the frames
    are those of a render whose encoder never moved."""
    request = request_for(mode)
    kept = np.concatenate(list(render_frames(tiny_pipe(), request)))  # home == device: nothing moves
    pipe = tiny_pipe()
    monkeypatch.setattr(inputs_module, "ENCODER_HOME", "meta")
    moved = np.concatenate(list(render_frames(pipe, request)))
    assert moved.shape == kept.shape and np.array_equal(moved, kept)
    assert devices(encoder_modules(pipe.vae)) == {"meta"}
    assert devices([pipe.vae.decoder]) == {"cpu"}


def test_encoder_visits_the_device_for_each_encode(monkeypatch):
    """Every encode brings the encoder to the render device and sends it home after (a pipeline renders
    several requests); nothing moves under model CPU offload or when the device is its home."""
    vae = build_tiny_vae()
    moves = []
    for module in encoder_modules(vae):
        monkeypatch.setattr(module, "to", lambda device, module=module: moves.append(str(device)) or module)
    for _ in range(2):
        with encoding_on(vae, "cuda"):
            assert moves[-1] == "cuda"
    assert moves == ["cuda", "cpu", "cuda", "cpu"]
    moves.clear()
    with encoding_on(vae, "cpu"), encoding_on(vae, "cuda", offload=True):
        pass
    assert moves == []
    with pytest.raises(RuntimeError), encoding_on(vae, "cuda"):
        raise RuntimeError("the encode failed")
    assert moves == ["cuda", "cpu"]  # home again after a failed encode too


def test_encoder_modules_are_the_encoder_only():
    vae = build_tiny_vae()
    assert encoder_modules(vae) == [vae.encoder]
    encoder_parameters = {id(p) for p in vae.encoder.parameters()}
    assert not encoder_parameters & {id(p) for p in vae.decoder.parameters()}
