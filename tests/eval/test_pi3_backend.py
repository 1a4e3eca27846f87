"""The pi3 backend's loading and calling code, against a stand-in for Pi3's package (Pi3 and its weights are not
installed here): the frames it is given, the weights it loads, the poses it returns, and the one-line errors."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from camrender.errors import CamrenderError
from camrender.eval.pi3_backend import PIXEL_LIMIT, Pi3Estimator, pi3_size


class FakePi3(torch.nn.Module):
    """Pi3's interface: `from_pretrained(name)`, `load_state_dict`, a call on (B, N, 3, H, W) images in [0, 1]
    returning "camera_poses" (B, N, 4, 4); its poses put frame i at x = i * scale."""

    loaded_from = None

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        self.seen = None

    @classmethod
    def from_pretrained(cls, name):
        if name != "yyfz233/Pi3":
            raise OSError(f"{name} is not a valid model identifier\nsecond line")
        model = cls()
        cls.loaded_from = name
        return model

    def forward(self, images):
        self.seen = images
        poses = torch.eye(4).repeat(images.shape[0], images.shape[1], 1, 1)
        poses[..., 0, 3] = torch.arange(images.shape[1], dtype=torch.float32) * self.scale
        return {"camera_poses": poses, "points": None}


@pytest.fixture
def fake_pi3(monkeypatch):
    package, models, module = (types.ModuleType(name) for name in ("pi3", "pi3.models", "pi3.models.pi3"))
    module.Pi3 = FakePi3
    for name, value in (("pi3", package), ("pi3.models", models), ("pi3.models.pi3", module)):
        monkeypatch.setitem(sys.modules, name, value)
    return FakePi3


def test_frames_go_in_at_pi3s_size_and_poses_come_out(fake_pi3):
    estimator = Pi3Estimator(device="cpu")
    assert fake_pi3.loaded_from == "yyfz233/Pi3"
    frames = np.full((5, 704, 1280, 3), 255, np.uint8)
    estimate = estimator.estimate(frames, np.zeros((5, 4)))
    seen = estimator.model.seen
    width, height = pi3_size(1280, 704)
    assert seen.shape == (1, 5, 3, height, width) and seen.dtype == torch.float32
    assert width % 14 == 0 and height % 14 == 0 and width * height <= PIXEL_LIMIT
    assert abs(width / height / (1280 / 704) - 1) < 0.05 and width * height > 0.9 * PIXEL_LIMIT
    assert torch.allclose(seen, torch.ones_like(seen))  # white in [0, 1]
    assert estimate.registered.all() and estimate.c2w.dtype == np.float64
    assert np.allclose(estimate.c2w[:, 0, 3], np.arange(5))


def test_a_weights_file_is_loaded_into_a_fresh_model(fake_pi3, tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"scale": torch.tensor(2.5)}, str(path))
    estimator = Pi3Estimator(str(path), device="cpu")
    estimate = estimator.estimate(np.zeros((3, 64, 96, 3), np.uint8), np.zeros((3, 4)))
    assert np.allclose(estimate.c2w[:, 0, 3], [0.0, 2.5, 5.0])


def test_missing_weights_and_a_missing_package_are_one_line(fake_pi3, monkeypatch):
    with pytest.raises(CamrenderError) as error:
        Pi3Estimator("nowhere/pi3")
    assert error.value.field == "pi3-weights" and "\n" not in str(error.value) and "not a valid model" in str(error.value)
    monkeypatch.setitem(sys.modules, "pi3.models.pi3", None)
    with pytest.raises(CamrenderError) as error:
        Pi3Estimator()
    assert error.value.field == "backend" and "github.com/yyfz/Pi3" in str(error.value)
