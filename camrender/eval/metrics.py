"""SANA-WM-Bench's camera metrics, numpy only: Sim(3) alignment of estimated extrinsics to the requested ones,
then per-frame rotation, translation and camera-matrix errors.

The definitions are the released evaluator's (`tools/metrics/sana_wm/pose_utils.py`, `metric`), written
here in float64 numpy; `tests/eval/test_metrics.py` runs the kit's functions on the same poses:

1. both paths relative to their first frame (`relative_poses`, the kit's ``relative_pose(..., "left")``);
2. world-to-camera extrinsics [R | t] of both; the estimate is aligned to the request
   (`align_camera_extrinsics`): a rotation Q from the SVD of mean(R_req^T R_est) (no reflection guard, as
   released), then a scale s and translation u fitted on a_i = R_est_i^T t_est_i against
   b_i = R_est_i^T t_req_i; the aligned estimate is [R_est Q | R_est u + s t_est];
3. per frame, on camera-to-world poses: RotErr = the geodesic angle between the rotations (degrees),
   TransErr = |t_req - t_est| (units of the requested path), CamMC = the Frobenius norm of the difference of
   the 3 x 4 [R | t] matrices; the reported values are their means over frames.

Frames the estimator could not register are never dropped (`pose_errors`): the alignment is fitted on the
registered frames only, and an unregistered frame is scored with the aligned pose of the nearest registered
frame in time (the earlier one on a tie), so a hole in the estimate costs what the camera moved meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from camrender.trajectory.rotations import invert_rigid, relative_poses


def align_camera_extrinsics(w2c_src: np.ndarray, w2c_tgt: np.ndarray, estimate_scale: bool = True,
                            eps: float = 1e-9) -> tuple[np.ndarray, np.ndarray, float]:
    """The alignment of (N, 3, 4) world-to-camera `w2c_src` onto `w2c_tgt`: (rotation (3, 3), translation (3,),
    scale) for `apply_alignment` (scale 1 when not estimated or for a single frame)."""
    r_src, r_tgt = w2c_src[:, :, :3], w2c_tgt[:, :, :3]
    u, _, vh = np.linalg.svd(np.einsum("nji,njk->ik", r_tgt, r_src) / len(r_src))
    rotation = vh.T @ u.T
    a = np.einsum("nji,nj->ni", r_src, w2c_src[:, :, 3])  # R_src^T t_src per frame
    b = np.einsum("nji,nj->ni", r_src, w2c_tgt[:, :, 3])  # R_src^T t_tgt per frame
    a_mean, b_mean = a.mean(axis=0), b.mean(axis=0)
    scale = 1.0
    if estimate_scale and len(a) > 1:
        a_centred, b_centred = a - a_mean, b - b_mean
        scale = float(np.mean(a_centred * b_centred) / max(float(np.mean(a_centred ** 2)), eps))
    return rotation, b_mean - scale * a_mean, scale


def apply_alignment(w2c: np.ndarray, rotation: np.ndarray, translation: np.ndarray, scale: float) -> np.ndarray:
    """(N, 3, 4) world-to-camera extrinsics moved by an `align_camera_extrinsics` result."""
    r = w2c[:, :, :3]
    return np.concatenate([r @ rotation, (r @ translation + scale * w2c[:, :, 3])[..., None]], axis=-1)


def rotation_errors_deg(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """(N,) geodesic angles in degrees between (N, 3, 3) rotations."""
    cosine = (np.einsum("nji,nji->n", r1, r2) - 1) / 2  # trace(r1^T r2)
    return np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))


def translation_errors(t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
    """(N,) distances between (N, 3) positions."""
    return np.linalg.norm(t2 - t1, axis=-1)


def camera_matrix_errors(rt1: np.ndarray, rt2: np.ndarray) -> np.ndarray:
    """(N,) Frobenius norms of the differences of (N, 3, 4) [R | t] matrices."""
    return np.linalg.norm((rt2 - rt1).reshape(len(rt1), 12), axis=-1)


def fill_unregistered(c2w: np.ndarray, registered: np.ndarray) -> np.ndarray:
    """(N, 4, 4) poses with every unregistered frame given the pose of the nearest registered frame in time
    (the earlier one on a tie). At least one frame must be registered."""
    registered_at = np.flatnonzero(registered)
    frames = np.arange(len(c2w))
    after = np.clip(np.searchsorted(registered_at, frames), 0, len(registered_at) - 1)
    before = np.clip(after - 1, 0, len(registered_at) - 1)
    take_before = np.abs(registered_at[before] - frames) <= np.abs(registered_at[after] - frames)
    nearest = np.where(take_before, registered_at[before], registered_at[after])
    return c2w[nearest]


@dataclass(frozen=True)
class PoseErrors:
    """Per-frame errors of an estimate against the request, on the sampled frames.

    rotation_deg, translation, camera_matrix: (N,) RotErr (degrees), TransErr (requested path units), CamMC.
    registered: (N,) bool, frames the estimator placed (the others took their nearest neighbour's pose).
    requested: (N, 4, 4) requested c2w relative to its first frame; estimated: (N, 4, 4) the estimate
    relative to its first frame and aligned onto `requested` (unregistered frames filled).
    scale: the alignment's scale (requested units per estimated unit).
    """

    rotation_deg: np.ndarray
    translation: np.ndarray
    camera_matrix: np.ndarray
    registered: np.ndarray
    requested: np.ndarray
    estimated: np.ndarray
    scale: float

    @property
    def rot_err(self) -> float:
        """RotErr: mean rotation error, degrees."""
        return float(np.mean(self.rotation_deg))

    @property
    def trans_err_rel(self) -> float:
        """TransErr_rel: mean translation error, requested path units."""
        return float(np.mean(self.translation))

    @property
    def cam_mc_rel(self) -> float:
        """CamMC_rel: mean [R | t] difference."""
        return float(np.mean(self.camera_matrix))


def pose_errors(requested_c2w: np.ndarray, estimated_c2w: np.ndarray, registered=None) -> PoseErrors:
    """Score (N, 4, 4) estimated camera-to-world poses against the requested ones (module docstring).

    registered: (N,) bool, the frames the estimator placed (default: all); the others' poses are ignored.
    Both paths may be in any world frame and the estimate at any scale.
    """
    requested_c2w = np.asarray(requested_c2w, np.float64)
    estimated_c2w = np.asarray(estimated_c2w, np.float64)
    registered = np.ones(len(estimated_c2w), bool) if registered is None else np.asarray(registered, bool)
    requested = relative_poses(requested_c2w)
    estimated = relative_poses(fill_unregistered(estimated_c2w, registered))
    w2c_requested, w2c_estimated = invert_rigid(requested)[:, :3], invert_rigid(estimated)[:, :3]
    rotation, translation, scale = align_camera_extrinsics(w2c_estimated[registered], w2c_requested[registered])
    aligned = np.tile(np.eye(4), (len(estimated), 1, 1))
    aligned[:, :3] = apply_alignment(w2c_estimated, rotation, translation, scale)
    aligned_c2w = invert_rigid(aligned)
    return PoseErrors(
        rotation_deg=rotation_errors_deg(requested[:, :3, :3], aligned_c2w[:, :3, :3]),
        translation=translation_errors(requested[:, :3, 3], aligned_c2w[:, :3, 3]),
        camera_matrix=camera_matrix_errors(requested[:, :3], aligned_c2w[:, :3]),
        registered=registered, requested=requested, estimated=aligned_c2w, scale=scale)
