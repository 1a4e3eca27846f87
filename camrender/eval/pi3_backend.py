"""The `pi3` backend: Pi3, the feed-forward pose estimator NVlabs' SANA-WM-Bench scores camera accuracy with.

Needs Pi3's package (`pip install "git+https://github.com/yyfz/Pi3.git"`, which brings torch and torchvision)
and its weights: `--pi3-weights` names a hub id (default `yyfz233/Pi3`, what the released
`eval_benchmark_poses.py` loads; downloaded once into the Hugging Face cache), a downloaded folder, or a
`model.safetensors` / `.pt` file. The loading code, as Pi3's own example loads it:

    model = Pi3.from_pretrained("yyfz233/Pi3")            # a hub id or a folder
    model = Pi3(); model.load_state_dict(load_file(path))  # a weights file

The frames go in as the evaluator's loader gives them: resized (Lanczos) to the largest size under
`PIXEL_LIMIT` pixels whose sides are multiples of 14 with the first frame's aspect ratio, RGB in [0, 1],
all frames of a video in one call (batch 1); on CUDA under autocast (bfloat16 from compute capability 8,
else float16). Pi3 reads no intrinsics and places every frame: its `camera_poses` (N, 4, 4) are
camera-to-world, OpenCV axes, in its own world frame and scale.
"""
from __future__ import annotations

import math
import os

import numpy as np

from camrender.errors import CamrenderError
from camrender.eval.estimate import Estimate

DEFAULT_WEIGHTS = "yyfz233/Pi3"
PIXEL_LIMIT = 255_000
PATCH = 14
INSTALL = ('the pi3 backend needs Pi3: pip install "git+https://github.com/yyfz/Pi3.git" (and its weights: '
           f'{DEFAULT_WEIGHTS} on the Hugging Face hub, or --pi3-weights FILE)')


def pi3_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) Pi3 sees a width x height frame at: multiples of PATCH, at most PIXEL_LIMIT pixels, close
    to the frame's aspect ratio (the largest such size, shrinking the side that strays most from it)."""
    scale = math.sqrt(PIXEL_LIMIT / (width * height))
    target_w, target_h = width * scale, height * scale
    columns, rows = round(target_w / PATCH), round(target_h / PATCH)
    while columns * rows * PATCH * PATCH > PIXEL_LIMIT:
        if columns / rows > target_w / target_h:
            columns -= 1
        else:
            rows -= 1
    return max(1, columns) * PATCH, max(1, rows) * PATCH


class Pi3Estimator:
    """Pi3 loaded once (module docstring); `estimate(frames, intrinsics, progress)` runs it on a video's frames."""

    name = "pi3"

    def __init__(self, weights: str = DEFAULT_WEIGHTS, device: str | None = None):
        try:
            import torch
            from pi3.models.pi3 import Pi3
        except ImportError:
            raise CamrenderError(INSTALL, field="backend") from None
        self.torch = torch
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        try:
            if os.path.isfile(weights):
                model = Pi3()
                model.load_state_dict(_state_dict(weights, torch))
            else:
                model = Pi3.from_pretrained(weights)
        except Exception as error:  # a missing download, a wrong file: one line naming the weights
            reason = " ".join(str(error).split())[:200]
            raise CamrenderError(f"cannot load Pi3's weights: {reason} ({INSTALL})", path=weights,
                                 field="pi3-weights") from None
        self.model = model.to(self.device).eval().requires_grad_(False)

    def estimate(self, frames: np.ndarray, intrinsics: np.ndarray, progress=None) -> Estimate:
        """Poses of (N, H, W, 3) uint8 `frames` (`intrinsics` are not used: Pi3 estimates its own)."""
        from PIL import Image

        torch = self.torch
        size = pi3_size(frames.shape[2], frames.shape[1])
        resized = np.stack([np.asarray(Image.fromarray(frame).resize(size, Image.Resampling.LANCZOS))
                            for frame in frames])
        images = torch.from_numpy(resized).permute(0, 3, 1, 2).float().div(255.0)[None].to(self.device)
        with torch.no_grad(), torch.autocast(self.device.type, dtype=_autocast_dtype(torch, self.device),
                                             enabled=self.device.type == "cuda"):
            poses = self.model(images)["camera_poses"][0]
        if progress is not None:
            progress(len(frames), len(frames), stage="pi3", unit="frame")
        return Estimate(poses.float().cpu().numpy().astype(np.float64), np.ones(len(frames), bool))


def _autocast_dtype(torch, device):
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16
    return torch.float16


def _state_dict(path: str, torch) -> dict:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)
