"""The full-clip sampler against diffusers' own SanaWMPipeline.__call__ on the tiny model."""

import numpy as np
import PIL.Image
import pytest
import torch

from camrender.errors import CamrenderError
from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.tiny import build_tiny_pipeline
from camrender.render.full import sample_video
from camrender.render.loop import render_frames
from helpers import render_request
from camrender.trajectory import Trajectory

FRAMES, SRC_W, SRC_H = 17, 120, 72  # source image / intrinsics size; rendered at 96x64


@pytest.fixture(scope="module")
def pipe():
    return build_tiny_pipeline(seed=0)


def dolly_zoom(zoom=True):
    """17 frames moving right and forward while the focal length grows (per-frame intrinsics)."""
    c2w = np.tile(np.eye(4), (FRAMES, 1, 1))
    c2w[:, 0, 3] = np.linspace(0, 0.5, FRAMES)
    c2w[:, 2, 3] = np.linspace(0, 0.3, FRAMES)
    focal = np.linspace(100.0, 160.0 if zoom else 100.0, FRAMES)
    intrinsics = np.stack([focal, focal, np.full(FRAMES, 60.0), np.full(FRAMES, 36.0)], axis=1)
    return Trajectory(c2w=c2w, intrinsics=intrinsics, width=SRC_W, height=SRC_H, fps=16)


def first_image():
    rng = np.random.default_rng(0)
    return PIL.Image.fromarray((rng.random((SRC_H, SRC_W, 3)) * 255).astype(np.uint8))


def request(traj, **changes):
    values = dict(traj=traj, prompt="a red house", negative_prompt="blurry", image=first_image(), steps=3,
                  guidance=3.0, seed=7, num_frames=FRAMES, fps=16, height=64, width=96, model="tiny",
                  recipe="bidirectional-diffusers",  # diffusers' pipeline is the anchor
                  kernels="torch")  # the PyTorch references: the sampler's logic against the stock pipeline
    values.update(changes)
    return render_request(**values)


def stock_frames(pipe, traj, req):
    return pipe(req.image, req.prompt, negative_prompt=req.negative_prompt, c2w=traj.c2w.astype(np.float32),
                intrinsics=traj.intrinsics.astype(np.float32), height=req.height, width=req.width,
                num_frames=req.num_frames, num_inference_steps=req.steps, guidance_scale=req.guidance,
                generator=torch.Generator().manual_seed(req.seed)).frames


def test_sampler_matches_stock_pipeline(pipe):
    traj = dolly_zoom()
    req = request(traj)
    ours = sample_video(pipe, req).numpy()
    stock = stock_frames(pipe, traj, req)
    assert ours.shape == stock.shape == (FRAMES, 64, 96, 3)
    assert np.abs(ours - stock).max() <= 1e-4
    # the comparison sees the camera: a different path gives clearly different frames
    other = sample_video(pipe, request(dolly_zoom(zoom=False))).numpy()
    assert np.abs(other - stock).max() > 100 * 1e-4


def test_sampler_without_guidance_matches_stock(pipe):
    traj = dolly_zoom()
    req = request(traj, guidance=1.0, steps=2, seed=3)
    assert np.abs(sample_video(pipe, req).numpy() - stock_frames(pipe, traj, req)).max() <= 1e-4


def test_patched_sampler_matches_stock_pipeline():
    pipe = build_tiny_pipeline(seed=0)
    traj = dolly_zoom()
    req = request(traj, steps=2)
    stock = stock_frames(pipe, traj, req)
    patch_transformer(pipe.transformer, kernels="torch")
    assert np.abs(sample_video(pipe, req).numpy() - stock).max() <= 1e-4


