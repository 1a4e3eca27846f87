"""Scoring a results folder of `<scene_id>_generated.mp4` against a SANA-WM-Bench manifest.

`plan_folder` reads every manifest row (its image's size and camera path: a row pointing at a missing or bad
file stops everything, one line, nothing written) and prepares every video the folder holds (`score.prepare`);
scenes without a video are listed as missing. Revisit pairs are the benchmark's when its
`scene_trajectories_v2.json` sits in the split folder, else found on each path. `score_folder` then scores
the videos one by one, writing each `NAME.eval.json` and `NAME.eval.png` as it is done (a killed run keeps
them, and a re-run reuses a record made for the same video, path and settings), and returns the records.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from camrender.errors import CamrenderError
from camrender.eval import report
from camrender.eval.picture import plot_score
from camrender.eval.revisit import benchmark_pairs
from camrender.eval.score import prepare, score
from camrender.trajectory.formats import sana_wm_bench
from camrender.trajectory.formats.fileio import read_json

BENCHMARK_META = "scene_trajectories_v2.json"


@dataclass(frozen=True)
class FolderPlan:
    """The prepared videos (`score.Job`s, manifest order), the scene ids with no video, and the method and split
    names (the results folder's parent and its own name, as `results/<method>/<split>/` has them)."""

    jobs: list
    missing: list
    method: str
    split: str


def benchmark_scenes(manifest: str) -> dict | None:
    """{scene_id: scene} of the split's `scene_trajectories_v2.json` beside the export folder, None without one."""
    path = os.path.join(os.path.dirname(os.path.dirname(manifest)), BENCHMARK_META)
    if not os.path.isfile(path):
        return None
    doc = read_json(path)
    scenes = doc.get("scenes") if isinstance(doc, dict) else None
    if not isinstance(scenes, list) or \
            not all(isinstance(s, dict) and isinstance(s.get("scene_id"), str) for s in scenes):
        raise CamrenderError("must be an object whose \"scenes\" list holds objects with a \"scene_id\"", path=path,
                             field="scenes")
    for scene in scenes:
        pairs = scene.get("evaluation_pairs") or []
        if not isinstance(pairs, list) or not all(isinstance(p, dict) and isinstance(p.get("frame_a"), int)
                                                  and isinstance(p.get("frame_b"), int) for p in pairs):
            raise CamrenderError("must be a list of objects with integer frame_a and frame_b", path=path,
                                 field=f"{scene['scene_id']}: evaluation_pairs")
    return {scene["scene_id"]: scene for scene in scenes}


def plan_folder(results, manifest, *, interval: int = 4, skip_choice: str = "auto") -> FolderPlan:
    """Check the manifest's scenes and the folder's videos (module docstring); CamrenderError for bad input."""
    results = os.path.abspath(os.fspath(results))
    if not os.path.isdir(results):
        raise CamrenderError("not a folder" if os.path.exists(results) else "folder not found", path=results)
    rows = sana_wm_bench.read_manifest(manifest)
    meta = benchmark_scenes(rows[0].manifest)
    jobs, missing = [], []
    for row in rows:
        scene = sana_wm_bench.load_scene(row)
        video = os.path.join(results, row.output_name)
        if not os.path.exists(video):
            missing.append(row.scene_id)
            continue
        pairs = benchmark_pairs(meta[row.scene_id]) if meta is not None and row.scene_id in meta else None
        jobs.append(prepare(video, scene.traj, interval=interval, skip_choice=skip_choice, pairs=pairs,
                            scene_id=row.scene_id, scene_type=row.scene_type))
    if not jobs:
        raise CamrenderError(f"holds none of the manifest's {len(rows)} videos "
                             f"(<scene_id>{sana_wm_bench.OUTPUT_SUFFIX})", path=results)
    return FolderPlan(jobs, missing, os.path.basename(os.path.dirname(results)), os.path.basename(results))


def score_folder(plan: FolderPlan, estimator, *, lpips=None, rescore: bool = False, progress=None,
                 video_progress=None) -> list:
    """Score every job of `plan` (module docstring); the videos' records, in the plan's order.

    progress: the estimator's (features, mapping); video_progress(done, total, info, stage=, unit=): videos.
    """
    records = []
    for done, job in enumerate(plan.jobs):
        out = report.default_output(job.video.path)
        record = None if rescore else report.reusable(out, job, estimator.name)
        if record is None:
            result = score(job, estimator, lpips=lpips, progress=progress)
            record = report.video_record(result)
            if result.errors is not None:
                plot_score(result, report.picture_path(out), f"{job.scene_id}: {report.summary_line(record)}")
            report.write_record(record, out)
        records.append(record)
        if video_progress is not None:
            video_progress(done + 1, len(plan.jobs), f"{job.scene_id}: {report.summary_line(record)}", stage="eval",
                           unit="video")
    return records
