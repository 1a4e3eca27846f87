"""`NAME.eval.json`: one video's score as a JSON record, written atomically; and whether an earlier record still
holds for the same video, path and settings (`reusable`: a re-run of a folder skips what is done).

The record's top-level `RotErr` (with `RotErr_unit` "deg"), `TransErr_rel`, `CamMC_rel`, `scene_type` and
`n_frames` are the names of the benchmark's per-scene `eval_poses.json` rows; `per_frame` holds each scored
frame's errors and whether the estimator placed it; `revisit` the pairs and their PSNR, SSIM (and LPIPS).
A failed estimate has `status` "failed", a `reason`, and null metrics.
"""
from __future__ import annotations

import json
import os

from camrender.errors import CamrenderError
from camrender.files import atomic_write_text
from camrender.trajectory.formats.fileio import read_json
from camrender.trajectory.model import trajectory_digest

EVAL_JSON_VERSION = 1


def default_output(video) -> str:
    """`NAME.eval.json` beside `NAME.mp4`."""
    return os.path.splitext(os.fspath(video))[0] + ".eval.json"


def picture_path(record_path) -> str:
    """`NAME.eval.png` beside `NAME.eval.json` (any other name: the same name plus `.png`)."""
    record_path = os.fspath(record_path)
    stem = record_path[: -len(".json")] if record_path.endswith(".json") else record_path
    return stem + ".png"


def video_identity(path) -> dict:
    stat = os.stat(path)
    return {"bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}


def settings_of(job, backend: str) -> dict:
    """What a record must agree on to be reused: the video file, the path, the estimator and the sampling."""
    return {"video_file": video_identity(job.video.path), "trajectory_sha256": trajectory_digest(job.traj),
            "backend": backend, "interval": job.plan.interval, "skip_first_frame": job.plan.skip_first_frame}


def _rounded(values) -> list:
    return [round(float(value), 6) for value in values]


def video_record(result) -> dict:
    """The JSON record of a `score.VideoScore`."""
    job, errors = result.job, result.errors
    plan = job.plan
    record = {
        "camrender_eval": EVAL_JSON_VERSION,
        "video": os.path.abspath(job.video.path),
        "trajectory": job.traj.source,
        "scene_id": job.scene_id,
        "scene_type": job.scene_type or "unknown",
        "status": result.status,
        "reason": result.reason or None,
        "RotErr": None if errors is None else errors.rot_err,
        "RotErr_unit": "deg",
        "TransErr_rel": None if errors is None else errors.trans_err_rel,
        "CamMC_rel": None if errors is None else errors.cam_mc_rel,
        "n_frames": len(plan),
        "registered_frames": 0 if errors is None else int(errors.registered.sum()),
        "skip_first_frame": plan.skip_first_frame,
        "skip_first_frame_reason": job.skip_reason,
        "settings": settings_of(job, result.backend),
        "frames": {"video": job.video.frames, "path": job.traj.num_frames, "fps": job.video.fps,
                   "size": [job.video.width, job.video.height]},
        "revisit": result.revisit,
        "notes": list(result.notes),
    }
    if errors is not None:
        record["alignment_scale"] = errors.scale
        record["per_frame"] = {
            "path_frame": plan.path_indices.tolist(), "video_frame": plan.video_indices.tolist(),
            "registered": errors.registered.tolist(), "RotErr": _rounded(errors.rotation_deg),
            "TransErr": _rounded(errors.translation), "CamMC": _rounded(errors.camera_matrix)}
    return record


def write_record(record: dict, path) -> None:
    """`NAME.eval.json`, atomically."""
    atomic_write_text(path, json.dumps(record, indent=1, allow_nan=False) + "\n")


def reusable(path, job, backend: str) -> dict | None:
    """The record at `path` when it was written for the same video, path and settings, else None."""
    if not os.path.isfile(path):
        return None
    try:
        record = read_json(path)
    except CamrenderError:
        return None
    if not isinstance(record, dict) or record.get("camrender_eval") != EVAL_JSON_VERSION:
        return None
    return record if record.get("settings") == settings_of(job, backend) else None


def summary_line(record: dict) -> str:
    """One line of a record: the three metrics, registered frames and revisit PSNR / SSIM, or the failure."""
    if record["status"] != "scored":
        return f"failed estimate: {record['reason']}"
    text = (f"RotErr {record['RotErr']:.3f} deg, TransErr_rel {record['TransErr_rel']:.4f}, "
            f"CamMC_rel {record['CamMC_rel']:.4f} ({record['registered_frames']}/{record['n_frames']} frames placed)")
    revisit = record.get("revisit") or {}
    if "psnr" in revisit:
        text += f"; revisits: PSNR {revisit['psnr']:.2f} dB, SSIM {revisit['ssim']:.4f}"
        text += f", LPIPS {revisit['lpips']:.4f}" if "lpips" in revisit else ""
    return text
