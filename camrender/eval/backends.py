"""Pose estimators for `camrender eval --backend`: their names, and loading one by name.

A backend takes the scored frames of a video and returns camera-to-world poses for those it could place
(an `estimate.Estimate`):

    estimator = load_backend("colmap")
    estimate = estimator.estimate(frames, intrinsics, progress)   # frames (N, H, W, 3) uint8

`colmap` (`colmap_backend`: pycolmap, CPU, no weights; the default) and `pi3` (`pi3_backend`: NVlabs'
benchmark estimator, Pi3, with its package and weights). A backend whose package is missing is one
CamrenderError naming what to install (exit code 2), raised when it is loaded: `camrender eval` loads it
once the inputs are checked, before anything is estimated or written.
"""
from __future__ import annotations

BACKENDS = ("colmap", "pi3")
DEFAULT_BACKEND = "colmap"


def load_backend(name: str, *, pi3_weights: str | None = None):
    """The estimator called `name` (one of BACKENDS), ready to run: its package imported and weights loaded."""
    from camrender.errors import CamrenderError

    if name == "colmap":
        from camrender.eval.colmap_backend import ColmapEstimator

        return ColmapEstimator()
    if name == "pi3":
        from camrender.eval.pi3_backend import DEFAULT_WEIGHTS, Pi3Estimator

        return Pi3Estimator(pi3_weights or DEFAULT_WEIGHTS)
    raise CamrenderError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})", field="backend")
