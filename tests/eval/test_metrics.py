"""camrender.eval.metrics against NVlabs' released `pose_utils.py` (agreement <= 1e-6), and what the metrics do
with frames the estimator could not place."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from camrender.eval.metrics import align_camera_extrinsics, apply_alignment, fill_unregistered, pose_errors
from camrender.trajectory.rotations import invert_rigid, relative_poses
from eval_paths import PATHS, kit_module

AGREEMENT = 1e-6


def _random_rotations(rng, count, spread):
    """(count, 3, 3) rotations about random axes by angles of about `spread` radians."""
    axes = rng.normal(size=(count, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = rng.normal(size=count) * spread
    k = np.zeros((count, 3, 3))
    k[:, 0, 1], k[:, 0, 2], k[:, 1, 2] = -axes[:, 2], axes[:, 1], -axes[:, 0]
    k -= np.transpose(k, (0, 2, 1))
    return np.eye(3) + np.sin(angles)[:, None, None] * k + (1 - np.cos(angles))[:, None, None] * (k @ k)


def _estimate_of(requested, rng, rotation_noise=0.05, position_noise=0.1):
    """A noisy estimate of `requested` in another world frame and scale, as an estimator returns one."""
    noise = np.tile(np.eye(4), (len(requested), 1, 1))
    noise[:, :3, :3] = _random_rotations(rng, len(requested), rotation_noise)
    noise[:, :3, 3] = rng.normal(size=(len(requested), 3)) * position_noise
    world = np.eye(4)
    world[:3, :3] = _random_rotations(rng, 1, 2.0)[0]
    world[:3, 3] = rng.normal(size=3) * 5
    estimate = world @ requested @ noise
    estimate[:, :3, 3] *= 3.7
    return estimate


def _pose_pairs():
    rng = np.random.default_rng(7)
    pairs = [(make(), _estimate_of(make(), rng)) for make in PATHS.values()]
    pairs.append((PATHS["handheld"](30), _estimate_of(PATHS["orbit"](30), rng, 0.2, 0.5)))  # a wrong path
    return pairs


def test_metrics_agree_with_the_released_evaluator():
    kit = kit_module("pose_utils")
    for requested, estimated in _pose_pairs():
        gt = kit.relative_pose(torch.from_numpy(requested), "left").double()
        est = kit.relative_pose(torch.from_numpy(estimated), "left").double()
        expected = kit.metric(gt, est)
        ours = pose_errors(requested, estimated)
        assert np.max(np.abs(np.array(expected) - [ours.rot_err, ours.trans_err_rel, ours.cam_mc_rel])) <= AGREEMENT
        # per frame: the kit's error functions on the kit's aligned poses
        w2c_gt, w2c_est = kit.closed_form_inverse_se3(gt), kit.closed_form_inverse_se3(est)
        align = kit.align_camera_extrinsics(w2c_est[:, :3, :4], w2c_gt[:, :3, :4], estimate_scale=True)
        r, t = kit.apply_transformation(w2c_est[:, :3, :4], *align, return_extri=False)
        aligned = kit.closed_form_inverse_se3(torch.cat([r, t.unsqueeze(-1)], dim=-1))
        per_frame = [kit.calc_roterr(gt[:, :3, :3], aligned[:, :3, :3]),
                     kit.calc_transerr(gt[:, :3, 3], aligned[:, :3, 3]),
                     kit.calc_cammc(gt[:, :3, :4], aligned[:, :3, :4])]
        for theirs, mine in zip(per_frame, (ours.rotation_deg, ours.translation, ours.camera_matrix)):
            assert np.max(np.abs(theirs.numpy() - mine)) <= AGREEMENT
        assert np.max(np.abs(aligned.numpy() - ours.estimated)) <= AGREEMENT


def test_alignment_agrees_with_the_released_evaluator():
    kit = kit_module("pose_utils")
    for requested, estimated in _pose_pairs():
        src, tgt = invert_rigid(estimated)[:, :3], invert_rigid(requested)[:, :3]
        for estimate_scale in (True, False):
            rotation, translation, scale = align_camera_extrinsics(src, tgt, estimate_scale=estimate_scale)
            kit_r, kit_t, kit_s = kit.align_camera_extrinsics(torch.from_numpy(src), torch.from_numpy(tgt),
                                                              estimate_scale=estimate_scale)
            assert np.max(np.abs(kit_r[0].numpy() - rotation)) <= AGREEMENT
            assert np.max(np.abs(kit_t[0].numpy() - translation)) <= AGREEMENT
            assert abs(float(kit_s) - scale) <= AGREEMENT
            moved = kit.apply_transformation(torch.from_numpy(src), kit_r, kit_t, kit_s).numpy()
            assert np.max(np.abs(moved - apply_alignment(src, rotation, translation, scale))) <= AGREEMENT


@pytest.mark.parametrize("name", sorted(PATHS))
def test_an_estimate_off_by_a_similarity_scores_zero(name):
    requested = PATHS[name]()
    rng = np.random.default_rng(1)
    estimated = _estimate_of(requested, rng, rotation_noise=0.0, position_noise=0.0)
    errors = pose_errors(requested, estimated)
    assert errors.rot_err < 1e-5 and errors.trans_err_rel < 1e-9 and errors.cam_mc_rel < 1e-9
    assert errors.scale == pytest.approx(1 / 3.7)
    assert np.allclose(errors.estimated, relative_poses(requested), atol=1e-9)


def test_unplaced_frames_take_their_nearest_neighbours_pose_and_count_in_the_mean():
    requested = PATHS["handheld"](21)
    estimated = _estimate_of(requested, np.random.default_rng(3), rotation_noise=0.0, position_noise=0.0)
    registered = np.ones(21, bool)
    registered[[0, 7, 8, 9, 20]] = False
    garbage = estimated.copy()
    garbage[~registered] = np.eye(4) * 1e6  # whatever a backend leaves there is never read
    errors = pose_errors(requested, garbage, registered)
    assert np.array_equal(errors.registered, registered)
    # the alignment is fitted on the placed frames only: they stay exact
    assert np.allclose(errors.translation[registered], 0, atol=1e-9)
    assert np.all(errors.translation[~registered] > 1e-3)  # the camera moved between them: the hole costs
    assert errors.trans_err_rel == pytest.approx(errors.translation.mean())
    assert errors.trans_err_rel > 0.2 * errors.translation[~registered].mean()
    # frame 0 takes 1, 7 takes 6 (nearer), 8 takes 6 (a tie: the earlier), 9 takes 10, 20 takes 19
    nearest = [1, 1, 2, 3, 4, 5, 6, 6, 6, 10, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 19]
    assert np.array_equal(fill_unregistered(garbage, registered), estimated[nearest])
