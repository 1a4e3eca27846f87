"""The 8k+1 frame rule: the LTX-2 VAE maps 8k+1 video frames to k+1 latent frames.

Rule (`to_model_frames`, shown for the VAE's stride 8; the streaming recipe uses 24): a
trajectory whose frame count F is already 8k+1 is used
as is. Otherwise the path is re-timed to M = 8k+1 frames -- M = ``num_frames`` when
given (rejected unless 8k+1), else the 8k+1 count nearest to F (ties go up, so no
part of the path is lost). Re-timing keeps the first and last pose, the fps and the
path itself: frame j of the result sits at position j*(F-1)/(M-1) along the original
frames, interpolated between its two neighbours (position linearly, rotation by
slerp, focal length in tan(fov/2) space). The clip becomes (M-F)/fps seconds longer
or shorter.

A path shorter than the ``num_frames`` asked is snapped as NVlabs' SANA-WM CLI snaps it
(`official_frame_count`): its first M frames are used, M = the stride*k+1 count nearest to F
(ties up) but never more than F, so up to stride-1 frames at the end are dropped and nothing
is stretched.
"""
from __future__ import annotations

import numpy as np

from camrender.errors import CamrenderError
from camrender.trajectory import interpolate
from camrender.trajectory.model import Trajectory

TIME_STRIDE = 8


def is_model_length(num_frames: int, stride: int = TIME_STRIDE) -> bool:
    return num_frames >= 1 and (num_frames - 1) % stride == 0


def nearest_model_length(num_frames: int, stride: int = TIME_STRIDE) -> int:
    """The stride*k+1 count closest to ``num_frames`` (ties -> the larger); a path of 2 frames or
    more gets at least stride + 1 (one frame would be the first image alone, no motion)."""
    if num_frames <= 1:
        return 1
    if num_frames <= stride + 1:
        return stride + 1
    below = num_frames - (num_frames - 1) % stride
    above = below + stride
    return below if below == num_frames or (num_frames - below) < (above - num_frames) else above


def official_frame_count(asked: int, available: int, stride: int = TIME_STRIDE) -> int:
    """NVlabs' rule: n = min(asked, available) snapped to the nearest stride*k+1 (ties up), the
    count below when that would pass `available`; at least 1."""
    n = min(asked, available)
    if n < 1:
        return 1
    if (n - 1) % stride == 0:
        return n
    below = n - (n - 1) % stride
    above = below + stride
    snapped = below if (n - below) < (above - n) else above
    return max(1, below if snapped > available else snapped)


def frames_note(before: int, after: int, asked=None, stride: int = TIME_STRIDE, recipe=None) -> str | None:
    """The one-line note of a path of `before` frames that renders with `after` (`to_model_frames`' result)
    when `asked` frames were asked for (None: not given), or None when there is nothing to say.

    A path shorter than `asked` is always noted, also when it is already stride*k+1 and renders whole;
    otherwise a changed frame count is. `recipe`: the recipe's name, said with the stride."""
    if asked is not None and before < asked:
        kept = f"rendering its first {after}" if after < before else f"rendering all {after}"
        said = f"the path has {before} frames, fewer than the {asked} asked: {kept}, as the official SANA-WM CLI does"
    elif before != after:
        said = f"the path is re-timed to {after} frames"
    else:
        return None
    return f"{said} ({stride}k+1, the {recipe} recipe's frame counts)" if recipe else f"{said} ({stride}k+1)"


def resample_frames(traj: Trajectory, num_frames: int, position: str = "linear") -> Trajectory:
    """Re-time the path to ``num_frames`` frames spread evenly over the original ones; fps unchanged.

    Frame j sits at j*(F-1)/(M-1) along the original frames. position: "linear" (see the module
    docstring) or "spline" (C1 Hermite through the original positions); rotations slerp, focal
    lengths interpolate in tan(fov/2). The first and (for M > 1) last poses are kept exactly.
    """
    if num_frames < 1:
        raise CamrenderError(f"must be at least 1, got {num_frames}", path=traj.source, field="num_frames")
    if num_frames == traj.num_frames:
        return traj.replace()
    old = traj.num_frames
    keys = np.arange(old, dtype=np.float64)
    samples = np.linspace(0.0, old - 1.0, num_frames)
    c2w, intrinsics = interpolate.sample_path(
        keys, traj.c2w, traj.intrinsics, samples, traj.width, traj.height, position=position, rotation="slerp"
    )
    # Pin the ends exactly (no quaternion or last-sample round-off).
    c2w[0], intrinsics[0] = traj.c2w[0], traj.intrinsics[0]
    if num_frames > 1:
        c2w[-1], intrinsics[-1] = traj.c2w[-1], traj.intrinsics[-1]
    return traj.replace(c2w=c2w, intrinsics=intrinsics)


def to_model_frames(traj: Trajectory, num_frames: int | None = None, stride: int = TIME_STRIDE) -> Trajectory:
    """Return a trajectory with a `stride`*k+1 frame count the model accepts (see module docstring).

    stride: 8 (the VAE's rule) or a multiple of it, e.g. 24 for the streaming recipe (chunks of
    3 latent frames, as the official streaming CLI snaps its frame counts)."""
    if num_frames is not None:
        if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)):
            raise CamrenderError(f"must be an integer, got {num_frames!r}", field="num_frames")
        if not is_model_length(int(num_frames), stride):
            near = nearest_model_length(max(int(num_frames), 1), stride)
            raise CamrenderError(
                f"{num_frames} frames is not {stride}k+1 (this recipe needs {stride}k+1 video frames, e.g. {near})",
                field="num_frames",
            )
        if traj.num_frames < num_frames:  # shorter than asked: NVlabs' snapping, a prefix of the path
            keep = official_frame_count(int(num_frames), traj.num_frames, stride)
            return traj.replace(c2w=traj.c2w[:keep].copy(), intrinsics=traj.intrinsics[:keep].copy())
        return resample_frames(traj, int(num_frames))
    if is_model_length(traj.num_frames, stride):
        return traj.replace()
    return resample_frames(traj, nearest_model_length(traj.num_frames, stride))
