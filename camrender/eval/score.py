"""Scoring one video against the path it was asked to follow: `prepare` checks everything that can be checked
without estimating (the video reads, the lengths match, enough frames are left), `score` estimates the poses
and measures them.

    job = prepare("orbit.mp4", load("orbit.traj.json"), interval=4, skip_choice="auto")
    result = score(job, load_backend("colmap"))
    result.errors.rot_err, result.errors.trans_err_rel, result.revisit["psnr"]

A video whose scored frames all show the same picture, of which the estimator placed fewer than
`sampling.MIN_POSES` frames, or on which it raised, is a failed estimate (`status` "failed", a `reason`, no
errors), never a score.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from camrender.eval import revisit
from camrender.eval.metrics import PoseErrors, pose_errors
from camrender.eval.sampling import MIN_POSES, FramePlan, frame_plan, skips_first_frame
from camrender.eval.video import VideoInfo, probe, read_frames
from camrender.trajectory.crop import crop_intrinsics
from camrender.trajectory.rotations import relative_poses

STILL_MEAN_DIFFERENCE = 0.5  # grey levels: frames closer than this to the first are the same picture


@dataclass(frozen=True)
class Job:
    """A video ready to score. intrinsics: (N, 4) of the scored frames in the video's pixels; pairs: revisit
    pairs in video frame indices; pairs_source: "benchmark" or "path"."""

    video: VideoInfo
    traj: object
    plan: FramePlan
    skip_reason: str
    intrinsics: np.ndarray
    pairs: list
    pairs_source: str
    scene_id: str | None = None
    scene_type: str | None = None


@dataclass
class VideoScore:
    """The outcome for one video: `status` "scored" (errors set) or "failed" (reason set)."""

    job: Job
    backend: str
    status: str
    reason: str = ""
    errors: PoseErrors | None = None
    revisit: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def prepare(video, traj, *, interval: int = 4, skip_choice: str = "auto", pairs=None, scene_id=None,
            scene_type=None) -> Job:
    """Check `video` against the Trajectory `traj` (CamrenderError naming the file and field) and plan the scoring.

    pairs: revisit pairs in path frame indices (the benchmark's); default: found on the path (`revisit.path_pairs`).
    """
    info = probe(video)
    skip, skip_reason = skips_first_frame(skip_choice, video)
    plan = frame_plan(info.frames, traj.num_frames, interval, skip, video=info.path, path=traj.source)
    intrinsics = crop_intrinsics(traj.intrinsics[plan.path_indices], (traj.width, traj.height),
                                 (info.width, info.height))
    source = "benchmark" if pairs is not None else "path"
    if pairs is None:
        pairs = revisit.path_pairs(relative_poses(traj.c2w), traj.fps, first=1 if skip else 0)
    offset = int(plan.path_indices[0] - plan.video_indices[0])
    in_video = []
    for pair in pairs:
        a, b = pair["frame_a"] - offset, pair["frame_b"] - offset
        if 0 <= a < info.frames and 0 <= b < info.frames and a != b:
            in_video.append(dict(pair, frame_a=a, frame_b=b))
    return Job(info, traj, plan, skip_reason, intrinsics, in_video, source, scene_id, scene_type)


def is_still(frames: np.ndarray) -> bool:
    """Whether every frame of (N, H, W, 3) uint8 `frames` is the first one's picture (within codec noise)."""
    first = frames[0].astype(np.int16)
    return all(float(np.mean(np.abs(frame.astype(np.int16) - first))) < STILL_MEAN_DIFFERENCE for frame in frames[1:])


def score(job: Job, estimator, *, lpips=None, progress=None) -> VideoScore:
    """Estimate the poses of the job's scored frames with `estimator` (`backends.load_backend`) and measure them;
    revisit pairs are scored too (LPIPS with an available `revisit.Lpips`)."""
    pair_frames = {index for pair in job.pairs for index in (pair["frame_a"], pair["frame_b"])}
    wanted = sorted(set(job.plan.video_indices.tolist()) | pair_frames)
    frames = dict(zip(wanted, read_frames(job.video, wanted)))
    sampled = np.stack([frames[index] for index in job.plan.video_indices])
    result = VideoScore(job, estimator.name, "failed", revisit=revisit.score_pairs(job.pairs, frames, lpips))
    result.revisit["source"] = job.pairs_source
    if lpips is not None and not lpips.available:
        result.notes.append(lpips.note)
    if is_still(sampled):
        result.reason = "every scored frame shows the same picture: the video does not move"
        return result
    try:
        estimate = estimator.estimate(sampled, job.intrinsics, progress)
    except Exception as error:  # the estimator's own failure on this video: reported, the other videos go on
        result.reason = f"{estimator.name} failed: {type(error).__name__}: {' '.join(str(error).split())[:200]}"
        return result
    result.notes.extend(estimate.notes)
    placed = int(estimate.registered.sum())
    if estimate.failure or placed < MIN_POSES:
        result.reason = estimate.failure or f"{estimator.name} placed {placed} of {len(sampled)} frames, fewer than " \
                                            f"the {MIN_POSES} an alignment needs"
        return result
    requested = np.asarray(job.traj.c2w)[job.plan.path_indices]
    result.errors = pose_errors(requested, estimate.c2w, estimate.registered)
    result.status = "scored"
    return result
