"""What a pose estimator returns (`Estimate`), whichever backend made it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """Poses a backend estimated for N frames.

    c2w: (N, 4, 4) float64 camera-to-world, OpenCV axes, in the backend's own world frame and scale (rows of
        unregistered frames are the identity and mean nothing).
    registered: (N,) bool, the frames the backend placed.
    failure: why the backend placed no usable set of frames ("" when it did).
    notes: what the backend wants said about the run (one line each).
    """

    c2w: np.ndarray
    registered: np.ndarray
    failure: str = ""
    notes: tuple = field(default=())

    @staticmethod
    def failed(count: int, reason: str) -> "Estimate":
        """No frame of `count` placed, for `reason`."""
        return Estimate(np.tile(np.eye(4), (count, 1, 1)), np.zeros(count, bool), reason)