def test_default_recipe_is_nvlabs_release_not_diffusers():
    """The default recipe (NVlabs 40151c8) runs on the patched model (a bare pipeline is patched by its
    first render, once), samples with shift 9.8 whatever the pipeline's scheduler says, and renders
    other frames than diffusers' pipeline (no GDN-block rescale)."""
    from camrender.model.settings import model_settings
    from camrender.render.full import sample_latents

    pipe = build_tiny_pipeline(seed=0)
    traj = dolly_zoom()
    default = request(traj, steps=2, recipe="bidirectional")
    assert model_settings(pipe.transformer) is None
    sample_latents(pipe, default)
    assert model_settings(pipe.transformer).backend == "torch"  # the request's --kernels torch
    seen = []
    step = pipe.scheduler.step
    pipe.scheduler.step = lambda *a, **k: seen.append("pipeline") or step(*a, **k)  # never used by the recipe
    ours = sample_latents(pipe, default)
    assert seen == []
    same_rules_diffusers_shift = sample_latents(pipe, request(traj, steps=2, recipe="bidirectional-diffusers"))
    assert seen == ["pipeline"] * 2
    assert (ours - same_rules_diffusers_shift).abs().max() > 1e-2
    latest = sample_latents(pipe, request(traj, steps=2, recipe="bidirectional-nvlabs-latest"))
    assert (latest - ours).abs().max() > 1e-4  # the softmax block's camera rules differ
    assert torch.equal(latest[:, :, :1], ours[:, :, :1])  # frame 0 pinned in both


def test_render_frames_yields_uint8_video(pipe):
    req = request(dolly_zoom(), steps=1, image=None)  # tiny: a neutral first frame stands in
    chunks = list(render_frames(pipe, req))
    assert len(chunks) == 1
    video = chunks[0]
    assert video.dtype == np.uint8 and video.shape == (FRAMES, 64, 96, 3)
    floats = sample_video(pipe, req).numpy()  # the same render as floats in [0, 1]
    assert np.array_equal(video, (floats * 255).round().astype(np.uint8))


def test_request_checks(pipe):
    sixteen = Trajectory(c2w=np.tile(np.eye(4), (16, 1, 1)), intrinsics=np.tile([100.0, 100, 60, 36], (16, 1)),
                         width=SRC_W, height=SRC_H, fps=16)
    with pytest.raises(CamrenderError, match="8k\\+1"):
        sample_video(pipe, request(sixteen, num_frames=16))
    with pytest.raises(CamrenderError, match="multiple of 8"):
        sample_video(pipe, request(dolly_zoom(), height=60))
    with pytest.raises(CamrenderError, match="first-frame image"):
        sample_video(pipe, request(dolly_zoom(), image=None, model="some/model"))
    with pytest.raises(CamrenderError, match="mode"):
        list(render_frames(pipe, request(dolly_zoom(), mode="sideways")))


def test_dropping_text_padding_changes_nothing(pipe):
    """Text columns no row attends to only cost time: the transformer output is the same without them."""
    from camrender.render.inputs import drop_text_padding

    transformer = pipe.transformer
    gen = torch.Generator().manual_seed(0)
    config = transformer.config
    latents = torch.randn(2, config.in_channels, 3, 4, 6, generator=gen)
    text = torch.randn(2, 1, 40, config.caption_channels, generator=gen)
    mask = torch.zeros(2, 40, dtype=torch.long)
    mask[0, :5], mask[1, :9] = 1, 1
    trimmed, trimmed_mask = drop_text_padding(text, mask)
    assert trimmed.shape == (2, 1, 9, config.caption_channels) and trimmed_mask.shape == (2, 9)
    assert torch.equal(trimmed_mask, mask[:, :9])
    timestep = torch.full((2, 1, 3), 500.0)
    with torch.no_grad():
        full = transformer(latents, timestep, text, mask=mask, return_dict=False)[0]
        dropped = transformer(latents, timestep, trimmed, mask=trimmed_mask, return_dict=False)[0]
    torch.testing.assert_close(dropped, full, rtol=1e-4, atol=1e-4)  # fp32 sums of other lengths
    assert drop_text_padding(text, torch.zeros_like(mask))[1].shape == (2, 1)  # nothing attended: one column


def test_full_mode_projects_the_plucker_maps_once(pipe, monkeypatch):
    """The whole clip's Plucker maps are projected once per block for all the steps (the denoiser's
    `plucker_once`), not by every block at every step."""
    from camrender.model.stage1 import block as block_module
    from camrender.render.full import sample_latents

    calls = []
    projection = block_module.plucker_projection

    def counted(*args, **kwargs):
        calls.append(1)
        return projection(*args, **kwargs)

    monkeypatch.setattr(block_module, "plucker_projection", counted)
    sample_latents(pipe, request(dolly_zoom(), steps=3))
    with_projection = sum(hasattr(b, "plucker_proj") for b in pipe.transformer.blocks)
    assert with_projection > 0 and len(calls) == with_projection
