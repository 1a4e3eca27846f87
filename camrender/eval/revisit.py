"""Revisit consistency: where the path comes back to a place it has been, the video should show the same picture.

Pairs of frames (a, b) come from the benchmark's `scene_trajectories_v2.json` when scoring a benchmark split
(its `evaluation_pairs`, the `MAX_PAIRS` of lowest `quality_score`, as NVlabs' `eval_unified.py` takes them),
else from the requested path (`path_pairs`): b at least `MIN_GAP_S` seconds after a, the cameras within
`MAX_DISTANCE` of the path's extent and `MAX_ANGLE_DEG` of view direction, the closest first, no two pairs
within `MIN_GAP_S` of each other at both ends. Each pair is scored with the evaluator's PSNR (uint8, 100 dB
for identical frames) and SSIM (per channel, 11 x 11 box windows, mirrored borders, averaged), and LPIPS
(AlexNet) when the `lpips` package and its weights load.
"""
from __future__ import annotations

import math

import numpy as np

MAX_PAIRS = 5
MIN_GAP_S = 2.0
MAX_DISTANCE = 0.05  # of the path's extent (the diagonal of its positions' bounding box)
MAX_ANGLE_DEG = 10.0
SSIM_WINDOW = 11


def path_pairs(c2w: np.ndarray, fps: float, *, first: int = 0) -> list[dict]:
    """Revisit pairs of (F, 4, 4) camera-to-world poses (module docstring), frames from `first` on:
    [{"frame_a", "frame_b", "distance", "angle_deg"}], at most MAX_PAIRS, best first."""
    positions, forward = c2w[:, :3, 3], c2w[:, :3, 2]
    extent = float(np.linalg.norm(np.ptp(positions, axis=0))) if len(positions) else 0.0
    gap = max(1, int(math.ceil(MIN_GAP_S * fps)))
    if extent <= 0 or len(positions) - first <= gap:
        return []
    frames = np.arange(first, len(positions))
    distance = np.linalg.norm(positions[frames, None] - positions[None, frames], axis=-1)
    cosine = np.clip(np.einsum("ai,bi->ab", forward[frames], forward[frames]), -1.0, 1.0)
    angle = np.degrees(np.arccos(cosine))
    later = frames[None, :] - frames[:, None] >= gap
    close = later & (distance <= MAX_DISTANCE * extent) & (angle <= MAX_ANGLE_DEG)
    rows, columns = np.nonzero(close)
    quality = distance[rows, columns] / (MAX_DISTANCE * extent) + angle[rows, columns] / MAX_ANGLE_DEG
    chosen = []
    for index in np.argsort(quality, kind="stable"):
        a, b = int(frames[rows[index]]), int(frames[columns[index]])
        if all(max(abs(a - pair["frame_a"]), abs(b - pair["frame_b"])) >= gap for pair in chosen):
            chosen.append({"frame_a": a, "frame_b": b, "distance": float(distance[rows[index], columns[index]]),
                           "angle_deg": float(angle[rows[index], columns[index]])})
            if len(chosen) == MAX_PAIRS:
                break
    return chosen


def benchmark_pairs(scene: dict) -> list[dict]:
    """A benchmark scene's `evaluation_pairs`: the MAX_PAIRS of lowest quality_score, as pairs of frames."""
    pairs = sorted(scene.get("evaluation_pairs") or [], key=lambda pair: pair.get("quality_score", 999))
    return [{"frame_a": int(pair["frame_a"]), "frame_b": int(pair["frame_b"]), "distance": pair.get("distance_m"),
             "angle_deg": pair.get("angle_diff_deg")} for pair in pairs[:MAX_PAIRS]]


def psnr(image_a: np.ndarray, image_b: np.ndarray) -> float:
    """PSNR in dB of two uint8 images (100 for identical ones)."""
    mse = float(np.mean((image_a.astype(np.float64) - image_b.astype(np.float64)) ** 2))
    return 100.0 if mse < 1e-10 else float(10 * np.log10(255.0 ** 2 / mse))


def _box_mean(plane: np.ndarray, size: int = SSIM_WINDOW) -> np.ndarray:
    """Mean over size x size windows centred on each pixel, borders mirrored (d c b a | a b c d | d c b a)."""
    half = size // 2
    padded = np.pad(plane, ((half, size - 1 - half), (half, size - 1 - half)), mode="symmetric")
    sums = np.cumsum(np.cumsum(np.pad(padded, ((1, 0), (1, 0))), axis=0), axis=1)
    window = sums[size:, size:] - sums[:-size, size:] - sums[size:, :-size] + sums[:-size, :-size]
    return window / (size * size)


def ssim(image_a: np.ndarray, image_b: np.ndarray) -> float:
    """SSIM of two uint8 (H, W, C) images: per channel (at most 3) over 11 x 11 box windows, then averaged."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for channel in range(min(image_a.shape[2], 3)):
        x, y = image_a[..., channel].astype(np.float64), image_b[..., channel].astype(np.float64)
        mean_x, mean_y = _box_mean(x), _box_mean(y)
        var_x = _box_mean(x * x) - mean_x ** 2
        var_y = _box_mean(y * y) - mean_y ** 2
        cov = _box_mean(x * y) - mean_x * mean_y
        ssim_map = ((2 * mean_x * mean_y + c1) * (2 * cov + c2)) / \
            ((mean_x ** 2 + mean_y ** 2 + c1) * (var_x + var_y + c2))
        values.append(float(ssim_map.mean()))
    return float(np.mean(values))


class Lpips:
    """LPIPS (AlexNet) when the `lpips` package and its weights load, else `available` is False and `note` says why."""

    def __init__(self):
        self.model, self.note = None, ""
        try:
            import lpips
            import torch

            self.torch = torch
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = lpips.LPIPS(net="alex", verbose=False).to(self.device).eval()
        except Exception as error:  # no package, no weights (no network for their download)
            reason = " ".join(str(error).split())[:160] or type(error).__name__
            self.note = f"LPIPS skipped ({reason}): it needs the lpips package and its AlexNet weights"

    @property
    def available(self) -> bool:
        return self.model is not None

    def __call__(self, image_a: np.ndarray, image_b: np.ndarray) -> float:
        torch = self.torch

        def tensor(image):
            return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float().div(127.5).sub(1.0)

        with torch.no_grad():
            return float(self.model(tensor(image_a).to(self.device), tensor(image_b).to(self.device)).item())


def score_pairs(pairs: list[dict], frames: dict, lpips: Lpips | None = None) -> dict:
    """{"pairs": [pair + psnr, ssim (, lpips)], "psnr", "ssim" (, "lpips"): means} for pairs whose frames
    (video indices) are in `frames` ({index: (H, W, 3) uint8}); {"pairs": []} when there are none."""
    scored = []
    for pair in pairs:
        a, b = frames[pair["frame_a"]], frames[pair["frame_b"]]
        record = dict(pair, psnr=psnr(a, b), ssim=ssim(a, b))
        if lpips is not None and lpips.available:
            record["lpips"] = lpips(a, b)
        scored.append(record)
    result = {"pairs": scored}
    for name in ("psnr", "ssim", "lpips"):
        if scored and name in scored[0]:
            result[name] = float(np.mean([pair[name] for pair in scored]))
    return result
