"""The table of a results folder, laid out as NVlabs' `aggregate_results.py` lays out a method and split: JSON
(`{"records": [...]}`) and markdown with the same columns (VBench and temporal degradation, which
`camrender eval` does not measure, are "—"), the camera means and their per-`scene_type` breakdown, revisit
PSNR / SSIM / LPIPS and their per-category breakdown (category: the scene id less its last `_` part).

A failed estimate is not in the means (as in the benchmark's evaluator) but is counted and named, with the
videos the manifest lists and the folder lacks, and the frames the estimator could not place.
"""
from __future__ import annotations

import numpy as np

NOT_MEASURED = "—"


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _category(scene_id: str) -> str:
    return "_".join(scene_id.split("_")[:-1]) or scene_id


def aggregate_record(method: str, split: str, records: list, missing: list, settings: dict) -> dict:
    """One method-and-split record from the videos' `NAME.eval.json` records."""
    scored = [r for r in records if r["status"] == "scored"]
    by_type: dict = {}
    for r in scored:
        by_type.setdefault(r.get("scene_type") or "unknown", []).append(r)
    record = {"method": method, "split": split, "settings": settings,
              "videos": {"listed": len(records) + len(missing), "scored": len(scored),
                         "failed": {r["scene_id"]: r["reason"] for r in records if r["status"] != "scored"},
                         "missing": list(missing)},
              "frames": {"scored": sum(r["n_frames"] for r in scored),
                         "placed": sum(r["registered_frames"] for r in scored)}}
    if scored:
        record["camera"] = {**_camera_means(scored), "n_scenes": len(scored),
                            "per_category": {kind: {**_camera_means(rows), "n_scenes": len(rows)}
                                             for kind, rows in sorted(by_type.items())}}
    revisited = [r for r in records if "psnr" in (r.get("revisit") or {})]
    if revisited:
        record["revisit"] = {**_revisit_means(revisited, pairs=True),
                             "per_category": _revisit_categories(revisited)}
    return record


def _camera_means(rows: list) -> dict:
    return {"rot_err_deg": _mean([r["RotErr"] for r in rows]),
            "trans_err_rel": _mean([r["TransErr_rel"] for r in rows]),
            "cam_mc_rel": _mean([r["CamMC_rel"] for r in rows])}


def _revisit_means(rows: list, pairs: bool = False) -> dict:
    """Means over every pair of `rows` (pairs=True: the split's figures) or over the rows' own means."""
    def values(name):
        if pairs:
            return [p[name] for r in rows for p in r["revisit"]["pairs"] if name in p]
        return [r["revisit"][name] for r in rows if name in r["revisit"]]

    means = {"psnr": _mean(values("psnr")), "ssim": _mean(values("ssim")), "lpips": _mean(values("lpips"))}
    if pairs:
        means["n_pairs"] = len(values("psnr"))
    return means


def _revisit_categories(rows: list) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(_category(r["scene_id"] or ""), []).append(r)
    return {name: {**{f"mean_{key}": value for key, value in _revisit_means(group).items()}, "n_scenes": len(group)}
            for name, group in sorted(groups.items())}


def _cell(value, fmt: str) -> str:
    return NOT_MEASURED if value is None else fmt.format(value)


def markdown(records: list) -> str:
    """The markdown table of aggregate records, per split, in `aggregate_results.py`'s columns."""
    lines = ["# camrender eval results", ""]
    for split in dict.fromkeys(r["split"] for r in records):
        lines += [f"## Split: `{split}`", "",
                  "| Method | VBench Total | Quality | Semantic | Revisit PSNR↑ | SSIM↑ | LPIPS↓ | RotErr°↓ | "
                  "TransErr_rel↓ | CamMC_rel↓ | Temp IQ first | last | drop |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted((r for r in records if r["split"] == split), key=lambda r: r["method"]):
            revisit, camera = r.get("revisit", {}), r.get("camera", {})
            cells = [_cell(revisit.get("psnr"), "{:.2f}"), _cell(revisit.get("ssim"), "{:.4f}"),
                     _cell(revisit.get("lpips"), "{:.4f}"), _cell(camera.get("rot_err_deg"), "{:.2f}"),
                     _cell(camera.get("trans_err_rel"), "{:.4f}"), _cell(camera.get("cam_mc_rel"), "{:.4f}")]
            lines.append(f"| `{r['method']}` | {' | '.join([NOT_MEASURED] * 3 + cells + [NOT_MEASURED] * 3)} |")
        lines.append("")
    lines += _breakdown(records) + _counts(records)
    return "\n".join(lines) + "\n"


def _breakdown(records: list) -> list:
    rows = [f"| `{r['method']}` | {r['split']} | {name} | {_cell(c.get('mean_psnr'), '{:.2f}')} | "
            f"{_cell(c.get('mean_ssim'), '{:.4f}')} | {_cell(c.get('mean_lpips'), '{:.4f}')} | {c['n_scenes']} |"
            for r in records for name, c in (r.get("revisit", {}).get("per_category") or {}).items()]
    if not rows:
        return []
    return ["## Revisit per-category breakdown", "",
            "| Method | Split | Category | PSNR↑ | SSIM↑ | LPIPS↓ | N scenes |", "|---|---|---|---:|---:|---:|---:|",
            *rows, ""]


def _counts(records: list) -> list:
    lines = ["## Videos", ""]
    for r in records:
        videos, frames, settings = r["videos"], r["frames"], r["settings"]
        lines.append(f"- `{r['method']}` {r['split']}: {videos['scored']} of {videos['listed']} videos scored with "
                     f"{settings['backend']} (every {settings['interval']} frames, frame 0 skipped: "
                     f"{settings['skip_first_frame']}); {frames['placed']} of {frames['scored']} scored frames placed")
        for scene_id, reason in videos["failed"].items():
            lines.append(f"  - failed estimate `{scene_id}`: {reason}")
        if videos["missing"]:
            lines.append(f"  - missing videos: {', '.join(f'`{name}`' for name in videos['missing'])}")
    return lines + [""]
