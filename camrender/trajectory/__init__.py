"""Camera trajectories: the `Trajectory` type, file loading/saving and the 8k+1 frame rule.

    traj = load("trajectories/orbit.json")      # any registered format (camrender.trajectory.formats)
    traj = to_model_frames(traj)                 # 8k+1 frames for the model
    save(traj, "render.traj.json")               # per-frame v1 JSON, written atomically

No torch or model import here: the CLI's `traj` commands stay light.
"""
from __future__ import annotations

from camrender.trajectory.formats import export_file, import_file
from camrender.trajectory.model import Trajectory, validate_arrays, validate_intrinsics, validate_pose
from camrender.trajectory.resample import is_model_length, nearest_model_length, to_model_frames

__all__ = [
    "Trajectory",
    "load",
    "save",
    "to_model_frames",
    "is_model_length",
    "nearest_model_length",
    "validate_arrays",
    "validate_pose",
    "validate_intrinsics",
]


def load(path, fmt: str | None = None) -> Trajectory:
    """Read a trajectory file of any registered format (chosen by ``fmt``, suffix or content)."""
    return import_file(path, fmt)


def save(traj: Trajectory, path) -> None:
    """Write ``traj`` as a per-frame v1 JSON file (temp file in the same folder, then rename)."""
    export_file(traj, path, "v1")
